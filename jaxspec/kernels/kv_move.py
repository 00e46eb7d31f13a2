"""SGLang 0.5.23 ``MHATokenToKVPool.move_kv_cache`` / ``copy_all_layer_kv_cache_tiled``
(``python/sglang/srt/mem_cache/memory_pool.py``, ``python/sglang/kernels/ops/kvcache/cache_move.py``) and
``move_accept_tokens_to_target_kvcache`` + ``_compact_accept_to_front``
(``python/sglang/srt/speculative/spec_utils.py``, ``eagle_worker_common.py``); docs/ops.md, "move_accept_tokens_to_target_kvcache".

Pool layout: all layers stacked, ``k_buffer`` / ``v_buffer`` of shape ``(L, X, H, E)`` (slots ``X``, any
trailing feature dims, any dtype; bf16 typical), or the paged ``(L, X/G, G, Hkv, E)`` with ``paged=True``:
slot id = ``page * G + offset`` is exactly the row-major flattening of ``(X/G, G)``, so the same kernel
serves every page size (the wrapper reshapes to ``(L, X, F)``, a free bitcast).

Semantics: ``buf[:, tgt] = buf[:, src]`` for K and V, a parallel assignment. The Pallas kernel works in
place (``input_output_aliases``; the jitted wrappers donate the buffers) and moves K and V of all layers
in ONE launch. What it guarantees (see ``dynamic_validate_move`` for the exact rule):

* pairs are cut into consecutive *chunks* of ``MoveConfig.rows`` pairs; a chunk gathers all its source
  rows before it scatters (each thread owns one 16-byte column strip of every row of its chunk, so a
  thread's loads precede its stores to the same address);
* chunks are grouped into *spans* of ``span`` pairs, processed in index order by one program per
  (span, layer, feature tile); spans run in parallel.
* Hence the result equals the parallel assignment whenever every hazard (pair ``i`` reads a slot that a
  different pair ``j`` overwrites with another value) has ``i`` and ``j`` in the same span and
  ``chunk(i) <= chunk(j)``, and duplicate targets carry identical sources. ``span=None`` (one span) is
  safe for SGLang's packed accept move (a reader always precedes its writer: entry k reads window slot
  ``a_k >= k``); ``move_accept_tokens_to_target_kvcache`` lays pairs out request-aligned so that spans
  are independent and the move runs fully parallel.
* pairs with ``tgt == src`` (the root self-copy, the ``0 <- 0`` padding) are skipped: no traffic.
* every other pair list would be order-dependent, so ``move_kv_cache`` never runs the kernel on one: pair
  lists known on the host are checked there (``unordered_pair_error``, O(n log n)): ``auto`` runs the
  reference for them, an explicit kernel is refused with a ``ValueError`` naming the pair; traced ones are checked in the program, which runs the reference for
  them (``lax.cond``); checked mode checks the same rule before the move and writes nothing when it fails.

Out-of-range values (one rule, reference and kernel alike): a pair whose ``tgt`` or ``src`` slot lies
outside ``[0, X)`` is dropped (nothing written, no wrap-around to slot ``X - 1``). In the accept move a
request's moved entries are its leading ``k < min(accept_lens[b], A, N)`` entries whose node ids lie in
``[b*N, (b+1)*N)`` (its own) in increasing order; the row is cut at the first entry that is not (so no
other request's slot is read or written).
Checked mode flags all of these, and traced hazards (``move_hazards``), before anything is written
(``jaxspec/kernels/_dispatch.py``).
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int32

from jax.experimental import pallas as pl

from jaxspec.kernels._validate import checks_enabled, has_tracer, index_array, static_int
from jaxspec.kernels._backend import Implementation
from jaxspec.kernels._dispatch import KernelOp, next_pow2
from jaxspec.kernels._triton import compiler_params, load, store
from jaxspec.kernels.cache_locs import fill_accept_out_cache_loc_reference, fill_front_out_cache_loc_reference

# One 16-byte vector per thread per row: the widest global access on sm_90 (LDG.128/STG.128).
VECTOR_BYTES = 16
_WARP = 32


@dataclasses.dataclass(frozen=True)
class MoveConfig:
    """Static tiling of the KV-move kernel.

    rows: pairs per chunk (power of two). Bytes in flight per program = rows * 2 (K, V) * tile bytes;
      Little's law on the H200 (~4.5 TB/s x ~1 us) wants a few MB in flight GPU-wide, i.e.
      rows * L * 2 * row_bytes >= ~2 MB: 16 rows at 32 x 2048-byte rows -> 2 MB.
    num_warps: warps per program. The feature tile is ``VECTOR_BYTES/itemsize * 32 * num_warps``
      elements (256 bf16 at one warp) so that Triton's blocked layout gives every thread one 16-byte
      column strip across all rows of the chunk (the gather-before-scatter argument above).
    """

    rows: int = 16
    num_warps: int = 1

    def __post_init__(self):
        for name in ("rows", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"MoveConfig.{name}: expected a power of two >= 1, got {v!r}")

    def feature_tile(self, features: int, itemsize: int) -> int:
        tile = max(VECTOR_BYTES // itemsize, 1) * _WARP * self.num_warps
        return min(tile, next_pow2(features))


DEFAULT_CONFIG = MoveConfig()


class KVBuffers(NamedTuple):
    """The (new) stacked pool buffers, same shapes/dtypes as given."""

    k_buffer: Array
    v_buffer: Array


# ----------------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------------


def _as_rows(buf, paged: bool):
    if paged:
        if buf.ndim < 3:
            raise ValueError(f"paged pool: expected (L, X/G, G, ...), got shape {buf.shape}")
        return buf.reshape(buf.shape[0], buf.shape[1] * buf.shape[2], -1)
    if buf.ndim < 2:
        raise ValueError(f"pool: expected (L, X, ...), got shape {buf.shape}")
    return buf.reshape(buf.shape[0], buf.shape[1], -1)


def move_kv_cache_reference(k_buffer, v_buffer, tgt_loc, src_loc, *, paged=False):
    """``buf.at[:, tgt].set(buf[:, src])`` for K and V (XLA gather + scatter; parallel assignment); pairs
    with a slot outside ``[0, X)`` are dropped."""
    out = []
    for buf in (k_buffer, v_buffer):
        rows = _as_rows(buf, paged)
        x = rows.shape[1]
        ok = (tgt_loc >= 0) & (tgt_loc < x) & (src_loc >= 0) & (src_loc < x)
        vals = rows[:, jnp.clip(src_loc, 0, max(x - 1, 0))]
        out.append(rows.at[:, jnp.where(ok, tgt_loc, x)].set(vals, mode="drop").reshape(buf.shape))
    return KVBuffers(*out)


def compact_accept_to_front_reference(x, accept_index, *, num_draft_tokens):
    """``out.reshape(B, N, ...)[:, :A] = x[clip(accept_index, 0).reshape(-1)].reshape(B, A, ...)``;
    ``-1`` entries clamp to global node 0 (they land past ``accept_lens``, never read upstream)."""
    bs, a = accept_index.shape
    n = num_draft_tokens
    # One gather over every row, rows past A reading themselves: a gather plus an update of [:, :A] would be,
    # at B = 1, a contiguous copy that XLA:GPU runs as a dynamic-slice copy on a second stream, outside its
    # command buffers (H200: it split the batch-1 adaptive loop, whose tree segment holds this op)
    own = jnp.arange(bs * n, dtype=jnp.int32).reshape(bs, n)
    src = jnp.concatenate([jnp.maximum(accept_index, 0), own[:, a:]], axis=1)
    return x[src.reshape(-1)]


def accepted_prefix(accept_index, accept_lens, num_draft_tokens: int):
    """The entries the accept move uses: row b keeps its leading ``k < min(accept_lens[b], A, N)`` entries that
    are node ids of request b (in ``[b*N, (b+1)*N)``) in increasing order, cut at the first entry that is not;
    returns ``(accept_index, accept_lens)`` with the rest set to -1 / counted out. The identity on verify's legal
    outputs (the root, then the accepted nodes, each a child of the one before: increasing ids), and what makes
    the kernel's request-aligned move equal the reference for every input: entry k then reads window slot
    ``>= k`` of its own request only."""
    bs, a = accept_index.shape
    n = num_draft_tokens
    k = jnp.arange(a, dtype=jnp.int32)[None, :]
    first = jnp.arange(bs, dtype=jnp.int32)[:, None] * n
    prev = jnp.concatenate([jnp.full((bs, 1), -1, jnp.int32), accept_index[:, :-1]], axis=1)
    good = (k < accept_lens[:, None]) & (k < n) & (accept_index >= first) & (accept_index < first + n)
    good = good & (accept_index > prev)
    keep = jnp.cumprod(good.astype(jnp.int32), axis=1) > 0
    return jnp.where(keep, accept_index, -1), jnp.sum(keep, axis=1, dtype=jnp.int32)


def move_accept_pairs_reference(accept_index, accept_lens, out_cache_loc):
    """0.5.23 packed pairs: ``tgt = fill_front(accept_lens, out_cache_loc)``, ``src = fill_accept(...)``
    over ``accepted_prefix`` of the inputs."""
    bs, a = accept_index.shape
    if bs:
        accept_index, accept_lens = accepted_prefix(accept_index, accept_lens, out_cache_loc.shape[0] // bs)
    tgt = fill_front_out_cache_loc_reference(accept_lens, out_cache_loc, width=a)
    src = fill_accept_out_cache_loc_reference(accept_index, out_cache_loc)
    return tgt, src


def move_accept_tokens_to_target_kvcache_reference(k_buffer, v_buffer, accept_index, accept_lens, out_cache_loc, *, paged=False):
    tgt, src = move_accept_pairs_reference(accept_index, accept_lens, out_cache_loc)
    return move_kv_cache_reference(k_buffer, v_buffer, tgt, src, paged=paged)


# ----------------------------------------------------------------------------------------------------
# Host-side validation (tier b)
# ----------------------------------------------------------------------------------------------------


def run_span(n: int, span: int | None, rows: int) -> int:
    """Pairs per program group as the kernel runs ``n`` pairs: ``span`` (``None``: all ``n``) rounded up to
    whole chunks of ``rows``."""
    s = n if span is None else span
    return max(rows, -(-s // rows) * rows)


def _order_problems(tgt, src, *, rows: int, span: int, num_slots: int, xp):
    """``(dup, unordered, writer)`` per pair, in O(n log n) (two sorts and binary searches, NumPy or jnp).

    A pair is *live* when both slots lie in ``[0, num_slots)`` (others are dropped by every implementation) and
    *active* when it is live and ``tgt != src`` (self-copies move nothing). ``dup[i]``: live pair ``i``'s target
    is written by a live pair from a different source. ``unordered[i]``: active pair ``i`` reads a slot that an
    active pair ``writer[i]`` overwrites where the kernel does not run ``i`` first (another span, or an earlier
    chunk); the writer checked is the first or the last one by index, which decide it (chunks and spans are
    runs of consecutive pairs)."""
    n = tgt.shape[0]
    i = xp.arange(n, dtype=tgt.dtype)
    live = (tgt >= 0) & (tgt < num_slots) & (src >= 0) & (src < num_slots)
    active = live & (tgt != src)
    # (dup) sort by (target, source): a target's first and last source differ
    key = xp.where(live, tgt, num_slots)
    order = xp.lexsort((src, key))
    k_sorted, s_sorted = key[order], src[order]
    first = xp.searchsorted(k_sorted, key, side="left")
    last = xp.searchsorted(k_sorted, key, side="right") - 1
    dup = live & (s_sorted[first] != s_sorted[last])
    # (order) the active writers of each slot, sorted by (slot, index): the first and the last writer of src[i]
    wkey = xp.where(active, tgt, num_slots)
    worder = xp.lexsort((i, wkey))
    w_sorted = wkey[worder]
    want = xp.where(active, src, -1)  # -1: no pair writes it
    lo = xp.searchsorted(w_sorted, want, side="left")
    hi = xp.searchsorted(w_sorted, want, side="right")
    has = hi > lo
    j_first = worder[xp.clip(lo, 0, n - 1)]
    j_last = worder[xp.clip(hi - 1, 0, n - 1)]
    sp, ch = i // span, i // rows
    early = (sp[j_first] != sp) | (sp[j_last] != sp) | (ch[j_first] < ch)
    unordered = active & has & early
    writer = xp.where((sp[j_first] != sp) | (ch[j_first] < ch), j_first, j_last)
    return dup, unordered, writer


def move_hazards(tgt, src, *, rows: int, span: int, num_slots: int, xp=np):
    """Boolean ``(n,)`` per pair: True where the kernel's result may differ from the parallel assignment
    because of pair ``i``: (dup) its target is also written from a different source, or (order) it reads a
    slot that another pair overwrites and the kernel may run the writer first (the writer in another span,
    or in an earlier chunk). Only live pairs count (both slots in ``[0, num_slots)``; others are dropped).
    ``span``: the kernel's span (``run_span``). O(n log n); ``xp=jnp`` inside a trace."""
    if tgt.shape[0] == 0:
        return xp.zeros((0,), bool)
    dup, unordered, _ = _order_problems(tgt, src, rows=rows, span=span, num_slots=num_slots, xp=xp)
    return dup | unordered


