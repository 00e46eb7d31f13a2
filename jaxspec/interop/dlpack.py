"""torch <-> JAX exchange through DLPack, with the boundary rules the interop layer relies on.

Rules (measured with torch 2.13 CPU / jax 0.10.2 and torch 2.11 CUDA / jax 0.11.2 on an H200):

* **Copy by default.** ``to_jax(t)`` and ``to_torch(x)`` return arrays that share no memory with their
  input. Aliasing across the boundary is undefined in both directions: JAX writes never flow back into
  a torch tensor (JAX arrays are immutable; an in-place-looking JAX update makes a new buffer), torch's
  later in-place writes to an imported buffer are unordered with respect to JAX (undefined behaviour for
  the JAX array), and a JAX buffer exported to torch cannot be donated while torch holds it ("Donation
  requested for buffer with external reference"). ``copy=False`` gives the zero-copy view for callers
  that promise not to mutate or donate; note that ``jax.dlpack.from_dlpack(t, copy=True)`` does *not*
  copy on CPU with jax 0.10.2 (checked), so the copy here is made explicitly on the torch side.
* **int64 is carried exactly or refused.** SGLang keeps tree arrays and cache locations in int64.
  With ``jax_enable_x64`` on (``with jax.enable_x64(True):``), int64 tensors arrive as int64. With it
  off, JAX would canonicalise int64 to int32 and silently wrap values (``2**40 + 3`` arrives as ``3``);
  instead ``to_jax`` range-checks the tensor: in-range values are narrowed to int32 explicitly (all of
  jaxspec's integer outputs are int32 anyway), out-of-range values raise ``ValueError`` naming the
  tensor. The range check reads the tensor's min/max (a host sync on CUDA; this is a test boundary).
* **Non-contiguous tensors are made contiguous** (JAX accepts only compact strides; older versions gave
  silently wrong results for others). Views whose data pointer is not 64-byte aligned are copied too.
* **Stream ordering on CUDA.** ``to_jax`` synchronises torch's current stream of the tensor's device
  before export, so every torch kernel that produced ``t`` has finished before JAX reads it (the DLPack
  stream handshake covers the conversion itself, but not copies made on another stream). ``to_torch``
  waits for the JAX array to be ready (``block_until_ready``) before handing it to torch.

This module imports torch; it is only imported by ``jaxspec.interop`` (never by ``import jaxspec``).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

__all__ = ["to_jax", "to_torch", "x64_enabled", "tree_to_jax", "tree_to_torch"]

_INT32_MIN = int(np.iinfo(np.int32).min)
_INT32_MAX = int(np.iinfo(np.int32).max)
_ALIGN_BYTES = 64  # XLA's CPU/GPU buffer alignment; misaligned views would be copied by JAX anyway


def x64_enabled() -> bool:
    """Whether JAX currently keeps 64-bit integers (honours ``jax.enable_x64(...)`` contexts)."""
    return jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)


def _sync_torch(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()


def _narrow_int64(t: torch.Tensor, name: str) -> torch.Tensor:
    """int64 -> int32 when every value fits, else ValueError naming the tensor (never a silent wrap)."""
    if t.numel() == 0:
        return t.to(torch.int32)
    lo, hi = int(t.min()), int(t.max())
    if lo < _INT32_MIN or hi > _INT32_MAX:
        raise ValueError(
            f"{name}: int64 tensor holds values in [{lo}, {hi}], outside int32; JAX has jax_enable_x64 off "
            f"and would truncate them. Enable x64 (`with jax.enable_x64(True):` or "
            f"jax.config.update('jax_enable_x64', True)) to carry int64 exactly."
        )
    return t.to(torch.int32)


def to_jax(t: torch.Tensor, *, copy: bool = True, name: str = "tensor") -> jax.Array:
    """Convert a torch tensor to a JAX array on the same device.

    Args:
      t: the tensor (any layout; non-contiguous tensors are made contiguous).
      copy: True (default) returns an array sharing no memory with ``t``. False imports zero-copy where
        DLPack allows it (the caller must then neither mutate ``t`` nor rely on JAX writes reaching it).
      name: used in error messages (e.g. the argument name).

    int64: kept as int64 when x64 is enabled; otherwise narrowed to int32 if every value fits, else
    ``ValueError``. uint64 is refused when x64 is off and values exceed int32 likewise.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.requires_grad:
        t = t.detach()
    _sync_torch(t)
    if t.dtype in (torch.int64, torch.uint64) and not x64_enabled():
        narrowed = _narrow_int64(t, name)
        copied = narrowed is not t  # .to() made a fresh buffer
        t = narrowed
    else:
        copied = False
    needs_fresh = not t.is_contiguous() or t.data_ptr() % _ALIGN_BYTES != 0
    if (copy and not copied) or needs_fresh:
        t = t.clone(memory_format=torch.contiguous_format)
        _sync_torch(t)
    # The fresh buffer is referenced only by the DLPack capsule from here on, so the zero-copy import
    # below cannot alias anything the caller holds.
    return jax.dlpack.from_dlpack(t)


def to_torch(x: Any, *, copy: bool = True) -> torch.Tensor:
    """Convert a JAX array (or anything ``jnp.asarray`` accepts) to a torch tensor on the same device.

    ``copy=True`` (default) clones, so torch never holds an external reference to a JAX buffer (which
    would block donating it) and torch's in-place writes cannot reach JAX memory.
    """
    x = jnp.asarray(x)
    x.block_until_ready()
    t = torch.from_dlpack(x)
    return t.clone() if copy else t


def tree_to_jax(tree: Any, *, copy: bool = True) -> Any:
    """Convert every torch tensor in a (nested) dict/list/tuple; other leaves pass through."""
    if isinstance(tree, torch.Tensor):
        return to_jax(tree, copy=copy)
    if isinstance(tree, Mapping):
        return {k: (to_jax(v, copy=copy, name=str(k)) if isinstance(v, torch.Tensor) else tree_to_jax(v, copy=copy))
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(tree_to_jax(v, copy=copy) for v in tree)
    return tree


def tree_to_torch(tree: Any, *, copy: bool = True) -> Any:
    """Convert every JAX array in a (nested) dict/list/tuple/NamedTuple to torch; other leaves pass through."""
    if isinstance(tree, jax.Array):
        return to_torch(tree, copy=copy)
    if isinstance(tree, Mapping):
        return {k: tree_to_torch(v, copy=copy) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(tree_to_torch(v, copy=copy) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_to_torch(v, copy=copy) for v in tree)
    return tree
