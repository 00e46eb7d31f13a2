"""The slot API: one decode state of ``B`` rows ("slots") that requests enter, decode in and leave.

JetStream's ``prefill`` / ``insert`` / ``generate`` / ``free_resource`` in one state: ``Engine.fresh_slots``
allocates it (every row done, its token table on the dummy page), ``prefill_slots`` prefills a batch of
chunks into their slots in one call (several requests' chunks, padded to buckets), ``decode_slots`` runs the
decode loop over the slot bucket ``[0, b)``, ``release_slots`` marks rows done and ``with_tables`` gives the
slots their KV pages (the token tables). ``Engine.generate`` is the
special case of one batch prefilled into every row in order and decoded until all are done; the serving core
(``jaxspec.serving``) admits, decodes and retires requests in slots as they come. Pure and jittable (the
compiled entry points are ``engine.compiled``'s, shared by both).

Per-row leaves are every array of the state with a leading batch dimension and each cache's token table
(``req_to_token``); the KV pools, ``eos_id``, the adaptive policy (one for the batch) and the simulated
acceptance table are the batch's and are never sliced.
"""

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.engine.state import DecodeState, EngineOptions, SamplingParams
from jaxspec.engine.step import decode_loop, prefill, prefill_chunk
from jaxspec.protocols import PagedKVCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotChunks:
    """``C`` prefill chunks for ``prefill_slots`` (one per request; ``C`` and ``P`` the caller's buckets).

    tokens: i32[C, P] right-padded chunk tokens; lengths: i32[C] real tokens of each (>= 1).
    slots: i32[C] the row of each chunk (a row ``>= B`` is a padding chunk: it reads the dummy page and
      writes nothing back); ``None``: chunk ``i`` goes to row ``i`` of a state of ``C`` rows.
    prefix: i32[C] the committed tokens before each chunk (its K/V already written); ``None``: the rows' own
      ``seq_lens``.
    following: i32[C, X] the prompt tokens after each chunk (``X >= step.prefill_lookahead``; a non-final
      chunk's drafter extend reads them); ``None`` for last chunks.
    max_new_tokens / sampling: i32[C] and ``SamplingParams`` of ``C`` rows: the rows start a request (its
      counters, outputs and ``done`` reset: done until its last chunk); ``None``: the rows keep theirs (a state
      ``Engine.prepare`` allocated).
    """

    tokens: jax.Array
    lengths: jax.Array
    slots: jax.Array | None = None
    prefix: jax.Array | None = None
    following: jax.Array | None = None
    max_new_tokens: jax.Array | None = None
    sampling: SamplingParams | None = None


def _is_cache(x) -> bool:
    return isinstance(x, PagedKVCache)


def _batch_fields(state: DecodeState) -> dict:
    return dict(policy=state.policy, simulate=state.simulate)


def map_rows(state: DecodeState, fn) -> DecodeState:
    """``state`` with ``fn`` applied to every per-row leaf (module docstring) and each cache's token table;
    the pools, scalars, policy and simulated acceptance kept."""
    batch = _batch_fields(state)
    bare = dataclasses.replace(state, policy=None, simulate=None)

    def one(x):
        if _is_cache(x):
            return PagedKVCache(x.k, x.v, fn(x.req_to_token))
        return fn(x) if x.ndim else x

    return dataclasses.replace(jax.tree.map(one, bare, is_leaf=_is_cache), **batch)


def merge_rows(state: DecodeState, sub: DecodeState, fn) -> DecodeState:
    """``state`` with every per-row leaf ``fn(leaf, sub's leaf)``, each cache's token table kept, the pools,
    the policy and the simulated acceptance taken from ``sub`` (the rows' call wrote them)."""
    batch = _batch_fields(sub)
    bare = dataclasses.replace(state, policy=None, simulate=None)
    sub = dataclasses.replace(sub, policy=None, simulate=None)

    def one(x, y):
        if _is_cache(x):
            return PagedKVCache(y.k, y.v, x.req_to_token)
        return fn(x, y) if x.ndim else x

    return dataclasses.replace(jax.tree.map(one, bare, sub, is_leaf=_is_cache), **batch)


