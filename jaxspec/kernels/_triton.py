"""The Pallas **Triton** backend: every ``jax.experimental.pallas.triton`` import lives here.

The Triton lowering is deprecated upstream (jax 0.11) but is still the only Pallas GPU lowering with
vector-indexed gathers/scatters on Hopper (shared platform notes). This module imports even when the
installed jax no longer ships it: ``AVAILABLE`` is then False and ``kernels._backend`` resolves
``implementation="auto"`` to the jnp reference (one warning); the helpers below raise only when a
kernel body is actually traced.

Kernels use:
  * ``load`` / ``store``: masked vector loads/stores on ``ref.at[...]`` (gathers/scatters);
  * ``debug_barrier``: orders a program's loads before its stores (``rotate_input_ids``' shift);
  * ``compiler_params(num_warps=..., num_stages=...)`` for ``pallas_call(compiler_params=...)``.

Interpret-mode trap (CPU): masked-off lanes of a scatter still write back the old value; park masked
lanes on an out-of-range index or guard with ``pl.when``.
"""

import importlib
import warnings

LOWERING_MODULE = "jax.experimental.pallas.triton"


def lowering():
    """The ``jax.experimental.pallas.triton`` module, or None when the installed jax has none."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(LOWERING_MODULE)
    except ImportError:
        return None


def _require():
    mod = lowering()
    if mod is None:
        raise RuntimeError(f"the Pallas Triton lowering ({LOWERING_MODULE}) is not in this jax install")
    return mod


def load(ref, *, mask=None, other=None):
    return _require().load(ref, mask=mask, other=other)


def store(ref, val, *, mask=None):
    return _require().store(ref, val, mask=mask)


def debug_barrier():
    return _require().debug_barrier()


def compiler_params(*, num_warps: int = 4, num_stages: int = 1):
    """Triton compiler params for ``pallas_call(compiler_params=...)``."""
    mod = _require()
    cls = getattr(mod, "CompilerParams", None) or getattr(mod, "TritonCompilerParams")
    return cls(num_warps=num_warps, num_stages=num_stages)


__all__ = ["LOWERING_MODULE", "compiler_params", "debug_barrier", "load", "lowering", "store"]
