"""Tests for jaxspec.kernels.paged_cache_locs (TokenSpeed 0.1.0 cache_loc_kernel.py; docs/ops.md, "paged_cache_locs").

Each op: Pallas kernel (interpret on CPU) == jnp reference == NumPy loop oracle, exactly, on random
inputs (fresh seeds) with random-permutation page tables whose unreferenced rows are poisoned with
INT_MIN. The golden example is docs/ops.md's (compute_out_cache_loc); the update_block_table cases port TokenSpeed 0.1.0's
``test/runtime/test_update_block_table_capacity_clamp.py`` (clamp to [2, 0, 3], 5 packed pages,
passthrough, partial clamp, early return, loud warning).
"""

import numpy as np
import pytest
from jax.experimental import checkify

from jaxspec.kernels import block_table as bt
from jaxspec.kernels import paged_cache_locs as pcl
from jaxspec.testing import checked_call

INT_MIN = np.iinfo(np.int32).min


# ------------------------------------------------------------------------------------------------
# NumPy oracles: per-request loops written from the Triton kernels' semantics.
# ------------------------------------------------------------------------------------------------


def oracle_loc(table, pool, pos, page_size):
    page, off = pos // page_size, pos % page_size  # pos >= 0 in every oracle case
    max_pages = table.shape[1]
    if page >= max_pages:
        return 0
    return int(table[pool, page]) * page_size + off


def oracle_out_cache_loc(cache_start, lens, pools, table, page_size, out_size):
    out = np.zeros(out_size, np.int64)
    off = 0
    for r in range(len(lens)):
        for k in range(lens[r]):
            out[off + k] = oracle_loc(table, pools[r], cache_start[r] + k, page_size)
        off += lens[r]
    return out


def oracle_fused(vcl, pools, table, page_size, u):
    seq, pos, loc = [], [], []
    for p in pools:
        c = int(vcl[p])
        seq.append(c + u)
        for k in range(u):
            pos.append(c + k)
            loc.append(oracle_loc(table, p, c + k, page_size))
    return np.array(seq), np.array(pos, np.int64).reshape(-1), np.array(loc, np.int64).reshape(-1)


def oracle_update_req_to_page(table, pools, pages, num, starts):
    out = table.copy()
    off = 0
    for i in range(len(pools)):
        for k in range(num[i]):
            if starts[i] + k < out.shape[1]:  # ours drops writes past the row (upstream: caller clamps)
                out[pools[i], starts[i] + k] = pages[off + k]
        off += num[i]
    return out


# ------------------------------------------------------------------------------------------------
# Random inputs.
# ------------------------------------------------------------------------------------------------


def random_table(rng, num_rows, max_pages, used_rows):
    """Random-permutation page ids (>= 1; page 0 is the reserved dummy) in used rows, INT_MIN elsewhere."""
    table = np.full((num_rows, max_pages), INT_MIN, np.int32)
    ids = rng.permutation(np.arange(1, num_rows * max_pages + 1, dtype=np.int32)).reshape(num_rows, max_pages)
    table[used_rows] = ids[used_rows]
    return table


def random_starts(rng, batch, max_pages, page_size, span):
    """Cache starts spread over the table, some close enough to its end that tokens overflow."""
    cap = max_pages * page_size
    starts = rng.integers(0, cap, size=batch)
    near_end = rng.random(batch) < 0.3
    starts[near_end] = np.maximum(cap - rng.integers(0, span + 1, size=near_end.sum()), 0)
    return starts.astype(np.int32)


