"""One speculative round, model-free: ``plan_verify`` before the target's verify forward, ``commit`` after.

The seam between any serving stack and jaxspec's pipeline: arrays in, arrays out, no model, no hidden
state, static shapes given ``(B, W, S, K, N)``; every function is pure and jittable (call it under your
own ``jax.jit``). One round, as SGLang's ``MTPWorkerV2`` runs it (docs/ops.md, "One decode round")::

    draft = drafter.propose(...)                       # DraftResults (tree) or i32[B, S] (chain)
    plan = plan_verify(spec, bonus, draft, seq_lens, req_to_token, page_size=G)
    logits, hidden, cache = target.forward(plan.tokens, plan.meta, cache)
    out = commit(spec, plan, cache, VerifyGreedy(logits), hidden=hidden)
    # out.accepted[b, :out.accept_lens[b]] are the round's new tokens, out.bonus the next root,
    # out.seq_lens the new committed lengths; the drafter extends over out.window_* with out.draft_meta.

``plan_verify``: ``build_chain_tree`` (``K == 1``) or ``build_tree`` (QLEN_ONLY) from the draft, the verify
window's cache slots ``req_to_token[r, seq_len + j]`` (``assign_extend_cache_locs_uniform``) and the
``AttentionMetadata`` of the verify forward (tree positions, tree mask, prefix = committed length).
``commit``: verify with the given verifier (``VerifyGreedy``: greedy ``eagle_sample``; ``VerifyGreedyPredict``:
the same from the logits' argmax; ``VerifyTargetOnly``: SGLang's target-only tree rejection sampling
``eagle_sample(greedy=False)``; ``VerifyDraftProbs``: for chains whose drafts were sampled, the classic rule
with the draft probabilities ``chain_speculative_sampling``) + ``fill_bonus_tokens``; for trees (``K > 1``) the accepted
path's KV moves to the window front (``move_accept_tokens_to_target_kvcache``) and the per-node predictions
and features are compacted the same way (``compact_accept_to_front``); chains need neither (the accepted
path already is the window front, as upstream skips the move for ``K == 1``).

Also here: the metadata of the other forwards a decode loop runs (``prefill_metadata``,
``decode_metadata``, ``root_metadata``) and ``causal_qmask``, so a loop needs nothing model-specific; and
``dense_metadata``, a cache-free causal forward's (training).
"""

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int32

from jaxspec.config import SpecConfig
from jaxspec.kernels import Implementation
from jaxspec.kernels.cache_locs import assign_extend_cache_locs_uniform
from jaxspec.kernels.kv_move import compact_accept_to_front, move_accept_tokens_to_target_kvcache
from jaxspec.ops.accept import eagle_sample, fill_bonus_tokens, sampling_probs
from jaxspec.ops.draft import DraftResults
from jaxspec.ops.tree import TreeMaskMode, TreeOutput, build_chain_tree, build_tree
from jaxspec.ops.verify import chain_speculative_sampling, verify_tree_greedy
from jaxspec.protocols import AttentionMetadata, PagedKVCache, page_table_from_req_to_token


class ChainDraft(NamedTuple):
    """A chain draft whose tokens were SAMPLED by the drafter: ``tokens i32[B, S]`` and ``probs f32[B, S, V]``
    (``probs[b, i]`` the processed distribution token ``i`` was drawn from). ``plan_verify`` takes it like
    the plain ``i32[B, S]`` chain; ``VerifyDraftProbs(logits, sampling, probs)`` verifies it with the classic rule."""

    tokens: Int32[Array, "B S"]
    probs: Float[Array, "B S V"]


class RoundSampling(NamedTuple):
    """Per-request sampling inputs of the sampling verifiers (arrays; changing them never recompiles).

    temperature: ``f32[B]`` (0 = greedy row). top_k: ``i32[B]`` in ``[1, V]`` (``V`` = off).
    top_p: ``f32[B]`` in ``(0, 1]``. coins: ``f32[B, N]`` / final_coins: ``f32[B]`` in ``[0, 1)``
    (``ops.accept.make_coins``), independent of any coins the drafter used.
    """

    temperature: Float[Array, " B"]
    top_k: Int32[Array, " B"]
    top_p: Float[Array, " B"]
    coins: Float[Array, "B N"]
    final_coins: Float[Array, " B"]


