"""``MTPDrafter``: the ``Drafter`` that drives a model's multi-token-prediction layers (SGLang's ``multi_layer_eagle_worker_v2.py``).

Works with any ``jaxspec.protocols.MTPHead`` (``mtp_forward``, ``num_draft_steps``, ``make_draft_cache``).
Draft steps are chained as in DeepSeek-V3 (step ``s`` consumes step ``s-1``'s hidden state; SGLang's
``chain_mtp_hidden_states``); each step is one ``mtp_forward`` of the head (its own MTP layer, or a reused
one when the head has fewer weight layers than steps) with its own draft KV layer.

Draft extend (after prefill and after every verify): draft steps ``0..S-1`` run over the window (the
prompt, or the N-row verify window with the accepted path compacted to the front), each feeding the next
its hidden state; after layer ``s`` the input ids are rotated left by one with that layer's prediction
written at ``select`` = the last real row (``rotate_input_ids``). This is SGLang's eager path (fixed
window, one ``select_index``): rows past ``select - s`` of layer ``s`` are fed a drafted (not yet verified)
token, so the draft KV of the last ``s`` committed positions of layer ``s`` is computed from a guess and
kept. SGLang's CUDA-graph "KV-cache reversion" (``assign_hidden_states_pool``) re-runs those rows; it is
not ported: it only affects draft quality, never the output (verify is exact). A non-final chunk of a chunked
prefill (``engine.step.prefill_chunk``) has the real next tokens: ``extend_after_prefill(lookahead=)`` writes
them at ``select`` instead of the predictions (``prefill_lookahead(spec) = S`` tokens past the chunk), so the
chunks write the draft KV of one whole-prompt extend.

Proposal: chain (``K == 1``) = the S per-layer argmax tokens of the last extend. With
``sample_drafts=True`` and a ``sampling`` argument (``pipeline.DraftSampling``, the engine's
``verify="draft_probs"`` mode) layer ``s`` instead SAMPLES its token from ``ops.accept.sampling_probs`` of its
logits (the request's temperature / top-k / top-p, coin ``sampling.coins[:, s]``), feeds it to layer ``s + 1``
and records that distribution; ``propose`` then returns a ``pipeline.ChainDraft`` (tokens + probabilities). Tree (``K > 1``) = S-1
beam forwards: draft step ``i`` on the ``B*K`` beams of step ``i`` (``select_top_k_tokens``), beams at the
row of the last committed target hidden (position ``seq_lens - 1``), attending to that layer's committed
KV (positions ``< seq_lens - 1``) plus themselves, writing no KV; then ``organize_draft_results``. The S-1
beam forwards are traced in a Python loop (each step may be a different MTP layer and reads its own KV
layer).

Reduced draft vocabulary: a head with ``draft_token_ids`` (``MTPHead``; ``jaxspec.models.with_draft_vocab``)
scores ``Vd`` tokens; every top-k index and sampled index is mapped through it to a token id, and sampled
distributions are scattered back to the full vocabulary (zero off the draft vocabulary).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.kernels import Implementation
from jaxspec.kernels.multi_layer_eagle import rotate_input_ids
from jaxspec.ops.accept import sample_from_probs, sampling_probs
from jaxspec.ops.draft import DraftResults, fast_topk, organize_draft_results, select_top_k_tokens
from jaxspec.protocols import AttentionMetadata, MTPHead, PagedKVCache, check_implements
from jaxspec.pipeline import ChainDraft


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPDraftState:
    """The drafter's part of the decode state.

    cache: the MTP layers' paged KV (slot ids shared with the target).
    topk_p: ``f32[B, X]`` / topk_index: ``i32[B, X]`` the next proposal: chain ``X = S`` (the per-layer
      argmax tokens), tree ``X = K`` (MTP layer 0's top-K).
    hidden: ``f32[B, F]`` MTP layer 0's hidden at the selected row (parent state of the tree beams).
    draft_probs: ``f32[B, S, V]`` the distributions the chain was drawn from (``sample_drafts``; one-hot at
      the argmax after a greedy extend), else ``None``.
    """

    cache: PagedKVCache
    topk_p: jax.Array
    topk_index: jax.Array
    hidden: jax.Array
    draft_probs: jax.Array | None = None


def _topk(logits: jax.Array, k: int, token_ids=None):
    """The draft's softmax, then SGLang's ``fast_topk`` (first index on ties); with a reduced draft vocabulary
    (``token_ids i32[Vd]``, the head's ``draft_token_ids``) the indices are mapped to token ids."""
    p, idx = fast_topk(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), k)
    return (p, idx) if token_ids is None else (p, token_ids[idx])


def _full_vocab(q: jax.Array, token_ids, vocab_size: int) -> jax.Array:
    """A draft distribution ``f32[B, Vd]`` over the reduced vocabulary as ``f32[B, V]`` (zero elsewhere)."""
    if token_ids is None:
        return q
    return jnp.zeros((q.shape[0], vocab_size), q.dtype).at[:, token_ids].set(q)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPDrafter:
    """Drafter over an ``MTPHead`` (``head``: a pytree or NNX module; often the target itself, which
    shares its embedding and LM head with the MTP layers). ``feature_size``: width F of the hidden that
    layer 0 consumes (default ``head.feature_size``). ``implementation`` / ``interpret`` go to the
    ``jaxspec.kernels`` ops (``rotate_input_ids``). ``sample_drafts``: chains only; sample the chain and keep
    its distributions when the engine passes ``sampling`` (``verify="draft_probs"``)."""

    head: object
    feature_size: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    implementation: Implementation = dataclasses.field(default="auto", metadata=dict(static=True))
    interpret: bool = dataclasses.field(default=False, metadata=dict(static=True))
    sample_drafts: bool = dataclasses.field(default=False, metadata=dict(static=True))

    def __post_init__(self):
        check_implements(self.head, MTPHead, "head")
        if not isinstance(self.sample_drafts, bool):
            raise ValueError(f"sample_drafts: expected a bool, got {self.sample_drafts!r}")
        if self.feature_size is None:
            if not isinstance(getattr(self.head, "feature_size", None), int):
                raise ValueError("feature_size: give the width F of the target's hidden feature (the head has none)")
            object.__setattr__(self, "feature_size", int(self.head.feature_size))

    def _kw(self):
        return dict(implementation=self.implementation, interpret=self.interpret)

    def _token_ids(self):
        """The head's reduced draft vocabulary (``MTPHead.draft_token_ids``, optional), or ``None``."""
        return getattr(self.head, "draft_token_ids", None)

    # ---------------------------------------------------------------- host side
    def kv_bytes_per_slot(self, spec) -> int:
        if spec.num_steps > self.head.num_draft_steps:
            raise ValueError(
                f"spec.num_steps={spec.num_steps} needs that many draft steps; the head runs at most "
                f"{self.head.num_draft_steps} (num_draft_steps). An MTPModel with fewer MTP layers than steps reuses "
                f"its last layer's weights: MTPModel(..., num_draft_steps={spec.num_steps})"
            )
        ids = self._token_ids()
        if ids is not None and spec.topk > ids.shape[0]:
            raise ValueError(f"spec.topk={spec.topk} exceeds the head's draft vocabulary ({ids.shape[0]} tokens)")
        shape = jax.eval_shape(lambda: self.head.make_draft_cache(np.zeros((1, 1), np.int32), 1))
        return int(shape.k.size * shape.k.dtype.itemsize + shape.v.size * shape.v.dtype.itemsize)

    def state_key(self, spec) -> tuple[int, int]:
        """The extend runs one MTP layer per draft step and keeps ``topk`` (tree) or ``S`` (chain) proposals:
        shapes with the same ``(num_steps, topk)`` have equal states."""
        return (int(spec.num_steps), int(spec.topk))

    def init_state(self, spec, req_to_token, num_slots: int) -> MTPDraftState:
        b = req_to_token.shape[0]
        x = spec.num_steps if spec.topk == 1 else spec.topk
        if self.sample_drafts and spec.topk != 1:
            raise ValueError(f"sample_drafts: MTPDrafter samples chains only (spec.topk == 1), got topk={spec.topk}")
        cache = self.head.make_draft_cache(req_to_token, num_slots)
        probs = None
        if self.sample_drafts:
            v = getattr(self.head, "vocab_size", None)
            if not isinstance(v, int):
                raise ValueError("sample_drafts: the head needs an int vocab_size (width of the draft distributions)")
            probs = jnp.zeros((b, spec.num_steps, v), jnp.float32)
        return MTPDraftState(
            cache=cache,
            topk_p=jnp.zeros((b, x), jnp.float32),
            topk_index=jnp.zeros((b, x), jnp.int32),
            hidden=jnp.zeros((b, self.feature_size), jnp.float32),
            draft_probs=probs,
        )

    # ---------------------------------------------------------------- jitted
    def _extend(self, spec, cache, ids, h, meta, starts, lens, select, sampling=None, feed=None) -> MTPDraftState:
        """Draft steps 0..S-1 over ``ids/h (B, Q)`` with SGLang's rotations; returns the new state. ``feed``
        (``i32[B, >= S-1]``): the tokens the rotation after step ``s`` writes at ``select`` (``feed[:, s]``)
        instead of step ``s``'s prediction."""
        if sampling is not None and not self.sample_drafts:
            raise ValueError("sampling: this MTPDrafter was built with sample_drafts=False")
        b, q = ids.shape
        flat = ids.reshape(b * q)
        tids = self._token_ids()
        vocab = getattr(self.head, "vocab_size", None)
        chain_p, chain_i, chain_q = [], [], []
        first = None
        for s in range(spec.num_steps):
            # logits of the selected rows only: the LM head over all B*Q window rows would be discarded
            sel, h, cache = self.head.mtp_forward(s, h, flat.reshape(b, q), meta, cache, rows=select)
            p, idx = _topk(sel, spec.topk, tids)
            if self.sample_drafts:
                if sampling is None:  # greedy batch: the argmax chain, recorded as one-hot distributions
                    chain_q.append(jax.nn.one_hot(idx[:, 0], vocab, dtype=jnp.float32))
                else:
                    qs = sampling_probs(sel[:, None], sampling.temperature, sampling.top_k, sampling.top_p)[:, 0]
                    idx = sample_from_probs(qs, sampling.coins[:, s])[:, None]
                    if tids is not None:
                        idx = tids[idx]
                    chain_q.append(_full_vocab(qs, tids, vocab))
            if s == 0:  # carried as float32 (exact for bf16 / f16 heads; a fixed loop-carry dtype)
                first = (p, idx, h.reshape(b * q, -1)[select].astype(jnp.float32))
            chain_p.append(p[:, :1])
            chain_i.append(idx[:, :1])
            if s + 1 < spec.num_steps:
                nxt = idx[:, :1] if feed is None else feed[:, s : s + 1]
                flat = rotate_input_ids(flat, starts, lens, nxt, select, **self._kw())
        if spec.topk == 1:
            probs = jnp.stack(chain_q, 1) if self.sample_drafts else None
            return MTPDraftState(cache, jnp.concatenate(chain_p, 1), jnp.concatenate(chain_i, 1), first[2], probs)
        return MTPDraftState(cache, first[0], first[1], first[2])

    def prefill_lookahead(self, spec) -> int:
        """Prompt tokens past a non-final chunk that ``extend_after_prefill`` of the chunk reads (``first_tokens``
        and ``lookahead``): step ``s`` of the chunk's last row consumes the token ``s + 1`` places on."""
        return int(spec.num_steps)

    def extend_after_prefill(self, spec, state, tokens, hidden, meta, prompt_lens, first_tokens, *, sampling=None,
                             lookahead=None):
        """``lookahead`` (``i32[B, S-1]``, a non-final chunk of a chunked prefill, ``first_tokens`` then being
        the prompt's next token): the prompt tokens after ``first_tokens``, fed to draft steps ``1..S-1`` where
        a whole prompt's extend has the real tokens (the chunk's last rows), so the chunk writes the draft KV
        the unchunked extend writes."""
        b, p = tokens.shape
        starts = jnp.arange(b, dtype=jnp.int32) * p
        # The next token of prompt row j is prompt[j + 1]; after the last prompt row it is the first token.
        ids = rotate_input_ids(tokens.reshape(b * p), starts, prompt_lens, first_tokens[:, None], **self._kw())
        return self._extend(
            spec, state.cache, ids.reshape(b, p), hidden, meta, starts, prompt_lens, starts + prompt_lens - 1,
            sampling, lookahead,
        )

    def extend_after_verify(self, spec, state, tokens, hidden, meta, accept_lens, *, sampling=None):
        b, n = tokens.shape
        starts = jnp.arange(b, dtype=jnp.int32) * n
        return self._extend(
            spec, state.cache, tokens, hidden, meta, starts, jnp.full((b,), n, jnp.int32), starts + accept_lens - 1,
            sampling,
        )

    def propose(self, spec, state, bonus, meta: AttentionMetadata):
        if spec.topk == 1:
            if state.draft_probs is not None:
                return ChainDraft(state.topk_index, state.draft_probs), state
            return state.topk_index, state
        return self._draft_tree(spec, state, meta), state

    def _draft_tree(self, spec, state: MTPDraftState, meta: AttentionMetadata) -> DraftResults:
        k = spec.topk
        b, d = state.hidden.shape
        sel = select_top_k_tokens(0, state.topk_p, state.topk_index, state.hidden, None, topk=k)
        scores, tokens, parents = [sel.tree_info.scores], [sel.tree_info.tokens], [sel.tree_info.parents]
        row = meta.prefix_lens - 1  # the last committed target hidden: MTP layer 0 consumed it with the bonus
        beam_meta = dataclasses.replace(
            meta,
            positions=jnp.broadcast_to(row[:, None], (b, k)),
            qmask=jnp.broadcast_to(jnp.eye(k, dtype=bool)[None], (b, k, k)),
            prefix_lens=row,
            write_locs=None,
        )
        for i in range(1, spec.num_steps):
            logits, h, _ = self.head.mtp_forward(
                i, sel.hidden_states.reshape(b, k, d), sel.input_ids.reshape(b, k), beam_meta, state.cache
            )
            p, idx = _topk(logits.reshape(b * k, -1), k, self._token_ids())
            sel = select_top_k_tokens(i, p, idx, h.reshape(b * k, d), sel.scores, topk=k)
            scores.append(sel.tree_info.scores)
            tokens.append(sel.tree_info.tokens)
            parents.append(sel.tree_info.parents)
        return organize_draft_results(scores, tokens, parents, num_draft_tokens=spec.num_draft_tokens)


__all__ = ["MTPDraftState", "MTPDrafter"]
