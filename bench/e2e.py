"""End-to-end decoding speed at real model scale (issue 15): plain vs MTP chain vs MTP tree in the compiled
device loop, on Llama-3.1-8B- and Llama-3.2-1B-shaped targets with random bf16 weights and a one-layer MTP
head (``MTPModel(num_mtp_layers=1, num_draft_steps=5)``: every draft step runs the one MTP layer, each with
its own KV layer).

``python bench/e2e.py [--models 8b,1b] [--batches 1,8,32,128] [--contexts 1024,4096] [--json PATH] [--png PATH]``;
``--quick``: a subset that fits one 10-minute device call; ``--tiny``: CPU-sized models (the test path).

Method, per (model, config, batch, context) row:
* Context without a long prefill: prefill an 8-token prompt per request, then move ``seq_lens`` to the
  context length (the KV content behind it is whatever the pool holds: fine for timing random weights).
  One ``max_context`` (the largest context + a margin) for every context, so one executable per
  (model, config, batch) serves both contexts (the attention kernel reads ``seq_lens`` pages, not ``W``).
* Decode: the jitted ``while_loop`` over ``plain_step`` / ``spec_step`` from the prefilled state
  (``Engine.run_decode`` when the engine has it, else the same loop built here), ``--max-new`` tokens per
  request; tokens/s = generated tokens / wall time of the loop (median of ``--repeats``); compile seconds =
  ``lower().compile()`` of that loop.
* Acceptance: random weights accept (almost) nothing, so speculative tokens/s is reported at SIMULATED
  accept lengths: mean 2.0, 3.0 and the real pair's distribution (the shipped tiny pair's accept-length
  histogram per config, measured in the same run with ``Engine.run_step``). The loop runs with the engine's
  ``simulate_accept=SimulatedAccept(mean=...)`` / ``(probs=...)`` (``sim`` column "engine ..."; the
  ``accept`` column is the accept length the loop measured, which for the tree can fall below the setting:
  the simulated path follows the draft tree's first-child chain). On an engine without that option the
  speculative row's tokens/s is PROJECTED as ``B x mean accept / measured time per round`` (``sim``
  "projected ..."; a round's cost hardly depends on what it accepts: the tree's KV move of the accepted
  rows and the drafter's extend window are fixed-shape). Every row touched by simulation says so.
* Breakdown (``--breakdown`` batches): the round's pieces timed as SEPARATE jitted calls on the same shapes,
  each in a device loop (1-trip loop subtracted): draft = ``propose`` + ``extend_after_verify``; verify =
  the target forward over the N verify tokens; bookkeeping = ``plan_verify`` + ``commit`` + ``append_tokens``.
  Their sum differs from the measured round by fusion across pieces and loop overhead.
* Roofline: bytes read per round (target weights read by a forward, i.e. all but the embedding table unless
  tied; per draft forward the MTP layer + final norm + LM head; KV of the context: all target layers, one
  draft layer per draft forward) over the device-to-device copy bandwidth (read + write counted) measured in
  the same run. ``x roof`` = measured time per round / that floor.
* Speculation efficiency = (spec tok/s / plain tok/s) / mean accept length (1.0: a round costs a plain step).
"""

import dataclasses
import json
import os
import statistics
import sys
import time

import _cli

BATCHES = "1,8,32,128"
CONTEXTS = "1024,4096"
PROMPT = 8  # prompt tokens per request (prefill), before seq_lens is moved to the context
SIM_MEANS = (2.0, 3.0)


