"""Jittable building blocks of the decode loops: ``prefill`` (and ``prefill_chunk``, a non-final chunk of a
chunked prefill), ``spec_step``, ``plain_step``.

Everything here is pure and traced under the caller's ``jax.jit``; shapes are static given
``(B, P, T, W, S, K, N, V)``. The models are anything meeting ``jaxspec.protocols`` (no concrete class is
imported here). One speculative round::

    sampling keys -> drafter.propose -> pipeline.plan_verify -> target.forward (verify)
    -> pipeline.commit -> drafter.extend_after_verify -> append the accepted tokens (active requests only)
"""

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp

from jaxspec import pipeline
from jaxspec.config import SpecConfig
from jaxspec.engine.policy import advance_plain, choose_mode, plain_rounds_left, update_policy
from jaxspec.engine.simulate import SimulatedVerify, draw_accept_lens
from jaxspec.engine.state import DecodeState, EngineOptions
from jaxspec.ops.accept import MAX_COIN, sample_from_probs, sampling_probs

# Plain rounds of an adaptive loop per drafter catch-up (``plain_segment``): the drafter's extend over up to this
# many committed tokens runs once per run of plain rounds, not once per round.
PLAIN_EXTEND_WINDOW = 8


def _kernel_kw(opts: EngineOptions) -> dict:
    return dict(implementation=opts.implementation, interpret=opts.interpret)


def _target_meta(opts: EngineOptions, meta):
    """The metadata of a target forward: ``meta``, batch-invariant in an engine of that mode (the drafter's
    forwards keep the default kernels: the drafts only choose what is verified, never the output)."""
    return dataclasses.replace(meta, batch_invariant=True) if opts.batch_invariant else meta


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


