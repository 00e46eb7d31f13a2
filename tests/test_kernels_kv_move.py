"""jaxspec/kernels/kv_move.py: Pallas (interpret on CPU) == jnp reference == NumPy oracle, bit for bit.

Golden: SGLang 0.5.23 (docs/ops.md, "move_accept_tokens_to_target_kvcache"): packed pairs from fill_front/fill_accept, parallel assignment.
Pools are built from integer iotas bit-cast to bf16/f32 (every element distinct and never NaN), so
"unchanged" is a bit-exact statement; every slot outside the target set must stay bit-identical.
"""

import functools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
from jax.experimental import checkify

from jaxspec._validate import checks
from jaxspec.kernels import kv_move as M
from jaxspec.testing import random_accept_index

SEED = np.random.SeedSequence().entropy
BF16_FINITE = 0x7F00  # uint16 patterns below 0x7F80 are finite positive bf16 values


def make_pool(shape, dtype, offset):
    """Distinct, NaN-free bit patterns: K and V pools use disjoint ranges via ``offset``."""
    n = int(np.prod(shape))
    if dtype == jnp.bfloat16:
        assert 2 * n <= BF16_FINITE
        bits = (jnp.arange(n, dtype=jnp.int32) + offset) % BF16_FINITE
        return jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16).reshape(shape)
    bits = jnp.arange(n, dtype=jnp.int32) + offset  # < 2^23: positive normal/subnormal f32, no NaN
    return jax.lax.bitcast_convert_type(bits, jnp.float32).reshape(shape)


def bits(x):
    x = np.asarray(jax.lax.bitcast_convert_type(x, jnp.uint16 if x.dtype == jnp.bfloat16 else jnp.uint32))
    return x


def np_move(buf_bits, tgt, src, paged):
    """Oracle: parallel assignment on a (L, X, F) view of the bit patterns."""
    shape = buf_bits.shape
    rows = buf_bits.reshape(shape[0], shape[1] * shape[2], -1) if paged else buf_bits.reshape(shape[0], shape[1], -1)
    out = rows.copy()
    out[:, tgt] = rows[:, src]
    return out.reshape(shape)


def random_disjoint_move(rng, num_slots, n):
    """Hazard-free general move: distinct targets, sources drawn from the other slots."""
    perm = rng.permutation(np.arange(1, num_slots))
    tgt = perm[:n].astype(np.int32)
    src = rng.choice(perm[n:], n, replace=True).astype(np.int32)
    return tgt, src




