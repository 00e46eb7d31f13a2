"""What the paged attention kernels share: the query-row layout, the fresh-token part, the merge of the
partial softmaxes, the online-softmax block step of the Triton kernels, the write of the fresh K/V into the
pool, the slots of a row's prefix, the split count, and each kernel's tile plan sized to the GPU's shared memory.

``paged_attention`` and both prefix kernels (``paged_attention_mosaic``, ``paged_attention_triton``) import
this module; it imports neither of them.

Shared memory: a thread block may use at most ``SMEM_LIMIT`` bytes (the opt-in maximum of compute capability
9.0, 227 KiB; what XLA reports as "available" on the H200). The plans below compute a kernel's need from
its tile config and dtype and pick the largest configuration that fits (``None``: none does, and the
resolver picks another kernel).
"""

import math

import jax
import jax.numpy as jnp

from jaxspec.kernels._dispatch import next_pow2

LOG2E = math.log2(math.e)
SMEM_LIMIT = 232448  # bytes per thread block, compute capability 9.0 (H100 / H200), opt-in maximum

# Mosaic GPU kernel (paged_attention_mosaic)
MOSAIC_ROWS = 64  # query rows per program: one wgmma M tile
MOSAIC_BLOCK = 64  # default prefix tokens per step
FRESH_CHUNK = 16  # fresh tokens per shared-memory chunk of the in-kernel K/V write
_SMEM_ALIGN = 1024  # Mosaic GPU aligns every shared-memory allocation to 1 KiB
_REDUCTION_SCRATCH = 2048  # Mosaic GPU's default cross-warp reduction scratch (CompilerParams)
_BARRIER_BYTES = 1024  # a bound on the kernel's mbarriers (8 bytes each, at most 2 * stages + 2 of them)

# Triton kernel (paged_attention_triton)
TRITON_BLOCK = 32  # prefix tokens per loop step
TRITON_MIN_ROWS = 16  # Triton dots need at least 16 rows


