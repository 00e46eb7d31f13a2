"""Engine arguments: every value that is not what the parameter takes is refused with a ValueError naming the
parameter (never converted: a float or bool token id, seed, limit or count is an error, not an int), and
numpy integers are taken as ints. Nothing here compiles: the checks run before anything is traced."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine
from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel

CFG = DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)
CHAIN = SpecConfig(3, 1, 4)


@pytest.fixture(scope="module")
def model():
    return MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_mtp_layers=3)


@pytest.mark.parametrize("name, value", [
    ("eos_id", 1.5), ("eos_id", True), ("eos_id", "3"), ("eos_id", -1), ("eos_id", 32),
    ("seed", "abc"), ("seed", 1.0), ("seed", False), ("seed", -1),
    ("max_context", 64.0), ("max_batch", True), ("page_size", 0),
    ("num_pages", 40.5), ("num_pages", True), ("num_pages", 0),
    ("memory_limit_bytes", 1e9), ("memory_limit_bytes", -1),
    ("interpret", 1), ("interpret", "yes"),
    ("implementation", 3), ("implementation", "cuda"),
])
def test_engine_refuses_and_names(model, name, value):
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        Engine(model, None, **{"max_context": 64, "max_batch": 2, name: value})


def test_numpy_integers_are_ints(model):
    eng = Engine(model, None, max_context=np.int64(64), max_batch=np.int32(2), eos_id=np.int64(5), seed=np.int32(3),
                 num_pages=np.int64(200))
    assert (eng.eos_id, eng.seed, eng.max_context, eng.max_batch, eng.num_pages) == (5, 3, 64, 2, 200)
    assert all(type(v) is int for v in (eng.eos_id, eng.seed, eng.max_context, eng.max_batch, eng.num_pages))


@pytest.mark.parametrize("value", [2.5, True, [3, 2.0], "4"])
def test_max_new_tokens_not_converted(model, value):
    eng = Engine(model, None, max_context=64, max_batch=2)
    with pytest.raises(ValueError, match="^max_new_tokens"):
        eng.prepare([np.arange(3), np.arange(4)], value)


def test_max_new_tokens_per_request(model):
    eng = Engine(model, None, max_context=64, max_batch=2)
    state, _, _ = eng.prepare([np.arange(3), np.arange(4)], [np.int64(3), 5])
    np.testing.assert_array_equal(np.asarray(state.max_new_tokens), [3, 5])
    with pytest.raises(ValueError, match=r"^max_new_tokens: expected a scalar or one value per request \(2\)"):
        eng.prepare([np.arange(3), np.arange(4)], [3, 4, 5])


def test_run_decode_and_calibrate_refuse_bools_and_floats(model):
    eng = Engine(model, MTPDrafter(model), spec=(CHAIN,), adaptive=AdaptivePolicy(), max_context=96, max_batch=2)
    state = None
    for kw, name in ((dict(mode=True), "mode"), (dict(mode=1.0), "mode"), (dict(max_rounds=True), "max_rounds"),
                     (dict(max_rounds=2.0), "max_rounds")):
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            eng.run_decode(state, **kw)
    for kw, name in ((dict(batch_size=True), "batch_size"), (dict(batch_size=1, rounds=True), "rounds"),
                     (dict(batch_size=1, context=3.5), "context"), (dict(batch_size=1, context=True), "context")):
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            eng.calibrate(**kw)
