"""SGLang 0.5.23 ``assign_extend_cache_locs`` (+ uniform, ``fill_front_out_cache_loc``,
``assign_draft_cache_locs_contiguous``) from ``python/sglang/kernels/ops/speculative/cache_locs.py`` and
``fill_accept_out_cache_loc`` from ``python/sglang/kernels/ops/speculative/eagle.py`` (docs/ops.md: "assign_extend_cache_locs", "fill_accept_out_cache_loc",
"assign_draft_cache_locs").

All location outputs are int32 (SGLang uses int64 buffers; the values are identical). Output buffers are
allocated here (no caller ``out`` tensors); packed ragged outputs have a zero tail (dummy KV slot 0).

Every op has a pure-jnp ``<op>_reference`` (jittable) and a Pallas kernel that lowers through the
Triton backend (``jaxspec/kernels/_backend.py``): 1-D gathers/scatters on flattened refs with index vectors,
power-of-two blocks, static grids, no scalar prefetch. Masked-off store lanes are parked on an
out-of-range index (``PARK``) because Pallas interpret mode writes masked lanes back.

Out-of-range values (one rule, reference and kernel alike): a read outside ``req_to_token`` (a pool row
outside ``[0, R)``, a column outside ``[0, W)``) or an ``accept_index`` node outside ``[0, T)`` reads the
dummy slot 0 -- never another request's row. Checked mode (``jaxspec.checks()`` / ``JAXSPEC_CHECKS=1``)
flags them: offsets inside the ``req_to_token`` row, packed totals within ``out_size``, pool rows in range.
Dispatch: ``jaxspec/kernels/_dispatch.py`` (validate -> resolve -> one jitted ``KernelOp``).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Int32

from jaxspec.kernels._validate import index_array, static_int
from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import KernelOp, next_pow2
from jaxspec.kernels._triton import compiler_params, load, store

# Index-vector width of the copy loops: 128 int32 lanes = one 512-byte vector per program step, the
# same order as SGLang's 32/64/128-wide Triton loops; power of two as the Triton lowering requires.
BLOCK = 128
# fill_accept_out_cache_loc runs one program over the whole flattened accept_index (the exclusive
# prefix count needs all of it); 32768 int32 lanes = 128 KiB of registers at 8 warps is the cap.
MAX_ACCEPT_SIZE = 32768
_NUM_WARPS = 4


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


def _read_table(table, rows, cols):
    """``table[rows, cols]``, or the dummy slot 0 where a row or column is out of range."""
    num_rows, width = table.shape
    ok = (rows >= 0) & (rows < num_rows) & (cols >= 0) & (cols < width)
    return jnp.where(ok, table[jnp.clip(rows, 0, num_rows - 1), jnp.clip(cols, 0, width - 1)], 0)


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
    vals = _read_table(req_to_token, req_pool_indices[b], start_offset[b] + k)
    return jnp.where(o < total, vals, 0).astype(jnp.int32)


def assign_extend_cache_locs_uniform_reference(req_pool_indices, req_to_token, seq_lens, *, width, with_positions=False):
    """``out[b*width + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]``; positions ``seq_lens[b] + k``."""
    k = jnp.arange(width, dtype=jnp.int32)
    cols = seq_lens[:, None] + k[None, :]
    out = _read_table(req_to_token, req_pool_indices[:, None], cols).reshape(-1).astype(jnp.int32)
    return UniformCacheLocs(out, cols.reshape(-1) if with_positions else None)


def fill_front_out_cache_loc_reference(num_front, out_cache_loc, *, width):
    """Pack the first ``num_front[b]`` slots of request b's window (``out_cache_loc.reshape(B, N)``)."""
    bs = num_front.shape[0]
    window = out_cache_loc.reshape(bs, -1) if bs else out_cache_loc.reshape(0, 1)
    rows = jnp.arange(bs, dtype=jnp.int32)
    return assign_extend_cache_locs_reference(rows, window, jnp.zeros_like(num_front), num_front, out_size=bs * width)


