"""A dense causal forward with ``dense_metadata(attention="xla" | "cudnn")`` runs ``jax.nn.dot_product_attention``
(is_causal) instead of the masked jnp reference over ``[B, H, T, T]`` scores: the drafter trainer's teacher
(``--teacher-attention``). CPU: the XLA implementation against the reference, and the refusals.

Tolerance: both forms sum the same f32 products in a different order (one fused softmax against the reference's
separate max, exp and sum); over two layers of random weights the logits differ by ~1e-6 of their scale, so 2e-5
of the largest logit is far above rounding and far below a masking or GQA mistake (which moves logits by O(1))."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder
from jaxspec.pipeline import dense_metadata

CFG = DecoderConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def model():
    return Decoder(CFG, rngs=nnx.Rngs(int(np.random.default_rng().integers(1 << 30))))


def _logits(model, tokens, meta):
    return jax.jit(lambda t, m: model.forward(t, m, None)[0])(tokens, meta)


@pytest.mark.parametrize("b,t", [(1, 1), (3, 37), (2, 64)])
def test_xla_causal_attention_equals_the_reference(model, b, t):
    tokens = jnp.asarray(np.random.default_rng().integers(0, CFG.vocab_size, (b, t)), jnp.int32)
    ref = _logits(model, tokens, dense_metadata(b, t))
    fused = _logits(model, tokens, dense_metadata(b, t, attention="xla"))
    scale = float(jnp.max(jnp.abs(ref)))
    assert float(jnp.max(jnp.abs(fused - ref))) <= 2e-5 * scale
    # causal: a later token changes no earlier row's logits
    other = tokens.at[:, -1].set((tokens[:, -1] + 1) % CFG.vocab_size)
    moved = _logits(model, other, dense_metadata(b, t, attention="xla"))
    np.testing.assert_array_equal(np.asarray(moved[:, :-1]), np.asarray(fused[:, :-1]))


def test_only_the_marked_metadata_takes_the_fused_path(model):
    b, t = 2, 24
    tokens = jnp.zeros((b, t), jnp.int32)
    ref = str(jax.make_jaxpr(lambda m: model.forward(tokens, m, None)[0])(dense_metadata(b, t)))
    fused = str(jax.make_jaxpr(lambda m: model.forward(tokens, m, None)[0])(dense_metadata(b, t, attention="xla")))
    assert "_reference_with_write" in ref and "_reference_with_write" not in fused
    assert dense_metadata(b, t).causal_attention is None


def test_refusals(model):
    with pytest.raises(ValueError, match="attention: expected one of"):
        dense_metadata(2, 4, attention="flash")
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="causal_attention: 'cudnn' needs a GPU"):
            _logits(model, jnp.zeros((1, 4), jnp.int32), dense_metadata(1, 4, attention="cudnn"))
    from jaxspec.models.distill_step import distill_step

    with pytest.raises(ValueError, match="teacher_attention"):
        distill_step(model, model, "mtp", steps=1, lr=1e-3, teacher_attention="flash")


def test_xla_attention_in_bf16_under_strict_promotion():
    """A bf16 model's XLA attention under this suite's strict dtype promotion (jax's implementation promotes the 16-bit
    scores to float32 itself): the reference's logits within bf16 rounding (3% of their scale, as on the GPU)."""
    cfg = DecoderConfig(vocab_size=256, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    model = Decoder(cfg, rngs=nnx.Rngs(int(np.random.default_rng().integers(1 << 30))), param_dtype=jnp.bfloat16)
    tokens = jnp.asarray(np.random.default_rng().integers(0, cfg.vocab_size, (2, 23)), jnp.int32)
    ref = _logits(model, tokens, dense_metadata(2, 23)).astype(jnp.float32)
    got = _logits(model, tokens, dense_metadata(2, 23, attention="xla")).astype(jnp.float32)
    assert float(jnp.max(jnp.abs(got - ref))) <= 0.03 * float(jnp.max(jnp.abs(ref)))


@pytest.mark.gpu
@pytest.mark.parametrize("implementation", ["xla", "cudnn"])
def test_gpu_causal_attention_bf16(implementation):
    """On a GPU in bf16, SmolLM2's attention shape (9 heads, 3 KV heads, head 64): each implementation against the
    reference within bf16 rounding (logits within 3% of their scale: a bf16 forward's own spread from reordering)."""
    cfg = DecoderConfig(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                        num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    model = Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    tokens = jnp.asarray(np.random.default_rng().integers(0, cfg.vocab_size, (4, 329)), jnp.int32)
    ref = _logits(model, tokens, dense_metadata(4, 329)).astype(jnp.float32)
    got = _logits(model, tokens, dense_metadata(4, 329, attention=implementation)).astype(jnp.float32)
    assert float(jnp.max(jnp.abs(got - ref))) <= 0.03 * float(jnp.max(jnp.abs(ref)))
