"""Which implementation a kernel call runs: the one resolver of ``implementation=`` for every kernel.

``Implementation`` names what a caller may ask for: ``"auto"``, ``"pallas"``, ``"reference"`` (the pure-jnp
reference), or one Pallas kernel by its backend, ``"triton"`` or ``"mosaic"``. Backend-specific Pallas imports
live in one module per backend (``_triton.py``, ``_mosaic_gpu.py``); ``BACKENDS`` maps a backend name to the
module whose ``lowering()`` says whether the installed jax has it. A kernel names the backends its Pallas
code is written for, in order of preference (``backends=("triton",)``; paged attention
``("mosaic", "triton")``), and may say why one of them cannot take a given call (``unsupported=``: dtype,
head size, shared memory). ``resolve_implementation`` returns ``"reference"`` or the backend that runs.

A backend can run a call when the device has it (a CUDA GPU; for ``"mosaic"`` a Hopper one, compute
capability >= 9.0; or ``interpret=True``), the installed jax has its lowering, and the kernel supports the
call. Rules:

  * ``"reference"``: the reference, always;
  * ``"triton"`` / ``"mosaic"``: that kernel, or ``ValueError`` saying why it cannot run;
  * ``"pallas"``: the first of the kernel's backends that can run; else ``ValueError`` (no silent fallback);
  * ``"auto"``: no GPU and no ``interpret``: the reference. Otherwise the first backend that can run (when
    interpreting, only the backends whose interpreter is quick enough: ``AUTO_WHEN_INTERPRETING``), else
    the reference. When a backend was left out only because this jax lacks its lowering, the fallback
    says so with one ``PallasBackendWarning`` per backend set and process.
"""

import importlib
import os
import re
import typing
import warnings
from collections.abc import Callable
from typing import Literal

import jax

Implementation = Literal["auto", "pallas", "reference", "mosaic", "triton"]
IMPLEMENTATIONS: tuple[str, ...] = typing.get_args(Implementation)

# backend name -> module (under jaxspec.kernels) exposing ``lowering()`` (None when absent)
BACKENDS = {"triton": "jaxspec.kernels._triton", "mosaic": "jaxspec.kernels._mosaic_gpu"}
# whether ``auto`` with ``interpret=True`` may pick the backend (the Mosaic GPU interpreter is ~50x slower than
# the Triton one: CPU tests name ``"mosaic"`` explicitly)
AUTO_WHEN_INTERPRETING = {"triton": True, "mosaic": False}

_warned: set = set()


class PallasBackendWarning(UserWarning):
    """``implementation="auto"`` fell back to the jnp reference: no Pallas backend of the kernel in this jax."""


def gpu_available() -> bool:
    """True when the default JAX backend is a GPU (CUDA)."""
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:  # pragma: no cover
        return False


def hopper_available() -> bool:
    """True when the default device is an NVIDIA GPU of compute capability >= 9.0 (wgmma + TMA)."""
    try:
        if not gpu_available():
            return False
        return float(getattr(jax.devices()[0], "compute_capability", "0")) >= 9.0
    except (RuntimeError, ValueError):  # pragma: no cover
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


def _device_has(backend: str, interpret: bool) -> bool:
    if interpret:
        return True
    return hopper_available() if backend == "mosaic" else gpu_available()


