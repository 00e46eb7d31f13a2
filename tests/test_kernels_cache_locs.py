"""jaxspec/kernels/cache_locs.py: Pallas (interpret on CPU) == jnp reference == NumPy oracle, exactly.

Golden: SGLang 0.5.23 semantics (docs/ops.md: "assign_extend_cache_locs", "fill_accept_out_cache_loc",
"assign_draft_cache_locs"); fixtures from upstream's tests (upstream
test_cache_locs_fallback.py) and §10.1.
"""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.experimental import checkify

from jaxspec._validate import checks
from jaxspec.kernels import cache_locs as C
from jaxspec.testing import random_accept_index

SEED = np.random.SeedSequence().entropy  # fresh seed per run; printed on failure via the assert message


# ----------------------------------------------------------------------------------------------------
# NumPy oracles (loops ported from the Triton kernels)
# ----------------------------------------------------------------------------------------------------


def np_extend(rpi, r2t, start, end, out_size):
    out = np.zeros(out_size, np.int64)
    off = 0
    for b in range(len(rpi)):
        for k in range(end[b] - start[b]):
            if off + k < out_size:
                out[off + k] = r2t[rpi[b], start[b] + k]
        off += end[b] - start[b]
    return out


def np_fill_accept(ai, ocl):
    flat = ai.reshape(-1)
    out = np.zeros(flat.size, np.int64)
    for pid in range(flat.size):
        dst = int(np.sum(flat[:pid] != -1))
        if flat[pid] > -1:
            out[dst] = ocl[flat[pid]]
    return out


def random_extend_case(rng, bs, rows, width):
    r2t = rng.permutation(rows * width * 4)[: rows * width].reshape(rows, width).astype(np.int32) + 1
    rpi = rng.permutation(rows)[:bs].astype(np.int32)
    start = rng.integers(0, width + 1, bs).astype(np.int32)
    end = np.minimum(start + rng.integers(0, 20, bs), width).astype(np.int32)
    zero = rng.random(bs) < 0.25
    end[zero] = start[zero]  # zero-length rows
    return rpi, r2t, start, end




