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