def _greedy(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def request_keys(state: DecodeState, fold: jax.Array, num: int) -> jax.Array:
    """``num`` PRNG keys per request ``(B, num)``: ``split(fold_in(key(seed[b]), fold[b]), num)``. They depend
    on the request's own seed and counter only (never on its batch row or the other requests)."""

    def one(seed, r):
        return jax.random.split(jax.random.fold_in(jax.random.key(seed), r), num)

    return jax.vmap(one)(state.sampling.seed, fold)


def _coins(keys: jax.Array, shape: tuple) -> jax.Array:
    """``f32[B, *shape]`` coins in ``[0, 1)``, one stream per row key (``make_coins``'s clamp)."""
    u = jax.vmap(lambda k: jax.random.uniform(k, shape, jnp.float32))(keys)
    return jnp.minimum(u, jnp.float32(MAX_COIN))


def sample_next(state: DecodeState, logits: jax.Array, coins: jax.Array) -> jax.Array:
    """One token per request from ``logits f32[B, V]`` under its sampling parameters (``sampling_probs``:
    temperature-0 rows are greedy, ``argmax``)."""
    sp = state.sampling
    probs = sampling_probs(logits[:, None, :], sp.temperature, sp.top_k, sp.top_p)[:, 0]
    return sample_from_probs(probs, coins)


def _draft_sampling(state: DecodeState, keys: jax.Array, num_steps: int) -> pipeline.DraftSampling:
    sp = state.sampling
    return pipeline.DraftSampling(sp.temperature, sp.top_k, sp.top_p, _coins(keys, (num_steps,)))


def _draft_probs_mode(opts: EngineOptions, state: DecodeState) -> bool:
    return opts.verify == "draft_probs" and not state.all_greedy


def _takes_rows(target) -> bool:
    """Whether ``target.forward`` takes the optional ``rows`` keyword (``TargetModel``'s docstring)."""
    try:
        return "rows" in inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False


def _last_row_forward(target, prompts, meta, cache, prompt_lens):
    """The target's forward over right-padded ``prompts (B, P)`` returning only each prompt's last row of logits
    ``f32[B, V]`` (through ``forward(rows=)`` where the target takes it), the hidden and the cache."""
    b, p = prompts.shape
    req, last = jnp.arange(b, dtype=jnp.int32), jnp.maximum(prompt_lens - 1, 0)
    if _takes_rows(target):
        return target.forward(prompts, meta, cache, rows=req * p + last)
    logits, hidden, cache = target.forward(prompts, meta, cache)
    return logits[req, last], hidden, cache


def prefill(target, drafter, opts: EngineOptions, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array):
    """Target prefill of right-padded ``prompts (B, P)`` + the drafter's extend of every draft shape; returns
    the new state.

    The prompts extend the committed ``seq_lens`` (0 in a prepared state; passed as the run-time prefix, see
    ``pipeline.prefill_metadata``), which become ``seq_lens + prompt_lens``; the first token becomes the bonus
    and the first output. Greedy (``state.all_greedy``): the argmax. Else sampled with the keys
    ``fold_in(key(seed), 0)`` (split: the token's coin, and the drafter's coins in ``verify="draft_probs"``,
    one key per drafter state).
    """
    b, p = prompts.shape
    r2t = state.target_cache.req_to_token
    meta = pipeline.prefill_metadata(prompt_lens, r2t, p, page_size=opts.page_size, prefix_lens=state.seq_lens,
                                     **_kernel_kw(opts))
    last, hidden, tcache = _last_row_forward(target, prompts, _target_meta(opts, meta), state.target_cache,
                                             prompt_lens)
    keys = None
    if state.all_greedy:
        first = _greedy(last)
    else:
        keys = request_keys(state, jnp.zeros((b,), jnp.int32), 1 + max(1, len(opts.specs)))
        first = sample_next(state, last, _coins(keys[:, 0], ()))
    draft = state.draft
    if drafter is not None:
        def extend(i, base):
            kw = {}
            if keys is not None and _draft_probs_mode(opts, state):
                kw = dict(sampling=_draft_sampling(state, keys[:, 1 + i], opts.specs[i].num_steps))
            return drafter.extend_after_prefill(opts.specs[i], base, prompts, hidden, meta, prompt_lens, first, **kw)

        draft = _per_group(drafter, opts, draft, extend)
    state = dataclasses.replace(state, target_cache=tcache, draft=draft, seq_lens=state.seq_lens + prompt_lens,
                                bonus=first)
    out, num, done = append_tokens(state, first[:, None], jnp.ones((b,), jnp.int32))
    return dataclasses.replace(state, out_tokens=out, num_generated=num, done=done)


def prefill_lookahead(drafter, opts: EngineOptions) -> int:
    """How many prompt tokens past a non-final chunk ``prefill_chunk`` reads (``following``'s width): 1 (the
    token after the chunk, every drafter's ``first_tokens``), or more for a drafter whose extend reads further
    (``drafter.prefill_lookahead(spec)``, e.g. MTP's ``S``: its step ``s`` consumes the token ``s + 1`` on)."""
    look = getattr(drafter, "prefill_lookahead", None)
    if drafter is None or look is None:
        return 1
    return max([1] + [int(look(spec)) for spec in opts.specs])


def prefill_chunk(target, drafter, opts: EngineOptions, state: DecodeState, tokens: jax.Array, chunk_lens: jax.Array,
                  following: jax.Array) -> DecodeState:
    """A NON-final chunk of a chunked prefill (the last chunk is ``prefill``): the target's K/V of the
    right-padded ``tokens (B, P)`` (``chunk_lens`` real) written after the committed ``seq_lens`` (the prefix,
    as ``prefill``), the drafter's extend of every draft shape over them, ``seq_lens + chunk_lens`` committed.
    Nothing sampled, nothing appended (``bonus``, the outputs, ``done`` and the counters untouched).

    ``following i32[B, X]`` (``X >= prefill_lookahead``): the prompt tokens after each chunk. The drafter's
    extend takes ``following[:, 0]`` as the token after the chunk (where ``prefill`` passes the sampled first
    token), and a drafter with ``prefill_lookahead(spec) > 1`` also ``lookahead=following[:, 1:that]``; so with
    the prompt's own next tokens the chunks write the K/V (target and draft) one whole-prompt ``prefill``
    writes, as long as the last chunk keeps ``prefill_lookahead`` tokens (the caller's rule)."""
    b, p = tokens.shape
    meta = pipeline.prefill_metadata(chunk_lens, state.target_cache.req_to_token, p, page_size=opts.page_size,
                                     prefix_lens=state.seq_lens, **_kernel_kw(opts))
    _, hidden, tcache = target.forward(tokens, _target_meta(opts, meta), state.target_cache)  # logits: dead code
    draft = state.draft
    if drafter is not None:
        look = getattr(drafter, "prefill_lookahead", None)

        def extend(i, base):
            n = 1 if look is None else int(look(opts.specs[i]))
            kw = dict(lookahead=following[:, 1:n]) if n > 1 else {}
            return drafter.extend_after_prefill(opts.specs[i], base, tokens, hidden, meta, chunk_lens, following[:, 0],
                                                **kw)

        draft = _per_group(drafter, opts, draft, extend)
    return dataclasses.replace(state, target_cache=tcache, draft=draft, seq_lens=state.seq_lens + chunk_lens)


def state_groups(drafter, specs) -> list[list[int]]:
    """The draft shapes (indices into ``specs``) that share one drafter state computation: shapes with equal
    ``drafter.state_key(spec)`` (optional; a drafter without it: every shape alone), in order of first index."""
    key = getattr(drafter, "state_key", None)
    groups: dict = {}
    for i, spec in enumerate(specs):
        groups.setdefault(i if key is None else ("key", key(spec)), []).append(i)
    return list(groups.values())


def _per_group(drafter, opts: EngineOptions, draft: tuple, extend, first: int | None = None) -> tuple:
    """``draft`` with every shape's state replaced by ``extend(i, draft[i])`` of its group's shape ``i`` (the
    group's first shape, or ``first`` where the group holds it): one computation per group of equal states."""
    out = list(draft)
    for members in state_groups(drafter, opts.specs):
        i = first if first in members else members[0]
        new = extend(i, draft[i])
        for j in members:
            out[j] = new
    return tuple(out)


def extend_draft_states(drafter, opts: EngineOptions, state: DecodeState, draft: tuple, tokens, hidden, meta,
                        accept_lens, coin_keys=None, first: int | None = None) -> tuple:
    """Every draft shape's state extended over a committed window (``Drafter.extend_after_verify``: ``tokens``,
    ``hidden``, ``meta``, ``accept_lens``): whatever the round's mode, every shape keeps a state that has every
    committed position, so switching shapes (or from plain decoding) costs no acceptance. ``first``: the round's
    own shape (its state in ``draft`` is the one its proposal returned). ``coin_keys`` (``verify="draft_probs"``
    in a sampling batch): one key per request for the drafter's coins."""

    def extend(i, base):
        kw = {}
        if coin_keys is not None and _draft_probs_mode(opts, state):
            kw = dict(sampling=_draft_sampling(state, coin_keys, opts.specs[i].num_steps))
        return drafter.extend_after_verify(opts.specs[i], base, tokens, hidden, meta, accept_lens, **kw)

    return _per_group(drafter, opts, draft, extend, first)


def spec_step(target, drafter, opts: EngineOptions, state: DecodeState, which: int = 0) -> DecodeState:
    """One speculative round of draft shape ``opts.specs[which]`` (drafter state ``state.draft[which]``) for
    the whole batch (traced). Requests already ``done`` are computed but frozen (their writes stay inside
    their own, already reserved window).

    The round's keys come first (they depend on the state only): sampling batches (``not state.all_greedy``)
    take ``split(fold_in(key(seed), 1 + num_rounds), 3)`` per request (verify coins ``(N,)`` + final coin,
    drafter coins ``(S,)``) and verify with ``opts.verify``; with ``state.simulate`` (benchmarking) the accept
    lengths are drawn from it (keys ``fold_in(fold_in(key(seed), -(1 + num_rounds)), row)``: rows with equal
    seeds still draw apart) and the verifier is wrapped in ``SimulatedVerify``."""
    spec = opts.specs[which]
    kw = _kernel_kw(opts)
    seq, r2t = state.seq_lens, state.target_cache.req_to_token
    active = ~state.done
    sampling = ext = None
    if not state.all_greedy:
        keys = request_keys(state, state.num_rounds + 1, 3)
        sp = state.sampling
        sampling = pipeline.RoundSampling(
            sp.temperature, sp.top_k, sp.top_p, _coins(keys[:, 0], (spec.num_draft_tokens,)), _coins(keys[:, 1], ())
        )
        if _draft_probs_mode(opts, state):
            ext = _draft_sampling(state, keys[:, 2], spec.num_steps)
    sim_lens = None
    if state.simulate is not None:
        sim_keys = request_keys(state, -(1 + state.num_rounds), 1)[:, 0]
        sim_keys = jax.vmap(jax.random.fold_in)(sim_keys, jnp.arange(sim_keys.shape[0]))  # rows draw apart
        sim_lens = draw_accept_lens(state.simulate, sim_keys)
    root = pipeline.root_metadata(seq, r2t, page_size=opts.page_size, **kw)
    draft, dstate = drafter.propose(spec, state.draft[which], state.bonus, root)
    plan = pipeline.plan_verify(spec, state.bonus, draft, seq, r2t, page_size=opts.page_size, **kw)
    logits, hidden, tcache = target.forward(plan.tokens, _target_meta(opts, plan.meta), state.target_cache)
    if sampling is None:
        verifier = pipeline.VerifyGreedy(logits)
    elif ext is not None:
        if not isinstance(draft, pipeline.ChainDraft):
            raise ValueError(
                f"drafter: verify='draft_probs' needs propose to return a pipeline.ChainDraft (sampled tokens and "
                f"their probabilities), got {type(draft).__name__}"
            )
        verifier = pipeline.VerifyDraftProbs(logits, sampling, draft.probs)
    else:
        verifier = pipeline.VerifyTargetOnly(logits, sampling, opts.threshold_single, opts.threshold_acc)
    if sim_lens is not None:
        verifier = SimulatedVerify(verifier, sim_lens)
    out = pipeline.commit(spec, plan, tcache, verifier, hidden=hidden, active=active, **kw)
    coins = None if ext is None else keys[:, 2]
    draft = extend_draft_states(drafter, opts, state, state.draft[:which] + (dstate,) + state.draft[which + 1:],
                                out.window_tokens, out.window_hidden, out.draft_meta, out.accept_lens, coins,
                                first=which)
    out_tokens, num, done = append_tokens(state, out.accepted, out.accept_lens)
    return dataclasses.replace(
        state,
        target_cache=out.cache,
        draft=draft,
        seq_lens=out.seq_lens,
        bonus=out.bonus,
        out_tokens=out_tokens,
        num_generated=num,
        done=done,
        num_rounds=state.num_rounds + active.astype(jnp.int32),
        num_accepted=state.num_accepted + jnp.where(active, out.accept_lens, 0),
    )


def _plain_round(target, opts: EngineOptions, state: DecodeState):
    """One plain decode round without the drafter: ``(new state, next token i32[B], the target's features of the
    committed token [B, 1, D], the round's metadata, the round's key per request or None)``."""
    b = state.seq_lens.shape[0]
    seq = state.seq_lens
    meta = pipeline.decode_metadata(seq, state.target_cache.req_to_token, page_size=opts.page_size, **_kernel_kw(opts))
    logits, hidden, tcache = target.forward(state.bonus[:, None], _target_meta(opts, meta), state.target_cache)
    key = None
    if state.all_greedy:
        nxt = _greedy(logits[:, 0])
    else:
        key = request_keys(state, state.num_rounds + 1, 1)[:, 0]
        nxt = sample_next(state, logits[:, 0], _coins(key, ()))
    active = ~state.done
    out_tokens, num, done = append_tokens(state, nxt[:, None], jnp.ones((b,), jnp.int32))
    new = dataclasses.replace(
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
    return new, nxt, hidden, meta, key


def _drafter_coins(key):
    """The drafter's coin keys of a plain round whose key is ``key`` (``fold_in(k, 1)``), or None (greedy)."""
    return None if key is None else jax.vmap(lambda k: jax.random.fold_in(k, 1))(key)


def plain_step(target, opts: EngineOptions, state: DecodeState, drafter=None) -> DecodeState:
    """One plain decode step: commit ``bonus`` at ``seq_lens`` and predict the next token (greedy, or
    sampled with the key ``k = fold_in(key(seed), 1 + num_rounds)`` in sampling batches). With a ``drafter``
    (a plain round of an adaptive engine run on its own, ``Engine.run_step``) every draft shape's state is
    extended over the committed token (``extend_draft_states``; drafter coins from ``fold_in(k, 1)`` in
    ``verify="draft_probs"``); the compiled loop's plain rounds extend them once per run of rounds instead
    (``plain_segment``)."""
    new, nxt, hidden, meta, key = _plain_round(target, opts, state)
    if drafter is None or not opts.specs:
        return new
    b = state.seq_lens.shape[0]
    draft = extend_draft_states(drafter, opts, state, state.draft, nxt[:, None], hidden, meta,
                                jnp.ones((b,), jnp.int32), _drafter_coins(key))
    return dataclasses.replace(new, draft=draft)


def plain_segment(target, drafter, opts: EngineOptions, window: int, live, pick, forced=None):
    """The adaptive loop's plain rounds (``decode_loop``'s mode-0 segment), ``(state, rounds) -> (state,
    rounds)``, running rounds while ``live((state, rounds))`` (traced ``bool[]``: the loop goes on) and
    ``pick(state)`` (``i32[]``: the policy's choice, or ``forced``'s, a traced ``i32[]``, ``-1`` = the policy's)
    is plain, in runs of at most ``window`` rounds:

    * the policy is read and updated once per run, not per round: a run of plain rounds changes only the modes'
      idle counts, so the policy goes on choosing plain for ``policy.plain_rounds_left`` rounds (exact, the
      same float32 test as ``choose_mode``); the run stops there (or at ``window``, or when the loop ends) and
      ``policy.advance_plain`` applies its rounds in one update, what one ``update_policy`` per round gives;
    * the drafter is caught up once per run: the run keeps each committed token and the target's features of
      the position before it, then one ``extend_draft_states`` over that window (``accept_lens`` = the row's
      rounds in it) brings every draft shape's state to every committed position, as one extend per round
      would (a speculative round extends over its committed window the same way).

    A plain round then costs the target's forward and its bookkeeping, the policy's and the drafter's work a
    share of one per run. Lossless either way (the drafts only choose what a speculative round verifies).
    Sampling batches: the drafter's coins are those of the run's last round (``fold_in(k, 1)``, as
    ``plain_step``)."""
    if window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")

    def rounds(c):
        st, n, k, tokens, feats = c
        new, nxt, hidden, _, _ = _plain_round(target, opts, st)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], k, axis=1)
        feats = jax.lax.dynamic_update_slice_in_dim(feats, hidden.astype(feats.dtype), k, axis=1)
        return new, n + 1, k + 1, tokens, feats

    def run(c):
        st, n = c
        b = st.seq_lens.shape[0]
        feat = jax.eval_shape(lambda s: _plain_round(target, opts, s)[2], st)  # [B, 1, D]
        start, before, ps = st.seq_lens, st.num_rounds, st.policy
        left = plain_rounds_left(opts.adaptive, ps)
        if forced is not None:
            left = jnp.where(forced >= 0, jnp.int32(2**30), left)
        stop = jnp.minimum(jnp.maximum(left, 1), window)  # the run's first round is the policy's (or forced) choice
        zero = jnp.int32(0)
        init = (st, n, zero, jnp.zeros((b, window), jnp.int32), jnp.zeros((b, window) + feat.shape[2:], feat.dtype))
        st, n, k, tokens, feats = jax.lax.while_loop(
            lambda c: (c[2] == 0) | (live((c[0], c[1])) & (c[2] < stop)), rounds, init)
        count = st.num_rounds - before  # the row's rounds in this run: its tokens in the window (0: a done row)
        # no row becomes active inside a decode call, so the last round's rows are those active in every round
        requests, rows = jnp.sum(count), jnp.sum((count == k).astype(jnp.int32))
        meta = pipeline.prefill_metadata(count, st.target_cache.req_to_token, window, page_size=opts.page_size,
                                         prefix_lens=start, **_kernel_kw(opts))
        coins = None
        if not st.all_greedy:  # the run's last round's key (plain_step's k): num_rounds already counts that round
            coins = _drafter_coins(request_keys(st, st.num_rounds, 1)[:, 0])
        draft = extend_draft_states(drafter, opts, st, st.draft, tokens, feats, meta, jnp.maximum(count, 1), coins)
        return dataclasses.replace(st, draft=draft, policy=advance_plain(ps, k, requests, rows)), n

    return lambda c: jax.lax.while_loop(lambda c: live(c) & (pick(c[0]) == 0), run, c)


