"""TokenSpeed's host-side ``update_block_table`` (NumPy in, fed by the scheduler): validate, clamp and pack
a page-table refresh, then apply it with the device op ``paged_cache_locs.update_req_to_page``.

Host inputs are concrete, so every out-of-range value is refused here with a ``ValueError`` naming the
argument (a request with more pages claimed than given, a negative begin or size, a pool row outside the
table, a negative page id); only a refresh past the table width is clamped, with a ``PageCapacityWarning``
(TokenSpeed's behaviour).
"""

import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import next_pow2
from jaxspec.kernels.paged_cache_locs import update_req_to_page

# Smallest power-of-two buckets ``update_block_table`` pads the batch / packed page buffer to, so the
# jitted update recompiles only when a bucket grows.
MIN_BATCH_BUCKET = 8
MIN_PAGES_BUCKET = 128
_INT32_MAX = int(np.iinfo(np.int32).max)


class PageCapacityWarning(UserWarning):
    """A request's page refresh would run past ``req_to_page``'s width and was clamped."""


class BlockTableUpdate(NamedTuple):
    """The packed, bucket-padded arguments ``update_block_table`` hands to ``update_req_to_page``."""

    req_pool_indices: np.ndarray  # i32[B'] (B' = batch bucket; padding rows have 0 pages)
    new_occupied_pages: np.ndarray  # i32[T'] packed, padded with 0
    new_occupied_pages_num: np.ndarray  # i32[B'] clamped sizes
    pages_copy_starts: np.ndarray  # i32[B']
    num_pages: int  # real packed entries (sum of clamped sizes)


def _check_request(i, begin, size, row, pool, num_rows):
    if size < 0:
        raise ValueError(f"sizes[{i}] = {size}: expected a page count >= 0")
    if begin < 0:
        raise ValueError(f"begins[{i}] = {begin}: expected a first table column >= 0")
    if size > len(row):
        raise ValueError(
            f"sizes[{i}] = {size} exceeds the {len(row)} page(s) given in new_occupied_pages[{i}] (the packed "
            f"offsets of later requests would shift)"
        )
    if size and num_rows is not None and not 0 <= pool < num_rows:
        raise ValueError(f"request_pool_indices[{i}] = {pool} is out of range [0, {num_rows})")
    bad = [p for p in row[:size] if not 0 <= p <= _INT32_MAX]
    if bad:
        raise ValueError(f"new_occupied_pages[{i}]: page id {bad[0]} is out of range [0, {_INT32_MAX}]")


def pack_block_table_update(
    max_pages: int,
    *,
    sizes: Sequence[int],
    begins: Sequence[int],
    new_occupied_pages: Sequence[Sequence[int]],
    request_pool_indices: Sequence[int],
    request_ids: Sequence[str] | None = None,
    bucket: bool = True,
    num_rows: int | None = None,
) -> BlockTableUpdate | None:
    """Validate, clamp and pack a scheduler refresh (host, NumPy). ``None`` when every size is 0.

    Request ``i`` writes its first ``sizes[i]`` pages of ``new_occupied_pages[i]`` at columns
    ``begins[i]...``; ``ValueError`` when ``sizes[i]`` is negative or larger than the pages given, ``begins[i]``
    is negative, a pool row is outside ``[0, num_rows)`` (when given) or a page id is negative. A request with
    ``begin + size > max_pages`` gets ``size = max(0, max_pages - begin)`` and its page list is truncated to
    that size (keeps the packed offsets of later requests aligned), with a ``PageCapacityWarning``. With
    ``bucket=True`` the batch and packed buffer are padded to powers of two (>= 8 / >= 128) so repeated
    updates reuse one compiled program.
    """
    sizes = [int(s) for s in sizes]
    begins = [int(b) for b in begins]
    pools = [int(p) for p in request_pool_indices]
    if not (len(sizes) == len(begins) == len(new_occupied_pages) == len(pools)):
        raise ValueError(
            f"update_block_table: sizes, begins, new_occupied_pages and request_pool_indices must have one entry "
            f"per request, got lengths {len(sizes)}, {len(begins)}, {len(new_occupied_pages)}, {len(pools)}"
        )
    rows = [[int(p) for p in r] for r in new_occupied_pages]
    for i, (begin, size, row, pool) in enumerate(zip(begins, sizes, rows, pools)):
        _check_request(i, begin, size, row, pool, num_rows)
    if all(s == 0 for s in sizes):
        return None
    for i, (begin, size) in enumerate(zip(begins, sizes)):
        rows[i] = rows[i][:size]
        if begin + size > max_pages:
            clamped = max(0, max_pages - begin)
            rid = (f"req {request_ids[i]}" if request_ids is not None and i < len(request_ids)
                   else f"request {i} (request_pool_indices[{i}] = {pools[i]})")
            warnings.warn(
                f"page copy would exceed req_to_page capacity for {rid}: begin={begin} + size={size} = "
                f"{begin + size} > req_to_page.shape[1]={max_pages}; clamping size to {clamped}. KV writes past "
                f"this point are dropped (slot 0).",
                PageCapacityWarning,
                stacklevel=3,
            )
            sizes[i] = clamped
            rows[i] = rows[i][:clamped]
    flat = [p for row in rows for p in row]
    batch, total = len(sizes), len(flat)
    nb = max(MIN_BATCH_BUCKET, next_pow2(batch)) if bucket else batch
    nt = max(MIN_PAGES_BUCKET, next_pow2(total)) if bucket else max(total, 1)

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
    implementation: Implementation = "auto",
    interpret: bool = False,
):
    """TokenSpeed's ``update_block_table`` (host side): returns the new ``req_to_page``.

    Returns ``req_to_page`` unchanged (no launch) when every size is 0; otherwise validates and packs with
    ``pack_block_table_update`` (``ValueError`` on out-of-range values, ``PageCapacityWarning`` on clamped
    requests) and calls ``update_req_to_page`` (which donates ``req_to_page``).
    """
    num_rows, max_pages = (int(d) for d in np.shape(req_to_page))
    packed = pack_block_table_update(
        max_pages, sizes=sizes, begins=begins, new_occupied_pages=new_occupied_pages,
        request_pool_indices=request_pool_indices, request_ids=request_ids, bucket=bucket, num_rows=num_rows,
    )
    if packed is None:
        return req_to_page
    return update_req_to_page(
        req_to_page, packed.req_pool_indices, packed.new_occupied_pages, packed.new_occupied_pages_num,
        packed.pages_copy_starts, implementation=implementation, interpret=interpret,
    )


__all__ = ["BlockTableUpdate", "PageCapacityWarning", "pack_block_table_update", "update_block_table"]
