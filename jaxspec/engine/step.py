"""Jittable building blocks of the decode loops: prefill (+ MTP draft extend), ``spec_step``, ``plain_step``.

Everything here is pure and traced under the caller's ``jax.jit``; shapes are static given
``(B, P, T, W, S, K, N, V)``. Data flow of one speculative round (ops-spec §0.4, seed ``MTPWorkerV2``):

  draft (chain: the S MTP tokens proposed by the last draft extend; tree: S-1 beam forwards of MTP
  layers 1..S-1 over the K beams + ``select_top_k_tokens`` / ``organize_draft_results``)
  -> ``build_chain_tree`` / ``build_tree`` (QLEN_ONLY)
  -> target verify forward over the N tree nodes at tree positions, KV to the window slots
     ``req_to_token[b, seq_len + j]`` (``assign_extend_cache_locs_uniform``)
  -> ``eagle_sample`` (greedy) + ``fill_bonus_tokens``
  -> K > 1: ``move_accept_tokens_to_target_kvcache`` + ``compact_accept_to_front`` (predict, hidden)
  -> draft extend: MTP layers 0..S-1 over the N-token window, rotating the ids by each layer's
     prediction at ``select_index = b*N + accept_lens - 1`` (``rotate_input_ids``)
  -> ``seq_lens += accept_lens`` (active requests only).

MTP layers are chained as in DeepSeek-V3 (layer ``s`` consumes layer ``s-1``'s hidden state; the seed's
``chain_mtp_hidden_states``). The draft extend is the seed's eager path (fixed N-wide window, one
``select_index``): rows past ``select_index - s`` of MTP layer ``s`` are fed a drafted (not yet verified)
token, so the draft KV of the last ``s`` committed positions of layer ``s`` is computed from a guess and
kept. The seed's CUDA-graph "KV-cache reversion" (window widened by one row per step, hidden rows from
``req_to_hidden_states_pool`` via ``assign_hidden_states_pool``) re-runs those rows; it is not ported: it
only affects draft quality, never the output (verify is exact), and the shipped pair still accepts
3.3-3.9 of 4 tokens per round. Consequently ``assign_hidden_states_pool`` is not used here.
"""

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.engine.state import DecodeState, EngineOptions
from jaxspec.kernels.cache_locs import assign_extend_cache_locs_uniform
from jaxspec.kernels.multi_layer_eagle import rotate_input_ids
from jaxspec.models.llama import ForwardInputs, TinyPair, causal_mask
from jaxspec.ops.accept import eagle_sample, fill_bonus_tokens
from jaxspec.ops.draft import organize_draft_results, select_top_k_tokens
from jaxspec.ops.tree import TreeMaskMode, build_chain_tree, build_tree


def _kernel_kw(opts: EngineOptions) -> dict:
    return dict(implementation=opts.implementation, interpret=opts.interpret)


