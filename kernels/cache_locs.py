"""SGLang 0.5.23 ``assign_extend_cache_locs`` (+ uniform, ``fill_front_out_cache_loc``,
``assign_draft_cache_locs_contiguous``) from ``python/sglang/kernels/ops/speculative/cache_locs.py`` and
``fill_accept_out_cache_loc`` from ``python/sglang/kernels/ops/speculative/eagle.py`` (ops-spec §8, §9, §14).

All location outputs are int32 (SGLang uses int64 buffers; the values are identical). Output buffers are
allocated here (no caller ``out`` tensors); packed ragged outputs have a zero tail (dummy KV slot 0).

Every op has a pure-jnp ``<op>_reference`` (jittable) and a Pallas kernel that lowers through the
Triton backend (``kernels/_backend.py``): 1-D gathers/scatters on flattened refs with index vectors,
power-of-two blocks, static grids, no scalar prefetch. Masked-off store lanes are parked on an
out-of-range index (``PARK``) because Pallas interpret mode writes masked lanes back.

Checked mode (``jaxspec._validate.checks()`` / ``JAXSPEC_CHECKS=1`` + ``checkify``) adds value checks:
offsets inside the ``req_to_token`` row, packed totals within ``out_size``, pool rows in range.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int32

from jaxspec._validate import check, check_shape, index_array, static_int
from jaxspec.kernels._backend import compiler_params, load, pl, resolve_implementation, store

# Index-vector width of the copy loops: 128 int32 lanes = one 512-byte vector per program step, the
# same order as SGLang's 32/64/128-wide Triton loops; power of two as the Triton lowering requires.
BLOCK = 128
# fill_accept_out_cache_loc runs one program over the whole flattened accept_index (the exclusive
# prefix count needs all of it); 32768 int32 lanes = 128 KiB of registers at 8 warps is the cap.
MAX_ACCEPT_SIZE = 32768
_NUM_WARPS = 4


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class UniformCacheLocs(NamedTuple):
    """``out_cache_loc`` i32[B*width] and, when requested, ``positions`` i32[B*width] (else None)."""

    out_cache_loc: Int32[Array, " T"]
    positions: Int32[Array, " T"] | None


class DraftCacheLocs(NamedTuple):
    """``out_cache_loc`` i32[B*K*C] (branch k of request b owns ``[b*K*C + k*C, +C)``), ``positions`` i32[B*K]."""

    out_cache_loc: Int32[Array, " T"]
    positions: Int32[Array, " BK"]


# ----------------------------------------------------------------------------------------------------
# References (pure jnp, jittable)
# ----------------------------------------------------------------------------------------------------


def assign_extend_cache_locs_reference(req_pool_indices, req_to_token, start_offset, end_offset, *, out_size):
    """``out[off_b + k] = req_to_token[req_pool_indices[b], start[b] + k]`` for ``k < end[b] - start[b]``,
    ``off_b`` the exclusive prefix sum of the lengths; positions past the total (or past ``out_size``) are 0."""
    lens = end_offset - start_offset
    cum_end = jnp.cumsum(lens)
    total = cum_end[-1] if lens.shape[0] else jnp.int32(0)
    o = jnp.arange(out_size, dtype=jnp.int32)
    b = jnp.searchsorted(cum_end, o, side="right").astype(jnp.int32)
    b = jnp.minimum(b, max(lens.shape[0] - 1, 0))
    if lens.shape[0] == 0:
        return jnp.zeros((out_size,), jnp.int32)
    k = o - (cum_end[b] - lens[b])
    vals = req_to_token[req_pool_indices[b], start_offset[b] + k]
    return jnp.where(o < total, vals, 0).astype(jnp.int32)


def assign_extend_cache_locs_uniform_reference(req_pool_indices, req_to_token, seq_lens, *, width, with_positions=False):
    """``out[b*width + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]``; positions ``seq_lens[b] + k``."""
    k = jnp.arange(width, dtype=jnp.int32)
    cols = seq_lens[:, None] + k[None, :]
    out = req_to_token[req_pool_indices[:, None], cols].reshape(-1).astype(jnp.int32)
    return UniformCacheLocs(out, cols.reshape(-1) if with_positions else None)


def fill_front_out_cache_loc_reference(num_front, out_cache_loc, *, width):
    """Pack the first ``num_front[b]`` slots of request b's window (``out_cache_loc.reshape(B, N)``)."""
    bs = num_front.shape[0]
    window = out_cache_loc.reshape(bs, -1) if bs else out_cache_loc.reshape(0, 1)
    rows = jnp.arange(bs, dtype=jnp.int32)
    return assign_extend_cache_locs_reference(rows, window, jnp.zeros_like(num_front), num_front, out_size=bs * width)


