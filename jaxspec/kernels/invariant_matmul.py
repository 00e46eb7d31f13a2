"""Batch-invariant matmul: ``x [M, K] @ w [K, N]`` (or ``x @ w.T`` for ``w [N, K]``) in float32, each output
row computed by the same sequence of operations whatever ``M`` is and wherever the row sits.

Why: XLA:GPU picks a GEMM's tiling and split-K by the shape (autotuned per ``M``), and rewrites a one-row
product into a reduction, so row ``i`` of a 4-row product need not equal the same row computed alone; in
bf16 that flips near-tied argmaxes between a verify forward and plain decoding. Here the reduction order of
an output element depends on ``K``, ``N`` and the dtype only.

Implementations (``implementation=``, resolved like every kernel of ``jaxspec.kernels``):

* ``"triton"`` (``"pallas"``; ``"auto"`` on a CUDA GPU): Pallas Triton with one fixed tile, ``TILE_M x
  TILE_N`` outputs, and a fixed split of ``K``: splits of ``SPLIT_STEPS`` ``TILE_K`` steps, each summed from
  zero in one float32 accumulator, the split sums added in split order. ``M`` only sets the number of
  programs and which of two layouts runs the same arithmetic (``split_programs``): few output tiles (a
  decode step's one-row products) give each split its own program, so the serial walk is ``SPLIT_STEPS``
  steps instead of all of ``K``, and the split sums are added after the kernel, in split order (a left fold of
  float32 adds, as jnp ops: in a jitted model they fuse into the op that reads the product, the residual add,
  SwiGLU or RoPE, so this layout needs no merge kernel of its own); many tiles walk the splits in one program,
  which adds them in the same order. RMSNorm's per-row scale is applied after the kernel in both layouts. Rows
  past ``M`` are masked (zeros), so a row's neighbours cannot reach it.
* ``"reference"`` (``"auto"`` elsewhere): pure jnp, the rows padded to blocks of ``TILE_M`` and the blocks
  mapped one at a time (``lax.map``) through a ``[TILE_M, K] x [K, N]`` dot: every call runs the same
  fixed-shape dot, so on a given backend a row's result does not depend on ``M`` either. The two
  implementations sum in different orders (they agree to float32 rounding of the accumulation, not bit for
  bit); choose one per deployment, as the batch-invariant mode does.

Inputs are cast to ``w``'s dtype (bf16 weights: bf16 products, exact in float32); float32 weights multiply
at full precision (never TF32).
"""

import functools

import jax
import jax.numpy as jnp

from jax.experimental import pallas as pl

from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import KernelOp, cdiv
from jaxspec.kernels._triton import compiler_params, load, store
from jaxspec.kernels.ordered_sum import ordered_sum

TILE_M = 64  # output rows per program (one wgmma M tile)
TILE_N = 64  # output columns per program
TILE_K = 64  # reduction step
SPLIT_STEPS = 3  # TILE_K steps per K split (K = 576: 3 splits; 1536: 8)
MIN_PROGRAMS = 132  # output tiles below which each K split gets a program of its own (an H100's / H200's SMs)
NUM_WARPS = 4
NUM_STAGES = 3

__all__ = ["MIN_PROGRAMS", "SPLIT_STEPS", "TILE_K", "TILE_M", "TILE_N", "invariant_matmul", "invariant_matmul_reference",
           "split_programs"]


def _check(x, w, transpose_w):
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D array [M, K], got shape {x.shape}")
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D array, got shape {w.shape}")
    k = w.shape[1] if transpose_w else w.shape[0]
    if x.shape[1] != k:
        want = "[N, K]" if transpose_w else "[K, N]"
        raise ValueError(f"w: expected {want} with K={x.shape[1]} (x's columns), got shape {w.shape}")
    for name, a in (("x", x), ("w", w)):
        if a.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
            raise ValueError(f"{name}: expected bfloat16, float16 or float32, got {a.dtype}")
    if x.shape[0] == 0:
        raise ValueError("x: expected at least one row")


def _precision(dtype):
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _rms_scale(x, eps):
    """``f32[M]``: RMSNorm's ``rsqrt(mean(x**2) + eps)`` per row, the mean square an ``ordered_sum``
    (row-invariant)."""
    x = x.astype(jnp.float32)
    return jax.lax.rsqrt(ordered_sum(x * x) / jnp.float32(x.shape[-1]) + jnp.float32(eps))


def _reference(x, w, norm_weight, *, transpose_w, norm_eps):
    m, k = x.shape
    scale = None
    if norm_weight is not None:  # the norm's weight before the product, its per-row scale after it
        scale = _rms_scale(x, norm_eps)
        x = x.astype(jnp.float32) * norm_weight.astype(jnp.float32)[None, :]
    x = x.astype(w.dtype)
    blocks = jnp.pad(x, ((0, cdiv(m, TILE_M) * TILE_M - m), (0, 0))).reshape(-1, TILE_M, k)
    dims = (((1,), (1,)), ((), ())) if transpose_w else (((1,), (0,)), ((), ()))

    def block(xb):
        return jax.lax.dot_general(xb, w, dims, precision=_precision(w.dtype), preferred_element_type=jnp.float32)

    y = jax.lax.map(block, blocks)
    y = y.reshape(-1, y.shape[-1])[:m]
    return y if scale is None else y * scale[:, None]


