"""jaxspec.ops.draft.fast_topk: the argmax form of K > 1 gives lax.top_k's values and indices exactly, ties
(lower index first), signed zeros, infinities, NaN and subnormals included; K == 1 and non-f32 dtypes too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec.ops.draft import fast_topk

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, 2.5, 2.5, -2.5],
                    np.float32)


def _same(ours, ref):
    (v, i), (rv, ri) = ours, ref
    assert i.dtype == jnp.int32 and i.shape == ri.shape
    np.testing.assert_array_equal(np.asarray(i), np.asarray(ri))
    # bit patterns: -0.0 and +0.0 (and NaN payloads) must come back as they were
    np.testing.assert_array_equal(np.asarray(v).view(np.int32), np.asarray(rv).view(np.int32))


@settings(max_examples=60)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(8, 300), k=st.integers(2, 8), kind=st.sampled_from(
    ["normal", "ties", "specials", "softmax"]))
def test_equals_lax_top_k(seed, n, k, kind):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 5)), n)
    if kind == "normal":
        x = rng.standard_normal(shape).astype(np.float32)
    elif kind == "ties":
        x = rng.integers(-2, 3, size=shape).astype(np.float32)
    elif kind == "specials":
        x = rng.choice(SPECIALS, size=shape)
    else:
        x = np.asarray(jax.nn.softmax(jnp.asarray(rng.standard_normal(shape) * 4, jnp.float32), axis=-1))
    _same(jax.jit(fast_topk, static_argnums=1)(x, k), jax.lax.top_k(x, k))


def test_leading_axes_and_k_equal_to_the_axis():
    x = np.random.default_rng(1).integers(0, 3, size=(2, 3, 6)).astype(np.float32)
    _same(fast_topk(x, 6), jax.lax.top_k(x, 6))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.int32])
def test_other_dtypes_are_lax_top_k(dtype):
    x = jnp.asarray(np.random.default_rng(2).integers(-4, 4, size=(3, 40)), dtype)
    v, i = fast_topk(x, 4)
    rv, ri = jax.lax.top_k(x, 4)
    assert v.dtype == dtype and i.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(i), np.asarray(ri))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(rv))


def test_k1_is_the_first_maximum():
    x = jnp.asarray([[1.0, 3.0, 3.0, -1.0]], jnp.float32)
    v, i = fast_topk(x, 1)
    assert i.tolist() == [[1]] and v.tolist() == [[3.0]]
