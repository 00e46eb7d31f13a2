"""The decoder's fused projections (``self_attn.qkv_proj``, ``mlp.gate_up_proj``) against the unfused computation:
the same decoder with each fused projection replaced by its Hugging Face parts (``q_proj`` / ``k_proj`` / ``v_proj``
and ``gate_proj`` / ``up_proj``, split from the fused kernel along the output axis), each its own product, the
outputs concatenated. Random weights and inputs from fresh seeds (hypothesis), f32 on CPU, paged forwards over a
committed prefix at 1 and 4 rows and the dense forward. Both sides sum the same products over the same input
axis, so they are compared for exact equality."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec.models import Decoder, DecoderConfig, make_req_to_token
from jaxspec.models.checkpoint import FUSED, _fused_sizes
from jaxspec.models.decoder import Linear
from jaxspec.pipeline import causal_qmask
from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token

LLAMA = DecoderConfig(vocab_size=80, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=12)
QWEN = DecoderConfig(**{**LLAMA.__dict__, "model_type": "qwen2", "attention_bias": True, "tie_word_embeddings": True})


class Unfused(nnx.Module):
    """A fused ``Linear`` as its parts: one ``Linear`` per output block, each applied alone, concatenated."""

    def __init__(self, fused: Linear, sizes: tuple[int, ...]):
        w = fused.kernel[...]
        b = None if fused.bias is None else fused.bias[...]
        bounds = np.cumsum((0,) + tuple(sizes))
        self.parts = nnx.List([])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = Linear(w.shape[0], int(hi - lo), bias=b is not None, dtype=w.dtype, rngs=nnx.Rngs(0))
            part.kernel.set_value(w[:, lo:hi])
            if b is not None:
                part.bias.set_value(b[lo:hi])
            self.parts.append(part)

    def __call__(self, x):
        return jnp.concatenate([p(x) for p in self.parts], axis=-1)


def _unfused(model: Decoder) -> Decoder:
    other = nnx.merge(*nnx.split(model))
    for layer in other.layers:
        layer.self_attn.qkv_proj = Unfused(layer.self_attn.qkv_proj, _fused_sizes("qkv_proj", model.cfg))
        layer.mlp.gate_up_proj = Unfused(layer.mlp.gate_up_proj, _fused_sizes("gate_up_proj", model.cfg))
    return other


def _randomize(model: Decoder, seed: int):
    """Every parameter drawn afresh (norm weights and biases too, which start at one and zero)."""
    for i, (_, v) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.Param))):
        x = v.get_value()
        v.set_value(jax.random.normal(jax.random.key(seed + i), x.shape, jnp.float32).astype(x.dtype) * 0.3)


def _meta(r2t, g, start, n):
    return AttentionMetadata(positions=start + jnp.arange(n, dtype=jnp.int32)[None], qmask=causal_qmask(1, n),
                             prefix_lens=jnp.array([start], jnp.int32), page_table=page_table_from_req_to_token(r2t, g),
                             write_locs=r2t[:, start:start + n], page_size=g)


@nnx.jit
def _fwd(model, tokens, meta, cache):
    return model.forward(tokens, meta, cache)


def test_unfused_has_the_hf_parts():
    """The reference really is unfused: three and two products per layer, of the Hugging Face shapes."""
    ref = _unfused(Decoder(QWEN, rngs=nnx.Rngs(0)))
    attn, mlp = ref.layers[0].self_attn.qkv_proj, ref.layers[0].mlp.gate_up_proj
    assert len(FUSED["qkv_proj"]) == len(attn.parts) and len(FUSED["gate_up_proj"]) == len(mlp.parts)
    assert [p.kernel[...].shape for p in attn.parts] == [(48, 48), (48, 24), (48, 24)]
    assert [p.kernel[...].shape for p in mlp.parts] == [(48, 72), (48, 72)]
    assert all(p.bias is not None for p in attn.parts)


@settings(max_examples=4)
@given(seed=st.integers(0, 2**30), qwen=st.booleans(), prefix=st.integers(1, 9))
def test_fused_decoder_equals_unfused(seed, qwen, prefix):
    cfg = QWEN if qwen else LLAMA
    model = Decoder(cfg, rngs=nnx.Rngs(seed % 1000), kv_dtype=jnp.float32)
    _randomize(model, seed)
    ref = _unfused(model)
    rng = np.random.default_rng(seed)
    g, q = 4, 4
    r2t = jnp.asarray(make_req_to_token(1, 16, g))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, prefix + 1 + q)), jnp.int32)
    caches = []
    for m in (model, ref):
        _, _, cache = _fwd(m, tokens[:, :prefix], _meta(r2t, g, 0, prefix), m.make_cache(r2t, int(r2t.max()) + 1))
        one = _fwd(m, tokens[:, prefix:prefix + 1], _meta(r2t, g, prefix, 1), cache)
        four = _fwd(m, tokens[:, prefix + 1:], _meta(r2t, g, prefix + 1, q), one[2])
        dense = _fwd(m, tokens, AttentionMetadata(positions=jnp.arange(tokens.shape[1], dtype=jnp.int32)[None],
                                                  qmask=causal_qmask(1, tokens.shape[1]),
                                                  prefix_lens=jnp.zeros((1,), jnp.int32),
                                                  page_table=jnp.zeros((1, 0), jnp.int32)), None)
        caches.append((one, four, dense))
    for got, want in zip(caches[0], caches[1]):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)
