"""End-to-end decoding speed at real model scale: plain vs MTP chain vs MTP tree in the compiled
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
* Decode: ``Engine.run_decode`` (the jitted ``while_loop`` over ``plain_step`` / ``spec_step`` from the
  prefilled state), ``--max-new`` tokens per request; tokens/s = generated tokens / wall time of the loop
  (median of ``--repeats``); compile seconds = first loop's time - the median.
* Acceptance: random weights accept (almost) nothing, so speculative rows run with the engine's SIMULATED
  acceptance, ``Engine(simulate_accept=SimulatedAccept(mean=...))`` / ``(probs=...)``: mean 2.0, 3.0 and the
  real pair's distribution (the shipped tiny pair's accept-length histogram per config, measured in the same
  run with ``Engine.run_step``). Every such row says so in its ``sim`` column; its ``accept`` column is the
  accept length the loop measured (integer means are exact; a histogram's mean is met up to the random
  draws of a short run). One executable per (config, batch) serves every
  setting (the distribution is a value of the state).
* Breakdown (``--breakdown`` batches): the round's pieces timed as SEPARATE jitted calls on the same shapes,
  each in a device loop (1-trip loop subtracted): draft = ``propose`` + ``extend_after_verify``; verify =
  the target forward over the N verify tokens; bookkeeping = ``plan_verify`` + ``commit`` + ``append_tokens``.
  Their sum differs from the measured round by fusion across pieces and loop overhead.
* Roofline: bytes read per round (target weights read by a forward, i.e. all but the embedding table unless
  tied; per draft forward the MTP layer + final norm + LM head; KV of the context: all target layers, one
  draft layer per draft forward) over the device-to-device copy bandwidth (read + write counted) measured in
  the same run. ``x roof`` = measured time per round / that floor.
* Speculation efficiency = (spec tok/s / plain tok/s) / mean accept length (1.0: a round costs a plain step).
* Adaptive rows: round costs calibrated at the row's batch and context, then the loops are timed twice: as a
  serving engine runs them (the row: each loop's policy warm-started from the previous one's,
  ``Engine.policy_memory``; the untimed compile loop explores) and cold (``tok_s_cold``: every loop starts
  from the optimistic prior and pays for its exploration).
"""

import json
import os
import statistics
import sys
import time

import _cli
from _e2e_parts import (breakdown, pair_accept_histogram, plain_forward_ms, prefilled, profile_loop,
                        profile_plain)

BATCHES = "1,8,32,128"
CONTEXTS = "1024,4096"
SIM_MEANS = (2.0, 3.0)


def _parse(argv):
    ap = _cli.parser("e2e.py", __doc__)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform to run on")
    ap.add_argument("--models", default="8b,1b", help="comma list of 8b, 1b, smollm2 (135M), tiny")
    ap.add_argument("--configs", default="plain,chain,tree,adaptive",
                    help="comma list: plain, chain (S3 K1 N4), tree (S5 K4 N8), tree16 (S5 K4 N16), adaptive (plain / chain / tree chosen "
                         "per round, Engine(adaptive=True), costs calibrated at the row's batch and context)")
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
    ap.add_argument("--draft-vocab", default="0",
                    help="comma list of draft vocabulary sizes for the speculative rows (0 = the full vocabulary; N = "
                         "the draft head scores N tokens, with_draft_vocab, as EAGLE-3's 32000 for Llama 3)")
    ap.add_argument("--no-pairs", action="store_true", help="skip the tiny pair's accept histograms (no 'sim pair' rows)")
    ap.add_argument("--profile", action="store_true",
                    help="per-kernel CUPTI profile of a whole decode loop (plain, and sim mean 3.0) at --breakdown batches")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="every engine with Engine(batch_invariant=True) (on XLA:CPU: XLA_FLAGS="
                         "--xla_cpu_experimental_ynn_fusion_type=), e.g. with --profile for the mode's kernels")
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
        # SmolLM2-135M-Instruct's shape (the real model of bench/real_model.py): small and launch-bound
        "smollm2": DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                                 rope_theta=100000.0, tie_word_embeddings=True, num_nextn_predict_layers=1),
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
    """Bytes one target forward / one draft forward reads from weights (the draft head: the reduced one of a
    ``with_draft_vocab`` model)."""
    from flax import nnx

    def size(tree, what=nnx.Param):
        return sum(x.size * x.dtype.itemsize for x in __import__("jax").tree.leaves(nnx.state(tree, what)))

    emb = model.embed_tokens[...]  # a tied head (Llama-3.2-1B) reads the embedding table
    head = size(model.norm) + (size(model.lm_head) if model.lm_head is not None else emb.size * emb.dtype.itemsize)
    dk = None if model.draft_head is None else model.draft_head.kernel[...]
    dhead = head if dk is None else size(model.norm) + dk.size * dk.dtype.itemsize
    layers = size(model.layers)
    return dict(target=layers + head, draft=size(model.mtp_layers[0]) + dhead, total=size(model))


