"""Decode benchmark: speculative (MTP chain / tree) vs plain greedy decoding, on-device ``while_loop`` vs
host-driven (one jitted call per round), over batch sizes.

``python bench/decode.py [--device cpu|gpu] [--batch-sizes 1,8,32] [--max-new 128] [--json PATH]``
(all flags: ``--help``).

Reports generated tokens/s (wall time of the decode, prefill included, compile excluded; median over
``--repeats``), the mean accept length (tokens committed per verify round) and compile time.

Sampling rows (``--sampling``, default ``greedy,t0.7p0.9``): each config also runs with every request at
temperature 0.7, top-p 0.9 (seed = request index; SGLang's target-only verify, drafts top-k), and the
``chain`` config additionally with ``verify="draft_probs"`` (config ``chain_dp``: sampled drafts, classic
rule); their ``same`` column is empty (sampled output is compared in distribution by the tests).

Measured on one H200 (jax 0.11.2, page size 16, max_new 128, shipped tiny pair), tokens/s:
batch 1: plain loop 10.7k, chain loop 11.5k (accept 3.34), tree loop 8.6k (accept 3.43); host-driven
0.8k / 2.7k / 2.3k. batch 32: plain loop 248k, chain 256k (accept 3.04), tree 190k (3.17); host-driven
31k / 52k / 59k (host-driven figures predate the cached-jit change that removed ~3 ms/call of GraphDef
hashing on CPU; expect them higher now). The tiny model is launch-bound: a plain round costs ~0.1 ms in the while_loop and a
speculative round ~0.3-0.4 ms (3 MTP forwards + verify + ops), so speculation pays ~3x per round and the
on-device loop beats one jitted call per round by ~4-13x.
"""

import json
import os
import statistics
import sys
import time

import _cli


def _parse(argv):
    ap = _cli.parser("decode.py", __doc__)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="JAX platform to run on")
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma list of batch sizes")
    ap.add_argument("--configs", default="plain,chain,tree",
                    help="comma list: plain (no speculation), chain (S3 K1 N4), tree (S3 K2 N6)")
    ap.add_argument("--modes", default="loop,host",
                    help="comma list: loop (on-device while_loop), host (one jitted call per round)")
    ap.add_argument("--sampling", default="greedy,t0.7p0.9",
                    help="comma list: greedy, t0.7p0.9 (temperature 0.7, top-p 0.9; adds the chain_dp config)")
    ap.add_argument("--max-new", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--page-size", type=int, default=16, help="KV page size (tokens)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (the median is reported)")
    ap.add_argument("--implementation", default="auto", choices=["auto", "reference", "pallas"],
                    help="kernel implementation")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this path")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    os.environ["JAX_PLATFORMS"] = "cpu" if args.device == "cpu" else "cuda"
    import jax
    import numpy as np
    from tqdm import tqdm

    from jaxspec.config import SpecConfig
    from jaxspec.corpus import make_prompts
    from jaxspec.engine import Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MockVocab, MTPDrafter, load_pair

    specs = {"plain": None, "chain": SpecConfig(3, 1, 4), "tree": SpecConfig(3, 2, 6)}
    names = args.configs.split(",")
    modes = args.modes.split(",")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    model = load_pair(DEFAULT_WEIGHTS)
    vocab = MockVocab(vocab_size=model.vocab_size)
    device = str(jax.devices()[0])

    def run_once(eng, prompts, mode, kw):
        inputs = jax.block_until_ready(eng.prepare(prompts, args.max_new, **kw))
        t0 = time.perf_counter()
        state = eng.run(*inputs) if mode == "loop" else eng.run_host_driven(*inputs)
        state = jax.block_until_ready(state)
        return time.perf_counter() - t0, Engine.result(state)

    rows = []
    samplings = args.sampling.split(",")
    combos = [(b, n, m, s) for s in samplings for b in batch_sizes for n in names for m in modes]
    combos += [(b, "chain_dp", m, s) for s in samplings if s != "greedy" and "chain" in names
               for b in batch_sizes for m in modes]
    reference = {}
    for b, name, mode, smp in tqdm(combos, desc="bench", unit="case"):
        prompts = [vocab.encode(t) for t in make_prompts(b)]
        spec = specs["chain" if name == "chain_dp" else name]
        width = max(len(p) for p in prompts) + args.max_new + (1 if spec is None else spec.num_draft_tokens)
        drafter = None if spec is None else MTPDrafter(model, implementation=args.implementation,
                                                         sample_drafts=name == "chain_dp")
        eng = Engine(model, drafter, spec=spec, max_context=-(-width // args.page_size) * args.page_size,
                     page_size=args.page_size, max_batch=b, implementation=args.implementation,
                     verify="draft_probs" if name == "chain_dp" else "target_only")
        kw = {} if smp == "greedy" else dict(temperature=0.7, top_p=0.9, seed=list(range(b)))
        t0 = time.perf_counter()
        _, res = run_once(eng, prompts, mode, kw)  # compile + warm-up
        compile_s = time.perf_counter() - t0
        times = [run_once(eng, prompts, mode, kw)[0] for _ in range(args.repeats)]
        toks = sum(len(t) for t in res.tokens)
        key = b
        if name == "plain" and smp == "greedy" and key not in reference:
            reference[key] = res.tokens
        same = None
        if smp == "greedy" and key in reference:
            same = all(np.array_equal(x, y) for x, y in zip(res.tokens, reference[key]))
        med = statistics.median(times)
        rows.append(dict(batch=b, config=name, mode=mode, sampling=smp, tokens=toks, seconds=med, tokens_per_s=toks / med,
                         mean_accept_length=res.mean_accept_length, rounds=int(res.num_rounds.max()),
                         compile_s=compile_s, matches_plain=same))

    print(f"\ndevice: {device}   max_new {args.max_new}   page size {args.page_size}   implementation {args.implementation}")
    hdr = f"{'batch':>5} {'config':<8} {'sampling':<9} {'mode':<5} {'tok/s':>10} {'speedup':>8} {'accept':>7} {'rounds':>7} {'ms/round':>9} {'compile s':>10} {'same':>5}"
    print(hdr)
    print("-" * len(hdr))
    base = {(r["batch"], r["mode"], r["sampling"]): r["tokens_per_s"] for r in rows if r["config"] == "plain"}
    for r in rows:
        k = (r["batch"], r["mode"], r["sampling"])
        sp = r["tokens_per_s"] / base[k] if k in base else float("nan")
        r["speedup_vs_plain"] = sp
        print(f"{r['batch']:>5} {r['config']:<8} {r['sampling']:<9} {r['mode']:<5} {r['tokens_per_s']:>10.1f} {sp:>8.2f} "
              f"{r['mean_accept_length']:>7.3f} {r['rounds']:>7} {1e3 * r['seconds'] / max(1, r['rounds']):>9.3f} "
              f"{r['compile_s']:>10.1f} {str(r['matches_plain']):>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, max_new=args.max_new, page_size=args.page_size,
                           implementation=args.implementation, rows=rows), f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["matches_plain"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
