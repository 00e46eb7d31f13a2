"""The one module that knows which Pallas GPU backend jaxspec kernels lower through.

Today: the Pallas **Triton** lowering (deprecated upstream in jax 0.11, still the only GPU lowering
with vector-indexed gathers/scatters on Hopper; see shared platform notes). Every backend-specific
import lives here so a migration to Mosaic GPU touches this file only.

Kernels use:
  * ``pl`` (``jax.experimental.pallas``): ``pallas_call``, ``BlockSpec``, ``program_id``, ``ds``, ``when``;
  * ``load`` / ``store``: masked vector loads/stores on ``ref.at[...]`` (gathers/scatters);
  * ``compiler_params(num_warps=..., num_stages=...)`` for ``pallas_call(compiler_params=...)``.

Interpret-mode trap (CPU): masked-off lanes of a scatter still write back the old value; park masked
lanes on an out-of-range index or guard with ``pl.when``.
"""

import warnings

import jax
from jax.experimental import pallas as pl

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas import triton as _pltriton

load = _pltriton.load
store = _pltriton.store
atomic_add = getattr(_pltriton, "atomic_add", None)
# tl.debug_barrier: orders a program's loads before its stores (rotate_input_ids' in-segment shift).
debug_barrier = _pltriton.debug_barrier

BACKEND_NAME = "pallas-triton"


def compiler_params(*, num_warps: int = 4, num_stages: int = 1):
    """Backend compiler params for ``pallas_call``."""
    cls = getattr(_pltriton, "CompilerParams", None) or getattr(_pltriton, "TritonCompilerParams")
    return cls(num_warps=num_warps, num_stages=num_stages)


def gpu_available() -> bool:
    """True when the default JAX backend is a GPU (CUDA)."""
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:  # pragma: no cover
        return False


def resolve_implementation(implementation: str, interpret: bool) -> str:
    """Map ``"auto" | "pallas" | "reference"`` to the concrete implementation.

    ``"auto"`` picks Pallas on a GPU (or when ``interpret=True``) and the jnp reference elsewhere.
    An explicit ``"pallas"`` without a GPU and without ``interpret=True`` raises instead of silently
    falling back.
    """
    if implementation == "reference":
        return "reference"
    if implementation == "pallas":
        if not (interpret or gpu_available()):
            raise ValueError(
                "implementation='pallas' needs a CUDA GPU or interpret=True (no silent fallback); "
                "use implementation='reference' or 'auto' on CPU"
            )
        return "pallas"
    if implementation == "auto":
        return "pallas" if (interpret or gpu_available()) else "reference"
    raise ValueError(f"implementation: expected 'auto', 'pallas' or 'reference', got {implementation!r}")


__all__ = ["pl", "load", "store", "atomic_add", "debug_barrier", "compiler_params", "gpu_available", "resolve_implementation"]
