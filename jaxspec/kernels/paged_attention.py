"""Paged GQA attention of fresh query tokens over a request's committed KV prefix plus themselves.

One entry point covers decode (``Q = 1``), extend / prefill (``qmask`` causal) and speculative verify
(``Q = N`` draft tokens, ``qmask`` the QLEN_ONLY tree mask, or its bit-packed form through
``qmask_bits=``): every fresh token attends to the first ``prefix_lens[b]`` tokens of its request, read
through ``page_table`` from ONE layer of the paged pool (a ``[X, Hkv, E]`` pool, or layer ``layer`` of a
model's ``[L, X, Hkv, E]`` pool), and to the fresh tokens ``qmask`` allows.
Softmax runs over ``[prefix | fresh]`` in float32; the result has ``q``'s dtype.

Layout (``jaxspec.protocols.AttentionMetadata``): token ``pos`` of row ``b`` lives at pool slot
``page_table[b, pos // G] * G + pos % G``. Fresh K/V (``k_new``, ``v_new``) are not in the pool yet;
with ``write_locs=`` the call stores them there too (the Mosaic kernel inside the kernel) and returns the
updated pools beside the output.

Every query row must see at least itself (``qmask[b, i, i]`` true): then no softmax row is empty. Padded
batch rows (``prefix_lens = 0``, identity ``qmask``) are computed like any other and can be ignored.
Page-table entries past ``cdiv(prefix_lens[b], G)`` are never trusted: they are clamped into the pool
and masked out. Pool slots outside the prefixes may hold anything for the reference and the Triton
kernel; the Mosaic kernel copies whole pages (and re-reads a request's last page for the tail of its
last block), so the slots of a request's LAST page past its prefix must hold finite values (stale K/V
or the zero-initialised pool do; a NaN there would reach the output through ``0 * NaN`` in ``P @ V``).

Implementations (``implementation=``):

* ``"reference"``: pure jnp (gather the prefix, dense masked softmax), any shape and dtype;
* ``"mosaic"``: Pallas Mosaic GPU (Hopper wgmma + TMA page copies, split prefix, ``paged_attention_mosaic``);
  bf16 / fp16, head_dim a multiple of 64, page size a multiple of 8 (at most 128);
* ``"triton"``: Pallas Triton lowering (deprecated upstream; ``paged_attention_triton``), any page size and head_dim;
* ``"pallas"``: the Mosaic kernel where it applies, else the Triton one;
* ``"auto"``: on a GPU the first kernel that takes the call (Mosaic on Hopper for bf16 / fp16 when its tiles
  fit shared memory, else Triton while jax still has that lowering, with row tiles sized to shared memory),
  else the reference (no GPU, or no kernel fits: every dtype and head size runs); with ``interpret=True`` the
  Triton kernel in interpret mode. Resolved by ``kernels._backend.resolve_implementation`` (the resolver of
  every kernel) with what each kernel supports (``_unsupported``).

Both kernels compute only the prefix part, split into ``num_splits`` slices per (request, KV head)
(flash-decoding); a program handles a tile of the ``Q * Hq/Hkv`` query rows of its KV head (all of them
where they fit in shared memory, so each KV byte is read once). The fresh part and the merge of the
partial softmaxes are small jnp ops (``_attention_parts``).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.kernels import paged_attention_triton as _triton_kernel
from jaxspec.kernels._attention_parts import (fresh_partial, merge_partials, mosaic_plan, one_layer, prefix_slots,
                                              triton_plan, write_fresh_kv)
from jaxspec.kernels._backend import Implementation, resolve_implementation

try:
    from jaxspec.kernels import paged_attention_mosaic as _mosaic_kernel
except ImportError:  # pragma: no cover - a jax without the Mosaic GPU lowering: the resolver never picks it
    _mosaic_kernel = None

__all__ = ["paged_attention", "paged_attention_reference", "qmask_from_bits", "resolve_attention_implementation"]

BACKENDS = ("mosaic", "triton")  # the Pallas kernels, in the order "pallas" and "auto" prefer them


# ----------------------------------------------------------------------------------------------------
# validation


def qmask_from_bits(bits, num_tokens: int):
    """``bool[B, Q, Q]`` from the QLEN_ONLY_BITPACKING mask of ``build_tree`` (bit ``j`` of row ``i`` =
    row ``i`` sees fresh token ``j``); ``bits``: unsigned ``(B*Q,)`` or ``(B, Q)``."""
    bits = jnp.asarray(bits)
    if not jnp.issubdtype(bits.dtype, jnp.unsignedinteger):
        raise ValueError(f"qmask_bits: expected an unsigned integer array (uint8/16/32), got {bits.dtype}")
    if num_tokens > bits.dtype.itemsize * 8:
        raise ValueError(f"qmask_bits: {bits.dtype} holds {bits.dtype.itemsize * 8} bits, need Q={num_tokens}")
    if bits.ndim == 1:
        if bits.shape[0] % num_tokens:
            raise ValueError(f"qmask_bits: expected shape (B*{num_tokens},), got {bits.shape}")
        bits = bits.reshape(-1, num_tokens)
    if bits.ndim != 2 or bits.shape[1] != num_tokens:
        raise ValueError(f"qmask_bits: expected shape (B, {num_tokens}) or (B*{num_tokens},), got {bits.shape}")
    j = jnp.arange(num_tokens, dtype=jnp.uint32)
    return ((bits.astype(jnp.uint32)[:, :, None] >> j[None, None, :]) & jnp.uint32(1)) == jnp.uint32(1)


def _check(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, qmask_bits, page_size, sm_scale,
           layer=None):
    if q.ndim != 4:
        raise ValueError(f"q: expected shape (B, Q, Hq, E), got {q.shape}")
    b, nq, hq, e = q.shape
    if k_new.ndim != 4 or k_new.shape[:2] != (b, nq) or k_new.shape[3] != e:
        raise ValueError(f"k_new: expected shape ({b}, {nq}, Hkv, {e}), got {k_new.shape}")
    hkv = k_new.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"k_new: Hkv={hkv} must divide Hq={hq}")
    if v_new.shape != k_new.shape:
        raise ValueError(f"v_new: expected shape {k_new.shape}, got {v_new.shape}")
    rank = 3 if layer is None else 4
    if k_pool.ndim != rank or k_pool.shape[-2:] != (hkv, e):
        want = f"(X, {hkv}, {e})" if layer is None else f"(L, X, {hkv}, {e}) with layer="
        raise ValueError(f"k_pool: expected shape {want}, got {k_pool.shape}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool: expected shape {k_pool.shape}, got {v_pool.shape}")
    if layer is not None:
        if isinstance(layer, (int, np.integer)) and not isinstance(layer, bool):
            if not 0 <= layer < k_pool.shape[0]:
                raise ValueError(f"layer: expected an int in [0, {k_pool.shape[0]}), got {layer}")
        elif not (hasattr(layer, "dtype") and jnp.shape(layer) == () and layer.dtype == jnp.int32):
            raise ValueError(f"layer: expected a Python int or an i32[] array, got {layer!r}")
    slots = k_pool.shape[-3]
    if not isinstance(page_size, (int, np.integer)) or page_size < 1 or slots % page_size:
        raise ValueError(f"page_size: expected a positive int dividing X={slots}, got {page_size!r}")
    for name, x in (("q", q), ("k_new", k_new), ("v_new", v_new), ("k_pool", k_pool), ("v_pool", v_pool)):
        if x.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
            raise ValueError(f"{name}: expected bfloat16, float16 or float32, got {x.dtype}")
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {x.dtype} differs from q's {q.dtype}")
    if page_table.ndim != 2 or page_table.shape[0] != b or page_table.dtype != jnp.int32:
        raise ValueError(f"page_table: expected i32[{b}, P], got {page_table.dtype}{list(page_table.shape)}")
    if prefix_lens.shape != (b,) or prefix_lens.dtype != jnp.int32:
        raise ValueError(f"prefix_lens: expected i32[{b}], got {prefix_lens.dtype}{list(prefix_lens.shape)}")
    if (qmask is None) == (qmask_bits is None):
        raise ValueError("qmask / qmask_bits: pass exactly one of them")
    if qmask is None:
        qmask = qmask_from_bits(qmask_bits, nq)
    if qmask.shape != (b, nq, nq) or qmask.dtype != jnp.bool_:
        raise ValueError(f"qmask: expected bool[{b}, {nq}, {nq}], got {qmask.dtype}{list(qmask.shape)}")
    if not isinstance(sm_scale, (float, int)) or not sm_scale > 0:
        raise ValueError(f"sm_scale: expected a positive Python float, got {sm_scale!r}")
    return qmask


# ----------------------------------------------------------------------------------------------------
# reference


def _reference(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, *, page_size, sm_scale):
    """Softmax over the prefix keys and the fresh keys as two parts sharing one max and one sum, no concatenated
    scores or values (XLA:CPU, the demo pair in a compiled forward loop: the fresh part with the concatenates cost
    ~2.7 us per layer at 1 row and ~5.6 us at 4 rows; this form saved ~2.0 and ~3.4 us of them)."""
    k_pool, v_pool = one_layer(k_pool, v_pool, layer)
    b, nq, hq, e = q.shape
    hkv = k_new.shape[2]
    prec = jax.lax.Precision.HIGHEST
    f32 = jnp.float32
    slots = prefix_slots(page_table, page_size, k_pool.shape[0])
    w = slots.shape[1]
    qg = q.reshape(b, nq, hkv, hq // hkv, e)
    s_new = jnp.einsum("bqhge,bkhe->bhqgk", qg, k_new, precision=prec, preferred_element_type=f32)
    s_new = jnp.where(qmask[:, None, :, None, :], s_new * f32(sm_scale), -jnp.inf)
    m = jnp.max(s_new, axis=-1)  # [B, Hkv, Q, G]
    if w:
        k_pre, v_pre = k_pool[slots], v_pool[slots]  # [B, W, Hkv, E]
        s_pre = jnp.einsum("bqhge,bwhe->bhqgw", qg, k_pre, precision=prec, preferred_element_type=f32)
        pre_ok = jnp.arange(w, dtype=jnp.int32)[None, :] < prefix_lens[:, None]
        s_pre = jnp.where(pre_ok[:, None, None, None, :], s_pre * f32(sm_scale), -jnp.inf)
        v_pre = jnp.where(pre_ok[:, :, None, None], v_pre, jnp.zeros((), v_pre.dtype))  # 0 * NaN garbage is NaN
        m = jnp.maximum(m, jnp.max(s_pre, axis=-1))
    p_new = jnp.exp(s_new - m[..., None])
    den = jnp.sum(p_new, axis=-1)
    num = jnp.einsum("bhqgk,bkhe->bhqge", p_new, v_new.astype(f32), precision=prec)
    if w:
        p_pre = jnp.exp(s_pre - m[..., None])
        den = den + jnp.sum(p_pre, axis=-1)
        num = num + jnp.einsum("bhqgw,bwhe->bhqge", p_pre, v_pre.astype(f32), precision=prec)
    out = num / den[..., None]  # [B, Hkv, Q, G, E]
    return out.transpose(0, 2, 1, 3, 4).reshape(b, nq, hq, e).astype(q.dtype)


def paged_attention_reference(
    q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask=None, *, page_size, sm_scale, qmask_bits=None,
    layer=None,
):
    """Pure-jnp paged attention (see the module docstring for shapes); jittable, f32 softmax."""
    qmask = _check(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, qmask_bits, page_size, sm_scale,
                   layer)
    return _reference_jit(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, None,
                          page_size=int(page_size), sm_scale=float(sm_scale))


# ----------------------------------------------------------------------------------------------------
# dispatch


def _unsupported(q, page_size, hkv):
    """``backend -> why its kernel cannot take this call`` (None: it can), for the resolver."""
    e, itemsize = q.shape[-1], q.dtype.itemsize
    rows = q.shape[1] * (q.shape[2] // hkv)

    def why(backend):
        if backend == "mosaic":
            if q.dtype not in (jnp.bfloat16, jnp.float16):
                return f"does not support dtype {q.dtype} (bfloat16 / float16)"
            if e % 64:
                return f"does not support head_dim {e} (a multiple of 64)"
            if page_size % 8 or page_size > 128:
                return f"does not support page_size {page_size} (a multiple of 8, at most 128)"
            if mosaic_plan(e, itemsize, page_size) is None:
                return f"does not fit shared memory at head_dim {e}, {q.dtype} (not even one stage)"
            return None
        if triton_plan(rows, e, itemsize) is None:
            return f"does not fit shared memory at head_dim {e}, {q.dtype} (not even 16 rows, one stage)"
        return None

    return why


def resolve_attention_implementation(implementation: Implementation, q, page_size, interpret, *,
                                     hkv: int | None = None) -> str:
    """``"mosaic" | "triton" | "reference"`` for this call (``ValueError`` for an explicit impossible choice):
    ``kernels._backend.resolve_implementation`` over the backends ``("mosaic", "triton")`` with what each
    kernel supports (dtype, head size, page size, shared memory; ``hkv``: the KV heads, None: one, the most
    query rows per program).

    ``auto``: on a GPU (not interpreting) the Mosaic kernel where it applies on Hopper, else the Triton
    kernel while jax has that lowering, else the reference; interpreting (CPU tests): the Triton kernel
    (the Mosaic GPU interpreter is ~50x slower), else the reference; no GPU: the reference.
    ``pallas``: the Mosaic kernel where it applies, else the Triton kernel, else ``ValueError``.
    """
    backends = BACKENDS if _mosaic_kernel is not None else ("triton",)
    return resolve_implementation(implementation, interpret, backends=backends,
                                  unsupported=_unsupported(q, page_size, hkv or 1))


def paged_attention(
    q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask=None, *, page_size, sm_scale,
    qmask_bits=None, implementation: Implementation = "auto", interpret=False, num_splits=None, layer=None,
    write_locs=None,
):
    """Paged attention (module docstring). ``q [B,Q,Hq,E]``, ``k_new, v_new [B,Q,Hkv,E]``, ``k_pool, v_pool
    [X,Hkv,E]`` (or a model's whole ``[L,X,Hkv,E]`` pool with ``layer``, an int or ``i32[]``: the Mosaic
    kernel then reads that layer itself, so the call needs no slice of the pool, which XLA:GPU would run
    outside its CUDA graphs), ``page_table i32[B,P]``, ``prefix_lens i32[B]``, ``qmask bool[B,Q,Q]`` (or
    ``qmask_bits``, build_tree's packed rows) -> ``[B,Q,Hq,E]`` in q's dtype. ``num_splits``: prefix slices
    per (request, KV head) for the kernels (default: enough to fill the GPU).

    ``write_locs i32[B,Q]`` (or ``[B*Q]``): also store the fresh K/V in the pool (of ``layer``) at these slots
    and return ``(out, k_pool, v_pool)``; the Mosaic kernel does it inside the attention kernel (no scatter
    kernels), the other paths with one jnp update per pool. The slots must not lie in any request's prefix
    (a forward's write slots never do); a slot outside ``[0, X)`` is not written, in every implementation.
    Called outside jit, the pools are donated (updated in place; the caller's arrays are consumed); inside
    a jit XLA updates them in place when they are dead afterwards."""
    qmask = _check(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, qmask_bits, page_size, sm_scale,
                   layer)
    if write_locs is not None:
        b, nq = q.shape[:2]
        if write_locs.shape not in ((b, nq), (b * nq,)) or write_locs.dtype != jnp.int32:
            raise ValueError(f"write_locs: expected i32[{b}, {nq}] or i32[{b * nq}], got "
                             f"{write_locs.dtype}{list(write_locs.shape)}")
        write_locs = write_locs.reshape(b * nq)
    impl = resolve_attention_implementation(implementation, q, page_size, interpret, hkv=k_new.shape[2])
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits: expected a positive int, got {num_splits!r}")
    args = (q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, write_locs)
    donate = write_locs is not None
    if impl == "reference":
        fn = _reference_write_jit if donate else _reference_jit
        return fn(*args, page_size=int(page_size), sm_scale=float(sm_scale))
    fn = _kernel_write_jit if donate else _kernel_jit
    return fn(*args, impl=impl, page_size=int(page_size), sm_scale=float(sm_scale), interpret=bool(interpret),
              num_splits=num_splits)


def _reference_with_write(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, write_locs, *,
                          page_size, sm_scale):
    # write first, then attend (the prefix never overlaps the write slots, so the order changes nothing)
    k_pool, v_pool = write_fresh_kv(k_pool, v_pool, layer, write_locs, k_new, v_new)
    out = _reference(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, page_size=page_size,
                     sm_scale=sm_scale)
    return out if write_locs is None else (out, k_pool, v_pool)


_reference_jit = jax.jit(_reference_with_write, static_argnames=("page_size", "sm_scale"))
_reference_write_jit = jax.jit(_reference_with_write, static_argnames=("page_size", "sm_scale"),
                               donate_argnames=("k_pool", "v_pool"))


def _kernel(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, layer, write_locs, *, impl, page_size,
            sm_scale, interpret, num_splits):
    kw = dict(page_size=page_size, sm_scale=sm_scale, num_splits=num_splits, interpret=interpret)
    if impl == "mosaic":  # a whole [L, X, Hkv, E] pool goes in unsliced; the kernel reads its layer
        # The kernel writes the fresh K/V itself, except a single token (batch-1 decode): there XLA writes
        # it in place with the fusion that computes it (RoPE), which measured faster than handing the kernel
        # the token (H200, 8B plain step at batch 1, interleaved processes: 4.38-4.40 ms against 4.48 ms);
        # for more rows the in-kernel write replaces two scatter kernels (batch 32: 5.83 ms against 5.93-5.95).
        fused = write_locs is not None and write_locs.shape[0] > 1
        if write_locs is not None and not fused:
            k_pool, v_pool = write_fresh_kv(k_pool, v_pool, layer, write_locs, k_new, v_new)
        fresh = (k_new, v_new, write_locs) if fused else None
        parts = _mosaic_kernel.prefix_partials(q, k_new.shape[2], k_pool, v_pool, page_table, prefix_lens,
                                               layer=layer, fresh=fresh, **kw)
        acc, m, l = parts[:3]
        if fused:
            k_pool, v_pool = parts[3:]
    else:
        k_pool, v_pool = write_fresh_kv(k_pool, v_pool, layer, write_locs, k_new, v_new)
        k_one, v_one = one_layer(k_pool, v_pool, layer)
        acc, m, l = _triton_kernel.prefix_partials(q, k_new.shape[2], k_one, v_one, page_table, prefix_lens, **kw)
    out = merge_partials(q, fresh_partial(q, k_new, v_new, qmask, sm_scale), acc, m, l)
    return out if write_locs is None else (out, k_pool, v_pool)


_STATIC = ("impl", "page_size", "sm_scale", "interpret", "num_splits")
_kernel_jit = jax.jit(_kernel, static_argnames=_STATIC)
_kernel_write_jit = jax.jit(_kernel, static_argnames=_STATIC, donate_argnames=("k_pool", "v_pool"))
