"""Prefix part of ``paged_attention`` as a Pallas **Mosaic GPU** kernel (Hopper: wgmma + TMA).

Grid ``(S, Hkv * T, B)``: one program (one warpgroup) per (prefix slice, KV head x row tile, request).
It holds ``ROWS = 64`` query rows of one KV head in shared memory (``Q * group`` rows, zero-padded; more
rows take more row tiles ``T``) and walks its slice of the prefix ``block`` tokens at a time:

* a block is ``block // G`` whole pages; each page is one contiguous ``[G, E]`` slab of the pool
  (``k_pool[layer, page*G : page*G+G, h]``; the layer index is a kernel input, so the model's whole pool
  goes in unsliced), copied by TMA with a dynamic start read as a scalar from the page
  table (Mosaic GPU has no vector gathers on Hopper); ``stages`` blocks are in flight (multi-buffering,
  one barrier per stage counting the page copies);
* ``S = q @ K^T`` and ``acc += P @ V`` run on the tensor cores (wgmma, f32 accumulators in registers),
  with an online base-2 softmax in between; positions ``>= prefix_lens[b]`` are masked.

Outputs the unnormalised partials ``acc f32[B,Hkv,S,R,E]``, ``m, l f32[B,Hkv,S,R]`` (``-inf`` / 0
for an empty slice; ``R`` = ``Q * group`` rounded up to 8 for one row tile, ``T * 64`` for more), merged with the fresh tokens by ``paged_attention.merge_partials``.
Requirements (checked by the caller): bf16 / fp16, head_dim % 64 == 0, page size % 8 == 0 and <= 128.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxspec.kernels._mosaic_gpu import interpret_params, pl, plgpu
from jaxspec.kernels.paged_attention import LOG2E, default_num_splits, query_rows

ROWS = 64  # one wgmma M tile
BLOCK = 64  # default prefix tokens per step
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _stages(e: int, block: int, itemsize: int) -> int:
    """Blocks in flight: 2 (measured on the H200, Llama-3.1-8B layer, 4 shapes: 2 stages beat 3 and 4 by
    2-10% -- two CTAs fit per SM and the page-id reads are issued a step ahead), 1 only where two stages
    of the largest head_dim would not fit beside the query tile."""
    per_stage = 2 * block * e * itemsize
    return 2 if ROWS * e * itemsize + 2 * per_stage <= 200 * 1024 else 1


def _body(q_ref, k_ref, v_ref, pt_ref, len_ref, layer_ref, acc_out, m_out, l_out, *, page_size, num_pages, width,
          block, stages, tiles, out_rows, num_splits, scale, dtype, interpret):
    g = page_size
    # the GPU interpreter has no layout_cast (layouts only matter to the compiler)
    cast = (lambda x, layout: x) if interpret else plgpu.layout_cast
    ppb = block // g  # pages per block
    s_idx = lax.axis_index("s")
    ht = lax.axis_index("ht")
    b = lax.axis_index("b")
    h = lax.div(ht, jnp.int32(tiles))
    tile = lax.rem(ht, jnp.int32(tiles))
    e = q_ref.shape[-1]
    layer = layer_ref[0]  # the pool's layer (the pool is [L, X, Hkv, E]: no slice of it outside the kernel)
    n = len_ref[b]
    nblk = lax.div(n + (block - 1), jnp.int32(block))
    per = lax.div(nblk + (num_splits - 1), jnp.int32(num_splits))
    lo = jnp.minimum(s_idx * per, nblk)
    cnt = jnp.minimum(lo + per, nblk) - lo
    last_page = jnp.minimum(lax.div(n + (g - 1), jnp.int32(g)) - 1, width - 1)  # only read when n > 0

    tiling = plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize))
    swizzle = plgpu.SwizzleTransform(128)

    def main(q_smem, k_smem, v_smem, q_bar, k_bar, v_bar):
        plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(tile * ROWS, ROWS)], q_smem, q_bar.at[0])

        def page_ids(blk):
            # Scalar loads of the block's page ids. Pages past the request's last used page (the tail of
            # its last block) re-read that last page instead of trusting page-table garbage: the data is
            # masked either way, but must be finite (0 * NaN in P @ V); ids are clamped into the pool.
            return [jnp.clip(pt_ref[b, jnp.minimum(blk * ppb + i, last_page)], 0, num_pages - 1) for i in range(ppb)]

        def issue(pages, slot):
            for i, page in enumerate(pages):
                src = pl.ds(page * g, g)
                plgpu.copy_gmem_to_smem(k_ref.at[layer, src, h], k_smem.at[slot, pl.ds(i * g, g)], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[layer, src, h], v_smem.at[slot, pl.ds(i * g, g)], v_bar.at[slot])

        for t in range(stages):
            @pl.when(t < cnt)
            def _():
                issue(page_ids(lo + t), t)

        plgpu.barrier_wait(q_bar.at[0])
        m0 = cast(jnp.full((ROWS,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        l0 = cast(jnp.full((ROWS,), 0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        acc0 = cast(jnp.full((ROWS, e), 0, jnp.float32), plgpu.Layout.WGMMA)

        def step(t, carry):
            acc, m_i, l_i = carry
            slot = lax.rem(t, jnp.int32(stages))
            next_pages = page_ids(lo + t + stages)  # read early: their latency overlaps this block's math
            plgpu.barrier_wait(k_bar.at[slot])

            def qk_fn(acc_ref):
                # ref.transpose == plgpu.transpose_ref (deprecated in jax 0.11), in jax 0.10 and 0.11 alike
                plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                return acc_ref[...]

            if interpret:  # the GPU interpreter's wgmma takes no transposed operand: same product, plain dot
                qk = lax.dot_general(q_smem[...], k_smem[slot], _NT, preferred_element_type=jnp.float32)
            else:
                qk = pl.run_scoped(qk_fn, plgpu.ACC((ROWS, block), jnp.float32))
            col = (lax.broadcasted_iota(jnp.int32, (ROWS, block), 1) if interpret
                   else plgpu.broadcasted_iota(jnp.int32, (ROWS, block), 1, layout=plgpu.Layout.WGMMA))
            qk = jnp.where(col + (lo + t) * block < n, qk * scale, -jnp.inf)
            m_new = jnp.maximum(m_i, qk.max(axis=1))
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(qk - lax.broadcast_in_dim(m_new, qk.shape, [0]))
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            plgpu.barrier_wait(v_bar.at[slot])

            def pv_fn(acc_ref):
                plgpu.wgmma(acc_ref, p.astype(dtype), v_smem.at[slot])
                return acc_ref[...]

            # a fresh accumulator (zero-initialised) then an add: the GPU interpreter has no run_state
            if interpret:
                acc = acc + lax.dot_general(p.astype(dtype), v_smem[slot], _NN, preferred_element_type=jnp.float32)
            else:
                acc = acc + pl.run_scoped(pv_fn, plgpu.ACC((ROWS, e), jnp.float32))

            @pl.when(t + stages < cnt)
            def _():
                issue(next_pages, slot)

            return acc, m_new, l_i

        return lax.fori_loop(0, cnt, step, (acc0, m0, l0))

    acc, m_i, l_i = pl.run_scoped(
        main,
        plgpu.SMEM((ROWS, e), dtype, transforms=(tiling, swizzle)),
        plgpu.SMEM((stages, block, e), dtype, transforms=(tiling, swizzle)),
        plgpu.SMEM((stages, block, e), dtype, transforms=(tiling, swizzle)),
        plgpu.Barrier(num_barriers=1),
        plgpu.Barrier(num_arrivals=ppb, num_barriers=stages),
        plgpu.Barrier(num_arrivals=ppb, num_barriers=stages),
    )

    def write(o_smem, m_smem, l_smem):
        o_smem[...] = acc
        m_smem[...] = m_i
        l_smem[...] = l_i
        plgpu.commit_smem()
        # only the rows that hold queries (a multiple of 8) go out: decode / verify use 4-64 of the 64
        src, dst = pl.ds(0, out_rows), pl.ds(tile * out_rows, out_rows)
        plgpu.copy_smem_to_gmem(o_smem.at[src], acc_out.at[b, h, s_idx, dst])
        plgpu.copy_smem_to_gmem(m_smem.at[src], m_out.at[b, h, s_idx, dst])
        plgpu.copy_smem_to_gmem(l_smem.at[src], l_out.at[b, h, s_idx, dst])
        plgpu.wait_smem_to_gmem(0)

    pl.run_scoped(write, plgpu.SMEM((ROWS, e), jnp.float32), plgpu.SMEM((ROWS,), jnp.float32),
                  plgpu.SMEM((ROWS,), jnp.float32))


@functools.partial(jax.jit, static_argnames=("hkv", "page_size", "sm_scale", "num_splits", "interpret", "block",
                                             "stages"))
def prefix_partials(q, hkv, k_pool, v_pool, page_table, prefix_lens, *, page_size, sm_scale, num_splits=None,
                    interpret=False, block=None, stages=None, layer=None):
    """``(acc, m, l)`` prefix partials (module docstring) for ``q [B,Q,Hq,E]`` over the paged pool: ``k_pool,
    v_pool [X,Hkv,E]``, or ``[L,X,Hkv,E]`` with ``layer`` (an int or ``i32[]``) choosing the layer inside the
    kernel (so no slice of the pool becomes an XLA op of its own: the call stays capturable in a CUDA graph).
    ``block`` (prefix tokens per step, a multiple of 64 and of the page size) and ``stages`` (blocks in
    flight) default to ``BLOCK`` / what fits in shared memory."""
    if k_pool.ndim == 3:
        k_pool, v_pool = k_pool[None], v_pool[None]
    layer = jnp.asarray(0 if layer is None else layer, jnp.int32).reshape(1)
    b, nq, hq, e = q.shape
    tiles = max(1, math.ceil(nq * (hq // hkv) / ROWS))
    out_rows = ROWS if tiles > 1 else -(-nq * (hq // hkv) // 8) * 8  # rows written per tile
    rows = tiles * out_rows
    block = block or max(BLOCK, page_size)
    if block % 64 or block % page_size:
        raise ValueError(f"block: expected a multiple of 64 and of page_size={page_size}, got {block}")
    width = page_table.shape[1]
    s = num_splits or default_num_splits(b, hkv * tiles, width * page_size, block)
    stages = stages or _stages(e, block, q.dtype.itemsize)
    body = functools.partial(
        _body, page_size=page_size, num_pages=k_pool.shape[1] // page_size, width=width, block=block,
        stages=stages, tiles=tiles, out_rows=out_rows, num_splits=s, scale=float(sm_scale * LOG2E), dtype=q.dtype,
        interpret=bool(interpret))
    f32 = jnp.float32
    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((b, hkv, s, rows, e), f32), jax.ShapeDtypeStruct((b, hkv, s, rows), f32),
                  jax.ShapeDtypeStruct((b, hkv, s, rows), f32)),
        grid=(s, hkv * tiles, b),
        grid_names=("s", "ht", "b"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret_params() if interpret else None,
    )
    return kernel(query_rows(q, hkv, tiles * ROWS), k_pool, v_pool, page_table, prefix_lens, layer)
