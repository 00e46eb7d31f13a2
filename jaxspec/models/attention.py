"""Paged attention of a ragged batch of fresh tokens over a request's cached prefix (pure jnp reference).

``paged_attention_reference`` is the one attention every jaxspec model calls; a kernel with the same
signature (``kernels/``) replaces it by changing the single ``ATTENTION`` binding below.
"""

import jax
import jax.numpy as jnp

# Every matmul at HIGHEST precision: the losslessness check compares greedy argmaxes of the verify forward
# (Q = N tokens) with plain decode (Q = 1); TF32 on the GPU would make near-ties flip between the two.
PREC = jax.lax.Precision.HIGHEST
_MASKED = -1e30  # finite "minus infinity": every query row sees at least itself, so no all-masked rows


def paged_attention_reference(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask, *, page_size: int,
                              sm_scale: float):
    """GQA attention of the fresh queries over [cached prefix | fresh keys]; returns ``[B, Q, Hq, E]`` in ``q.dtype``.

    q: ``[B, Q, Hq, E]``; k_new, v_new: ``[B, Q, Hkv, E]`` (the fresh tokens' K/V, RoPE applied, not yet in
    the pool); k_pool, v_pool: ``[X, Hkv, E]`` (one layer); page_table: ``i32[B, P]``; prefix_lens:
    ``i32[B]`` (row ``b`` sees logical positions ``< prefix_lens[b]`` of its pages); qmask: ``bool[B, Q, Q]``
    (fresh-to-fresh visibility, row = query). Scores, softmax and the weighted sum run in float32 whatever
    the input dtypes; the prefix gathered is ``P * page_size`` wide (positions past ``prefix_lens`` masked).
    """
    if q.ndim != 4:
        raise ValueError(f"q: expected [B, Q, Hq, E], got shape {q.shape}")
    b, nq, hq, e = q.shape
    hkv = k_new.shape[2] if k_new.ndim == 4 else -1
    expect = {
        "k_new": (k_new, (b, nq, hkv, e)), "v_new": (v_new, (b, nq, hkv, e)),
        "k_pool": (k_pool, (k_pool.shape[0], hkv, e)), "v_pool": (v_pool, k_pool.shape),
        "page_table": (page_table, (b, page_table.shape[-1])), "prefix_lens": (prefix_lens, (b,)),
        "qmask": (qmask, (b, nq, nq)),
    }
    for name, (x, shape) in expect.items():
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)} (q is {q.shape}), got {tuple(x.shape)}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q heads ({hq}) must be a multiple of k_new heads ({hkv})")
    f32 = jnp.float32
    qg = q.astype(f32).reshape(b, nq, hkv, hq // hkv, e) * sm_scale
    s_new = jnp.einsum("bqhge,bkhe->bhgqk", qg, k_new.astype(f32), precision=PREC)
    s_new = jnp.where(qmask[:, None, None, :, :], s_new, _MASKED)
    width = page_table.shape[1] * page_size
    pos = jnp.arange(width, dtype=jnp.int32)
    slots = page_table[:, pos // page_size] * page_size + (pos % page_size)[None, :]  # = meta.prefix_slots(width)
    k_pre, v_pre = k_pool[slots].astype(f32), v_pool[slots].astype(f32)  # [B, W, Hkv, E]
    s_pre = jnp.einsum("bqhge,bwhe->bhgqw", qg, k_pre, precision=PREC)
    s_pre = jnp.where((pos[None, :] < prefix_lens[:, None])[:, None, None, None, :], s_pre, _MASKED)
    p = jax.nn.softmax(jnp.concatenate([s_pre, s_new], axis=-1), axis=-1)
    v = jnp.concatenate([v_pre, v_new.astype(f32)], axis=1)
    out = jnp.einsum("bhgqk,bkhe->bqhge", p, v, precision=PREC)
    return out.reshape(b, nq, hq, e).astype(q.dtype)


# The attention the models call (swap in a kernel with the same signature here).
ATTENTION = paged_attention_reference
