"""Tests for jaxspec.kernels.multi_layer_eagle (SGLang 0.5.12 multi_layer_eagle_utils.py; docs/ops.md,
"rotate_input_ids" and "assign_hidden_states_pool").

Pallas kernel (interpret on CPU) == jnp reference == NumPy oracle (a sequential port of the Triton
programs), exactly; ids outside every segment and pool rows nobody writes are poisoned (INT_MIN / NaN
bit patterns) and must come back bit-identical.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from jaxspec.kernels import multi_layer_eagle as mle
from jaxspec.testing import checked_call

INT_MIN = np.iinfo(np.int32).min


def oracle_rotate(ids, starts, lens, topk, select=None):
    """Program after program, like the Triton grid (segments disjoint, so order does not matter)."""
    out = ids.copy()
    flat = np.asarray(topk).reshape(-1)
    for b in range(len(starts)):
        s, n = int(starts[b]), int(lens[b])
        for k in range(n - 1):  # blockwise loads precede stores: a pure left shift
            out[s + k] = out[s + k + 1]
        if n > 0:
            out[int(select[b]) if select is not None else s + n - 1] = flat[b]
    return out


def oracle_assign(hidden, pools, pool, lens, starts):
    out = pool.copy()
    width = pool.shape[1]
    for b in range(len(pools)):
        end = int(starts[b]) + int(lens[b])
        for i in range(width):
            r = end - width + i
            out[pools[b], i] = hidden[r] if 0 <= r < hidden.shape[0] else 0  # ours: rows before 0 read 0
    return out


def random_segments(rng, batch, lengths, gap_max=3):
    """Disjoint segments with random gaps (gap tokens belong to nobody and must stay untouched)."""
    lens = rng.choice(lengths, size=batch).astype(np.int32)
    gaps = rng.integers(0, gap_max + 1, size=batch)
    starts = (np.cumsum(gaps + lens) - lens).astype(np.int32)
    total = int(starts[-1] + lens[-1] + rng.integers(0, gap_max + 1))
    return starts, lens, total


def as_bits(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


class _MultiLayerEagleCases:
    """Shared cases (the GPU class and the interpret class both derive from this unmarked base, because
    pytest inherits class marks through the MRO)."""

    INTERPRET = False

    def call(self, fn, *args, implementation="pallas", **kwargs):
        return fn(*args, implementation=implementation, interpret=self.INTERPRET, **kwargs)

    # --- rotate_input_ids ---------------------------------------------------------------------------

    def test_rotate_example(self):
        ids = np.arange(10, dtype=np.int32) * 10
        starts, lens = np.array([0, 4, 5], np.int32), np.array([4, 0, 5], np.int32)
        for impl in ("pallas", "reference"):
            got = self.call(mle.rotate_input_ids, ids, starts, lens, np.array([[-1], [-2], [-3]], np.int32),
                            implementation=impl)
            np.testing.assert_array_equal(got, [10, 20, 30, -1, 40, 60, 70, 80, 90, -3])
            # select_index (absolute) inside the segment: the segment end keeps its old (duplicated) token.
            got = self.call(mle.rotate_input_ids, ids, starts, lens, np.array([-1, -2, -3], np.int32),
                            np.array([1, 99, 6], np.int32), implementation=impl)
            np.testing.assert_array_equal(got, [10, -1, 30, 30, 40, 60, -3, 80, 90, 90])

    @pytest.mark.parametrize("batch,with_select", [(1, False), (1, True), (12, False), (12, True)])
    def test_rotate_random(self, batch, with_select):
        for _ in range(3):
            rng = np.random.default_rng()
            starts, lens, total = random_segments(rng, batch, [0, 1, 2, 5, 129, 300])
            # One static T per case (one compile); the tail past the last segment is a poisoned gap too.
            ids = np.full(batch * 304 + 4, INT_MIN, np.int32)  # gaps stay poisoned
            for s, n in zip(starts, lens):
                ids[s : s + n] = rng.integers(0, 50_000, size=n)
            topk = rng.integers(0, 50_000, size=(batch, 1)).astype(np.int32)
            select = None
            if with_select:  # the last accepted position: anywhere in the segment
                select = (starts + np.floor(rng.random(batch) * np.maximum(lens, 1))).astype(np.int32)
            want = oracle_rotate(ids, starts, lens, topk, select)
            for impl in ("pallas", "reference"):
                got = self.call(mle.rotate_input_ids, ids.copy(), starts, lens, topk, select, implementation=impl)
                np.testing.assert_array_equal(got, want, err_msg=impl)

    def test_rotate_reads_topk_flat_like_upstream(self):
        # K > 1: upstream reads topk_index.flat[b] (the request's token only when K == 1).
        ids = np.arange(6, dtype=np.int32)
        starts, lens = np.array([0, 3], np.int32), np.array([3, 3], np.int32)
        topk = np.array([[100, 101], [200, 201]], np.int32)
        for impl in ("pallas", "reference"):
            got = self.call(mle.rotate_input_ids, ids, starts, lens, topk, implementation=impl)
            np.testing.assert_array_equal(got, [1, 2, 100, 4, 5, 101])

    def test_rotate_zero_lengths_are_no_ops(self):
        ids = np.arange(5, dtype=np.int32)
        for impl in ("pallas", "reference"):
            got = self.call(mle.rotate_input_ids, ids, np.array([1, 3], np.int32), np.zeros(2, np.int32),
                            np.array([7, 8], np.int32), np.array([0, 4], np.int32), implementation=impl)
            np.testing.assert_array_equal(got, ids)

    # --- assign_hidden_states_pool ------------------------------------------------------------------

    @pytest.mark.parametrize("dtype,hidden_dim,width", [(jnp.bfloat16, 96, 3), (jnp.float32, 1100, 2),
                                                        (jnp.bfloat16, 64, 1)])
    def test_assign_random(self, dtype, hidden_dim, width):
        batch, num_rows = 9, 14
        itemsize = np.dtype(dtype).itemsize
        for _ in range(2):
            rng = np.random.default_rng()
            starts, lens, total = random_segments(rng, batch, [0, 1, 2, 4, 7], gap_max=1)
            starts[0] = max(int(starts[0]), width)  # request 0 reads rows >= 0 here (hazard tested below)
            total = max(total, int(starts[-1] + lens[-1]), int(starts[0] + lens[0])) + 1
            pools = rng.permutation(num_rows)[:batch].astype(np.int32)
            # Exact fills from integer iotas bit-cast to the float dtype (no float rounding anywhere).
            udt = {2: np.uint16, 4: np.uint32}[itemsize]
            # Canonical quiet NaN: XLA:CPU bf16 copies canonicalise NaN payloads, so a payload would not survive.
            one, nan = (0x3F80, 0x7FC0) if itemsize == 2 else (0x3F800000, 0x7FC00000)
            hidden = rng.integers(one, one + 2**14, size=(total, hidden_dim)).astype(udt).view(dtype)  # normal
            pool = np.full((num_rows, width, hidden_dim), nan, udt).view(dtype)  # NaN poison
            want = oracle_assign(hidden, pools, pool, lens, starts)
            for impl in ("pallas", "reference"):
                got = self.call(mle.assign_hidden_states_pool, hidden, pools, pool.copy(), lens, starts,
                                implementation=impl)
                np.testing.assert_array_equal(as_bits(got), as_bits(want), err_msg=impl)

    def test_assign_short_segments_read_before_segment(self):
        # Upstream hazard kept: L < W reads the previous request's tail; rows before 0 read as 0.
        hidden = np.arange(1, 13, dtype=np.float32).reshape(6, 2)
        pool = np.full((3, 3, 2), np.nan, np.float32)
        starts, lens = np.array([0, 2], np.int32), np.array([2, 1], np.int32)
        want = pool.copy()
        want[2] = [[0, 0], [1, 2], [3, 4]]  # end 2: rows -1, 0, 1
        want[0] = [[1, 2], [3, 4], [5, 6]]  # end 3: rows 0, 1, 2 (two of them request 0's)
        for impl in ("pallas", "reference"):
            got = self.call(mle.assign_hidden_states_pool, hidden, np.array([2, 0], np.int32), pool.copy(), lens,
                            starts, implementation=impl)
            np.testing.assert_array_equal(as_bits(got), as_bits(want), err_msg=impl)

    def test_assign_width_zero_is_no_op(self):
        pool = np.zeros((3, 0, 4), np.float32)
        got = self.call(mle.assign_hidden_states_pool, np.ones((5, 4), np.float32), np.array([1], np.int32), pool,
                        np.array([3], np.int32), np.array([0], np.int32))
        assert got.shape == (3, 0, 4)


@pytest.mark.gpu
class TestMultiLayerEagle(_MultiLayerEagleCases):
    INTERPRET = False


class TestMultiLayerEagleInterpret(_MultiLayerEagleCases):
    INTERPRET = True


# ------------------------------------------------------------------------------------------------
# Validation.
# ------------------------------------------------------------------------------------------------

I32 = np.int32


def test_trace_time_errors():
    ids = np.zeros(8, I32)
    with pytest.raises(ValueError, match=r"topk_index: expected shape \(B,\) or \(B, K\)"):
        mle.rotate_input_ids(ids, np.zeros(3, I32), np.ones(3, I32), np.zeros(2, I32), implementation="reference")
    with pytest.raises(ValueError, match=r"select_index: expected shape \(3,\)"):
        mle.rotate_input_ids(ids, np.zeros(3, I32), np.ones(3, I32), np.zeros(3, I32), np.zeros(2, I32),
                             implementation="reference")
    with pytest.raises(ValueError, match="input_ids: int64 value 8589934592 does not fit in int32"):
        mle.rotate_input_ids(np.array([2**33]), np.zeros(1, I32), np.ones(1, I32), np.zeros(1, I32),
                             implementation="reference")
    with pytest.raises(ValueError, match="req_to_hidden_states_pool: expected dtype bfloat16"):
        mle.assign_hidden_states_pool(jnp.zeros((4, 8), jnp.bfloat16), np.zeros(1, I32), np.zeros((2, 1, 8), np.float32),
                                      np.ones(1, I32), np.zeros(1, I32), implementation="reference")
    with pytest.raises(ValueError, match=r"req_to_hidden_states_pool: expected shape \(\*, \*, 8\)"):
        mle.assign_hidden_states_pool(np.zeros((4, 8), np.float32), np.zeros(1, I32), np.zeros((2, 1, 4), np.float32),
                                      np.ones(1, I32), np.zeros(1, I32), implementation="reference")
    with pytest.raises(ValueError, match="hidden_states: expected dtype"):
        mle.assign_hidden_states_pool(np.zeros((4, 8), np.int32), np.zeros(1, I32), np.zeros((2, 1, 8), np.float32),
                                      np.ones(1, I32), np.zeros(1, I32), implementation="reference")




@pytest.mark.parametrize("implementation,interpret", [("reference", False), ("pallas", True)])
def test_checked_mode_errors(implementation, interpret):
    kw = dict(implementation=implementation, interpret=interpret)
    ids = np.arange(8, dtype=I32)
    err, _ = checked_call(mle.rotate_input_ids, ids, np.array([0, 4], I32), np.array([4, 5], I32),
                      np.zeros(2, I32), **kw)
    with pytest.raises(checkify.JaxRuntimeError, match=r"segment outside input_ids\[0:8\]"):
        err.throw()
    err, _ = checked_call(mle.rotate_input_ids, ids, np.array([0, 4], I32), np.array([4, 4], I32),
                      np.zeros(2, I32), np.array([3, 8], I32), **kw)
    with pytest.raises(checkify.JaxRuntimeError, match=r"select_index: out of range \[0, 8\)"):
        err.throw()
    hidden, pool = np.zeros((6, 4), np.float32), np.zeros((3, 2, 4), np.float32)
    err, _ = checked_call(mle.assign_hidden_states_pool, hidden, np.array([3], I32), pool, np.array([3], I32),
                      np.array([0], I32), **kw)
    with pytest.raises(checkify.JaxRuntimeError, match=r"req_pool_indices: pool index out of range \[0, 3\)"):
        err.throw()
    err, _ = checked_call(mle.assign_hidden_states_pool, hidden, np.array([1], I32), pool, np.array([1], I32),
                      np.array([0], I32), **kw)
    with pytest.raises(checkify.JaxRuntimeError, match="outside hidden_states"):
        err.throw()


def test_checked_mode_quiet_on_legal_input():
    err, out = checked_call(mle.rotate_input_ids, np.arange(6, dtype=I32), np.array([0, 3], I32), np.array([3, 3], I32),
                        np.array([9, 8], I32), implementation="reference")
    assert err.get() is None
    np.testing.assert_array_equal(out, [1, 2, 9, 4, 5, 8])


def test_traceable_inside_an_enclosing_jit():
    import jax

    f = jax.jit(lambda i, s, n, k: mle.rotate_input_ids(i, s, n, k, implementation="reference"))
    np.testing.assert_array_equal(f(np.arange(4, dtype=I32), np.array([0], I32), np.array([4], I32),
                                    np.array([9], I32)), [1, 2, 3, 9])
    g = jax.jit(lambda h, p: mle.assign_hidden_states_pool(h, np.array([1], I32), p, np.array([2], I32),
                                                           np.array([0], I32), implementation="reference"))
    out = g(np.arange(6, dtype=np.float32).reshape(3, 2), np.zeros((2, 1, 2), np.float32))
    np.testing.assert_array_equal(out[1, 0], [2, 3])