def resolve_implementation(
    implementation: Implementation,
    interpret: bool,
    *,
    backends: tuple[str, ...] = ("triton",),
    unsupported: Callable[[str], str | None] | None = None,
) -> str:
    """``"reference"`` or the backend (one of ``backends``) that runs this call (module docstring).

    ``unsupported(backend)``: why that backend's kernel cannot take this call (a sentence), or None."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: expected one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "reference":
        return "reference"
    if implementation in BACKENDS and implementation not in backends:
        have = ", ".join(backends) or "none"
        raise ValueError(f"implementation={implementation!r}: this kernel has no {implementation} kernel "
                         f"(its Pallas kernels: {have}); use 'auto', 'pallas' or 'reference'")

    def why_not(b: str) -> tuple[str, str | None]:
        """(kind, reason): kind 'device' / 'lowering' / 'call'; reason None when ``b`` can run."""
        if not _device_has(b, interpret):
            gpu = "a Hopper GPU (compute capability >= 9.0)" if b == "mosaic" else "a CUDA GPU"
            return "device", f"needs {gpu} or interpret=True"
        if not backend_available(b):
            return "lowering", f"this jax {jax.__version__} has no Pallas {b} lowering"
        reason = unsupported(b) if unsupported is not None else None
        return "call", reason

    if implementation in BACKENDS:
        _, reason = why_not(implementation)
        if reason is not None:
            raise ValueError(f"implementation={implementation!r}: {implementation} kernel {reason}")
        return implementation
    if implementation == "pallas":
        reasons = {}
        for b in backends:
            kind, reason = why_not(b)
            if reason is None:
                return b
            reasons[b] = (kind, reason)
        if not backends or all(kind == "lowering" for kind, _ in reasons.values()):
            raise ValueError(
                f"implementation='pallas': this jax {jax.__version__} has none of the Pallas lowerings this kernel "
                f"is written for ({', '.join(backends) or 'none'}); use implementation='reference' or 'auto'")
        if all(kind == "device" for kind, _ in reasons.values()):
            raise ValueError("implementation='pallas' needs a CUDA GPU or interpret=True (no silent fallback); "
                             "use implementation='reference' or 'auto' on CPU")
        detail = "; ".join(f"{b}: {r}" for b, (_, r) in reasons.items())
        raise ValueError(f"implementation='pallas': no Pallas kernel can take this call ({detail})")
    # auto
    if not (interpret or gpu_available()):
        return "reference"
    missing = []
    for b in backends:
        if interpret and not AUTO_WHEN_INTERPRETING[b]:
            continue
        kind, reason = why_not(b)
        if reason is None:
            return b
        if kind == "lowering":
            missing.append(b)
    if missing:
        key = tuple(backends)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"jaxspec: jax {jax.__version__} has no Pallas {'/'.join(missing)} lowering; implementation='auto' "
                f"runs the jnp reference kernels instead (same results, slower)",
                PallasBackendWarning,
                stacklevel=3,
            )
    return "reference"


# XLA:CPU option that keeps YNNPACK from fusing elementwise and reduction work (its fused kernels round exp,
# rsqrt and friends differently in their vector body and their tail, so a row's result follows the shape)
CPU_INVARIANT_FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def batch_invariance_blocker() -> str | None:
    """Why this backend cannot run batch-invariant forwards as configured (a sentence), or None when it can.
    XLA:GPU can. XLA:CPU needs YNNPACK fusions off, ``XLA_FLAGS`` holding ``CPU_INVARIANT_FLAG`` with an empty
    value, set before jax starts (measured with jaxlib 0.10: ``exp(s - max(s))`` over a 128-wide row differs in
    the last bit between a ``[3, 6, 2, 2, 128]`` array and its ``[3, 1, 2, 2, 128]`` slice)."""
    if jax.default_backend() != "cpu":
        return None
    values = re.findall(r"--xla_cpu_experimental_ynn_fusion_type=(\S*)", os.environ.get("XLA_FLAGS", ""))
    if values and values[-1] == "":
        return None
    return (f"XLA:CPU computes a row differently by the shape while YNNPACK fuses elementwise work; set "
            f"XLA_FLAGS='{CPU_INVARIANT_FLAG}' before jax starts")


__all__ = ["AUTO_WHEN_INTERPRETING", "BACKENDS", "CPU_INVARIANT_FLAG", "IMPLEMENTATIONS", "Implementation",
           "PallasBackendWarning", "backend_available", "batch_invariance_blocker", "gpu_available",
           "hopper_available", "resolve_implementation"]
