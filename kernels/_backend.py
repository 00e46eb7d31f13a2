"""Which implementation a kernel call runs: ``"auto" | "pallas" | "reference"`` -> ``"pallas"`` or ``"reference"``.

Backend-specific Pallas imports live in one module per backend (``_triton.py``; a Mosaic GPU module
registers the same way). ``BACKENDS`` maps a backend name to the module whose ``lowering()`` says whether
the installed jax has it. A kernel names the backend(s) its Pallas path is written for
(``backends=("triton",)``); resolution picks the first one present.

Rules:
  * ``"reference"``: the pure-jnp reference, always;
  * ``"pallas"``: a CUDA GPU (or ``interpret=True``) and one of the kernel's backends in this jax; else
    ``ValueError`` saying which is missing (no silent fallback);
  * ``"auto"``: Pallas on a GPU (or with ``interpret=True``) when one of the kernel's backends is
    present; the reference elsewhere. When a GPU / interpret is there but no backend is, it falls back
    to the reference with one ``PallasBackendWarning`` per backend set and process.
"""

import importlib
import warnings

import jax

# backend name -> module (under jaxspec.kernels) exposing ``lowering()`` (None when absent)
BACKENDS = {"triton": "jaxspec.kernels._triton", "mosaic_gpu": "jaxspec.kernels._mosaic_gpu"}
IMPLEMENTATIONS = ("auto", "pallas", "reference")

_warned: set = set()


class PallasBackendWarning(UserWarning):
    """``implementation="auto"`` fell back to the jnp reference: no Pallas backend of the kernel in this jax."""


def gpu_available() -> bool:
    """True when the default JAX backend is a GPU (CUDA)."""
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:  # pragma: no cover
        return False


def backend_available(name: str) -> bool:
    """Whether the installed jax has the Pallas lowering of backend ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown Pallas backend {name!r}; known: {sorted(BACKENDS)}")
    try:
        mod = importlib.import_module(BACKENDS[name])
    except ImportError:
        return False
    return mod.lowering() is not None


def pick_backend(backends=("triton",)) -> str | None:
    """The first of ``backends`` present in this jax, or None."""
    return next((b for b in backends if backend_available(b)), None)


def resolve_implementation(implementation: str, interpret: bool, *, backends=("triton",)) -> str:
    """Map ``"auto" | "pallas" | "reference"`` to ``"pallas"`` or ``"reference"`` (module docstring)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: expected 'auto', 'pallas' or 'reference', got {implementation!r}")
    if implementation == "reference":
        return "reference"
    device_ok = interpret or gpu_available()
    if implementation == "pallas":
        if not device_ok:
            raise ValueError(
                "implementation='pallas' needs a CUDA GPU or interpret=True (no silent fallback); "
                "use implementation='reference' or 'auto' on CPU"
            )
        if pick_backend(backends) is None:
            raise ValueError(
                f"implementation='pallas': this jax {jax.__version__} has none of the Pallas lowerings this kernel "
                f"is written for ({', '.join(backends)}); use implementation='reference' or 'auto'"
            )
        return "pallas"
    if not device_ok:
        return "reference"
    if pick_backend(backends) is None:
        key = tuple(backends)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"jaxspec: jax {jax.__version__} has no Pallas {'/'.join(backends)} lowering; implementation='auto' "
                f"runs the jnp reference kernels instead (same results, slower)",
                PallasBackendWarning,
                stacklevel=3,
            )
        return "reference"
    return "pallas"


__all__ = ["BACKENDS", "PallasBackendWarning", "backend_available", "gpu_available", "pick_backend",
           "resolve_implementation"]
