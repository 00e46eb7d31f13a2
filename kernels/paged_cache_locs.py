"""TokenSpeed 0.1.0 ``python/tokenspeed/runtime/execution/cache_loc_kernel.py`` (the seed file, commit f1c89a6e).

Paged cache-location kernels (ops-spec §16): ``update_req_to_page`` (+ the host wrapper
``update_block_table``), ``compute_out_cache_loc`` (ragged), ``compute_out_cache_loc_uniform`` and
``fused_decode_input_prep``, each as a pure-jnp ``<op>_reference`` and a Pallas (Triton-lowering) kernel
behind one public function with ``implementation="auto" | "pallas" | "reference"``.

Conventions (same as TokenSpeed): page tables (``req_to_page``, pool-indexed, ``[R, M]``) and every
location/position output are int32; ``loc = page_id * page_size + offset_in_page`` in int32 arithmetic;
logical pages at or past the table width route to the reserved dummy slot 0.

Differences from upstream, all on inputs upstream leaves undefined (the checked mode flags them):
  * out-of-range ``req_pool_indices`` never touch memory: reads route to slot 0 (locations) / cache
    length 0, writes are dropped (upstream: unchecked out-of-bounds access);
  * negative lengths / page counts act as 0 (upstream: they shift the cumsum offsets of later requests);
  * ``update_req_to_page`` drops writes past the row width or past the packed page buffer
    (upstream: no bounds check, the caller clamps -- see ``update_block_table``);
  * duplicate ``req_pool_indices`` with overlapping writes race upstream and are unspecified here too.
Outputs are returned, never written into caller buffers; table updates donate the table so XLA updates it
in place (``input_output_aliases`` on the ``pallas_call``).
"""

import functools
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Int32

from jaxspec import _validate
from jaxspec.kernels import _backend
from jaxspec.kernels._backend import load, pl, store

# TokenSpeed's BLOCK_SIZE: one program iteration handles a 128-lane vector (4 warps x 32 lanes), so a
# decode step (a handful of tokens per request) is one iteration and a long prefill loops.
BLOCK = 128
# Lanes used when summing the lengths of earlier requests inside a program (exclusive prefix).
PREFIX_BLOCK = 128
NUM_WARPS = 4
# Smallest power-of-two buckets ``update_block_table`` pads the batch / packed page buffer to, so the
# jitted update recompiles only when a bucket grows.
MIN_BATCH_BUCKET = 8
MIN_PAGES_BUCKET = 128


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _lanes(n: int, cap: int = BLOCK) -> int:
    """Power-of-two vector width for ``n`` items (Triton needs power-of-two shapes), at most ``cap``."""
    return min(cap, _next_pow2(max(n, 1)))


def _cdiv(a, b):
    return (a + b - 1) // b


# ----------------------------------------------------------------------------------------------------
# Shared page math (used verbatim by the references and the kernel bodies, so both agree bit for bit).
# ----------------------------------------------------------------------------------------------------


def _page_locs(gather, pool, pos, *, num_rows: int, max_pages: int, page_size: int):
    """``loc = table[pool, pos // P] * P + pos % P``; overflow pages and invalid pools -> slot 0.

    ``lax.div``/``lax.rem`` truncate like Triton's ``//``/``%`` on int32, so even a (checked-mode
    flagged) negative position reproduces upstream's arithmetic. ``gather(pool_c, page_c)`` reads the table
    at in-range indices.
    """
    p = jnp.int32(page_size)
    page = lax.div(pos, p)
    off = lax.rem(pos, p)
    overflow = page >= max_pages
    page_c = jnp.clip(page, 0, max_pages - 1)
    pool_ok = (pool >= 0) & (pool < num_rows)
    pool_c = jnp.clip(pool, 0, num_rows - 1)
    ids = gather(pool_c, page_c)
    return jnp.where(overflow | ~pool_ok, 0, ids * p + off)


