"""Prompts of many lengths: the decode loop is compiled once per batch / output bucket whatever the prompts'
lengths (the prefill is its own executable, bucketed to powers of two), and the prefill's attention gets its
(empty) prefix lengths as run-time values, so XLA cannot spend compile time constant-folding the masked
prefix scores (quadratic in the prompt width: XLA:CPU took seconds per prompt length on SmolLM2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend import core as jcore

from jaxspec.engine import Engine, SlotChunks
from jaxspec.engine.memory import prompt_bucket
from jaxspec.models import Decoder, DecoderConfig
from jaxspec.testing import CompileCounter

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)
LENGTHS = (3, 9, 17, 20, 31, 44)


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(3), param_dtype=jnp.float32, kv_dtype=jnp.float32)


COMPILES = CompileCounter()


def test_prompt_buckets():
    assert [prompt_bucket(n, 1024) for n in (1, 8, 9, 16, 17, 33, 100, 600)] == [8, 8, 16, 16, 32, 64, 128, 1024]
    assert prompt_bucket(100, 96) == 96  # never wider than the context


def test_new_prompt_lengths_compile_no_decode_loop(model):
    """Batches with prompt lengths from 3 to 44 (four prompt buckets): one decode-loop executable, one prefill
    executable per bucket, and a prompt length in a bucket already seen compiles nothing at all."""
    eng = Engine(model, None, max_context=96, max_batch=2)
    rng = np.random.default_rng(0)
    entries = eng._entry_points(False)
    outs = {}
    for n in LENGTHS:
        prompts = [rng.integers(0, CFG.vocab_size, n), rng.integers(0, CFG.vocab_size, max(1, n - 2))]
        outs[n] = eng.generate(prompts, 12)
    assert entries.decode._cache_size() == 1
    assert entries.prefill._cache_size() == len({prompt_bucket(n, 96) for n in LENGTHS}) == 4
    before = COMPILES.count
    for n in (5, 12, 27, 40):  # buckets 8, 16, 32, 64: all compiled above
        res = eng.generate([rng.integers(0, CFG.vocab_size, n)] * 2, 12)
        assert [len(t) for t in res.tokens] == [12, 12]
    assert COMPILES.count == before, COMPILES.count - before
    assert entries.decode._cache_size() == 1


def test_host_driven_and_streaming_pieces_agree(model):
    """``generate`` (prefill executable + decode loop) equals the host-driven loop token for token."""
    eng = Engine(model, None, max_context=96, max_batch=2)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, CFG.vocab_size, 13), rng.integers(0, CFG.vocab_size, 6)]
    a, b = eng.generate(prompts, 16), eng.generate_host_driven(prompts, 16)
    for x, y in zip(a.tokens, b.tokens):
        np.testing.assert_array_equal(x, y)


def _attention_prefix_inputs(closed, dynamic):
    """For every call of the reference attention (``_reference_with_write``) inside ``closed``: whether its
    ``prefix_lens`` operand depends on the jaxpr's inputs (``dynamic``: one bool per input)."""
    jaxpr = closed.jaxpr if isinstance(closed, jcore.ClosedJaxpr) else closed
    dyn = {v for v, d in zip(jaxpr.invars, dynamic) if d}
    found = []
    for eqn in jaxpr.eqns:
        ins = [not isinstance(v, jcore.Literal) and v in dyn for v in eqn.invars]
        sub = eqn.params.get("jaxpr")
        if eqn.params.get("name") == "_reference_with_write":
            found.append(ins[6])  # (q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, ...)
        elif sub is not None and len(getattr(sub, "jaxpr", sub).invars) == len(ins):
            found += _attention_prefix_inputs(sub, ins)
        if any(ins):
            dyn.update(eqn.outvars)
    return found


def test_prefill_prefix_lengths_are_runtime_values(model):
    """The prefill's attention reads prefix lengths computed from the state (zeros at run time), not a
    trace-time constant XLA would fold together with the masked scores at compile time."""
    eng = Engine(model, None, max_context=64, max_batch=1, implementation="reference")
    state, prompts, lens = eng.prepare([np.arange(1, 20)], 4)
    closed = jax.make_jaxpr(eng._entry_points(False).prefill)(eng.params, state, SlotChunks(prompts, lens))
    found = _attention_prefix_inputs(closed, [True] * len(closed.jaxpr.invars))
    assert found and all(found), found