class _PagedCacheLocsCases:
    """Shared cases. (pytest inherits class marks through the MRO, so the GPU and interpret classes both
    derive from this unmarked base instead of from each other.)"""

    INTERPRET = False

    def call(self, fn, *args, implementation="pallas", **kwargs):
        return fn(*args, implementation=implementation, interpret=self.INTERPRET, **kwargs)

    # --- golden example (docs/ops.md, compute_out_cache_loc) ------------------------------------------------------------

    def test_spec_example(self):
        table = np.zeros((3, 4), np.int32)
        table[1] = [0, 5, 9, 2]
        cs, pools = np.array([6], np.int32), np.array([1], np.int32)
        for impl in ("pallas", "reference"):
            uni = self.call(pcl.compute_out_cache_loc_uniform, cs, pools, table, page_size=4,
                            uniform_input_length=4, implementation=impl)
            np.testing.assert_array_equal(uni, [22, 23, 36, 37])
            rag = self.call(pcl.compute_out_cache_loc, cs, np.array([4], np.int32), pools, table, page_size=4,
                            out_size=6, implementation=impl)
            np.testing.assert_array_equal(rag, [22, 23, 36, 37, 0, 0])
            fused = self.call(pcl.fused_decode_input_prep, np.array([0, 6, 0], np.int32), pools, table,
                              page_size=4, uniform_input_length=4, implementation=impl)
            np.testing.assert_array_equal(fused.seq_lens, [10])
            np.testing.assert_array_equal(fused.positions, [6, 7, 8, 9])
            np.testing.assert_array_equal(fused.out_cache_loc, [22, 23, 36, 37])

    def test_overflow_routes_to_slot_0(self):
        table = np.arange(1, 9, dtype=np.int32).reshape(2, 4)  # M = 4 pages of P = 2 -> capacity 8
        out = self.call(pcl.compute_out_cache_loc_uniform, np.array([6, 7], np.int32), np.array([1, 0], np.int32),
                        table, page_size=2, uniform_input_length=3)
        # pool 1: positions 6,7 -> page 3 (id 8): 16, 17; position 8 -> page 4 >= M -> 0.
        # pool 0: position 7 -> page 3 (id 4): 9; positions 8, 9 overflow -> 0.
        np.testing.assert_array_equal(out, [16, 17, 0, 9, 0, 0])

    # --- random parity ------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "batch,uniform,page_size,max_pages",
        [(1, 1, 1, 8), (16, 3, 16, 5), (7, 129, 1, 200), (64, 4, 16, 3)],
    )
    def test_uniform_and_fused_random(self, batch, uniform, page_size, max_pages):
        num_rows = batch + 5
        for _ in range(3):
            rng = np.random.default_rng()
            pools = rng.permutation(num_rows)[:batch].astype(np.int32)
            table = random_table(rng, num_rows, max_pages, pools)
            cs = random_starts(rng, batch, max_pages, page_size, uniform + page_size)
            want = oracle_out_cache_loc(cs, [uniform] * batch, pools, table, page_size, batch * uniform)
            for impl in ("pallas", "reference"):
                got = self.call(pcl.compute_out_cache_loc_uniform, cs, pools, table, page_size=page_size,
                                uniform_input_length=uniform, implementation=impl)
                np.testing.assert_array_equal(got, want, err_msg=impl)
            vcl = rng.integers(INT_MIN, 0, size=num_rows).astype(np.int32)  # poison: rows nobody reads
            vcl[pools] = cs
            want_seq, want_pos, want_loc = oracle_fused(vcl, pools, table, page_size, uniform)
            for impl in ("pallas", "reference"):
                got = self.call(pcl.fused_decode_input_prep, vcl, pools, table, page_size=page_size,
                                uniform_input_length=uniform, implementation=impl)
                np.testing.assert_array_equal(got.seq_lens, want_seq, err_msg=impl)
                np.testing.assert_array_equal(got.positions, want_pos, err_msg=impl)
                np.testing.assert_array_equal(got.out_cache_loc, want_loc, err_msg=impl)

    @pytest.mark.parametrize("batch,page_size,max_pages", [(1, 16, 30), (9, 1, 400), (33, 16, 24)])
    def test_ragged_random(self, batch, page_size, max_pages):
        num_rows = batch + 3
        out_size = 1024
        for _ in range(3):
            rng = np.random.default_rng()
            pools = rng.permutation(num_rows)[:batch].astype(np.int32)
            table = random_table(rng, num_rows, max_pages, pools)
            lens = rng.choice([0, 1, 3, 7, 129, 300], size=batch).astype(np.int32)
            while lens.sum() > out_size - 5:  # keep a zero tail
                lens[np.argmax(lens)] //= 2
            cs = random_starts(rng, batch, max_pages, page_size, 300)
            want = oracle_out_cache_loc(cs, lens, pools, table, page_size, out_size)
            for impl in ("pallas", "reference"):
                got = self.call(pcl.compute_out_cache_loc, cs, lens, pools, table, page_size=page_size,
                                out_size=out_size, implementation=impl)
                np.testing.assert_array_equal(got, want, err_msg=impl)

    def test_ragged_zero_lengths_and_truncation(self):
        table = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
        pools, cs = np.array([2, 0], np.int32), np.array([1, 0], np.int32)
        for impl in ("pallas", "reference"):
            zeros = self.call(pcl.compute_out_cache_loc, cs, np.array([0, 0], np.int32), pools, table, page_size=1,
                              out_size=5, implementation=impl)
            np.testing.assert_array_equal(zeros, np.zeros(5))
            # sum(lengths) = 6 > out_size = 4: tokens past out_size are dropped.
            trunc = self.call(pcl.compute_out_cache_loc, cs, np.array([3, 3], np.int32), pools, table, page_size=1,
                              out_size=4, implementation=impl)
            np.testing.assert_array_equal(trunc, [10, 11, 12, 1])
            empty = self.call(pcl.compute_out_cache_loc_uniform, cs, pools, table, page_size=1,
                              uniform_input_length=0, implementation=impl)
            assert empty.shape == (0,)

    @pytest.mark.parametrize("batch,total,max_pages", [(1, 128, 8), (16, 512, 300), (5, 7, 40)])
    def test_update_req_to_page_random(self, batch, total, max_pages):
        num_rows = batch + 4
        for _ in range(3):
            rng = np.random.default_rng()
            pools = rng.permutation(num_rows)[:batch].astype(np.int32)
            num = rng.choice([0, 1, 2, 5, 129, 300], size=batch)
            num = np.minimum(num, max_pages)
            while num.sum() > total:
                num[np.argmax(num)] //= 2
            starts = np.array([rng.integers(0, max_pages - n + 1) for n in num], np.int32)
            num = num.astype(np.int32)
            pages = np.full(total, INT_MIN, np.int32)  # padding past sum(num) is poison and must be ignored
            pages[: num.sum()] = rng.permutation(10 * total)[: num.sum()] + 1
            table = np.full((num_rows, max_pages), INT_MIN, np.int32)
            table[rng.random(table.shape) < 0.5] = 7
            want = oracle_update_req_to_page(table, pools, pages, num, starts)
            for impl in ("pallas", "reference"):
                got = np.asarray(self.call(pcl.update_req_to_page, table.copy(), pools, pages, num, starts,
                                           implementation=impl))
                np.testing.assert_array_equal(got, want, err_msg=impl)
                untouched = np.setdiff1d(np.arange(num_rows), pools[num > 0])
                np.testing.assert_array_equal(got[untouched], table[untouched])  # bit-identical rows

    def test_update_req_to_page_drops_writes_past_capacity(self):
        table = np.full((3, 4), INT_MIN, np.int32)
        pools = np.array([1, 2], np.int32)
        pages = np.array([10, 11, 12, 20, 21, 0, 0, 0], np.int32)
        num, starts = np.array([3, 2], np.int32), np.array([2, 0], np.int32)
        want = table.copy()
        want[1, 2:4] = [10, 11]  # page 12 would land in column 4: dropped, not wrapped into row 2
        want[2, 0:2] = [20, 21]
        for impl in ("pallas", "reference"):
            got = self.call(pcl.update_req_to_page, table.copy(), pools, pages, num, starts, implementation=impl)
            np.testing.assert_array_equal(got, want, err_msg=impl)

    def test_update_block_table_end_to_end(self):
        table = np.zeros((6, 10), np.int32)
        with pytest.warns(bt.PageCapacityWarning, match="req b"):
            got = self.call(bt.update_block_table, table.copy(), sizes=[2, 4, 1], begins=[0, 8, 3],
                            new_occupied_pages=[[5, 6], [7, 8, 9, 10], [11]], request_pool_indices=[4, 1, 2],
                            request_ids=["a", "b", "c"])
        want = table.copy()
        want[4, 0:2] = [5, 6]
        want[1, 8:10] = [7, 8]
        want[2, 3] = 11
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
class TestPagedCacheLocs(_PagedCacheLocsCases):
    INTERPRET = False