def fill_accept_out_cache_loc_reference(accept_index, out_cache_loc):
    """Stream compaction: the valid (``>= 0``) entries of ``accept_index.reshape(-1)`` mapped through
    ``out_cache_loc``, packed in order; zero tail; size ``B * A``."""
    flat = accept_index.reshape(-1)
    size = flat.shape[0]
    valid = flat >= 0
    cnt = valid.astype(jnp.int32)
    dst = jnp.cumsum(cnt) - cnt
    vals = out_cache_loc[jnp.clip(flat, 0, max(out_cache_loc.shape[0] - 1, 0))] if out_cache_loc.shape[0] else flat * 0
    return jnp.zeros((size,), jnp.int32).at[jnp.where(valid, dst, size)].set(vals.astype(jnp.int32), mode="drop")


def assign_draft_cache_locs_reference(req_pool_indices, req_to_token, seq_lens, *, topk, num_steps, num_cols=None):
    """§14 contiguous variant: ``out[b*K*C + c] = req_to_token[req[b], seq_lens[b] + c]``, ``c < K*C``
    (``C = num_cols or num_steps``); ``positions[b*K + k] = seq_lens[b]``."""
    c = num_steps if num_cols is None else num_cols
    out = assign_extend_cache_locs_uniform_reference(req_pool_indices, req_to_token, seq_lens, width=topk * c).out_cache_loc
    return DraftCacheLocs(out, jnp.repeat(seq_lens, topk, total_repeat_length=seq_lens.shape[0] * topk))


# ----------------------------------------------------------------------------------------------------
# Pallas kernels (refs only). Flattened 1-D tables; every store parks masked lanes on ``size`` (OOB).
# ----------------------------------------------------------------------------------------------------


def _extend_kernel(rpi_ref, r2t_ref, start_ref, end_ref, out_ref, *, bs, width, out_size, bs_up):
    # rpi_ref i32[B] | r2t_ref i32[R*W] (flattened) | start_ref, end_ref i32[B] | out_ref i32[out_size]; all HBM.
    pid = pl.program_id(0)
    lane = jnp.arange(BLOCK, dtype=jnp.int32)
    # --- exclusive prefix of the row lengths (the upstream bs_upper reduction) ---
    idx = jnp.arange(bs_up, dtype=jnp.int32)
    live = idx < bs
    starts = load(start_ref.at[jnp.where(live, idx, 0)], mask=live, other=0)
    ends = load(end_ref.at[jnp.where(live, idx, 0)], mask=live, other=0)
    lens = jnp.where(live, ends - starts, 0)
    total = jnp.sum(lens)

    @pl.when(pid < bs)
    def _copy_segment():
        off = jnp.sum(jnp.where(idx < pid, lens, 0))
        row = rpi_ref[pid]
        st = start_ref[pid]
        ln = end_ref[pid] - st

        def body(i, carry):
            k = i * BLOCK + lane
            m = (k < ln) & (off + k < out_size)
            vals = load(r2t_ref.at[jnp.where(m, row * width + st + k, 0)], mask=m, other=0)
            store(out_ref.at[jnp.where(m, off + k, out_size)], vals, mask=m)
            return carry

        jax.lax.fori_loop(0, (jnp.maximum(ln, 0) + BLOCK - 1) // BLOCK, body, 0)

    @pl.when(pid >= bs)
    def _zero_tail():
        pos = (pid - bs) * BLOCK + lane
        m = (pos >= total) & (pos < out_size)
        store(out_ref.at[jnp.where(m, pos, out_size)], jnp.zeros((BLOCK,), jnp.int32), mask=m)


def _extend_pallas(rpi, table, start, end, *, out_size, interpret):
    bs = rpi.shape[0]
    width = table.shape[1]
    if out_size == 0 or bs == 0:
        return jnp.zeros((out_size,), jnp.int32)
    grid = bs + pl.cdiv(out_size, BLOCK)  # B copy programs, then zero-tail programs
    kernel = functools.partial(_extend_kernel, bs=bs, width=width, out_size=out_size, bs_up=_next_pow2(max(bs, 1)))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((out_size,), jnp.int32),
        grid=(grid,),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=_NUM_WARPS, num_stages=1),
        name=f"assign_extend_cache_locs_{out_size=}",
    )(rpi, table.reshape(-1), start, end)