class _CacheLocsCases:
    """Shared cases. (pytest inherits class marks through the MRO, so the GPU-only class and the
    interpret class are siblings over this base rather than parent and child.)"""

    INTERPRET = False
    IMPL = "pallas"

    def run(self, f, *args, **kw):
        out = f(*args, implementation=self.IMPL, interpret=self.INTERPRET, **kw)
        ref = f(*args, implementation="reference", **kw)
        jax.tree.map(lambda o, r: np.testing.assert_array_equal(np.asarray(o), np.asarray(r), err_msg=f"{SEED=}"), out, ref)
        return out

    # --- §8 ragged ---------------------------------------------------------------------------------

    def test_extend_golden(self):
        # upstream fixture (upstream test/registered/unit/spec/test_cache_locs_fallback.py)
        r2t = np.array([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]], np.int32)
        out = self.run(C.assign_extend_cache_locs, np.array([2, 0, 1], np.int32), r2t,
                       np.array([1, 2, 0], np.int32), np.array([3, 3, 3], np.int32), out_size=9)
        np.testing.assert_array_equal(out, [31, 32, 12, 20, 21, 22, 0, 0, 0])
        assert out.dtype == jnp.int32

    @pytest.mark.parametrize("bs,rows,width,out_size", [(1, 1, 7, 7), (33, 40, 300, 300)])
    def test_extend_random(self, bs, rows, width, out_size):
        rng = np.random.default_rng([SEED, bs])
        for _ in range(2):
            rpi, r2t, start, end = random_extend_case(rng, bs, rows, width)
            out = self.run(C.assign_extend_cache_locs, rpi, r2t, start, end, out_size=out_size)
            np.testing.assert_array_equal(out, np_extend(rpi, r2t, start, end, out_size), err_msg=f"{SEED=}")

    def test_extend_long_row_crosses_blocks(self):
        rng = np.random.default_rng([SEED, 7])
        r2t = rng.permutation(4 * 700).reshape(4, 700).astype(np.int32)
        rpi, start, end = np.array([3, 1], np.int32), np.array([5, 0], np.int32), np.array([300, 257], np.int32)
        out = self.run(C.assign_extend_cache_locs, rpi, r2t, start, end, out_size=600)
        np.testing.assert_array_equal(out, np_extend(rpi, r2t, start, end, 600))

    def test_extend_empty_batch(self):
        out = self.run(C.assign_extend_cache_locs, np.zeros(0, np.int32), np.ones((2, 4), np.int32),
                       np.zeros(0, np.int32), np.zeros(0, np.int32), out_size=5)
        np.testing.assert_array_equal(out, np.zeros(5))

    # --- uniform / draft -----------------------------------------------------------------------------

    @pytest.mark.parametrize("bs,width", [(1, 1), (16, 130)])
    def test_uniform(self, bs, width):
        rng = np.random.default_rng([SEED, bs, width])
        rows, w = bs + 3, width + 50
        r2t = rng.permutation(rows * w).reshape(rows, w).astype(np.int32)
        rpi = rng.permutation(rows)[:bs].astype(np.int32)
        seq = rng.integers(0, w - width + 1, bs).astype(np.int32)
        out = self.run(C.assign_extend_cache_locs_uniform, rpi, r2t, seq, width=width, with_positions=True)
        np.testing.assert_array_equal(out.out_cache_loc, np_extend(rpi, r2t, seq, seq + width, bs * width))
        np.testing.assert_array_equal(out.positions, (seq[:, None] + np.arange(width)[None, :]).reshape(-1))
        plain = self.run(C.assign_extend_cache_locs_uniform, rpi, r2t, seq, width=width)
        assert plain.positions is None

    @pytest.mark.parametrize("topk,steps,cols", [(4, 5, None), (1, 3, 4)])
    def test_draft(self, topk, steps, cols):
        rng = np.random.default_rng([SEED, topk, steps])
        bs, rows, w = 6, 8, 64
        r2t = rng.permutation(rows * w).reshape(rows, w).astype(np.int32)
        rpi = rng.permutation(rows)[:bs].astype(np.int32)
        seq = rng.integers(0, w - topk * (cols or steps), bs).astype(np.int32)
        out = self.run(C.assign_draft_cache_locs, rpi, r2t, seq, topk=topk, num_steps=steps, num_cols=cols)
        c = cols or steps
        np.testing.assert_array_equal(out.out_cache_loc, np_extend(rpi, r2t, seq, seq + topk * c, bs * topk * c))
        np.testing.assert_array_equal(out.positions, np.repeat(seq, topk))

    # --- fill_front / fill_accept --------------------------------------------------------------------

    def test_accept_and_front_golden(self):
        # the worked example of docs/ops.md, "move_accept_tokens_to_target_kvcache"
        ai = np.array([[0, 3, 4, 5], [6, 10, 11, -1]], np.int32)
        ocl = 100 + np.arange(12, dtype=np.int32)
        src = self.run(C.fill_accept_out_cache_loc, ai, ocl)
        tgt = self.run(C.fill_front_out_cache_loc, np.array([4, 3], np.int32), ocl, width=4)
        np.testing.assert_array_equal(src, [100, 103, 104, 105, 106, 110, 111, 0])
        np.testing.assert_array_equal(tgt, [100, 101, 102, 103, 106, 107, 108, 0])

    @pytest.mark.parametrize("bs,a,n", [(1, 2, 2), (300, 8, 10)])
    def test_accept_random(self, bs, a, n):
        rng = np.random.default_rng([SEED, bs, a])
        ai, lens = random_accept_index(rng, bs, a, n)
        ai[rng.random(ai.shape) < 0.1] = -1  # holes too: compaction does not care about row structure
        ocl = rng.permutation(bs * n * 3)[: bs * n].astype(np.int32) + 1
        out = self.run(C.fill_accept_out_cache_loc, ai, ocl)
        np.testing.assert_array_equal(out, np_fill_accept(ai, ocl), err_msg=f"{SEED=}")
        front = self.run(C.fill_front_out_cache_loc, lens, ocl, width=a)
        np.testing.assert_array_equal(front, np_extend(np.arange(bs), ocl.reshape(bs, n), 0 * lens, lens, bs * a))

    def test_accept_empty(self):
        out = self.run(C.fill_accept_out_cache_loc, np.zeros((0, 4), np.int32), np.arange(8, dtype=np.int32))
        assert out.shape == (0,)


@pytest.mark.gpu
class TestCacheLocs(_CacheLocsCases):
    """Compiled Pallas on the GPU (skipped without one)."""

    INTERPRET = False


class TestCacheLocsInterpret(_CacheLocsCases):
    """The same cases in Pallas interpret mode on CPU."""

    INTERPRET = True


# ----------------------------------------------------------------------------------------------------
# Validation: trace-time errors and checked mode
# ----------------------------------------------------------------------------------------------------


def _checked(f, *args, **kw):
    with checks(True):
        err, out = checkify.checkify(lambda *a: f(*a, implementation="pallas", interpret=True, **kw))(*args)
    return err, out


