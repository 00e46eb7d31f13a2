"""TokenSpeed 0.1.0 ``python/tokenspeed/runtime/execution/cache_loc_kernel.py`` (commit f1c89a6e).

Paged cache-location kernels (docs/ops.md, "paged_cache_locs"): ``update_req_to_page`` (+ the host wrapper
``update_block_table``), ``compute_out_cache_loc`` (ragged), ``compute_out_cache_loc_uniform`` and
``fused_decode_input_prep``, each as a pure-jnp ``<op>_reference`` and a Pallas (Triton-lowering) kernel
behind one public function with ``implementation=`` (``_backend.Implementation``).

Conventions (same as TokenSpeed): page tables (``req_to_page``, pool-indexed, ``[R, M]``) and every
location/position output are int32; ``loc = page_id * page_size + offset_in_page`` in int32 arithmetic;
logical pages at or past the table width route to the reserved dummy slot 0.

Differences from upstream, all on inputs upstream leaves undefined (the checked mode flags them):
  * out-of-range ``req_pool_indices`` never touch memory: reads route to slot 0 (locations) / cache
    length 0, writes are dropped (upstream: unchecked out-of-bounds access);
  * negative lengths / page counts act as 0 (upstream: they shift the cumsum offsets of later requests);
  * ``update_req_to_page`` drops writes past the row width or past the packed page buffer, and the whole
    update of a request whose start column is negative (upstream: no bounds check, the caller clamps --
    see ``jaxspec/kernels/block_table.py``);
  * a negative position (``cache_start < 0``) or a negative page id in the table gives slot 0 (upstream:
    a slot on another page or a negative location);
  * duplicate ``req_pool_indices`` with overlapping writes race upstream and are unspecified here too.
Outputs are returned, never written into caller buffers; table updates donate the table so XLA updates it
in place (``input_output_aliases`` on the ``pallas_call``).

Length (over ~500 lines): four ops, each a reference, a kernel body, its checks and a public wrapper, all
built on the one shared page math (``_page_locs``) that keeps reference and kernel bit-identical; the host
block-table packer lives in ``block_table.py``.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Int32

from jax.experimental import pallas as pl

from jaxspec.kernels import _validate
from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import KernelOp, cdiv, next_pow2
from jaxspec.kernels._triton import compiler_params, load, store

# TokenSpeed's BLOCK_SIZE: one program iteration handles a 128-lane vector (4 warps x 32 lanes), so a
# decode step (a handful of tokens per request) is one iteration and a long prefill loops.
BLOCK = 128
# Lanes used when summing the lengths of earlier requests inside a program (exclusive prefix).
PREFIX_BLOCK = 128
NUM_WARPS = 4
def _lanes(n: int, cap: int = BLOCK) -> int:
    """Power-of-two vector width for ``n`` items (Triton needs power-of-two shapes), at most ``cap``."""
    return min(cap, next_pow2(max(n, 1)))


# ----------------------------------------------------------------------------------------------------
# Shared page math (used verbatim by the references and the kernel bodies, so both agree bit for bit).
# ----------------------------------------------------------------------------------------------------


def _page_locs(gather, pool, pos, *, num_rows: int, max_pages: int, page_size: int):
    """``loc = table[pool, pos // G] * G + pos % G``; overflow pages, invalid pools, negative positions and
    negative page ids -> slot 0 (checked mode flags the last three).

    ``lax.div``/``lax.rem`` truncate like Triton's ``//``/``%`` on int32. ``gather(pool_c, page_c)`` reads
    the table at in-range indices.
    """
    p = jnp.int32(page_size)
    page = lax.div(pos, p)
    off = lax.rem(pos, p)
    overflow = page >= max_pages
    page_c = jnp.clip(page, 0, max_pages - 1)
    pool_ok = (pool >= 0) & (pool < num_rows)
    pool_c = jnp.clip(pool, 0, num_rows - 1)
    ids = gather(pool_c, page_c)
    return jnp.where(overflow | ~pool_ok | (pos < 0) | (ids < 0), 0, ids * p + off)


def _segment_of(ends, size: int):
    """For each ``t < size``: the number of segments ending at or before ``t`` (= ``searchsorted(ends, t,
    side="right")`` for non-decreasing ``ends``), by a scatter-add + cumsum -- no XLA while loop, whose
    per-iteration predicate read-back makes ``jnp.searchsorted`` slow on GPU."""
    count = jnp.zeros((size + 1,), jnp.int32).at[jnp.minimum(ends, size)].add(1)
    return jnp.cumsum(count)[:size]


def _exclusive_cumsum(x):
    return jnp.cumsum(x) - x


# ----------------------------------------------------------------------------------------------------
# References (pure jnp, jittable, static shapes).
# ----------------------------------------------------------------------------------------------------


def update_req_to_page_reference(
    req_to_page: Int32[Array, "R M"],
    req_pool_indices: Int32[Array, "B"],
    new_occupied_pages: Int32[Array, "T"],
    new_occupied_pages_num: Int32[Array, "B"],
    pages_copy_starts: Int32[Array, "B"],
) -> Int32[Array, "R M"]:
    """``req_to_page[pool[i], start[i] + k] = pages[off[i] + k]`` for ``k < num[i]`` (docs/ops.md, "update_req_to_page").

    ``off`` is the exclusive prefix sum of ``num``; ``new_occupied_pages`` is a padded buffer whose entries
    past ``sum(num)`` are ignored.
    """
    num_rows, max_pages = req_to_page.shape
    total = new_occupied_pages.shape[0]
    if req_pool_indices.shape[0] == 0 or total == 0:
        return req_to_page
    num = jnp.maximum(new_occupied_pages_num, 0)
    off = _exclusive_cumsum(num)
    ends = off + num
    # Entry t of the packed buffer belongs to the request whose [off, end) holds t.
    t = jnp.arange(total, dtype=jnp.int32)
    r = _segment_of(ends, total)
    valid = r < num.shape[0]
    r_c = jnp.minimum(r, num.shape[0] - 1)
    col = pages_copy_starts[r_c] + (t - off[r_c])
    pool = req_pool_indices[r_c]
    start_ok = pages_copy_starts[r_c] >= 0  # a negative start drops the request's whole update
    valid = valid & start_ok & (col >= 0) & (col < max_pages) & (pool >= 0) & (pool < num_rows)
    rows = jnp.where(valid, pool, num_rows)  # parked out of range -> dropped
    return req_to_page.at[rows, jnp.where(valid, col, 0)].set(new_occupied_pages, mode="drop")


def compute_out_cache_loc_reference(
    cache_start: Int32[Array, "B"],
    input_lengths: Int32[Array, "B"],
    req_pool_indices: Int32[Array, "B"],
    req_to_pages: Int32[Array, "R M"],
    *,
    page_size: int,
    out_size: int,
) -> Int32[Array, "T"]:
    """Ragged locations: request ``r``'s ``input_lengths[r]`` tokens start at the exclusive prefix of the
    lengths; token ``k`` sits at position ``cache_start[r] + k`` (docs/ops.md, "compute_out_cache_loc"). Entries past
    ``sum(input_lengths)`` are 0 (the dummy slot)."""
    batch = req_pool_indices.shape[0]
    if batch == 0 or out_size == 0:
        return jnp.zeros((out_size,), jnp.int32)
    lens = jnp.maximum(input_lengths, 0)
    ends = jnp.cumsum(lens)
    t = jnp.arange(out_size, dtype=jnp.int32)
    r = _segment_of(ends, out_size)
    valid = r < batch
    r_c = jnp.minimum(r, batch - 1)
    pos = cache_start[r_c] + (t - (ends[r_c] - lens[r_c]))
    num_rows, max_pages = req_to_pages.shape
    locs = _page_locs(
        lambda p, q: req_to_pages[p, q], req_pool_indices[r_c], pos,
        num_rows=num_rows, max_pages=max_pages, page_size=page_size,
    )
    return jnp.where(valid, locs, 0)


def compute_out_cache_loc_uniform_reference(
    cache_start: Int32[Array, "B"],
    req_pool_indices: Int32[Array, "B"],
    req_to_pages: Int32[Array, "R M"],
    *,
    page_size: int,
    uniform_input_length: int,
) -> Int32[Array, "T"]:
    """Uniform locations: ``out[b*U + k] = loc(cache_start[b] + k)`` for ``k < U`` (docs/ops.md, "compute_out_cache_loc")."""
    num_rows, max_pages = req_to_pages.shape
    k = jnp.arange(uniform_input_length, dtype=jnp.int32)[None, :]
    pos = cache_start[:, None] + k
    pool = jnp.broadcast_to(req_pool_indices[:, None], pos.shape)
    locs = _page_locs(
        lambda p, q: req_to_pages[p, q], pool, pos, num_rows=num_rows, max_pages=max_pages, page_size=page_size
    )
    return locs.reshape(-1)


class DecodeInputs(NamedTuple):
    """Outputs of ``fused_decode_input_prep`` (all int32)."""

    seq_lens: Int32[Array, "B"]  # valid_cache_lengths[pool[b]] + U
    positions: Int32[Array, "T"]  # T = B * U; positions[b*U + k] = cache length + k
    out_cache_loc: Int32[Array, "T"]  # KV write slots of those positions


def fused_decode_input_prep_reference(
    valid_cache_lengths: Int32[Array, "R"],
    req_pool_indices: Int32[Array, "B"],
    req_to_pages: Int32[Array, "R M"],
    *,
    page_size: int,
    uniform_input_length: int,
) -> DecodeInputs:
    """Decode-uniform input prep (docs/ops.md, "fused_decode_input_prep"): one read of ``valid_cache_lengths[pool]`` feeds
    ``seq_lens``, ``positions`` and ``out_cache_loc``. Invalid pools read cache length 0 and slot 0."""
    num_rows, max_pages = req_to_pages.shape
    n_state = valid_cache_lengths.shape[0]
    pool = req_pool_indices
    ok = (pool >= 0) & (pool < n_state)
    c = jnp.where(ok, valid_cache_lengths[jnp.clip(pool, 0, n_state - 1)], 0)
    u = uniform_input_length
    pos = c[:, None] + jnp.arange(u, dtype=jnp.int32)[None, :]
    locs = _page_locs(
        lambda p, q: req_to_pages[p, q], jnp.broadcast_to(pool[:, None], pos.shape), pos,
        num_rows=num_rows, max_pages=max_pages, page_size=page_size,
    )
    return DecodeInputs(c + jnp.int32(u), pos.reshape(-1), locs.reshape(-1))


# ----------------------------------------------------------------------------------------------------
# Pallas kernel bodies. Refs are whole arrays in GPU global memory (no BlockSpecs: every program gathers
# through ``ref.at[...]``). Masked-off store lanes are parked on an out-of-range index (interpret mode
# writes masked lanes back; out-of-range scatter indices are dropped there and never touched on GPU).
# ----------------------------------------------------------------------------------------------------


def _prefix_sum(len_ref, b, batch: int):
    """Sum of ``max(len[i], 0)`` for ``i < b`` (the exclusive prefix TokenSpeed gets from a cumsum)."""
    lanes = _lanes(batch, PREFIX_BLOCK)
    iota = jnp.arange(lanes, dtype=jnp.int32)

    def body(j, acc):
        i = j * lanes + iota
        m = i < b
        v = load(len_ref.at[jnp.where(m, i, 0)], mask=m, other=0)
        return acc + jnp.sum(jnp.maximum(v, 0))

    return lax.fori_loop(0, cdiv(batch, lanes), body, jnp.int32(0))


def _table_gather(table_ref, mask):
    def gather(pool_c, page_c):
        return load(table_ref.at[pool_c, jnp.where(mask, page_c, 0)], mask=mask, other=0)

    return gather


def _update_req_to_page_kernel(
    rpi_ref,  # i32[B], GMEM
    pages_ref,  # i32[T], GMEM (packed, padded)
    num_ref,  # i32[B], GMEM
    starts_ref,  # i32[B], GMEM
    table_in_ref,  # i32[R, M], GMEM (aliased with table_ref; unused)
    table_ref,  # i32[R, M], GMEM (output)
    *,
    batch: int,
    total: int,
):
    del table_in_ref
    num_rows, max_pages = table_ref.shape
    b = pl.program_id(0)
    pool = rpi_ref[b]
    num = jnp.maximum(num_ref[b], 0)
    start = starts_ref[b]
    off = _prefix_sum(num_ref, b, batch)
    pool_ok = (pool >= 0) & (pool < num_rows) & (start >= 0)  # a negative start drops the whole request
    pool_c = jnp.clip(pool, 0, num_rows - 1)
    iota = jnp.arange(BLOCK, dtype=jnp.int32)

    def body(j, carry):
        k = j * BLOCK + iota
        src = off + k
        col = start + k
        m = (k < num) & pool_ok & (col >= 0) & (col < max_pages) & (src < total)
        v = load(pages_ref.at[jnp.where(m, src, 0)], mask=m, other=0)
        store(table_ref.at[pool_c, jnp.where(m, col, max_pages)], v, mask=m)
        return carry

    lax.fori_loop(0, cdiv(num, BLOCK), body, 0)


def _compute_out_cache_loc_kernel(
    rpi_ref,  # i32[B], GMEM
    len_ref,  # i32[B], GMEM
    cs_ref,  # i32[B], GMEM
    table_ref,  # i32[R, M], GMEM
    out_ref,  # i32[out_size], GMEM
    *,
    batch: int,
    page_size: int,
):
    """Programs ``0..B-1``: one request each (TokenSpeed's grid). Program ``B``: zero the tail past
    ``sum(lengths)`` so the whole (fresh) output is defined."""
    num_rows, max_pages = table_ref.shape
    out_size = out_ref.shape[0]
    b = pl.program_id(0)
    iota = jnp.arange(BLOCK, dtype=jnp.int32)

    @pl.when(b < batch)
    def _segment():
        pool = rpi_ref[b]
        length = jnp.maximum(len_ref[b], 0)
        start = cs_ref[b]
        off = _prefix_sum(len_ref, b, batch)

        def body(j, carry):
            k = j * BLOCK + iota
            t = off + k
            m = (k < length) & (t < out_size)
            locs = _page_locs(
                _table_gather(table_ref, m), pool, start + k,
                num_rows=num_rows, max_pages=max_pages, page_size=page_size,
            )
            store(out_ref.at[jnp.where(m, t, out_size)], locs, mask=m)
            return carry

        lax.fori_loop(0, cdiv(length, BLOCK), body, 0)

    @pl.when(b == batch)
    def _tail():
        total = _prefix_sum(len_ref, batch, batch)

        def body(j, carry):
            t = total + j * BLOCK + iota
            m = t < out_size
            store(out_ref.at[jnp.where(m, t, out_size)], jnp.zeros((BLOCK,), jnp.int32), mask=m)
            return carry

        lax.fori_loop(0, cdiv(jnp.maximum(out_size - total, 0), BLOCK), body, 0)


def _uniform_kernel(
    rpi_ref,  # i32[B], GMEM
    start_ref,  # i32[B] cache_start (uniform) or i32[R] valid_cache_lengths (fused), GMEM
    table_ref,  # i32[R, M], GMEM
    *out_refs,  # uniform: loc i32[B*U]; fused: loc i32[B*U], positions i32[B*U], seq_lens i32[B]
    batch: int,
    uniform: int,
    page_size: int,
    lanes: int,
    fused: bool,
):
    """Token-centric: program ``j`` owns flat tokens ``[j*lanes, (j+1)*lanes)`` of the ``B*U`` output
    (request ``t // U``, offset ``t % U``), so small-``U`` decode batches are a few dense programs instead
    of ``B`` mostly-idle ones; per-token results equal TokenSpeed's per-request loop."""
    num_rows, max_pages = table_ref.shape
    total = batch * uniform
    t = pl.program_id(0) * lanes + jnp.arange(lanes, dtype=jnp.int32)
    m = t < total
    b = jnp.where(m, lax.div(t, jnp.int32(uniform)), 0)
    k = t - b * uniform
    pool = load(rpi_ref.at[b], mask=m, other=0)
    if fused:
        n_state = start_ref.shape[0]
        ok = m & (pool >= 0) & (pool < n_state)
        c = load(start_ref.at[jnp.where(ok, pool, 0)], mask=ok, other=0)
    else:
        c = load(start_ref.at[b], mask=m, other=0)
    pos = c + k
    locs = _page_locs(
        _table_gather(table_ref, m), pool, pos, num_rows=num_rows, max_pages=max_pages, page_size=page_size
    )
    dst = jnp.where(m, t, total)
    store(out_refs[0].at[dst], locs, mask=m)
    if fused:
        store(out_refs[1].at[dst], pos, mask=m)
        first = m & (k == 0)
        store(out_refs[2].at[jnp.where(first, b, batch)], c + jnp.int32(uniform), mask=first)


# ----------------------------------------------------------------------------------------------------
# Public ops: validate (int64 narrowed through index_array, never truncated) -> resolve -> one jitted
# ``KernelOp`` keyed on the static config, implementation, interpret and checked mode (jaxspec/kernels/_dispatch.py).
# ----------------------------------------------------------------------------------------------------


def _table(name, x):
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype != np.int32:
        raise ValueError(f"{name}: expected an int32 page table of shape (R, M) (TokenSpeed tables are int32), "
                         f"got dtype {dtype}")
    if np.ndim(x) != 2 or np.shape(x)[0] < 1 or np.shape(x)[1] < 1:
        raise ValueError(f"{name}: expected shape (R, M) with R, M >= 1, got {name}.shape={tuple(np.shape(x))}")
    return jnp.asarray(x)


def _pools_in_range(pool, num_rows: int, what: str = "req_pool_indices"):
    return (pool >= 0) & (pool < num_rows), f"{what}: pool index out of range [0, {num_rows})"


def _page_ids_valid(table, pool, pos, valid, *, page_size: int):
    """Checked mode: the page ids behind in-table positions are not negative."""
    num_rows, max_pages = table.shape
    page = lax.div(pos, jnp.int32(page_size))
    used = valid & (pos >= 0) & (page < max_pages) & (pool >= 0) & (pool < num_rows)
    ids = table[jnp.clip(pool, 0, num_rows - 1), jnp.clip(page, 0, max_pages - 1)]
    return ~used | (ids >= 0), "req_to_pages: negative page id in a row a request reads"


def _update_checks(req_to_page, rpi, pages, num, starts):
    num_rows, max_pages = req_to_page.shape
    total = pages.shape[0]
    return [
        _pools_in_range(rpi, num_rows),
        (num >= 0, "new_occupied_pages_num: negative page count"),
        (starts >= 0, "pages_copy_starts: negative start"),
        (starts + num <= max_pages, f"update_req_to_page: pages past capacity (pages_copy_starts + "
                                    f"new_occupied_pages_num > max_pages={max_pages})"),
        (jnp.sum(jnp.maximum(num, 0)) <= total,
         f"new_occupied_pages: sum(new_occupied_pages_num) exceeds the packed buffer ({total})"),
        (pages >= 0, "new_occupied_pages: negative page id"),
    ]


def _update_impl(req_to_page, rpi, pages, num, starts, *, implementation, interpret):
    batch, total = rpi.shape[0], pages.shape[0]
    if batch == 0 or total == 0:
        return req_to_page
    if implementation == "reference":
        return update_req_to_page_reference(req_to_page, rpi, pages, num, starts)
    return pl.pallas_call(
        functools.partial(_update_req_to_page_kernel, batch=batch, total=total),
        out_shape=jax.ShapeDtypeStruct(req_to_page.shape, jnp.int32),
        grid=(batch,),
        input_output_aliases={4: 0},
        compiler_params=compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"update_req_to_page_{batch=}",
    )(rpi, pages, num, starts, req_to_page)


_UPDATE = KernelOp("update_req_to_page", _update_impl, donate=(0,), checks=_update_checks,
                   unchanged=lambda table, *_: table)


def update_req_to_page(
    req_to_page,
    req_pool_indices,
    new_occupied_pages,
    new_occupied_pages_num,
    pages_copy_starts,
    *,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, "R M"]:
    """Apply packed page-table refresh slices; returns the new ``req_to_page`` (jitted, table donated).

    Args:
      req_to_page: ``i32[R, M]`` pool-indexed page table (``R = max_req_pool_size + 1``). Donated: the
        caller's buffer is consumed and XLA writes the result in place.
      req_pool_indices: ``[B]`` pool row of each request.
      new_occupied_pages: ``[T]`` page ids packed request after request; a padded static buffer --
        entries past ``sum(new_occupied_pages_num)`` are ignored.
      new_occupied_pages_num: ``[B]`` pages per request; request ``i`` reads the packed entries
        ``[off_i, off_i + num_i)``, ``off`` = exclusive prefix sum.
      pages_copy_starts: ``[B]`` first table column written for each request.

    ``req_to_page[pool_i, start_i + k] = pages[off_i + k]``. Writes past the row width, the packed buffer or
    to an out-of-range pool are dropped, and so is the whole update of a request with a negative start
    (upstream has no bounds check); checked mode reports them before the table is written.
    """
    req_to_page = _table("req_to_page", req_to_page)
    rpi = _validate.index_array("req_pool_indices", req_pool_indices, (None,))
    batch = rpi.shape[0]
    pages = _validate.index_array("new_occupied_pages", new_occupied_pages, (None,))
    num = _validate.index_array("new_occupied_pages_num", new_occupied_pages_num, (batch,))
    starts = _validate.index_array("pages_copy_starts", pages_copy_starts, (batch,))
    return _UPDATE(req_to_page, rpi, pages, num, starts, implementation=implementation, interpret=interpret)


def _ragged_checks(cache_start, lens, rpi, table, *, page_size, out_size):
    batch = rpi.shape[0]
    out = [
        _pools_in_range(rpi, table.shape[0]),
        (lens >= 0, "input_lengths: negative length"),
        (cache_start >= 0, "cache_start: negative cache start"),
        (jnp.sum(jnp.maximum(lens, 0)) <= out_size, f"input_lengths: sum(input_lengths) exceeds out_size={out_size}"),
    ]
    if batch and out_size:
        ln = jnp.maximum(lens, 0)
        ends = jnp.cumsum(ln)
        t = jnp.arange(out_size, dtype=jnp.int32)
        r = _segment_of(ends, out_size)
        r_c = jnp.minimum(r, batch - 1)
        pos = cache_start[r_c] + (t - (ends[r_c] - ln[r_c]))
        out.append(_page_ids_valid(table, rpi[r_c], pos, r < batch, page_size=page_size))
    return out


def _ragged_impl(cache_start, lens, rpi, table, *, page_size, out_size, implementation, interpret):
    batch = rpi.shape[0]
    if implementation == "reference" or batch == 0 or out_size == 0:
        return compute_out_cache_loc_reference(cache_start, lens, rpi, table, page_size=page_size,
                                               out_size=out_size)
    return pl.pallas_call(
        functools.partial(_compute_out_cache_loc_kernel, batch=batch, page_size=page_size),
        out_shape=jax.ShapeDtypeStruct((out_size,), jnp.int32),
        grid=(batch + 1,),
        compiler_params=compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"compute_out_cache_loc_{page_size=}",
    )(rpi, lens, cache_start, table)


_RAGGED = KernelOp("compute_out_cache_loc", _ragged_impl, static=("page_size", "out_size"), checks=_ragged_checks)


def compute_out_cache_loc(
    cache_start,
    input_lengths,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    out_size: int,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, "T"]:
    """Ragged KV write locations (jitted): returns ``i32[out_size]``.

    Request ``r`` owns outputs ``[off_r, off_r + input_lengths[r])`` (``off`` = exclusive prefix sum);
    token ``k`` there is position ``cache_start[r] + k`` of pool row ``req_pool_indices[r]`` and lands at
    ``req_to_pages[row, pos // G] * G + pos % G`` (``G = page_size``) -- or slot 0 when ``pos // G >= M`` (upstream's semantics), when
    ``pos < 0`` or when the page id is negative. ``out_size`` is a static bucket ``>= sum(input_lengths)``;
    outputs past the sum are 0 (TokenSpeed callers zero-initialise the buffer), tokens past ``out_size`` are
    dropped.
    """
    table = _table("req_to_pages", req_to_pages)
    rpi = _validate.index_array("req_pool_indices", req_pool_indices, (None,))
    batch = rpi.shape[0]
    cs = _validate.index_array("cache_start", cache_start, (batch,))
    lens = _validate.index_array("input_lengths", input_lengths, (batch,))
    page_size = _validate.static_int("page_size", page_size, 1)
    out_size = _validate.static_int("out_size", out_size, 0)
    return _RAGGED(cs, lens, rpi, table, page_size=page_size, out_size=out_size, implementation=implementation,
                   interpret=interpret)


def _uniform_call(rpi, starts, table, *, page_size, uniform, interpret, fused):
    batch = rpi.shape[0]
    total = batch * uniform
    lanes = _lanes(total)
    out_shape = [jax.ShapeDtypeStruct((total,), jnp.int32)]
    if fused:
        out_shape += [jax.ShapeDtypeStruct((total,), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.int32)]
    return pl.pallas_call(
        functools.partial(_uniform_kernel, batch=batch, uniform=uniform, page_size=page_size, lanes=lanes,
                          fused=fused),
        out_shape=out_shape,
        grid=(cdiv(total, lanes),),
        compiler_params=compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"{'fused_decode_input_prep' if fused else 'compute_out_cache_loc_uniform'}_{uniform=}_{page_size=}",
    )(rpi, starts, table)


def _uniform_args(req_to_pages, req_pool_indices, page_size, uniform_input_length, min_uniform):
    """Validated ``(table, req_pool_indices, page_size, U)`` of the uniform-length ops."""
    return (_table("req_to_pages", req_to_pages), _validate.index_array("req_pool_indices", req_pool_indices, (None,)),
            _validate.static_int("page_size", page_size, 1),
            _validate.static_int("uniform_input_length", uniform_input_length, min_uniform))


def _uniform_positions(cache_start, u):
    return cache_start[:, None] + jnp.arange(u, dtype=jnp.int32)[None, :]


def _uniform_page_ids_valid(cache_start, rpi, table, *, page_size, uniform_input_length):
    pos = _uniform_positions(cache_start, uniform_input_length)
    pool = jnp.broadcast_to(rpi[:, None], pos.shape)
    return _page_ids_valid(table, pool, pos, jnp.ones(pos.shape, bool), page_size=page_size)


def _uniform_checks(cache_start, rpi, table, *, page_size, uniform_input_length):
    return [
        _pools_in_range(rpi, table.shape[0]),
        (cache_start >= 0, "cache_start: negative cache start"),
        _uniform_page_ids_valid(cache_start, rpi, table, page_size=page_size, uniform_input_length=uniform_input_length),
    ]


def _uniform_impl(cache_start, rpi, table, *, page_size, uniform_input_length, implementation, interpret):
    if implementation == "reference" or rpi.shape[0] * uniform_input_length == 0:
        return compute_out_cache_loc_uniform_reference(cache_start, rpi, table, page_size=page_size,
                                                       uniform_input_length=uniform_input_length)
    (locs,) = _uniform_call(rpi, cache_start, table, page_size=page_size, uniform=uniform_input_length,
                            interpret=interpret, fused=False)
    return locs


_UNIFORM = KernelOp("compute_out_cache_loc_uniform", _uniform_impl, static=("page_size", "uniform_input_length"),
                    checks=_uniform_checks)


def compute_out_cache_loc_uniform(
    cache_start,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    uniform_input_length: int,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, "T"]:
    """Uniform KV write locations (jitted): ``out[b*U + k]`` for position ``cache_start[b] + k``, ``k < U``
    (``U = uniform_input_length``, static; the multi-step drafter uses ``U = S - 1``). Same page math and
    slot-0 rule as ``compute_out_cache_loc``. Returns ``i32[B * U]``."""
    table, rpi, page_size, u = _uniform_args(req_to_pages, req_pool_indices, page_size, uniform_input_length, 0)
    cs = _validate.index_array("cache_start", cache_start, (rpi.shape[0],))
    return _UNIFORM(cs, rpi, table, page_size=page_size, uniform_input_length=u, implementation=implementation,
                    interpret=interpret)


def _fused_checks(vcl, rpi, table, *, page_size, uniform_input_length):
    n_state = vcl.shape[0]
    ok = (rpi >= 0) & (rpi < n_state)
    c = jnp.where(ok, vcl[jnp.clip(rpi, 0, n_state - 1)], 0)
    return [
        _pools_in_range(rpi, min(table.shape[0], n_state)),
        (vcl >= 0, "valid_cache_lengths: negative cache length"),
        _uniform_page_ids_valid(c, rpi, table, page_size=page_size, uniform_input_length=uniform_input_length),
    ]


def _fused_impl(vcl, rpi, table, *, page_size, uniform_input_length, implementation, interpret):
    if implementation == "reference" or rpi.shape[0] == 0:
        return fused_decode_input_prep_reference(vcl, rpi, table, page_size=page_size,
                                                 uniform_input_length=uniform_input_length)
    locs, pos, seq = _uniform_call(rpi, vcl, table, page_size=page_size, uniform=uniform_input_length,
                                   interpret=interpret, fused=True)
    return DecodeInputs(seq, pos, locs)


_FUSED = KernelOp("fused_decode_input_prep", _fused_impl, static=("page_size", "uniform_input_length"),
                  checks=_fused_checks)


def fused_decode_input_prep(
    valid_cache_lengths,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    uniform_input_length: int,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> DecodeInputs:
    """Decode-only input prep in one launch (jitted): ``c = valid_cache_lengths[req_pool_indices[b]]``;
    ``seq_lens[b] = c + U``; ``positions[b*U + k] = c + k``; ``out_cache_loc`` as
    ``compute_out_cache_loc_uniform`` with ``cache_start = c`` (TokenSpeed seed; 0.1.1 dropped the
    locations). ``valid_cache_lengths`` is pool-indexed ``[R]``; ``U >= 1`` is static."""
    table, rpi, page_size, u = _uniform_args(req_to_pages, req_pool_indices, page_size, uniform_input_length, 1)
    vcl = _validate.index_array("valid_cache_lengths", valid_cache_lengths, (None,))
    if vcl.shape[0] < 1:
        raise ValueError(f"valid_cache_lengths: expected shape (R,) with R >= 1, got {vcl.shape}")
    return _FUSED(vcl, rpi, table, page_size=page_size, uniform_input_length=u, implementation=implementation,
                  interpret=interpret)


__all__ = [
    "DecodeInputs",
    "compute_out_cache_loc",
    "compute_out_cache_loc_reference",
    "compute_out_cache_loc_uniform",
    "compute_out_cache_loc_uniform_reference",
    "fused_decode_input_prep",
    "fused_decode_input_prep_reference",
    "update_req_to_page",
    "update_req_to_page_reference",
]