def _uniform_kernel(rpi_ref, r2t_ref, seq_ref, *out_refs, width, row_width, nblk):
    # rpi_ref, seq_ref i32[B] | r2t_ref i32[R*W] | out_refs: i32[B*width] locations (+ i32[B*width] positions).
    b = pl.program_id(0)
    lane = jnp.arange(BLOCK, dtype=jnp.int32)
    row = rpi_ref[b]
    st = seq_ref[b]
    size = out_refs[0].shape[0]
    for i in range(nblk):  # static: width is a compile-time constant (N or K*C)
        k = i * BLOCK + lane
        m = k < width
        vals = load(r2t_ref.at[jnp.where(m, row * row_width + st + k, 0)], mask=m, other=0)
        dst = jnp.where(m, b * width + k, size)
        store(out_refs[0].at[dst], vals, mask=m)
        if len(out_refs) > 1:
            store(out_refs[1].at[dst], st + k, mask=m)


def _uniform_pallas(rpi, table, seq_lens, *, width, with_positions, interpret):
    bs = rpi.shape[0]
    n_out = 2 if with_positions else 1
    if bs == 0 or width == 0:
        z = jnp.zeros((bs * width,), jnp.int32)
        return UniformCacheLocs(z, z if with_positions else None)
    kernel = functools.partial(_uniform_kernel, width=width, row_width=table.shape[1], nblk=pl.cdiv(width, BLOCK))
    outs = pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct((bs * width,), jnp.int32)] * n_out,
        grid=(bs,),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=_NUM_WARPS, num_stages=1),
        name=f"assign_extend_cache_locs_uniform_{width=}",
    )(rpi, table.reshape(-1), seq_lens)
    return UniformCacheLocs(outs[0], outs[1] if with_positions else None)


def _accept_kernel(ai_ref, ocl_ref, out_ref, *, size, size_up, num_locs):
    # ai_ref i32[B*A] flattened accept_index | ocl_ref i32[T] verify out_cache_loc | out_ref i32[B*A].
    idx = jnp.arange(size_up, dtype=jnp.int32)
    live = idx < size
    flat = load(ai_ref.at[jnp.where(live, idx, 0)], mask=live, other=-1)
    valid = flat >= 0
    cnt = valid.astype(jnp.int32)
    dst = jnp.cumsum(cnt) - cnt  # exclusive prefix count (forward cumsum lowers on Triton)
    total = jnp.sum(cnt)
    src = jnp.where(valid, jnp.minimum(flat, num_locs - 1), 0)
    vals = load(ocl_ref.at[src], mask=valid, other=0)
    store(out_ref.at[jnp.where(valid, dst, size)], vals, mask=valid)
    tail = live & (idx >= total)  # disjoint from [0, total): no lane races with the compaction store
    store(out_ref.at[jnp.where(tail, idx, size)], jnp.zeros((size_up,), jnp.int32), mask=tail)


