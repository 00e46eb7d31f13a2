"""Tiny target + MTP model over the paged KV cache: allocator, paged attention == dense attention,
save/load, vocab. CPU, a few seconds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models import (
    ForwardInputs,
    MockVocab,
    ModelConfig,
    TinyPair,
    causal_mask,
    init_cache,
    load_pair,
    make_req_to_token,
    save_pair,
)
from jaxspec.models.io import DEFAULT_WEIGHTS

CFG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  ffn_size=64, num_mtp_layers=2)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_req_to_token_page_aligned(page_size):
    r2t = make_req_to_token(3, 37, page_size, seed=1)
    assert r2t.dtype == np.int32 and r2t.shape == (3, 37)
    assert r2t.min() >= page_size  # page 0 (slot 0) is the reserved dummy page
    assert len(np.unique(r2t)) == r2t.size  # no slot shared
    pos = np.arange(37)
    np.testing.assert_array_equal(r2t % page_size, np.broadcast_to(pos % page_size, r2t.shape))
    pages = r2t // page_size
    np.testing.assert_array_equal(pages[:, pos], pages[:, (pos // page_size) * page_size])  # one page per G tokens


def test_page_exhaustion_raises():
    with pytest.raises(ValueError, match="page pool exhausted"):
        make_req_to_token(4, 64, 16, num_pages=16)  # needs 4*4 + 1 = 17
    make_req_to_token(4, 64, 16, num_pages=17)


@nnx.jit
def _target(model, tokens, inp, cache):
    return model.target(tokens, inp, cache)


def _dense(model, tokens):
    b, t = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    logits, h, _ = _target(model, tokens, ForwardInputs(pos, causal_mask(b, t)), None)
    return logits, h


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_extend_matches_dense(page_size):
    """Prefill P tokens into the paged cache, then extend Q more with the prefix read back through
    req_to_token: logits equal the dense causal forward (ragged prefix lengths per row)."""
    model = TinyPair(CFG, nnx.Rngs(0))
    b, t, w = 3, 12, 40
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, CFG.vocab_size, jnp.int32)
    ref_logits, _ = _dense(model, tokens)
    r2t = make_req_to_token(b, w, page_size, seed=3)
    cache = init_cache(CFG.num_layers, CFG, r2t, page_size=page_size)
    plen = jnp.array([5, 3, 8], jnp.int32)
    q = t - 3  # extend window (rows with short prefixes see the rest; logits compared where in range)
    j = jnp.arange(t, dtype=jnp.int32)[None]
    pos = jnp.broadcast_to(j, (b, t))
    locs = jnp.where(j < plen[:, None], cache.req_to_token[:, :t], 0)
    _, _, cache = _target(model, tokens, ForwardInputs(pos, causal_mask(b, t), None, locs), cache)
    ext_pos = plen[:, None] + jnp.arange(q, dtype=jnp.int32)[None]
    ext_tok = jnp.take_along_axis(tokens, jnp.minimum(ext_pos, t - 1), axis=1)
    ext_locs = jnp.take_along_axis(cache.req_to_token, ext_pos, axis=1)
    logits, _, _ = _target(model, ext_tok, ForwardInputs(ext_pos, causal_mask(b, q), plen, ext_locs), cache)
    for r in range(b):
        n = t - int(plen[r])
        np.testing.assert_allclose(logits[r, :n], ref_logits[r, int(plen[r]) :], rtol=1e-4, atol=1e-4)


def test_tree_mask_branches_are_independent():
    """Two sibling tree nodes at the same position see only the prefix + root + themselves: each one's
    logits equal a chain forward of that branch alone."""
    model = TinyPair(CFG, nnx.Rngs(0))
    r2t = make_req_to_token(1, 16, 1)
    prefix = jnp.array([[3, 4, 5, 6]], jnp.int32)
    cache = init_cache(CFG.num_layers, CFG, r2t, page_size=1)
    pos = jnp.arange(4, dtype=jnp.int32)[None]
    _, _, cache = _target(model, prefix, ForwardInputs(pos, causal_mask(1, 4), None, cache.req_to_token[:, :4]), cache)
    # tree: root 7 at pos 4, children 8 and 9 at pos 5
    tree_tok = jnp.array([[7, 8, 9]], jnp.int32)
    mask = jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
    tl, _, _ = _target(model, tree_tok, ForwardInputs(jnp.array([[4, 5, 5]], jnp.int32), mask, jnp.array([4], jnp.int32), None), cache)
    for child, tok in ((1, 8), (2, 9)):
        full = jnp.array([[3, 4, 5, 6, 7, tok]], jnp.int32)
        ref, _ = _dense(model, full)
        np.testing.assert_allclose(tl[0, child], ref[0, 5], rtol=1e-4, atol=1e-4)
    ref, _ = _dense(model, jnp.array([[3, 4, 5, 6, 7]], jnp.int32))
    np.testing.assert_allclose(tl[0, 0], ref[0, 4], rtol=1e-4, atol=1e-4)


def test_mtp_shares_embedding_and_head():
    model = TinyPair(CFG, nnx.Rngs(0))
    assert len(model.mtp) == CFG.num_mtp_layers
    names = {"/".join(map(str, k)) for k, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert not any(n.startswith("mtp/") and ("embed" in n or "lm_head" in n) for n in names)


def test_save_load_roundtrip(tmp_path):
    model = TinyPair(CFG, nnx.Rngs(5))
    path = str(tmp_path / "pair")
    save_pair(model, path, note="x")
    other = load_pair(path)
    assert other.cfg == CFG
    tok = jnp.array([[1, 2, 3]], jnp.int32)
    np.testing.assert_array_equal(_dense(model, tok)[0], _dense(other, tok)[0])


def test_shipped_weights():
    model = load_pair(DEFAULT_WEIGHTS)
    assert model.cfg.num_mtp_layers >= 3
    import os

    assert os.path.getsize(os.path.join(DEFAULT_WEIGHTS, "model.safetensors")) < 20 * 1024 * 1024


def test_mock_vocab():
    v = MockVocab()
    ids = v.encode("count: 1 2 3.\n")
    assert ids.dtype == np.int32 and v.decode(ids) == "count: 1 2 3.\n"
    assert v.encode("\n")[0] == v.eos_id
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.encode("ABC")