def draft_vocab_models(model, sizes: list[int]) -> dict:
    """``{size: model}``: the model itself for 0 (or >= V), else ``with_draft_vocab(model, arange(size))`` (with
    random weights and simulated acceptance, which tokens are in the set does not matter)."""
    import numpy as np

    from jaxspec.models import with_draft_vocab

    return {n: model if n == 0 or n >= model.vocab_size else with_draft_vocab(model, np.arange(n)) for n in sizes}


def _label(cname: str, dv: int) -> str:
    return cname if dv == 0 else f"{cname}/{dv // 1000}k" if dv % 1000 == 0 else f"{cname}/{dv}"


# ---------------------------------------------------------------------------------------------- grid
def _specs():
    from jaxspec.config import SpecConfig

    return {"plain": None, "chain": SpecConfig(3, 1, 4), "tree": SpecConfig(5, 4, 8), "tree16": SpecConfig(5, 4, 16)}


ADAPTIVE_SPECS = ("chain", "tree")  # the draft shapes an "adaptive" row chooses from, besides plain decoding


def _sims(spec, pair: dict | None):
    """[(label, mean, probs or None)] of the simulated acceptance settings for ``spec``."""
    out = [(f"sim mean {m:.1f}", m, None) for m in SIM_MEANS if m <= spec.num_steps + 1]
    if pair is not None:
        out.append((f"sim pair {pair['mean']:.2f}", pair["mean"], tuple(pair["probs"])))
    return out