class DraftSampling(NamedTuple):
    """What a drafter that samples its chain (``verify="draft_probs"``) gets in ``extend_after_prefill`` /
    ``extend_after_verify`` (keyword ``sampling``): the requests' ``temperature f32[B]``, ``top_k i32[B]``,
    ``top_p f32[B]`` and ``coins f32[B, S]`` in ``[0, 1)`` (one per draft step, independent of the verify
    coins). It draws draft ``i`` from ``ops.accept.sampling_probs`` of its logits with ``coins[:, i]`` and
    proposes a ``ChainDraft`` holding those distributions."""

    temperature: Float[Array, " B"]
    top_k: Int32[Array, " B"]
    top_p: Float[Array, " B"]
    coins: Float[Array, "B S"]


class VerifyPlan(NamedTuple):
    """Output of ``plan_verify``: what the target's verify forward needs, and the tree ``commit`` walks.

    tree: ``build_tree`` / ``build_chain_tree`` output (QLEN_ONLY mask, positions, retrieve links).
    tokens: ``i32[B, N]`` node tokens (node 0 = the bonus/root), the verify forward's input.
    meta: ``AttentionMetadata`` of the verify forward (``write_locs`` = ``cache_locs``).
    cache_locs: ``i32[B, N]`` window slots ``req_to_token[r, seq_lens + j]``.
    """

    tree: TreeOutput
    tokens: Int32[Array, "B N"]
    meta: AttentionMetadata
    cache_locs: Int32[Array, "B N"]


class CommitOutput(NamedTuple):
    """Output of ``commit`` (all ``int32`` but ``window_hidden``).

    cache: the target cache after the accept KV move (``K > 1``; the given cache for chains).
    predict: ``(B*N,)`` the verify output as upstream returns it (the token after each accepted node).
    accept_index: ``(B, S+1)`` global node ids of the accepted path, -1 padded (``eagle_sample``).
    accept_lens: ``(B,)`` accepted drafts + 1 (>= 1), as verified (also for inactive rows).
    accepted: ``(B, S+1)`` the committed tokens of the round, valid where column ``< accept_lens``
      (the accepted drafts, then the bonus/correction token).
    bonus: ``(B,)`` the next round's root (inactive rows keep the plan's root).
    seq_lens: ``(B,)`` new committed lengths ``seq_lens + accept_lens`` (inactive rows unchanged).
    window_tokens: ``(B, N)`` the token following each window row, accepted path compacted to the front
      (row ``j < accept_lens`` sits at position ``seq_lens + j``): the drafter's extend input.
    window_hidden: ``(B, N, F)`` the target's features in the same row order, or ``None``.
    draft_meta: ``AttentionMetadata`` of a draft extend over the window (causal, positions
      ``seq_lens + j``, writes to the window slots).
    """

    cache: PagedKVCache
    predict: Int32[Array, " T"]
    accept_index: Int32[Array, "B A"]
    accept_lens: Int32[Array, " B"]
    accepted: Int32[Array, "B A"]
    bonus: Int32[Array, " B"]
    seq_lens: Int32[Array, " B"]
    window_tokens: Int32[Array, "B N"]
    window_hidden: Float[Array, "B N F"] | None
    draft_meta: AttentionMetadata


def causal_qmask(batch: int, q: int) -> Bool[Array, "B Q Q"]:
    """``bool[B, Q, Q]`` lower-triangular fresh-to-fresh mask (query row ``i`` sees fresh keys ``j <= i``)."""
    m = jnp.arange(q)[:, None] >= jnp.arange(q)[None, :]
    return jnp.broadcast_to(m[None], (batch, q, q))


DENSE_ATTENTION = ("reference", "xla", "cudnn")  # dense_metadata(attention=)