def _topk(logits: jax.Array, k: int):
    """``softmax`` + top-k (first index on ties), as ``fast_topk`` after the draft's softmax."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    p, idx = jax.lax.top_k(probs, k)
    return p, idx.astype(jnp.int32)


def _rows(x: jax.Array, b: int) -> jax.Array:
    return jnp.arange(b, dtype=jnp.int32) if x is None else x


# --------------------------------------------------------------------------------------------
# Output bookkeeping
# --------------------------------------------------------------------------------------------


def append_tokens(state: DecodeState, tokens: jax.Array, counts: jax.Array):
    """Append ``tokens[b, :counts[b]]`` (i32[B, A]) for active requests; stop on max-new / EOS.

    Returns ``(out_tokens, num_generated, done)``. Tokens past ``max_new_tokens`` or past the first EOS
    (``state.eos_id``, -1 = none) are dropped; the EOS itself is kept.
    """
    b, a = tokens.shape
    active = ~state.done
    k = jnp.arange(a, dtype=jnp.int32)[None, :]
    pos = state.num_generated[:, None] + k
    valid = (k < counts[:, None]) & (pos < state.max_new_tokens[:, None]) & active[:, None]
    is_eos = valid & (tokens == state.eos_id) & (state.eos_id >= 0)
    first = jnp.min(jnp.where(is_eos, k, a), axis=1)
    valid = valid & (k <= first[:, None])
    hit_eos = jnp.any(is_eos, axis=1)
    width = state.out_tokens.shape[1]
    rows = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, a))
    out = state.out_tokens.at[rows, jnp.where(valid, pos, width)].set(tokens, mode="drop")
    num = state.num_generated + jnp.sum(valid.astype(jnp.int32), axis=1)
    done = state.done | (num >= state.max_new_tokens) | hit_eos
    return out, num, done


# --------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------


def _draft_extend(model, opts, cache, ids, h, positions, prefix_lens, write_locs, starts, lens, select):
    """Run MTP layers 0..S-1 over ``ids/h (B, Q)`` with the seed's rotations; returns the proposal.

    ``select`` (i32[B]) is the absolute flat row whose prediction feeds the next draft; after layer ``s``
    the ids are rotated left by one with that prediction written at ``select`` (``rotate_input_ids``).
    Returns ``(topk_p, topk_index, hidden, cache)`` in the ``DecodeState`` layout.
    """
    spec = opts.spec
    b, q = ids.shape
    inp = ForwardInputs(positions=positions, qmask=causal_mask(b, q), prefix_lens=prefix_lens, write_locs=write_locs)
    flat = ids.reshape(b * q)
    chain_p, chain_i = [], []
    first = None
    for s in range(spec.num_steps):
        logits, h, cache = model.draft(s, h, flat.reshape(b, q), inp, cache)
        row_logits = logits.reshape(b * q, -1)[select]
        p, idx = _topk(row_logits, spec.topk)
        if s == 0:
            first = (p, idx, h.reshape(b * q, -1)[select])
        chain_p.append(p[:, :1])
        chain_i.append(idx[:, :1])
        if s + 1 < spec.num_steps:
            flat = rotate_input_ids(flat, starts, lens, idx[:, :1], select, **_kernel_kw(opts))
    if spec.topk == 1:
        return jnp.concatenate(chain_p, 1), jnp.concatenate(chain_i, 1), first[2], cache
    return first[0], first[1], first[2], cache


def prefill(model: TinyPair, opts: EngineOptions, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array):
    """Target prefill of padded ``prompts (B, P)`` + (spec) MTP draft extend; returns the new state.

    The first token (greedy) becomes the bonus and the first output; ``seq_lens = prompt_lens``.
    """
    b, p = prompts.shape
    j = jnp.arange(p, dtype=jnp.int32)[None, :]
    positions = jnp.broadcast_to(j, (b, p))
    in_prompt = j < prompt_lens[:, None]
    locs = jnp.where(in_prompt, state.target_cache.req_to_token[:b, :p], 0)  # padding -> dummy slot 0
    inp = ForwardInputs(positions=positions, qmask=causal_mask(b, p), prefix_lens=None, write_locs=locs)
    logits, hidden, tcache = model.target(prompts, inp, state.target_cache)
    last = prompt_lens - 1
    rows = jnp.arange(b, dtype=jnp.int32)
    first = jnp.argmax(logits[rows, last], axis=-1).astype(jnp.int32)
    state = dataclasses.replace(state, target_cache=tcache, seq_lens=prompt_lens, bonus=first)
    if opts.spec is not None:
        starts = rows * p
        ids = rotate_input_ids(prompts.reshape(b * p), starts, prompt_lens, first[:, None], **_kernel_kw(opts))
        topk_p, topk_index, hid, dcache = _draft_extend(
            model, opts, state.draft_cache, ids.reshape(b, p), hidden, positions, None, locs,
            starts, prompt_lens, starts + last,
        )
        state = dataclasses.replace(state, draft_cache=dcache, topk_p=topk_p, topk_index=topk_index, hidden=hid)
    out, num, done = append_tokens(state, first[:, None], jnp.ones((b,), jnp.int32))
    return dataclasses.replace(state, out_tokens=out, num_generated=num, done=done)


# --------------------------------------------------------------------------------------------
# Speculative round
# --------------------------------------------------------------------------------------------


def _draft_tree(model: TinyPair, opts: EngineOptions, state: DecodeState):
    """Tree drafting (K > 1): S-1 beam forwards, MTP layer ``i`` on the B*K beams of step ``i``.

    Beams sit at the row of the last committed target hidden (position ``seq_lens - 1``), attend to that
    MTP layer's committed KV (positions ``< seq_lens - 1``) plus themselves, and write no KV.
    Returns ``build_tree``'s inputs via ``organize_draft_results``.
    """
    spec = opts.spec
    k, b = spec.topk, state.seq_lens.shape[0]
    d = state.hidden.shape[-1]
    sel = select_top_k_tokens(0, state.topk_p, state.topk_index, state.hidden, None, topk=k)
    scores, tl, pl = [sel.tree_info.scores], [sel.tree_info.tokens], [sel.tree_info.parents]
    row = state.seq_lens - 1
    inp = ForwardInputs(
        positions=jnp.broadcast_to(row[:, None], (b, k)),
        qmask=jnp.broadcast_to(jnp.eye(k, dtype=bool)[None], (b, k, k)),
        prefix_lens=row,
        write_locs=None,
    )
    for i in range(1, spec.num_steps):
        logits, h, _ = model.draft(
            i, sel.hidden_states.reshape(b, k, d), sel.input_ids.reshape(b, k), inp, state.draft_cache
        )
        p, idx = _topk(logits.reshape(b * k, -1), k)
        sel = select_top_k_tokens(i, p, idx, h.reshape(b * k, d), sel.scores, topk=k)
        scores.append(sel.tree_info.scores)
        tl.append(sel.tree_info.tokens)
        pl.append(sel.tree_info.parents)
    return organize_draft_results(scores, tl, pl, num_draft_tokens=spec.num_draft_tokens)


def spec_step(model: TinyPair, opts: EngineOptions, state: DecodeState) -> DecodeState:
    """One speculative round for the whole batch (traced; see the module docstring). Requests already
    ``done`` are computed but frozen (their writes stay inside their own, already reserved window)."""
    spec = opts.spec
    s, k, n = spec.num_steps, spec.topk, spec.num_draft_tokens
    b = state.seq_lens.shape[0]
    rows = jnp.arange(b, dtype=jnp.int32)
    seq = state.seq_lens

    # 1. draft tree
    if k == 1:
        tree = build_chain_tree(state.bonus, state.topk_index, seq, config=spec)
    else:
        res = _draft_tree(model, opts, state)
        tree = build_tree(
            state.bonus, res.parent_list, res.top_scores_index, res.draft_tokens, seq,
            config=spec, mask_mode=TreeMaskMode.QLEN_ONLY,
        )

    # 2. target verify over the N nodes, KV to the window slots req_to_token[b, seq + j]
    locs = assign_extend_cache_locs_uniform(
        rows, state.target_cache.req_to_token, seq, width=n, **_kernel_kw(opts)
    ).out_cache_loc
    inp = ForwardInputs(
        positions=tree.positions.reshape(b, n),
        qmask=tree.tree_mask.reshape(b, n, n),
        prefix_lens=seq,
        write_locs=locs.reshape(b, n),
    )
    logits, hidden, tcache = model.target(tree.draft_tokens.reshape(b, n), inp, state.target_cache)

    # 3. greedy verify, bonus token
    out = eagle_sample(
        logits.reshape(b * n, -1), tree.draft_tokens, tree.retrieve_index, tree.retrieve_next_token,
        tree.retrieve_next_sibling, config=spec, greedy=True,
    )
    bonus = fill_bonus_tokens(out.predict, out.accept_index, out.accept_lens)
    accepted = jnp.take(out.predict, jnp.maximum(out.accept_index, 0), axis=0)  # (B, S+1), valid < accept_lens
    predict, hidden = out.predict, hidden.reshape(b * n, -1)

    # 4. tree: move the accepted path's KV to the window front, compact predict / hidden the same way
    if k > 1:
        from jaxspec.kernels.kv_move import compact_accept_to_front, move_accept_tokens_to_target_kvcache

        new_k, new_v = move_accept_tokens_to_target_kvcache(
            tcache.k, tcache.v, out.accept_index, out.accept_lens, locs, **_kernel_kw(opts)
        )
        tcache = dataclasses.replace(tcache, k=new_k, v=new_v)
        predict = compact_accept_to_front(predict, out.accept_index, num_draft_tokens=n)
        hidden = compact_accept_to_front(hidden, out.accept_index, num_draft_tokens=n)

    # 5. draft extend over the window -> next proposal
    starts = rows * n
    window = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None, :], (b, n))
    topk_p, topk_index, hid, dcache = _draft_extend(
        model, opts, state.draft_cache, predict.reshape(b, n), hidden.reshape(b, n, -1),
        seq[:, None] + window, seq, locs.reshape(b, n), starts, jnp.full((b,), n, jnp.int32),
        starts + out.accept_lens - 1,
    )

    # 6. commit (active requests only) and append the accepted tokens
    active = ~state.done
    out_tokens, num, done = append_tokens(state, accepted, out.accept_lens)
    return dataclasses.replace(
        state,
        target_cache=tcache,
        draft_cache=dcache,
        seq_lens=jnp.where(active, seq + out.accept_lens, seq),
        bonus=jnp.where(active, bonus, state.bonus),
        topk_p=topk_p,
        topk_index=topk_index,
        hidden=hid,
        out_tokens=out_tokens,
        num_generated=num,
        done=done,
        num_rounds=state.num_rounds + active.astype(jnp.int32),
        num_accepted=state.num_accepted + jnp.where(active, out.accept_lens, 0),
    )


# --------------------------------------------------------------------------------------------
# Plain greedy decode
# --------------------------------------------------------------------------------------------


def plain_step(model: TinyPair, opts: EngineOptions, state: DecodeState) -> DecodeState:
    """One plain greedy decode step: commit ``bonus`` at ``seq_lens`` and predict the next token."""
    b = state.seq_lens.shape[0]
    rows = jnp.arange(b, dtype=jnp.int32)
    seq = state.seq_lens
    loc = state.target_cache.req_to_token[rows, seq]
    inp = ForwardInputs(
        positions=seq[:, None], qmask=jnp.ones((b, 1, 1), bool), prefix_lens=seq, write_locs=loc[:, None]
    )
    logits, _, tcache = model.target(state.bonus[:, None], inp, state.target_cache)
    nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
    active = ~state.done
    out_tokens, num, done = append_tokens(state, nxt[:, None], jnp.ones((b,), jnp.int32))
    return dataclasses.replace(
        state,
        target_cache=tcache,
        seq_lens=jnp.where(active, seq + 1, seq),
        bonus=jnp.where(active, nxt, state.bonus),
        out_tokens=out_tokens,
        num_generated=num,
        done=done,
        num_rounds=state.num_rounds + active.astype(jnp.int32),
        num_accepted=state.num_accepted + active.astype(jnp.int32),
    )
