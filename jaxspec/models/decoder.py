"""Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral) in Flax NNX: the jaxspec ``TargetModel``.

RMSNorm, RoPE (``rope_theta``, optional Llama-3 ``rope_scaling``), GQA, SwiGLU, optional q/k/v bias (Qwen2)
and tied embeddings. Parameters keep the Hugging Face module names (``embed_tokens``, ``layers[i].self_attn
.o_proj``, ``mlp.down_proj``, ``input_layernorm``, ``norm``, ``lm_head``) except SGLang's two fused
projections, ``self_attn.qkv_proj`` (q/k/v) and ``mlp.gate_up_proj`` (gate/up), with kernels stored
``[in, out]``; ``jaxspec.models.checkpoint`` maps them to and from safetensors.

Precision: weights in ``param_dtype`` (f32 or bf16); the residual stream, norms, RoPE, attention softmax and
every matmul accumulation run in float32 (matmul inputs are cast to the weight dtype). The KV pool dtype
is ``kv_dtype`` (default bf16 on GPU, f32 on CPU). Attention is ``jaxspec.kernels.paged_attention`` (prefill,
decode, verify and draft extend alike), its kernel picked by ``meta.implementation`` / ``meta.interpret``;
queries and fresh K/V are cast to the pool dtype for it (softmax and accumulation in float32).

Batch-invariant forwards (``meta.batch_invariant``): every matmul is ``invariant_matmul`` (the RMSNorm before
it inside the product, its mean square summed in a fixed order) and attention is ``invariant_attention``, so a
row's logits do not depend on the other rows of the call (a verify window's row equals the same token decoded
alone; a request's rows equal the same request in any batch); RoPE, the activations and the residual stream
are elementwise. ``meta.implementation == "reference"`` runs their jnp references, anything else their Pallas
kernels where they can (on a GPU, or interpreted with ``meta.interpret``).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec._validate import check
from jaxspec.kernels import paged_attention
from jaxspec.kernels.invariant_attention import invariant_attention
from jaxspec.kernels.invariant_matmul import invariant_matmul
from jaxspec.models.config import DecoderConfig
from jaxspec.protocols import AttentionMetadata, PagedKVCache

_F32 = jnp.float32
# Every matmul at HIGHEST precision: the losslessness check compares greedy argmaxes of the verify forward
# (Q = N tokens) with plain decode (Q = 1); TF32 on the GPU would make near-ties flip between the two.
PREC = jax.lax.Precision.HIGHEST


def default_kv_dtype():
    """bf16 on GPU/TPU, f32 on CPU (where bf16 arithmetic is emulated and slow)."""
    return _F32 if jax.default_backend() == "cpu" else jnp.bfloat16


def _bcast(w, ndim: int):
    """A ``[D]`` vector shaped to broadcast over ``[..., D]`` (rank promotion is an error in this project)."""
    return w.reshape((1,) * (ndim - 1) + (-1,))


def _init(rngs: nnx.Rngs, shape, fan_in: int, dtype) -> nnx.Param:
    return nnx.Param((jax.random.normal(rngs.params(), shape, _F32) * (fan_in**-0.5)).astype(dtype))


class Linear(nnx.Module):
    """``x @ kernel (+ bias)``, kernel ``[in, out]``; inputs cast to the kernel dtype, f32 accumulation."""

    def __init__(self, fan_in: int, fan_out: int, *, bias: bool, dtype, rngs: nnx.Rngs):
        self.kernel = _init(rngs, (fan_in, fan_out), fan_in, dtype)
        self.bias = nnx.Param(jnp.zeros((fan_out,), dtype)) if bias else None

    def __call__(self, x, invariant=None, norm=None):
        """``invariant``: ``None``, or the ``invariant_matmul`` kernel switch of a batch-invariant forward.
        ``norm``: an ``RMSNorm`` applied to ``x`` first (fused into the matmul when invariant)."""
        w = self.kernel[...]
        if invariant is not None:
            kw = {} if norm is None else dict(norm_weight=norm.weight[...], norm_eps=norm.eps)
            y = invariant_matmul(x.reshape(-1, x.shape[-1]), w, **kw, **invariant).reshape(*x.shape[:-1], -1)
            return y if self.bias is None else y + _bcast(self.bias[...].astype(_F32), y.ndim)
        if norm is not None:
            x = norm(x)
        if w.dtype == _F32:
            y = jnp.einsum("...d,df->...f", x.astype(w.dtype), w, precision=PREC, preferred_element_type=_F32)
        else:
            y = _dot16(x.astype(w.dtype), w)  # the same product; one row padded to two (below)
        return y if self.bias is None else y + _bcast(self.bias[...].astype(_F32), y.ndim)


def _with_zero_row(x):
    """``x [1, ...]`` -> ``[2, ...]`` (a zero row appended along axis 0): how a single row becomes a 2-row GEMM
    operand (``_dot16``). A 16-bit batch-1 decode layer appends it before its norms, so q/k/v and gate/up get
    2-row inputs without a pad of their own (measured on the H200, 8B plain step at batch 1: 638 kernels per
    step instead of 694; its time moved within the ~5% between runs)."""
    return jnp.concatenate([x, jnp.zeros_like(x)], axis=0)


def _dot16(x, w):
    """``x [..., D] @ w [D, F]`` for 16-bit weights, float32 accumulation. A single row (batch-1 decode) is
    computed as two: XLA:GPU rewrites a vector-matrix dot into a column reduction, which read the 8B model's
    4096 x 4096 projections at 0.6 TB/s on the H200 (plain 8B forward at batch 1: 10.6 ms with the vector
    dot, 4.4 ms padded); a 2-row dot stays a GEMM. The optimization barrier keeps XLA from simplifying the
    padding row away. More rows: unchanged."""
    lead = x.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    x2 = x.reshape(rows, x.shape[-1])
    if rows == 1:
        x2 = jax.lax.optimization_barrier(_with_zero_row(x2))
    y = _dot_f32(x2, w)[:rows]
    return y.reshape(*lead, w.shape[1])


@jax.custom_vjp
def _dot_f32(x, w):
    """``x [N, D] @ w [D, F]`` (same dtype) -> ``f32[N, F]``, HIGHEST. Its gradient multiplies in the operands'
    dtype: the float32 cotangent is cast to it first, so a 16-bit layer's backward products stay 16-bit GEMMs
    with float32 accumulation (autodiff would pair the f32 cotangent with the 16-bit operand, which XLA runs as
    a float32 GEMM: on the H200 a bf16 draft head's backward took ~8x its forward's time). For float32
    operands it is autodiff's gradient."""
    return jnp.dot(x, w, precision=PREC, preferred_element_type=_F32)


