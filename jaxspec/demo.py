"""Demo: greedy MTP speculative decoding vs plain decoding with the shipped demo pair.

``python -m jaxspec.demo [--device cpu|gpu] [--config chain|tree|both] [--batch 1] [--max-new 128] [--repeats 20]``

Loads the checkpoint directory ``jaxspec/assets/demo_pair`` (``DEMO_WEIGHTS``: a 24-layer, 32-wide target with 3
MTP layers; or ``--weights DIR``), decodes a batch of corpus prompts of different lengths with the whole
generation in one XLA ``while_loop`` (speculative and plain), checks the outputs are identical token for
token (prints "outputs identical", else exits 1), and prints one table row per mode (mode, mean accept
length, tokens/s, run s = the fastest of ``--repeats`` interleaved timed runs, compile s, median s), then each
speculative mode's speed-up over plain decoding split into tokens per round and the cost of a round in plain
decode steps. The fastest run is the measure (as ``timeit``'s): on a shared CPU other processes only ever add
time, by 20-60% in a run of 30-80 ms; the median is printed beside it.

On CPU every mode runs under the same XLA:CPU options (``CPU_XLA_FLAGS``, process-wide, set before JAX starts).
"""

import argparse
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.demo",
        description="Greedy MTP speculative decoding vs plain decoding with the shipped tiny target + MTP pair: "
                    "decodes a batch of prompts both ways (each generation one XLA while_loop), checks the "
                    "outputs are identical token for token (exit 1 if not) and prints the mean accept length "
                    "and tokens/s of each.",
    )
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="JAX platform to run on (default: %(default)s)")
    ap.add_argument("--config", choices=["chain", "tree", "both"], default="both",
                    help="speculation shape: chain (3 steps, top-1, 4 draft tokens), tree (3 steps, top-2, "
                         "6 draft tokens) or both (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=1, help="number of prompts decoded together (default: %(default)s)")
    ap.add_argument("--max-new", type=int, default=128, help="tokens generated per prompt (default: %(default)s)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=20,
                    help="timed runs per mode after the compile run, interleaved across modes; the table shows "
                         "the fastest and the median (default: %(default)s)")
    ap.add_argument("--weights", default=None, metavar="DIR",
                    help="checkpoint directory of a target + MTP pair (default: the shipped jaxspec/assets/demo_pair)")
    return ap


def _parse(argv):
    args = _parser().parse_args(argv)
    for name in ("batch", "max_new", "page_size", "repeats"):
        if getattr(args, name) < 1:
            _parser().error(f"--{name.replace('_', '-')}: expected an int >= 1, got {getattr(args, name)}")
    return args


# XLA:CPU options of the demo (every mode runs under them; set before JAX starts its CPU backend, so only when the
# demo starts it). An option already in XLA_FLAGS keeps the user's value. Measured with jaxlib 0.10.2 on this repo's
# 2-core CPU (README, "What the demo shows"): jaxlib 0.10 hands multi-row f32 matmuls (a verify forward's 4 rows)
# to YNNPACK fusions and single rows to XLA's own dot; at the demo's 32-wide shapes the YNNPACK call costs more
# than the matmul, and Eigen's multi-threaded dots pay a thread hand-off per tiny matmul. Added only for the
# jaxlib versions they were measured with (XLA aborts on an option it does not know).
CPU_XLA_FLAGS = {"--xla_cpu_experimental_ynn_fusion_type": "", "--xla_cpu_multi_thread_eigen": "false"}
CPU_XLA_FLAGS_JAXLIB = ("0.10.",)


def cpu_xla_flags(current: str, jaxlib_version: str) -> str:
    """``current`` (an ``XLA_FLAGS`` value) plus the ``CPU_XLA_FLAGS`` it does not set already, for a jaxlib
    version in ``CPU_XLA_FLAGS_JAXLIB``; else ``current`` unchanged."""
    if not jaxlib_version.startswith(CPU_XLA_FLAGS_JAXLIB):
        return current
    have = {f.split("=", 1)[0] for f in current.split()}
    extra = [f"{k}={v}" for k, v in CPU_XLA_FLAGS.items() if k not in have]
    return " ".join(([current.strip()] if current.strip() else []) + extra)


# Why the speed-up grows with the target's size (printed under the table).
WHY = (
    "why: a round = one target forward over its N verify tokens + the draft layers + bookkeeping. Where a forward\n"
    "  is bound by reading the weights (a GPU at model scale: on the H200 a batch-1 chain round of an 8B-shaped\n"
    "  target costs ~1.15 plain decode steps, BENCHMARKS.md), verifying N tokens costs about one step; the draft\n"
    "  and bookkeeping are fixed costs, so the bigger the target (here {layers} layers against {mtp} draft layers),\n"
    "  the closer a round gets to one step and the speed-up to the accept length. On a CPU at this model's size a\n"
    "  forward's arithmetic and many small ops grow with the rows (a 4-row forward costs 1.6-2.2 one-row ones),\n"
    "  which caps the win here."
)


def main(argv=None) -> int:
    args = _parse(argv)
    # Pick the platform before JAX initialises a backend.
    os.environ["JAX_PLATFORMS"] = "cpu" if args.device == "cpu" else "cuda"
    if args.device == "cpu":
        from importlib.metadata import version

        os.environ["XLA_FLAGS"] = cpu_xla_flags(os.environ.get("XLA_FLAGS", ""), version("jaxlib"))
    import jax
    import numpy as np
    from tqdm import tqdm

    from jaxspec.config import SpecConfig
    from jaxspec.corpus import make_prompts
    from jaxspec.engine import Engine
    from jaxspec.models import DEMO_WEIGHTS, MockVocab, MTPDrafter, load_pair

    model = load_pair(args.weights or DEMO_WEIGHTS)
    vocab = MockVocab(vocab_size=model.vocab_size)
    texts = make_prompts(args.batch)
    prompts = [vocab.encode(t) for t in texts]
    configs = {"chain": SpecConfig(3, 1, 4), "tree": SpecConfig(3, 2, 6)}
    names = ["chain", "tree"] if args.config == "both" else [args.config]
    width = max(len(p) for p in prompts) + args.max_new + max(configs[n].num_draft_tokens for n in names)
    max_context = -(-width // args.page_size) * args.page_size
    print(f"device: {jax.devices()[0]}  batch {args.batch}  prompt lengths {[len(p) for p in prompts]}  "
          f"max_new {args.max_new}  page size {args.page_size}")
    if args.device == "cpu":
        print(f"XLA_FLAGS (every mode): {os.environ['XLA_FLAGS'] or '(none)'}")

    kw = dict(max_context=max_context, page_size=args.page_size, max_batch=args.batch)
    engines = {"plain": Engine(model, None, spec=None, **kw)}
    for n in names:
        engines[n] = Engine(model, MTPDrafter(model), spec=configs[n], **kw)
    results, compile_s, run_s = {}, {}, {name: [] for name in engines}
    with tqdm(total=len(engines) * (1 + args.repeats), desc="demo", unit="run") as bar:
        for name, eng in engines.items():
            bar.set_postfix_str(f"compile {name}")
            t0 = time.perf_counter()
            jax.block_until_ready(eng.run(*eng.prepare(prompts, args.max_new)).out_tokens)  # compile + warm-up
            compile_s[name] = time.perf_counter() - t0
            bar.update()
        for _ in range(args.repeats):  # interleaved, so a change in the machine's load hits every mode alike
            for name, eng in engines.items():
                bar.set_postfix_str(f"run {name}")
                inputs = jax.block_until_ready(eng.prepare(prompts, args.max_new))
                t0 = time.perf_counter()
                state = jax.block_until_ready(eng.run(*inputs))
                run_s[name].append(time.perf_counter() - t0)
                results[name] = Engine.result(state)
                bar.update()
    median_s = {name: float(np.median(ts)) for name, ts in run_s.items()}
    run_s = {name: float(np.min(ts)) for name, ts in run_s.items()}

    ok = True
    plain = results["plain"]
    for name in names:
        same = all(np.array_equal(a, b) for a, b in zip(results[name].tokens, plain.tokens))
        ok &= same
        if not same:
            bad = [i for i, (a, b) in enumerate(zip(results[name].tokens, plain.tokens)) if not np.array_equal(a, b)]
            print(f"{name}: outputs DIFFER from plain decoding for requests {bad}")
    print()
    print(f"{'mode':<8}{'accept len':>12}{'tokens/s':>12}{'run s':>10}{'compile s':>11}{'median s':>10}")
    for name, res in results.items():
        toks = sum(len(t) for t in res.tokens)
        print(f"{name:<8}{res.mean_accept_length:>12.3f}{toks / run_s[name]:>12.1f}{run_s[name]:>10.3f}"
              f"{compile_s[name]:>11.1f}{median_s[name]:>10.3f}")
    print()
    # One loop iteration = one plain decode step or one speculative round (the batch's longest request).
    step_s = run_s["plain"] / max(1, int(plain.num_rounds.max()))
    for name in names:
        res = results[name]
        round_s = run_s[name] / max(1, int(res.num_rounds.max()))
        print(f"{name}: {run_s['plain'] / run_s[name]:.2f}x plain tokens/s ({res.mean_accept_length:.2f} tokens per "
              f"round; a round costs {round_s / step_s:.2f} plain decode steps; medians: "
              f"{median_s['plain'] / median_s[name]:.2f}x)")
    print(WHY.format(layers=model.cfg.num_hidden_layers, mtp=model.num_mtp_layers))
    print()
    for i in range(min(3, len(texts))):
        print(f"  {texts[i]!r} -> {vocab.decode(plain.tokens[i])!r}")
    print()
    if not ok:
        print("outputs differ")
        return 1
    print("outputs identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
