"""Tiny Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) and a DeepSeek-style MTP draft, in Flax NNX.

Attention runs over a paged KV cache passed in and returned as a value (``PagedKVCache``). A forward
covers a ragged batch laid out as ``B`` rows of ``Q`` fresh tokens (static ``Q``; padded rows are masked):

* the committed prefix of row ``b`` (logical positions ``< prefix_lens[b]``) is gathered from the pool
  through ``req_to_token[b, :W]`` (static ``W``);
* the ``Q`` fresh tokens attend to each other through ``qmask (B, Q, Q)`` -- causal for prefill / extend,
  the QLEN_ONLY tree mask (``jaxspec.ops.tree.build_tree``) for verify, the identity for draft beams;
* their rotated K/V are written to the slot ids ``write_locs (B, Q)`` (``None``: nothing is written, e.g.
  draft beams that must not clobber the committed draft KV).

The MTP layer ``s`` mirrors the seed ``MTPDraftWorker`` / DeepSeek-V3 MTP module: it takes the hidden state
of the previous position from the target (``s == 0``) or from MTP layer ``s - 1`` plus the embedding of the
next token, RMS-normalises both, concatenates ``[enorm(emb), hnorm(h)]``, projects ``2D -> D``, runs one
transformer block with its own KV cache (layer ``s`` of the draft cache), and reuses the target's final
norm and LM head. Hidden states passed around are pre-final-norm (SGLang's "hidden before norm").
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.models.cache import PagedKVCache, init_cache
from jaxspec.models.config import ModelConfig
from jaxspec.protocols import AttentionMetadata

# All matmuls at HIGHEST precision: the losslessness check compares greedy argmaxes of the verify forward
# (Q = N tokens) with plain decode (Q = 1); TF32 on the GPU would make near-ties flip between the two.
_PREC = jax.lax.Precision.HIGHEST
_MASKED = -1e30  # finite "minus infinity": every query row sees at least itself, so no all-masked rows


class ForwardInputs(NamedTuple):
    """Per-forward attention metadata (all int32 unless noted).

    positions:   (B, Q) RoPE positions of the fresh tokens.
    qmask:       (B, Q, Q) bool, fresh-to-fresh visibility (row = query).
    prefix_lens: (B,) committed prefix length visible from the cache, or None (no prefix).
    write_locs:  (B, Q) KV slot ids for the fresh tokens, or None (no write).
    """

    positions: jax.Array
    qmask: jax.Array
    prefix_lens: jax.Array | None = None
    write_locs: jax.Array | None = None


def _param(rngs: nnx.Rngs, shape, fan_in: int) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * (fan_in**-0.5))


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotate-half RoPE. ``x: f32[B, Q, H, E]``, ``positions: i32[B, Q]``."""
    half = x.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = positions.astype(jnp.float32)[:, :, None] * freq[None, None, :]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        var = jnp.mean(x * x, axis=-1, keepdims=True)
        scale = self.scale[...].reshape((1,) * (x.ndim - 1) + (-1,))
        return x * jax.lax.rsqrt(var + self.eps) * scale


