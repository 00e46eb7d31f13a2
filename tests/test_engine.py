"""Compiled speculative decoding loop (MTP chain / tree) vs plain greedy decoding, on CPU.

Losslessness: greedy speculative output == greedy plain output token for token (trained and random
weights, chain S3/K1/N4 and tree S3/K2/N6, page sizes 1 and 16, 4 prompts of different lengths).
Compiles are shared through module-level jits: every engine below has the same shapes (B=4, P=16,
T=32, W=64, equal pool sizes), so each (spec config, page size, entry point) compiles once.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.corpus import make_prompts
from jaxspec.engine import Engine
from jaxspec.models import DEFAULT_WEIGHTS, TINY_PAIR_CONFIG, MockVocab, MTPDrafter, MTPModel, load_pair, num_pages_needed

W = 64
MAX_NEW = 24
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
# Same pool size (slots) for page sizes 1 and 16, so both share one executable.
SLOTS = num_pages_needed(4, W, 16) * 16
NUM_PAGES = {1: SLOTS, 16: SLOTS // 16}


@pytest.fixture(scope="module")
def models():
    trained = load_pair(DEFAULT_WEIGHTS)
    assert trained.cfg == TINY_PAIR_CONFIG, "the random model must share the shipped structure (shared compiles)"
    return {"trained": trained, "random": MTPModel(TINY_PAIR_CONFIG, rngs=nnx.Rngs(123), kv_dtype=jnp.float32)}


@pytest.fixture(scope="module")
def prompts():
    vocab = MockVocab()
    texts = make_prompts(4, seed=3, min_len=3, max_len=15)
    out = [vocab.encode(t) for t in texts]
    assert len({len(p) for p in out}) > 1
    return out


def _drafter(model, spec, **kw):
    return None if spec is None else MTPDrafter(model, **kw)


def _engine(model, spec, page_size=1, **kw):
    drafter = _drafter(model, spec, **{k: v for k, v in kw.items() if k in ("implementation", "interpret")})
    return Engine(model, drafter, spec=spec, max_context=W, page_size=page_size, num_pages=NUM_PAGES[page_size], **kw)


@pytest.fixture(scope="module")
def plain(models, prompts):
    return {name: _engine(m, None).generate(prompts, MAX_NEW) for name, m in models.items()}


def _assert_same(a, b):
    assert len(a.tokens) == len(b.tokens)
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens)):
        np.testing.assert_array_equal(x, y, err_msg=f"request {i}")


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("which", ["trained", "random"])
def test_lossless(models, prompts, plain, which, spec, page_size):
    res = _engine(models[which], spec, page_size).generate(prompts, MAX_NEW)
    _assert_same(res, plain[which])
    assert all(len(t) == MAX_NEW for t in res.tokens)
    assert 1.0 <= res.mean_accept_length <= spec.num_steps + 1
    if which == "trained":
        assert res.mean_accept_length > 1.5, res.mean_accept_length


def test_host_driven_matches(models, prompts, plain):
    res = _engine(models["trained"], CHAIN, 16).generate_host_driven(prompts, MAX_NEW)
    _assert_same(res, plain["trained"])


def test_no_host_sync_inside_loop(models, prompts):
    eng = _engine(models["trained"], CHAIN)
    args = jax.block_until_ready(eng.prepare(prompts, MAX_NEW))
    params = jax.block_until_ready(eng.params)
    del params
    eng.run(*eng.prepare(prompts, MAX_NEW))  # warm the executable outside the guard
    with jax.transfer_guard("disallow"):
        state = eng.run(*args)
        state = jax.block_until_ready(state)
    assert int(jnp.min(state.num_generated)) == MAX_NEW


@pytest.mark.parametrize("spec", [None, CHAIN, TREE], ids=["plain", "chain", "tree"])
def test_stopping(models, prompts, plain, spec):
    full = plain["trained"].tokens
    eos = int(full[1][5])  # a token request 1 produces: stops it (and maybe others) early
    max_new = np.array([3, MAX_NEW, 10, 1])
    res = _engine(models["trained"], spec, eos_id=eos).generate(prompts, max_new)
    for i, (got, ref) in enumerate(zip(res.tokens, full)):
        want = ref[: max_new[i]]
        hits = np.nonzero(want == eos)[0]
        if hits.size:
            want = want[: hits[0] + 1]
        np.testing.assert_array_equal(got, want, err_msg=f"request {i}")


def test_errors(models, prompts):
    eng = _engine(models["random"], CHAIN)
    with pytest.raises(ValueError, match="at least one prompt"):
        eng.prepare([], 4)
    with pytest.raises(ValueError, match="non-empty"):
        eng.prepare([np.array([], np.int32)], 4)
    with pytest.raises(ValueError, match="context overflow"):
        eng.prepare([np.arange(2, 40)], 30)  # 38 + 30 + 4 > 64
    with pytest.raises(ValueError, match="context overflow"):
        eng.prepare(prompts, W)
    with pytest.raises(ValueError, match="token ids"):
        eng.prepare([np.array([1, 999])], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.prepare(prompts, 0)
    with pytest.raises(ValueError, match="page pool exhausted"):
        Engine(models["random"], _drafter(models["random"], CHAIN), spec=CHAIN, max_context=W, page_size=16,
               num_pages=4).prepare(prompts, 4)
    with pytest.raises(ValueError, match="MTP layers"):
        Engine(models["random"], _drafter(models["random"], CHAIN), spec=SpecConfig(5, 1, 6), max_context=W)
    # exactly at the limit is fine
    eng.prepare([np.arange(2, 38)], W - 36 - CHAIN.num_draft_tokens)


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_pallas_interpret_kernels(models, prompts, plain, spec):
    """The same loop with every jaxspec.kernels op forced to its Pallas kernel (interpreted on CPU)."""
    res = _engine(models["trained"], spec, 16, implementation="pallas", interpret=True).generate(prompts, MAX_NEW)
    _assert_same(res, plain["trained"])


def test_entry_points_looked_up_once(models, prompts, plain, monkeypatch):
    """An engine looks its jitted entry points up once per checks setting: the lookup's cache key hashes the NNX
    GraphDef (milliseconds), which was paid on every call before. ``run_decode`` passes its two scalars as
    explicit transfers, so the decode call runs under ``jax.transfer_guard("disallow")``."""
    from jaxspec.engine import engine as engine_mod

    calls = []
    real = engine_mod.entry_points

    def counting(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(engine_mod, "entry_points", counting)
    eng = _engine(models["trained"], CHAIN)
    for _ in range(2):
        _assert_same(eng.generate(prompts, MAX_NEW), plain["trained"])
    state = eng.run_prefill(*eng.prepare(prompts, MAX_NEW))
    state = jax.block_until_ready(eng.run_decode(state, max_rounds=1))
    with jax.transfer_guard("disallow"):
        state = jax.block_until_ready(eng.run_decode(state))
    assert calls == [False], calls
    assert int(jnp.min(state.num_generated)) == MAX_NEW