def _num_splits(k):
    return cdiv(k, TILE_K * SPLIT_STEPS)


def _split_acc(x_ref, w_ref, nw_ref, s, *, rows, cols, row_ok, col_ok, k, transpose_w, norm_eps):
    """One K split of a ``TILE_M x TILE_N`` tile: its ``SPLIT_STEPS`` (or fewer, the last) ``TILE_K`` steps from a
    zero accumulator, and the rows' sum of squares over the same columns (``norm_eps``; else zeros)."""
    kk = jnp.arange(TILE_K, dtype=jnp.int32)
    prec = _precision(w_ref.dtype)
    f32 = jnp.float32

    def step(t, carry):
        acc, ss = carry
        ks = t * TILE_K + kk
        k_ok = ks < k
        a = load(x_ref.at[rows[:, None], ks[None, :]], mask=row_ok[:, None] & k_ok[None, :], other=0)
        if norm_eps is not None:  # the row's mean square summed over the K blocks in order, in the same pass
            a = a.astype(f32)
            ss = ss + jnp.sum(a * a, axis=1)
            nw = load(nw_ref.at[ks], mask=k_ok, other=0).astype(f32)
            a = (a * nw[None, :]).astype(w_ref.dtype)
        if transpose_w:
            b = load(w_ref.at[cols[:, None], ks[None, :]], mask=col_ok[:, None] & k_ok[None, :], other=0)
            dims = (((1,), (1,)), ((), ()))
        else:
            b = load(w_ref.at[ks[:, None], cols[None, :]], mask=k_ok[:, None] & col_ok[None, :], other=0)
            dims = (((1,), (0,)), ((), ()))
        return acc + jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32), ss

    lo = s * SPLIT_STEPS
    hi = jnp.minimum(lo + SPLIT_STEPS, cdiv(k, TILE_K))
    return jax.lax.fori_loop(lo, hi, step, (jnp.zeros((TILE_M, TILE_N), f32), jnp.zeros((TILE_M,), f32)))


def _tile(i, j, m, n):
    rows = i * TILE_M + jnp.arange(TILE_M, dtype=jnp.int32)
    cols = j * TILE_N + jnp.arange(TILE_N, dtype=jnp.int32)
    return rows, cols, rows < m, cols < n


def _whole_kernel(x_ref, w_ref, nw_ref, o_ref, ss_ref, *, m, k, n, transpose_w, norm_eps):
    """One program per output tile: the K splits one after the other, each added to the total as it ends (the
    left fold ``_fold`` makes of the few-tile layout's parts); the total to ``o [1, M, N]``, the rows' sum of
    squares to ``ss [1, M]`` (from the first column tile)."""
    j = pl.program_id(1)
    rows, cols, row_ok, col_ok = _tile(pl.program_id(0), j, m, n)
    split = functools.partial(_split_acc, x_ref, w_ref, nw_ref, rows=rows, cols=cols, row_ok=row_ok, col_ok=col_ok,
                              k=k, transpose_w=transpose_w, norm_eps=norm_eps)

    def add(s, carry):
        acc, ss = split(s)
        return carry[0] + acc, carry[1] + ss

    total, ss = jax.lax.fori_loop(1, _num_splits(k), add, split(0))
    store(o_ref.at[0, rows[:, None], cols[None, :]], total, mask=row_ok[:, None] & col_ok[None, :])
    store(ss_ref.at[0, rows], ss, mask=row_ok & (j == 0))


def _split_kernel(x_ref, w_ref, nw_ref, p_ref, ss_ref, *, m, k, n, transpose_w, norm_eps):
    """One program per (output tile, K split): the split's sum to ``p [splits, M, N]``, its rows' sum of squares to
    ``ss [splits, M]`` (from the first column tile)."""
    j, s = pl.program_id(1), pl.program_id(2)
    rows, cols, row_ok, col_ok = _tile(pl.program_id(0), j, m, n)
    acc, ss = _split_acc(x_ref, w_ref, nw_ref, s, rows=rows, cols=cols, row_ok=row_ok, col_ok=col_ok, k=k,
                         transpose_w=transpose_w, norm_eps=norm_eps)
    store(p_ref.at[s, rows[:, None], cols[None, :]], acc, mask=row_ok[:, None] & col_ok[None, :])
    store(ss_ref.at[s, rows], ss, mask=row_ok & (j == 0))


