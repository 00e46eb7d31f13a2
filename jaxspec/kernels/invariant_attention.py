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

The fresh K/V are stored in the pool (one layer, or layer ``layer`` of a stacked pool) and attended to with
the same values. Implementations (``implementation=``, resolved like every kernel of ``jaxspec.kernels``):

* ``"triton"`` (``"pallas"``; ``"auto"`` on a CUDA GPU): two Pallas Triton kernels. The first has one program
  per (request, block of queries (``TILE_ROWS`` rows over the query heads of a KV head), KV head, split of
  ``KEY_SPLIT`` key positions):
  it walks the keys of its split in blocks of ``KEY_BLOCK`` positions, the prefix's gathered through the
  page table, the fresh ones read from ``k_new`` / ``v_new``, with an online softmax over a fixed
  ``[TILE_ROWS, E] x [E, KEY_BLOCK]`` tile (the block's queries x their heads). A row counts only the keys its
  query sees, so nothing of the tile's other rows reaches its arithmetic; where a block's queries see
  different fresh tokens at one position (a tree's branches) that key block is walked once per query. The
  split-0 programs also store the fresh K/V in the pools (in place). The second kernel merges a query's
  splits in split order. The splits are fixed logical-position ranges, never chosen by the batch, the query
  count or the context, so a split past the query adds exact zeros (the parallel splits keep a decode step
  from walking its whole context in one program, the query blocks keep a prefill chunk from reading its keys
  once per query).
* ``"reference"`` (``"auto"`` elsewhere): pure jnp, multiplies and ``ordered_sum``s over the whole context
  (no dot and no XLA reduction, whose order XLA picks by the shape; the max is exact in any order).

Each implementation is invariant on its own; the two sum in different orders (they agree to float32
rounding, not bit for bit), so one deployment uses one of them, as the batch-invariant mode does.
"""

import functools

import jax
import jax.numpy as jnp

from jax.experimental import pallas as pl

from jaxspec.kernels._attention_parts import (LOG2E, one_layer, online_softmax_init, online_softmax_step,
                                              prefix_slots, write_fresh_kv)
from jaxspec.kernels._backend import Implementation, resolve_implementation
from jaxspec.kernels._dispatch import cdiv, next_pow2
from jaxspec.kernels._triton import compiler_params, load, store
from jaxspec.kernels.ordered_sum import BLOCK, ordered_sum

KEY_BLOCK = 64  # key positions per step of the Triton kernel
# Key positions per program of the Triton kernel's first pass (a multiple of KEY_BLOCK), and the rows of its query
# tile (a block of queries x their padded heads, at least 16 for the tensor cores). Any fixed pair is invariant;
# measured on an H100 (SmolLM2-135M's shape, context 512, batch 1), 64 / 16 against 256 / 64: plain decoding 818
# against 661 tok/s, a tree (5,4,16) round 1,014 against 660 (bench/invariance.py --attention-tiles; BENCHMARKS).
KEY_SPLIT = 64
TILE_ROWS = 16

__all__ = ["KEY_BLOCK", "KEY_SPLIT", "invariant_attention", "resolve_invariant_attention"]


def _fresh_at(prefix_lens, positions, qmask, values):
    """``(value i32[B, Q, D], has bool[B, Q, D])``: ``values[b, j]`` (a pool slot, or the token's index) of the
    fresh token ``j`` query ``i`` sees at depth ``d`` past the prefix (``has``: there is one).

    One scatter-add over the ``[B, Q, Q]`` visibility mask (query ``i`` sees fresh token ``j``: it lands at
    ``j``'s depth), not a ``[B, Q, Q, D]`` comparison: a prefill chunk of ``Q`` = 512 rows would make that
    ``B * 512**3`` elements per layer. Integer adds are exact in any order, so the scatter's order is free."""
    b, nq = positions.shape
    depth = positions - prefix_lens[:, None]  # [B, Q]: a fresh token's place after the prefix
    on = qmask & ((depth >= 0) & (depth < nq))[:, None, :]  # [Bi, Qi, Qj]: j visible to i at a depth in range
    rows = jnp.arange(b, dtype=jnp.int32)[:, None, None]
    cols = jnp.arange(nq, dtype=jnp.int32)[None, :, None]
    at = (rows, cols, jnp.broadcast_to(jnp.clip(depth, 0, nq - 1)[:, None, :], (b, nq, nq)))
    zero = jnp.zeros((b, nq, nq), jnp.int32)
    slot = zero.at[at].add(jnp.where(on, values[:, None, :], 0), mode="drop")
    count = zero.at[at].add(on.astype(jnp.int32), mode="drop")
    return slot, count > 0


def _key_slots(page_table, prefix_lens, positions, qmask, fresh_slots, page_size, num_slots, width):
    """``(slots i32[B, Q, width], valid bool[B, Q, width])``: the pool slot of each query's key at each logical
    position (module docstring)."""
    b, nq = positions.shape
    pos = jnp.arange(width, dtype=jnp.int32)
    table = prefix_slots(page_table, page_size, num_slots)  # [B, P*G]; a row's context never passes P*G
    prefix_slot = jnp.pad(table, ((0, 0), (0, width - table.shape[1])))  # [B, width]
    fresh_at, has = _fresh_at(prefix_lens, positions, qmask, fresh_slots)
    off = pos[None, :] - prefix_lens[:, None]  # [B, width]
    idx = jnp.clip(off, 0, nq - 1)[:, None, :]
    in_prefix = (off < 0)[:, None, :]
    fresh = jnp.take_along_axis(fresh_at, jnp.broadcast_to(idx, (b, nq, width)), axis=2)
    fresh_ok = jnp.take_along_axis(has, jnp.broadcast_to(idx, (b, nq, width)), axis=2) & (off < nq)[:, None, :]
    fresh_ok = fresh_ok & (fresh >= 0) & (fresh < num_slots)  # a slot outside the pool is never read
    slots = jnp.where(in_prefix, prefix_slot[:, None, :], fresh)
    valid = in_prefix | fresh_ok
    return jnp.clip(slots, 0, num_slots - 1), valid


def _reference(q, k_one, v_one, page_table, prefix_lens, positions, qmask, write_locs, *, page_size, sm_scale):
    b, nq, hq, e = q.shape
    hkv = k_one.shape[1]
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
    return out.reshape(b, nq, hq, e).astype(q.dtype)


def _query_blocks(prefix_lens, positions, qmask, write_locs, num_slots, bq):
    """Which fresh token each query sees at each depth past the prefix, per block of ``bq`` queries:
    ``(token i32[B, Qp, Q], has bool[B, Qp, Q], canon i32[B, Qb, Q], conflict bool[B, Qb, Q])`` with ``Qp = Qb *
    bq`` (padding queries see nothing): the token (its index among the fresh ones), whether there is one,
    the token the block's queries see there (-1: none) and whether two of them see different ones (a tree's
    branches). A token whose write slot lies outside the pool (a padding token's) is seen by nobody."""
    b, nq = positions.shape
    nqb = cdiv(nq, bq)
    token, has = _fresh_at(prefix_lens, positions, qmask, jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32), (b, nq)))
    slot = jnp.take_along_axis(write_locs, token.reshape(b, -1), axis=1).reshape(token.shape)
    has = has & (slot >= 0) & (slot < num_slots)
    pad = ((0, 0), (0, nqb * bq - nq), (0, 0))
    token, has = jnp.pad(token, pad), jnp.pad(has, pad)
    blk_token, blk_has = token.reshape(b, nqb, bq, nq), has.reshape(b, nqb, bq, nq)
    canon = jnp.max(jnp.where(blk_has, blk_token, -1), axis=2)
    conflict = jnp.any(blk_has & (blk_token != canon[:, :, None]), axis=2)
    return token, has, canon, conflict


def _tile_rows(qb, h, *, rows, grp, grp_pad, bq, nq):
    """A program's tile rows (row ``r``: query ``r // grp_pad`` of query block ``qb``, head ``r % grp_pad`` of KV
    head ``h``'s group): ``(query in the block, head in the group, query row, row is real, query head)``; the
    first pass and the merge lay out their tiles alike."""
    r = jnp.arange(rows, dtype=jnp.int32)
    qi, hh = r // grp_pad, r % grp_pad
    qrow = qb * bq + qi  # < the padded query count
    return qi, hh, qrow, (hh < grp) & (qrow < nq), h * grp + jnp.minimum(hh, grp - 1)


def _kernel(lay_ref, pt_ref, pre_ref, pos_ref, wl_ref, tok_ref, has_ref, canon_ref, conf_ref, q_ref, kn_ref, vn_ref,
            k_ref, v_ref, acc_ref, ml_ref, k_out, v_out, *, page_size, num_pages, num_slots, width, nq, grp, grp_pad, bq,
            num_kv, rows, head_dim, scale, layered):
    """First pass: one program per (request, block of ``bq`` queries, KV head, split) walks the keys of
    positions ``[split * KEY_SPLIT, (split + 1) * KEY_SPLIT)`` in blocks of ``KEY_BLOCK``, one ``[rows, E]``
    tile of the block's queries x their heads (row ``r``: query ``r // grp_pad``, head ``r % grp_pad``) against
    one ``[KEY_BLOCK, E]`` key tile: the prefix's keys from the pool, the fresh ones from ``k_new`` (the same
    values the pool holds once written). Each row counts only the keys its query sees (``<=`` its position,
    in the prefix or on its path), so its arithmetic is the same whichever queries share the tile (a score or
    value product reads only its own row and its key's column; keys it does not see weigh exactly 0). Where
    the block's queries see different fresh tokens at one position (a tree's branches), that key block is
    walked once per query, each pass counting that query's rows only. Stores the partial softmax (``acc``,
    the running max ``m`` and sum ``l``; ``m = -inf, l = 0`` for a split past the query). The split-0
    program also writes its queries' fresh K/V of its head into the pools (in place): slots past every
    prefix, so no program reads what another writes."""
    b, qb, h, sp = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    g = page_size
    n_pre = pre_ref[b]
    e_pad = next_pow2(head_dim)
    c = jnp.arange(e_pad, dtype=jnp.int32)
    col = c < head_dim
    lay = lay_ref[0]

    def pool(ref, slot):  # ref.at[slot rows, head h, every column]
        idx = (slot[:, None], h, c[None, :])
        return ref.at[(lay, *idx) if layered else idx]

    @pl.when(sp == 0)
    def _write():
        qs = qb * bq + jnp.arange(bq, dtype=jnp.int32)
        src = jnp.minimum(qs, nq - 1)
        slot = load(wl_ref.at[b, src], mask=qs < nq, other=-1)
        ok = (qs < nq) & (slot >= 0) & (slot < num_slots)
        dest = jnp.where(ok, slot, num_slots)  # masked lanes park past the pool (interpreted, they write back)
        mask = ok[:, None] & col[None, :]
        store(pool(k_out, dest), load(kn_ref.at[b, src[:, None], h, c[None, :]], mask=mask, other=0), mask=mask)
        store(pool(v_out, dest), load(vn_ref.at[b, src[:, None], h, c[None, :]], mask=mask, other=0), mask=mask)

    qi, hh, qrow, row_ok, heads = _tile_rows(qb, h, rows=rows, grp=grp, grp_pad=grp_pad, bq=bq, nq=nq)
    last = jnp.where(row_ok, load(pos_ref.at[b, qrow]), -1)  # a query sees the keys 0..its position
    q = load(q_ref.at[b, jnp.minimum(qrow, nq - 1)[:, None], heads[:, None], c[None, :]],
             mask=row_ok[:, None] & col[None, :], other=0)
    j = jnp.arange(KEY_BLOCK, dtype=jnp.int32)
    prec = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    first = sp * (KEY_SPLIT // KEY_BLOCK)  # the split's first key block

    def step(t, carry):
        kp = (first + t) * KEY_BLOCK + j
        in_pre = kp < n_pre
        off = kp - n_pre
        fresh = (off >= 0) & (off < nq)
        d = jnp.clip(off, 0, nq - 1)
        page = load(pt_ref.at[b, jnp.clip(kp // g, 0, width - 1)], mask=in_pre, other=0)
        pre_slot = jnp.clip(page, 0, num_pages - 1) * g + kp % g
        seen = load(has_ref.at[b, qrow[:, None], d[None, :]], mask=row_ok[:, None] & fresh[None, :], other=0)
        ok = (in_pre[None, :] | (seen != 0)) & (kp[None, :] <= last[:, None]) & row_ok[:, None]  # [rows, KEY_BLOCK]
        split = jnp.max(load(conf_ref.at[b, qb, d], mask=fresh, other=0)) > 0

        def keys(carry, token, counted):  # the key tile: the prefix from the pool, fresh tokens from k_new / v_new
            need = jnp.max(counted.astype(jnp.int32), axis=0) > 0
            pre = (need & in_pre)[:, None] & col[None, :]
            new = (need & ~in_pre)[:, None] & col[None, :]
            at = (b, jnp.clip(token, 0, nq - 1)[:, None], h, c[None, :])
            k = jnp.where(pre, load(pool(k_ref, pre_slot), mask=pre, other=0), load(kn_ref.at[at], mask=new, other=0))
            v = jnp.where(pre, load(pool(v_ref, pre_slot), mask=pre, other=0), load(vn_ref.at[at], mask=new, other=0))
            return online_softmax_step(carry, q, k, v, counted, scale, prec)

        def shared(carry):  # every query of the block sees the same token at each position
            return keys(carry, load(canon_ref.at[b, qb, d], mask=fresh, other=0), ok)

        def per_query(carry):
            def one(u, carry):
                return keys(carry, load(tok_ref.at[b, qb * bq + u, d], mask=fresh, other=0), ok & (qi == u)[:, None])
            return jax.lax.fori_loop(0, bq, one, carry)

        return jax.lax.cond(split, per_query, shared, carry)

    # the split's blocks up to the one holding the block's last position (none for a split past it)
    top = jnp.max(last)
    blocks = jnp.clip((top + KEY_BLOCK) // KEY_BLOCK - first, 0, KEY_SPLIT // KEY_BLOCK)
    acc, m, l = jax.lax.fori_loop(0, blocks, step, online_softmax_init(rows, e_pad))
    # the block's own queries and heads only (other rows park on an out-of-range head, masked)
    dest = jnp.where(row_ok, h * grp + hh, grp * num_kv)
    store(acc_ref.at[b, qrow[:, None], sp, dest[:, None], c[None, :]], acc, mask=row_ok[:, None])
    store(ml_ref.at[b, qrow, sp, 0, dest], m, mask=row_ok)
    store(ml_ref.at[b, qrow, sp, 1, dest], l, mask=row_ok)


def _merge_kernel(acc_ref, ml_ref, o_ref, *, splits, nq, grp, grp_pad, bq, rows, head_dim, num_kv):
    """Second pass: one program per (request, block of queries, KV head) merges each row's splits in split
    order: ``out = sum_s 2**(m_s - M) acc_s / sum_s 2**(m_s - M) l_s`` with ``M = max_s m_s`` (a split past the
    query adds exact zeros, so the context's width never reaches the result). Row by row: a row's result does
    not depend on the others of its tile."""
    b, qb, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    e_pad = next_pow2(head_dim)
    c = jnp.arange(e_pad, dtype=jnp.int32)
    _, hh, qrow, row_ok, heads = _tile_rows(qb, h, rows=rows, grp=grp, grp_pad=grp_pad, bq=bq, nq=nq)
    top = load(ml_ref.at[b, qrow, 0, 0, heads])
    for sp in range(1, splits):  # the max is exact in any order
        top = jnp.maximum(top, load(ml_ref.at[b, qrow, sp, 0, heads]))
    top = jnp.where(top == -jnp.inf, 0.0, top)  # a row that sees nothing (a padding query): weights 0
    num = jnp.zeros((rows, e_pad), jnp.float32)
    den = jnp.zeros((rows,), jnp.float32)
    for sp in range(splits):  # split order, written out
        w = jnp.exp2(load(ml_ref.at[b, qrow, sp, 0, heads]) - top)
        den = den + load(ml_ref.at[b, qrow, sp, 1, heads]) * w
        num = num + load(acc_ref.at[b, qrow[:, None], sp, heads[:, None], c[None, :]]) * w[:, None]
    out = jnp.where(den[:, None] > 0, num / jnp.where(den > 0, den, 1.0)[:, None], 0.0).astype(o_ref.dtype)
    # other rows park on an out-of-range head (interpreted, a masked lane still writes its old value back)
    dest = jnp.where(row_ok, h * grp + hh, grp * num_kv)
    store(o_ref.at[b, jnp.minimum(qrow, nq - 1)[:, None], dest[:, None], c[None, :]], out,
          mask=row_ok[:, None] & (c < head_dim)[None, :])


def _triton(q, k_new, v_new, k_pool, v_pool, layer, page_table, prefix_lens, positions, qmask, write_locs, *,
            page_size, sm_scale, interpret):
    b, nq, hq, e = q.shape
    hkv = k_pool.shape[-2]
    num_slots = k_pool.shape[-3]
    grp = hq // hkv
    grp_pad, e_pad = next_pow2(grp), next_pow2(e)
    rows = max(TILE_ROWS, grp_pad)
    bq = rows // grp_pad  # queries per program
    nqb = cdiv(nq, bq)
    token, has, canon, conflict = _query_blocks(prefix_lens, positions, qmask, write_locs, num_slots, bq)
    pos = jnp.pad(positions, ((0, 0), (0, nqb * bq - nq)), constant_values=-1)
    layered = layer is not None
    lay = jnp.reshape(jnp.asarray(0 if layer is None else layer, jnp.int32), (1,))
    # every key a query can see lies below the page table's reach or among the fresh tokens
    splits = cdiv(page_table.shape[1] * page_size + nq, KEY_SPLIT)
    geometry = dict(grp=grp, grp_pad=grp_pad, bq=bq, rows=rows, head_dim=e, num_kv=hkv)
    kernel = functools.partial(
        _kernel, page_size=page_size, num_pages=num_slots // page_size, num_slots=num_slots,
        width=page_table.shape[1], nq=nq, scale=float(sm_scale * LOG2E), layered=layered, **geometry)
    args = (lay, page_table, prefix_lens, pos, write_locs, token, has.astype(jnp.int32), canon,
            conflict.astype(jnp.int32), q, k_new.astype(k_pool.dtype), v_new.astype(v_pool.dtype), k_pool, v_pool)
    acc, ml, k_pool, v_pool = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((b, nqb * bq, splits, hq, e_pad), jnp.float32),
                   jax.ShapeDtypeStruct((b, nqb * bq, splits, 2, hq), jnp.float32),
                   jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype), jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype)),
        grid=(b, nqb, hkv, splits),
        input_output_aliases={len(args) - 2: 2, len(args) - 1: 3},
        interpret=interpret,
        compiler_params=compiler_params(num_warps=4, num_stages=2),
        name=f"invariant_attention_g{page_size}",
    )(*args)
    merge = functools.partial(_merge_kernel, splits=splits, nq=nq, **geometry)
    out = pl.pallas_call(
        merge,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(b, nqb, hkv),
        interpret=interpret,
        compiler_params=compiler_params(num_warps=4, num_stages=1),
        name="invariant_attention_merge",
    )(acc, ml)
    return out, k_pool, v_pool


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


def resolve_invariant_attention(implementation: Implementation, interpret: bool) -> str:
    """``"triton"`` or ``"reference"`` for ``invariant_attention`` (``kernels._backend.resolve_implementation``)."""
    return resolve_implementation(implementation, interpret, backends=("triton",))


def invariant_attention(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, positions, qmask, write_locs, *,
                        page_size, sm_scale, layer=None, implementation: Implementation = "auto",
                        interpret: bool = False):
    """Store the fresh ``k_new, v_new [B, Q, Hkv, E]`` in the pools (``[X, Hkv, E]``, or ``[L, X, Hkv, E]`` with
    ``layer``, an int or ``i32[]``) at ``write_locs i32[B, Q]`` (a slot outside ``[0, X)`` is not written),
    then attend: ``q [B, Q, Hq, E]`` (the pool's dtype) with ``page_table i32[B, P]``, ``prefix_lens i32[B]``,
    ``positions i32[B, Q]`` (a fresh token sits at ``prefix_lens[b] + depth``) and ``qmask bool[B, Q, Q]``
    (each query sees itself and the fresh tokens on its path). Returns ``(out [B, Q, Hq, E] in q's dtype,
    k_pool, v_pool)``. Softmax and sums in float32. Jittable (traced inside the caller's jit)."""
    _check(q, k_new, k_pool, page_table, prefix_lens, positions, qmask, write_locs, layer)
    impl = resolve_invariant_attention(implementation, interpret)
    kw = dict(page_size=page_size, sm_scale=sm_scale)
    if impl == "triton":  # the kernel writes the fresh K/V itself
        return _triton(q, k_new, v_new, k_pool, v_pool, layer, page_table, prefix_lens, positions, qmask,
                       write_locs, interpret=interpret, **kw)
    k_pool, v_pool = write_fresh_kv(k_pool, v_pool, layer, write_locs.reshape(-1), k_new, v_new)
    k_one, v_one = one_layer(k_pool, v_pool, layer)
    out = _reference(q, k_one, v_one, page_table, prefix_lens, positions, qmask, write_locs, **kw)
    return out, k_pool, v_pool