_index = _validate.index_array  # tracer-safe, no host read for int32 arrays


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
    """``req_to_page[pool[i], start[i] + k] = pages[off[i] + k]`` for ``k < num[i]`` (ops-spec §16.1).

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
    valid = valid & (col >= 0) & (col < max_pages) & (pool >= 0) & (pool < num_rows)
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
    lengths; token ``k`` sits at position ``cache_start[r] + k`` (ops-spec §16.2). Entries past
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
    """Uniform locations: ``out[b*U + k] = loc(cache_start[b] + k)`` for ``k < U`` (ops-spec §16.2)."""
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
    """Decode-uniform input prep (ops-spec §16.3, seed): one read of ``valid_cache_lengths[pool]`` feeds
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

    return lax.fori_loop(0, _cdiv(batch, lanes), body, jnp.int32(0))


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
    pool_ok = (pool >= 0) & (pool < num_rows)
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

    lax.fori_loop(0, _cdiv(num, BLOCK), body, 0)


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

        lax.fori_loop(0, _cdiv(length, BLOCK), body, 0)

    @pl.when(b == batch)
    def _tail():
        total = _prefix_sum(len_ref, batch, batch)

        def body(j, carry):
            t = total + j * BLOCK + iota
            m = t < out_size
            store(out_ref.at[jnp.where(m, t, out_size)], jnp.zeros((BLOCK,), jnp.int32), mask=m)
            return carry

        lax.fori_loop(0, _cdiv(jnp.maximum(out_size - total, 0), BLOCK), body, 0)


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
# Public wrappers: host-side validation (int64 narrowed through index_array, never truncated), then one
# jitted implementation keyed on the static config and on whether checked mode is on.
# ----------------------------------------------------------------------------------------------------


def _table(name, x):
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype != np.int32:
        raise ValueError(f"{name}: expected an int32 page table of shape (R, M) (TokenSpeed tables are int32), "
                         f"got dtype {dtype}")
    if np.ndim(x) != 2 or np.shape(x)[0] < 1 or np.shape(x)[1] < 1:
        raise ValueError(f"{name}: expected shape (R, M) with R, M >= 1, got {name}.shape={tuple(np.shape(x))}")
    return jnp.asarray(x)


def _check_pools(pool, num_rows: int, what: str = "req_pool_indices"):
    _validate.check(jnp.all((pool >= 0) & (pool < num_rows)), f"{what}: pool index out of range [0, {num_rows})")


@functools.partial(jax.jit, static_argnames=("implementation", "interpret", "checks"),
                   donate_argnames=("req_to_page",))
def _update_req_to_page_jit(req_to_page, rpi, pages, num, starts, *, implementation, interpret, checks):
    num_rows, max_pages = req_to_page.shape
    batch, total = rpi.shape[0], pages.shape[0]
    if checks:
        _check_pools(rpi, num_rows)
        _validate.check(jnp.all(num >= 0), "new_occupied_pages_num: negative page count")
        _validate.check(jnp.all(starts >= 0), "pages_copy_starts: negative start")
        _validate.check(jnp.all(starts + num <= max_pages),
                        f"update_req_to_page: pages past capacity (pages_copy_starts + new_occupied_pages_num "
                        f"> max_pages={max_pages})")
        _validate.check(jnp.sum(jnp.maximum(num, 0)) <= total,
                        f"new_occupied_pages: sum(new_occupied_pages_num) exceeds the packed buffer ({total})")
    if batch == 0 or total == 0:
        return req_to_page
    if implementation == "reference":
        return update_req_to_page_reference(req_to_page, rpi, pages, num, starts)
    return pl.pallas_call(
        functools.partial(_update_req_to_page_kernel, batch=batch, total=total),
        out_shape=jax.ShapeDtypeStruct(req_to_page.shape, jnp.int32),
        grid=(batch,),
        input_output_aliases={4: 0},
        compiler_params=_backend.compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"update_req_to_page_{batch=}",
    )(rpi, pages, num, starts, req_to_page)


