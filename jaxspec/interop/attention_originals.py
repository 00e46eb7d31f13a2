"""SGLang 0.5.23's Triton attention kernels, the originals ``jaxspec.kernels.paged_attention`` stands beside.

* ``extend_attention_fwd`` (``sglang/kernels/ops/attention/extend_attention.py``): extend / verify, with a
  ``custom_mask`` (SGLang's FULL_MASK layout: per request ``q_len x (prefix + q_len)`` int8 rows at
  ``mask_indptr[b]``; the prefix columns are skipped by ``skip_prefix_custom_mask=True``, as SGLang's
  Triton backend calls it for target verify).
* ``decode_attention_fwd`` (``.../decode_attention.py``): one query token per request, split-K over
  ``max_kv_splits`` slices (SGLang's Triton backend default: 8), the token's own K/V in the buffer.

Both read SGLang's page-size-1 layout: ``k_buffer [X, Hkv, E]`` (the jaxspec pool layer as is) and
``kv_indices`` (the slots of each request's prefix tokens, concatenated; ``kv_indptr`` their offsets).
:func:`sglang_layout` builds those from jaxspec's ``page_table`` / ``prefix_lens``.

Files are read from ``.originals/sglang-0.5.23/<path>`` (``python -m jaxspec.interop.fetch`` extracts them;
their sha256 are pinned in ``jaxspec.interop.pins``, and the bytes executed are the bytes checked).
``originals.load("paged_attention")`` / ``load("paged_attention@decode")`` execute them as published (with the
rest of the originals table) with stand-in modules for their package imports:
``sglang.srt.utils`` (``is_cuda`` = a CUDA device is visible, so the Hopper block sizes are chosen on the
H200; every ROCm probe False; ``get_device_core_count`` from torch), ``sglang.srt.environ.envs`` (every
flag at its default, False), and the two sibling files themselves (``score_mod``, ``decode_attention``).

On CPU (``TRITON_INTERPRET=1``) the interpreter miscomputes bf16 ``tl.dot``: run these in fp16 / f32 there.
"""

import types

import numpy as np

from jaxspec.interop.originals import load

__all__ = [
    "load_attention_originals", "sglang_layout", "extend_call", "decode_call", "run_extend",
    "run_decode",
]

DEFAULT_MAX_KV_SPLITS = 8  # SGLang server arg triton_attention_num_kv_splits


def load_attention_originals() -> types.SimpleNamespace:
    """``namespace(extend_attention_fwd, decode_attention_fwd)`` as published in sglang 0.5.23."""
    return types.SimpleNamespace(extend_attention_fwd=load("paged_attention"),
                                 decode_attention_fwd=load("paged_attention@decode"))