def _dot_f32_fwd(x, w):
    return _dot_f32(x, w), (x, w)


def _dot_f32_bwd(res, g):
    x, w = res
    g = g.astype(w.dtype)
    dx = jnp.dot(g, w.T, precision=PREC, preferred_element_type=_F32).astype(x.dtype)
    dw = jnp.dot(x.T, g, precision=PREC, preferred_element_type=_F32).astype(w.dtype)
    return dx, dw


_dot_f32.defvjp(_dot_f32_fwd, _dot_f32_bwd)


# Row counts for which ``tied_head`` computes the product as a fused multiply-reduce on XLA:CPU (below).
CPU_REDUCE_HEAD_ROWS = (2, 32)


def _invariant_impl(meta: AttentionMetadata) -> dict | None:
    """The kernel switch (``implementation`` / ``interpret``) of a batch-invariant forward's ``invariant_matmul``
    and ``invariant_attention``, or None for a default forward: ``"reference"`` stays the jnp reference, any other
    choice runs the Pallas kernels where they can (``"pallas"`` when interpreting, else ``"auto"``)."""
    if not meta.batch_invariant:
        return None
    if meta.implementation == "reference":
        return dict(implementation="reference", interpret=False)
    return dict(implementation="pallas" if meta.interpret else "auto", interpret=meta.interpret)


def _project(linear, x, invariant, norm=None):
    """``linear(x)``, or in a batch-invariant forward ``linear(x, invariant, norm)`` (a default forward calls a
    projection with ``x`` alone, so any module with that call can stand in for a ``Linear``)."""
    if invariant is None:
        return linear(x if norm is None else norm(x))
    return linear(x, invariant, norm)