def bucket_view(state: DecodeState, size: int) -> DecodeState:
    """Rows ``[0, size)`` of ``state`` (a static slice; the batch's fields whole)."""
    return map_rows(state, lambda x: x[:size])


def write_bucket(state: DecodeState, sub: DecodeState) -> DecodeState:
    """``state`` with rows ``[0, b)`` from ``sub`` (a ``bucket_view``), its pools and policy."""
    return merge_rows(state, sub, lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, 0, 0))


def take_rows(state: DecodeState, rows: jax.Array) -> DecodeState:
    """Rows ``rows i32[C]`` of ``state`` (a gather); a row out of range reads zeros (its token table: the
    dummy page)."""
    return map_rows(state, lambda x: jnp.take(x, rows, axis=0, mode="fill", fill_value=0))


def put_rows(state: DecodeState, sub: DecodeState, rows: jax.Array) -> DecodeState:
    """``state`` with rows ``rows`` from ``sub`` (a ``take_rows``; rows out of range dropped), its pools."""
    return merge_rows(state, sub, lambda x, y: x.at[rows].set(y, mode="drop"))


def with_tables(state: DecodeState, req_to_token: jax.Array) -> DecodeState:
    """``state`` with every cache's token table (target and drafter) replaced by ``req_to_token i32[B, W]``
    (a slot's positions on the KV pages it was given; the serving core derives it from its page table). Each
    cache gets its own copy: a donated state must not hold one buffer twice."""
    return jax.tree.map(lambda x: PagedKVCache(x.k, x.v, jnp.array(req_to_token, copy=True)) if _is_cache(x) else x,
                        state, is_leaf=_is_cache)


def release_slots(state: DecodeState, rows: jax.Array) -> DecodeState:
    """``state`` with the rows of ``rows bool[B]`` done (frozen in every later round)."""
    return dataclasses.replace(state, done=state.done | rows)


def prefill_slots(target, drafter, opts: EngineOptions, state: DecodeState, chunks: SlotChunks, *,
                  final: bool) -> DecodeState:
    """One prefill call of ``chunks`` into their slots (``SlotChunks``): ``final``, each chunk ends its prompt
    (``step.prefill``: the first token sampled, the row decoding from then on), else none does
    (``step.prefill_chunk``: K/V written, the row stays done). The other rows are untouched."""
    sub = state if chunks.slots is None else take_rows(state, chunks.slots)
    if chunks.prefix is not None:
        sub = dataclasses.replace(sub, seq_lens=chunks.prefix)
    if chunks.max_new_tokens is not None:
        zero = jnp.zeros_like(chunks.lengths)
        sub = dataclasses.replace(
            sub, num_generated=zero, done=jnp.full(zero.shape, not final), max_new_tokens=chunks.max_new_tokens,
            num_rounds=zero, num_accepted=zero, out_tokens=jnp.zeros_like(sub.out_tokens), sampling=chunks.sampling)
    if final:
        sub = prefill(target, drafter, opts, sub, chunks.tokens, chunks.lengths)
    else:
        if chunks.following is None:
            raise ValueError("chunks: a non-final chunk needs following (the prompt tokens after it)")
        sub = prefill_chunk(target, drafter, opts, sub, chunks.tokens, chunks.lengths, chunks.following)
    return sub if chunks.slots is None else put_rows(state, sub, chunks.slots)


def decode_slots(target, drafter, opts: EngineOptions, state: DecodeState, *, bucket: int, max_rounds: jax.Array,
                 force_mode: jax.Array, first_finish: jax.Array) -> DecodeState:
    """The decode loop (``step.decode_loop``) over rows ``[0, bucket)`` (static; the whole state when it is
    every row) for at most ``max_rounds`` rounds (traced ``i32[]``); ``force_mode`` (adaptive engines; traced,
    ``-1`` = the policy's choice) as there. ``first_finish`` (traced ``bool[]``): leave the loop as soon as a
    row that was decoding at the start has finished (a serving step, whose freed slot can take a waiting
    request), else run until every row is done."""
    whole = bucket == state.done.shape[0]
    sub = state if whole else bucket_view(state, bucket)
    running = ~sub.done
    out = decode_loop(target, drafter, opts, sub, force_mode, max_rounds,
                      until=lambda st: first_finish & jnp.any(running & st.done))
    return out if whole else write_bucket(state, out)