def unordered_pair_error(tgt, src, num_slots: int, *, span: int | None = None, config: MoveConfig = DEFAULT_CONFIG):
    """The reason the Pallas move of these (host) pairs could differ from the parallel assignment, or None.

    ``span``/``config`` as given to ``move_kv_cache``; pairs with a slot outside ``[0, num_slots)`` are
    dropped (no reason)."""
    tgt = np.asarray(tgt).astype(np.int64).reshape(-1)
    src = np.asarray(src).astype(np.int64).reshape(-1)
    n = tgt.shape[0]
    if n == 0:
        return None
    sp = run_span(n, span, config.rows)
    dup, unordered, writer = _order_problems(tgt, src, rows=config.rows, span=sp, num_slots=num_slots, xp=np)
    if dup.any():
        k = int(np.argmax(dup))
        j = int(np.argmax(dup & (tgt == tgt[k]) & (src != src[k])))
        return (f"duplicate target slot {int(tgt[k])} written from different sources "
                f"(pairs {k}: {int(tgt[k])} <- {int(src[k])} and {j}: {int(tgt[j])} <- {int(src[j])})")
    if unordered.any():
        k = int(np.argmax(unordered))
        j = int(writer[k])
        where = "another span" if j // sp != k // sp else "an earlier chunk"
        return (f"overlapping move: pair {k} ({int(tgt[k])} <- {int(src[k])}) reads slot {int(src[k])}, which "
                f"pair {j} ({int(tgt[j])} <- {int(src[j])}) overwrites in {where}: the kernel may write it "
                f"first (rows={config.rows}, span={sp})")
    return None


