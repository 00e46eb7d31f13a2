"""The one module holding jaxspec's Mosaic GPU (``plgpu``) Pallas imports.

Mosaic GPU is the supported Pallas lowering on NVIDIA GPUs (the Triton lowering, in ``jaxspec/kernels/_triton.py``,
is deprecated since jax 0.11). ``jaxspec/kernels/_backend.py`` registers this module as backend ``"mosaic"``. Kernels written against it use:

* ``pl`` (``jax.experimental.pallas``): ``ds``, ``when``, ``run_scoped``, ``run_state``, ``cdiv``;
* ``plgpu`` (``jax.experimental.pallas.mosaic_gpu``): ``kernel``, ``SMEM``, ``Barrier``, ``wgmma``,
  ``copy_gmem_to_smem`` / ``copy_smem_to_gmem``, ``Layout``, ``TilingTransform``, ``SwizzleTransform``;
* ``interpret_params()``: the GPU interpreter's parameters (runs a Mosaic GPU kernel on CPU), or
  ``None`` where this jax has no GPU interpreter.

The API is the same in jax 0.10.2 (CPU) and 0.11.x (H200) for what jaxspec uses (``plgpu.kernel``
with ``out_type=`` / ``scratch_types=``).
"""

from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


def lowering():
    """The ``jax.experimental.pallas.mosaic_gpu`` module (``kernels._backend``'s registry asks each backend)."""
    return plgpu


def interpret_params():
    """``InterpretGPUParams()`` for ``plgpu.kernel(interpret=...)`` (CPU), or ``None`` if unavailable.

    The only ``jax._src`` import in jaxspec's kernels: jax 0.10 / 0.11 export no public name for the Mosaic GPU
    interpreter's parameters (tests/test_architecture.py allows exactly this one). Without it the Mosaic kernel's
    CPU tests skip; the GPU path does not need it."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:  # pragma: no cover - older jax
        return None
    return InterpretGPUParams()


__all__ = ["pl", "plgpu", "interpret_params", "lowering"]
