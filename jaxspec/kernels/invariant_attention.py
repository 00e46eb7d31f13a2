"""Batch-invariant paged attention: a query's result depends on its own key/value sequence only, never on
how many queries share the call, where the committed prefix ends, or which other requests are in the batch.

``paged_attention`` splits a query's keys into the committed prefix (a kernel over the paged pool, with a
split count chosen by the batch and context) and the fresh tokens of the call (a small dense part), and
merges the two partial softmaxes: the reduction order depends on the prefix / fresh boundary and on the
batch. Here every query attends over its keys in **logical-position order**: positions ``< prefix_lens[b]``
through ``page_table``, then its visible fresh tokens (``qmask``) placed at their own positions
(``positions[b, j] - prefix_lens[b]`` past the prefix: a tree query's ancestors become the contiguous
sequence plain decoding of the accepted path would have read). The scores (over the head dim), the softmax
sum and the value sum (over positions, masked ones contributing exact zeros) are ``ordered_sum``s, whose
order of additions is written out, so the result for a query at position ``p`` is the same function of the
keys ``0..p`` whatever the call: decode, prefill (any chunking), chain or tree verify, alone or in a batch,
and for any context width (trailing blocks add zero).

Pure jnp by design: multiplies and written-out sums, no dot and no XLA reduction (whose order XLA picks by
the shape); the max is exact in any order. The fresh K/V are written to the pool first and read back from
it like the prefix.
"""

import jax
import jax.numpy as jnp

from jaxspec.kernels._attention_parts import write_fresh
from jaxspec.kernels._dispatch import cdiv
from jaxspec.kernels.ordered_sum import BLOCK, ordered_sum

__all__ = ["invariant_attention"]