def _parse(argv):
    ap = _cli.parser("e2e.py", __doc__)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform to run on")
    ap.add_argument("--models", default="8b,1b", help="comma list of 8b, 1b, tiny")
    ap.add_argument("--configs", default="plain,chain,tree", help="comma list: plain, chain (S3 K1 N4), tree (S5 K4 N8)")
    ap.add_argument("--batches", default=BATCHES, help="comma list of batch sizes")
    ap.add_argument("--contexts", default=CONTEXTS, help="comma list of context lengths (tokens already in the KV)")
    ap.add_argument("--max-new", type=int, default=32, help="tokens generated per request in a timed loop")
    ap.add_argument("--repeats", type=int, default=2, help="timed decode loops per row (median)")
    ap.add_argument("--breakdown", default="1,32", help="batch sizes whose rounds are split into pieces ('' = none)")
    ap.add_argument("--reps", type=int, default=8, help="device-loop trips per timed piece of the breakdown")
    ap.add_argument("--page-size", type=int, default=16, help="KV page size")
    ap.add_argument("--quick", action="store_true",
                    help="one-device-call subset (about 9 min on the H200): 8b at batches 1,32,128 x contexts 1024,4096 "
                         "and 1b at batch 32 x 1024 (no breakdown), --max-new 16, --repeats 1")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized models and grid (tests; < 1 min on CPU)")
    ap.add_argument("--probe", action="store_true", help="plain 8b decode only, with a per-kernel CUPTI profile")
    ap.add_argument("--ab-linear", action="store_true",
                    help="also time the plain forward of the breakdown batches with the previous Linear (einsum at "
                         "precision HIGHEST, no single-row padding) for an A/B of decoder._dot16")
    ap.add_argument("--json", default=None, help="write rows + environment as JSON here")
    ap.add_argument("--png", default=None, help="write a tokens/s plot here")
    return ap.parse_args(argv)


# ---------------------------------------------------------------------------------------------- models
def model_configs():
    from jaxspec.models import DecoderConfig

    llama = dict(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
                 rope_theta=500000.0, num_nextn_predict_layers=1)
    return {
        "8b": DecoderConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128, **llama),
        "1b": DecoderConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                            tie_word_embeddings=True, **llama),
        "tiny": DecoderConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=500000.0,
                              num_nextn_predict_layers=1),
    }


def make_model(cfg, steps: int, dtype, kv_dtype):
    from flax import nnx

    from jaxspec.models import MTPModel

    return MTPModel(cfg, rngs=nnx.Rngs(0), param_dtype=dtype, kv_dtype=kv_dtype, num_mtp_layers=1,
                    num_draft_steps=steps)


def weight_bytes(model) -> dict:
    """Bytes one target forward / one draft forward reads from weights."""
    from flax import nnx

    def size(tree):
        return sum(x.size * x.dtype.itemsize for x in __import__("jax").tree.leaves(nnx.state(tree, nnx.Param)))

    head = size(model.norm) + (size(model.lm_head) if model.lm_head is not None else size(model.embed_tokens))
    layers = size(model.layers)
    return dict(target=layers + head, draft=size(model.mtp_layers[0]) + head, total=size(model))


# ---------------------------------------------------------------------------------------------- loops
def _models_fn(eng):
    import jax
    from flax import nnx

    graphdef, treedef = eng.graphdef, eng._treedef

    def models(params):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, params))

    return models