def update_req_to_page(
    req_to_page,
    req_pool_indices,
    new_occupied_pages,
    new_occupied_pages_num,
    pages_copy_starts,
    *,
    implementation: str = "auto",
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
    to an out-of-range pool are dropped (upstream has no bounds check); checked mode reports them.
    """
    req_to_page = _table("req_to_page", req_to_page)
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    batch = rpi.shape[0]
    pages = _index("new_occupied_pages", new_occupied_pages, (None,))
    num = _index("new_occupied_pages_num", new_occupied_pages_num, (batch,))
    starts = _index("pages_copy_starts", pages_copy_starts, (batch,))
    impl = _backend.resolve_implementation(implementation, interpret)
    return _update_req_to_page_jit(req_to_page, rpi, pages, num, starts, implementation=impl,
                                   interpret=interpret, checks=_validate.checks_enabled())


@functools.partial(jax.jit, static_argnames=("page_size", "out_size", "implementation", "interpret", "checks"))
def _compute_out_cache_loc_jit(cache_start, lens, rpi, table, *, page_size, out_size, implementation, interpret,
                               checks):
    batch = rpi.shape[0]
    if checks:
        _check_pools(rpi, table.shape[0])
        _validate.check(jnp.all(lens >= 0), "input_lengths: negative length")
        _validate.check(jnp.all(cache_start >= 0), "cache_start: negative cache start")
        _validate.check(jnp.sum(jnp.maximum(lens, 0)) <= out_size,
                        f"input_lengths: sum(input_lengths) exceeds out_size={out_size}")
    if implementation == "reference" or batch == 0 or out_size == 0:
        return compute_out_cache_loc_reference(cache_start, lens, rpi, table, page_size=page_size,
                                               out_size=out_size)
    return pl.pallas_call(
        functools.partial(_compute_out_cache_loc_kernel, batch=batch, page_size=page_size),
        out_shape=jax.ShapeDtypeStruct((out_size,), jnp.int32),
        grid=(batch + 1,),
        compiler_params=_backend.compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"compute_out_cache_loc_{page_size=}",
    )(rpi, lens, cache_start, table)


def compute_out_cache_loc(
    cache_start,
    input_lengths,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    out_size: int,
    implementation: str = "auto",
    interpret: bool = False,
) -> Int32[Array, "T"]:
    """Ragged KV write locations (jitted): returns ``i32[out_size]``.

    Request ``r`` owns outputs ``[off_r, off_r + input_lengths[r])`` (``off`` = exclusive prefix sum);
    token ``k`` there is position ``cache_start[r] + k`` of pool row ``req_pool_indices[r]`` and lands at
    ``req_to_pages[row, pos // P] * P + pos % P`` -- or slot 0 when ``pos // P >= M`` (seed semantics).
    ``out_size`` is a static bucket ``>= sum(input_lengths)``; outputs past the sum are 0 (TokenSpeed
    callers zero-initialise the buffer), tokens past ``out_size`` are dropped.
    """
    table = _table("req_to_pages", req_to_pages)
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    batch = rpi.shape[0]
    cs = _index("cache_start", cache_start, (batch,))
    lens = _index("input_lengths", input_lengths, (batch,))
    page_size = _validate.static_int("page_size", page_size, 1)
    out_size = _validate.static_int("out_size", out_size, 0)
    impl = _backend.resolve_implementation(implementation, interpret)
    return _compute_out_cache_loc_jit(cs, lens, rpi, table, page_size=page_size, out_size=out_size,
                                      implementation=impl, interpret=interpret, checks=_validate.checks_enabled())


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
        grid=(_cdiv(total, lanes),),
        compiler_params=_backend.compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"{'fused_decode_input_prep' if fused else 'compute_out_cache_loc_uniform'}_{uniform=}_{page_size=}",
    )(rpi, starts, table)


@functools.partial(jax.jit, static_argnames=("page_size", "uniform_input_length", "implementation", "interpret",
                                             "checks"))
def _compute_out_cache_loc_uniform_jit(cache_start, rpi, table, *, page_size, uniform_input_length, implementation,
                                       interpret, checks):
    if checks:
        _check_pools(rpi, table.shape[0])
        _validate.check(jnp.all(cache_start >= 0), "cache_start: negative cache start")
    if implementation == "reference" or rpi.shape[0] * uniform_input_length == 0:
        return compute_out_cache_loc_uniform_reference(cache_start, rpi, table, page_size=page_size,
                                                       uniform_input_length=uniform_input_length)
    (locs,) = _uniform_call(rpi, cache_start, table, page_size=page_size, uniform=uniform_input_length,
                            interpret=interpret, fused=False)
    return locs


def compute_out_cache_loc_uniform(
    cache_start,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    uniform_input_length: int,
    implementation: str = "auto",
    interpret: bool = False,
) -> Int32[Array, "T"]:
    """Uniform KV write locations (jitted): ``out[b*U + k]`` for position ``cache_start[b] + k``, ``k < U``
    (``U = uniform_input_length``, static; the multi-step drafter uses ``U = S - 1``). Same page math and
    overflow-to-slot-0 rule as ``compute_out_cache_loc``. Returns ``i32[B * U]``."""
    table = _table("req_to_pages", req_to_pages)
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    cs = _index("cache_start", cache_start, (rpi.shape[0],))
    page_size = _validate.static_int("page_size", page_size, 1)
    u = _validate.static_int("uniform_input_length", uniform_input_length, 0)
    impl = _backend.resolve_implementation(implementation, interpret)
    return _compute_out_cache_loc_uniform_jit(cs, rpi, table, page_size=page_size, uniform_input_length=u,
                                              implementation=impl, interpret=interpret,
                                              checks=_validate.checks_enabled())


@functools.partial(jax.jit, static_argnames=("page_size", "uniform_input_length", "implementation", "interpret",
                                             "checks"))
def _fused_decode_input_prep_jit(vcl, rpi, table, *, page_size, uniform_input_length, implementation, interpret,
                                 checks):
    if checks:
        _check_pools(rpi, min(table.shape[0], vcl.shape[0]))
        _validate.check(jnp.all(vcl >= 0), "valid_cache_lengths: negative cache length")
    if implementation == "reference" or rpi.shape[0] == 0:
        return fused_decode_input_prep_reference(vcl, rpi, table, page_size=page_size,
                                                 uniform_input_length=uniform_input_length)
    locs, pos, seq = _uniform_call(rpi, vcl, table, page_size=page_size, uniform=uniform_input_length,
                                   interpret=interpret, fused=True)
    return DecodeInputs(seq, pos, locs)


def fused_decode_input_prep(
    valid_cache_lengths,
    req_pool_indices,
    req_to_pages,
    *,
    page_size: int,
    uniform_input_length: int,
    implementation: str = "auto",
    interpret: bool = False,
) -> DecodeInputs:
    """Decode-only input prep in one launch (jitted): ``c = valid_cache_lengths[req_pool_indices[b]]``;
    ``seq_lens[b] = c + U``; ``positions[b*U + k] = c + k``; ``out_cache_loc`` as
    ``compute_out_cache_loc_uniform`` with ``cache_start = c`` (TokenSpeed seed; 0.1.1 dropped the
    locations). ``valid_cache_lengths`` is pool-indexed ``[R]``; ``U >= 1`` is static."""
    table = _table("req_to_pages", req_to_pages)
    vcl = _index("valid_cache_lengths", valid_cache_lengths, (None,))
    rpi = _index("req_pool_indices", req_pool_indices, (None,))
    page_size = _validate.static_int("page_size", page_size, 1)
    u = _validate.static_int("uniform_input_length", uniform_input_length, 1)
    if vcl.shape[0] < 1:
        raise ValueError(f"valid_cache_lengths: expected shape (R,) with R >= 1, got {vcl.shape}")
    impl = _backend.resolve_implementation(implementation, interpret)
    return _fused_decode_input_prep_jit(vcl, rpi, table, page_size=page_size, uniform_input_length=u,
                                        implementation=impl, interpret=interpret, checks=_validate.checks_enabled())


# ----------------------------------------------------------------------------------------------------
# Host-side wrapper (NumPy in, like TokenSpeed's update_block_table fed by the C++ scheduler).
# ----------------------------------------------------------------------------------------------------


class PageCapacityWarning(UserWarning):
    """A request's page refresh would run past ``req_to_page``'s width and was clamped."""


class BlockTableUpdate(NamedTuple):
    """The packed, bucket-padded arguments ``update_block_table`` hands to ``update_req_to_page``."""

    req_pool_indices: np.ndarray  # i32[B'] (B' = batch bucket; padding rows have 0 pages)
    new_occupied_pages: np.ndarray  # i32[T'] packed, padded with 0
    new_occupied_pages_num: np.ndarray  # i32[B'] clamped sizes
    pages_copy_starts: np.ndarray  # i32[B']
    num_pages: int  # real packed entries (sum of clamped sizes)


def pack_block_table_update(
    max_pages: int,
    *,
    sizes: Sequence[int],
    begins: Sequence[int],
    new_occupied_pages: Sequence[Sequence[int]],
    request_pool_indices: Sequence[int],
    request_ids: Sequence[str] | None = None,
    bucket: bool = True,
) -> BlockTableUpdate | None:
    """Clamp and pack a scheduler refresh (host, NumPy). ``None`` when every size is 0 (nothing to do).

    A request with ``begin + size > max_pages`` gets ``size = max(0, max_pages - begin)`` and its page list
    is truncated to that size (keeps the packed offsets of later requests aligned), with a
    ``PageCapacityWarning``. With ``bucket=True`` the batch and packed buffer are padded to powers of two
    (>= 8 / >= 128) so repeated updates reuse one compiled program.
    """
    sizes = [int(s) for s in sizes]
    begins = [int(b) for b in begins]
    pools = [int(p) for p in request_pool_indices]
    if not (len(sizes) == len(begins) == len(new_occupied_pages) == len(pools)):
        raise ValueError(
            f"update_block_table: sizes, begins, new_occupied_pages and request_pool_indices must have one entry "
            f"per request, got lengths {len(sizes)}, {len(begins)}, {len(new_occupied_pages)}, {len(pools)}"
        )
    if all(s == 0 for s in sizes):
        return None
    rows = [list(r) for r in new_occupied_pages]
    for i, (begin, size) in enumerate(zip(begins, sizes)):
        if begin + size > max_pages:
            clamped = max(0, max_pages - begin)
            rid = request_ids[i] if request_ids is not None and i < len(request_ids) else "?"
            warnings.warn(
                f"page copy would exceed req_to_page capacity for req {rid}: begin={begin} + size={size} = "
                f"{begin + size} > req_to_page.shape[1]={max_pages}; clamping size to {clamped}. KV writes past "
                f"this point are dropped (slot 0).",
                PageCapacityWarning,
                stacklevel=3,
            )
            sizes[i] = clamped
            rows[i] = rows[i][:clamped]
    flat = [int(p) for row in rows for p in row]
    batch, total = len(sizes), len(flat)
    nb = max(MIN_BATCH_BUCKET, _next_pow2(batch)) if bucket else batch
    nt = max(MIN_PAGES_BUCKET, _next_pow2(total)) if bucket else max(total, 1)

    def pad(vals, n):
        out = np.zeros((n,), np.int32)
        out[: len(vals)] = vals
        return out

    return BlockTableUpdate(pad(pools, nb), pad(flat, nt), pad(sizes, nb), pad(begins, nb), total)


def update_block_table(
    req_to_page,
    *,
    sizes: Sequence[int],
    begins: Sequence[int],
    new_occupied_pages: Sequence[Sequence[int]],
    request_pool_indices: Sequence[int],
    request_ids: Sequence[str] | None = None,
    bucket: bool = True,
    implementation: str = "auto",
    interpret: bool = False,
):
    """TokenSpeed's ``update_block_table`` (host side): returns the new ``req_to_page``.

    Returns ``req_to_page`` unchanged (no launch) when every size is 0; otherwise clamps overflowing
    requests (``PageCapacityWarning``), packs with ``pack_block_table_update`` and calls
    ``update_req_to_page`` (which donates ``req_to_page``).
    """
    max_pages = int(np.shape(req_to_page)[1])
    packed = pack_block_table_update(
        max_pages, sizes=sizes, begins=begins, new_occupied_pages=new_occupied_pages,
        request_pool_indices=request_pool_indices, request_ids=request_ids, bucket=bucket,
    )
    if packed is None:
        return req_to_page
    return update_req_to_page(
        req_to_page, packed.req_pool_indices, packed.new_occupied_pages, packed.new_occupied_pages_num,
        packed.pages_copy_starts, implementation=implementation, interpret=interpret,
    )


__all__ = [
    "DecodeInputs",
    "BlockTableUpdate",
    "PageCapacityWarning",
    "compute_out_cache_loc",
    "compute_out_cache_loc_reference",
    "compute_out_cache_loc_uniform",
    "compute_out_cache_loc_uniform_reference",
    "fused_decode_input_prep",
    "fused_decode_input_prep_reference",
    "pack_block_table_update",
    "update_block_table",
    "update_req_to_page",
    "update_req_to_page_reference",
]
