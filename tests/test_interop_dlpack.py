"""jaxspec.interop.dlpack: exact torch <-> JAX exchange (copies, int64 carried or refused, layouts)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jaxspec.interop import dlpack  # noqa: E402

pytestmark = pytest.mark.interop


def _x64():
    """``jax.enable_x64(True)`` (jax >= 0.10) or the older ``jax.experimental.enable_x64()``."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # pragma: no cover - older jax

    return enable_x64()


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy() if t.dtype != torch.bool else t.numpy()


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.bool, torch.bfloat16, torch.float16, torch.float32, torch.uint8, torch.int8]
)
def test_round_trip_exact(dtype):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        t = torch.rand(5, 7, generator=g) > 0.5
    elif dtype.is_floating_point:
        t = torch.randn(5, 7, generator=g).to(dtype)
    else:
        t = torch.randint(-100 if dtype.is_signed else 0, 100, (5, 7), generator=g, dtype=dtype)
    x = dlpack.to_jax(t, name="t")
    assert x.shape == (5, 7)
    assert x.dtype == jnp.dtype(str(t.dtype).removeprefix("torch."))
    back = dlpack.to_torch(x)
    assert back.dtype == t.dtype and back.shape == t.shape
    np.testing.assert_array_equal(_bits(back), _bits(t))


def test_int64_out_of_int32_range_refused_without_x64():
    assert not dlpack.x64_enabled()
    t = torch.tensor([1, 2**40 + 3, 5], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"seq_lens: int64 tensor holds values .*outside int32.*enable_x64"):
        dlpack.to_jax(t, name="seq_lens")
    with pytest.raises(ValueError, match="neg"):
        dlpack.to_jax(torch.tensor([-(2**31) - 1]), name="neg")


def test_int64_in_range_narrowed_to_int32_without_x64():
    t = torch.tensor([[0, -5], [2**31 - 1, -(2**31)]], dtype=torch.int64)
    x = dlpack.to_jax(t)
    assert x.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(x), t.numpy())
    assert dlpack.to_jax(torch.zeros((0, 3), dtype=torch.int64)).dtype == jnp.int32


def test_int64_above_2_31_survives_round_trip_with_x64():
    vals = [0, 2**31, 2**40 + 3, -(2**62), 2**63 - 1]
    t = torch.tensor(vals, dtype=torch.int64)
    with _x64():
        assert dlpack.x64_enabled()
        x = dlpack.to_jax(t)
        assert x.dtype == jnp.int64
        np.testing.assert_array_equal(np.asarray(x), np.array(vals, np.int64))
        back = dlpack.to_torch(x)
    assert back.dtype == torch.int64
    assert back.tolist() == vals


@pytest.mark.parametrize("view", ["transpose", "step", "offset", "expand"])
def test_non_contiguous_and_misaligned_views(view):
    base = torch.arange(4 * 6, dtype=torch.int32).reshape(4, 6)
    t = {"transpose": base.t(), "step": base[:, ::2], "offset": base.reshape(-1)[1:], "expand":
         torch.arange(3, dtype=torch.int32)[:, None].expand(3, 4)}[view]
    x = dlpack.to_jax(t)
    np.testing.assert_array_equal(np.asarray(x), t.contiguous().numpy())
    y = dlpack.to_jax(t, copy=False)  # still made contiguous / aligned, values identical
    np.testing.assert_array_equal(np.asarray(y), t.contiguous().numpy())


def test_copies_do_not_alias():
    t = torch.arange(8, dtype=torch.int32)
    x = dlpack.to_jax(t)
    t[0] = 99  # torch writes after the exchange do not reach the JAX array
    assert int(x[0]) == 0
    back = dlpack.to_torch(x)
    back[1] = 77  # ... and torch writes to the returned tensor do not reach JAX memory
    assert int(x[1]) == 1
    # copy=False is the documented zero-copy escape hatch (aliasing is then the caller's business)
    z = dlpack.to_jax(t, copy=False)
    assert int(z[0]) == 99


def test_tree_helpers_and_type_errors():
    tree = {"a": torch.ones(2, dtype=torch.int32), "b": [torch.zeros(1, dtype=torch.bool), 3], "c": None}
    j = dlpack.tree_to_jax(tree)
    assert isinstance(j["a"], jax.Array) and isinstance(j["b"][0], jax.Array) and j["b"][1] == 3
    back = dlpack.tree_to_torch(j)
    assert torch.equal(back["a"], tree["a"]) and back["c"] is None
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        dlpack.to_jax(np.zeros(3), name="x")


def test_grad_tensor_detached():
    t = torch.ones(3, requires_grad=True)
    np.testing.assert_array_equal(np.asarray(dlpack.to_jax(t)), np.ones(3, np.float32))