def test_trace_time_errors():
    r2t = np.zeros((3, 5), np.int32)
    with pytest.raises(ValueError, match="req_pool_indices: expected an integer dtype"):
        C.assign_extend_cache_locs(np.zeros(2, np.float32), r2t, np.zeros(2, np.int32), np.zeros(2, np.int32), out_size=4)
    with pytest.raises(ValueError, match=r"end_offset: expected shape \(2,\)"):
        C.assign_extend_cache_locs(np.zeros(2, np.int32), r2t, np.zeros(2, np.int32), np.zeros(3, np.int32), out_size=4)
    with pytest.raises(ValueError, match="out_cache_loc: expected a multiple of B=3"):
        C.fill_front_out_cache_loc(np.zeros(3, np.int32), np.zeros(7, np.int32), width=2)
    with pytest.raises(ValueError, match="int64 value 4294967296 does not fit in int32"):
        C.assign_extend_cache_locs_uniform(np.array([2**32], np.int64), r2t, np.zeros(1, np.int32), width=2)
    with pytest.raises(ValueError, match="implementation: expected one of"):
        C.fill_accept_out_cache_loc(np.zeros((1, 2), np.int32), np.zeros(2, np.int32), implementation="cuda")
    with pytest.raises(ValueError, match="has no mosaic kernel"):
        C.fill_accept_out_cache_loc(np.zeros((1, 2), np.int32), np.zeros(2, np.int32), implementation="mosaic")
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a CUDA GPU or interpret=True"):
            C.fill_accept_out_cache_loc(np.zeros((1, 2), np.int32), np.zeros(2, np.int32), implementation="triton")


def test_checked_mode_errors():
    r2t = np.arange(15, dtype=np.int32).reshape(3, 5)
    two = np.array([0, 1], np.int32)
    err, _ = _checked(C.assign_extend_cache_locs, two, r2t, np.array([0, 0], np.int32), np.array([3, 3], np.int32), out_size=5)
    with pytest.raises(checkify.JaxRuntimeError, match="total length exceeds out_size=5"):
        err.throw()
    err, _ = _checked(C.assign_extend_cache_locs, two, r2t, np.array([0, 4], np.int32), np.array([3, 6], np.int32), out_size=9)
    with pytest.raises(checkify.JaxRuntimeError, match="end_offset <= req_to_token.shape"):
        err.throw()
    err, _ = _checked(C.assign_extend_cache_locs_uniform, np.array([0, 3], np.int32), r2t, two, width=2)
    with pytest.raises(checkify.JaxRuntimeError, match="pool row out of range"):
        err.throw()
    err, _ = _checked(C.fill_accept_out_cache_loc, np.array([[0, 9]], np.int32), np.arange(4, dtype=np.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="node id in"):
        err.throw()
    # legal inputs: no error
    err, out = _checked(C.assign_extend_cache_locs, two, r2t, np.array([0, 1], np.int32), np.array([2, 3], np.int32), out_size=4)
    assert err.get() is None
    np.testing.assert_array_equal(out, [0, 1, 6, 7])


def test_jittable_under_outer_jit():
    f = jax.jit(lambda ai, ocl: C.fill_accept_out_cache_loc(ai, ocl, implementation="pallas", interpret=True))
    np.testing.assert_array_equal(f(jnp.array([[0, -1]], jnp.int32), jnp.array([5, 6], jnp.int32)), [5, 0])


def test_lowers_through_triton():
    """Every Pallas kernel lowers to Triton IR (the GPU path) -- checked on CPU by registering the
    Triton pallas_call lowering for the cpu platform (private API; test-only)."""
    from jax._src.interpreters import mlir
    from jax._src.pallas import pallas_call
    from jax._src.pallas.triton import pallas_call_registration as reg

    mlir.register_lowering(pallas_call.pallas_call_p, reg.pallas_call_lowering, platform="cpu")
    try:
        i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
        txt = jax.jit(lambda a, b, c, d: C._extend_pallas(a, b, c, d, out_size=64, interpret=False)).lower(
            i32(5), i32(7, 40), i32(5), i32(5)).as_text()
        assert "xla.gpu.triton" in txt
        txt = jax.jit(lambda a, b, c: C._uniform_pallas(a, b, c, width=6, with_positions=True, interpret=False)).lower(
            i32(5), i32(7, 40), i32(5)).as_text()
        assert "xla.gpu.triton" in txt
        txt = jax.jit(lambda a, b: C._accept_pallas(a, b, interpret=False)).lower(i32(5, 6), i32(40)).as_text()
        assert "xla.gpu.triton" in txt
    finally:  # restore the default (interpret-capable) rule
        mlir.register_lowering(pallas_call.pallas_call_p, pallas_call._pallas_call_lowering, platform="cpu")