def tied_head(x, w):
    """``x [..., D] . w [V, D]`` over ``D`` -> ``f32[..., V]``: the tied LM head (``w`` the embedding table).

    One row, and any row count off XLA:CPU or for 16-bit weights: one dot. On XLA:CPU with f32 weights and 2 to 32
    rows (a verify forward's window): ``sum(w[:, None, :] * x[None, :, :], -1)``, which XLA:CPU compiles into
    one fused multiply-reduce (no ``[V, rows, D]`` product is materialized) that reads each row of ``w`` once
    against every row of ``x``. XLA:CPU hands a multi-row f32 dot to YNNPACK, whose GEMM against a ``[V, D]``
    (transposed) operand streams the table at about a third of the one-row GEMV's rate: SmolLM2-135M's 49152 x
    576 head at 4 rows cost 2.3-2.4 one-row heads as a dot, about 1.3 this way, and stays ahead up to 32 rows
    (2-core AMD EPYC, jaxlib 0.10; docs/cpu_verify_forward.md). Both sum the same f32 products in float32, in a
    different order (logits agree to float32 rounding, not bit for bit)."""
    lead, d = x.shape[:-1], x.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    lo, hi = CPU_REDUCE_HEAD_ROWS
    if w.dtype == _F32 and lo <= rows <= hi and jax.default_backend() == "cpu":
        x2 = x.astype(_F32).reshape(rows, d)
        return jnp.sum(w[:, None, :] * x2[None, :, :], axis=-1).T.reshape(*lead, w.shape[0])
    return jnp.einsum("...d,vd->...v", x.astype(w.dtype), w, precision=PREC, preferred_element_type=_F32)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        x = x.astype(_F32)
        var = jnp.mean(x * x, axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(var + self.eps) * _bcast(self.weight[...].astype(_F32), x.ndim)


def rope_inv_freq(cfg: DecoderConfig) -> jax.Array:
    """``f32[E/2]`` RoPE frequencies ``theta^(-2i/E)``, with Llama-3 ``rope_scaling`` applied when set."""
    half = cfg.head_dim // 2
    inv = cfg.rope_theta ** (-jnp.arange(half, dtype=_F32) / half)
    if cfg.rope_scaling is None:
        return inv
    rs = dict(cfg.rope_scaling)
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    ctx = rs["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    scaled = jnp.where(wavelen > ctx / lo, inv / factor, inv)
    smooth = (ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= ctx / hi) & (wavelen <= ctx / lo)
    return jnp.where(medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate-half RoPE. ``x: f32[B, Q, H, E]``, ``positions: i32[B, Q]``."""
    half = x.shape[-1] // 2
    ang = positions.astype(_F32)[:, :, None] * inv_freq[None, None, :]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _write_slots(write_locs, num_slots: int):
    """``write_locs`` flattened, a slot outside ``[0, num_slots)`` sent to slot 0: the dummy slot that padding
    tokens write to (page 0, never a request's; SGLang's KV pools keep slot 0 for the same purpose), so every
    write lands in the pool (``paged_attention(write_locs=)`` itself drops an out-of-range slot). With checks on
    (``JAXSPEC_CHECKS``) an out-of-range slot is an error."""
    flat = write_locs.reshape(-1)
    ok = (flat >= 0) & (flat < num_slots)
    check(jnp.all(ok), f"write_locs: every slot must lie in [0, {num_slots}) (the KV pool's slots)")
    return jnp.where(ok, flat, 0)


class SelfAttention(nnx.Module):
    """GQA self-attention. ``qkv_proj`` is SGLang's fused ``QKVParallelLinear``: the q, k and v projections
    (Hugging Face ``q_proj`` / ``k_proj`` / ``v_proj``) stacked along the output axis, one GEMM instead of three
    (the checkpoint loader stacks and splits them)."""

    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        d, e, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.cfg = cfg
        self.qkv_proj = Linear(d, (hq + 2 * hkv) * e, bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(hq * e, d, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x, meta: AttentionMetadata, cache: PagedKVCache | None, layer: int, norm=None):
        """``x [B, Q, D]`` (or ``[2, 1, D]`` for ``B = Q = 1``: ``_with_zero_row``; the rows past ``B`` are
        dropped after the projections) -> ``([B, Q, D], cache)``; ``norm``: an ``RMSNorm`` for ``x`` (see
        ``Linear``)."""
        cfg = self.cfg
        b, nq = meta.positions.shape
        e, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        inv_freq = rope_inv_freq(cfg)
        inv = _invariant_impl(meta)
        qkv = _project(self.qkv_proj, x, inv, norm)[:b].reshape(b, nq, hq + 2 * hkv, e)
        q = apply_rope(qkv[:, :, :hq], meta.positions, inv_freq)
        k = apply_rope(qkv[:, :, hq:hq + hkv], meta.positions, inv_freq)
        v = qkv[:, :, hq + hkv:]
        if inv is not None:
            out, cache = self._invariant_attention(q, k, v, meta, cache, layer, inv)
        elif cache is None and meta.causal_attention is not None:  # dense causal (training's teacher)
            dt = self.qkv_proj.kernel[...].dtype  # in the weights' dtype, as the paged path casts to its pool's
            out = _dense_causal_attention(q.astype(dt), k.astype(dt), v.astype(dt), e**-0.5, meta.causal_attention)
        elif cache is None:  # dense forward (training, tests): no prefix and nothing paged, so the jnp reference
            pool = k.reshape(b * nq, hkv, e)
            out = paged_attention(q, k, v, pool, pool, meta.page_table[:, :0], meta.prefix_lens, meta.qmask,
                                  page_size=1, sm_scale=e**-0.5, implementation="reference")
        else:
            # paged_attention writes the fresh K/V at their slots and attends (on the GPU inside the attention
            # kernel: no scatter kernels; elsewhere write first, then attend). The prefix never overlaps the
            # write slots, so the order does not change the result. The pools stay in place: the next layer's
            # write depends on this layer's result (attending to the OLD pool while scattering into it left
            # XLA:GPU no data dependence to order the read before the write, so it copied the whole [L, X, Hkv, E]
            # pool per layer: 55 ms of a 62 ms 8B decode step at batch 32).
            dt = cache.k.dtype
            locs = None if meta.write_locs is None else _write_slots(meta.write_locs, cache.k.shape[1])
            out = paged_attention(q.astype(dt), k.astype(dt), v.astype(dt), cache.k, cache.v, meta.page_table,
                                  meta.prefix_lens, meta.qmask, page_size=meta.page_size, sm_scale=e**-0.5,
                                  implementation=meta.implementation, interpret=meta.interpret, layer=layer,
                                  write_locs=locs)
            if locs is not None:
                out, k_pool, v_pool = out
                cache = PagedKVCache(k=k_pool, v=v_pool, req_to_token=cache.req_to_token)
        return _project(self.o_proj, out.reshape(b, nq, -1), inv), cache

    def _invariant_attention(self, q, k, v, meta: AttentionMetadata, cache: PagedKVCache | None, layer: int,
                             inv: dict):
        """``invariant_attention`` over the paged pool (fresh K/V written at ``meta.write_locs``), or for a dense
        forward over the fresh tokens alone (a pool of them)."""
        b, nq, _, e = q.shape
        if cache is None:
            pool = k.reshape(b * nq, *k.shape[2:])
            locs = jnp.arange(b * nq, dtype=jnp.int32).reshape(b, nq)
            out, _, _ = invariant_attention(q, k, v, pool, v.reshape(pool.shape), meta.page_table[:, :0],
                                            jnp.zeros((b,), jnp.int32), meta.positions - meta.positions[:, :1],
                                            meta.qmask, locs, page_size=1, sm_scale=e**-0.5, **inv)
            return out, None
        if meta.write_locs is None:
            raise ValueError("meta.write_locs: a batch-invariant forward over a paged cache writes its fresh K/V "
                             "(it attends to them from the pool); got None")
        dt = cache.k.dtype
        locs = _write_slots(meta.write_locs, cache.k.shape[1]).reshape(b, nq)
        out, k_pool, v_pool = invariant_attention(
            q.astype(dt), k.astype(dt), v.astype(dt), cache.k, cache.v, meta.page_table, meta.prefix_lens,
            meta.positions, meta.qmask, locs, page_size=meta.page_size, sm_scale=e**-0.5, layer=layer, **inv)
        return out, PagedKVCache(k=k_pool, v=v_pool, req_to_token=cache.req_to_token)


def _dense_causal_attention(q, k, v, scale: float, implementation: str):
    """``jax.nn.dot_product_attention`` over a dense causal forward (``AttentionMetadata.causal_attention``): ``q
    [B, T, Hq, E]``, ``k, v [B, T, Hkv, E]`` (GQA) in the weights' dtype -> ``[B, T, Hq, E]`` in that dtype; f32
    at highest precision."""
    if implementation == "cudnn" and (jax.default_backend() != "gpu" or q.dtype not in (jnp.bfloat16, jnp.float16)):
        raise ValueError(f"causal_attention: 'cudnn' needs a GPU and 16-bit weights, got backend "
                         f"{jax.default_backend()!r} and {q.dtype}")
    # standard promotion: jax's XLA implementation promotes 16-bit scores to float32 itself, which strict promotion
    # (a setting of the caller's) refuses
    with jax.default_matmul_precision("highest" if q.dtype == jnp.float32 else "default"), \
            jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), scale=scale, is_causal=True,
                                            implementation=implementation)


class MLP(nnx.Module):
    """SwiGLU. ``gate_up_proj`` is SGLang's fused ``MergedColumnParallelLinear``: Hugging Face ``gate_proj``
    and ``up_proj`` stacked along the output axis (one GEMM)."""

    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.intermediate_size = f
        self.gate_up_proj = Linear(d, 2 * f, bias=False, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(f, d, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x, invariant=None, norm=None):
        f = self.intermediate_size
        gu = _project(self.gate_up_proj, x, invariant, norm)
        return _project(self.down_proj, jax.nn.silu(gu[..., :f]) * gu[..., f:], invariant)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = SelfAttention(cfg, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)

    def __call__(self, x, meta: AttentionMetadata, cache: PagedKVCache | None, layer: int):
        b, nq, _ = x.shape
        inv = _invariant_impl(meta)
        if inv is not None:  # batch-invariant: the norms run inside the matmuls
            a, cache = self.self_attn(x, meta, cache, layer, norm=self.input_layernorm)
            x = x + a
            return x + self.mlp(x, inv, norm=self.post_attention_layernorm), cache
        two = b * nq == 1 and self.mlp.down_proj.kernel[...].dtype != _F32  # 16-bit single row: _with_zero_row
        a, cache = self.self_attn(self.input_layernorm(_with_zero_row(x) if two else x), meta, cache, layer)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(_with_zero_row(x) if two else x))[:b], cache


class Decoder(nnx.Module):
    """A Llama-family decoder implementing ``jaxspec.protocols.TargetModel``.

    Args:
      cfg: the ``DecoderConfig`` (``DecoderConfig.from_hf(config_json)`` for a Hugging Face checkpoint).
      param_dtype: weight dtype (``jnp.float32`` or ``jnp.bfloat16``).
      kv_dtype: KV pool dtype; ``None``: ``default_kv_dtype()`` (bf16 on GPU, f32 on CPU).
      aux_layers: ``None``: ``hidden`` is the last layer's pre-norm output (``feature_size = D``, MTP);
        a tuple of layer indices: ``hidden`` concatenates the residual stream *entering* each of those layers
        (SGLang's EAGLE-3 capture points; index ``L`` is the final pre-norm output), ``feature_size = len * D``.
    """

    supports_batch_invariant = True  # honours ``AttentionMetadata.batch_invariant`` (module docstring)

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs, param_dtype=_F32, kv_dtype=None,
                 aux_layers: tuple[int, ...] | None = None):
        if aux_layers is not None:
            aux_layers = tuple(int(i) for i in aux_layers)
            if (not aux_layers or any(not 0 <= i <= cfg.num_hidden_layers for i in aux_layers)
                    or list(aux_layers) != sorted(set(aux_layers))):
                raise ValueError(f"aux_layers: expected a non-empty increasing tuple of layer indices in [0, "
                                 f"{cfg.num_hidden_layers}], got {aux_layers}")
        d = cfg.hidden_size
        self.cfg = cfg
        self.param_dtype = jnp.dtype(param_dtype)
        self.kv_dtype = jnp.dtype(default_kv_dtype() if kv_dtype is None else kv_dtype)
        self.aux_layers = aux_layers
        self.embed_tokens = nnx.Param(jax.random.normal(rngs.params(), (cfg.vocab_size, d), _F32).astype(param_dtype))
        self.layers = nnx.List([DecoderLayer(cfg, dtype=param_dtype, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype)
        self.lm_head = (None if cfg.tie_word_embeddings
                        else Linear(d, cfg.vocab_size, bias=False, dtype=param_dtype, rngs=rngs))

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def feature_size(self) -> int:
        return self.cfg.hidden_size * (1 if self.aux_layers is None else len(self.aux_layers))

    def _pool(self, num_layers: int, req_to_token, num_slots: int) -> PagedKVCache:
        r2t = jnp.asarray(req_to_token, jnp.int32)
        if r2t.ndim != 2:
            raise ValueError(f"req_to_token: expected i32[R, W], got shape {r2t.shape}")
        w = self.cfg.sliding_window
        if w is not None and r2t.shape[1] > w:
            raise ValueError(f"req_to_token: width {r2t.shape[1]} exceeds the model's sliding_window {w}; "
                             "sliding-window attention is not implemented (use a max context <= the window)")
        shape = (num_layers, int(num_slots), self.cfg.num_key_value_heads, self.cfg.head_dim)
        return PagedKVCache(k=jnp.zeros(shape, self.kv_dtype), v=jnp.zeros(shape, self.kv_dtype), req_to_token=r2t)

    def make_cache(self, req_to_token, num_slots: int) -> PagedKVCache:
        """A zeroed ``[L, num_slots, Hkv, E]`` pool in ``kv_dtype`` for ``req_to_token (R, W)``."""
        return self._pool(self.cfg.num_hidden_layers, req_to_token, num_slots)

    def kv_bytes_per_slot(self) -> int:
        c = self.cfg
        return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * self.kv_dtype.itemsize

    def embed(self, tokens):
        return self.embed_tokens[...][tokens].astype(_F32)

    def logits(self, h, invariant=None):
        """Shared head: ``f32[..., V]`` from the pre-norm hidden ``[..., D]`` (``invariant``: the kernel switch
        of a batch-invariant forward, or None)."""
        if invariant is not None:  # the final norm inside the head's matmul
            if self.lm_head is not None:
                return self.lm_head(h, invariant, norm=self.norm)
            w = self.embed_tokens[...]
            y = invariant_matmul(h.reshape(-1, h.shape[-1]), w, transpose_w=True, norm_weight=self.norm.weight[...],
                                 norm_eps=self.norm.eps, **invariant)
            return y.reshape(*h.shape[:-1], w.shape[0])
        x = self.norm(h)
        if self.lm_head is not None:
            return self.lm_head(x)
        return tied_head(x, self.embed_tokens[...])

    def forward(self, tokens, meta: AttentionMetadata, cache: PagedKVCache | None, rows=None):
        """``tokens i32[B, Q]`` -> ``(logits f32[B, Q, V], hidden f32[B, Q, F], cache)``.

        ``cache=None`` runs a dense forward over the fresh tokens only (``qmask``), writing nothing. ``rows``
        (``i32[R]``, indices into the ``B * Q`` flattened rows): the logits are ``f32[R, V]`` of those rows only
        (the LM head runs on ``R`` rows).
        """
        x, hidden, cache = self.trunk(tokens, meta, cache)
        if rows is not None:
            x = x.reshape(-1, x.shape[-1])[rows]
        return self.logits(x, _invariant_impl(meta)), hidden, cache

    def trunk(self, tokens, meta: AttentionMetadata, cache: PagedKVCache | None):
        """``forward`` without the head: ``(last pre-norm hidden f32[B, Q, D], hidden f32[B, Q, F], cache)``
        (what training needs when it scores only some vocabulary columns)."""
        x = self.embed(tokens)
        aux = []
        for i, layer in enumerate(self.layers):
            if self.aux_layers is not None and i in self.aux_layers:
                aux.append(x)
            x, cache = layer(x, meta, cache, i)
        if self.aux_layers is not None and len(self.layers) in self.aux_layers:
            aux.append(x)
        hidden = x if self.aux_layers is None else jnp.concatenate(aux, axis=-1)
        return x, hidden, cache