class _KVMoveCases:
    """Shared cases; the GPU class and the interpret class are siblings (pytest inherits class marks)."""

    INTERPRET = False

    def check_move(self, shape, dtype, tgt, src, *, paged=False, span=None, config=M.DEFAULT_CONFIG):
        k0, v0 = make_pool(shape, dtype, 0), make_pool(shape, dtype, 17)
        kb, vb = bits(k0), bits(v0)  # host copies: the device buffers are donated below
        want_k, want_v = np_move(kb, tgt, src, paged), np_move(vb, tgt, src, paged)
        ref = M.move_kv_cache(make_pool(shape, dtype, 0), make_pool(shape, dtype, 17), tgt, src,
                              paged=paged, implementation="reference")
        out = M.move_kv_cache(k0, v0, tgt, src, paged=paged, span=span, config=config,
                              implementation="pallas", interpret=self.INTERPRET)
        for got, r, want, orig in ((out.k_buffer, ref.k_buffer, want_k, kb), (out.v_buffer, ref.v_buffer, want_v, vb)):
            assert got.shape == shape and got.dtype == dtype
            np.testing.assert_array_equal(bits(got), want, err_msg=f"{SEED=}")
            np.testing.assert_array_equal(bits(r), want, err_msg=f"{SEED=}")
            # poison check: everything outside the target slots is bit-identical to before
            flat_got = bits(got).reshape(shape[0], -1, *shape[3 if paged else 2:])
            flat_orig = orig.reshape(flat_got.shape)
            keep = np.setdiff1d(np.arange(flat_got.shape[1]), np.asarray(tgt))
            np.testing.assert_array_equal(flat_got[:, keep], flat_orig[:, keep])

    @pytest.mark.parametrize("n,rows", [(1, 16), (37, 16), (64, 8)])
    def test_random_move_bf16(self, n, rows):
        rng = np.random.default_rng([SEED, n])
        shape = (3, 96, 2, 16)  # L, X, H, E; F = 32 features: sizes not a multiple of the block
        tgt, src = random_disjoint_move(rng, shape[1], n)
        M.dynamic_validate_move(tgt, src, shape[1], span=rows, config=M.MoveConfig(rows=rows))
        self.check_move(shape, jnp.bfloat16, tgt, src, span=rows, config=M.MoveConfig(rows=rows))

    def test_paged_page16_f32(self):
        rng = np.random.default_rng([SEED, 16])
        shape = (2, 6, 16, 3, 5)  # L, X/G, G=16, Hkv, E (D=15, not a power of two)
        tgt, src = random_disjoint_move(rng, 6 * 16, 21)
        self.check_move(shape, jnp.float32, tgt, src, paged=True)

    def test_empty_move(self):
        self.check_move((2, 8, 2, 8), jnp.bfloat16, np.zeros(0, np.int32), np.zeros(0, np.int32))

    def test_ordered_overlap_sequential_chunks(self):
        # a chain slide 1<-2<-3<-...: reads precede writes in index order -> legal with one span, any rows
        tgt = np.arange(1, 40, dtype=np.int32)
        src = tgt + 1
        M.dynamic_validate_move(tgt, src, 64, config=M.MoveConfig(rows=4))
        self.check_move((2, 64, 1, 8), jnp.bfloat16, tgt, src, config=M.MoveConfig(rows=4))

    # --- the spec-accept move --------------------------------------------------------------------------

    @pytest.mark.parametrize("bs,a,n,g", [(9, 6, 8, 1), (5, 4, 16, 16)])
    def test_move_accept(self, bs, a, n, g):
        rng = np.random.default_rng([SEED, bs, a, n])
        ai, lens = random_accept_index(rng, bs, a, n)
        num_slots = 1 + bs * n + 23
        num_slots = -(-num_slots // g) * g
        # verify window slots: a random permutation of the pool (slot 0 is the dummy slot)
        ocl = (1 + rng.permutation(num_slots - 1)[: bs * n]).astype(np.int32)
        shape = (2, num_slots // g, g, 2, 8) if g > 1 else (2, num_slots, 2, 8)
        tgt, src = (np.asarray(x) for x in M.move_accept_pairs_reference(jnp.asarray(ai), jnp.asarray(lens), jnp.asarray(ocl)))
        M.dynamic_validate_move(tgt, src, num_slots)  # the legal pattern passes
        k0, v0 = make_pool(shape, jnp.bfloat16, 0), make_pool(shape, jnp.bfloat16, 5)
        kb, vb = bits(k0), bits(v0)
        out = M.move_accept_tokens_to_target_kvcache(k0, v0, ai, lens, ocl, paged=g > 1,
                                                     implementation="pallas", interpret=self.INTERPRET)
        ref = M.move_accept_tokens_to_target_kvcache(make_pool(shape, jnp.bfloat16, 0), make_pool(shape, jnp.bfloat16, 5),
                                                     ai, lens, ocl, paged=g > 1, implementation="reference")
        for got, r, orig in ((out.k_buffer, ref.k_buffer, kb), (out.v_buffer, ref.v_buffer, vb)):
            want = np_move(orig, tgt, src, g > 1)
            np.testing.assert_array_equal(bits(r), want, err_msg=f"{SEED=}")
            np.testing.assert_array_equal(bits(got), want, err_msg=f"{SEED=}")

    def test_worked_example_10_1(self):
        # docs/ops.md's worked example: accept_index [[0,3,4,5],[6,10,11,-1]], out_cache_loc = 100 + arange(12), lens [4,3]
        ai = np.array([[0, 3, 4, 5], [6, 10, 11, -1]], np.int32)
        ocl = 100 + np.arange(12, dtype=np.int32)
        lens = np.array([4, 3], np.int32)
        tgt, src = M.move_accept_pairs_reference(jnp.asarray(ai), jnp.asarray(lens), jnp.asarray(ocl))
        np.testing.assert_array_equal(src, [100, 103, 104, 105, 106, 110, 111, 0])
        np.testing.assert_array_equal(tgt, [100, 101, 102, 103, 106, 107, 108, 0])
        shape = (2, 128, 1, 8)
        k0 = make_pool(shape, jnp.bfloat16, 0)
        kb = bits(k0)
        out = M.move_accept_tokens_to_target_kvcache(k0, make_pool(shape, jnp.bfloat16, 9), ai, lens, ocl,
                                                     implementation="pallas", interpret=self.INTERPRET)
        got = bits(out.k_buffer)
        for t, s in zip([101, 102, 103, 107, 108], [103, 104, 105, 110, 111]):
            np.testing.assert_array_equal(got[:, t], kb[:, s])
        np.testing.assert_array_equal(got[:, 104:107], kb[:, 104:107])


@pytest.mark.gpu
class TestKVMove(_KVMoveCases):
    """Compiled Pallas on the GPU (skipped without one)."""

    INTERPRET = False


class TestKVMoveInterpret(_KVMoveCases):
    """The same cases in Pallas interpret mode on CPU."""

    INTERPRET = True


# ----------------------------------------------------------------------------------------------------
# compact_accept_to_front, validation, checked mode
# ----------------------------------------------------------------------------------------------------


def test_compact_worked_example_10_2():
    # docs/ops.md, "Compaction to the front" (B=2, N=6, A=4; the worked example's accept_index; -1 clamps to global node 0 = token 3)
    predict = np.array([3, 0, 0, 4, 5, 18, 11, 0, 0, 0, 12, 18], np.int32)
    ai = np.array([[0, 3, 4, 5], [6, 10, 11, -1]], np.int32)
    out = M.compact_accept_to_front(predict, ai, num_draft_tokens=6)
    np.testing.assert_array_equal(out, [3, 4, 5, 18, 5, 18, 11, 12, 18, 3, 12, 18])
    select_index = np.array([3, 8])  # b*N + accept_lens - 1 with accept_lens [4, 3]
    np.testing.assert_array_equal(np.asarray(out)[select_index], [18, 18])


def test_compact_hidden_matches_numpy():
    rng = np.random.default_rng([SEED, 3])
    bs, n, a, h = 4, 8, 6, 5
    ai, _ = random_accept_index(rng, bs, a, n)
    x = rng.standard_normal((bs * n, h)).astype(np.float32)
    want = x.copy()
    want.reshape(bs, n, h)[:, :a] = x[np.maximum(ai, 0).reshape(-1)].reshape(bs, a, h)
    np.testing.assert_array_equal(M.compact_accept_to_front(x, ai, num_draft_tokens=n), want)


def test_compact_is_one_gather():
    """compact is one gather over every row, with no update of ``[:, :A]``: at B = 1 that update is a contiguous
    copy, which XLA:GPU ran as an async dynamic-slice copy outside its command buffers (H200, the batch-1 adaptive
    loop). Fails on ``blocks.at[:, :a].set(gathered)``."""
    x, ai = jnp.zeros((8, 16), jnp.float32), jnp.zeros((1, 6), jnp.int32)
    text = jax.jit(lambda x, ai: M.compact_accept_to_front_reference(x, ai, num_draft_tokens=8)).lower(x, ai).as_text()
    ops = set(re.findall(r"stablehlo\.(\w+)", text))
    assert "gather" in ops and not ops & {"scatter", "dynamic_update_slice"}, ops


def test_dynamic_validate_move_errors():
    with pytest.raises(ValueError, match=r"tgt_loc\[1\] = 64 is out of range \[0, 64\)"):
        M.dynamic_validate_move([1, 64], [2, 3], 64)
    with pytest.raises(ValueError, match=r"src_loc\[0\] = -1 is out of range"):
        M.dynamic_validate_move([1], [-1], 64)
    with pytest.raises(ValueError, match="duplicate target slot 5 written from different sources"):
        M.dynamic_validate_move([5, 5], [1, 2], 64)
    # writer (pair 0, chunk 0) runs before the reader (pair 1, chunk 1) with rows=1: order-dependent
    with pytest.raises(ValueError, match="overlapping move"):
        M.dynamic_validate_move([6, 5], [7, 6], 64, config=M.MoveConfig(rows=1))
    M.dynamic_validate_move([6, 5], [7, 6], 64, config=M.MoveConfig(rows=2))  # same chunk: gathered first
    # hazard across independent spans
    with pytest.raises(ValueError, match="overlapping move"):
        M.dynamic_validate_move([5, 6], [6, 7], 64, span=1, config=M.MoveConfig(rows=1))
    M.dynamic_validate_move([5, 6], [6, 7], 64, config=M.MoveConfig(rows=1))  # one span: reader first
    M.dynamic_validate_move([0, 0, 3], [0, 0, 3], 64)  # 0 <- 0 padding and self-copies are legal


def test_dynamic_validate_accepts_legal_accept_pattern():
    rng = np.random.default_rng([SEED, 99])
    for bs, a, n in [(1, 4, 4), (128, 6, 16)]:
        ai, lens = random_accept_index(rng, bs, a, n)
        ocl = (1 + rng.permutation(bs * n * 2)[: bs * n]).astype(np.int32)
        tgt, src = M.move_accept_pairs_reference(jnp.asarray(ai), jnp.asarray(lens), jnp.asarray(ocl))
        M.dynamic_validate_move(tgt, src, bs * n * 2 + 1, config=M.MoveConfig(rows=1))
        M.dynamic_validate_move(tgt, src, bs * n * 2 + 1)


def _checked_move(tgt, src, **kw):
    shape = (1, 16, 1, 8)
    with checks(True):
        f = checkify.checkify(lambda k, v, t, s: M.move_kv_cache(k, v, t, s, implementation="reference", **kw))
        err, _ = f(make_pool(shape, jnp.bfloat16, 0), make_pool(shape, jnp.bfloat16, 3),
                   jnp.asarray(tgt, jnp.int32), jnp.asarray(src, jnp.int32))
    return err


def test_checked_mode_move():
    with pytest.raises(checkify.JaxRuntimeError, match="tgt_loc out of range"):
        _checked_move([1, 16], [2, 3]).throw()
    with pytest.raises(checkify.JaxRuntimeError, match="overlapping src/tgt"):
        _checked_move([6, 5], [7, 6], config=M.MoveConfig(rows=1)).throw()
    # the legal accept pattern does not fire (in-jit check, default config)
    assert _checked_move([1, 2, 3, 7, 8, 0], [1, 4, 5, 7, 11, 0]).get() is None
    assert _checked_move([1, 2, 3, 4], [3, 4, 5, 6], config=M.MoveConfig(rows=1)).get() is None


def test_checked_mode_accept_rows():
    shape = (1, 32, 1, 8)
    ai = jnp.array([[0, -1, 2]], jnp.int32)  # hole: valid entries are not a prefix
    with checks(True):
        f = checkify.checkify(lambda k, v: M.move_accept_tokens_to_target_kvcache(
            k, v, ai, jnp.array([2], jnp.int32), jnp.arange(1, 4, dtype=jnp.int32), implementation="reference"))
        err, _ = f(make_pool(shape, jnp.bfloat16, 0), make_pool(shape, jnp.bfloat16, 1))
    with pytest.raises(checkify.JaxRuntimeError, match="first accept_lens"):
        err.throw()


def test_trace_time_errors():
    k = make_pool((1, 8, 1, 8), jnp.bfloat16, 0)
    with pytest.raises(ValueError, match="tgt_loc: expected (an integer dtype|int32)"):
        M.move_kv_cache(k, k + 0, np.zeros(2, np.float32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"src_loc: expected shape \(2,\)"):
        M.move_kv_cache(k + 0, k + 0, np.zeros(2, np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="k_buffer/v_buffer: slot dims differ"):
        M.move_kv_cache(k + 0, make_pool((1, 9, 1, 8), jnp.bfloat16, 0), np.zeros(2, np.int32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="int64 value 4294967296 does not fit"):
        M.move_kv_cache(k + 0, k + 0, np.array([2**32], np.int64), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="MoveConfig.rows: expected a power of two"):
        M.MoveConfig(rows=6)
    with pytest.raises(ValueError, match="x: expected leading dim B\\*N = 12"):
        M.compact_accept_to_front(np.zeros(10, np.int32), np.zeros((2, 3), np.int32), num_draft_tokens=6)


def test_move_lowers_through_triton():
    """The move kernel lowers to Triton IR (GPU path), checked on CPU via the Triton lowering rule."""
    from jax._src.interpreters import mlir
    from jax._src.pallas import pallas_call
    from jax._src.pallas.triton import pallas_call_registration as reg

    mlir.register_lowering(pallas_call.pallas_call_p, reg.pallas_call_lowering, platform="cpu")
    try:
        kb = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16)
        i32 = jax.ShapeDtypeStruct((100,), jnp.int32)
        for span in (None, 16):
            txt = jax.jit(lambda k, v, t, s, span=span: M._move_pallas(k, v, t, s, span=span, config=M.DEFAULT_CONFIG,
                                                                         interpret=False)).lower(kb, kb, i32, i32).as_text()
            assert "xla.gpu.triton" in txt
    finally:
        mlir.register_lowering(pallas_call.pallas_call_p, pallas_call._pallas_call_lowering, platform="cpu")


# ----------------------------------------------------------------------------------------------------
# every pair list: the Pallas move equals the parallel assignment, or is refused (host pairs) / falls back
# to the reference in the program (traced pairs)
# ----------------------------------------------------------------------------------------------------

_SLOTS = 16


def _brute_problems(tgt, src, rows, span, num_slots):
    """O(n^2) statement of the order rule: live pair i (both slots in range) is a problem when its target is
    written from another source, or when it is active (moves something), reads a slot that another active
    pair j overwrites, and j sits in another span or an earlier chunk."""
    n = tgt.shape[0]
    i = np.arange(n)
    live = (tgt >= 0) & (tgt < num_slots) & (src >= 0) & (src < num_slots)
    active = live & (tgt != src)
    dup = (live[:, None] & live[None, :] & (tgt[:, None] == tgt[None, :]) & (src[:, None] != src[None, :])).any(1)
    reads = active[:, None] & active[None, :] & (src[:, None] == tgt[None, :])
    early = ((i[:, None] // span) != (i[None, :] // span)) | ((i[None, :] // rows) < (i[:, None] // rows))
    return dup | (reads & early).any(1)


# 8 or 16 pairs (two executables per config) over slots -1..8 (and 9: one past the pool), so that pairs collide
_pair_lists = st.sampled_from([8, 16]).flatmap(lambda n: st.tuples(
    st.lists(st.tuples(st.integers(-1, 9), st.integers(-1, 9)), min_size=n, max_size=n),
    st.sampled_from([1, 2, 4]), st.sampled_from([None, 1])))


@settings(max_examples=60)
@given(case=_pair_lists)
def test_move_equals_the_parallel_assignment_or_is_refused(case):
    """Random pair lists, hazards of every kind (swaps and chains across chunks and spans, duplicate targets,
    self-copies, out-of-range slots): the O(n log n) order rule equals its O(n^2) statement; host pairs the
    Pallas move accepts give the parallel assignment bit for bit, the others are refused naming a pair; the
    same pairs traced inside jit, or with ``auto``, give the reference's result in every case."""
    pairs, rows, span_mult = case
    tgt = np.array([t for t, _ in pairs], np.int32)
    src = np.array([s for _, s in pairs], np.int32)
    tgt[tgt == 9], src[src == 9] = _SLOTS + 3, _SLOTS + 5  # some slots out of range: dropped
    config = M.MoveConfig(rows=rows)
    span = None if span_mult is None else span_mult * rows
    sp = M.run_span(len(pairs), span, rows)
    np.testing.assert_array_equal(M.move_hazards(tgt, src, rows=rows, span=sp, num_slots=_SLOTS),
                                  _brute_problems(tgt, src, rows, sp, _SLOTS), err_msg=f"{tgt=} {src=}")
    shape = (2, _SLOTS, 1, 4)
    kb = bits(make_pool(shape, jnp.float32, 0))
    live = (tgt >= 0) & (tgt < _SLOTS) & (src >= 0) & (src < _SLOTS)
    kw = dict(span=span, config=config, implementation="pallas", interpret=True)
    ref = M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 7), tgt, src,
                          implementation="reference")
    if M.unordered_pair_error(tgt, src, _SLOTS, span=span, config=config) is None:
        out = M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 7), tgt, src, **kw)
        np.testing.assert_array_equal(bits(out.k_buffer), np_move(kb, tgt[live], src[live], False),
                                      err_msg=f"{tgt=} {src=} {rows=} {span=}")
    else:
        with pytest.raises(ValueError, match=r"would differ from the parallel assignment: .*pairs? \d+"):
            M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 7), tgt, src, **kw)
        auto = M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 7), tgt, src,
                               **dict(kw, implementation="auto"))  # auto runs the reference for these
        np.testing.assert_array_equal(bits(auto.k_buffer), bits(ref.k_buffer))
    traced = _traced_move(span, config)(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 7),
                                        jnp.asarray(tgt), jnp.asarray(src))
    np.testing.assert_array_equal(bits(traced.k_buffer), bits(ref.k_buffer), err_msg=f"{tgt=} {src=} {rows=} {span=}")
    np.testing.assert_array_equal(bits(traced.v_buffer), bits(ref.v_buffer))


