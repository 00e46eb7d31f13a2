"""Contracts between the decoding loop and the models it drives.

Shared types (``PagedKVCache``, ``AttentionMetadata``) and the ``TargetModel`` / ``Drafter`` protocols.
This module sits *below* ``jaxspec.models`` and ``jaxspec.engine`` (architecture.md): both import it, it
imports neither, so a serving stack can implement the protocols without importing any jaxspec model.

Letters: ``B`` batch rows, ``Q`` fresh tokens per row in one forward, ``L`` layers, ``X`` KV pool slots,
``Hkv`` KV heads, ``E`` head dim, ``R`` request rows of the table, ``W`` max tokens per request,
``P`` pages per request row, ``G`` page size, ``V`` vocabulary, ``F`` width of the feature a target
hands to its drafter.
"""

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    """A paged KV pool passed into a forward and returned as a value.

    k, v: ``[L, X, Hkv, E]`` (keys stored after RoPE); slot ``x`` of page ``p`` is ``p * G + offset``.
    req_to_token: ``i32[R, W]``, SGLang's table: the slot of logical token ``pos`` of request row ``r``.
    Page 0 (slots ``[0, G)``) is never handed to a request.
    """

    k: jax.Array
    v: jax.Array
    req_to_token: jax.Array

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def max_tokens_per_req(self) -> int:
        """``W``: the static maximum context of one request row."""
        return self.req_to_token.shape[1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """What one forward needs to attend over a paged cache; the same for every attention implementation.

    positions:   ``i32[B, Q]`` RoPE positions of the fresh tokens.
    qmask:       ``bool[B, Q, Q]`` fresh-to-fresh visibility (row = query): causal for prefill/extend,
                 the QLEN_ONLY tree mask of ``build_tree`` for verify, the identity for draft beams.
    prefix_lens: ``i32[B]`` committed tokens of row ``b`` read from the cache (0: no prefix).
    page_table:  ``i32[B, P]`` page ids of row ``b``: token ``pos`` lives at slot
                 ``page_table[b, pos // G] * G + pos % G`` (``P * G >= W``).
    write_locs:  ``i32[B, Q]`` slot of each fresh token's K/V, or ``None`` (write nothing).
    page_size:   ``G`` (static).

    Fresh tokens attend to the prefix (positions ``< prefix_lens``) and to the fresh tokens ``qmask``
    allows; their own K/V is written only after attention, so a forward never reads what it writes.
    """

    positions: jax.Array
    qmask: jax.Array
    prefix_lens: jax.Array
    page_table: jax.Array
    write_locs: jax.Array | None = None
    page_size: int = dataclasses.field(default=1, metadata=dict(static=True))

    def prefix_slots(self, width: int) -> jax.Array:
        """``i32[B, width]``: the slot of each logical position ``< width`` (for gather-based attention)."""
        pos = jnp.arange(width, dtype=jnp.int32)
        g = self.page_size
        return self.page_table[:, pos // g] * g + pos % g


def page_table_from_req_to_token(req_to_token: jax.Array, page_size: int) -> jax.Array:
    """``i32[R, ceil(W / G)]`` page ids of a page-aligned ``req_to_token`` (every page starts at a
    multiple of ``G``, as the allocators in ``jaxspec.models.cache`` and TokenSpeed lay them out)."""
    return req_to_token[:, ::page_size] // page_size


@runtime_checkable
class TargetModel(Protocol):
    """The model being accelerated: a forward over a ragged batch of fresh tokens and a paged cache.

    A target is a pytree (``jax.tree_util`` node or a Flax NNX module): the engine splits it once into
    static structure and weights and closes over the structure in its jitted loop.
    """

    vocab_size: int  # V
    feature_size: int  # F: width of ``hidden`` returned by ``forward`` (the drafter's input feature)

    def make_cache(self, req_to_token: Any, num_slots: int) -> PagedKVCache:
        """A zeroed pool of ``num_slots`` slots (a multiple of the page size) for ``req_to_token (R, W)``."""
        ...

    def kv_bytes_per_slot(self) -> int:
        """Bytes one slot takes across all layers, K and V (the engine sizes pools up front with it)."""
        ...

    def forward(
        self, tokens: jax.Array, meta: AttentionMetadata, cache: PagedKVCache
    ) -> tuple[jax.Array, jax.Array, PagedKVCache]:
        """``tokens: i32[B, Q]`` -> ``(logits f32[B, Q, V], hidden [B, Q, F], cache)``; pure and jittable.

        ``hidden`` is what the drafter consumes: the last layer's pre-norm hidden for MTP heads, the
        concatenated auxiliary layers for EAGLE-3. K/V of the fresh tokens go to ``meta.write_locs``.
        """
        ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens each round (the roles of the seed ``mtp_worker_v2.py``).

    The drafter owns its state (its KV cache, the pending proposal): a pytree the engine carries in
    ``DecodeState.draft`` and passes back; plain decoding has no drafter and no draft state. All three
    methods are pure and jittable; ``spec`` (a ``SpecConfig``) is static.
    """

    def init_state(self, spec: Any, req_to_token: Any, num_slots: int) -> Any:
        """The drafter's initial state for a batch whose rows use ``req_to_token (B, W)``."""
        ...

    def extend_after_prefill(
        self, spec: Any, state: Any, tokens: jax.Array, hidden: jax.Array, meta: AttentionMetadata,
        first_tokens: jax.Array,
    ) -> Any:
        """Draft-extend over the prompts ``tokens i32[B, P]`` (target features ``hidden [B, P, F]``),
        given the target's first generated token ``first_tokens i32[B]``; returns the new state holding
        the proposal for round 1."""
        ...

    def propose(self, spec: Any, state: Any, bonus: jax.Array, seq_lens: jax.Array, meta: AttentionMetadata) -> Any:
        """The round's draft: an ``ops.draft.DraftResults`` (tree, ``spec.topk > 1``) or the chain tokens
        ``i32[B, S]`` (``spec.topk == 1``), the input of ``build_tree`` / ``build_chain_tree``."""
        ...

    def extend_after_verify(
        self, spec: Any, state: Any, tokens: jax.Array, hidden: jax.Array, meta: AttentionMetadata,
        accept_lens: jax.Array,
    ) -> Any:
        """Draft-extend over the verified window ``tokens i32[B, N]`` (accepted path compacted to the
        front, ``hidden [B, N, F]``), ``accept_lens i32[B]`` of them real; returns the new state."""
        ...


__all__ = ["AttentionMetadata", "Drafter", "PagedKVCache", "TargetModel", "page_table_from_req_to_token"]