def run_loop(eng, batch, context, max_new, repeats, cold=False):
    """Time the decode loop from prefilled states; returns dict(ms_round, tok_s, rounds, tokens, accept, compile_s).
    ``cold`` (adaptive engines): every loop starts with no learned policy (``policy_memory`` cleared), as a
    bucket's first call does; else the first (compile) loop's policy warm-starts the timed ones."""
    import jax
    import numpy as np

    def once():
        if cold:
            eng.policy_memory.clear()
        state = prefilled(eng, batch, context, max_new)
        g0, r0, a0 = (np.asarray(x) for x in (state.num_generated, state.num_rounds, state.num_accepted))
        t0 = time.perf_counter()
        state = jax.block_until_ready(eng.run_decode(state))
        dt = time.perf_counter() - t0
        g, r, a = (np.asarray(x) for x in (state.num_generated, state.num_rounds, state.num_accepted))
        modes = None if state.policy is None else np.asarray(state.policy.mode_rounds).tolist()
        del state
        return dt, int((g - g0).sum()), int((r - r0).max()), float((a - a0).sum()) / max(1, int((r - r0).sum())), modes

    first = once()
    runs = [once() for _ in range(repeats)]
    dt = statistics.median(r[0] for r in runs)
    _, tokens, rounds, accept, modes = runs[0]
    return dict(ms_round=dt * 1e3 / max(1, rounds), tok_s=tokens / dt, rounds=rounds, tokens=tokens, accept=accept,
                compile_s=max(0.0, first[0] - dt), mode_rounds=modes)


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

    from jaxspec.engine import Engine, SimulatedAccept
    from jaxspec.models import MTPDrafter

    specs = _specs()
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
    heads = draft_vocab_models(model, [int(x) for x in args.draft_vocab.split(",")])
    head_bytes = {dv: weight_bytes(head) for dv, head in heads.items()}
    for dv in heads:
        if dv:
            print(f"[{name}] draft vocabulary {dv} tokens (with_draft_vocab): draft forward reads "
                  f"{head_bytes[dv]['draft'] / 2**30:.2f} GiB", flush=True)
    plain_ms = {}
    for batch in [int(x) for x in args.batches.split(",")]:
        for cname, dv in [(c, dv) for c in args.configs.split(",") for dv in (heads if c != "plain" else [0])]:
            head = heads.get(dv, model)
            if cname == "adaptive":
                adaptive_rows(head, head_bytes.get(dv, wb), name, batch, contexts, width, args, gbps, plain_ms, rows,
                              pairs, dv)
                continue
            spec = specs[cname]
            drafter = None if spec is None else MTPDrafter(head)
            settings = [("-", 1.0, None)] if spec is None else _sims(spec, pairs.get(cname))
            kw = dict(spec=spec, max_context=width, page_size=args.page_size, max_batch=batch,
                      batch_invariant=args.batch_invariant)
            eng = Engine(head, drafter, **kw)  # plain rows, and the breakdown's shapes
            for context in contexts:
                t0 = time.perf_counter()
                if spec is None:
                    measured = {"-": run_loop(eng, batch, context, args.max_new, args.repeats)}
                    loop_engines = {"-": eng}
                else:  # one engine per simulated setting; the setting is a value of the state: one compile
                    measured, loop_engines = {}, {}
                    for lab, mean, probs in settings:
                        sim = SimulatedAccept(probs=probs) if probs is not None else SimulatedAccept(mean=mean)
                        e2 = loop_engines[lab] = Engine(head, drafter, simulate_accept=sim, **kw)
                        measured[lab] = run_loop(e2, batch, context, args.max_new, args.repeats)
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
                    else:
                        parts = breakdown(eng, st, args.reps)
                    del st
                    lab = "-" if spec is None else "sim mean 3.0"
                    if args.profile and lab in loop_engines:
                        st = prefilled(loop_engines[lab], batch, context, args.max_new)
                        prof = profile_loop(loop_engines[lab], st, measured[lab]["rounds"])
                        if prof:
                            parts["loop_profile"] = dict(prof, ms_round=measured[lab]["ms_round"])
                        del st
                roof = roofline_ms(head_bytes.get(dv, wb), model, spec, batch, context, gbps)
                for lab, mean, _ in settings:
                    m = measured[lab]
                    if spec is None:
                        tok_s, acc, sim = m["tok_s"], 1.0, "-"
                        plain_ms[(batch, context)] = m["ms_round"]
                    else:
                        tok_s, acc, sim = m["tok_s"], m["accept"], f"engine {lab}"
                    pms = plain_ms.get((batch, context))
                    base = None if pms is None else batch / (pms * 1e-3)
                    row = dict(model=name, config=cname, draft_vocab=dv, batch=batch, context=context, sim=sim, accept=acc,
                               tok_s=tok_s, ms_round=m["ms_round"], measured_accept=m["accept"],
                               roofline_ms=roof, x_roof=m["ms_round"] / roof, compile_s=m["compile_s"],
                               speedup=None if base is None else tok_s / base,
                               efficiency=None if base is None else tok_s / base / acc, **parts)
                    rows.append(row)
                    _print_row(row)
                    if args.json:  # after every row: a run cut short still leaves its rows
                        _write_json(args, rows, gbps, pairs)
                print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)
            del eng
            gc.collect()
    del model, heads
    gc.collect()


