"""Measurement pieces of ``bench/e2e.py``: prefilled states at a given context, the round's pieces timed as
separate jitted calls in a device loop, the plain forward's per-kernel CUPTI profile, and the shipped tiny
pair's accept-length histogram. No CLI (``python bench/e2e.py --help``)."""

import dataclasses
import time

from _timing import cupti_kernels

PROMPT = 8  # prompt tokens per request (prefill), before seq_lens is moved to the context


# ---------------------------------------------------------------------------------------------- loops
def _models_fn(eng):
    import jax
    from flax import nnx

    graphdef, treedef = eng.graphdef, eng.treedef

    def models(params):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, params))

    return models


def prefilled(eng, batch: int, context: int, max_new: int):
    """Prefill ``PROMPT`` tokens per request, then move ``seq_lens`` to ``context``."""
    import jax
    import numpy as np

    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, eng.vocab_size, PROMPT).astype(np.int32) for _ in range(batch)]
    state = eng.run_prefill(*eng.prepare(prompts, max_new))
    shift = context - PROMPT
    return jax.block_until_ready(dataclasses.replace(state, seq_lens=state.seq_lens + shift))


def piece_timer(fn):
    """A jitted ``(params, aux, carry, n) -> carry`` running ``fn(params, aux, carry)`` n times in a device loop
    (one compile for any n; ``carry`` donated; big inputs travel in ``aux``, never as closed-over constants)."""
    import jax

    def e2e_piece(params, aux, carry, n):
        return jax.lax.fori_loop(0, n, lambda i, c: fn(params, aux, c), carry)

    return jax.jit(e2e_piece, donate_argnums=(2,))


_TIMERS: dict = {}


def time_piece(key, fn, params, aux, carry, reps: int):
    """ms per ``fn`` call: (time of ``reps`` trips - time of 1 trip) / (reps - 1), best of 2; returns
    (ms, compile s, carry). ``key`` names the jitted timer (same key, same executable for equal shapes:
    the first call's seconds are compile + run)."""
    import jax

    if key not in _TIMERS:
        _TIMERS[key] = piece_timer(fn)
    run = _TIMERS[key]
    t0 = time.perf_counter()
    carry = jax.block_until_ready(run(params, aux, carry, 1))
    compile_s = time.perf_counter() - t0
    samples = []
    for _ in range(2):
        t0 = time.perf_counter()
        carry = jax.block_until_ready(run(params, aux, carry, 1))
        t1 = time.perf_counter()
        carry = jax.block_until_ready(run(params, aux, carry, reps))
        t2 = time.perf_counter()
        samples.append(((t2 - t1) - (t1 - t0)) / (reps - 1) * 1e3)
    return max(min(samples), 0.0), compile_s, carry


