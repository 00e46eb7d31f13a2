"""SGLang 0.5.12 ``python/sglang/srt/speculative/multi_layer_eagle_utils.py``: ``rotate_input_ids_triton``,
``assign_hidden_states_pool_triton`` (MTP helpers; docs/ops.md, "rotate_input_ids" and "assign_hidden_states_pool").

``rotate_input_ids`` is unchanged in 0.5.23 (``python/sglang/kernels/ops/speculative/multi_layer_eagle.py``);
``assign_hidden_states_pool`` was removed there. Both upstream kernels update a buffer in place; here they
return the new buffer and donate the old one (``input_output_aliases`` + ``donate_argnames``), so XLA does
the update in place. Token ids are int32 here (SGLang: int64; identical values).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Int32, Shaped

from jax.experimental import pallas as pl

from jaxspec.kernels import _validate
from jaxspec.kernels import _triton
from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import KernelOp, cdiv, next_pow2
from jaxspec.kernels._triton import compiler_params, load, store

# Token lanes per shift iteration. Upstream uses 4096 when select_index is given (decode draft-extend
# windows are short: one iteration) and 8 otherwise; the result is a pure left shift for any block size, so
# we use one 128-lane vector (4 warps x 32 lanes).
ROTATE_BLOCK = 128
# Hidden features per program. Upstream loops one program per request over BLOCK_HID = 64 features; we
# spread (request, pool slot, feature block) over the grid so a 7168-wide bf16 row is 7 programs of 2 KiB.
HIDDEN_BLOCK = 1024
NUM_WARPS = 4
HIDDEN_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def _barrier(interpret: bool):
    """``tl.debug_barrier`` between the shift's loads and stores (threads of one program read lanes that
    other warps store). Interpret mode runs each op whole, so it needs (and has) no barrier."""
    if interpret:
        return
    _triton.debug_barrier()


# ----------------------------------------------------------------------------------------------------
# References (pure jnp, jittable).
# ----------------------------------------------------------------------------------------------------


def rotate_input_ids_reference(
    input_ids: Int32[Array, "T"],
    extend_start_loc: Int32[Array, "B"],
    extend_seq_lens: Int32[Array, "B"],
    new_tokens: Int32[Array, "B"],
    select_index: Int32[Array, "B"] | None = None,
) -> Int32[Array, "T"]:
    """Left-shift each segment ``[start, start + L)`` by one, then write ``new_tokens[b]`` at
    ``select_index[b]`` (absolute) or at the segment end ``start + L - 1``; ``L <= 0`` leaves the segment
    alone. Positions outside ``[0, T)`` are never read or written. ``new_tokens`` is already
    ``topk_index.flat[:B]``."""
    n = input_ids.shape[0]
    if n == 0 or extend_seq_lens.shape[0] == 0:
        return input_ids
    # Coverage of the shift targets [start, start + L - 1) through a difference array.
    lo = jnp.clip(extend_start_loc, 0, n)
    hi = jnp.where(extend_seq_lens >= 2, jnp.clip(extend_start_loc + extend_seq_lens - 1, 0, n), lo)
    hi = jnp.maximum(hi, lo)
    delta = jnp.zeros((n + 1,), jnp.int32).at[lo].add(1).at[hi].add(-1)
    covered = jnp.cumsum(delta)[:n] > 0
    t = jnp.arange(n, dtype=jnp.int32)
    shifted = jnp.where(covered & (t + 1 < n), input_ids[jnp.minimum(t + 1, n - 1)], input_ids)
    pos = extend_start_loc + extend_seq_lens - 1 if select_index is None else select_index
    ok = (extend_seq_lens > 0) & (pos >= 0) & (pos < n)
    return shifted.at[jnp.where(ok, pos, n)].set(new_tokens, mode="drop")


def assign_hidden_states_pool_reference(
    hidden_states: Shaped[Array, "T H"],
    req_pool_indices: Int32[Array, "B"],
    req_to_hidden_states_pool: Shaped[Array, "R S1 H"],
    extend_seq_lens: Int32[Array, "B"],
    extend_start_loc: Int32[Array, "B"],
) -> Shaped[Array, "R S1 H"]:
    """``pool[req_pool_indices[b], i, :] = hidden_states[end_b - S1 + i, :]`` for ``i < S1`` (``S1 = S - 1``,
    ``end_b = extend_start_loc[b] + extend_seq_lens[b]``). Source rows outside ``[0, T)`` read as zeros;
    out-of-range pool rows are not written."""
    n_rows, width, _ = req_to_hidden_states_pool.shape
    n_tok = hidden_states.shape[0]
    if width == 0 or req_pool_indices.shape[0] == 0:
        return req_to_hidden_states_pool
    end = extend_start_loc + extend_seq_lens
    src = end[:, None] - width + jnp.arange(width, dtype=jnp.int32)[None, :]
    src_ok = (src >= 0) & (src < n_tok)
    rows = hidden_states[jnp.clip(src, 0, max(n_tok - 1, 0))] if n_tok else jnp.zeros(
        src.shape + hidden_states.shape[1:], hidden_states.dtype)
    vals = jnp.where(src_ok[:, :, None], rows, jnp.zeros((), hidden_states.dtype))
    pool = req_pool_indices
    pool_ok = (pool >= 0) & (pool < n_rows)
    return req_to_hidden_states_pool.at[jnp.where(pool_ok, pool, n_rows)].set(vals, mode="drop")


# ----------------------------------------------------------------------------------------------------
# Pallas kernel bodies (whole-array refs in GPU global memory).
# ----------------------------------------------------------------------------------------------------


def _rotate_input_ids_kernel(
    start_ref,  # i32[B], GMEM
    len_ref,  # i32[B], GMEM
    tok_ref,  # i32[B], GMEM (topk_index.flat[:B])
    *refs,  # [select_ref i32[B]], ids_in_ref i32[T] (aliased, unused), ids_ref i32[T] (output), GMEM
    has_select: bool,
    interpret: bool,
):
    """One program per request, like upstream. Reads go through the output ref (the live, aliased buffer)
    so program order, not buffer identity, defines what a read sees."""
    select_ref = refs[0] if has_select else None
    ids_ref = refs[-1]
    n = ids_ref.shape[0]
    b = pl.program_id(0)
    start = start_ref[b]
    length = len_ref[b]
    new = tok_ref[b]
    iota = jnp.arange(ROTATE_BLOCK, dtype=jnp.int32)

    # Shift: ids[p] = ids[p + 1] for p in [start, start + L - 1), blockwise in increasing order, so every
    # read is ahead of all earlier writes; barriers keep other warps' stores behind this block's loads.
    def body(j, carry):
        k = j * ROTATE_BLOCK + iota
        p = start + k
        m = (k < length - 1) & (p >= 0) & (p + 1 < n)
        v = load(ids_ref.at[jnp.where(m, p + 1, 0)], mask=m, other=0)
        _barrier(interpret)
        store(ids_ref.at[jnp.where(m, p, n)], v, mask=m)
        _barrier(interpret)
        return carry

    lax.fori_loop(0, cdiv(jnp.maximum(length - 1, 0), ROTATE_BLOCK), body, 0)

    pos = select_ref[b] if has_select else start + length - 1

    @pl.when((length > 0) & (pos >= 0) & (pos < n))
    def _write_new_token():
        ids_ref[pos] = new


def _assign_hidden_states_pool_kernel(
    rpi_ref,  # i32[B], GMEM
    len_ref,  # i32[B], GMEM
    start_ref,  # i32[B], GMEM
    hid_ref,  # [T, H] float, GMEM
    pool_in_ref,  # [R, S1, H] float, GMEM (aliased with pool_ref; unused)
    pool_ref,  # [R, S1, H] float, GMEM (output)
    *,
    lanes: int,
):
    del pool_in_ref
    n_rows, width, hidden = pool_ref.shape
    n_tok = hid_ref.shape[0]
    b, i, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    pool = rpi_ref[b]
    src = start_ref[b] + len_ref[b] - width + i
    f = h * lanes + jnp.arange(lanes, dtype=jnp.int32)
    fm = f < hidden
    src_ok = (src >= 0) & (src < n_tok)
    rm = fm & src_ok
    vals = load(hid_ref.at[jnp.clip(src, 0, n_tok - 1), jnp.where(rm, f, 0)], mask=rm, other=0)
    wm = fm & (pool >= 0) & (pool < n_rows)
    store(pool_ref.at[jnp.clip(pool, 0, n_rows - 1), i, jnp.where(wm, f, hidden)], vals, mask=wm)


# ----------------------------------------------------------------------------------------------------
# Public wrappers.
# ----------------------------------------------------------------------------------------------------


def _rotate_checks(input_ids, starts, lens, topk, select):
    n = input_ids.shape[0]
    out = [
        (lens >= 0, "extend_seq_lens: negative length"),
        ((starts >= 0) & (starts + lens <= n), f"extend_start_loc/extend_seq_lens: segment outside input_ids[0:{n}]"),
    ]
    if select is not None:
        out.append(((lens <= 0) | ((select >= 0) & (select < n)), f"select_index: out of range [0, {n})"))
    return out


def _rotate_impl(input_ids, starts, lens, topk, select, *, implementation, interpret):
    n, batch = input_ids.shape[0], starts.shape[0]
    tokens = topk.reshape(-1)[:batch]  # upstream reads topk_index.flat[b]
    if implementation == "reference" or n == 0 or batch == 0:
        return rotate_input_ids_reference(input_ids, starts, lens, tokens, select)
    has_select = select is not None
    args = (starts, lens, tokens) + ((select,) if has_select else ()) + (input_ids,)
    return pl.pallas_call(
        functools.partial(_rotate_input_ids_kernel, has_select=has_select, interpret=interpret),
        out_shape=jax.ShapeDtypeStruct(input_ids.shape, jnp.int32),
        grid=(batch,),
        input_output_aliases={len(args) - 1: 0},
        compiler_params=compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"rotate_input_ids_{has_select=}",
    )(*args)


_ROTATE = KernelOp("rotate_input_ids", _rotate_impl, donate=(0,), checks=_rotate_checks,
                   unchanged=lambda ids, *_: ids)


def rotate_input_ids(
    input_ids,
    extend_start_loc,
    extend_seq_lens,
    topk_index,
    select_index=None,
    *,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Int32[Array, "T"]:
    """MTP input rotation (jitted; ``input_ids`` donated): returns the new ``i32[T]`` ids.

    For each request ``b`` with segment ``[start, start + L)`` (``extend_start_loc``, ``extend_seq_lens``):
    ``ids[start : start+L-1] = ids[start+1 : start+L]``, then, if ``L > 0``,
    ``ids[pos] = topk_index.flat[b]`` with ``pos = select_index[b]`` (an ABSOLUTE index) or
    ``start + L - 1``. ``L == 0`` leaves the segment untouched; ``L == 1`` only writes the token.

    ``topk_index`` may be ``[B]`` or ``[B, K]``; like upstream it is read as ``topk_index.flat[b]``, which is
    the request's token only for ``K == 1`` (with ``K > 1`` it picks ``topk_index[b // K, b % K]``).
    Preconditions (as upstream, where violations race): segments are disjoint and the write positions are
    distinct and outside other requests' segments. Out-of-range positions are never touched (checked mode
    reports them).
    """
    ids = _validate.index_array("input_ids", input_ids, (None,))
    starts = _validate.index_array("extend_start_loc", extend_start_loc, (None,))
    batch = starts.shape[0]
    lens = _validate.index_array("extend_seq_lens", extend_seq_lens, (batch,))
    topk = _validate.index_array("topk_index", topk_index)
    if topk.ndim not in (1, 2) or topk.size < batch:
        raise ValueError(f"topk_index: expected shape (B,) or (B, K) with at least B={batch} elements "
                         f"(read as topk_index.flat[b]), got topk_index.shape={tuple(topk.shape)}")
    select = _validate.index_array("select_index", select_index, (batch,), allow_none=True)
    return _ROTATE(ids, starts, lens, topk, select, implementation=implementation, interpret=interpret)


def _hidden_checks(hidden, rpi, pool, lens, starts):
    n_rows, width, _ = pool.shape
    n_tok = hidden.shape[0]
    end = starts + lens
    return [
        ((rpi >= 0) & (rpi < n_rows), f"req_pool_indices: pool index out of range [0, {n_rows})"),
        (lens >= 0, "extend_seq_lens: negative length"),
        ((end - width >= 0) & (end <= n_tok),
         f"assign_hidden_states_pool: source rows end-{width}..end-1 outside hidden_states[0:{n_tok}]"),
    ]


def _hidden_impl(hidden, rpi, pool, lens, starts, *, implementation, interpret):
    n_rows, width, hidden_dim = pool.shape
    n_tok, batch = hidden.shape[0], rpi.shape[0]
    if width == 0 or batch == 0:
        return pool
    if implementation == "reference" or n_tok == 0 or hidden_dim == 0:
        return assign_hidden_states_pool_reference(hidden, rpi, pool, lens, starts)
    lanes = min(HIDDEN_BLOCK, next_pow2(hidden_dim))
    return pl.pallas_call(
        functools.partial(_assign_hidden_states_pool_kernel, lanes=lanes),
        out_shape=jax.ShapeDtypeStruct(pool.shape, pool.dtype),
        grid=(batch, width, cdiv(hidden_dim, lanes)),
        input_output_aliases={4: 0},
        compiler_params=compiler_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
        name=f"assign_hidden_states_pool_{width=}",
    )(rpi, lens, starts, hidden, pool)


_HIDDEN = KernelOp("assign_hidden_states_pool", _hidden_impl, donate=(2,), checks=_hidden_checks,
                   unchanged=lambda hidden, rpi, pool, *_: pool)


def assign_hidden_states_pool(
    hidden_states,
    req_pool_indices,
    req_to_hidden_states_pool,
    extend_seq_lens,
    extend_start_loc,
    *,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> Shaped[Array, "R S1 H"]:
    """MTP hidden-state pool update (jitted; the pool is donated): returns the new pool.

    ``pool[req_pool_indices[b], i, :] = hidden_states[end_b - S1 + i, :]`` for ``i < S1``, where
    ``S1 = S - 1 = pool.shape[1]`` (upstream's ``pool_size``; ``S1 == 0`` is a no-op) and
    ``end_b = extend_start_loc[b] + extend_seq_lens[b]``: the last ``S1`` hidden rows of each segment.

    Hazard kept from upstream: when ``extend_seq_lens[b] < S1`` the rows before the segment (the previous
    request's tail) are copied. Rows before 0 or past ``T`` (undefined memory upstream) read as zeros here;
    out-of-range pool rows are not written. ``hidden_states`` ``[T, H]`` and the pool ``[R, S1, H]`` share a
    float dtype (bf16/f16/f32).
    """
    hidden = _validate.float_array("hidden_states", hidden_states, (None, None), HIDDEN_DTYPES)
    pool = _validate.float_array("req_to_hidden_states_pool", req_to_hidden_states_pool,
                                 (None, None, hidden.shape[1]), (hidden.dtype,))
    if pool.shape[0] < 1:
        raise ValueError(f"req_to_hidden_states_pool: expected at least one pool row, got shape {pool.shape}")
    rpi = _validate.index_array("req_pool_indices", req_pool_indices, (None,))
    batch = rpi.shape[0]
    lens = _validate.index_array("extend_seq_lens", extend_seq_lens, (batch,))
    starts = _validate.index_array("extend_start_loc", extend_start_loc, (batch,))
    return _HIDDEN(hidden, rpi, pool, lens, starts, implementation=implementation, interpret=interpret)


__all__ = [
    "assign_hidden_states_pool",
    "assign_hidden_states_pool_reference",
    "rotate_input_ids",
    "rotate_input_ids_reference",
]