def dense_metadata(batch: int, length: int, *, attention: str = "reference") -> AttentionMetadata:
    """Metadata of a dense causal forward with no KV cache (training, teacher forcing).

    Args:
        batch: rows ``B``.
        length: tokens per row ``T``, at positions ``0 .. T - 1``.
        attention: ``"reference"`` (default): the masked jnp reference over ``[B, H, T, T]`` f32 scores;
            ``"xla"`` / ``"cudnn"``: ``jax.nn.dot_product_attention`` with ``is_causal`` and that implementation
            (``"cudnn"``: the fused flash attention, 16-bit weights on a GPU).

    Returns:
        ``AttentionMetadata``: causal over the ``T`` fresh tokens, no committed prefix, an empty page table and
        nothing written (``target.forward(tokens, meta, None)``).
    """
    if attention not in DENSE_ATTENTION:
        raise ValueError(f"attention: expected one of {DENSE_ATTENTION}, got {attention!r}")
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None], (batch, length))
    return AttentionMetadata(positions=pos, qmask=causal_qmask(batch, length),
                             prefix_lens=jnp.zeros((batch,), jnp.int32), page_table=jnp.zeros((batch, 0), jnp.int32),
                             causal_attention=None if attention == "reference" else attention)


def _rows(req_to_token, req_pool_indices, b):
    if req_pool_indices is None:
        return jnp.arange(b, dtype=jnp.int32), req_to_token[:b]
    return req_pool_indices, req_to_token[req_pool_indices]


def _check_batch(name, x, b):
    if x.shape[:1] != (b,):
        raise ValueError(f"{name}: expected leading dim B={b}, got {name}.shape={x.shape}")


def _metadata(positions, qmask, prefix_lens, table, write_locs, page_size, implementation, interpret):
    return AttentionMetadata(
        positions=positions, qmask=qmask, prefix_lens=prefix_lens,
        page_table=page_table_from_req_to_token(table, page_size), write_locs=write_locs, page_size=page_size,
        implementation=implementation, interpret=interpret,
    )


def prefill_metadata(
    prompt_lens: Int32[Array, " B"], req_to_token: Int32[Array, "R W"], width: int, *, page_size: int,
    prefix_lens: Int32[Array, " B"] | None = None, req_pool_indices: Int32[Array, " B"] | None = None,
    implementation: Implementation = "auto", interpret: bool = False,
) -> AttentionMetadata:
    """Metadata of a prefill over right-padded prompts ``(B, width)``: causal, prompt token ``j`` of row ``r``
    at position ``prefix_lens[r] + j`` and written to ``req_to_token[r, prefix_lens[r] + j]``, padding to slot
    0 (the dummy page).

    ``prefix_lens``: tokens already committed before the prompts (default none). Pass the run-time committed
    lengths (e.g. a fresh ``DecodeState``'s zero ``seq_lens``, as the engine does) rather than leaving it to
    the default: with a trace-time constant 0, XLA:CPU constant-folds the attention's masked prefix scores
    at compile time (a ``[B, Hkv, width, group, W]`` reduction per layer: seconds per prompt width)."""
    b = prompt_lens.shape[0]
    _, table = _rows(req_to_token, req_pool_indices, b)
    j = jnp.arange(width, dtype=jnp.int32)[None, :]
    if prefix_lens is None:
        prefix_lens, pos, slots = jnp.zeros((b,), jnp.int32), jnp.broadcast_to(j, (b, width)), table[:, :width]
    else:
        _check_batch("prefix_lens", prefix_lens, b)
        pos = prefix_lens[:, None] + j
        slots = jnp.take_along_axis(table, jnp.minimum(pos, table.shape[1] - 1), axis=1)
    locs = jnp.where(j < prompt_lens[:, None], slots, 0)
    return _metadata(pos, causal_qmask(b, width), prefix_lens, table, locs, page_size, implementation, interpret)


