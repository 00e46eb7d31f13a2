"""Prefix part of ``paged_attention`` as a Pallas **Mosaic GPU** kernel (Hopper: wgmma + TMA).

Grid ``(S, Hkv * T, B)``: one program (one warpgroup) per (prefix slice, KV head x row tile, request).
It holds ``ROWS = 64`` query rows of one KV head in shared memory (``Q * group`` rows, zero-padded to a multiple
of 8 and copied alone, the tile's other rows unused; more rows take more row tiles ``T``) and walks its slice of
the prefix ``block`` tokens at a time:

* a block is ``block // G`` whole pages; each page is one contiguous ``[G, E]`` slab of the pool
  (``k_pool[layer, page*G : page*G+G, h]``; the layer index is a kernel input, so the model's whole pool
  goes in unsliced), copied by TMA with a dynamic start read as a scalar from the page
  table (Mosaic GPU has no vector gathers on Hopper); ``stages`` blocks are in flight (multi-buffering,
  one barrier per stage counting the page copies);
* ``S = q @ K^T`` and ``acc += P @ V`` run on the tensor cores (wgmma, f32 accumulators in registers),
  with an online base-2 softmax in between; positions ``>= prefix_lens[b]`` are masked.

With fresh K/V and their slots (``prefix_partials(..., fresh=(k_new, v_new, write_locs))``) the kernel also
writes them into the pool's layer, in place (the pool goes in as a mutable ``Ref``, aliased in and out): the
first program of each (request, KV head) copies the request's fresh rows of that head into shared memory
(beside its query tile) and stores each at its slot by TMA before it walks the prefix, so a layer needs no
scatter kernels of its own (an 8B decode layer at batch 32 ran two, 3.3 us each). The prefix never overlaps
the fresh slots, so writing while other programs read the prefix changes nothing they use; a slot outside
``[0, X)`` is not written.

Outputs the unnormalised partials ``acc f32[B,Hkv,S,R,E]``, ``m, l f32[B,Hkv,S,R]`` (``-inf`` / 0
for an empty slice; ``R`` = ``Q * group`` rounded up to 8 for one row tile, ``T * 64`` for more), merged with the fresh tokens by ``_attention_parts.merge_partials``.
Requirements (checked by the caller): bf16 / fp16, head_dim % 64 == 0, page size % 8 == 0 and <= 128.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxspec.kernels._mosaic_gpu import interpret_params, pl, plgpu
from jaxspec.kernels._attention_parts import FRESH_CHUNK, LOG2E, MOSAIC_BLOCK as BLOCK, MOSAIC_ROWS as ROWS
from jaxspec.kernels._attention_parts import default_num_splits, mosaic_plan, query_rows

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _body(*refs, page_size, num_pages, width, block, stages, tiles, out_rows, num_splits, scale, dtype, interpret,
          num_fresh):
    if num_fresh:
        q_ref, k_ref, v_ref, pt_ref, len_ref, layer_ref, kn_ref, vn_ref, loc_ref, acc_out, m_out, l_out = refs
    else:
        (q_ref, k_ref, v_ref, pt_ref, len_ref, layer_ref, acc_out, m_out, l_out), kn_ref = refs, None
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

    # the fresh K/V write (module docstring): by the first program of each (request, KV head), in chunks of
    # `chunk` tokens (the last chunk starts at num_fresh - chunk: rows written twice get the same values). The
    # first chunk is loaded beside the queries and stored before the prefix walk (its stores run under it);
    # later chunks (prefill only) after it.
    chunk = min(num_fresh, FRESH_CHUNK)
    writer = (s_idx == 0) & (tile == 0)

    def fresh_load(start, kn_smem, vn_smem, f_bar):
        rows = pl.ds(start, chunk)
        plgpu.copy_gmem_to_smem(kn_ref.at[b, rows, h], kn_smem, f_bar.at[0])
        plgpu.copy_gmem_to_smem(vn_ref.at[b, rows, h], vn_smem, f_bar.at[0])

    def fresh_store(start, kn_smem, vn_smem, f_bar):
        plgpu.barrier_wait(f_bar.at[0])
        for j in range(chunk):
            slot = loc_ref[b * num_fresh + start + j]

            @pl.when((slot >= 0) & (slot < k_ref.shape[1]))
            def _():
                plgpu.copy_smem_to_gmem(kn_smem.at[pl.ds(j, 1)], k_ref.at[layer, pl.ds(slot, 1), h])
                plgpu.copy_smem_to_gmem(vn_smem.at[pl.ds(j, 1)], v_ref.at[layer, pl.ds(slot, 1), h])

    def fresh_rest(kn_smem, vn_smem, f_bar):
        def one(c, carry):
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous chunk's stores have read the buffers
            start = jnp.minimum(c * chunk, num_fresh - chunk)
            fresh_load(start, kn_smem, vn_smem, f_bar)
            fresh_store(start, kn_smem, vn_smem, f_bar)
            return carry

        lax.fori_loop(1, -(-num_fresh // chunk), one, 0)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # before the buffers leave scope

    def main(q_smem, k_smem, v_smem, q_bar, k_bar, v_bar, *fresh):
        # only the query rows that go out are copied (q is padded to them, not to 64 rows); the tile's other rows
        # hold whatever shared memory held and only reach their own rows of the products, never written out
        plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(tile * out_rows, out_rows)], q_smem.at[pl.ds(0, out_rows)],
                                q_bar.at[0])
        if fresh:
            @pl.when(writer)
            def _():
                fresh_load(0, *fresh)

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
        if fresh:
            @pl.when(writer)
            def _():
                fresh_store(0, *fresh)

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

        out = lax.fori_loop(0, cnt, step, (acc0, m0, l0))
        if fresh:
            @pl.when(writer)
            def _():
                fresh_rest(*fresh)
        return out

    fresh_scratch = () if not num_fresh else (
        plgpu.SMEM((chunk, e), dtype), plgpu.SMEM((chunk, e), dtype), plgpu.Barrier(num_arrivals=2, num_barriers=1))
    acc, m_i, l_i = pl.run_scoped(
        main,
        plgpu.SMEM((ROWS, e), dtype, transforms=(tiling, swizzle)),
        plgpu.SMEM((stages, block, e), dtype, transforms=(tiling, swizzle)),
        plgpu.SMEM((stages, block, e), dtype, transforms=(tiling, swizzle)),
        plgpu.Barrier(num_barriers=1),
        plgpu.Barrier(num_arrivals=ppb, num_barriers=stages),
        plgpu.Barrier(num_arrivals=ppb, num_barriers=stages),
        *fresh_scratch,
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
                    interpret=False, block=None, stages=None, layer=None, fresh=None):
    """``(acc, m, l)`` prefix partials (module docstring) for ``q [B,Q,Hq,E]`` over the paged pool: ``k_pool,
    v_pool [X,Hkv,E]``, or ``[L,X,Hkv,E]`` with ``layer`` (an int or ``i32[]``) choosing the layer inside the
    kernel (so no slice of the pool becomes an XLA op of its own: the call stays capturable in a CUDA graph).
    ``block`` (prefix tokens per step, a multiple of 64 and of the page size) and ``stages`` (blocks in
    flight) default to ``_attention_parts.mosaic_plan``: ``BLOCK`` (or the page size) and the stages that fit in
    shared memory.

    ``fresh = (k_new, v_new [B,Q,Hkv,E], write_locs i32[B*Q])``: the kernel also writes the fresh K/V at those
    slots of the layer (module docstring) and returns ``(acc, m, l, k_pool, v_pool)``, the pools updated in
    place when the caller's are dead afterwards (donated, or inside one jit)."""
    single = k_pool.ndim == 3
    if single:
        k_pool, v_pool = k_pool[None], v_pool[None]
    layer = jnp.asarray(0 if layer is None else layer, jnp.int32).reshape(1)
    b, nq, hq, e = q.shape
    tiles = max(1, math.ceil(nq * (hq // hkv) / ROWS))
    out_rows = ROWS if tiles > 1 else -(-nq * (hq // hkv) // 8) * 8  # rows written per tile
    rows = tiles * out_rows
    block = block or max(BLOCK, page_size)
    if not stages:
        plan = mosaic_plan(e, q.dtype.itemsize, page_size, fresh=fresh is not None, block=block)
        if plan is None:
            raise ValueError(f"q: head_dim {e} in {q.dtype} does not fit the Mosaic kernel's shared memory "
                             f"(block {block}); use the Triton kernel or the reference")
        stages = plan[1]
    if block % 64 or block % page_size:
        raise ValueError(f"block: expected a multiple of 64 and of page_size={page_size}, got {block}")
    width = page_table.shape[1]
    s = num_splits or default_num_splits(b, hkv * tiles, width * page_size, block)
    body = functools.partial(
        _body, page_size=page_size, num_pages=k_pool.shape[1] // page_size, width=width, block=block,
        stages=stages, tiles=tiles, out_rows=out_rows, num_splits=s, scale=float(sm_scale * LOG2E), dtype=q.dtype,
        interpret=bool(interpret), num_fresh=0 if fresh is None else nq)
    f32 = jnp.float32
    out_type = (jax.ShapeDtypeStruct((b, hkv, s, rows, e), f32), jax.ShapeDtypeStruct((b, hkv, s, rows), f32),
                jax.ShapeDtypeStruct((b, hkv, s, rows), f32))
    kw = dict(compiler_params=plgpu.CompilerParams(approx_math=True),
              interpret=interpret_params() if interpret else None)
    rows_q = query_rows(q, hkv, rows)
    if fresh is None:
        kernel = plgpu.kernel(body, out_type=out_type, grid=(s, hkv * tiles, b), grid_names=("s", "ht", "b"), **kw)
        return kernel(rows_q, k_pool, v_pool, page_table, prefix_lens, layer)
    # the pools as mutable refs: aliased in and out of the kernel (pl.kernel, not plgpu.kernel, whose vmap
    # wrapper takes no refs in jax 0.10)
    k_new, v_new, locs = fresh
    k_ref, v_ref = (jax.new_ref(x, memory_space=plgpu.GMEM) for x in (k_pool, v_pool))
    kernel = pl.kernel(body, out_type=out_type, mesh=plgpu.Mesh(grid=(s, hkv * tiles, b), grid_names=("s", "ht", "b")),
                       **kw)
    acc, m, l = kernel(rows_q, k_ref, v_ref, page_table, prefix_lens, layer, k_new.astype(q.dtype),
                       v_new.astype(q.dtype), locs.reshape(-1).astype(jnp.int32))
    k_pool, v_pool = k_ref[...], v_ref[...]
    if single:
        k_pool, v_pool = k_pool[0], v_pool[0]
    return acc, m, l, k_pool, v_pool