class TestPagedCacheLocsInterpret(_PagedCacheLocsCases):
    INTERPRET = True


# ------------------------------------------------------------------------------------------------
# Host wrapper (ported from TokenSpeed 0.1.0's test_update_block_table_capacity_clamp.py).
# ------------------------------------------------------------------------------------------------


def _pack(begins, sizes, pages=None, **kw):
    pages = [list(range(s)) for s in sizes] if pages is None else pages
    return bt.pack_block_table_update(513, sizes=sizes, begins=begins, new_occupied_pages=pages,
                                       request_pool_indices=list(range(len(sizes))), **kw)


def test_clamp_overflowing_request_keeps_others():
    with pytest.warns(bt.PageCapacityWarning, match="page copy would exceed req_to_page capacity"):
        packed = _pack([400, 513, 100], [2, 1, 3], bucket=False)
    np.testing.assert_array_equal(packed.new_occupied_pages_num, [2, 0, 3])
    np.testing.assert_array_equal(packed.pages_copy_starts, [400, 513, 100])
    assert packed.num_pages == 5 and len(packed.new_occupied_pages) == 5


def test_passthrough_when_no_overflow():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed = _pack([100, 200, 0], [1, 2, 1], bucket=False)
    np.testing.assert_array_equal(packed.new_occupied_pages_num, [1, 2, 1])


