"""A dense causal forward (``pipeline.dense_metadata``: training's teacher and the MTP student) runs one fused
causal attention (``jax.nn.dot_product_attention``) instead of the masked jnp reference over ``[B, H, T, T]``
scores; ``implementation="reference"`` and any metadata not marked ``causal`` keep the reference. CPU.

Tolerance: both forms sum the same f32 products in a different order (XLA's fused softmax against the
reference's separate max, exp and sum); over two layers of random weights the logits differ by ~1e-6 of their
scale, so 2e-5 of the largest logit (f32) is far above rounding and far below any mistake in masking or GQA
(a wrong mask moves logits by O(1))."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder
from jaxspec.pipeline import causal_qmask, dense_metadata

CFG = DecoderConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(int(np.random.default_rng().integers(1 << 30))))


def _logits(model, tokens, meta):
    return jax.jit(lambda t, m: model.forward(t, m, None)[0])(tokens, meta)


@pytest.mark.parametrize("b,t", [(1, 1), (3, 37), (2, 64)])
def test_fused_causal_equals_the_reference(model, b, t):
    tokens = jnp.asarray(np.random.default_rng().integers(0, CFG.vocab_size, (b, t)), jnp.int32)
    meta = dense_metadata(b, t)
    assert meta.causal
    fused = _logits(model, tokens, meta)
    ref = _logits(model, tokens, dataclasses.replace(meta, implementation="reference"))
    scale = float(jnp.max(jnp.abs(ref)))
    assert float(jnp.max(jnp.abs(fused - ref))) <= 2e-5 * scale
    # causal: a later token changes no earlier row's logits
    other = tokens.at[:, -1].set((tokens[:, -1] + 1) % CFG.vocab_size)
    moved = _logits(model, other, meta)
    np.testing.assert_array_equal(np.asarray(moved[:, :-1]), np.asarray(fused[:, :-1]))


def test_fused_path_is_the_dense_causal_one_only(model):
    """The dense causal forward does not run the masked reference; a metadata not marked causal (any qmask)
    does, and reads its mask."""
    b, t = 2, 24
    tokens = jnp.zeros((b, t), jnp.int32)
    meta = dense_metadata(b, t)
    fused = str(jax.make_jaxpr(lambda m: model.forward(tokens, m, None)[0])(meta))
    plain = dataclasses.replace(meta, causal=False)
    ref = str(jax.make_jaxpr(lambda m: model.forward(tokens, m, None)[0])(plain))
    assert "_reference_with_write" in ref and "_reference_with_write" not in fused
    # a non-causal qmask (a tree's) through the reference differs from the causal result: the mask is read
    rng = np.random.default_rng()
    q = np.asarray(causal_qmask(b, t)).copy()
    q[:, -1, : t // 2] = False
    tok = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)), jnp.int32)
    masked = _logits(model, tok, dataclasses.replace(plain, qmask=jnp.asarray(q)))
    causal = _logits(model, tok, meta)
    assert float(jnp.max(jnp.abs(masked[:, -1] - causal[:, -1]))) > 1e-3
    np.testing.assert_allclose(np.asarray(masked[:, :-1]), np.asarray(causal[:, :-1]), rtol=0, atol=2e-5 * float(
        jnp.max(jnp.abs(causal))))
