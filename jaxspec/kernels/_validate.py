"""Input validation shared by every public op (kernels, ops, models, engine).

It lives in the kernel layer, the lowest one that validates input, so ``jaxspec.kernels`` needs nothing
from the rest of the package; ``jaxspec._validate`` re-exports every name for the layers above.

Three tiers:
  (a) trace time: shapes and dtypes, ``ValueError`` naming the argument and what was expected;
  (b) concrete values: when an argument is a concrete (NumPy or committed JAX) array, int64 values are
      range-checked before they are narrowed to int32 -- never a silent truncation;
  (c) in-jit value checks behind the ``JAXSPEC_CHECKS`` switch (``checks_enabled()``), written with
      ``jax.experimental.checkify``.

Checked mode (``JAXSPEC_CHECKS=1`` or ``with jaxspec.checks():``) is a static argument of every jitted op
(``checks=``), so it is part of the jit cache key: a checked call after a plain one with the same shapes
retraces with the checks, and a plain call after a checked one reuses the plain trace.

* Eager calls (concrete inputs) check themselves: ``call_checked`` runs the op under ``checkify`` and raises
  ``checkify.JaxRuntimeError``; kernels that write in place run their checks in a separate program BEFORE
  the write (``_dispatch.py``), so a failed check never costs the donated buffer.
* Inside a caller's ``jax.jit`` the checks are ``checkify.check``s in the caller's program: functionalize the
  caller with ``checkify.checkify`` (or use ``checked(fn)``), and make the checks switch part of the caller's
  own jit key (trace it with the switch on, e.g. pass ``checks_enabled()`` as a static argument). In-place
  kernels then skip their write when a check fails (the buffer comes back unchanged with the error).
"""

import contextlib
import functools
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


def has_tracer(tree) -> bool:
    """Whether any leaf of ``tree`` is a tracer (the call is inside a caller's trace)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))


@functools.lru_cache(maxsize=None)
def _checkified(jitted, static_items):
    return jax.jit(checkify.checkify(functools.partial(jitted, checks=True, **dict(static_items))))


def call_checked(jitted, *args, **static):
    """Call ``jitted(*args, checks=..., **static)`` (``checks`` one of its static arguments) in the current mode.

    Checks off: the plain program. Checks on inside a trace: the checked program (the caller functionalizes).
    Checks on with concrete inputs: the checked program under ``checkify``; a failed check raises
    ``checkify.JaxRuntimeError``. Not for ops that donate buffers (``_dispatch.py`` checks those first).
    """
    if not checks_enabled():
        return jitted(*args, checks=False, **static)
    if has_tracer(args):
        return jitted(*args, checks=True, **static)
    err, out = _checkified(jitted, tuple(sorted(static.items())))(*args)
    if has_tracer(err):  # an outer (eager) checkify sees this call: leave the checks in its program
        return jitted(*args, checks=True, **static)
    err.throw()
    return out


def checked(fn):
    """``fn`` with checked mode on while it traces and its checks functionalized: a failed check raises
    ``checkify.JaxRuntimeError``. ``fn`` may be a caller's ``jax.jit`` function; trace it fresh (its cache does
    not know the switch) or give it the switch as a static argument."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with checks(True):
            err, out = checkify.checkify(fn)(*args, **kwargs)
        err.throw()
        return out

    return wrapper


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
    outside int32). Traced arrays: int8/int16/uint8/uint16 are widened; int64, uint32 and uint64 are
    refused (``ValueError``) since their values may not fit. Floats and bools are refused.
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
    # Traced: only integer dtypes whose every value fits in int32 are widened; wider or 32-bit unsigned
    # ones would wrap silently (uint32 3e9 -> negative), so they are refused at trace time.
    if dtype.itemsize > 4 or (dtype.itemsize == 4 and np.issubdtype(dtype, np.unsignedinteger)):
        raise ValueError(
            f"{name}: a traced {dtype} array may hold values outside int32 and jaxspec refuses to narrow it "
            f"silently; pass int32 inside jit (or a concrete array, which is range-checked on the host)"
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