def breakdown(eng, state, reps: int) -> dict:
    """Time the round's pieces as separate jitted calls on the shapes of ``state`` (module docstring);
    ``state`` is consumed (its caches are donated)."""
    import jax
    import jax.numpy as jnp

    from jaxspec import pipeline
    from jaxspec.engine.step import append_tokens

    models, opts, spec = _models_fn(eng), eng.opts, eng.opts.specs[0]
    kw = dict(implementation=opts.implementation, interpret=opts.interpret)
    b = state.seq_lens.shape[0]
    params = eng.params
    g = opts.page_size

    def root(st):
        return pipeline.root_metadata(st.seq_lens, st.target_cache.req_to_token, page_size=g, **kw)

    def e2e_prep(params, state):
        target, drafter = models(params)
        draft, _ = drafter.propose(spec, state.draft[0], state.bonus, root(state))
        r2t = state.target_cache.req_to_token
        plan = pipeline.plan_verify(spec, state.bonus, draft, state.seq_lens, r2t, page_size=g, **kw)
        n, v, f = spec.num_draft_tokens, target.vocab_size, target.feature_size
        logits = jax.random.normal(jax.random.key(0), (b, n, v), jnp.float32)
        hidden = jax.random.normal(jax.random.key(1), (b, n, f), jnp.float32)
        out = pipeline.commit(spec, plan, state.target_cache, pipeline.VerifyGreedy(logits), hidden=hidden, **kw)
        window = (out.window_tokens, out.window_hidden, out.draft_meta, out.accept_lens)
        return dict(draft=draft, plan=plan, logits=logits, hidden=hidden, window=window)

    t0 = time.perf_counter()
    if ("prep", id(eng)) not in _TIMERS:
        _TIMERS[("prep", id(eng))] = jax.jit(e2e_prep)
    aux = jax.block_until_ready(_TIMERS[("prep", id(eng))](params, state))
    prep_s = time.perf_counter() - t0
    # the state's small fields (no caches) for the pieces that read them
    aux["state"] = dataclasses.replace(state, target_cache=dataclasses.replace(
        state.target_cache, k=jnp.zeros((0,), state.target_cache.k.dtype), v=jnp.zeros((0,), state.target_cache.v.dtype)),
        draft=())

    def draft_piece(params, aux, c):
        dstate, acc = c
        _, drafter = models(params)
        st = aux["state"]
        d, dstate = drafter.propose(spec, dstate, st.bonus, root(st))
        tokens = d if spec.topk == 1 else d.draft_tokens
        dstate = drafter.extend_after_verify(spec, dstate, *aux["window"])
        return dstate, acc + jnp.sum(tokens)

    def verify_piece(params, aux, c):
        cache, acc = c
        target, _ = models(params)
        plan = aux["plan"]
        logits, hid, cache = target.forward(plan.tokens, plan.meta, cache)
        return cache, acc + jnp.sum(jnp.argmax(logits, axis=-1)) + jnp.sum(hid[..., 0]).astype(jnp.int32)

    def book_piece(params, aux, c):
        cache, acc = c
        st = aux["state"]
        p = pipeline.plan_verify(spec, st.bonus, aux["draft"], st.seq_lens, cache.req_to_token, page_size=g, **kw)
        out = pipeline.commit(spec, p, cache, pipeline.VerifyGreedy(aux["logits"]), hidden=aux["hidden"], active=~st.done,
                              **kw)
        toks, num, _ = append_tokens(st, out.accepted, out.accept_lens)
        return out.cache, acc + jnp.sum(num) + jnp.sum(toks[:, 0]) + jnp.sum(out.window_tokens)

    def zero():  # a fresh scalar per carry (carries are donated)
        return jnp.zeros((), jnp.int32)

    res = dict(prep_compile_s=prep_s)
    ms, cs, _ = time_piece(("draft", id(eng)), draft_piece, params, aux, (state.draft[0], zero()), reps)
    res.update(draft_ms=ms, draft_compile_s=cs)
    ms, cs, (cache, _) = time_piece(("verify", id(eng)), verify_piece, params, aux, (state.target_cache, zero()), reps)
    res.update(verify_ms=ms, verify_compile_s=cs)
    ms, cs, _ = time_piece(("book", id(eng)), book_piece, params, aux, (cache, zero()), reps)
    res.update(bookkeeping_ms=ms, bookkeeping_compile_s=cs)
    return res


def plain_forward_ms(eng, state, reps: int) -> tuple[float, float]:
    """ms of one plain decode forward (Q = 1) as a separate jitted call; returns (ms, compile s)."""
    import jax.numpy as jnp

    from jaxspec import pipeline

    models, opts = _models_fn(eng), eng.opts
    kw = dict(implementation=opts.implementation, interpret=opts.interpret)

    def fwd(params, aux, c):
        cache, acc = c
        target, _ = models(params)
        meta = pipeline.decode_metadata(aux["seq_lens"], cache.req_to_token, page_size=opts.page_size, **kw)
        logits, _, cache = target.forward(aux["bonus"][:, None], meta, cache)
        return cache, acc + jnp.sum(jnp.argmax(logits, axis=-1))

    aux = dict(seq_lens=state.seq_lens, bonus=state.bonus)
    ms, cs, _ = time_piece(("fwd", id(eng)), fwd, eng.params, aux, (state.target_cache, jnp.int32(0)), reps)
    return ms, cs


# ---------------------------------------------------------------------------------------------- profile
def kernel_groups(per_kernel: dict) -> dict:
    """Sum the per-kernel us into coarse groups by name."""
    groups: dict = {}
    for name, us in per_kernel.items():
        n = name.lower()
        g = ("attention" if ("attention" in n or "mosaic" in n or "prefix" in n) else
             "gemm/gemv" if any(t in n for t in ("gemm", "gemv", "cublas", "cutlass", "dot", "matmul", "xmma", "sm90")) else
             "scatter" if "scatter" in n else "copy" if "copy" in n else "reduce" if "reduce" in n else
             "fusion" if ("fusion" in n or "loop_" in n or "input_" in n) else "other")
        groups[g] = groups.get(g, 0.0) + us
    return groups