def dynamic_validate_move(tgt_loc, src_loc, num_slots: int, *, span: int | None = None, config: MoveConfig = DEFAULT_CONFIG):
    """Raise ``ValueError`` unless ``move_kv_cache(..., tgt_loc, src_loc, span=span, config=config)`` is
    exactly the parallel assignment ``buf[tgt] = buf[src]``: slots in ``[0, num_slots)``, no target written
    from two different sources, and every hazard ordered as the kernel guarantees (module docstring).

    The legal 0.5.23 accept pattern (packed, request-major, ``0 <- 0`` padding) passes with ``span=None``.
    """
    tgt = np.asarray(tgt_loc).astype(np.int64).reshape(-1)
    src = np.asarray(src_loc).astype(np.int64).reshape(-1)
    if tgt.shape != src.shape:
        raise ValueError(f"tgt_loc/src_loc: expected equal lengths, got {tgt.shape} and {src.shape}")
    for name, x in (("tgt_loc", tgt), ("src_loc", src)):
        bad = (x < 0) | (x >= num_slots)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"{name}[{k}] = {int(x[k])} is out of range [0, {num_slots})")
    reason = unordered_pair_error(tgt, src, num_slots, span=span, config=config)
    if reason is not None:
        raise ValueError(reason)


# ----------------------------------------------------------------------------------------------------
# Pallas kernel
# ----------------------------------------------------------------------------------------------------


