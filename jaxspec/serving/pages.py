"""The device page tables of the serving core and their jitted refresh (the host free list, ``PagePool``, is the
scheduler's: ``serving.scheduler``).

The pool is the engine's (``Engine.num_pages`` pages of ``page_size`` slots; page 0 is the dummy page and is
never handed out). The serving core keeps one pool-indexed page table ``req_to_page i32[B, M]`` on the device
(``M = ceil(W / G)``, one row per batch slot, page 0 where nothing is assigned) and derives from it the
token table ``req_to_token i32[B, W]`` that every ``PagedKVCache`` of the decode state (target and drafter)
reads. Both steps run TokenSpeed's ported kernels:

* ``refresh_tables`` (jitted by ``refresh_fn``) writes newly assigned pages into ``req_to_page`` with
  ``update_req_to_page`` (TokenSpeed ``update_block_table`` / ``update_req_to_page``; the packing is
  ``kernels.block_table.pack_block_table_update`` without its power-of-two buckets, padded here to one fixed
  shape so the refresh compiles once), then maps
  every position ``0..W-1`` of every row to its slot with ``compute_out_cache_loc_uniform`` (TokenSpeed
  ``compute_out_cache_loc`` for a uniform length ``W`` from position 0): unassigned pages give slots on the
  dummy page.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.engine import functionalize_checks, release_slots, with_tables
from jaxspec.kernels import Implementation, compute_out_cache_loc_uniform, pack_block_table_update, update_req_to_page


def pack_rows(rows: dict[int, tuple[int, list[int]]], *, num_slots: int, max_pages: int):
    """Host packing of one table refresh: ``rows[slot] = (first column, page ids)`` (a whole-row reset writes
    ``max_pages`` ids from column 0, zeros past the row's pages). Returns the four ``update_req_to_page``
    operands padded to the fixed shapes ``(num_slots,)`` and ``(num_slots * max_pages,)`` (padding entries
    write nothing), or ``None`` when nothing changes."""
    slots = sorted(rows)
    packed = pack_block_table_update(
        max_pages, sizes=[len(rows[s][1]) for s in slots], begins=[rows[s][0] for s in slots],
        new_occupied_pages=[rows[s][1] for s in slots], request_pool_indices=slots, bucket=False,
        num_rows=num_slots)
    if packed is None:
        return None

    def pad(x, n):
        out = np.zeros((n,), np.int32)
        out[: x.size] = x[:n]
        return out

    total = num_slots * max_pages
    return (pad(packed.req_pool_indices, num_slots), pad(packed.new_occupied_pages[: packed.num_pages], total),
            pad(packed.new_occupied_pages_num, num_slots), pad(packed.pages_copy_starts, num_slots))


def refresh_tables(state, req_to_page, rpi, pages, num, starts, stop, *, page_size: int, max_context: int,
                   implementation: Implementation, interpret: bool):
    """Apply a packed refresh (``pack_rows``) to ``req_to_page`` (``update_req_to_page``), rebuild the token
    table of every cache in ``state`` from it (``compute_out_cache_loc_uniform`` over positions ``0..W-1``), and
    mark the rows of ``stop bool[B]`` done (aborted requests). Pure and jittable (``refresh_fn``); returns
    ``(state, req_to_page)``."""
    kw = dict(implementation=implementation, interpret=interpret)
    r2p = update_req_to_page(req_to_page, rpi, pages, num, starts, **kw)
    b = r2p.shape[0]
    r2t = compute_out_cache_loc_uniform(jnp.zeros((b,), jnp.int32), jnp.arange(b, dtype=jnp.int32), r2p,
                                        page_size=page_size, uniform_input_length=max_context, **kw)
    state = with_tables(state, r2t.reshape(b, max_context))
    return release_slots(state, stop), r2p


@functools.lru_cache(maxsize=64)
def refresh_fn(page_size: int, max_context: int, implementation: Implementation, interpret: bool, checks: bool):
    """``refresh_tables`` jitted for one static key (``state`` and ``req_to_page`` donated); with ``checks`` the
    kernels' in-jit checks are functionalised (``jaxspec.engine.functionalize_checks``: returns ``(error, out)``)."""
    fn = functools.partial(refresh_tables, page_size=page_size, max_context=max_context,
                           implementation=implementation, interpret=interpret)
    return jax.jit(functionalize_checks(fn, checks), donate_argnums=(0, 1))