def decode_loop(eng):
    """``state -> state``: the jitted decode ``while_loop`` from a prefilled state (state donated)."""
    import jax
    import jax.numpy as jnp

    from jaxspec.engine import plain_step, spec_step

    models, opts = _models_fn(eng), eng.opts

    def e2e_decode_loop(params, state):
        target, drafter = models(params)

        def body(st):
            return plain_step(target, opts, st) if drafter is None else spec_step(target, drafter, opts, st)

        return jax.lax.while_loop(lambda st: ~jnp.all(st.done), body, state)

    return jax.jit(e2e_decode_loop, donate_argnums=(1,))


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

    from jaxspec import round as rnd
    from jaxspec.engine.step import append_tokens

    models, opts, spec = _models_fn(eng), eng.opts, eng.opts.spec
    kw = dict(implementation=opts.implementation, interpret=opts.interpret)
    b = state.seq_lens.shape[0]
    params = eng.params
    g = opts.page_size

    def root(st):
        return rnd.root_metadata(st.seq_lens, st.target_cache.req_to_token, page_size=g, **kw)

    def e2e_prep(params, state):
        target, drafter = models(params)
        draft, _ = drafter.propose(spec, state.draft, state.bonus, root(state))
        r2t = state.target_cache.req_to_token
        plan = rnd.plan_verify(spec, state.bonus, draft, state.seq_lens, r2t, page_size=g, **kw)
        n, v, f = spec.num_draft_tokens, target.vocab_size, target.feature_size
        logits = jax.random.normal(jax.random.key(0), (b, n, v), jnp.float32)
        hidden = jax.random.normal(jax.random.key(1), (b, n, f), jnp.float32)
        out = rnd.commit(spec, plan, state.target_cache, logits=logits, hidden=hidden, **kw)
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
        draft=None)

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
        p = rnd.plan_verify(spec, st.bonus, aux["draft"], st.seq_lens, cache.req_to_token, page_size=g, **kw)
        out = rnd.commit(spec, p, cache, logits=aux["logits"], hidden=aux["hidden"], active=~st.done, **kw)
        toks, num, _ = append_tokens(st, out.accepted, out.accept_lens)
        return out.cache, acc + jnp.sum(num) + jnp.sum(toks[:, 0]) + jnp.sum(out.window_tokens)

    def zero():  # a fresh scalar per carry (carries are donated)
        return jnp.zeros((), jnp.int32)

    res = dict(prep_compile_s=prep_s)
    ms, cs, _ = time_piece(("draft", id(eng)), draft_piece, params, aux, (state.draft, zero()), reps)
    res.update(draft_ms=ms, draft_compile_s=cs)
    ms, cs, (cache, _) = time_piece(("verify", id(eng)), verify_piece, params, aux, (state.target_cache, zero()), reps)
    res.update(verify_ms=ms, verify_compile_s=cs)
    ms, cs, _ = time_piece(("book", id(eng)), book_piece, params, aux, (cache, zero()), reps)
    res.update(bookkeeping_ms=ms, bookkeeping_compile_s=cs)
    return res


def plain_forward_ms(eng, state, reps: int) -> tuple[float, float]:
    """ms of one plain decode forward (Q = 1) as a separate jitted call; returns (ms, compile s)."""
    import jax.numpy as jnp

    from jaxspec import round as rnd

    models, opts = _models_fn(eng), eng.opts
    kw = dict(implementation=opts.implementation, interpret=opts.interpret)

    def fwd(params, aux, c):
        cache, acc = c
        target, _ = models(params)
        meta = rnd.decode_metadata(aux["seq_lens"], cache.req_to_token, page_size=opts.page_size, **kw)
        logits, _, cache = target.forward(aux["bonus"][:, None], meta, cache)
        return cache, acc + jnp.sum(jnp.argmax(logits, axis=-1))

    aux = dict(seq_lens=state.seq_lens, bonus=state.bonus)
    ms, cs, _ = time_piece(("fwd", id(eng)), fwd, eng.params, aux, (state.target_cache, jnp.int32(0)), reps)
    return ms, cs


def ab_old_linear(eng, batch, context, args) -> float:
    """ms of the plain forward with ``Linear`` as before ``decoder._dot16`` (einsum, precision HIGHEST)."""
    import jax.numpy as jnp

    from jaxspec.models import decoder

    def old(self, x):
        w = self.kernel[...]
        y = jnp.einsum("...d,df->...f", x.astype(w.dtype), w, precision=decoder.PREC,
                       preferred_element_type=jnp.float32)
        return y if self.bias is None else y + decoder._bcast(self.bias[...].astype(jnp.float32), y.ndim)

    new = decoder.Linear.__call__
    decoder.Linear.__call__ = old
    try:
        _TIMERS.pop(("fwd", id(eng)), None)
        ms, _ = plain_forward_ms(eng, prefilled(eng, batch, context, args.max_new), args.reps)
    finally:
        decoder.Linear.__call__ = new
        _TIMERS.pop(("fwd", id(eng)), None)
    return ms