def _move_kernel(tgt_ref, src_ref, k_in, v_in, k_ref, v_ref, *, rows, span, tile, features, num_slots):
    # tgt_ref, src_ref i32[n_pad] | k_in, v_in: aliased inputs (unused: the outputs alias the same HBM)
    # k_ref, v_ref T[L, X, D] HBM, updated in place.
    del k_in, v_in
    s_id, layer, f_id = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    cols = f_id * tile + jnp.arange(tile, dtype=jnp.int32)
    col_ok = cols < features

    def chunk(c, carry):
        base = s_id * span + c * rows
        t = tgt_ref[pl.ds(base, rows)]
        s = src_ref[pl.ds(base, rows)]
        # self-copies and 0 <- 0 padding move nothing; pairs with a slot outside [0, X) are dropped
        act = (t != s) & (t >= 0) & (t < num_slots) & (s >= 0) & (s < num_slots)
        m = act[:, None] & col_ok[None, :]
        s_idx = jnp.where(act, s, 0)[:, None]
        t_idx = jnp.where(act, t, num_slots)[:, None]  # park masked rows out of range (interpret trap)
        # gather K and V of the whole chunk before any scatter
        kv = load(k_ref.at[layer, s_idx, cols[None, :]], mask=m)
        vv = load(v_ref.at[layer, s_idx, cols[None, :]], mask=m)
        store(k_ref.at[layer, t_idx, cols[None, :]], kv, mask=m)
        store(v_ref.at[layer, t_idx, cols[None, :]], vv, mask=m)
        return carry

    jax.lax.fori_loop(0, span // rows, chunk, 0)


def _move_pallas(k3, v3, tgt, src, *, span, config, interpret):
    n = tgt.shape[0]
    layers, num_slots, features = k3.shape
    rows = config.rows
    span = run_span(n, span, rows)
    n_pad = -(-n // span) * span
    if n_pad != n:
        pad = jnp.zeros((n_pad - n,), jnp.int32)
        tgt, src = jnp.concatenate([tgt, pad]), jnp.concatenate([src, pad])
    tile = config.feature_tile(features, k3.dtype.itemsize)
    grid = (n_pad // span, layers, pl.cdiv(features, tile))
    kernel = functools.partial(
        _move_kernel, rows=rows, span=span, tile=tile, features=features, num_slots=num_slots
    )
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(k3.shape, k3.dtype), jax.ShapeDtypeStruct(v3.shape, v3.dtype)),
        grid=grid,
        input_output_aliases={2: 0, 3: 1},
        interpret=interpret,
        # num_stages=1: no software pipelining, so chunk c+1's loads never move above chunk c's stores.
        compiler_params=compiler_params(num_warps=config.num_warps, num_stages=1),
        name=f"move_kv_cache_rows{rows}_span{span}_tile{tile}",
    )(tgt, src, k3, v3)


# ----------------------------------------------------------------------------------------------------
# Public wrappers
# ----------------------------------------------------------------------------------------------------


def _check_pool(k_buffer, v_buffer, paged):
    if k_buffer is v_buffer:  # both are donated and written: one array cannot be both pools
        raise ValueError("k_buffer/v_buffer: the same array passed twice; expected the K pool and the V pool, two "
                         "distinct buffers")
    for name, b in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if not jnp.issubdtype(b.dtype, jnp.floating) and not jnp.issubdtype(b.dtype, jnp.integer):
            raise ValueError(f"{name}: expected a float (or raw integer) KV dtype, got {b.dtype}")
        if b.ndim < (3 if paged else 2):
            raise ValueError(f"{name}: expected shape {'(L, X/G, G, ...)' if paged else '(L, X, ...)'}, got {b.shape}")
    lead = 3 if paged else 2
    if k_buffer.shape[:lead] != v_buffer.shape[:lead]:
        raise ValueError(f"k_buffer/v_buffer: slot dims differ: {k_buffer.shape=} {v_buffer.shape=}")
    return int(np.prod(k_buffer.shape[1:lead]))


def _move(k_buffer, v_buffer, tgt, src, *, span, paged, config, impl, interpret, ordered=True):
    """The move; ``ordered=False``: the pairs were not checked on the host, so the program checks them and
    runs the reference where the kernel could not order them (``lax.cond``)."""
    if tgt.shape[0] == 0 or k_buffer.size == 0:
        return KVBuffers(k_buffer, v_buffer)
    if impl == "reference":
        return move_kv_cache_reference(k_buffer, v_buffer, tgt, src, paged=paged)

    def kernel(k_buffer, v_buffer):
        k3, v3 = _as_rows(k_buffer, paged), _as_rows(v_buffer, paged)
        kk, vv = _move_pallas(k3, v3, tgt, src, span=span, config=config, interpret=interpret)
        return KVBuffers(kk.reshape(k_buffer.shape), vv.reshape(v_buffer.shape))

    if ordered:
        return kernel(k_buffer, v_buffer)
    num_slots = _as_rows(k_buffer, paged).shape[1]
    bad = jnp.any(move_hazards(tgt, src, rows=config.rows, span=run_span(tgt.shape[0], span, config.rows),
                               num_slots=num_slots, xp=jnp))
    reference = functools.partial(move_kv_cache_reference, tgt_loc=tgt, src_loc=src, paged=paged)
    return KVBuffers(*jax.lax.cond(bad, lambda k, v: tuple(reference(k, v)), lambda k, v: tuple(kernel(k, v)),
                                   k_buffer, v_buffer))


def _unchanged(k_buffer, v_buffer, *_):
    return KVBuffers(k_buffer, v_buffer)


def _move_checks(k_buffer, v_buffer, tgt, src, *, span, paged, config, ordered=True):
    del ordered  # the hazard rule is checked either way
    num_slots = int(np.prod(k_buffer.shape[1:(3 if paged else 2)]))
    pad = src <= PAD_SRC  # bucket padding (``_bucket_pairs``): dropped by design, not an error
    out = [
        ((tgt >= 0) & (tgt < num_slots) | pad, f"move_kv_cache: tgt_loc out of range [0, {num_slots})"),
        ((src >= 0) & (src < num_slots) | pad, f"move_kv_cache: src_loc out of range [0, {num_slots})"),
    ]
    if tgt.shape[0]:
        sp = run_span(tgt.shape[0], span, config.rows)
        out.append((~jnp.any(move_hazards(tgt, src, rows=config.rows, span=sp, num_slots=num_slots, xp=jnp)),
                    "move_kv_cache: overlapping src/tgt pairs (order-dependent move)"))
    return out


PAD_SRC = -(1 << 30)  # source slot of a bucket-padding pair (and below): out of range, so the pair is dropped


def _bucket_pairs(tgt, src):
    """Pad the pair list to the next power of two (concrete inputs only: a traced call compiles with its
    caller), so that new pair counts reuse executables. Padding pairs are out of range in both slots, so
    every implementation drops them; targets ``-1, -2, ...`` and sources ``PAD_SRC, PAD_SRC - 1, ...`` are
    all distinct, so the hazard rule never sees them collide with each other or with a real slot."""
    n = tgt.shape[0]
    nb = next_pow2(n) if n else 0
    if nb == n or has_tracer((tgt, src)):
        return tgt, src
    k = jnp.arange(nb - n, dtype=jnp.int32)
    return jnp.concatenate([tgt, -1 - k]), jnp.concatenate([src, PAD_SRC - k])


def _move_impl(k_buffer, v_buffer, tgt, src, *, span, paged, config, ordered, implementation, interpret):
    return _move(k_buffer, v_buffer, tgt, src, span=span, paged=paged, config=config, impl=implementation,
                 interpret=interpret, ordered=ordered)


_MOVE = KernelOp("move_kv_cache", _move_impl, static=("span", "paged", "config", "ordered"), donate=(0, 1),
                 checks=_move_checks, unchanged=_unchanged)


def _unequal_rows(k_buffer, v_buffer, paged) -> str | None:
    """Why the Pallas move cannot take these pools (it moves K and V in one launch), or None."""
    k3, v3 = _as_rows(k_buffer, paged), _as_rows(v_buffer, paged)
    if k3.shape[2] != v3.shape[2] or k3.dtype != v3.dtype:
        return (f"needs k_buffer/v_buffer rows of equal width and dtype (one launch moves both), got "
                f"{k_buffer.shape} {k_buffer.dtype} and {v_buffer.shape} {v_buffer.dtype}")
    return None


def move_kv_cache(
    k_buffer: Array,
    v_buffer: Array,
    tgt_loc: Int32[Array, " n"],
    src_loc: Int32[Array, " n"],
    *,
    span: int | None = None,
    paged: bool = False,
    config: MoveConfig = DEFAULT_CONFIG,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> KVBuffers:
    """Move KV rows of every layer: ``buf[:, tgt] = buf[:, src]`` for K and V, in place (buffers donated).

    ``k_buffer``/``v_buffer``: ``(L, X, *features)`` or, with ``paged=True``, ``(L, X/G, G, *features)``;
    locations are slot ids (``page * G + offset``). ``span``: pairs per independent program group (see the
    module docstring; ``None`` = one group, safe for any read-before-write-in-index-order pattern such as
    SGLang's packed accept move). Pairs with a slot outside ``[0, X)`` are dropped. Concrete pair lists are
    padded to a power of two with dropped pairs (one executable per bucket, not per count). A Pallas move of
    pairs the kernel cannot order (module docstring) runs the reference (``auto``, and traced pairs) or is
    refused (host pairs with an explicit kernel: ``ValueError``). Checked mode: slots in range, and the hazard rule of
    ``dynamic_validate_move``, checked before the move (a failure writes nothing).
    """
    _check_pool(k_buffer, v_buffer, paged)
    tgt = index_array("tgt_loc", tgt_loc, (None,))
    src = index_array("src_loc", src_loc, (tgt.shape[0],))
    if span is not None:
        static_int("span", span, 1)
    # The kernel's order rule: checked mode checks it before the move (and writes nothing when it fails);
    # otherwise host pairs are checked here (``auto`` then runs the reference, an explicit kernel is refused) and
    # traced ones in the program (``_move``'s ``ordered=False``).
    host = checks_enabled() or not has_tracer((tgt, src))

    def unsupported(backend):
        reason = _unequal_rows(k_buffer, v_buffer, paged)
        if reason is None and host and not checks_enabled():
            order = unordered_pair_error(tgt, src, _check_pool(k_buffer, v_buffer, paged), span=span, config=config)
            if order is not None:
                reason = (f"cannot order these pairs (tgt_loc/src_loc): the move would differ from the parallel "
                          f"assignment: {order}; reorder the pairs or use implementation='reference'")
        return reason

    impl = _MOVE.resolve(implementation, interpret, unsupported=unsupported)
    ordered = impl != "reference" and host
    tgt, src = _bucket_pairs(tgt, src)
    return _MOVE(k_buffer, v_buffer, tgt, src, span=span, paged=bool(paged), config=config, ordered=ordered,
                 implementation=impl, interpret=interpret)


def _aligned_accept_pairs(accept_index, accept_lens, out_cache_loc, width):
    """Request-aligned pairs ``(B, width)``: row b, entry k < accept_lens[b]: ``window[b, k] <- ocl[accept_index[b, k]]``;
    other entries ``0 <- 0`` (skipped). Same pool effect as 0.5.23's packed pairs when each row's valid
    entries are its first ``accept_lens[b]`` (``accepted_prefix`` makes them so)."""
    bs, a = accept_index.shape
    n = out_cache_loc.shape[0] // bs
    k = jnp.arange(width, dtype=jnp.int32)
    use = (k[None, :] < accept_lens[:, None]) & (k[None, :] < a)
    ai = jnp.pad(accept_index, ((0, 0), (0, width - a)), constant_values=-1)
    tgt = out_cache_loc[jnp.arange(bs, dtype=jnp.int32)[:, None] * n + jnp.minimum(k, n - 1)[None, :]]
    src = out_cache_loc[jnp.clip(ai, 0, out_cache_loc.shape[0] - 1)]
    zero = jnp.zeros_like(tgt)
    return jnp.where(use, tgt, zero).reshape(-1), jnp.where(use, src, zero).reshape(-1)


def _accept_pairs(ai, lens, ocl, config):
    """The Pallas path's request-aligned pairs of ``accepted_prefix``'s entries, and their span (whole requests
    per span: requests never straddle spans)."""
    bs, a = ai.shape
    ai, lens = accepted_prefix(ai, lens, ocl.shape[0] // bs)
    width = next_pow2(a)
    tgt, src = _aligned_accept_pairs(ai, lens, ocl, width)
    return tgt, src, max(width, config.rows)


def _accept_move_checks(k_buffer, v_buffer, ai, lens, ocl, *, paged, config):
    bs, a = ai.shape
    n = ocl.shape[0] // bs
    kk = jnp.arange(a, dtype=jnp.int32)
    num_slots = int(np.prod(k_buffer.shape[1:(3 if paged else 2)]))
    valid = kk[None, :] < lens[:, None]
    first = jnp.arange(bs, dtype=jnp.int32)[:, None] * n
    prev = jnp.concatenate([jnp.full((bs, 1), -1, jnp.int32), ai[:, :-1]], axis=1)
    tgt, src, span = _accept_pairs(ai, lens, ocl, config)
    return [
        ((lens >= 0) & (lens <= min(a, n)), f"accept_lens: expected values in [0, min(A, N) = {min(a, n)}]"),
        ((ai >= 0) == (kk[None, :] < lens[:, None]),
         "accept_index: the valid (>= 0) entries of row b must be its first accept_lens[b] entries"),
        ((ai >= -1) & (ai < ocl.shape[0]), f"accept_index: expected -1 or a node id in [0, {ocl.shape[0]})"),
        ((ocl >= 0) & (ocl < num_slots), f"out_cache_loc: slot out of range [0, {num_slots})"),
        (~valid | ((ai >= first) & (ai < first + n) & (ai > prev)),
         "accept_index: row b's entries must be node ids of request b, in [b*N, (b+1)*N), in increasing order"),
        (~jnp.any(move_hazards(tgt, src, rows=config.rows, span=run_span(tgt.shape[0], span, config.rows),
                               num_slots=num_slots, xp=jnp)),
         "out_cache_loc: a slot in two requests' windows (or twice in one): the move would depend on its order"),
    ]


def _accept_move_impl(k_buffer, v_buffer, ai, lens, ocl, *, paged, config, implementation, interpret):
    if implementation == "reference":
        return move_accept_tokens_to_target_kvcache_reference(k_buffer, v_buffer, ai, lens, ocl, paged=paged)
    tgt, src, span = _accept_pairs(ai, lens, ocl, config)
    return _move(k_buffer, v_buffer, tgt, src, span=span, paged=paged, config=config, impl=implementation,
                 interpret=interpret)


_ACCEPT_MOVE = KernelOp("move_accept_tokens_to_target_kvcache", _accept_move_impl, static=("paged", "config"),
                        donate=(0, 1), checks=_accept_move_checks, unchanged=_unchanged)


def move_accept_tokens_to_target_kvcache(
    k_buffer: Array,
    v_buffer: Array,
    accept_index: Int32[Array, "B A"],
    accept_lens: Int32[Array, " B"],
    out_cache_loc: Int32[Array, " BN"],
    *,
    paged: bool = False,
    config: MoveConfig = DEFAULT_CONFIG,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> KVBuffers:
    """0.5.23 spec-accept KV move (K > 1 only upstream): the accepted path's KV rows go to the front of
    each request's verify window. ``src = fill_accept_out_cache_loc(accept_index, out_cache_loc)``,
    ``tgt = fill_front_out_cache_loc(accept_lens, out_cache_loc, width=A)`` (``accept_lens`` =
    ``num_correct_drafts + 1``), then ``move_kv_cache(tgt, src)``. Buffers donated; returns the new ones.

    Out-of-range entries follow ``accepted_prefix`` (module docstring): never a write to another request's
    slots. The Pallas path lays the same pairs out request-aligned (one 2^k-padded row of pairs per request)
    so that programs are independent (every hazard lies inside one request and reads precede writes).
    """
    _check_pool(k_buffer, v_buffer, paged)
    ai = index_array("accept_index", accept_index, (None, None))
    bs, a = ai.shape
    lens = index_array("accept_lens", accept_lens, (bs,))
    ocl = index_array("out_cache_loc", out_cache_loc, (None,))
    if bs == 0 or a == 0:
        return KVBuffers(k_buffer, v_buffer)
    if ocl.shape[0] % bs:
        raise ValueError(f"out_cache_loc: expected B*N entries with B={bs}, got out_cache_loc.shape={ocl.shape}")
    impl = _ACCEPT_MOVE.resolve(implementation, interpret, unsupported=lambda b: _unequal_rows(k_buffer, v_buffer, paged))
    return _ACCEPT_MOVE(k_buffer, v_buffer, ai, lens, ocl, paged=bool(paged), config=config, implementation=impl,
                        interpret=interpret)


def _compact_impl(x, ai, *, num_draft_tokens, implementation, interpret):
    del implementation, interpret  # one XLA gather; no Pallas kernel
    return compact_accept_to_front_reference(x, ai, num_draft_tokens=num_draft_tokens)


_COMPACT = KernelOp("compact_accept_to_front", _compact_impl, static=("num_draft_tokens",), backends=())


def compact_accept_to_front(x: Array, accept_index: Int32[Array, "B A"], *, num_draft_tokens: int) -> Array:
    """Rewrite node-indexed ``x`` (``predict`` ``(B*N,)``, hidden ``(B*N, H)``) so the accepted path sits at
    the front of each request's ``N``-block (0.5.23 ``_compact_accept_to_front``); ``-1`` clamps to global
    node 0. One XLA gather (no Pallas kernel: it is a few KB to a few MB of contiguous rows)."""
    ai = index_array("accept_index", accept_index, (None, None))
    n = static_int("num_draft_tokens", num_draft_tokens, 1)
    bs, a = ai.shape
    if x.shape[:1] != (bs * n,):
        raise ValueError(f"x: expected leading dim B*N = {bs * n}, got {x.shape=}")
    if a > n:
        raise ValueError(f"accept_index: expected A <= N = {n}, got {ai.shape=}")
    return _COMPACT(jnp.asarray(x), ai, num_draft_tokens=n, implementation="reference")


__all__ = [
    "DEFAULT_CONFIG",
    "KVBuffers",
    "MoveConfig",
    "compact_accept_to_front",
    "compact_accept_to_front_reference",
    "dynamic_validate_move",
    "move_accept_pairs_reference",
    "move_accept_tokens_to_target_kvcache",
    "move_accept_tokens_to_target_kvcache_reference",
    "move_hazards",
    "move_kv_cache",
    "move_kv_cache_reference",
    "run_span",
    "unordered_pair_error",
]