def fill_accept_out_cache_loc_reference(accept_index, out_cache_loc):
    """Stream compaction: the valid (``>= 0``) entries of ``accept_index.reshape(-1)`` mapped through
    ``out_cache_loc``, packed in order; zero tail; size ``B * A``. Nodes ``>= T`` read slot 0."""
    flat = accept_index.reshape(-1)
    size = flat.shape[0]
    valid = flat >= 0
    cnt = valid.astype(jnp.int32)
    dst = jnp.cumsum(cnt) - cnt
    num_locs = out_cache_loc.shape[0]
    vals = jnp.where(flat < num_locs, out_cache_loc[jnp.clip(flat, 0, max(num_locs - 1, 0))], 0) if num_locs else flat * 0
    return jnp.zeros((size,), jnp.int32).at[jnp.where(valid, dst, size)].set(vals.astype(jnp.int32), mode="drop")


# ----------------------------------------------------------------------------------------------------
# Pallas kernels (refs only). Flattened 1-D tables; every store parks masked lanes on ``size`` (OOB).
# ----------------------------------------------------------------------------------------------------


def _extend_kernel(rpi_ref, r2t_ref, start_ref, end_ref, out_ref, *, bs, num_rows, width, out_size, bs_up):
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
        row_ok = (row >= 0) & (row < num_rows)

        def body(i, carry):
            k = i * BLOCK + lane
            m = (k < ln) & (off + k < out_size)
            rd = m & row_ok & (st + k >= 0) & (st + k < width)  # reads outside the table: dummy slot 0
            vals = load(r2t_ref.at[jnp.where(rd, row * width + st + k, 0)], mask=rd, other=0)
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
    kernel = functools.partial(_extend_kernel, bs=bs, num_rows=table.shape[0], width=width, out_size=out_size,
                               bs_up=next_pow2(max(bs, 1)))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((out_size,), jnp.int32),
        grid=(grid,),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=_NUM_WARPS, num_stages=1),
        name=f"assign_extend_cache_locs_{out_size=}",
    )(rpi, table.reshape(-1), start, end)


def _uniform_kernel(rpi_ref, r2t_ref, seq_ref, *out_refs, width, num_rows, row_width, nblk):
    # rpi_ref, seq_ref i32[B] | r2t_ref i32[R*W] | out_refs: i32[B*width] locations (+ i32[B*width] positions).
    b = pl.program_id(0)
    lane = jnp.arange(BLOCK, dtype=jnp.int32)
    row = rpi_ref[b]
    st = seq_ref[b]
    size = out_refs[0].shape[0]
    row_ok = (row >= 0) & (row < num_rows)
    for i in range(nblk):  # static: width is a compile-time constant (N or K*C)
        k = i * BLOCK + lane
        m = k < width
        rd = m & row_ok & (st + k >= 0) & (st + k < row_width)  # reads outside the table: dummy slot 0
        vals = load(r2t_ref.at[jnp.where(rd, row * row_width + st + k, 0)], mask=rd, other=0)
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
    kernel = functools.partial(_uniform_kernel, width=width, num_rows=table.shape[0], row_width=table.shape[1],
                               nblk=pl.cdiv(width, BLOCK))
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
    rd = valid & (flat < num_locs)  # nodes past out_cache_loc read the dummy slot 0
    vals = load(ocl_ref.at[jnp.where(rd, flat, 0)], mask=rd, other=0)
    store(out_ref.at[jnp.where(valid, dst, size)], vals, mask=valid)
    tail = live & (idx >= total)  # disjoint from [0, total): no lane races with the compaction store
    store(out_ref.at[jnp.where(tail, idx, size)], jnp.zeros((size_up,), jnp.int32), mask=tail)