@functools.lru_cache(maxsize=None)
def _traced_move(span, config):
    return jax.jit(lambda k, v, t, s: M.move_kv_cache(k, v, t, s, span=span, config=config, implementation="pallas",
                                                       interpret=True))


def test_swap_across_chunks_is_refused_on_the_host_and_reordered_in_a_trace():
    """A swap (1 <- 2, 2 <- 1) in two chunks cannot be done in place in index order: host pairs are refused,
    traced pairs run the reference; in one chunk the kernel gathers both rows first and does it."""
    shape = (1, _SLOTS, 1, 4)
    tgt, src = np.array([1, 2], np.int32), np.array([2, 1], np.int32)
    with pytest.raises(ValueError, match=r"pair 1 \(2 <- 1\) reads slot 1, which pair 0 \(1 <- 2\) overwrites in an "
                                         r"earlier chunk"):
        M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 1), tgt, src,
                        config=M.MoveConfig(rows=1), implementation="pallas", interpret=True)
    kb = bits(make_pool(shape, jnp.float32, 0))
    want = np_move(kb, tgt, src, False)
    traced = _traced_move(None, M.MoveConfig(rows=1))(make_pool(shape, jnp.float32, 0),
                                                      make_pool(shape, jnp.float32, 1), jnp.asarray(tgt), jnp.asarray(src))
    np.testing.assert_array_equal(bits(traced.k_buffer), want)
    out = M.move_kv_cache(make_pool(shape, jnp.float32, 0), make_pool(shape, jnp.float32, 1), tgt, src,
                          config=M.MoveConfig(rows=2), implementation="pallas", interpret=True)
    np.testing.assert_array_equal(bits(out.k_buffer), want)