def _fold(parts, ss, *, k, norm_eps):
    """``parts f32[S, M, N]`` and ``ss f32[S, M]`` (S split sums, or one total) -> ``f32[M, N]``: the splits added in
    split order, ``((p0 + p1) + p2) + ...`` (the kernel's own fold, op for op: separate float32 adds, which XLA
    neither reorders nor contracts), then RMSNorm's per-row scale."""
    total, sq = parts[0], ss[0]
    for s in range(1, parts.shape[0]):
        total, sq = total + parts[s], sq + ss[s]
    if norm_eps is None:
        return total
    return total * jax.lax.rsqrt(sq / jnp.float32(k) + jnp.float32(norm_eps))[:, None]


def split_programs(m: int, k: int, n: int) -> bool:
    """Whether ``invariant_matmul`` gives each K split its own program (the split sums then added after the kernel)
    rather than walking the splits in one program per tile: when the output tiles alone would not fill the GPU
    (``MIN_PROGRAMS``) and ``K`` has more than one split. Both add the same split sums in the same order: the
    choice changes the speed, never a bit of the result."""
    return _num_splits(k) > 1 and cdiv(m, TILE_M) * cdiv(n, TILE_N) < MIN_PROGRAMS


def _triton(x, w, norm_weight, *, transpose_w, norm_eps, split, interpret):
    m, k = x.shape
    n = w.shape[0] if transpose_w else w.shape[1]
    if norm_weight is None:
        x, norm_weight = x.astype(w.dtype), jnp.zeros((1,), jnp.float32)  # (no norm: the weight is never read)
    if split is None:
        split = split_programs(m, k, n)
    static = dict(m=m, k=k, n=n, norm_eps=norm_eps)
    tiles = (cdiv(m, TILE_M), cdiv(n, TILE_N))
    params = compiler_params(num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    name = f"invariant_matmul_k{k}_n{n}{'_t' if transpose_w else ''}"
    parts = _num_splits(k) if split else 1
    kernel, grid = (_split_kernel, (*tiles, parts)) if split else (_whole_kernel, tiles)
    out, ss = pl.pallas_call(
        functools.partial(kernel, transpose_w=transpose_w, **static),
        out_shape=(jax.ShapeDtypeStruct((parts, m, n), jnp.float32), jax.ShapeDtypeStruct((parts, m), jnp.float32)),
        grid=grid, interpret=interpret, compiler_params=params,
        name=f"{name}_splits" if split else name)(x, w, norm_weight)
    return _fold(out, ss, k=k, norm_eps=norm_eps)


def _impl(x, w, norm_weight, *, transpose_w, norm_eps, split, implementation, interpret):
    if implementation == "reference":
        return _reference(x, w, norm_weight, transpose_w=transpose_w, norm_eps=norm_eps)
    return _triton(x, w, norm_weight, transpose_w=transpose_w, norm_eps=norm_eps, split=split, interpret=interpret)


# split: None (split_programs decides), or forced (the kernel tests compare the two layouts bit for bit)
_OP = KernelOp("invariant_matmul", _impl, static=("transpose_w", "norm_eps", "split"))


def _norm_args(x, norm_weight, norm_eps):
    if norm_weight is None:
        if norm_eps is not None:
            raise ValueError("norm_eps: given without norm_weight (the fused RMSNorm needs both)")
        return None
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"norm_weight: expected shape ({x.shape[1]},) (x's columns), got {norm_weight.shape}")
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not norm_eps > 0:
        raise ValueError(f"norm_eps: expected a positive float with norm_weight, got {norm_eps!r}")
    return float(norm_eps)


def invariant_matmul(x, w, *, transpose_w: bool = False, norm_weight=None, norm_eps: float | None = None,
                     implementation: Implementation = "auto", interpret: bool = False):
    """``f32[M, N]``: ``x [M, K] @ w [K, N]``, or ``x @ w.T`` for ``w [N, K]`` with ``transpose_w=True`` (a tied
    LM head), with a per-row reduction order independent of ``M`` and of the row's neighbours (module
    docstring). ``norm_weight f[K]`` and ``norm_eps``: RMSNorm the rows first, computed as
    ``rsqrt(mean(x**2) + eps) * ((x * norm_weight) @ w)`` (the same function: the weighted rows are cast to
    ``w``'s dtype, the per-row scale multiplies the float32 product; the kernel sums the mean square in the
    product's own pass over ``x``). Jittable; without a norm the rows are cast to ``w``'s dtype."""
    _check(x, w, bool(transpose_w))
    eps = _norm_args(x, norm_weight, norm_eps)
    return _OP(x, w, norm_weight, transpose_w=bool(transpose_w), norm_eps=eps, split=None,
               implementation=implementation, interpret=interpret)


def invariant_matmul_reference(x, w, *, transpose_w: bool = False, norm_weight=None, norm_eps: float | None = None):
    """The pure-jnp implementation of :func:`invariant_matmul` (fixed ``[TILE_M, K]`` blocks, one at a time)."""
    return invariant_matmul(x, w, transpose_w=transpose_w, norm_weight=norm_weight, norm_eps=norm_eps,
                            implementation="reference")