def _accept_pallas(accept_index, out_cache_loc, *, interpret):
    size = accept_index.shape[0] * accept_index.shape[1]
    if size == 0 or out_cache_loc.shape[0] == 0:
        return jnp.zeros((size,), jnp.int32)
    size_up = next_pow2(size)
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
# Public ops: validate -> resolve ``implementation`` -> one jitted ``KernelOp`` (jaxspec/kernels/_dispatch.py)
# ----------------------------------------------------------------------------------------------------


def _rows_in_range(rpi, num_rows):
    return (rpi >= 0) & (rpi < num_rows), f"req_pool_indices: pool row out of range [0, {num_rows})"


def _extend_checks(rpi, r2t, start, end, *, out_size):
    return [
        _rows_in_range(rpi, r2t.shape[0]),
        ((start >= 0) & (start <= end) & (end <= r2t.shape[1]),
         f"assign_extend_cache_locs: need 0 <= start_offset <= end_offset <= req_to_token.shape[1] = {r2t.shape[1]}"),
        (jnp.sum(end - start) <= out_size, f"assign_extend_cache_locs: total length exceeds out_size={out_size}"),
    ]


def _extend_impl(rpi, r2t, start, end, *, out_size, implementation, interpret):
    if implementation == "reference":
        return assign_extend_cache_locs_reference(rpi, r2t, start, end, out_size=out_size)
    return _extend_pallas(rpi, r2t, start, end, out_size=out_size, interpret=interpret)


_EXTEND = KernelOp("assign_extend_cache_locs", _extend_impl, static=("out_size",), checks=_extend_checks)


def assign_extend_cache_locs(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    start_offset: Int32[Array, " B"],
    end_offset: Int32[Array, " B"],
    *,
    out_size: int,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, " out_size"]:
    """Packed ragged copy of ``req_to_token[req_pool_indices[b], start[b]:end[b]]`` into a static
    ``(out_size,)`` int32 buffer, request-major; the tail past ``Σ(end - start)`` is 0 (dummy slot).

    Mirrors the Triton ``assign_extend_cache_locs`` (SGLang 0.5.23); the original leaves the tail as
    the caller's buffer had it (``torch.zeros`` in every spec caller). Rows longer than ``out_size``
    allows are truncated; reads outside ``req_to_token`` give slot 0; checked mode reports both (and
    pool rows out of range).
    """
    rpi = index_array("req_pool_indices", req_pool_indices, (None,))
    bs = rpi.shape[0]
    r2t = index_array("req_to_token", req_to_token, (None, None))
    start = index_array("start_offset", start_offset, (bs,))
    end = index_array("end_offset", end_offset, (bs,))
    out_size = static_int("out_size", out_size, 0)
    return _EXTEND(rpi, r2t, start, end, out_size=out_size, implementation=implementation, interpret=interpret)


def _uniform_checks(rpi, r2t, seq, *, width, with_positions=False):
    return [
        _rows_in_range(rpi, r2t.shape[0]),
        ((seq >= 0) & (seq + width <= r2t.shape[1]),
         f"assign_extend_cache_locs_uniform: need 0 <= seq_lens and seq_lens + {width} <= req_to_token.shape[1]"),
    ]


def _uniform_impl(rpi, r2t, seq, *, width, with_positions, implementation, interpret):
    if implementation == "reference":
        return assign_extend_cache_locs_uniform_reference(rpi, r2t, seq, width=width, with_positions=with_positions)
    return _uniform_pallas(rpi, r2t, seq, width=width, with_positions=with_positions, interpret=interpret)


_UNIFORM = KernelOp("assign_extend_cache_locs_uniform", _uniform_impl, static=("width", "with_positions"),
                    checks=_uniform_checks)


