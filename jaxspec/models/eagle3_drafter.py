"""``EAGLE3Drafter``: the ``jaxspec.protocols.Drafter`` of an EAGLE-3 head (``jaxspec.models.eagle3.EAGLE3Model``).

Follows SGLang's EAGLE worker (``eagle_worker.py``: draft extend, then ``draft_forward``):

* Draft extend (after prefill and after every verify): one draft forward over the window, row ``t`` fed the
  target's aux features at ``t`` through ``fc`` and the embedding of the token that follows ``t``, at
  position ``t``, its K/V written to the draft's one-layer paged cache (slot ids shared with the target).
  The selected row (the last real one) gives step 0's top-K (draft ids mapped to target ids through
  ``arange(Vd) + d2t``) and the draft's pre-norm output there.
* Chain (``topk == 1``): draft step ``i`` (``1 <= i < S``) runs at position ``c - 1 + i`` (``c``: the committed
  length, so step 1 sits at ``c`` as in SGLang, whose positions start at ``seq_lens``), fed the previous step's
  argmax token and the draft's OWN pre-norm output of the previous step (SGLang: ``fc`` is skipped when the
  hidden is already ``H`` wide); it attends to the committed draft K/V and to steps ``1..i-1``, whose K/V it
  writes at their positions' slots (past the committed length: the next extend overwrites them).
* Tree (``topk > 1``): SGLang's beam search (``select_top_k_tokens`` / ``organize_draft_results``). Each
  beam at step ``i`` is recomputed with its whole path (``i`` rows: its ancestors' tokens and input hiddens,
  positions ``c .. c - 1 + i``, causal within the path, nothing written), so every beam attends to exactly its
  own ancestors (SGLang's draft decode reads the K/V of the beam *slot*, which after a re-ranking need not be
  the beam's ancestry). A path's rows cost ``1 + 2 + ... + (S - 1)`` rows per beam in all: small for the
  draft's one layer.

Verification is exact whatever the drafter proposes (``verify="target_only"``); sampled drafts
(``verify="draft_probs"``) are not implemented here.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.kernels import Implementation
from jaxspec.models.eagle3 import EAGLE3Model, aux_layers_from_ids
from jaxspec.ops.draft import DraftResults, fast_topk, organize_draft_results, select_top_k_tokens
from jaxspec.protocols import AttentionMetadata, PagedKVCache

_F32 = jnp.float32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EAGLE3DraftState:
    """cache: the draft layer's paged KV (one layer). topk_p / topk_index: ``[B, K]`` step 0's top-K (target
    ids) at the last committed row. hidden: ``f32[B, H]`` the draft's pre-norm output there."""

    cache: PagedKVCache
    topk_p: jax.Array
    topk_index: jax.Array
    hidden: jax.Array