# ---------------------------------------------------------------------------------------------- profile
def cupti_kernels(call, sync, iterations: int) -> dict | None:
    """Kernel name -> us per call (CUPTI through jax's Mosaic GPU extension), or None when unavailable."""
    try:
        from jax._src.lib import mosaic_gpu as mgpu  # noqa: PLC0415 - GPU-only, optional
        ext = mgpu._mosaic_gpu_ext
        sync()
        ext._cupti_init()
        try:
            call()
            sync()
        finally:
            timings = ext._cupti_get_timings(True)
    except Exception as e:  # noqa: BLE001
        print(f"  (CUPTI unavailable: {e})", file=sys.stderr)
        return None
    out: dict = {}
    for name, t in timings or []:
        out[name] = out.get(name, 0.0) + t * 1e3 / iterations
    return out


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
    per = cupti_kernels(call, lambda: jax.block_until_ready(carry[0]), reps)
    if per is None:
        return {}
    top = sorted(per.items(), key=lambda kv: -kv[1])
    return dict(total_us=sum(per.values()), kernels=len(per), groups=kernel_groups(per),
                top=[(k[:90], round(v, 2)) for k, v in top[:30]])


# ---------------------------------------------------------------------------------------------- real pair
def pair_accept_histogram(spec, batch: int = 8, max_new: int = 64) -> dict:
    """Accept-length histogram of the shipped tiny pair (greedy, ``Engine.run_step`` round by round; a head
    with ``num_draft_steps = max(3, S)``: steps past its 3 trained layers reuse layer 3's weights)."""
    import numpy as np

    from jaxspec.corpus import make_prompts
    from jaxspec.engine import Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MockVocab, MTPDrafter, load_model

    import jax.numpy as jnp

    model = load_model(DEFAULT_WEIGHTS, mtp=True, kv_dtype=jnp.float32, num_draft_steps=max(3, spec.num_steps))
    vocab = MockVocab(vocab_size=model.vocab_size)
    prompts = [vocab.encode(t) for t in make_prompts(batch)]
    width = max(len(p) for p in prompts) + max_new + spec.num_draft_tokens
    eng = Engine(model, MTPDrafter(model), spec=spec, max_context=-(-width // 16) * 16, page_size=16, max_batch=batch)
    state = eng.run_prefill(*eng.prepare(prompts, max_new))
    hist = np.zeros(spec.num_steps + 2, np.int64)
    while not bool(np.asarray(state.done).all()):
        before, active = np.asarray(state.num_accepted), ~np.asarray(state.done)
        state = eng.run_step(state)
        np.add.at(hist, (np.asarray(state.num_accepted) - before)[active], 1)
    probs = hist[1:] / max(1, hist.sum())
    return dict(histogram=hist[1:].tolist(), probs=probs.tolist(),
                mean=float((np.arange(1, spec.num_steps + 2) * probs).sum()))


# ---------------------------------------------------------------------------------------------- grid
def _specs():
    from jaxspec.config import SpecConfig

    return {"plain": None, "chain": SpecConfig(3, 1, 4), "tree": SpecConfig(5, 4, 8)}


def _engine_sim():
    """``(SimulatedAccept, True)`` when the engine has the ``simulate_accept`` option, else ``(None, False)``."""
    import inspect

    from jaxspec import engine

    if "simulate_accept" in inspect.signature(engine.Engine.__init__).parameters and hasattr(engine, "SimulatedAccept"):
        return engine.SimulatedAccept, True
    return None, False


def _sims(spec, pair: dict | None):
    """[(label, mean, probs or None)] of the simulated acceptance settings for ``spec``."""
    out = [(f"sim mean {m:.1f}", m, None) for m in SIM_MEANS if m <= spec.num_steps + 1]
    if pair is not None:
        out.append((f"sim pair {pair['mean']:.2f}", pair["mean"], tuple(pair["probs"])))
    return out


def run_loop(eng, loop, batch, context, max_new, repeats):
    """Time the decode loop from prefilled states; returns dict(ms_round, tok_s, rounds, tokens, accept, compile_s)."""
    import jax
    import numpy as np

    def once():
        state = prefilled(eng, batch, context, max_new)
        g0, r0, a0 = (np.asarray(x) for x in (state.num_generated, state.num_rounds, state.num_accepted))
        t0 = time.perf_counter()
        state = jax.block_until_ready(loop(eng.params, state) if loop is not None else eng.run_decode(state))
        dt = time.perf_counter() - t0
        g, r, a = (np.asarray(x) for x in (state.num_generated, state.num_rounds, state.num_accepted))
        del state
        return dt, int((g - g0).sum()), int((r - r0).max()), float((a - a0).sum()) / max(1, int((r - r0).sum()))

    first = once()
    runs = [once() for _ in range(repeats)]
    dt = statistics.median(r[0] for r in runs)
    _, tokens, rounds, accept = runs[0]
    return dict(ms_round=dt * 1e3 / max(1, rounds), tok_s=tokens / dt, rounds=rounds, tokens=tokens, accept=accept,
                compile_s=max(0.0, first[0] - dt))


def roofline_ms(wb: dict, model, spec, batch: int, context: int, gbps: float) -> float:
    """Bytes one round reads (module docstring) over the copy bandwidth, in ms."""
    c = model.cfg
    kv_layer = 2 * c.num_key_value_heads * c.head_dim * model.kv_dtype.itemsize
    nbytes = wb["target"] + batch * context * kv_layer * c.num_hidden_layers
    if spec is not None:
        n_draft = spec.num_steps if spec.topk == 1 else 2 * spec.num_steps - 1
        nbytes += n_draft * (wb["draft"] + batch * context * kv_layer)
    return nbytes / (gbps * 1e9) * 1e3


def bench_model(name, cfg, args, gbps, pairs, rows, dtype, kv_dtype):
    import gc

    import jax

    from jaxspec.engine import Engine
    from jaxspec.models import MTPDrafter

    specs = _specs()
    sim_cls, engine_sim = _engine_sim()
    steps = max(s.num_steps for s in specs.values() if s is not None)
    t0 = time.perf_counter()
    model = make_model(cfg, steps, dtype, kv_dtype)
    jax.block_until_ready(jax.tree.leaves(__import__("flax").nnx.state(model)))
    wb = weight_bytes(model)
    print(f"\n[{name}] weights {wb['total'] / 2**30:.2f} GiB (target forward reads {wb['target'] / 2**30:.2f}, "
          f"draft forward {wb['draft'] / 2**30:.2f}); init {time.perf_counter() - t0:.1f} s", flush=True)
    contexts = [int(x) for x in args.contexts.split(",")]
    width = -(-(max(contexts) + args.max_new + 32) // args.page_size) * args.page_size
    brk = {int(x) for x in args.breakdown.split(",") if x}
    plain_ms = {}
    for batch in [int(x) for x in args.batches.split(",")]:
        for cname in args.configs.split(","):
            spec = specs[cname]
            drafter = None if spec is None else MTPDrafter(model)
            settings = [("-", 1.0, None)] if spec is None else _sims(spec, pairs.get(cname))
            kw = dict(spec=spec, max_context=width, page_size=args.page_size, max_batch=batch)
            eng = Engine(model, drafter, **kw)
            use_engine = hasattr(eng, "run_decode")
            loop = None if use_engine else decode_loop(eng)
            for context in contexts:
                t0 = time.perf_counter()
                if spec is None or not engine_sim:
                    m = run_loop(eng, loop, batch, context, args.max_new, args.repeats)
                    measured = {lab: m for lab, _, _ in settings}
                else:  # the engine simulates acceptance: one loop per setting (values in the state)
                    measured = {}
                    for lab, mean, probs in settings:
                        sim = sim_cls(probs=probs) if probs is not None else sim_cls(mean=mean)
                        e2 = Engine(model, drafter, simulate_accept=sim, **kw)
                        measured[lab] = run_loop(e2, None if hasattr(e2, "run_decode") else decode_loop(e2),
                                                 batch, context, args.max_new, args.repeats)
                if engine_sim:  # one executable serves every setting: the first run of the row compiled it
                    first_compile = max(m["compile_s"] for m in measured.values())
                    for m in measured.values():
                        m["compile_s"] = first_compile
                parts = {}
                if batch in brk:
                    st = prefilled(eng, batch, context, args.max_new)
                    if spec is None:
                        ms, cs = plain_forward_ms(eng, st, args.reps)
                        parts = dict(verify_ms=ms, verify_compile_s=cs)
                        if args.probe:
                            st = prefilled(eng, batch, context, args.max_new)
                            parts["profile"] = profile_plain(eng, st, args.reps)
                        if args.ab_linear:
                            st = None
                            parts["verify_ms_old_linear"] = ab_old_linear(eng, batch, context, args)
                    else:
                        parts = breakdown(eng, st, args.reps)
                    del st
                roof = roofline_ms(wb, model, spec, batch, context, gbps)
                for lab, mean, _ in settings:
                    m = measured[lab]
                    if spec is None:
                        tok_s, acc, sim = m["tok_s"], 1.0, "-"
                        plain_ms[(batch, context)] = m["ms_round"]
                    elif engine_sim:
                        tok_s, acc, sim = m["tok_s"], m["accept"], f"engine {lab}"
                    else:
                        tok_s, acc, sim = batch * mean / (m["ms_round"] * 1e-3), mean, f"projected {lab}"
                    pms = plain_ms.get((batch, context))
                    base = None if pms is None else batch / (pms * 1e-3)
                    row = dict(model=name, config=cname, batch=batch, context=context, sim=sim, accept=acc,
                               tok_s=tok_s, ms_round=m["ms_round"], measured_accept=m["accept"],
                               roofline_ms=roof, x_roof=m["ms_round"] / roof, compile_s=m["compile_s"],
                               speedup=None if base is None else tok_s / base,
                               efficiency=None if base is None else tok_s / base / acc,
                               decode_loop="Engine.run_decode" if use_engine else "bench while_loop", **parts)
                    rows.append(row)
                    _print_row(row)
                    if args.json:  # after every row: a run cut short still leaves its rows
                        _write_json(args, rows, gbps, pairs)
                print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)
            del eng, loop
            gc.collect()
    del model
    gc.collect()


HEADER = (f"{'model':<5} {'config':<6} {'batch':>5} {'ctx':>5} {'accept (sim)':<26} {'tok/s':>10} {'x plain':>7} "
          f"{'eff':>5} {'ms/round':>8} {'roof ms':>7} {'x roof':>6} {'draft':>6} {'verify':>6} {'book':>6} {'compile s':>9}")


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _print_row(r):
    acc = f"{r['accept']:.2f} ({r['sim']})" if r["config"] != "plain" else "1.00"
    print(f"{r['model']:<5} {r['config']:<6} {r['batch']:>5} {r['context']:>5} {acc:<26} {r['tok_s']:>10,.0f} "
          f"{_f(r['speedup'], '.2f'):>7} {_f(r['efficiency'], '.2f'):>5} {r['ms_round']:>8.3f} {r['roofline_ms']:>7.3f} "
          f"{r['x_roof']:>6.2f} {_f(r.get('draft_ms'), '.3f'):>6} {_f(r.get('verify_ms'), '.3f'):>6} "
          f"{_f(r.get('bookkeeping_ms'), '.3f'):>6} {r['compile_s']:>9.1f}", flush=True)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: no plot)")
        return
    keys = sorted({(r["model"], r["context"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (m, c) in zip(axes[0], keys):
        sel = [r for r in rows if r["model"] == m and r["context"] == c]
        lines = sorted({(r["config"], r["sim"]) for r in sel})
        for cfg, sim in lines:
            pts = sorted((r["batch"], r["tok_s"]) for r in sel if (r["config"], r["sim"]) == (cfg, sim))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{cfg} {sim}".replace(" -", ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{m}, context {c}")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None) -> int:
    args = _parse(argv)
    if args.tiny:
        args.device, args.models, args.batches, args.contexts = "cpu", "tiny", "1", "64"
        args.max_new, args.repeats, args.reps, args.breakdown = 8, 1, 2, "1"
    os.environ["JAX_PLATFORMS"] = "cpu" if args.device == "cpu" else "cuda"
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.dirname(__file__))
    from _timing import copy_ceiling_gbps

    configs = model_configs()
    dtype = jnp.bfloat16
    kv_dtype = jnp.float32 if args.device == "cpu" else jnp.bfloat16
    dev = str(jax.devices()[0])
    gbps, _ = copy_ceiling_gbps(2**30 if args.device == "gpu" else 2**24)
    print(f"device {dev}; copy bandwidth {gbps:.0f} GB/s (read + write); engine simulate_accept: "
          f"{_engine_sim()[1]}; decode loop: {'Engine.run_decode' if hasattr(__import__('jaxspec.engine', fromlist=['Engine']).Engine, 'run_decode') else 'bench while_loop'}",
          flush=True)
    pairs = {}
    if not args.probe:
        for cname, spec in _specs().items():
            if spec is not None and cname in args.configs.split(","):
                t0 = time.perf_counter()
                pairs[cname] = pair_accept_histogram(spec, batch=1 if args.tiny else 8, max_new=8 if args.tiny else 64)
                print(f"tiny pair {cname} {spec}: real accept lengths 1..{spec.num_steps + 1}: "
                      f"{pairs[cname]['histogram']}, mean {pairs[cname]['mean']:.3f} ({time.perf_counter() - t0:.1f} s)",
                      flush=True)
    rows = []
    print(HEADER)
    plan = [(m, None) for m in args.models.split(",")]
    if args.quick and not args.tiny:
        args.max_new, args.repeats = 16, 1
        plan = [("8b", dict(batches="1,32,128")), ("1b", dict(batches="32", contexts="1024", breakdown=""))]
    for name, over in plan:
        a = argparse_copy(args, over)
        bench_model(name, configs[name], a, gbps, pairs, rows, dtype, kv_dtype)
    print("\n" + HEADER)
    for r in rows:
        _print_row(r)
    for r in rows:
        if "verify_ms_old_linear" in r:
            print(f"A/B plain forward {r['model']} batch {r['batch']} ctx {r['context']}: {r['verify_ms']:.3f} ms "
                  f"(Linear via decoder._dot16) vs {r['verify_ms_old_linear']:.3f} ms (previous einsum, HIGHEST)")
    for r in rows:
        if "profile" in r and r["profile"]:
            p = r["profile"]
            print(f"\nCUPTI plain forward {r['model']} batch {r['batch']} ctx {r['context']}: {p['total_us']:.0f} us in "
                  f"{p['kernels']} kernel names; groups " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(p["groups"].items())))
            for k, v in p["top"]:
                print(f"   {v:9.1f} us  {k}")
    if args.json:
        _write_json(args, rows, gbps, pairs)
        print(f"wrote {args.json}")
    if args.png:
        plot(rows, args.png)
    return 0


def _write_json(args, rows, gbps, pairs):
    import jax

    with open(args.json, "w") as f:
        json.dump(dict(device=str(jax.devices()[0]), copy_gbps=gbps, pairs=pairs,
                       engine_simulate_accept=_engine_sim()[1], max_new=args.max_new, page_size=args.page_size,
                       argv=sys.argv[1:], rows=rows), f, indent=1, default=str)


def argparse_copy(args, over):
    import argparse

    d = dict(vars(args))
    d.update(over or {})
    return argparse.Namespace(**d)


if __name__ == "__main__":
    sys.exit(main())
