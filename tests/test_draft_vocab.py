"""A reduced draft vocabulary (``with_draft_vocab``: EAGLE-3's ``draft_vocab_size`` / SGLang's
``speculative_token_map``): the draft head scores only the chosen tokens, proposals map back to token ids,
the engine stays lossless, and a permutation of the whole vocabulary drafts exactly what the full head does.
CPU, f32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import pipeline
from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel, load_model, load_pair, save_model, with_draft_vocab
from jaxspec.protocols import AttentionMetadata
from jaxspec.pipeline import causal_qmask

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, num_nextn_predict_layers=1)


def _window(m, b=2, q=5, seed=2):
    meta = AttentionMetadata(
        positions=jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q)), qmask=causal_qmask(b, q),
        prefix_lens=jnp.zeros((b,), jnp.int32), page_table=jnp.zeros((b, 0), jnp.int32))
    tok = jax.random.randint(jax.random.key(seed), (b, q), 0, m.vocab_size, jnp.int32)
    _, h, _ = m.forward(tok, meta, None)
    return h, tok, meta


@pytest.mark.parametrize("tied", [False, True], ids=["lm_head", "tied"])
def test_draft_logits_are_the_heads_columns(tied):
    cfg = DecoderConfig(**{**CFG.__dict__, "tie_word_embeddings": tied})
    m = MTPModel(cfg, rngs=nnx.Rngs(1), kv_dtype=jnp.float32, num_draft_steps=2)
    ids = np.random.default_rng(0).permutation(cfg.vocab_size)[:20]
    dv = with_draft_vocab(m, ids)
    assert m.draft_token_ids is None and m.draft_head is None  # the input model is untouched
    np.testing.assert_array_equal(dv.draft_token_ids, ids)
    h, tok, meta = _window(m)
    full, hf, _ = m.mtp_forward(1, h, tok, meta, None)
    part, hp, _ = dv.mtp_forward(1, h, tok, meta, None)
    assert part.shape == (2, 5, 20)
    # the same f32 dot products over a column subset (HIGHEST precision): only the summation order may differ
    np.testing.assert_allclose(part, full[..., ids], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(hp, hf)
    rows = jnp.array([1, 8], jnp.int32)
    sel, _, _ = dv.mtp_forward(1, h, tok, meta, None, rows=rows)
    np.testing.assert_allclose(sel, part.reshape(10, -1)[np.asarray(rows)], rtol=1e-6, atol=1e-6)
    # the target forward and its head are unchanged
    np.testing.assert_array_equal(dv.forward(tok, meta, None)[0], m.forward(tok, meta, None)[0])


@pytest.mark.parametrize("bad, match", [
    (np.zeros((2, 3), np.int32), "1-D"), (np.zeros((0,), np.int32), "non-empty"), (np.array([1.0, 2.0]), "integer"),
    (np.array([0, 64]), r"\[0, 64\)"), (np.array([-1, 3]), r"\[0, 64\)"), (np.array([3, 5, 3]), "distinct"),
])
def test_bad_token_ids(bad, match):
    m = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32)
    with pytest.raises(ValueError, match="token_ids.*" + match):
        with_draft_vocab(m, bad)


def test_topk_larger_than_the_draft_vocabulary():
    m = with_draft_vocab(MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_draft_steps=3), np.arange(3))
    with pytest.raises(ValueError, match="spec.topk=4 exceeds the head's draft vocabulary"):
        Engine(m, MTPDrafter(m), spec=SpecConfig(3, 4, 8), max_context=32, max_batch=1)


def test_checkpoint_round_trip_skips_the_draft_head(tmp_path):
    m = MTPModel(CFG, rngs=nnx.Rngs(3), kv_dtype=jnp.float32)
    save_model(with_draft_vocab(m, np.arange(10)), str(tmp_path))
    back = load_model(str(tmp_path), kv_dtype=jnp.float32)
    assert back.draft_head is None
    for (k, a), (_, b) in zip(nnx.to_flat_state(nnx.state(m, nnx.Param)), nnx.to_flat_state(nnx.state(back, nnx.Param))):
        np.testing.assert_array_equal(a.get_value(), b.get_value(), err_msg=str(k))


@pytest.fixture(scope="module")
def pair():
    return load_pair()


PROMPTS = [np.array([5, 6, 7, 8, 9], np.int32), np.array([10, 11, 12], np.int32)]
KW = dict(max_context=48, page_size=16, max_batch=2)


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
def test_engine_lossless_and_permutation_exact(pair, spec):
    plain = Engine(pair, None, **KW).generate(PROMPTS, 16)
    full = Engine(pair, MTPDrafter(pair), spec=spec, **KW).generate(PROMPTS, 16)
    perm = with_draft_vocab(pair, np.random.default_rng(1).permutation(pair.vocab_size))
    res_perm = Engine(perm, MTPDrafter(perm), spec=spec, **KW).generate(PROMPTS, 16)
    few = with_draft_vocab(pair, np.arange(0, pair.vocab_size, 7))  # a seventh of the vocabulary
    res_few = Engine(few, MTPDrafter(few), spec=spec, **KW).generate(PROMPTS, 16)
    for got in (full, res_perm, res_few):
        for a, b in zip(got.tokens, plain.tokens):
            np.testing.assert_array_equal(a, b)
    # the whole vocabulary in another order drafts the same tokens: the same accept lengths
    assert res_perm.mean_accept_length == full.mean_accept_length
    assert 1.0 <= res_few.mean_accept_length <= full.mean_accept_length


def test_sampled_drafts_live_on_the_draft_vocabulary():
    pair = MTPModel(CFG, rngs=nnx.Rngs(5), kv_dtype=jnp.float32, num_draft_steps=3)  # random: spread distributions
    ids = np.arange(1, pair.vocab_size, 3)
    dv = with_draft_vocab(pair, ids)
    spec = SpecConfig(3, 1, 4)
    drafter = MTPDrafter(dv, sample_drafts=True)
    b, p = 2, 6
    r2t = jnp.arange(b * 16, dtype=jnp.int32).reshape(b, 16)
    state = drafter.init_state(spec, r2t, b * 16)
    prompts = jax.random.randint(jax.random.key(0), (b, p), 0, pair.vocab_size, jnp.int32)
    lens = jnp.array([6, 4], jnp.int32)
    meta = pipeline.prefill_metadata(lens, r2t, p, page_size=16, implementation="reference")
    _, hidden, _ = dv.forward(prompts, meta, dv.make_cache(r2t, b * 16))
    coins = jax.random.uniform(jax.random.key(1), (b, spec.num_steps))
    top_k = jnp.full((b,), pair.vocab_size, jnp.int32)  # V: no top-k cut (the engine's value for "off")
    smp = pipeline.DraftSampling(jnp.ones((b,)), top_k, jnp.ones((b,)), coins)
    out = drafter.extend_after_prefill(spec, state, prompts, hidden, meta, lens, jnp.array([3, 4], jnp.int32),
                                       sampling=smp)
    q = np.asarray(out.draft_probs)
    assert q.shape == (b, spec.num_steps, pair.vocab_size)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)
    outside = np.setdiff1d(np.arange(pair.vocab_size), ids)
    assert np.all(q[..., outside] == 0) and np.all(q[..., ids] > 0)
    tokens = np.asarray(out.topk_index)
    assert np.isin(tokens, ids).all()
    for r in range(b):  # each sampled token has positive probability under its step's distribution
        for s in range(spec.num_steps):
            assert q[r, s, tokens[r, s]] > 0