def adaptive_step(target, drafter, opts: EngineOptions, state: DecodeState) -> DecodeState:
    """One round of adaptive speculation (``Engine.run_step``; the compiled loop is ``decode_loop``):
    ``policy.choose_mode`` picks plain decoding (mode 0) or draft shape ``opts.specs[m - 1]``, one
    ``lax.switch`` runs that round, and the round's mean accept length over its active requests (and their
    number) updates the policy state."""
    ps = state.policy
    mode = choose_mode(opts.adaptive, ps)
    new = jax.lax.switch(mode, _mode_branches(target, drafter, opts), state)
    return dataclasses.replace(new, policy=update_policy(opts.adaptive, ps, mode, *_round_accept(state, new)))


def _mode_branches(target, drafter, opts: EngineOptions) -> list:
    """The round of each mode: plain decoding, then one per draft shape in ``opts.specs``."""
    out = [functools.partial(plain_step, target, opts, drafter=drafter)]
    return out + [functools.partial(spec_step, target, drafter, opts, which=i) for i in range(len(opts.specs))]


def _round_accept(old: DecodeState, new: DecodeState) -> tuple[jax.Array, jax.Array]:
    """``(mean accept length f32[], active requests i32[])`` of the round ``old -> new``."""
    rounds = jnp.sum(new.num_rounds - old.num_rounds)
    accepted = jnp.sum(new.num_accepted - old.num_accepted).astype(jnp.float32)
    return accepted / jnp.maximum(rounds, 1).astype(jnp.float32), rounds.astype(jnp.int32)


