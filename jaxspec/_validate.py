"""Input validation shared by every public op.

Three tiers (see docs in README):
  (a) trace time: shapes and dtypes, ``ValueError`` naming the argument and what was expected;
  (b) concrete values: when an argument is a concrete (NumPy or committed JAX) array, int64 values are
      range-checked before they are narrowed to int32 -- never a silent truncation;
  (c) in-jit value checks behind the ``JAXSPEC_CHECKS`` switch (``checks_enabled()``), written with
      ``jax.experimental.checkify``: wrap the caller in ``checkify.checkify`` to receive them.
"""

import contextlib
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

INT32_MIN = int(np.iinfo(np.int32).min)
INT32_MAX = int(np.iinfo(np.int32).max)

_CHECKS = [os.environ.get("JAXSPEC_CHECKS", "0") not in ("", "0", "false", "False")]


def checks_enabled() -> bool:
    """Whether in-jit value checks (tier c) are traced into jaxspec functions."""
    return _CHECKS[0]


@contextlib.contextmanager
def checks(enabled: bool = True):
    """Context manager turning in-jit checks on/off while tracing (``JAXSPEC_CHECKS=1`` sets the default)."""
    old = _CHECKS[0]
    _CHECKS[0] = enabled
    try:
        yield
    finally:
        _CHECKS[0] = old


def check(pred, msg: str, *fmt_args):
    """Tier-(c) check: a no-op unless checks are enabled; then a ``checkify.check``."""
    if checks_enabled():
        checkify.check(pred, msg, *fmt_args)


def _is_concrete(x) -> bool:
    if isinstance(x, (np.ndarray, np.generic, int, list, tuple)):
        return True
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return True
    return False


def _dtype_of(x) -> np.dtype:
    # Never evaluate np.asarray on a tracer (it raises); tracers and arrays carry .dtype.
    dt = getattr(x, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(x).dtype


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_shape(name: str, x, expected: Sequence[int | None]):
    """Raise ``ValueError`` unless ``x.shape`` matches ``expected`` (``None`` = any size)."""
    shape = tuple(np.shape(x))
    ok = len(shape) == len(expected) and all(e is None or e == s for s, e in zip(shape, expected))
    if not ok:
        exp = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ("," if len(expected) == 1 else "") + ")"
        raise ValueError(f"{name}: expected shape {exp}, got {name}.shape={_shape_str(shape)}")


def index_array(name: str, x, shape: Sequence[int | None] | None = None, *, allow_none: bool = False):
    """Validate an integer index/token array and return it as int32 JAX array.

    int32 passes through. int64 (and other integer dtypes) is narrowed only after a value check:
    concrete arrays are checked on the host (``ValueError`` naming the argument if any value falls
    outside int32); a traced int64 array (x64 mode inside jit) is narrowed with a tier-(c) check.
    Floats and bools are refused.
    """
    if x is None:
        if allow_none:
            return None
        raise ValueError(f"{name}: expected an integer array, got None")
    dtype = _dtype_of(x)
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"{name}: expected an integer dtype (int32, or int64 within int32 range), got {dtype}")
    if shape is not None:
        check_shape(name, x, shape)
    if dtype == np.int32:
        return x if isinstance(x, jax.core.Tracer) else jnp.asarray(x)
    if _is_concrete(x):
        arr = np.asarray(x)
        if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
            bad = arr[(arr < INT32_MIN) | (arr > INT32_MAX)].reshape(-1)[0]
            raise ValueError(
                f"{name}: {dtype} value {int(bad)} does not fit in int32; jaxspec carries indices as int32 "
                f"and refuses to truncate"
            )
        return jnp.asarray(arr.astype(np.int32))
    # Traced wide integer (only possible with jax_enable_x64): narrow with an opt-in in-jit check.
    check(
        jnp.all((x >= INT32_MIN) & (x <= INT32_MAX)),
        f"{name}: {dtype} value does not fit in int32",
    )
    return x.astype(jnp.int32)


def float_array(name: str, x, shape: Sequence[int | None] | None = None, dtypes=(np.float32,)):
    """Validate a float array's dtype and shape; returns it as a JAX array."""
    dtype = _dtype_of(x)
    if dtype not in [np.dtype(d) for d in dtypes]:
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise ValueError(f"{name}: expected dtype {names}, got {dtype}")
    if shape is not None:
        check_shape(name, x, shape)
    return jnp.asarray(x)


def static_int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    """Validate a static Python int argument's range."""
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ValueError(f"{name}: expected a Python int, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{name}: expected >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name}: expected <= {hi}, got {v}")
    return v
