"""The tied LM head (``jaxspec.models.decoder.tied_head``): its multi-row reduce form against the dot, and a tied
decoder's verify forward against its one-row forwards. CPU, f32, a few seconds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models import Decoder, DecoderConfig, make_req_to_token
from jaxspec.models.decoder import PREC, tied_head
from jaxspec.pipeline import causal_qmask
from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token

CFG = DecoderConfig(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=12, tie_word_embeddings=True)


def _dot_head(x, w):
    return jnp.einsum("...d,vd->...v", x, w, precision=PREC, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("lead", [(1,), (1, 1), (2,), (1, 4), (2, 3), (4, 8), (1, 33)])
def test_tied_head_equals_the_dot(lead):
    """Every row count (the reduce form's 2..32 and the dot's 1 and 33) gives the dot's logits up to f32 rounding
    of a 48-term sum, in the input's leading shape."""
    rng = np.random.default_rng(sum(lead) * 31 + len(lead))
    w = jnp.asarray(rng.standard_normal((96, 48)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((*lead, 48)), jnp.float32)
    got = jax.jit(tied_head)(x, w)
    assert got.shape == (*lead, 96) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, _dot_head(x, w), rtol=1e-5, atol=1e-5)


def test_tied_head_keeps_the_dot_for_16_bit_weights():
    """bf16 weights: the dot (f32 accumulation), unchanged by the row count."""
    rng = np.random.default_rng(5)
    w = jnp.asarray(rng.standard_normal((96, 48)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((1, 4, 48)), jnp.float32)
    np.testing.assert_array_equal(tied_head(x, w), _dot_head(x.astype(jnp.bfloat16), w))


def test_tied_verify_forward_matches_one_row_forwards():
    """A 4-row causal verify forward over a paged prefix gives, row by row, the logits (to f32 rounding) and
    argmaxes of four one-row forwards that append the same tokens one at a time."""
    model = Decoder(CFG, rngs=nnx.Rngs(3))
    g, prefix, q = 4, 6, 4
    r2t = jnp.asarray(make_req_to_token(1, 16, g))
    pt = page_table_from_req_to_token(r2t, g)
    tokens = jnp.asarray(np.random.default_rng(9).integers(0, CFG.vocab_size, prefix + q), jnp.int32)[None]

    def meta(start, n):
        return AttentionMetadata(positions=start + jnp.arange(n, dtype=jnp.int32)[None], qmask=causal_qmask(1, n),
                                 prefix_lens=jnp.array([start], jnp.int32), page_table=pt,
                                 write_locs=r2t[:, start:start + n], page_size=g)

    fwd = jax.jit(lambda t, m, c: model.forward(t, m, c))
    _, _, cache = fwd(tokens[:, :prefix], meta(0, prefix), model.make_cache(r2t, int(r2t.max()) + 1))
    many, _, _ = fwd(tokens[:, prefix:], meta(prefix, q), cache)
    ones = []
    for i in range(q):
        logits, _, cache = fwd(tokens[:, prefix + i:prefix + i + 1], meta(prefix + i, 1), cache)
        ones.append(logits[:, 0])
    ones = jnp.stack(ones, 1)
    np.testing.assert_allclose(many, ones, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(jnp.argmax(many, -1), jnp.argmax(ones, -1))


@pytest.mark.parametrize("topk, num_draft", [(1, 4), (2, 6)], ids=["chain", "tree"])
def test_tied_greedy_speculation_equals_plain(topk, num_draft):
    """A tied target at batch 1: plain decoding runs one-row forwards (the dot head), speculation 4- and 6-row
    verify forwards (the reduce head); greedy outputs are equal token for token."""
    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine
    from jaxspec.models import MTPDrafter, MTPModel, num_pages_needed

    cfg = DecoderConfig(**{**CFG.__dict__, "num_nextn_predict_layers": 3})
    model = MTPModel(cfg, rngs=nnx.Rngs(11), kv_dtype=jnp.float32)
    prompt = [np.random.default_rng(2).integers(0, cfg.vocab_size, 7).tolist()]
    kw = dict(max_context=48, page_size=4, num_pages=num_pages_needed(1, 48, 4))
    plain = Engine(model, None, spec=None, **kw).generate(prompt, 20)
    spec = SpecConfig(num_steps=3, topk=topk, num_draft_tokens=num_draft)
    out = Engine(model, MTPDrafter(model), spec=spec, **kw).generate(prompt, 20)
    assert len(plain.tokens[0]) == 20
    np.testing.assert_array_equal(out.tokens[0], plain.tokens[0])