def decode_loop(target, drafter, opts: EngineOptions, state: DecodeState, force_mode=None, max_rounds=None,
                until=None):
    """The compiled decode loop: rounds until every request is done (or ``max_rounds``, traced ``i32[]``, or
    ``until(state)`` is true: a traced ``bool[]`` predicate checked before every round, e.g. the serving core's
    "a request that was running has finished").

    Adaptive engines run it as segments: the body of an outer ``while_loop`` is one inner ``while_loop`` per
    mode, in mode order, each running that mode's rounds while the policy (or ``force_mode``, traced, ``-1`` =
    the policy's) chooses it: zero rounds when it is not chosen. Every iteration of the outer loop runs at
    least one round (the mode chosen at its start). No conditional: a ``lax.switch`` copies buffers it
    carries (whole KV pools, measured), while loops alias their carry, so each segment is the fixed-shape
    loop of its mode. The plain segment (``plain_segment``) catches the drafter up once per run of up to
    ``PLAIN_EXTEND_WINDOW`` rounds, so a plain round costs what plain decoding's does plus a share of that."""
    limit = jnp.int32(2**31 - 1) if max_rounds is None else max_rounds
    if until is None:
        live = lambda c: ~jnp.all(c[0].done) & (c[1] < limit)  # noqa: E731
    else:
        live = lambda c: ~jnp.all(c[0].done) & (c[1] < limit) & ~until(c[0])  # noqa: E731
    if opts.adaptive is None:
        return jax.lax.while_loop(live, lambda c: (decode_step(target, drafter, opts, c[0]), c[1] + 1), (state, 0))[0]
    forced = jnp.int32(-1) if force_mode is None else force_mode

    def pick(st):
        return jnp.where(forced >= 0, forced, choose_mode(opts.adaptive, st.policy))

    def segment(mode: int, step):
        def body(c):
            new = step(c[0])
            ps = update_policy(opts.adaptive, c[0].policy, jnp.int32(mode), *_round_accept(c[0], new))
            return dataclasses.replace(new, policy=ps), c[1] + 1

        return lambda c: jax.lax.while_loop(lambda c: live(c) & (pick(c[0]) == mode), body, c)

    segments = [plain_segment(target, drafter, opts, PLAIN_EXTEND_WINDOW, live, pick, forced)]
    segments += [segment(m, f) for m, f in enumerate(_mode_branches(target, drafter, opts)) if m > 0]
    return jax.lax.while_loop(live, lambda c: functools.reduce(lambda c, seg: seg(c), segments, c),
                              (state, jnp.int32(0)))[0]


def decode_step(target, drafter, opts: EngineOptions, state: DecodeState) -> DecodeState:
    """One round of an engine (``Engine.run_step``, and the body of the fixed-shape ``decode_loop``):
    ``adaptive_step``, ``spec_step`` or ``plain_step`` by ``opts``."""
    if opts.adaptive is not None:
        return adaptive_step(target, drafter, opts, state)
    return spec_step(target, drafter, opts, state) if opts.specs else plain_step(target, opts, state)


def draft_spec_max_accept(specs: tuple[SpecConfig, ...]) -> tuple[float, ...]:
    """The most a round of each mode accepts: plain 1, a draft shape ``S + 1``."""
    return (1.0,) + tuple(float(s.num_steps + 1) for s in specs)