class EAGLE3Drafter(nnx.Module):
    """Drafter over ``model`` (an ``EAGLE3Model``) for ``target``, whose token embedding it shares (the same NNX
    variable: it travels once through the engine). ``target`` must hand the drafter its aux features:
    ``Decoder(aux_layers=aux_layers_from_ids(model.cfg.aux_layer_ids, L))``. Any other target: pass
    ``embed`` (the ``[V, Ht]`` embedding, an ``nnx.Variable`` or array) and ``target=None``."""

    def __init__(self, model: EAGLE3Model, target=None, *, embed=None, implementation: Implementation = "auto",
                 interpret: bool = False):
        if not isinstance(model, EAGLE3Model):
            raise ValueError(f"model: expected an EAGLE3Model, got {type(model).__name__}")
        cfg = model.cfg
        if target is not None:
            if embed is not None:
                raise ValueError("embed: give the target or its embedding, not both")
            want = len(cfg.aux_layer_ids) * cfg.target_hidden_size
            if getattr(target, "feature_size", None) != want:
                raise ValueError(f"target: feature_size {getattr(target, 'feature_size', None)} != the head's fc input "
                                 f"{want}; load the target with aux_layers=aux_layers_from_ids({list(cfg.aux_layer_ids)}, L)")
            tl = getattr(target, "aux_layers", None)
            n = getattr(getattr(target, "cfg", None), "num_hidden_layers", None)
            if tl is not None and n is not None and tuple(tl) != aux_layers_from_ids(cfg.aux_layer_ids, n):
                raise ValueError(f"target: aux_layers {tuple(tl)} differ from the head's "
                                 f"{aux_layers_from_ids(cfg.aux_layer_ids, n)} (ids {list(cfg.aux_layer_ids)})")
            embed = target.embed_tokens
        if embed is None:
            raise ValueError("embed: the target's token embedding is needed (pass target= or embed=)")
        if not isinstance(embed, nnx.Variable):
            embed = nnx.Param(jnp.asarray(embed))
        shape = tuple(embed.get_value().shape)
        if shape != (cfg.decoder.vocab_size, cfg.decoder.hidden_size):
            raise ValueError(f"embed: expected shape {(cfg.decoder.vocab_size, cfg.decoder.hidden_size)}, got {shape}")
        self.model = model
        self.embed_tokens = embed
        self.implementation = implementation
        self.interpret = interpret

    def _embed(self, tokens):
        return self.embed_tokens[...][tokens].astype(_F32)

    def _topk(self, out, k):
        p, idx = fast_topk(jax.nn.softmax(self.model.logits(out), axis=-1), k)
        return p, self.model.token_ids[...][idx]

    # ---------------------------------------------------------------- host side
    def kv_bytes_per_slot(self, spec) -> int:
        vd = self.model.cfg.draft_vocab_size
        if spec.topk > vd:
            raise ValueError(f"spec.topk={spec.topk} exceeds the head's draft vocabulary ({vd} tokens)")
        return self.model.kv_bytes_per_slot()

    def state_key(self, spec) -> int:
        """Shapes with the same ``topk`` have equal states after the same extends (the chain length is read by
        ``propose`` only)."""
        return int(spec.topk)

    def init_state(self, spec, req_to_token, num_slots: int) -> EAGLE3DraftState:
        b, k = req_to_token.shape[0], spec.topk
        return EAGLE3DraftState(self.model.make_cache(req_to_token, num_slots), jnp.zeros((b, k), _F32),
                                jnp.zeros((b, k), jnp.int32), jnp.zeros((b, self.model.hidden_size), _F32))

    # ---------------------------------------------------------------- jitted
    def _extend(self, spec, state, next_tokens, aux, meta, select, sampling):
        if sampling is not None:
            raise ValueError("sampling: EAGLE3Drafter proposes greedy drafts (use verify='target_only')")
        b, q = next_tokens.shape
        out, cache = self.model.forward(self._embed(next_tokens), self.model.project(aux), meta, state.cache)
        last = out.reshape(b * q, -1)[select]
        p, idx = self._topk(last, spec.topk)
        return EAGLE3DraftState(cache, p, idx.astype(jnp.int32), last.astype(_F32))

    def extend_after_prefill(self, spec, state, tokens, hidden, meta, prompt_lens, first_tokens, *, sampling=None):
        b, p = tokens.shape
        j = jnp.arange(p, dtype=jnp.int32)[None, :]
        nxt = jnp.where(j == prompt_lens[:, None] - 1, first_tokens[:, None], jnp.roll(tokens, -1, axis=1))
        select = jnp.arange(b, dtype=jnp.int32) * p + prompt_lens - 1
        return self._extend(spec, state, nxt, hidden, meta, select, sampling)

    def extend_after_verify(self, spec, state, tokens, hidden, meta, accept_lens, *, sampling=None):
        b, n = tokens.shape
        select = jnp.arange(b, dtype=jnp.int32) * n + accept_lens - 1
        return self._extend(spec, state, tokens, hidden, meta, select, sampling)

    def propose(self, spec, state: EAGLE3DraftState, bonus, meta: AttentionMetadata):
        if spec.topk == 1:
            return self._chain(spec, state, meta)
        return self._tree(spec, state, meta), state

    def _chain(self, spec, state, meta):
        b = state.hidden.shape[0]
        c = meta.prefix_lens
        width = meta.page_table.shape[1] * meta.page_size
        rows = jnp.arange(b)
        tok, h, cache = state.topk_index[:, 0], state.hidden, state.cache
        tokens = [tok]
        for i in range(1, spec.num_steps):
            pos = jnp.minimum(c - 1 + i, width - 1).astype(jnp.int32)
            slot = meta.page_table[rows, pos // meta.page_size] * meta.page_size + pos % meta.page_size
            m = dataclasses.replace(meta, positions=pos[:, None], prefix_lens=pos, write_locs=slot[:, None],
                                    qmask=jnp.ones((b, 1, 1), bool))
            out, cache = self.model.forward(self._embed(tok[:, None]), h[:, None].astype(_F32), m, cache)
            h = out[:, 0]
            _, idx = self._topk(h, 1)
            tok = idx[:, 0].astype(jnp.int32)
            tokens.append(tok)
        return jnp.stack(tokens, axis=1), dataclasses.replace(state, cache=cache)

    def _tree(self, spec, state, meta) -> DraftResults:
        k = spec.topk
        b, d = state.hidden.shape
        c = meta.prefix_lens
        sel = select_top_k_tokens(0, state.topk_p, state.topk_index, state.hidden, None, topk=k)
        scores, tokens, parents = [sel.tree_info.scores], [sel.tree_info.tokens], [sel.tree_info.parents]
        path_tok = sel.input_ids.reshape(b, k, 1)  # each beam's path: tokens and input hiddens of its nodes
        path_h = sel.hidden_states.reshape(b, k, 1, d).astype(_F32)
        for i in range(1, spec.num_steps):
            pos = jnp.broadcast_to((c[:, None] + jnp.arange(i, dtype=jnp.int32)[None, :])[:, None, :], (b, k, i))
            causal = jnp.arange(i)[:, None] >= jnp.arange(i)[None, :]
            qmask = jnp.kron(jnp.eye(k, dtype=jnp.int32), causal.astype(jnp.int32)).astype(bool)
            m = dataclasses.replace(meta, positions=pos.reshape(b, k * i), prefix_lens=c, write_locs=None,
                                    qmask=jnp.broadcast_to(qmask[None], (b, k * i, k * i)))
            out, _ = self.model.forward(self._embed(path_tok.reshape(b, k * i)), path_h.reshape(b, k * i, d), m,
                                        state.cache)
            last = out.reshape(b, k, i, d)[:, :, -1].reshape(b * k, d)
            p, idx = self._topk(last, k)
            sel = select_top_k_tokens(i, p, idx.astype(jnp.int32), last, sel.scores, topk=k)
            scores.append(sel.tree_info.scores)
            tokens.append(sel.tree_info.tokens)
            parents.append(sel.tree_info.parents)
            if i + 1 < spec.num_steps:
                parent = (sel.tree_info.parents - (k * k * (i - 1) + k)) // k  # (B, K) parent beam of each new beam
                path_tok = jnp.concatenate([jnp.take_along_axis(path_tok, parent[:, :, None], 1),
                                            sel.input_ids.reshape(b, k, 1)], axis=2)
                path_h = jnp.concatenate([jnp.take_along_axis(path_h, parent[:, :, None, None], 1),
                                          sel.hidden_states.reshape(b, k, 1, d).astype(_F32)], axis=2)
        return organize_draft_results(scores, tokens, parents, num_draft_tokens=spec.num_draft_tokens)


__all__ = ["EAGLE3DraftState", "EAGLE3Drafter"]