def decode_metadata(
    seq_lens: Int32[Array, " B"], req_to_token: Int32[Array, "R W"], *, page_size: int,
    req_pool_indices: Int32[Array, " B"] | None = None, write: bool = True, implementation: Implementation = "auto",
    interpret: bool = False,
) -> AttentionMetadata:
    """Metadata of one token per row at position ``seq_lens`` over the committed prefix: the plain decode
    forward (``write=True``: its K/V goes to ``req_to_token[r, seq_lens]``) and the root a drafter's
    ``propose`` receives (``write=False``, see ``root_metadata``)."""
    b = seq_lens.shape[0]
    _, table = _rows(req_to_token, req_pool_indices, b)
    locs = jnp.take_along_axis(table, seq_lens[:, None], axis=1) if write else None
    return _metadata(seq_lens[:, None], jnp.ones((b, 1, 1), bool), seq_lens, table, locs, page_size, implementation,
                     interpret)


def root_metadata(seq_lens, req_to_token, *, page_size: int, req_pool_indices=None, implementation: Implementation = "auto",
                  interpret: bool = False) -> AttentionMetadata:
    """``Drafter.propose``'s ``meta``: the root at position ``seq_lens``, nothing written."""
    return decode_metadata(seq_lens, req_to_token, page_size=page_size, req_pool_indices=req_pool_indices, write=False,
                           implementation=implementation, interpret=interpret)