def _key_slots(page_table, prefix_lens, positions, qmask, fresh_slots, page_size, num_slots, width):
    """``(slots i32[B, Q, width], valid bool[B, Q, width])``: the pool slot of each query's key at each logical
    position (module docstring)."""
    b, nq = positions.shape
    g = page_size
    pos = jnp.arange(width, dtype=jnp.int32)
    pages = jnp.clip(page_table[:, jnp.minimum(pos // g, page_table.shape[1] - 1)], 0, num_slots // g - 1)
    prefix_slot = pages * g + (pos % g)[None, :]  # [B, width]
    depth = positions - prefix_lens[:, None]  # [B, Q]: a fresh token's place after the prefix
    d = jnp.arange(nq, dtype=jnp.int32)
    at = qmask[:, :, :, None] & (depth[:, None, :, None] == d[None, None, None, :])  # [B, Qi, Qj, D]
    fresh_at = jnp.sum(jnp.where(at, fresh_slots[:, None, :, None], 0), axis=2)  # [B, Q, D]
    has = jnp.any(at, axis=2)
    off = pos[None, :] - prefix_lens[:, None]  # [B, width]
    idx = jnp.clip(off, 0, nq - 1)[:, None, :]
    in_prefix = (off < 0)[:, None, :]
    fresh = jnp.take_along_axis(fresh_at, jnp.broadcast_to(idx, (b, nq, width)), axis=2)
    fresh_ok = jnp.take_along_axis(has, jnp.broadcast_to(idx, (b, nq, width)), axis=2) & (off < nq)[:, None, :]
    slots = jnp.where(in_prefix, prefix_slot[:, None, :], fresh)
    valid = in_prefix | fresh_ok
    return jnp.clip(slots, 0, num_slots - 1), valid


def _check(q, k_new, k_pool, page_table, prefix_lens, positions, qmask, write_locs, layer):
    if q.ndim != 4:
        raise ValueError(f"q: expected shape (B, Q, Hq, E), got {q.shape}")
    b, nq, hq, e = q.shape
    if k_new.ndim != 4 or k_new.shape[:2] != (b, nq) or k_new.shape[3] != e or hq % k_new.shape[2]:
        raise ValueError(f"k_new: expected shape ({b}, {nq}, Hkv, {e}) with Hkv dividing {hq}, got {k_new.shape}")
    rank = 3 if layer is None else 4
    if k_pool.ndim != rank or k_pool.shape[-2:] != k_new.shape[2:]:
        raise ValueError(f"k_pool: expected a rank-{rank} pool ending in {k_new.shape[2:]}, got {k_pool.shape}")
    if q.dtype != k_pool.dtype:
        raise ValueError(f"q: dtype {q.dtype} differs from the pool's {k_pool.dtype}")
    for name, x, shape in (("prefix_lens", prefix_lens, (b,)), ("positions", positions, (b, nq)),
                           ("write_locs", write_locs, (b, nq))):
        if x.shape != shape or x.dtype != jnp.int32:
            raise ValueError(f"{name}: expected i32{list(shape)}, got {x.dtype}{list(x.shape)}")
    if page_table.ndim != 2 or page_table.shape[0] != b or page_table.dtype != jnp.int32:
        raise ValueError(f"page_table: expected i32[{b}, P], got {page_table.dtype}{list(page_table.shape)}")
    if qmask.shape != (b, nq, nq) or qmask.dtype != jnp.bool_:
        raise ValueError(f"qmask: expected bool[{b}, {nq}, {nq}], got {qmask.dtype}{list(qmask.shape)}")


def invariant_attention(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, positions, qmask, write_locs, *,
                        page_size, sm_scale, layer=None):
    """Store the fresh ``k_new, v_new [B, Q, Hkv, E]`` in the pools (``[X, Hkv, E]``, or ``[L, X, Hkv, E]`` with
    ``layer``) at ``write_locs i32[B, Q]`` (a slot outside ``[0, X)`` is not written), then attend: ``q [B, Q,
    Hq, E]`` (the pool's dtype) with ``page_table i32[B, P]``, ``prefix_lens i32[B]``, ``positions i32[B, Q]``
    (a fresh token sits at ``prefix_lens[b] + depth``) and ``qmask bool[B, Q, Q]`` (each query sees itself
    and the fresh tokens on its path). Returns ``(out [B, Q, Hq, E] in q's dtype, k_pool, v_pool)``.
    Softmax and sums in float32. Jittable; traced inside the caller's jit."""
    _check(q, k_new, k_pool, page_table, prefix_lens, positions, qmask, write_locs, layer)
    b, nq, hq, e = q.shape
    hkv = k_new.shape[2]
    flat = write_locs.reshape(-1)
    k_pool = write_fresh(k_pool, layer, flat, k_new.reshape(-1, hkv, e))
    v_pool = write_fresh(v_pool, layer, flat, v_new.reshape(-1, hkv, e))
    k_one, v_one = k_pool, v_pool
    if layer is not None:
        k_one, v_one = (jax.lax.dynamic_index_in_dim(x, layer, 0, keepdims=False) for x in (k_pool, v_pool))
    grp = hq // hkv
    f32 = jnp.float32
    width = cdiv(page_table.shape[1] * page_size, BLOCK) * BLOCK
    slots, valid = _key_slots(page_table, prefix_lens, positions, qmask, write_locs, page_size, k_one.shape[0],
                              width)
    kg = k_one[slots].astype(f32)  # [B, Q, W, Hkv, E]
    vg = jnp.where(valid[..., None, None], v_one[slots].astype(f32), 0.0)  # 0 * NaN garbage would be NaN
    qg = q.reshape(b, nq, hkv, grp, e).astype(f32)
    s = ordered_sum(qg[:, :, :, :, None, :] * kg.transpose(0, 1, 3, 2, 4)[:, :, :, None])  # [B, Q, Hkv, G, W]
    s = jnp.where(valid[:, :, None, None, :], s * f32(sm_scale), -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)  # finite: every query sees itself
    p = jnp.exp(s - m)
    den = ordered_sum(p)  # [B, Q, Hkv, G]
    num = ordered_sum(p[:, :, :, :, None, :] * vg.transpose(0, 1, 3, 4, 2)[:, :, :, None])  # [B, Q, Hkv, G, E]
    out = num / den[..., None]
    return out.reshape(b, nq, hq, e).astype(q.dtype), k_pool, v_pool
