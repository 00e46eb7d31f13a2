"""The one kernel dispatch convention of ``jaxspec.kernels`` and the small helpers every kernel shares.

A public kernel op is written as

1. **validate** (eager, host side): dtypes and shapes at trace time, concrete wide-integer inputs
   range-checked before they become int32 (``_validate.py``);
2. **resolve** ``implementation`` (``_backend.resolve_implementation``: ``"reference"`` or the Pallas backend
   that runs, e.g. ``"triton"``);
3. **one jitted implementation**, a ``KernelOp``, keyed on the static config, the resolved
   implementation, ``interpret`` and the checked-mode switch ``checks``.

``KernelOp(name, impl, static=..., donate=..., checks=..., unchanged=...)`` holds that jitted function.
``impl(*arrays, implementation, interpret, **static)`` is the op (both implementations behind one switch);
``checks(*arrays, **static)`` returns the op's in-jit value checks as ``(predicate, message)`` pairs.

Checked mode (``jaxspec.checks()`` / ``JAXSPEC_CHECKS=1``):

* concrete inputs: the checks run first, as their own (non-donating) program under ``checkify``; a failed
  check raises ``checkify.JaxRuntimeError`` before the op runs, so a donated buffer is never lost and
  nothing is written; then the plain program runs;
* traced inputs (the op inside a caller's ``jax.jit``): the checks are ``checkify.check``s in the caller's
  program (functionalize it with ``checkify.checkify`` or ``jaxspec.checked``), and an in-place op
  (``unchanged`` given) runs under ``lax.cond`` on the checks: when one fails the buffers come back
  unchanged -- nothing is written.
"""

import functools
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import checkify

from jaxspec.kernels import _validate
from jaxspec.kernels import _backend
from jaxspec.kernels._backend import Implementation

_FIXED_STATIC = ("implementation", "interpret", "checks")


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``): Triton block shapes are powers of two."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a, b):
    """Ceiling division, for Python ints and traced int32 alike."""
    return (a + b - 1) // b


def _emit(checks: Iterable[tuple]) -> jax.Array:
    """``checkify.check`` every ``(pred, msg)`` pair; returns the conjunction of the predicates."""
    ok = jnp.bool_(True)
    for pred, msg in checks:
        pred = jnp.all(pred)
        checkify.check(pred, msg)
        ok = ok & pred
    return ok


class KernelOp:
    """One jitted kernel implementation (module docstring). Call it with the arrays, the static config as
    keywords, ``implementation`` (any ``Implementation``; resolved here) and ``interpret``. ``impl`` receives the
    resolved one: ``"reference"`` or a backend of ``backends``."""

    def __init__(
        self,
        name: str,
        impl: Callable,
        *,
        static: tuple[str, ...] = (),
        donate: tuple[int, ...] = (),
        checks: Callable | None = None,
        unchanged: Callable | None = None,
        backends: tuple[str, ...] = ("triton",),
    ):
        self.name = name
        self.impl = impl
        self.static = tuple(static)
        self.checks = checks
        self.unchanged = unchanged
        self.backends = tuple(backends)
        self._jit = jax.jit(self._run, static_argnames=self.static + _FIXED_STATIC, donate_argnums=tuple(donate))
        functools.update_wrapper(self, impl)

    def _run(self, *arrays, implementation, interpret, checks, **static):
        def op(args):
            return self.impl(*args, implementation=implementation, interpret=interpret, **static)

        if not checks or self.checks is None:
            return op(arrays)
        ok = _emit(self.checks(*arrays, **static))
        if self.unchanged is None:
            return op(arrays)
        return lax.cond(ok, op, lambda args: self.unchanged(*args), arrays)

    @functools.lru_cache(maxsize=None)  # noqa: B019 -- one checker per (op, static config); ops live forever
    def _checker(self, static_items):
        static = dict(static_items)
        return jax.jit(checkify.checkify(lambda *arrays: _emit(self.checks(*arrays, **static))))

    def resolve(self, implementation: Implementation, interpret: bool, *, unsupported=None) -> str:
        """``_backend.resolve_implementation`` over this op's backends; ``unsupported(backend)``: why the kernel
        cannot take this particular call (a sentence), or None."""
        return _backend.resolve_implementation(implementation, interpret, backends=self.backends,
                                               unsupported=unsupported)

    def __call__(self, *arrays, implementation: Implementation = "auto", interpret: bool = False, **static):
        impl = self.resolve(implementation, interpret)
        checks = _validate.checks_enabled() and self.checks is not None
        if checks and not _validate.has_tracer(arrays):
            err, _ = self._checker(tuple(sorted(static.items())))(*arrays)
            if not _validate.has_tracer(err):  # else an outer (eager) checkify sees this call: checks in-program
                err.throw()  # before the op runs: nothing written, nothing donated
                checks = False
        return self._jit(*arrays, implementation=impl, interpret=interpret, checks=checks, **static)


__all__ = ["KernelOp", "cdiv", "next_pow2"]