def _accept_pallas(accept_index, out_cache_loc, *, interpret):
    size = accept_index.shape[0] * accept_index.shape[1]
    if size == 0 or out_cache_loc.shape[0] == 0:
        return jnp.zeros((size,), jnp.int32)
    size_up = _next_pow2(size)
    kernel = functools.partial(_accept_kernel, size=size, size_up=size_up, num_locs=out_cache_loc.shape[0])
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((size,), jnp.int32),
        grid=(1,),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=8 if size_up > 4096 else _NUM_WARPS, num_stages=1),
        name=f"fill_accept_out_cache_loc_{size=}",
    )(accept_index.reshape(-1), out_cache_loc)


# ----------------------------------------------------------------------------------------------------
# Public wrappers (jitted; trace-time validation; opt-in in-jit value checks)
# ----------------------------------------------------------------------------------------------------


_index = index_array  # tracer-safe; no host read for int32 arrays


def _host_narrowed(jitted, names):
    """Public entry: range-check concrete wide-integer index arguments on the host (``index_array``: never a
    silent int64 -> int32 truncation at the jit boundary), then call the jitted op."""

    @functools.wraps(jitted)
    def wrapper(*args, **kwargs):
        args = list(args)
        for i, name in enumerate(names[: len(args)]):
            a = args[i]
            dt = getattr(a, "dtype", None)
            if name and dt is not None and not isinstance(a, jax.core.Tracer) and jnp.issubdtype(dt, jnp.integer) and dt != jnp.int32:
                args[i] = index_array(name, a)
        return jitted(*args, **kwargs)

    wrapper.jitted = jitted
    return wrapper


def _check_rows(name, rpi, num_rows):
    check(jnp.all((rpi >= 0) & (rpi < num_rows)), f"{name}: pool row out of range [0, {num_rows})")


@functools.partial(jax.jit, static_argnames=("out_size", "implementation", "interpret"))
def assign_extend_cache_locs(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    start_offset: Int32[Array, " B"],
    end_offset: Int32[Array, " B"],
    *,
    out_size: int,
    implementation: str = "auto",
    interpret: bool = False,
) -> Int32[Array, " out_size"]:
    """Packed ragged copy of ``req_to_token[req_pool_indices[b], start[b]:end[b]]`` into a static
    ``(out_size,)`` int32 buffer, request-major; the tail past ``Σ(end - start)`` is 0 (dummy slot).

    Mirrors the Triton ``assign_extend_cache_locs`` (SGLang 0.5.23); the original leaves the tail as
    the caller's buffer had it (``torch.zeros`` in every spec caller). Rows longer than ``out_size``
    allows are truncated; checked mode reports it (and offsets outside the row / pool rows out of range).
    """
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    bs = rpi.shape[0]
    r2t = _index("req_to_token", req_to_token, (None, None))
    start = _index("start_offset", start_offset, (bs,))
    end = _index("end_offset", end_offset, (bs,))
    out_size = static_int("out_size", out_size, 0)
    _check_rows("req_pool_indices", rpi, r2t.shape[0])
    check(jnp.all((start >= 0) & (start <= end) & (end <= r2t.shape[1])),
          f"assign_extend_cache_locs: need 0 <= start_offset <= end_offset <= req_to_token.shape[1] = {r2t.shape[1]}")
    check(jnp.sum(end - start) <= out_size, f"assign_extend_cache_locs: total length exceeds out_size={out_size}")
    if resolve_implementation(implementation, interpret) == "reference":
        return assign_extend_cache_locs_reference(rpi, r2t, start, end, out_size=out_size)
    return _extend_pallas(rpi, r2t, start, end, out_size=out_size, interpret=interpret)


assign_extend_cache_locs = _host_narrowed(assign_extend_cache_locs, ("req_pool_indices", "req_to_token", "start_offset", "end_offset"))


