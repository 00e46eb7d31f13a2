"""MTPModel over the paged KV cache: the allocator, tree-masked verify through the paged attention kernel
(reference and the Pallas kernel in interpret mode), the shared embedding/head, save/load_pair, vocab.
CPU, f32, a few seconds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models import (
    DecoderConfig,
    MockVocab,
    MTPModel,
    load_pair,
    make_req_to_token,
    save_pair,
)
from jaxspec.models.io import load_meta
from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token
from jaxspec.pipeline import causal_qmask

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, num_nextn_predict_layers=2)


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
def _fwd(model, tokens, meta, cache):
    return model.forward(tokens, meta, cache)


def _meta(b, q, positions=None, qmask=None, prefix_lens=None, page_table=None, write_locs=None, page_size=1):
    pos = jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q)) if positions is None else positions
    return AttentionMetadata(
        positions=pos, qmask=causal_qmask(b, q) if qmask is None else qmask,
        prefix_lens=jnp.zeros((b,), jnp.int32) if prefix_lens is None else prefix_lens,
        page_table=jnp.zeros((b, 0), jnp.int32) if page_table is None else page_table,
        write_locs=write_locs, page_size=page_size)


def _dense(model, tokens):
    return _fwd(model, tokens, _meta(*tokens.shape), None)[0]


@pytest.mark.parametrize("page_size,implementation", [(1, "reference"), (16, "reference"), (16, "pallas")])
def test_tree_mask_branches_are_independent(page_size, implementation):
    """A prefix prefilled into the paged pool, then a tree verify (root 7, siblings 8 and 9 at the same
    position) attending to it through the page table: each sibling's logits equal a dense forward of its
    branch alone. ``pallas`` runs the model's attention through the Pallas kernel (interpret mode on CPU),
    chosen by ``AttentionMetadata.implementation``. f32: 1e-4 covers the reassociation of the paged
    (split prefix + fresh merge) softmax against the dense one."""
    model = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32)
    kw = dict(implementation=implementation, interpret=implementation != "reference")
    r2t = make_req_to_token(1, 32, page_size, seed=2)
    cache = model.make_cache(r2t, int(r2t.max()) // page_size * page_size + page_size)
    table = page_table_from_req_to_token(cache.req_to_token, page_size)
    prefix = jnp.array([[3, 4, 5, 6]], jnp.int32)
    pre = dataclasses.replace(_meta(1, 4, page_table=table, write_locs=cache.req_to_token[:, :4], page_size=page_size),
                              **kw)
    _, _, cache = _fwd(model, prefix, pre, cache)
    tree = jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
    verify = dataclasses.replace(_meta(1, 3, jnp.array([[4, 5, 5]], jnp.int32), tree, jnp.array([4], jnp.int32), table,
                                       page_size=page_size), **kw)
    tl, _, _ = _fwd(model, jnp.array([[7, 8, 9]], jnp.int32), verify, cache)
    for child, tok in ((1, 8), (2, 9)):
        ref = _dense(model, jnp.array([[3, 4, 5, 6, 7, tok]], jnp.int32))
        np.testing.assert_allclose(tl[0, child], ref[0, 5], rtol=1e-4, atol=1e-4)
    ref = _dense(model, jnp.array([[3, 4, 5, 6, 7]], jnp.int32))
    np.testing.assert_allclose(tl[0, 0], ref[0, 4], rtol=1e-4, atol=1e-4)
    # the mask matters: 8 attending to 9's sibling slot would change its logits
    wrong = dataclasses.replace(verify, qmask=jnp.ones((1, 3, 3), bool))
    wl, _, _ = _fwd(model, jnp.array([[7, 8, 9]], jnp.int32), wrong, cache)
    assert float(jnp.max(jnp.abs(wl[0, 1] - tl[0, 1]))) > 1e-3


def test_mtp_shares_embedding_and_head():
    model = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32)
    assert model.num_mtp_layers == CFG.num_nextn_predict_layers
    names = {"/".join(map(str, k)) for k, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert any(n.startswith("mtp_layers/") for n in names)
    assert not any(n.startswith("mtp_layers/") and ("embed" in n or "lm_head" in n) for n in names)


def test_save_load_pair_roundtrip(tmp_path):
    model = MTPModel(CFG, rngs=nnx.Rngs(5), kv_dtype=jnp.float32)
    path = str(tmp_path / "pair")
    save_pair(model, path, note="x")
    other = load_pair(path)
    assert isinstance(other, MTPModel) and other.cfg == CFG and load_meta(path) == {"note": "x"}
    tok = jnp.array([[1, 2, 3]], jnp.int32)
    np.testing.assert_array_equal(_dense(model, tok), _dense(other, tok))


def test_mock_vocab():
    v = MockVocab()
    ids = v.encode("count: 1 2 3.\n")
    assert ids.dtype == np.int32 and v.decode(ids) == "count: 1 2 3.\n"
    assert v.encode("\n")[0] == v.eos_id
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.encode("ABC")


def test_bf16_single_row_equals_its_row_in_a_batch():
    """A 16-bit batch-1 decode runs each layer's norms and projections on two rows (a zero row appended,
    ``decoder._with_zero_row``): its outputs equal row 0 of a batch-2 forward whose first row is the same
    token, and keep the ``[1, 1, ...]`` shapes. Dense forward (no cache), bf16 weights, f32 accumulation; both
    sides are the same 2-row products, so the tolerance is float32 rounding only."""
    from jaxspec.models import Decoder

    m = Decoder(CFG, rngs=nnx.Rngs(7), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)

    def meta(b):
        return AttentionMetadata(positions=jnp.full((b, 1), 5, jnp.int32), qmask=causal_qmask(b, 1),
                                 prefix_lens=jnp.zeros((b,), jnp.int32), page_table=jnp.zeros((b, 0), jnp.int32))

    one_logits, one_hidden, _ = m.forward(jnp.array([[11]], jnp.int32), meta(1), None)
    two_logits, two_hidden, _ = m.forward(jnp.array([[11], [42]], jnp.int32), meta(2), None)
    assert one_logits.shape == (1, 1, CFG.vocab_size) and one_hidden.shape == (1, 1, CFG.hidden_size)
    np.testing.assert_allclose(one_hidden[0], two_hidden[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one_logits[0], two_logits[0], rtol=1e-6, atol=1e-6)
    assert not np.allclose(two_logits[0], two_logits[1])  # the rows differ: row 1 is not a copy of row 0


def test_out_of_range_write_slots_go_to_the_dummy_slot_only():
    """A write slot outside the pool lands in slot 0 (the dummy slot padding tokens write to), never in a
    clamped neighbour; every other slot keeps its poison. With checks on it is an error."""
    import jax
    from jax.experimental import checkify

    import jaxspec
    from jaxspec.models import Decoder

    m = Decoder(CFG, rngs=nnx.Rngs(3), kv_dtype=jnp.float32)
    cache = m.make_cache(np.zeros((2, 8), np.int32), 16)
    cache = dataclasses.replace(cache, k=jnp.full_like(cache.k, 7.0), v=jnp.full_like(cache.v, 7.0))
    locs = jnp.array([[5], [16]], jnp.int32)  # row 1: one past the pool
    meta = _meta(2, 1, positions=jnp.zeros((2, 1), jnp.int32), write_locs=locs)
    meta = dataclasses.replace(meta, page_table=jnp.zeros((2, 1), jnp.int32))
    _, _, out = _fwd(m, jnp.array([[3], [9]], jnp.int32), meta, cache)
    for pool in (np.asarray(out.k), np.asarray(out.v)):
        written = np.any(pool != 7.0, axis=(0, 2, 3))
        assert set(np.flatnonzero(written)) == {0, 5}, np.flatnonzero(written)
    with jaxspec.checks():
        err, _ = jax.jit(checkify.checkify(lambda c: m.forward(jnp.array([[3], [9]], jnp.int32), meta, c)))(cache)
    with pytest.raises(checkify.JaxRuntimeError, match="write_locs"):
        err.throw()


@pytest.mark.gpu
@pytest.mark.parametrize("b,q", [(1, 1), (3, 1), (2, 4)])
def test_gpu_kernel_forward_writes_the_pool_as_the_reference(b, q):
    """A bf16 decoder with 64-wide heads on the GPU (the Mosaic attention kernel, which writes the fresh K/V
    itself for more than one token) against the same forward with the jnp reference (write, then attend):
    the same K/V values land in the same slots (layer 0 bit for bit; later layers' inputs went through the two
    attentions, so to bf16 rounding), every other slot keeps its poison, and the logits agree to bf16 attention
    rounding (2^-6 of their scale)."""
    from jaxspec.models import Decoder

    cfg = DecoderConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    m = Decoder(cfg, rngs=nnx.Rngs(5), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    g, width = 16, 64
    r2t = make_req_to_token(b, width, g, seed=2)
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**31))
    prefix = rng.integers(1, width - q, b).astype(np.int32)
    cache = m.make_cache(r2t, int(r2t.max()) + 1)
    poison = jnp.asarray(rng.standard_normal(cache.k.shape).astype(np.float32)).astype(jnp.bfloat16)
    cache = dataclasses.replace(cache, k=poison, v=-poison)
    pos = jnp.asarray(prefix[:, None] + np.arange(q)[None], jnp.int32)
    meta = _meta(b, q, positions=pos, qmask=causal_qmask(b, q), prefix_lens=jnp.asarray(prefix),
                 page_table=jnp.asarray(page_table_from_req_to_token(r2t, g)), page_size=g,
                 write_locs=jnp.asarray(np.take_along_axis(r2t, np.asarray(pos), 1)))
    tokens = jnp.asarray(rng.integers(0, 128, (b, q)), jnp.int32)
    outs = {}
    for impl in ("reference", "pallas"):
        c = dataclasses.replace(cache, k=jnp.array(cache.k), v=jnp.array(cache.v))
        interp = jax.default_backend() != "gpu"  # the GPU interpreter where there is no GPU (checking the test)
        outs[impl] = _fwd(m, tokens, dataclasses.replace(meta, implementation=impl, interpret=interp), c)
    (lr, _, cr), (lk, _, ck) = outs["reference"], outs["pallas"]
    written = np.zeros(cache.k.shape[1], bool)
    written[np.asarray(meta.write_locs).reshape(-1)] = True
    for a, w, p0 in ((ck.k, cr.k, poison), (ck.v, cr.v, -poison)):
        a, w, p0 = (np.asarray(x.astype(jnp.float32)) for x in (a, w, p0))
        np.testing.assert_array_equal(a[:, ~written], p0[:, ~written])  # nothing else written
        np.testing.assert_array_equal(w[:, ~written], p0[:, ~written])
        np.testing.assert_array_equal(a[0], w[0])  # layer 0: the same K/V values in the same slots
        assert not np.array_equal(a[:, written], p0[:, written])
        # later layers: their inputs went through the two attentions (bf16 rounding apart)
        np.testing.assert_allclose(a, w, atol=np.abs(w).max() * 2.0**-5)
    scale = float(np.abs(np.asarray(lr)).max())
    np.testing.assert_allclose(np.asarray(lk), np.asarray(lr), atol=scale * 2.0**-6)