def adaptive_rows(model, wb, name, batch, contexts, width, args, gbps, plain_ms, rows, pairs, dv=0):
    """Rows of ``Engine(spec=(chain, tree), adaptive=True)`` at each simulated mean: the round costs of plain /
    chain / tree are calibrated at this batch and context first (``Engine.calibrate``, one decode executable
    for calibration and the timed loop), then the policy chooses per round; ``modes`` = rounds per mode."""
    from jaxspec.engine import Engine, SimulatedAccept
    from jaxspec.kernels._dispatch import next_pow2
    from jaxspec.models import MTPDrafter

    specs = _specs()
    shapes = tuple(specs[c] for c in ADAPTIVE_SPECS)
    for context in contexts:
        t0 = time.perf_counter()
        costs = None
        for mean in SIM_MEANS:
            eng = Engine(model, MTPDrafter(model), spec=shapes, adaptive=True, max_context=width,
                         page_size=args.page_size, max_batch=batch, simulate_accept=SimulatedAccept(mean=mean),
                         batch_invariant=args.batch_invariant)
            if costs is None:
                tc = time.perf_counter()
                costs = eng.calibrate(batch, context=context)
                cal_s = time.perf_counter() - tc
            eng.round_costs[next_pow2(batch)] = costs  # the same costs for every simulated mean
            m = run_loop(eng, batch, context, args.max_new, args.repeats)  # warm: the compile loop taught the policy
            cold = run_loop(eng, batch, context, args.max_new, args.repeats, cold=True)  # every loop explores afresh
            pms = plain_ms.get((batch, context))
            base = None if pms is None else batch / (pms * 1e-3)
            row = dict(model=name, config="adaptive", draft_vocab=dv, batch=batch, context=context,
                       sim=f"engine sim mean {mean:.1f}",
                       accept=m["accept"], tok_s=m["tok_s"], ms_round=m["ms_round"], measured_accept=m["accept"],
                       roofline_ms=roofline_ms(wb, model, None, batch, context, gbps), compile_s=m["compile_s"],
                       speedup=None if base is None else m["tok_s"] / base,
                       efficiency=None if base is None else m["tok_s"] / base / m["accept"],
                       mode_rounds=m["mode_rounds"], round_costs_ms=[float(c) * 1e3 for c in costs],
                       calibrate_s=cal_s, tok_s_cold=cold["tok_s"], mode_rounds_cold=cold["mode_rounds"],
                       speedup_cold=None if base is None else cold["tok_s"] / base)
            row["x_roof"] = row["ms_round"] / row["roofline_ms"]
            rows.append(row)
            _print_row(row)
            print(f"      warm-started policy (the row): rounds plain/chain/tree {m['mode_rounds']}; cold start: "
                  f"{cold['tok_s']:,.0f} tok/s, rounds {cold['mode_rounds']}", flush=True)
            print(f"      calibrated ms/round "
                  f"{', '.join(f'{c * 1e3:.3f}' for c in costs)} ({cal_s:.1f} s incl. compile)", flush=True)
            if args.json:
                _write_json(args, rows, gbps, pairs)
        print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)


def adaptive_summary(rows):
    """Per (model, batch, context, sim mean): adaptive tok/s vs plain and vs the best fixed config."""
    out = []
    for r in rows:
        if r["config"] != "adaptive":
            continue
        mean = r["sim"].split()[-1]
        same = [x for x in rows if (x["model"], x["batch"], x["context"]) == (r["model"], r["batch"], r["context"])]
        dv = r.get("draft_vocab", 0)
        fixed = {x["config"]: x["tok_s"] for x in same
                 if x["config"] == "plain" or (x["config"] in ADAPTIVE_SPECS and x.get("draft_vocab", 0) == dv
                                               and x["sim"].endswith(f"mean {mean}"))}
        if not fixed:
            continue
        best = max(fixed, key=fixed.get)
        out.append(dict(model=r["model"], draft_vocab=dv, batch=r["batch"], context=r["context"], mean=mean,
                        tok_s=r["tok_s"],
                        vs_plain=r["tok_s"] / fixed["plain"] if "plain" in fixed else None, best=best,
                        vs_best=r["tok_s"] / fixed[best], modes=r.get("mode_rounds"),
                        cold_vs_plain=r["tok_s_cold"] / fixed["plain"] if "plain" in fixed else None,
                        cold_vs_best=r["tok_s_cold"] / fixed[best], cold_modes=r.get("mode_rounds_cold")))
    return out