def assign_extend_cache_locs_uniform(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    seq_lens: Int32[Array, " B"],
    *,
    width: int,
    with_positions: bool = False,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> UniformCacheLocs:
    """Verify-window slots: ``out[b*width + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]``,
    ``k < width`` (``width = N``); optional ``positions[b*width + k] = seq_lens[b] + k``.

    Mirrors ``assign_extend_cache_locs_uniform`` (SGLang 0.5.23; the v2p/anchor fused outputs are not
    ported). Reads outside ``req_to_token`` give slot 0. Checked mode: ``seq_lens[b] + width <=
    req_to_token.shape[1]``, pool rows in range.
    """
    rpi = index_array("req_pool_indices", req_pool_indices, (None,))
    bs = rpi.shape[0]
    r2t = index_array("req_to_token", req_to_token, (None, None))
    seq = index_array("seq_lens", seq_lens, (bs,))
    width = static_int("width", width, 0)
    return _UNIFORM(rpi, r2t, seq, width=width, with_positions=bool(with_positions), implementation=implementation,
                    interpret=interpret)


def _front_checks(nf, ocl, *, width):
    bs = nf.shape[0]
    n = ocl.shape[0] // bs if bs else 0
    return [
        ((nf >= 0) & (nf <= n), f"fill_front_out_cache_loc: need 0 <= num_front <= N = {n}"),
        (jnp.sum(nf) <= bs * width, f"fill_front_out_cache_loc: Σ num_front exceeds B * width = {bs * width}"),
    ]


def _front_impl(nf, ocl, *, width, implementation, interpret):
    bs = nf.shape[0]
    n = ocl.shape[0] // bs if bs else 0
    if implementation == "reference" or bs == 0 or n == 0:
        return fill_front_out_cache_loc_reference(nf, ocl, width=width)
    rows = jnp.arange(bs, dtype=jnp.int32)
    return _extend_pallas(rows, ocl.reshape(bs, n), jnp.zeros_like(nf), nf, out_size=bs * width, interpret=interpret)


_FRONT = KernelOp("fill_front_out_cache_loc", _front_impl, static=("width",), checks=_front_checks)


def fill_front_out_cache_loc(
    num_front: Int32[Array, " B"],
    out_cache_loc: Int32[Array, " BN"],
    *,
    width: int,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, " BW"]:
    """Pack the first ``num_front[b]`` slots of each request's verify window
    (``out_cache_loc.reshape(B, N)``) into a ``(B * width,)`` buffer with a zero tail.

    Mirrors ``fill_front_out_cache_loc_func`` (SGLang 0.5.23): the ragged kernel with rows ``arange(B)``,
    ``start = 0``, ``end = num_front``. For the KV move ``width = A = S + 1`` and ``num_front = accept_lens``.
    Entries past a window (``num_front[b] > N``) read slot 0. Checked mode: ``0 <= num_front[b] <= N`` and
    ``Σ num_front <= B * width``.
    """
    nf = index_array("num_front", num_front, (None,))
    bs = nf.shape[0]
    ocl = index_array("out_cache_loc", out_cache_loc, (None,))
    width = static_int("width", width, 0)
    if bs and ocl.shape[0] % bs:
        raise ValueError(f"out_cache_loc: expected a multiple of B={bs} entries, got out_cache_loc.shape={ocl.shape}")
    return _FRONT(nf, ocl, width=width, implementation=implementation, interpret=interpret)


def _accept_checks(ai, ocl):
    return [((ai >= -1) & (ai < ocl.shape[0]),
             f"fill_accept_out_cache_loc: accept_index must be -1 or a node id in [0, {ocl.shape[0]})")]


def _accept_impl(ai, ocl, *, implementation, interpret):
    if implementation == "reference":
        return fill_accept_out_cache_loc_reference(ai, ocl)
    return _accept_pallas(ai, ocl, interpret=interpret)


_ACCEPT = KernelOp("fill_accept_out_cache_loc", _accept_impl, checks=_accept_checks)


def fill_accept_out_cache_loc(
    accept_index: Int32[Array, "B A"],
    out_cache_loc: Int32[Array, " T"],
    *,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, " BA"]:
    """Stream compaction ``out[dst] = out_cache_loc[accept_index.flat[p]]`` over valid entries, ``dst`` the
    number of valid entries before ``p``; size ``B * A`` (0.5.23 sizing, not the older ``B * N``); zero tail.

    Mirrors ``fill_accept_out_cache_loc`` (SGLang 0.5.23, ``eagle.py``). Upstream counts entries ``!= -1``
    but writes entries ``> -1``; jaxspec treats every negative entry as unused (identical for the legal
    ``-1`` padding) and node ids ``>= T`` read slot 0; checked mode rejects both.
    """
    ai = index_array("accept_index", accept_index, (None, None))
    ocl = index_array("out_cache_loc", out_cache_loc, (None,))
    size = ai.shape[0] * ai.shape[1]
    too_big = f"takes accept_index with B*A <= {MAX_ACCEPT_SIZE}, got shape {ai.shape}"
    impl = _ACCEPT.resolve(implementation, interpret, unsupported=lambda b: too_big if size > MAX_ACCEPT_SIZE else None)
    return _ACCEPT(ai, ocl, implementation=impl, interpret=interpret)


def _draft_checks(rpi, r2t, seq, *, topk, num_cols):
    return _uniform_checks(rpi, r2t, seq, width=topk * num_cols)


def _draft_impl(rpi, r2t, seq, *, topk, num_cols, implementation, interpret):
    locs = _uniform_impl(rpi, r2t, seq, width=topk * num_cols, with_positions=False, implementation=implementation,
                         interpret=interpret).out_cache_loc
    return DraftCacheLocs(locs, jnp.repeat(seq, topk, total_repeat_length=seq.shape[0] * topk))


_DRAFT = KernelOp("assign_draft_cache_locs", _draft_impl, static=("topk", "num_cols"), checks=_draft_checks)


def assign_draft_cache_locs(
    req_pool_indices: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    seq_lens: Int32[Array, " B"],
    *,
    topk: int,
    num_steps: int,
    num_cols: int | None = None,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> DraftCacheLocs:
    """Draft-decode KV slots, contiguous variant (§14): ``out[b*K*C + c] = req_to_token[req[b], seq_lens[b] + c]``
    for ``c < K*C`` with ``C = num_cols`` (default ``num_steps``; ``N`` when a K==1 chain plans the whole
    window), and ``positions[b*K + k] = seq_lens[b]``.

    Mirrors ``assign_draft_cache_locs_contiguous`` (SGLang 0.5.23; the M-RoPE copies are not ported).
    Per-step view: ``out.reshape(B, K, C).transpose(2, 0, 1)``. Reads outside ``req_to_token`` give slot 0.
    """
    topk = static_int("topk", topk, 1)
    num_steps = static_int("num_steps", num_steps, 1)
    c = num_steps if num_cols is None else static_int("num_cols", num_cols, 1)
    rpi = index_array("req_pool_indices", req_pool_indices, (None,))
    r2t = index_array("req_to_token", req_to_token, (None, None))
    seq = index_array("seq_lens", seq_lens, (rpi.shape[0],))
    return _DRAFT(rpi, r2t, seq, topk=topk, num_cols=c, implementation=implementation, interpret=interpret)


__all__ = [
    "BLOCK",
    "MAX_ACCEPT_SIZE",
    "DraftCacheLocs",
    "UniformCacheLocs",
    "assign_draft_cache_locs",
    "assign_extend_cache_locs",
    "assign_extend_cache_locs_reference",
    "assign_extend_cache_locs_uniform",
    "assign_extend_cache_locs_uniform_reference",
    "fill_accept_out_cache_loc",
    "fill_accept_out_cache_loc_reference",
    "fill_front_out_cache_loc",
    "fill_front_out_cache_loc_reference",
]
