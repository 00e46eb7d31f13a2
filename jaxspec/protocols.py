"""Contracts between the decoding loop and the models it drives.

Shared types (``PagedKVCache``, ``AttentionMetadata``) and the ``TargetModel`` / ``Drafter`` protocols.
This module sits *below* ``jaxspec.models`` and ``jaxspec.engine``: both import it, it
imports neither, so a serving stack can implement the protocols without importing any jaxspec model.

Letters: ``B`` batch rows, ``Q`` fresh tokens per row in one forward, ``L`` layers, ``X`` KV pool slots,
``Hkv`` KV heads, ``E`` head dim, ``R`` request rows of the table, ``W`` max tokens per request,
``P`` pages per request row, ``G`` page size, ``V`` vocabulary, ``F`` width of the feature a target
hands to its drafter.

A model meets a protocol structurally (no base class to inherit); ``missing_members`` names what an object
lacks, and ``jaxspec.engine.Engine`` calls it at construction.
"""

import dataclasses
import inspect
import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.kernels import Implementation


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
    implementation, interpret: the ``jaxspec.kernels.paged_attention`` switch (static; ``"auto"``: the Pallas
                 kernel on a GPU, the jnp reference on CPU). The round's metadata builders set them from the
                 engine's ``implementation`` / ``interpret``; ``dataclasses.replace`` keeps them.
    batch_invariant: (static) compute every row with a reduction order that does not depend on the other rows
                 of the call (``jaxspec.kernels.invariant_matmul`` / ``invariant_attention``): a target that
                 declares ``supports_batch_invariant = True`` honours it; engines set it on the target's
                 forwards only, in their batch-invariant mode.
    causal_attention: (static) ``None``: attention reads ``qmask``. ``"xla"`` / ``"cudnn"``: the metadata is a
                 dense causal forward (``pipeline.dense_metadata``: ``qmask`` causal, positions ``0 .. Q - 1``, no
                 prefix, no cache) and a dense forward runs that ``jax.nn.dot_product_attention`` implementation
                 (``"cudnn"``: its fused flash attention, 16-bit on a GPU) instead of the masked jnp reference.

    Fresh tokens attend to the prefix (positions ``< prefix_lens``) and to the fresh tokens ``qmask``
    allows; their own K/V goes to ``write_locs``, which lie past the prefix, so attention never reads from the
    pool what the same forward writes (its fresh keys come as ``k_new`` / ``v_new``).
    """

    positions: jax.Array
    qmask: jax.Array
    prefix_lens: jax.Array
    page_table: jax.Array
    write_locs: jax.Array | None = None
    page_size: int = dataclasses.field(default=1, metadata=dict(static=True))
    implementation: Implementation = dataclasses.field(default="auto", metadata=dict(static=True))
    interpret: bool = dataclasses.field(default=False, metadata=dict(static=True))
    batch_invariant: bool = dataclasses.field(default=False, metadata=dict(static=True))
    causal_attention: str | None = dataclasses.field(default=None, metadata=dict(static=True))

    def prefix_slots(self, width: int) -> jax.Array:
        """``i32[B, width]``: the slot of each logical position ``< width`` (for gather-based attention)."""
        pos = jnp.arange(width, dtype=jnp.int32)
        g = self.page_size
        return self.page_table[:, pos // g] * g + (pos % g)[None, :]


def page_table_from_req_to_token(req_to_token: jax.Array, page_size: int) -> jax.Array:
    """``i32[R, ceil(W / G)]`` page ids of a page-aligned ``req_to_token`` (every page starts at a
    multiple of ``G``, as ``make_req_to_token`` and TokenSpeed lay them out)."""
    return req_to_token[:, ::page_size] // page_size


def num_pages_needed(num_reqs: int, max_tokens_per_req: int, page_size: int) -> int:
    """Pages a fully reserved batch needs, including the dummy page 0."""
    return num_reqs * math.ceil(max_tokens_per_req / page_size) + 1


def make_req_to_token(
    num_reqs: int, max_tokens_per_req: int, page_size: int, *, num_pages: int | None = None, seed: int = 0
) -> np.ndarray:
    """Host-side allocator: reserve ``ceil(W / G)`` shuffled pages per request row; ``int32[R, W]``.

    Raises ``ValueError`` when the pool (``num_pages`` including the dummy page) cannot hold every row's
    reservation -- page exhaustion is reported at the host boundary, never clamped silently.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if num_reqs < 1 or max_tokens_per_req < 1:
        raise ValueError(f"num_reqs and max_tokens_per_req must be >= 1, got {num_reqs}, {max_tokens_per_req}")
    pages_per_req = math.ceil(max_tokens_per_req / page_size)
    need = num_pages_needed(num_reqs, max_tokens_per_req, page_size)
    if num_pages is None:
        num_pages = need
    if num_pages < need:
        raise ValueError(
            f"KV page pool exhausted: {num_reqs} requests x {pages_per_req} pages of {page_size} tokens "
            f"(+1 dummy page) = {need} pages needed, pool has num_pages={num_pages}"
        )
    rng = np.random.default_rng(seed)
    pages = rng.permutation(np.arange(1, num_pages, dtype=np.int64))[: num_reqs * pages_per_req]
    pages = pages.reshape(num_reqs, pages_per_req)
    pos = np.arange(max_tokens_per_req, dtype=np.int64)
    table = pages[:, pos // page_size] * page_size + pos[None, :] % page_size
    return table.astype(np.int32)


@runtime_checkable
class TargetModel(Protocol):
    """The model being accelerated: a forward over a ragged batch of fresh tokens and a paged cache.

    A target is a pytree of arrays (a registered dataclass, say) or a Flax NNX module: the engine splits it
    once into static structure and weights and closes over the structure in its jitted loop.

    Optional: ``forward(..., rows=None)``. A target whose ``forward`` takes a ``rows`` keyword (``i32[R]`` indices
    into the ``B * Q`` flattened rows) returns the logits of those rows only, ``f32[R, V]``; prefill then scores
    each prompt's last row alone instead of ``B * P`` rows (at a wide generation batch the full prefill logits are
    tens of GB). A target without it is called without it and its rows are gathered from the full logits.
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
class MTPHead(Protocol):
    """Multi-token-prediction draft steps (DeepSeek-V3 MTP / seed ``mtp_worker_v2.py``), driven by
    ``jaxspec.models.mtp_drafter.MTPDrafter``. Step ``s`` consumes the hidden state of the previous
    position (the target's ``hidden`` for ``s == 0``, step ``s - 1``'s after) and the *next* token. A head
    may run more steps than it has weight layers (``jaxspec.models.MTPModel`` reuses its last layer's
    weights, as SGLang does); each step still has its own KV layer.

    Optional: ``draft_token_ids`` (``i32[Vd]`` or ``None``). A head whose draft logits cover a reduced vocabulary
    (EAGLE-3's ``draft_vocab_size``, SGLang's ``speculative_token_map``; ``jaxspec.models.with_draft_vocab``)
    sets it: logit column ``j`` of ``mtp_forward`` is token ``draft_token_ids[j]``, and the drafter maps its
    picks through it (a sampled chain's distributions are scattered back to the full vocabulary, zero elsewhere).
    """

    num_draft_steps: int  # S_max: the drafter can run ``spec.num_steps <= num_draft_steps`` steps

    def make_draft_cache(self, req_to_token: Any, num_slots: int) -> PagedKVCache:
        """A zeroed pool with one layer per draft step (layer ``s`` of the pool is step ``s``'s KV); slot ids
        are the target's (one ``req_to_token``)."""
        ...

    def mtp_forward(
        self, step: int, h_prev: jax.Array, tokens: jax.Array, meta: AttentionMetadata, cache: PagedKVCache,
        rows: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, PagedKVCache]:
        """Draft step ``step`` (static, ``< num_draft_steps``). ``h_prev [B, Q, F]``, ``tokens i32[B, Q]`` (the
        next tokens) -> ``(logits f32[B, Q, V], hidden [B, Q, F], cache)``; K/V to layer ``step`` at
        ``meta.write_locs``. ``rows``: ``None``, or ``i32[R]`` indices into the ``B * Q`` flattened rows: the
        logits are then ``f32[R, V]`` of those rows only (a draft extend reads one row per request, and the LM
        head is a draft step's largest weight read and, at large ``B * Q``, its largest matmul)."""
        ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens each round (the role of SGLang's draft workers, e.g. ``multi_layer_eagle_worker_v2.py``).

    The drafter owns its state (its KV cache, the pending proposal): a pytree the engine carries in
    ``DecodeState.draft`` and passes back; plain decoding has no drafter and no draft state. The drafter
    itself is a pytree of arrays or an NNX module (split once, like the target). Every method but
    ``init_state`` / ``kv_bytes_per_slot`` is pure and jittable; ``spec`` (a ``SpecConfig``) is static.
    Batch row ``b`` of every argument is request row ``b`` of ``req_to_token``.

    Optional methods: ``prefill_lookahead(spec) -> int`` (prompt tokens past a non-final prefill chunk that the
    extend reads; default 1) and ``state_key(spec) -> hashable``: draft shapes with equal keys have equal states
    after the same extends (an engine of several shapes then computes their extends once; default: every shape
    its own).
    """

    def kv_bytes_per_slot(self, spec: Any) -> int:
        """Bytes the drafter's state takes per KV pool slot (for the up-front memory estimate). Called at
        ``Engine`` construction: raise ``ValueError`` there when the drafter cannot serve ``spec``."""
        ...

    def init_state(self, spec: Any, req_to_token: Any, num_slots: int) -> Any:
        """The drafter's initial state for a batch whose rows use ``req_to_token (B, W)`` (host side)."""
        ...

    def extend_after_prefill(
        self, spec: Any, state: Any, tokens: jax.Array, hidden: jax.Array, meta: AttentionMetadata,
        prompt_lens: jax.Array, first_tokens: jax.Array,
    ) -> Any:
        """Draft-extend over the right-padded prompts ``tokens i32[B, P]`` (``prompt_lens i32[B]`` real;
        target features ``hidden [B, P, F]``; ``meta`` is the target prefill's), given the target's first
        generated token ``first_tokens i32[B]``; returns the new state holding the proposal for round 1."""
        ...

    def propose(self, spec: Any, state: Any, bonus: jax.Array, meta: AttentionMetadata) -> tuple[Any, Any]:
        """The round's draft and the new state. ``bonus i32[B]`` is the root of the round's tree; ``meta``
        locates it: ``positions (B, 1)`` = ``prefix_lens`` = the committed length, ``page_table``.

        Returns ``(draft, state)``: ``draft`` is an ``ops.draft.DraftResults`` (``spec.topk > 1``, the
        input of ``build_tree``) or the chain tokens ``i32[B, S]`` (``spec.topk == 1``)."""
        ...

    def extend_after_verify(
        self, spec: Any, state: Any, tokens: jax.Array, hidden: jax.Array, meta: AttentionMetadata,
        accept_lens: jax.Array,
    ) -> Any:
        """Draft-extend over the verified window (``pipeline.commit``'s ``window_tokens i32[B, N]``: the token
        that follows each window row, accepted path compacted to the front; ``window_hidden [B, N, F]``;
        ``meta`` = ``draft_meta``), ``accept_lens i32[B]`` rows real; returns the new state."""
        ...


def _protocol_members(protocol: type) -> list[str]:
    names = list(getattr(protocol, "__annotations__", {}))
    names += [n for n, v in vars(protocol).items() if not n.startswith("_") and inspect.isfunction(v)]
    return names


def missing_members(obj: Any, protocol: type) -> list[str]:
    """Names of ``protocol``'s attributes and methods that ``obj`` lacks (methods must be callable)."""
    missing = []
    for name in _protocol_members(protocol):
        if not hasattr(obj, name):
            missing.append(name)
        elif inspect.isfunction(vars(protocol).get(name)) and not callable(getattr(obj, name)):
            missing.append(name)
    return missing


def check_implements(obj: Any, protocol: type, what: str) -> None:
    """``ValueError`` naming every member of ``protocol`` that ``obj`` (the argument ``what``) lacks."""
    missing = missing_members(obj, protocol)
    if missing:
        raise ValueError(
            f"{what}: {type(obj).__name__} does not implement jaxspec.protocols.{protocol.__name__}: "
            f"missing {', '.join(missing)}"
        )


__all__ = [
    "AttentionMetadata",
    "Drafter",
    "MTPHead",
    "PagedKVCache",
    "TargetModel",
    "check_implements",
    "make_req_to_token",
    "missing_members",
    "num_pages_needed",
    "page_table_from_req_to_token",
]