def test_partial_overflow_clamps_to_remaining_capacity():
    with pytest.warns(bt.PageCapacityWarning, match="clamping size to 1"):
        packed = _pack([512], [4], [[700, 701, 702, 703]], bucket=False)
    np.testing.assert_array_equal(packed.new_occupied_pages_num, [1])
    np.testing.assert_array_equal(packed.new_occupied_pages, [700])


def test_warning_names_request():
    with pytest.warns(bt.PageCapacityWarning, match="my-bad-req"):
        _pack([513], [1], request_ids=["my-bad-req"])


def test_zero_sizes_return_early():
    assert _pack([100, 200], [0, 0]) is None
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = bt.update_block_table(table, sizes=[0, 0], begins=[1, 2], new_occupied_pages=[[], []],
                                 request_pool_indices=[0, 1], implementation="reference")
    assert out is table


def test_bucketing_pads_with_no_op_rows():
    packed = _pack([0, 5], [2, 3])
    assert packed.req_pool_indices.shape == (8,) and packed.new_occupied_pages.shape == (128,)
    np.testing.assert_array_equal(packed.new_occupied_pages_num, [2, 3, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(packed.new_occupied_pages[:6], [0, 1, 0, 1, 2, 0])


def test_pack_rejects_ragged_arguments():
    with pytest.raises(ValueError, match="one entry per request"):
        bt.pack_block_table_update(8, sizes=[1], begins=[0, 1], new_occupied_pages=[[1]], request_pool_indices=[0])


# ------------------------------------------------------------------------------------------------
# Validation: trace-time ValueErrors and checked mode.
# ------------------------------------------------------------------------------------------------


TABLE = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
I32 = np.int32


def test_trace_time_errors():
    with pytest.raises(ValueError, match="req_to_pages: expected an int32 page table"):
        pcl.compute_out_cache_loc_uniform(np.zeros(2, I32), np.zeros(2, I32), TABLE.astype(np.int64), page_size=1,
                                          uniform_input_length=1, implementation="reference")
    with pytest.raises(ValueError, match=r"cache_start: expected shape \(2,\)"):
        pcl.compute_out_cache_loc_uniform(np.zeros(3, I32), np.zeros(2, I32), TABLE, page_size=1,
                                          uniform_input_length=1, implementation="reference")
    with pytest.raises(ValueError, match="input_lengths: expected an integer dtype"):
        pcl.compute_out_cache_loc(np.zeros(2, I32), np.zeros(2, np.float32), np.zeros(2, I32), TABLE, page_size=1,
                                  out_size=4, implementation="reference")
    with pytest.raises(ValueError, match="cache_start: int64 value 4294967296 does not fit in int32"):
        pcl.compute_out_cache_loc_uniform(np.array([2**32, 0]), np.zeros(2, I32), TABLE, page_size=1,
                                          uniform_input_length=1, implementation="reference")
    with pytest.raises(ValueError, match="page_size: expected >= 1"):
        pcl.compute_out_cache_loc_uniform(np.zeros(2, I32), np.zeros(2, I32), TABLE, page_size=0,
                                          uniform_input_length=1, implementation="reference")
    with pytest.raises(ValueError, match="uniform_input_length: expected >= 1"):
        pcl.fused_decode_input_prep(np.zeros(3, I32), np.zeros(2, I32), TABLE, page_size=1, uniform_input_length=0,
                                    implementation="reference")
    with pytest.raises(ValueError, match=r"new_occupied_pages_num: expected shape \(2,\)"):
        pcl.update_req_to_page(TABLE.copy(), np.zeros(2, I32), np.zeros(4, I32), np.zeros(3, I32), np.zeros(2, I32),
                               implementation="reference")


def test_int64_inputs_within_range_are_accepted():
    out = pcl.compute_out_cache_loc_uniform(np.array([6], np.int64), np.array([1], np.int64), TABLE, page_size=4,
                                            uniform_input_length=2, implementation="reference")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [26, 27])




@pytest.mark.parametrize("implementation,interpret", [("reference", False), ("pallas", True)])
def test_checked_mode_errors(implementation, interpret):
    kw = dict(implementation=implementation, interpret=interpret)
    err, _ = checked_call(pcl.compute_out_cache_loc_uniform, np.zeros(2, I32), np.array([0, 3], I32), TABLE,
                      page_size=1, uniform_input_length=2, **kw)
    with pytest.raises(checkify.JaxRuntimeError, match=r"req_pool_indices: pool index out of range \[0, 3\)"):
        err.throw()
    err, _ = checked_call(pcl.compute_out_cache_loc, np.zeros(2, I32), np.array([2, -1], I32), np.zeros(2, I32), TABLE,
                      page_size=1, out_size=4, **kw)
    with pytest.raises(checkify.JaxRuntimeError, match="input_lengths: negative length"):
        err.throw()
    err, _ = checked_call(pcl.update_req_to_page, TABLE.copy(), np.array([1], I32), np.arange(4, dtype=I32),
                      np.array([3], I32), np.array([2], I32), **kw)
    with pytest.raises(checkify.JaxRuntimeError, match="update_req_to_page: pages past capacity"):
        err.throw()
    err, _ = checked_call(pcl.fused_decode_input_prep, np.array([0, -2, 0], I32), np.array([1], I32), TABLE,
                      page_size=1, uniform_input_length=1, **kw)
    with pytest.raises(checkify.JaxRuntimeError, match="valid_cache_lengths: negative cache length"):
        err.throw()


def test_checked_mode_quiet_on_legal_input():
    err, out = checked_call(pcl.compute_out_cache_loc, np.array([6, 0], I32), np.array([2, 3], I32),
                        np.array([1, 1], I32), TABLE, page_size=4, out_size=5, implementation="reference")
    assert err.get() is None
    np.testing.assert_array_equal(out, [4 * 6 + 2, 4 * 6 + 3, 20, 21, 22])


def test_pallas_without_gpu_or_interpret_raises():
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="implementation='pallas' needs a CUDA GPU or interpret=True"):
        pcl.compute_out_cache_loc_uniform(np.zeros(1, I32), np.zeros(1, I32), TABLE, page_size=1,
                                          uniform_input_length=1, implementation="pallas")


def test_traceable_inside_an_enclosing_jit():
    import jax

    table = TABLE.copy()
    f = jax.jit(lambda cs, p, t: pcl.fused_decode_input_prep(cs, p, t, page_size=4, uniform_input_length=2,
                                                             implementation="reference"))
    got = f(np.array([6, 0, 1], I32), np.array([0, 2], I32), table)
    np.testing.assert_array_equal(got.out_cache_loc, [4 * 2 + 2, 4 * 2 + 3, 4 * 9 + 1, 4 * 9 + 2])
    g = jax.jit(lambda t, n: pcl.update_req_to_page(t, np.array([1], I32), np.array([42, 43], I32), n,
                                                    np.array([2], I32), implementation="reference"))
    np.testing.assert_array_equal(g(table, np.array([2], I32))[1], [5, 6, 42, 43])