@functools.partial(jax.jit, static_argnames=("width", "with_positions", "implementation", "interpret"))
def assign_extend_cache_locs_uniform(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    seq_lens: Int32[Array, " B"],
    *,
    width: int,
    with_positions: bool = False,
    implementation: str = "auto",
    interpret: bool = False,
) -> UniformCacheLocs:
    """Verify-window slots: ``out[b*width + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]``,
    ``k < width`` (``width = N``); optional ``positions[b*width + k] = seq_lens[b] + k``.

    Mirrors ``assign_extend_cache_locs_uniform`` (SGLang 0.5.23; the v2p/anchor fused outputs are not
    ported). Checked mode: ``seq_lens[b] + width <= req_to_token.shape[1]``, pool rows in range.
    """
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    bs = rpi.shape[0]
    r2t = _index("req_to_token", req_to_token, (None, None))
    seq = _index("seq_lens", seq_lens, (bs,))
    width = static_int("width", width, 0)
    _check_rows("req_pool_indices", rpi, r2t.shape[0])
    check(jnp.all((seq >= 0) & (seq + width <= r2t.shape[1])),
          f"assign_extend_cache_locs_uniform: need 0 <= seq_lens and seq_lens + {width} <= req_to_token.shape[1]")
    if resolve_implementation(implementation, interpret) == "reference":
        return assign_extend_cache_locs_uniform_reference(rpi, r2t, seq, width=width, with_positions=with_positions)
    return _uniform_pallas(rpi, r2t, seq, width=width, with_positions=with_positions, interpret=interpret)


assign_extend_cache_locs_uniform = _host_narrowed(assign_extend_cache_locs_uniform, ("req_pool_indices", "req_to_token", "seq_lens"))


@functools.partial(jax.jit, static_argnames=("width", "implementation", "interpret"))
def fill_front_out_cache_loc(
    num_front: Int32[Array, " B"],
    out_cache_loc: Int32[Array, " BN"],
    *,
    width: int,
    implementation: str = "auto",
    interpret: bool = False,
) -> Int32[Array, " BW"]:
    """Pack the first ``num_front[b]`` slots of each request's verify window
    (``out_cache_loc.reshape(B, N)``) into a ``(B * width,)`` buffer with a zero tail.

    Mirrors ``fill_front_out_cache_loc_func`` (SGLang 0.5.23): the ragged kernel with rows ``arange(B)``,
    ``start = 0``, ``end = num_front``. For the KV move ``width = A = S + 1`` and ``num_front = accept_lens``.
    Checked mode: ``0 <= num_front[b] <= N`` and ``Σ num_front <= B * width``.
    """
    nf = _index("num_front", num_front, (None,))
    bs = nf.shape[0]
    ocl = _index("out_cache_loc", out_cache_loc, (None,))
    width = static_int("width", width, 0)
    if bs and ocl.shape[0] % bs:
        raise ValueError(f"out_cache_loc: expected a multiple of B={bs} entries, got out_cache_loc.shape={ocl.shape}")
    n = ocl.shape[0] // bs if bs else 0
    check(jnp.all((nf >= 0) & (nf <= n)), f"fill_front_out_cache_loc: need 0 <= num_front <= N = {n}")
    check(jnp.sum(nf) <= bs * width, f"fill_front_out_cache_loc: Σ num_front exceeds B * width = {bs * width}")
    if resolve_implementation(implementation, interpret) == "reference" or bs == 0 or n == 0:
        return fill_front_out_cache_loc_reference(nf, ocl, width=width)
    rows = jnp.arange(bs, dtype=jnp.int32)
    return _extend_pallas(rows, ocl.reshape(bs, n), jnp.zeros_like(nf), nf, out_size=bs * width, interpret=interpret)


fill_front_out_cache_loc = _host_narrowed(fill_front_out_cache_loc, ("num_front", "out_cache_loc"))