@pytest.mark.gpu
def test_traced_move_updates_the_donated_pool_in_place():
    """Traced pairs are checked in the program (``lax.cond`` between the kernel and the reference): the donated
    pools are still updated in place, with no pool-sized temporary (a copy would double the KV pool's memory)."""
    k = jnp.zeros((4, 1 << 14, 1024), jnp.bfloat16)
    t = jnp.arange(1, 257, dtype=jnp.int32)
    f = jax.jit(lambda k, v, t, s: tuple(M.move_kv_cache(k, v, t, s, implementation="pallas")), donate_argnums=(0, 1))
    stats = f.lower(k, k, t, t + 1000).compile().memory_analysis()
    assert stats.temp_size_in_bytes < k.nbytes // 8, stats


def _accept_oracle(pool_bits, ai, lens, ocl, n):
    """The accept move's parallel assignment over the entries it uses: row b's leading entries that are its own
    node ids, increasing, within ``accept_lens[b]`` and ``N``."""
    bs, a = ai.shape
    out = pool_bits.copy()
    for b in range(bs):
        for j in range(min(a, n)):
            node = ai[b, j]
            if j >= lens[b] or not b * n <= node < (b + 1) * n or (j and node <= ai[b, j - 1]):
                break
            out[:, ocl[b * n + j]] = pool_bits[:, ocl[node]]
    return out