def sglang_layout(page_table, prefix_lens, page_size: int):
    """``(kv_indptr i32[B+1], kv_indices i32[sum(prefix)])``: SGLang's page-size-1 view of the prefixes."""
    pt, lens = np.asarray(page_table), np.asarray(prefix_lens)
    idx = []
    for b in range(pt.shape[0]):
        pos = np.arange(int(lens[b]))
        idx.append(pt[b, pos // page_size] * page_size + pos % page_size)
    indices = np.concatenate(idx).astype(np.int32) if idx else np.zeros((0,), np.int32)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return indptr, indices


def _t(x, device, dtype=None):
    """A torch tensor on ``device`` from NumPy / JAX / torch (JAX arrays on a GPU: a zero-copy DLPack view)."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.to(device)
    elif device != "cpu" and hasattr(x, "devices") and next(iter(x.devices())).platform == "gpu":
        from jaxspec.interop.dlpack import to_torch

        t = to_torch(x, copy=False)
    else:
        arr = np.asarray(x.astype("float32") if str(getattr(x, "dtype", "")) == "bfloat16" else x)
        t = torch.from_numpy(np.array(arr)).to(device)  # a writable host copy
    return t.to(dtype) if dtype is not None and t.dtype != dtype else t


def _dtype(q, dtype):
    import torch

    return dtype or getattr(torch, str(q.dtype))


def extend_call(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, *, page_size, sm_scale,
                device="cpu", dtype=None):
    """``(run, out)``: ``run()`` launches SGLang's ``extend_attention_fwd`` with ``custom_mask`` = ``qmask``
    on buffers prepared once (torch ``dtype``, default q's), writing ``out [B*Q, Hq, E]``."""
    import torch

    fns = load_attention_originals()
    b, nq, hq, e = q.shape
    tdt = _dtype(q, dtype)
    indptr, indices = sglang_layout(page_table, prefix_lens, page_size)
    lens = np.asarray(prefix_lens).astype(np.int64)
    qm = np.asarray(qmask)
    mask = np.concatenate([np.concatenate([np.ones((nq, int(lens[i])), np.uint8), qm[i].astype(np.uint8)], 1)
                           .reshape(-1) for i in range(b)])
    mask_indptr = np.concatenate([[0], np.cumsum(nq * (lens + nq))]).astype(np.int64)
    o = torch.empty((b * nq, hq, e), dtype=tdt, device=device)
    args = (
        _t(q, device, tdt).reshape(b * nq, hq, e), _t(k_new, device, tdt).reshape(b * nq, -1, e),
        _t(v_new, device, tdt).reshape(b * nq, -1, e), o, _t(k_pool, device, tdt), _t(v_pool, device, tdt),
        torch.arange(0, (b + 1) * nq, nq, dtype=torch.int32, device=device), _t(indptr, device),
        _t(indices.astype(np.int64), device), _t(mask, device), False, _t(mask_indptr, device), nq, 1.0, 1.0)
    return (lambda: fns.extend_attention_fwd(*args, sm_scale=sm_scale)), o


def decode_call(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, *, page_size, sm_scale, device="cpu",
                dtype=None, max_kv_splits=DEFAULT_MAX_KV_SPLITS):
    """``(run, out)`` for SGLang's ``decode_attention_fwd`` (``Q == 1``): the fresh K/V go into ``B`` extra
    slots appended to copies of the pools (SGLang writes them before attending)."""
    import torch

    fns = load_attention_originals()
    b, nq, hq, e = q.shape
    if nq != 1:
        raise ValueError(f"q: decode_attention_fwd takes one query token per request, got Q={nq}")
    tdt = _dtype(q, dtype)
    x = k_pool.shape[0]
    kb = torch.cat([_t(k_pool, device, tdt), _t(k_new, device, tdt).reshape(b, -1, e)])
    vb = torch.cat([_t(v_pool, device, tdt), _t(v_new, device, tdt).reshape(b, -1, e)])
    indptr, indices = sglang_layout(page_table, prefix_lens, page_size)
    lens = np.asarray(prefix_lens)
    # int64 slots, as SGLang's Triton backend builds kv_indices: the kernels' pointer offsets are
    # kv_index * row stride, which overflows int32 once the pool has more than 2**31 elements
    full = np.concatenate([np.append(indices[indptr[i]:indptr[i + 1]], x + i) for i in range(b)]).astype(np.int64)
    full_ptr = np.concatenate([[0], np.cumsum(lens + 1)]).astype(np.int32)
    o = torch.empty((b, hq, e), dtype=tdt, device=device)
    logits = torch.empty((b, hq, max_kv_splits, e), dtype=torch.float32, device=device)
    lse = torch.empty((b, hq, max_kv_splits), dtype=torch.float32, device=device)
    splits = torch.full((b,), max_kv_splits, dtype=torch.int32, device=device)
    args = (_t(q, device, tdt).reshape(b, hq, e), kb, vb, o, _t(full_ptr, device), _t(full, device), logits, lse,
            splits, max_kv_splits, sm_scale, 1.0, 1.0)
    return (lambda: fns.decode_attention_fwd(*args)), o


def run_extend(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, *, page_size, sm_scale,
               device="cpu", dtype=None):
    """SGLang's ``extend_attention_fwd`` on the same buffers; float32 NumPy ``[B, Q, Hq, E]``."""
    run, o = extend_call(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, page_size=page_size,
                         sm_scale=sm_scale, device=device, dtype=dtype)
    run()
    return o.float().cpu().numpy().reshape(q.shape)


def run_decode(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, *, page_size, sm_scale, device="cpu",
               dtype=None, max_kv_splits=DEFAULT_MAX_KV_SPLITS):
    """SGLang's ``decode_attention_fwd`` (``Q == 1``) on the same buffers; float32 NumPy ``[B, 1, Hq, E]``."""
    run, o = decode_call(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, page_size=page_size,
                         sm_scale=sm_scale, device=device, dtype=dtype, max_kv_splits=max_kv_splits)
    run()
    return o.float().cpu().numpy().reshape(q.shape)