def plan_verify(
    spec: SpecConfig,
    bonus: Int32[Array, " B"],
    draft: DraftResults | Int32[Array, "B S"],
    seq_lens: Int32[Array, " B"],
    req_to_token: Int32[Array, "R W"],
    *,
    page_size: int,
    req_pool_indices: Int32[Array, " B"] | None = None,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> VerifyPlan:
    """Build the verify tree and the verify forward's inputs (jittable).

    Args:
      spec: static ``SpecConfig(S, K, N)``.
      bonus: ``i32[B]`` root token of each row (the last generated, not yet committed token).
      draft: ``DraftResults`` (``organize_draft_results`` / a drafter's ``propose``; required for
        ``K > 1``) or, for chains, the ``i32[B, S]`` drafted tokens (a chain ``DraftResults`` or a
        ``ChainDraft`` works too).
      seq_lens: ``i32[B]`` committed lengths (the root sits at position ``seq_lens``).
      req_to_token: ``i32[R, W]`` slot table, page aligned; ``req_pool_indices`` ``i32[B]`` picks the rows
        (default: batch row ``b`` is table row ``b``). Needs ``seq_lens + N <= W``.
      page_size: static page size ``G`` of the metadata.
      implementation / interpret: forwarded to the ``jaxspec.kernels`` ops.
    """
    if not isinstance(spec, SpecConfig):
        raise ValueError(f"spec: expected a SpecConfig, got {type(spec).__name__}")
    n = spec.num_draft_tokens
    b = seq_lens.shape[0]
    _check_batch("bonus", bonus, b)
    if spec.topk == 1:
        chain = draft.draft_tokens if isinstance(draft, DraftResults) else draft
        chain = chain.tokens if isinstance(chain, ChainDraft) else chain
        tree = build_chain_tree(bonus, chain, seq_lens, config=spec)
    else:
        if not isinstance(draft, DraftResults):
            raise ValueError(f"draft: spec.topk={spec.topk} > 1 needs a DraftResults, got {type(draft).__name__}")
        tree = build_tree(
            bonus, draft.parent_list, draft.top_scores_index, draft.draft_tokens, seq_lens,
            config=spec, mask_mode=TreeMaskMode.QLEN_ONLY,
        )
    rows, table = _rows(req_to_token, req_pool_indices, b)
    locs = assign_extend_cache_locs_uniform(
        rows, req_to_token, seq_lens, width=n, implementation=implementation, interpret=interpret
    ).out_cache_loc.reshape(b, n)
    meta = _metadata(tree.positions.reshape(b, n), tree.tree_mask.reshape(b, n, n), seq_lens, table, locs, page_size,
                     implementation, interpret)
    return VerifyPlan(tree=tree, tokens=tree.draft_tokens.reshape(b, n), meta=meta, cache_locs=locs)


class VerifyGreedy(NamedTuple):
    """Greedy verification from the verify forward's ``logits`` (``[B, N, V]`` or ``[B*N, V]``):
    ``eagle_sample(greedy=True)``, bit-exact with SGLang."""

    logits: Float[Array, "B N V"]

    def verify(self, spec: SpecConfig, plan: VerifyPlan):
        b, n, tree = plan.tokens.shape[0], spec.num_draft_tokens, plan.tree
        out = eagle_sample(
            self.logits.reshape(b * n, -1), tree.draft_tokens, tree.retrieve_index, tree.retrieve_next_token,
            tree.retrieve_next_sibling, config=spec, greedy=True,
        )
        return out.predict, out.accept_index, out.accept_lens


class VerifyGreedyPredict(NamedTuple):
    """Greedy verification from the target's argmax ``target_predict i32[B, N]`` (for callers that reduced
    the logits already): ``verify_tree_greedy``."""

    target_predict: Int32[Array, "B N"]

    def verify(self, spec: SpecConfig, plan: VerifyPlan):
        tree = plan.tree
        _check_batch("target_predict", self.target_predict, plan.tokens.shape[0])
        v = verify_tree_greedy(
            plan.tokens, tree.retrieve_index, tree.retrieve_next_token, tree.retrieve_next_sibling,
            self.target_predict, num_steps=spec.num_steps, topk=spec.topk,  # K-bounded sibling scan: loop-free
        )
        return v.predict, v.accept_index, v.num_correct_drafts + 1


class VerifyTargetOnly(NamedTuple):
    """SGLang's target-only tree rejection sampling (``eagle_sample(greedy=False)``; drafts taken top-k):
    the target's distribution per node is ``sampling_probs(logits)`` under ``sampling`` (temperature-0 rows
    are one-hot, i.e. greedy). ``threshold_single`` / ``threshold_acc`` are static (1.0 / 1.0 = lossless)."""

    logits: Float[Array, "B N V"]
    sampling: RoundSampling
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def verify(self, spec: SpecConfig, plan: VerifyPlan):
        b, n, tree, smp = plan.tokens.shape[0], spec.num_draft_tokens, plan.tree, self.sampling
        out = eagle_sample(
            self.logits.reshape(b * n, -1), tree.draft_tokens, tree.retrieve_index, tree.retrieve_next_token,
            tree.retrieve_next_sibling, config=spec, greedy=False, temperatures=smp.temperature,
            top_ks=smp.top_k, top_ps=smp.top_p, uniform_samples=smp.coins,
            uniform_samples_for_final_sampling=smp.final_coins, threshold_single=self.threshold_single,
            threshold_acc=self.threshold_acc,
        )
        return out.predict, out.accept_index, out.accept_lens


class VerifyDraftProbs(NamedTuple):
    """The classic ``min(1, p/q)`` rule (``chain_speculative_sampling``) for a chain (``K == 1``) whose drafts
    were sampled from ``draft_probs f32[B, S, V]``; ``p`` is ``sampling_probs(logits)`` under ``sampling``."""

    logits: Float[Array, "B N V"]
    sampling: RoundSampling
    draft_probs: Float[Array, "B S V"]

    def verify(self, spec: SpecConfig, plan: VerifyPlan):
        if spec.topk != 1:
            raise ValueError(f"VerifyDraftProbs: the classic rule is implemented (and exact) for sampled chains "
                             f"only (spec.topk == 1), got topk={spec.topk}")
        b, n, smp = plan.tokens.shape[0], spec.num_draft_tokens, self.sampling
        probs = sampling_probs(self.logits.reshape(b, n, -1), smp.temperature, smp.top_k, smp.top_p)
        v = chain_speculative_sampling(plan.tokens, smp.coins, smp.final_coins, probs, self.draft_probs)
        return v.predict, v.accept_index, v.num_correct_drafts + 1


VERIFIERS = (VerifyGreedy, VerifyGreedyPredict, VerifyTargetOnly, VerifyDraftProbs)


def commit(
    spec: SpecConfig,
    plan: VerifyPlan,
    cache: PagedKVCache,
    verifier,
    *,
    hidden: Float[Array, "B N F"] | None = None,
    active: Bool[Array, " B"] | None = None,
    implementation: Implementation = "auto",
    interpret: bool = False,
) -> CommitOutput:
    """Verify ``plan``'s tree against the target and the bookkeeping after it (jittable).

    ``verifier`` decides the accepted path: ``VerifyGreedy(logits)``, ``VerifyGreedyPredict(target_predict)``,
    ``VerifyTargetOnly(logits, sampling, ...)`` or ``VerifyDraftProbs(logits, sampling, draft_probs)`` (any
    value whose ``verify(spec, plan)`` returns ``(predict (B*N,), accept_index (B, S+1), accept_lens (B,))``
    as those do). ``hidden`` (the verify forward's features) is compacted with the accepted path when given.
    ``cache`` is the cache the verify forward returned (its K/V of the window is moved for ``K > 1``; donate
    it). Rows with ``active = False`` are computed but frozen: no KV move, ``seq_lens`` and ``bonus`` unchanged.
    """
    if not callable(getattr(verifier, "verify", None)):
        raise ValueError(f"verifier: expected one of {', '.join(v.__name__ for v in VERIFIERS)} (a value with "
                         f"verify(spec, plan)), got {type(verifier).__name__}")
    n, k = spec.num_draft_tokens, spec.topk
    b = plan.tokens.shape[0]
    kw = dict(implementation=implementation, interpret=interpret)
    predict, accept_index, accept_lens = verifier.verify(spec, plan)
    verify_predict = predict
    bonus = fill_bonus_tokens(predict, accept_index, accept_lens)
    accepted = jnp.take(predict, jnp.maximum(accept_index, 0), axis=0)
    flat_hidden = None if hidden is None else hidden.reshape(b * n, -1)
    if active is None:
        active = jnp.ones((b,), bool)
    if k > 1:
        # Frozen rows move nothing: only their root self-copy stays (a skipped 0-byte pair).
        col = jnp.arange(accept_index.shape[1], dtype=jnp.int32)[None, :]
        move_lens = jnp.where(active, accept_lens, 1)
        move_index = jnp.where(col < move_lens[:, None], accept_index, -1)
        new_k, new_v = move_accept_tokens_to_target_kvcache(
            cache.k, cache.v, move_index, move_lens, plan.cache_locs.reshape(-1), **kw
        )
        cache = dataclasses.replace(cache, k=new_k, v=new_v)
        predict = compact_accept_to_front(predict, accept_index, num_draft_tokens=n)
        if flat_hidden is not None:
            flat_hidden = compact_accept_to_front(flat_hidden, accept_index, num_draft_tokens=n)
    seq = plan.meta.prefix_lens
    window = jnp.arange(n, dtype=jnp.int32)[None, :]
    draft_meta = dataclasses.replace(plan.meta, positions=seq[:, None] + window, qmask=causal_qmask(b, n))
    return CommitOutput(
        cache=cache,
        predict=verify_predict,
        accept_index=accept_index,
        accept_lens=accept_lens,
        accepted=accepted,
        bonus=jnp.where(active, bonus, plan.tokens[:, 0]),
        seq_lens=jnp.where(active, seq + accept_lens, seq),
        window_tokens=predict.reshape(b, n),
        window_hidden=None if flat_hidden is None else flat_hidden.reshape(b, n, -1),
        draft_meta=draft_meta,
    )


__all__ = [
    "ChainDraft",
    "CommitOutput",
    "DraftSampling",
    "RoundSampling",
    "VerifyDraftProbs",
    "VerifyGreedy",
    "VerifyGreedyPredict",
    "VerifyPlan",
    "VerifyTargetOnly",
    "causal_qmask",
    "commit",
    "decode_metadata",
    "plan_verify",
    "prefill_metadata",
    "root_metadata",
]