@settings(max_examples=40)
@given(shape=st.sampled_from([(8, 4, 4), (2, 20, 24)]), data=st.data())
def test_accept_move_equals_the_reference_for_every_accept_index(shape, data):
    """Any accept_index (other requests' nodes, repeats, decreasing ids, -1 holes, out of range) and any
    accept_lens, over distinct window slots: the Pallas move (request-aligned spans: B = 8 requests of 4 pairs
    in two 16-pair spans; at A = 20 a request spans two 16-pair chunks) equals the reference and the oracle bit
    for bit."""
    bs, a, n = shape
    ai = np.array(data.draw(st.lists(st.integers(-1, bs * n + 1), min_size=bs * a, max_size=bs * a)), np.int32)
    ai = ai.reshape(bs, a)
    if data.draw(st.booleans()):  # mostly legal rows: each row's own nodes, increasing, with a few edits
        ai = np.sort(np.abs(ai) % n, axis=1) + np.arange(bs, dtype=np.int32)[:, None] * n
    lens = np.array(data.draw(st.lists(st.integers(0, a + 1), min_size=bs, max_size=bs)), np.int32)
    slots = bs * n + 5
    ocl = (1 + np.random.default_rng([SEED, bs]).permutation(slots - 1)[: bs * n]).astype(np.int32)
    pool = (2, slots, 1, 4)
    kb = bits(make_pool(pool, jnp.float32, 0))
    want = _accept_oracle(kb, ai, lens, ocl, n)
    for impl in (dict(implementation="reference"), dict(implementation="pallas", interpret=True)):
        out = M.move_accept_tokens_to_target_kvcache(make_pool(pool, jnp.float32, 0), make_pool(pool, jnp.float32, 3),
                                                     ai, lens, ocl, **impl)
        np.testing.assert_array_equal(bits(out.k_buffer), want, err_msg=f"{impl} {ai=} {lens=}")