def _attend(q, k_new, v_new, qmask, k_pre, v_pre, pre_mask):
    """GQA attention of ``q (B,Q,Hq,E)`` over [prefix (B,W) | fresh (B,Q)] keys; returns ``(B, Q, Hq*E)``."""
    b, nq, hq, e = q.shape
    hkv = k_new.shape[2]
    q = q.reshape(b, nq, hkv, hq // hkv, e) * (e**-0.5)
    s = jnp.einsum("bqhge,bkhe->bhgqk", q, k_new, precision=_PREC)
    s = jnp.where(qmask[:, None, None, :, :], s, _MASKED)
    v = v_new
    if k_pre is not None:
        s_pre = jnp.einsum("bqhge,bwhe->bhgqw", q, k_pre, precision=_PREC)
        s_pre = jnp.where(pre_mask[:, None, None, None, :], s_pre, _MASKED)
        s = jnp.concatenate([s_pre, s], axis=-1)
        v = jnp.concatenate([v_pre, v_new], axis=1)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bhgqk,bkhe->bqhge", p, v, precision=_PREC)
    return out.reshape(b, nq, hq * e)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, e = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.wq = _param(rngs, (d, cfg.num_heads * e), d)
        self.wk = _param(rngs, (d, cfg.num_kv_heads * e), d)
        self.wv = _param(rngs, (d, cfg.num_kv_heads * e), d)
        self.wo = _param(rngs, (cfg.num_heads * e, d), cfg.num_heads * e)

    def __call__(self, x, inp: ForwardInputs, cache: PagedKVCache | None, layer: int):
        cfg = self.cfg
        b, nq, _ = x.shape
        e = cfg.head_dim
        q = jnp.einsum("bqd,df->bqf", x, self.wq[...], precision=_PREC).reshape(b, nq, cfg.num_heads, e)
        k = jnp.einsum("bqd,df->bqf", x, self.wk[...], precision=_PREC).reshape(b, nq, cfg.num_kv_heads, e)
        v = jnp.einsum("bqd,df->bqf", x, self.wv[...], precision=_PREC).reshape(b, nq, cfg.num_kv_heads, e)
        q = apply_rope(q, inp.positions, cfg.rope_theta)
        k = apply_rope(k, inp.positions, cfg.rope_theta)
        k_pre = v_pre = pre_mask = None
        if cache is not None and inp.prefix_lens is not None:
            # Gather-before-scatter: the prefix (< prefix_lens) never overlaps this forward's write slots.
            locs = cache.req_to_token[:b]  # (B, W): batch row b uses request row b
            k_pre, v_pre = cache.k[layer][locs], cache.v[layer][locs]  # (B, W, Hkv, E)
            w = locs.shape[1]
            pre_mask = jnp.arange(w, dtype=jnp.int32)[None, :] < inp.prefix_lens[:, None]
        out = _attend(q, k, v, inp.qmask, k_pre, v_pre, pre_mask)
        if cache is not None and inp.write_locs is not None:
            flat = inp.write_locs.reshape(-1)
            cache = PagedKVCache(
                k=cache.k.at[layer, flat].set(k.reshape(b * nq, cfg.num_kv_heads, e)),
                v=cache.v.at[layer, flat].set(v.reshape(b * nq, cfg.num_kv_heads, e)),
                req_to_token=cache.req_to_token,
            )
        return jnp.einsum("bqf,fd->bqd", out, self.wo[...], precision=_PREC), cache


class SwiGLU(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.ffn_size
        self.w_gate = _param(rngs, (d, f), d)
        self.w_up = _param(rngs, (d, f), d)
        self.w_down = _param(rngs, (f, d), f)

    def __call__(self, x):
        g = jnp.einsum("bqd,df->bqf", x, self.w_gate[...], precision=_PREC)
        u = jnp.einsum("bqd,df->bqf", x, self.w_up[...], precision=_PREC)
        return jnp.einsum("bqf,fd->bqd", jax.nn.silu(g) * u, self.w_down[...], precision=_PREC)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = SwiGLU(cfg, rngs)

    def __call__(self, x, inp: ForwardInputs, cache: PagedKVCache | None, layer: int):
        a, cache = self.attn(self.attn_norm(x), inp, cache, layer)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), cache


class MTPLayer(nnx.Module):
    """One MTP module: ``block(eh_proj([enorm(emb(next token)), hnorm(h_prev)]))``."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.enorm = RMSNorm(d, cfg.norm_eps)
        self.hnorm = RMSNorm(d, cfg.norm_eps)
        self.eh_proj = _param(rngs, (2 * d, d), 2 * d)
        self.block = Block(cfg, rngs)

    def __call__(self, h_prev, emb, inp: ForwardInputs, cache: PagedKVCache | None, layer: int):
        x = jnp.concatenate([self.enorm(emb), self.hnorm(h_prev)], axis=-1)
        x = jnp.einsum("bqc,cd->bqd", x, self.eh_proj[...], precision=_PREC)
        return self.block(x, inp, cache, layer)


class TinyPair(nnx.Module):
    """Target decoder + ``num_mtp_layers`` MTP draft layers sharing its embedding, final norm and LM head."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Param(jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), jnp.float32))
        self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), cfg.hidden_size)
        self.mtp = nnx.List([MTPLayer(cfg, rngs) for _ in range(cfg.num_mtp_layers)])

    def logits(self, h):
        """Shared head: ``f32[..., V]`` from pre-norm hidden ``f32[..., D]``."""
        return jnp.einsum("...d,dv->...v", self.final_norm(h), self.lm_head[...], precision=_PREC)

    def target(self, tokens, inp: ForwardInputs, cache: PagedKVCache | None):
        """Target forward. ``tokens: i32[B, Q]`` -> ``(logits f32[B,Q,V], hidden f32[B,Q,D], cache)``."""
        x = self.embed[...][tokens]
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, inp, cache, i)
        return self.logits(x), x, cache

    def draft(self, step: int, h_prev, tokens, inp: ForwardInputs, cache: PagedKVCache | None):
        """MTP layer ``step`` (static). ``h_prev: f32[B,Q,D]``, ``tokens: i32[B,Q]`` (the *next* tokens).

        Returns ``(logits f32[B,Q,V], hidden f32[B,Q,D], cache)``; KV goes to layer ``step`` of ``cache``.
        """
        x, cache = self.mtp[step](h_prev, self.embed[...][tokens], inp, cache, step)
        return self.logits(x), x, cache

    # -------- jaxspec.protocols: TargetModel (forward, make_cache) and MTPHead (mtp_forward, make_draft_cache)
    # Attention gathers the prefix through ``cache.req_to_token[:B]`` (batch row b = table row b, as the
    # engine lays rows out), which equals ``meta.prefix_slots(W)`` for its page-aligned tables.
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def feature_size(self) -> int:
        return self.cfg.hidden_size

    @property
    def num_mtp_layers(self) -> int:
        return self.cfg.num_mtp_layers

    def kv_bytes_per_slot(self) -> int:
        return self.cfg.num_layers * 2 * self.cfg.num_kv_heads * self.cfg.head_dim * 4  # f32 K and V

    def make_cache(self, req_to_token, num_slots: int) -> PagedKVCache:
        return init_cache(self.cfg.num_layers, self.cfg, req_to_token, page_size=1, num_pages=num_slots)

    def make_draft_cache(self, req_to_token, num_slots: int) -> PagedKVCache:
        return init_cache(self.cfg.num_mtp_layers, self.cfg, req_to_token, page_size=1, num_pages=num_slots)

    def forward(self, tokens, meta: AttentionMetadata, cache: PagedKVCache):
        return self.target(tokens, _inputs(meta), cache)

    def mtp_forward(self, step: int, h_prev, tokens, meta: AttentionMetadata, cache: PagedKVCache):
        return self.draft(step, h_prev, tokens, _inputs(meta), cache)


def _inputs(meta: AttentionMetadata) -> ForwardInputs:
    return ForwardInputs(meta.positions, meta.qmask, meta.prefix_lens, meta.write_locs)


def causal_mask(batch: int, q: int) -> jax.Array:
    """``bool[B, Q, Q]`` lower-triangular (query row i sees fresh keys j <= i)."""
    m = jnp.arange(q)[:, None] >= jnp.arange(q)[None, :]
    return jnp.broadcast_to(m[None], (batch, q, q))
