"""move_kv_cache buckets the pair count: 5..8 pairs share one executable, the padding pairs
move nothing in either implementation, and checked mode does not mistake them for out-of-range slots."""

import numpy as np
import pytest

import jax.numpy as jnp

import jaxspec
from jaxspec.kernels import kv_move


def _pool(seed, layers=2, slots=40, feat=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((layers, slots, feat)).astype(np.float32)


def _pairs(rng, n, slots=40):
    perm = rng.permutation(np.arange(1, slots))
    return perm[:n].astype(np.int32), perm[n:2 * n].astype(np.int32)  # distinct targets and sources


@pytest.mark.parametrize("impl", [dict(implementation="reference"), dict(implementation="pallas", interpret=True)])
def test_pair_counts_share_one_executable_and_move_exactly(impl):
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**31))
    kv_move._MOVE._jit.clear_cache()
    for n in (5, 6, 7, 8):
        k, v = _pool(n), _pool(n + 100)
        tgt, src = _pairs(rng, n)
        want_k, want_v = k.copy(), v.copy()
        want_k[:, tgt], want_v[:, tgt] = k[:, src], v[:, src]
        out = kv_move.move_kv_cache(jnp.asarray(k), jnp.asarray(v), tgt, src, **impl)
        np.testing.assert_array_equal(np.asarray(out.k_buffer), want_k)  # untouched slots untouched, pads dropped
        np.testing.assert_array_equal(np.asarray(out.v_buffer), want_v)
    assert kv_move._MOVE._jit._cache_size() == 1  # one bucket (8 pairs) for 5, 6, 7 and 8 pairs


def test_checked_mode_ignores_bucket_padding_but_flags_real_out_of_range():
    rng = np.random.default_rng(3)
    tgt, src = _pairs(rng, 5)
    with jaxspec.checks():
        out = kv_move.move_kv_cache(jnp.asarray(_pool(1)), jnp.asarray(_pool(2)), tgt, src,
                                    implementation="reference")
        assert out.k_buffer.shape == (2, 40, 8)
        bad = tgt.copy()
        bad[2] = -1
        with pytest.raises(Exception, match="tgt_loc out of range"):
            kv_move.move_kv_cache(jnp.asarray(_pool(1)), jnp.asarray(_pool(2)), bad, src, implementation="reference")