@functools.partial(jax.jit, static_argnames=("implementation", "interpret"))
def fill_accept_out_cache_loc(
    accept_index: Int32[Array, "B A"],
    out_cache_loc: Int32[Array, " T"],
    *,
    implementation: str = "auto",
    interpret: bool = False,
) -> Int32[Array, " BA"]:
    """Stream compaction ``out[dst] = out_cache_loc[accept_index.flat[p]]`` over valid entries, ``dst`` the
    number of valid entries before ``p``; size ``B * A`` (0.5.23 sizing, not the older ``B * N``); zero tail.

    Mirrors ``fill_accept_out_cache_loc`` (SGLang 0.5.23, ``eagle.py``). Upstream counts entries ``!= -1``
    but writes entries ``> -1``; jaxspec treats every negative entry as unused (identical for the legal
    ``-1`` padding; checked mode rejects values below -1 and node ids ``>= T``).
    """
    ai = _index("accept_index", accept_index, (None, None))
    ocl = _index("out_cache_loc", out_cache_loc, (None,))
    size = ai.shape[0] * ai.shape[1]
    check(jnp.all((ai >= -1) & (ai < ocl.shape[0])),
          f"fill_accept_out_cache_loc: accept_index must be -1 or a node id in [0, {ocl.shape[0]})")
    impl = resolve_implementation(implementation, interpret)
    if impl == "pallas" and size > MAX_ACCEPT_SIZE:
        raise ValueError(f"accept_index: the Pallas kernel handles B*A <= {MAX_ACCEPT_SIZE}, got {ai.shape=}")
    if impl == "reference":
        return fill_accept_out_cache_loc_reference(ai, ocl)
    return _accept_pallas(ai, ocl, interpret=interpret)


fill_accept_out_cache_loc = _host_narrowed(fill_accept_out_cache_loc, ("accept_index", "out_cache_loc"))


@functools.partial(jax.jit, static_argnames=("topk", "num_steps", "num_cols", "implementation", "interpret"))
def assign_draft_cache_locs(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    seq_lens: Int32[Array, " B"],
    *,
    topk: int,
    num_steps: int,
    num_cols: int | None = None,
    implementation: str = "auto",
    interpret: bool = False,
) -> DraftCacheLocs:
    """Draft-decode KV slots, contiguous variant (§14): ``out[b*K*C + c] = req_to_token[req[b], seq_lens[b] + c]``
    for ``c < K*C`` with ``C = num_cols`` (default ``num_steps``; ``N`` when a K==1 chain plans the whole
    window), and ``positions[b*K + k] = seq_lens[b]``.

    Mirrors ``assign_draft_cache_locs_contiguous`` (SGLang 0.5.23; the M-RoPE copies are not ported).
    Per-step view: ``out.reshape(B, K, C).transpose(2, 0, 1)``.
    """
    topk = static_int("topk", topk, 1)
    num_steps = static_int("num_steps", num_steps, 1)
    c = num_steps if num_cols is None else static_int("num_cols", num_cols, 1)
    locs = assign_extend_cache_locs_uniform(
        req_pool_indices, req_to_token, seq_lens, width=topk * c, implementation=implementation, interpret=interpret
    ).out_cache_loc
    seq = _index("seq_lens", seq_lens, (None,))
    return DraftCacheLocs(locs, jnp.repeat(seq, topk, total_repeat_length=seq.shape[0] * topk))


assign_draft_cache_locs = _host_narrowed(assign_draft_cache_locs, ("req_pool_indices", "req_to_token", "seq_lens"))


__all__ = [
    "BLOCK",
    "MAX_ACCEPT_SIZE",
    "DraftCacheLocs",
    "UniformCacheLocs",
    "assign_draft_cache_locs",
    "assign_draft_cache_locs_reference",
    "assign_extend_cache_locs",
    "assign_extend_cache_locs_reference",
    "assign_extend_cache_locs_uniform",
    "assign_extend_cache_locs_uniform_reference",
    "fill_accept_out_cache_loc",
    "fill_accept_out_cache_loc_reference",
    "fill_front_out_cache_loc",
    "fill_front_out_cache_loc_reference",
]