HEADER = (f"{'model':<5} {'config':<10} {'batch':>5} {'ctx':>5} {'accept (sim)':<26} {'tok/s':>10} {'x plain':>7} "
          f"{'eff':>5} {'ms/round':>8} {'roof ms':>7} {'x roof':>6} {'draft':>6} {'verify':>6} {'book':>6} {'compile s':>9}")


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _print_row(r):
    acc = f"{r['accept']:.2f} ({r['sim']})" if r["config"] != "plain" else "1.00"
    print(f"{r['model']:<5} {_label(r['config'], r.get('draft_vocab', 0)):<10} {r['batch']:>5} {r['context']:>5} {acc:<26} {r['tok_s']:>10,.0f} "
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
        lines = sorted({(_label(r["config"], r.get("draft_vocab", 0)), r["sim"]) for r in sel})
        for cfg, sim in lines:
            pts = sorted((r["batch"], r["tok_s"]) for r in sel
                         if (_label(r["config"], r.get("draft_vocab", 0)), r["sim"]) == (cfg, sim))
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

    from _timing import copy_ceiling_gbps

    configs = model_configs()
    dtype = jnp.bfloat16
    kv_dtype = jnp.float32 if args.device == "cpu" else jnp.bfloat16
    dev = str(jax.devices()[0])
    gbps, _ = copy_ceiling_gbps(2**30 if args.device == "gpu" else 2**24)
    print(f"device {dev}; copy bandwidth {gbps:.0f} GB/s (read + write); decode loop: Engine.run_decode; "
          f"speculative rows: Engine(simulate_accept=...); XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    pairs = {}
    if not (args.probe or args.no_pairs):
        for cname, spec in _specs().items():
            if spec is not None and cname in args.configs.split(","):
                t0 = time.perf_counter()
                pairs[cname] = pair_accept_histogram(spec, prompts=2 if args.tiny else 8, max_new=8 if args.tiny else 64)
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
    summary = adaptive_summary(rows)
    if summary:
        print("\nadaptive vs fixed configs (targets: >= 0.97x plain, within 5% of the best fixed config); the row's "
              "policy is warm-started (Engine.policy_memory), cold start = every loop explores afresh")
        for a in summary:
            print(f"  {_label(a['model'], a['draft_vocab'])} batch {a['batch']:>4} ctx {a['context']:>5} sim mean {a['mean']}: "
                  f"{a['tok_s']:>10,.0f} tok/s = {_f(a['vs_plain'], '.3f')}x plain, {a['vs_best']:.3f}x the best fixed "
                  f"({a['best']}); rounds plain/chain/tree {a['modes']}; cold start {_f(a['cold_vs_plain'], '.3f')}x "
                  f"plain, {a['cold_vs_best']:.3f}x the best, rounds {a['cold_modes']}")
    for r in rows:
        p = r.get("loop_profile")
        if p and r["sim"] in ("-", "engine sim mean 3.0"):
            print(f"\nCUPTI decode loop {r['model']} {_label(r['config'], r.get('draft_vocab', 0))} batch {r['batch']} ctx {r['context']} ({r['sim']}): "
                  f"kernels {p['total_us'] / 1e3:.3f} ms of {p['ms_round']:.3f} ms per round, "
                  f"{p['kernels_per_round']:.0f} kernels per round; groups "
                  + ", ".join(f"{k} {v:.0f}" for k, v in sorted(p["groups"].items())))
            for k, v in p["top"]:
                print(f"   {v:9.1f} us  {k}")
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
                       max_new=args.max_new, page_size=args.page_size,
                       argv=sys.argv[1:], rows=rows), f, indent=1, default=str)


def argparse_copy(args, over):
    import argparse

    d = dict(vars(args))
    d.update(over or {})
    return argparse.Namespace(**d)


if __name__ == "__main__":
    sys.exit(main())