def _align(n: int) -> int:
    return -(-n // _SMEM_ALIGN) * _SMEM_ALIGN


def mosaic_smem_bytes(head_dim: int, itemsize: int, *, block: int, stages: int, fresh: bool = True) -> int:
    """Shared memory of one Mosaic program: the query tile and ``stages`` K and V blocks (plus the fresh K/V
    chunk of the in-kernel write, and the reductions' scratch) while it walks the prefix; then, in a scope of
    its own that reuses the same memory, the f32 output tile and its row maxima and sums. Every allocation
    is rounded up to 1 KiB, as Mosaic GPU allocates them."""
    e, s = head_dim, itemsize
    walk = _align(MOSAIC_ROWS * e * s) + 2 * _align(stages * block * e * s) + _REDUCTION_SCRATCH
    if fresh:
        walk += 2 * _align(FRESH_CHUNK * e * s)
    write = _align(MOSAIC_ROWS * e * 4) + 2 * _align(MOSAIC_ROWS * 4)
    return max(walk, write) + _BARRIER_BYTES


def mosaic_plan(head_dim: int, itemsize: int, page_size: int, *, fresh: bool = True, block: int | None = None,
                limit: int = SMEM_LIMIT) -> tuple[int, int] | None:
    """``(block, stages)`` for the Mosaic kernel, or None when not even one stage fits in ``limit`` bytes.

    ``block`` (prefix tokens per step) defaults to ``MOSAIC_BLOCK`` (or the page size when larger: a block is
    whole pages). Two stages are
    preferred (measured on the H200, Llama-3.1-8B layer, 4 shapes: 2 stages beat 3 and 4 by 2-10%: two
    programs fit per SM and the page-id reads are issued a step ahead) where the query tile and two stages
    take at most 200 KiB; else one."""
    block = block or max(MOSAIC_BLOCK, page_size)
    e, s = head_dim, itemsize
    preferred = 2 if MOSAIC_ROWS * e * s + 2 * (2 * block * e * s) <= 200 * 1024 else 1
    for stages in range(preferred, 0, -1):
        if mosaic_smem_bytes(e, s, block=block, stages=stages, fresh=fresh) <= limit:
            return block, stages
    return None


def triton_smem_bytes(rows: int, head_dim: int, itemsize: int, *, stages: int) -> int:
    """An upper bound on the shared memory of one Triton program with ``rows`` query rows: the query tile, the
    softmax weights of one block (operands of the two dots), ``stages`` K and V blocks, and 8 bytes per row
    for the row statistics. Checked against XLA's report on the H200 (f32, head_dim 64, 1024 rows, 2 stages:
    411648 bytes requested; this bound gives 434176)."""
    e = next_pow2(head_dim)
    return (rows * e * itemsize + rows * TRITON_BLOCK * itemsize + stages * 2 * TRITON_BLOCK * e * itemsize
            + rows * 8)


def triton_plan(num_rows: int, head_dim: int, itemsize: int, *, limit: int = SMEM_LIMIT,
                max_tile: int | None = None) -> tuple[int, int, int] | None:
    """``(rows, tile, stages)`` for the Triton kernel: ``rows`` query rows per KV head (``num_rows`` rounded up
    to a power of two, at least 16) in row tiles of ``tile`` rows, one program each, with ``stages`` pipeline
    stages. The largest tile (at most ``max_tile``) that fits ``limit`` with 2 stages, else with 1; None when
    not even 16 rows fit."""
    rows = max(TRITON_MIN_ROWS, next_pow2(num_rows))
    top = rows if max_tile is None else max(TRITON_MIN_ROWS, min(rows, next_pow2(max_tile)))
    for stages in (2, 1):
        tile = top
        while tile >= TRITON_MIN_ROWS:
            if triton_smem_bytes(tile, head_dim, itemsize, stages=stages) <= limit:
                return rows, tile, stages
            tile //= 2
    return None


def query_rows(q, hkv: int, rows: int):
    """``[B, Q, Hq, E] -> [B, Hkv, rows, E]``: row ``i * group + g`` is query token ``i``, head ``h*group+g``
    (zero rows pad ``Q * group`` up to ``rows``)."""
    b, nq, hq, e = q.shape
    grp = hq // hkv
    r = q.reshape(b, nq, hkv, grp, e).transpose(0, 2, 1, 3, 4).reshape(b, hkv, nq * grp, e)
    return jnp.pad(r, ((0, 0), (0, 0), (0, rows - nq * grp), (0, 0)))


def fresh_partial(q, k_new, v_new, qmask, sm_scale):
    """Fresh-token part as a partial softmax in base 2: ``(acc f32[B,Hkv,R,E], m f32[B,Hkv,R], l f32[B,Hkv,R])``
    with ``R = Q * group`` rows ordered as :func:`query_rows`."""
    b, nq, hq, e = q.shape
    hkv = k_new.shape[2]
    grp = hq // hkv
    f32 = jnp.float32
    qg = q.reshape(b, nq, hkv, grp, e)
    if nq == 1:  # decode: the token sees only itself, so p = 1, l = 1, acc = v (no dots: fuses into the merge)
        s = jnp.sum(qg[:, 0].astype(f32) * k_new[:, 0, :, None, :].astype(f32), axis=-1) * f32(sm_scale * LOG2E)
        acc = jnp.broadcast_to(v_new[:, 0, :, None, :].astype(f32), (b, hkv, grp, e))
        return acc, s, jnp.ones((b, hkv, grp), f32)
    s = jnp.einsum("bqhge,bkhe->bhqgk", qg, k_new, precision=jax.lax.Precision.HIGHEST, preferred_element_type=f32)
    s = jnp.where(qmask[:, None, :, None, :], s * f32(sm_scale * LOG2E), -jnp.inf)
    m = jnp.max(s, axis=-1)  # finite: every row sees itself
    p = jnp.exp2(s - m[..., None])
    acc = jnp.einsum("bhqgk,bkhe->bhqge", p, v_new.astype(f32), precision=jax.lax.Precision.HIGHEST)
    return acc.reshape(b, hkv, nq * grp, e), m.reshape(b, hkv, nq * grp), jnp.sum(p, -1).reshape(b, hkv, nq * grp)


def merge_partials(q, fresh, acc, m, l):
    """Merge the fresh partial with the prefix partials ``acc [B,Hkv,S,>=R,E]``, ``m, l [B,Hkv,S,>=R]``
    (base-2 logits; ``m = -inf, l = 0`` for an empty slice) into ``[B, Q, Hq, E]`` of ``q``'s dtype."""
    b, nq, hq, e = q.shape
    f_acc, f_m, f_l = fresh
    hkv, r = f_acc.shape[1], f_acc.shape[2]
    acc, m, l = acc[:, :, :, :r], m[:, :, :, :r], l[:, :, :, :r]
    m_all = jnp.maximum(f_m, jnp.max(m, axis=2))  # finite (the fresh part always has a visible key)
    w = jnp.exp2(m - m_all[:, :, None])  # 0 for empty slices
    wf = jnp.exp2(f_m - m_all)
    num = f_acc * wf[..., None] + jnp.sum(acc * w[..., None], axis=2)
    den = f_l * wf + jnp.sum(l * w, axis=2)
    out = num / den[..., None]  # [B, Hkv, Q*grp, E]
    return out.reshape(b, hkv, nq, hq // hkv, e).transpose(0, 2, 1, 3, 4).reshape(b, nq, hq, e).astype(q.dtype)


def default_num_splits(batch: int, hkv: int, max_tokens: int, block: int, *, programs: int = 264) -> int:
    """Prefix slices per (request, KV head): as many as fit in ONE wave of ``programs`` (2 resident
    programs per SM on the H200's 132 SMs; a second, partial wave would idle most SMs), at least 4
    blocks of ``block`` tokens per slice."""
    fit = max(1, programs // (batch * hkv))
    return int(max(1, min(fit, max_tokens // (4 * block))))


def write_fresh(pool, layer, slots, x):
    """``pool`` (``[X, Hkv, E]``, or ``[L, X, Hkv, E]`` with ``layer``) with ``x [n, Hkv, E]`` stored at ``slots
    i32[n]``; a slot outside ``[0, X)`` is not written. One token (batch-1 decode) is a ``dynamic_update_slice``
    of the row or its old value: a scatter's out-of-bounds semantics made XLA:GPU write it as a select kernel
    plus the update (H200, 8B plain step at batch 1: 538 kernels instead of 606)."""
    single = pool.ndim == 3
    if single:
        pool, layer = pool[None], 0
    num = pool.shape[1]
    x = x.astype(pool.dtype)
    if slots.shape[0] == 1:
        ok = (slots[0] >= 0) & (slots[0] < num)
        at = (jnp.asarray(layer, jnp.int32), jnp.clip(slots[0], 0, num - 1), jnp.int32(0), jnp.int32(0))
        old = jax.lax.dynamic_slice(pool, at, (1, 1) + pool.shape[2:])
        pool = jax.lax.dynamic_update_slice(pool, jnp.where(ok, x[None], old), at)
    else:
        pool = pool.at[layer, slots].set(x, mode="drop")
    return pool[0] if single else pool


def online_softmax_init(rows: int, cols: int):
    """``(acc f32[rows, cols], m f32[rows], l f32[rows])`` before the first key block: zeros, ``-inf``, zeros."""
    return (jnp.zeros((rows, cols), jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))


def online_softmax_step(carry, q, k, v, ok, scale, prec):
    """One key block of a flash-attention walk inside a Triton kernel: ``q [R, E]``, ``k, v [T, E]``, ``ok``
    (the keys that count: ``bool[T]`` for every row, or ``bool[R, T]`` per row), ``scale`` (the softmax scale
    times ``LOG2E``: base-2 logits) -> the new ``(acc, m, l)``. The softmax weights meet ``v`` in ``v``'s dtype,
    accumulated in float32. A row that has seen no key yet and sees none here stays ``(0, -inf, 0)``; a row
    with a finite max that sees none here is left exactly as it was (its weights are 0, its scale 1)."""
    acc, m, l = carry
    sc = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=prec, preferred_element_type=jnp.float32)
    sc = jnp.where(ok if ok.ndim == 2 else ok[None, :], sc * scale, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(sc, axis=1))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # no key so far: exp2(-inf - 0) = 0, never -inf - -inf
    p = jnp.exp2(sc - m_use[:, None])
    alpha = jnp.exp2(m - m_use)
    l = l * alpha + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + jax.lax.dot_general(
        p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=prec, preferred_element_type=jnp.float32)
    return acc, m_new, l


def write_fresh_kv(k_pool, v_pool, layer, write_locs, k_new, v_new):
    """Both pools with the fresh ``k_new, v_new [B, Q, Hkv, E]`` stored at ``write_locs i32[B*Q]``
    (``write_fresh``); ``write_locs`` None: the pools as they are."""
    hkv, e = k_new.shape[2:]
    if write_locs is None:
        return k_pool, v_pool
    return (write_fresh(k_pool, layer, write_locs, k_new.reshape(-1, hkv, e)),
            write_fresh(v_pool, layer, write_locs, v_new.reshape(-1, hkv, e)))


def prefix_slots(page_table, page_size, num_slots):
    """``i32[B, P*G]``: the pool slot of every logical position ``< P*G`` of each row through ``page_table i32[B,
    P]`` (page ids clamped into a pool of ``num_slots`` slots)."""
    width = page_table.shape[1] * page_size
    pos = jnp.arange(width, dtype=jnp.int32)
    pages = jnp.clip(page_table[:, pos // page_size], 0, num_slots // page_size - 1)
    return pages * page_size + (pos % page_size)[None, :]


def one_layer(k_pool, v_pool, layer):
    """Inside jit: the ``[X, Hkv, E]`` pools of ``layer`` (``None``: the pools are one layer's already)."""
    if layer is None:
        return k_pool, v_pool
    return tuple(jax.lax.dynamic_index_in_dim(x, layer, 0, keepdims=False) for x in (k_pool, v_pool))