def profile_plain(eng, state, reps: int) -> dict:
    """Per-kernel device time of the plain decode forward (Q = 1), CUPTI, ``reps`` forwards."""
    import jax
    import jax.numpy as jnp

    run = _TIMERS[("fwd", id(eng))]
    carry = [(state.target_cache, jnp.int32(0))]
    aux = dict(seq_lens=state.seq_lens, bonus=state.bonus)

    def call():
        carry[0] = run(eng.params, aux, carry[0], reps)

    call()
    jax.block_until_ready(carry[0])
    per = cupti_kernels(call, lambda: jax.block_until_ready(carry[0]), reps, calls=1)
    if per is None:
        return {}
    top = sorted(per.items(), key=lambda kv: -kv[1])
    return dict(total_us=sum(per.values()), kernels=len(per), groups=kernel_groups(per),
                top=[(k[:90], round(v, 2)) for k, v in top[:30]])


def profile_loop(eng, state, rounds: int) -> dict:
    """Per-kernel device time of one whole ``Engine.run_decode`` from ``state`` (CUPTI), per round: what the
    round's kernels add up to next to its wall time (the rest is launch gaps and the loop's host round trips)."""
    import jax

    out = []

    def call():
        out.append(eng.run_decode(state))

    per = cupti_kernels(call, lambda: jax.block_until_ready(out[-1] if out else None), max(1, rounds), calls=1)
    if per is None:
        return {}
    top = sorted(per.items(), key=lambda kv: -kv[1])
    # one middle round's kernels in order (name, us): where each layer's and the bookkeeping's time goes
    seq = cupti_kernels.last_timings
    n = len(seq) // max(1, rounds)
    mid = seq[(rounds // 2) * n:(rounds // 2 + 1) * n]  # approximate if the loop adds a few kernels
    return dict(total_us=sum(per.values()), kernels_per_round=cupti_kernels.last_count, groups=kernel_groups(per),
                top=[(k[:90], round(v, 2)) for k, v in top[:24]], round_kernels=[(k[:60], round(v, 2)) for k, v in mid])


# ---------------------------------------------------------------------------------------------- real pair
def pair_accept_histogram(spec, prompts: int = 8, max_new: int = 64) -> dict:
    """Accept-length histogram of the shipped tiny pair (greedy, ``Engine.run_step`` round by round; a head
    with ``num_draft_steps = max(3, S)``: steps past its 3 trained layers reuse layer 3's weights). Each of
    the ``prompts`` corpus prompts runs as its own batch-1 request: one small executable (the tree step's CPU
    compile grew from about 1 min at batch 1 to over 20 min at batch 8 on a 2-core CPU), and a
    request's greedy accept lengths do not depend on its batch."""
    import jax.numpy as jnp
    import numpy as np

    from jaxspec.corpus import make_prompts
    from jaxspec.engine import Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MockVocab, MTPDrafter, load_model

    model = load_model(DEFAULT_WEIGHTS, mtp=True, kv_dtype=jnp.float32, num_draft_steps=max(3, spec.num_steps))
    vocab = MockVocab(vocab_size=model.vocab_size)
    texts = [vocab.encode(t) for t in make_prompts(prompts)]
    width = max(len(p) for p in texts) + max_new + spec.num_draft_tokens
    eng = Engine(model, MTPDrafter(model), spec=spec, max_context=-(-width // 16) * 16, page_size=16, max_batch=1)
    hist = np.zeros(spec.num_steps + 2, np.int64)
    for p in texts:
        state = eng.run_prefill(*eng.prepare([p], max_new))
        while not bool(np.asarray(state.done).all()):
            before = np.asarray(state.num_accepted)
            state = eng.run_step(state)
            hist[int((np.asarray(state.num_accepted) - before)[0])] += 1
    probs = hist[1:] / max(1, hist.sum())
    return dict(histogram=hist[1:].tolist(), probs=probs.tolist(),
                mean=float((np.arange(1, spec.num_steps + 2) * probs).sum()))
