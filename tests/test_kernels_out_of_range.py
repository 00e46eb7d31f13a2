"""One defined behaviour for out-of-range slots, pages, rows, accept indices and lengths, the
same in every implementation.

Every case runs the jnp reference and the Pallas kernel (interpret mode) and checks them against a NumPy
expectation: a dropped write or a slot-0 read, never a write elsewhere or another request's data; pools
are poisoned so that any stray write shows.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.kernels import block_table as bt
from jaxspec.kernels import cache_locs as C
from jaxspec.kernels import kv_move as M
from jaxspec.kernels import multi_layer_eagle as mle
from jaxspec.kernels import paged_cache_locs as pcl

I32 = np.int32
IMPLS = [dict(implementation="reference"), dict(implementation="pallas", interpret=True)]
IDS = ["reference", "pallas"]


def _pool(layers=2, slots=8, feat=4):
    """Poisoned pool: every (layer, slot, feature) value distinct."""
    return np.arange(layers * slots * feat, dtype=np.float32).reshape(layers, slots, feat) + 1000.0


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_move_kv_cache_out_of_range_pairs_are_dropped(impl):
    k = _pool()
    tgt = np.array([-1, 8, 3, 2, 5], I32)
    src = np.array([4, 4, -1, 9, 6], I32)
    kk, vv = M.move_kv_cache(jnp.asarray(k), jnp.asarray(k + 1), tgt, src, **impl)
    want = k.copy()
    want[:, 5] = k[:, 6]  # the only in-range pair
    np.testing.assert_array_equal(np.asarray(kk), want)
    np.testing.assert_array_equal(np.asarray(vv), want + 1)


def _accept_expect(pool, ai, lens, ocl, n):
    bs, a = ai.shape
    out = pool.copy()
    for b in range(bs):
        for j in range(a):
            node = ai[b, j]
            if j >= lens[b] or j >= n or not b * n <= node < (b + 1) * n or (j and node <= ai[b, j - 1]):
                break  # the row ends where it leaves its own nodes or stops increasing
            out[:, ocl[b * n + j]] = pool[:, ocl[node]]
    return out


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_move_accept_out_of_range_never_writes_another_request(impl):
    bs, a, n = 3, 3, 4
    pool = _pool(slots=bs * n + 4)
    ocl = np.arange(bs * n, dtype=I32) + 2
    ai = np.array([[0, 2, 3], [4, -1, 6], [8, 99, 10]], I32)  # row 1: negative mid-row; row 2: node >= B*N
    lens = np.array([5, 3, 3], I32)  # row 0: accept_lens > A
    kk, _ = M.move_accept_tokens_to_target_kvcache(jnp.asarray(pool), jnp.asarray(pool), ai, lens, ocl, **impl)
    np.testing.assert_array_equal(np.asarray(kk), _accept_expect(pool, ai, lens, ocl, n))
    # another request's nodes (a swap across requests: 1 <-> 5), and a row that goes back (10 after 11)
    ai = np.array([[0, 5, 2], [4, 1, -1], [8, 11, 10]], I32)
    lens = np.array([3, 2, 3], I32)
    kk, _ = M.move_accept_tokens_to_target_kvcache(jnp.asarray(pool), jnp.asarray(pool), ai, lens, ocl, **impl)
    np.testing.assert_array_equal(np.asarray(kk), _accept_expect(pool, ai, lens, ocl, n))


R2T = np.arange(3 * 6, dtype=I32).reshape(3, 6) + 100


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_cache_loc_reads_past_the_row_give_slot_zero(impl):
    out = C.assign_extend_cache_locs_uniform(np.array([1, 3, -1], I32), R2T, np.array([4, 0, 0], I32), width=3,
                                             **impl).out_cache_loc
    np.testing.assert_array_equal(np.asarray(out), [110, 111, 0] + [0] * 6)
    out = C.assign_extend_cache_locs(np.array([2, 5], I32), R2T, np.array([5, 0], I32), np.array([8, 2], I32),
                                     out_size=6, **impl)
    np.testing.assert_array_equal(np.asarray(out), [117, 0, 0, 0, 0, 0])
    out = C.fill_front_out_cache_loc(np.array([3, 1], I32), np.array([7, 8, 9, 10], I32), width=3, **impl)
    np.testing.assert_array_equal(np.asarray(out), [7, 8, 0, 9, 0, 0])
    locs = C.assign_draft_cache_locs(np.array([0], I32), R2T, np.array([5], I32), topk=1, num_steps=2, **impl)
    np.testing.assert_array_equal(np.asarray(locs.out_cache_loc), [105, 0])
    out = C.fill_accept_out_cache_loc(np.array([[0, 7]], I32), np.array([5, 6, 7], I32), **impl)
    np.testing.assert_array_equal(np.asarray(out), [5, 0])


TABLE = np.array([[1, 2, 3], [4, -5, 6]], I32)


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_paged_locations_negative_start_or_page_give_slot_zero(impl):
    out = pcl.compute_out_cache_loc_uniform(np.array([-1, 3], I32), np.array([0, 1], I32), TABLE, page_size=4,
                                            uniform_input_length=2, **impl)
    np.testing.assert_array_equal(np.asarray(out), [0, 4, 19, 0])  # pos -1 -> 0; page id -5 -> 0
    out = pcl.compute_out_cache_loc(np.array([-2], I32), np.array([3], I32), np.array([0], I32), TABLE,
                                    page_size=4, out_size=4, **impl)
    np.testing.assert_array_equal(np.asarray(out), [0, 0, 4, 0])


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_update_req_to_page_negative_start_drops_the_request(impl):  # traced / device inputs
    table = np.full((3, 4), 7, I32)
    out = pcl.update_req_to_page(jnp.asarray(table), np.array([0, 1, 5], I32), np.array([11, 12, 13, 14, 15], I32),
                                 np.array([2, 2, 1], I32), np.array([-1, 3, 0], I32), **impl)
    want = table.copy()
    want[1, 3] = 13  # request 1's second page is past the width: dropped; request 0 (start -1) and 2 (pool 5) dropped
    np.testing.assert_array_equal(np.asarray(out), want)


def test_update_block_table_refuses_inconsistent_host_inputs():  # host inputs
    table = jnp.zeros((2, 8), jnp.int32)
    with pytest.raises(ValueError, match=r"sizes\[0\] = 4 exceeds the 1 page"):
        bt.update_block_table(table, sizes=[4, 1], begins=[0, 0], new_occupied_pages=[[11], [5]],
                              request_pool_indices=[0, 1])
    with pytest.raises(ValueError, match=r"begins\[0\] = -1"):
        bt.update_block_table(table, sizes=[1], begins=[-1], new_occupied_pages=[[11]], request_pool_indices=[0])
    with pytest.raises(ValueError, match=r"request_pool_indices\[0\] = 2 is out of range \[0, 2\)"):
        bt.update_block_table(table, sizes=[1], begins=[0], new_occupied_pages=[[11]], request_pool_indices=[2])
    with pytest.raises(ValueError, match=r"page id -3"):
        bt.update_block_table(table, sizes=[1], begins=[0], new_occupied_pages=[[-3]], request_pool_indices=[0])
    # extra pages past size are ignored (they used to shift the next request's pages)
    out = bt.update_block_table(table, sizes=[1, 2], begins=[0, 0], new_occupied_pages=[[11, 99], [12, 13]],
                                request_pool_indices=[0, 1], implementation="reference")
    np.testing.assert_array_equal(np.asarray(out)[:, :2], [[11, 0], [12, 13]])


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_in_place_mtp_kernels_out_of_range_untouched(impl):
    pool = _pool(layers=3, slots=2, feat=4)  # (R=3, W=2, H=4)
    hidden = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    out = mle.assign_hidden_states_pool(jnp.asarray(hidden), np.array([5, 1], I32), jnp.asarray(pool),
                                        np.array([3, 2], I32), np.array([0, 3], I32), **impl)
    want = pool.copy()
    want[1] = hidden[3:5]
    np.testing.assert_array_equal(np.asarray(out), want)
    ids = np.arange(8, dtype=I32)
    out = mle.rotate_input_ids(jnp.asarray(ids), np.array([0, 4], I32), np.array([3, 3], I32),
                               np.array([50, 60], I32), np.array([9, -1], I32), **impl)
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 2, 3, 5, 6, 6, 7])


def test_traced_wide_or_unsigned_ids_are_refused():
    r2t = jnp.asarray(R2T)
    f = jax.jit(lambda rpi: C.assign_extend_cache_locs_uniform(rpi, r2t, jnp.zeros(1, jnp.int32), width=2,
                                                               implementation="reference").out_cache_loc)
    with pytest.raises(ValueError, match="req_pool_indices: a traced uint32 array"):
        f(jnp.array([3_000_000_000], jnp.uint32))
    np.testing.assert_array_equal(np.asarray(f(jnp.array([1], jnp.uint16))), [106, 107])


def test_negative_page_id_is_flagged_in_checked_mode():  # checked mode
    from jax.experimental import checkify

    from jaxspec.testing import checked_call

    err, out = checked_call(pcl.compute_out_cache_loc_uniform, jnp.array([3], jnp.int32), jnp.array([1], jnp.int32),
                            jnp.asarray(TABLE), page_size=4, uniform_input_length=2)
    with pytest.raises(checkify.JaxRuntimeError, match="negative page id"):
        err.throw()
    np.testing.assert_array_equal(np.asarray(out), [19, 0])
