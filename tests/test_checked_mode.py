"""Checked mode as a real mode (in the jit key, checks before a donated buffer is written, traced hazards flagged)
and the backend fallback."""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxspec
from jaxspec.kernels import _backend
from jaxspec.kernels import cache_locs as C
from jaxspec.kernels import kv_move as M
from jaxspec.testing import checked_call

I32 = np.int32


def _pool():
    return jnp.asarray(np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4))


def test_checked_call_after_plain_call_checks_and_plain_after_checked_runs():
    r2t = np.arange(12, dtype=I32).reshape(2, 6)
    args = (np.array([0, 5], I32), r2t, np.array([0, 0], I32))
    C.assign_extend_cache_locs_uniform(*args, width=2)  # plain first: caches the unchecked trace
    with jaxspec.checks(), pytest.raises(checkify.JaxRuntimeError, match="pool row out of range"):
        C.assign_extend_cache_locs_uniform(*args, width=2)
    C.assign_extend_cache_locs_uniform(*args, width=2)  # plain after checked: no "not functionalized" error
    k = _pool()
    M.move_kv_cache(k + 0, k + 0, np.array([9], I32), np.array([1], I32))
    with jaxspec.checks(), pytest.raises(checkify.JaxRuntimeError, match="tgt_loc out of range"):
        M.move_kv_cache(k + 0, k + 0, np.array([9], I32), np.array([1], I32))
    M.move_kv_cache(k + 0, k + 0, np.array([9], I32), np.array([1], I32))


@pytest.mark.parametrize("impl", ["reference", "pallas"])
def test_checked_move_checks_before_the_pool_is_donated(impl):
    k, v = _pool(), _pool() + 1
    before = np.asarray(k)
    with jaxspec.checks(), pytest.raises(checkify.JaxRuntimeError, match="tgt_loc out of range"):
        M.move_kv_cache(k, v, np.array([1, -1], I32), np.array([2, 3], I32), implementation=impl, interpret=True)
    assert not k.is_deleted() and not v.is_deleted()
    np.testing.assert_array_equal(np.asarray(k), before)


def test_traced_overlapping_pairs_are_flagged_and_nothing_is_written():
    n = 32
    tgt = jnp.arange(n, dtype=jnp.int32)
    src = (n - 1 - jnp.arange(n)).astype(jnp.int32)  # swaps across spans: order-dependent
    k = jnp.asarray(np.arange(2 * n * 4, dtype=np.float32).reshape(2, n, 4))
    err, (kk, _) = checked_call(M.move_kv_cache, k + 0, k + 0, tgt, src, span=16, implementation="pallas",
                                interpret=True)
    with pytest.raises(checkify.JaxRuntimeError, match="overlapping src/tgt pairs"):
        err.throw()
    np.testing.assert_array_equal(np.asarray(kk), np.asarray(k))


def test_checked_inside_a_callers_jit():
    r2t = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)

    @jax.jit
    def step(rpi, seq):
        return C.assign_extend_cache_locs_uniform(rpi, r2t, seq, width=2).out_cache_loc

    np.testing.assert_array_equal(np.asarray(step(jnp.array([1], jnp.int32), jnp.array([5], jnp.int32))), [11, 0])
    # jaxspec.checked traces the caller fresh with checks on and functionalizes them
    checked_step = jaxspec.checked(jax.jit(lambda rpi, seq: C.assign_extend_cache_locs_uniform(
        rpi, r2t, seq, width=2).out_cache_loc))
    with pytest.raises(checkify.JaxRuntimeError, match="seq_lens \\+ 2 <= req_to_token.shape"):
        checked_step(jnp.array([1], jnp.int32), jnp.array([5], jnp.int32))
    np.testing.assert_array_equal(np.asarray(checked_step(jnp.array([1], jnp.int32), jnp.array([3], jnp.int32))),
                                  [9, 10])


def test_auto_falls_back_to_reference_with_one_warning_without_the_triton_lowering(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)  # import now raises ImportError
    monkeypatch.setattr(_backend, "_warned", set())
    assert not _backend.backend_available("triton")
    r2t = np.arange(12, dtype=I32).reshape(2, 6)
    with pytest.warns(_backend.PallasBackendWarning, match="no Pallas triton lowering") as record:
        for _ in range(3):
            out = C.assign_extend_cache_locs_uniform(np.array([1], I32), r2t, np.array([2], I32), width=2,
                                                     interpret=True).out_cache_loc
            np.testing.assert_array_equal(np.asarray(out), [8, 9])
    assert len([w for w in record if issubclass(w.category, _backend.PallasBackendWarning)]) == 1
    with pytest.raises(ValueError, match="has none of the Pallas lowerings"):
        C.assign_extend_cache_locs_uniform(np.array([1], I32), r2t, np.array([2], I32), width=2,
                                           implementation="pallas", interpret=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on CPU without interpret: the reference is the plan there
        assert _backend.resolve_implementation("auto", False) == "reference"
