"""Prefix part of ``paged_attention`` as a Pallas **Triton** kernel (deprecated lowering; see
``paged_attention_mosaic`` for the Mosaic GPU kernel that ``auto`` prefers).

Grid ``(B, Hkv * T, S)``: one program per (request, KV head x row tile, prefix slice) takes ``tile`` of the
``rows`` query rows of that KV head and walks its slice of the prefix ``BLOCK`` tokens at a time, gathering
K/V rows through the page table (any page size; any head_dim: columns padded to a power of two and masked;
vector gathers), with an online base-2 softmax. ``rows`` is ``Q * group`` rounded up to a power of two (at
least 16); the tile and the pipeline stages come from ``_attention_parts.triton_plan``, the largest that
fit in shared memory (one tile, ``T = 1``, unless the rows would not fit: long f32 prefills). Outputs the
unnormalised partials ``acc f32[B,Hkv,S,rows,E]``, ``m, l f32[B,Hkv,S,rows]`` (``-inf`` / 0 for an empty
slice).
"""

import functools

import jax
import jax.numpy as jnp

from jax.experimental import pallas as pl

from jaxspec.kernels._attention_parts import LOG2E, TRITON_BLOCK as BLOCK
from jaxspec.kernels._attention_parts import (default_num_splits, online_softmax_init, online_softmax_step, query_rows,
                                              triton_plan)
from jaxspec.kernels._dispatch import next_pow2
from jaxspec.kernels._triton import compiler_params, load, store


def _kernel(len_ref, pt_ref, q_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, *, page_size, num_pages, width, rows,
            tiles, head_dim, num_splits, scale):
    b, ht, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    h = ht // tiles
    g = page_size
    n = len_ref[b]
    nblk = (n + BLOCK - 1) // BLOCK
    per = (nblk + num_splits - 1) // num_splits
    lo = jnp.minimum(s * per, nblk)
    hi = jnp.minimum(lo + per, nblk)
    r = (ht % tiles) * rows + jnp.arange(rows, dtype=jnp.int32)  # this program's rows (``rows`` = the tile)
    e_pad = next_pow2(head_dim)  # Triton blocks are powers of two: mask the columns past head_dim
    c = jnp.arange(e_pad, dtype=jnp.int32)
    col = c < head_dim
    q = load(q_ref.at[b, h, r[:, None], c[None, :]], mask=col[None, :], other=0)
    j = jnp.arange(BLOCK, dtype=jnp.int32)
    # float32 inputs (the f32 test models): full-precision dots, never TF32 (greedy near-ties would flip)
    prec = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def step(t, carry):
        pos = t * BLOCK + j
        ok = pos < n
        page = load(pt_ref.at[b, jnp.minimum(pos // g, width - 1)], mask=ok, other=0)
        slot = jnp.clip(page, 0, num_pages - 1) * g + pos % g
        k = load(k_ref.at[slot[:, None], h, c[None, :]], mask=ok[:, None] & col[None, :], other=0)
        v = load(v_ref.at[slot[:, None], h, c[None, :]], mask=ok[:, None] & col[None, :], other=0)
        return online_softmax_step(carry, q, k, v, ok, scale, prec)

    init = online_softmax_init(rows, e_pad)
    acc, m, l = jax.lax.fori_loop(lo, hi, step, init)
    store(acc_ref.at[b, h, s, r[:, None], c[None, :]], acc, mask=col[None, :])
    store(m_ref.at[b, h, s, r], m)
    store(l_ref.at[b, h, s, r], l)


@functools.partial(jax.jit, static_argnames=("hkv", "page_size", "sm_scale", "num_splits", "interpret", "max_tile"))
def prefix_partials(q, hkv, k_pool, v_pool, page_table, prefix_lens, *, page_size, sm_scale, num_splits=None,
                    interpret=False, max_tile=None):
    """``(acc, m, l)`` prefix partials (module docstring) for ``q [B,Q,Hq,E]`` over the paged pool; ``max_tile``
    caps the query rows per program (a power of two >= 16; default: the largest tile that fits)."""
    b, nq, hq, e = q.shape
    plan = triton_plan(nq * (hq // hkv), e, q.dtype.itemsize, max_tile=max_tile)
    if plan is None:
        raise ValueError(f"q: head_dim {e} in {q.dtype} does not fit the Triton kernel's shared memory; "
                         f"use the reference")
    rows, tile, stages = plan
    tiles = rows // tile
    width = page_table.shape[1]
    s = num_splits or default_num_splits(b, hkv * tiles, width * page_size, BLOCK)
    qr = query_rows(q, hkv, rows)
    kernel = functools.partial(
        _kernel, page_size=page_size, num_pages=k_pool.shape[0] // page_size, width=width, rows=tile, tiles=tiles,
        head_dim=e, num_splits=s, scale=float(sm_scale * LOG2E))
    f32 = jnp.float32
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((b, hkv, s, rows, e), f32), jax.ShapeDtypeStruct((b, hkv, s, rows), f32),
                   jax.ShapeDtypeStruct((b, hkv, s, rows), f32)),
        grid=(b, hkv * tiles, s),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=4, num_stages=stages),
        name=f"paged_attention_prefix_rows{tile}_g{page_size}",
    )(prefix_lens, page_table, qr, k_pool, v_pool)
