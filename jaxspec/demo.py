"""Demo: greedy MTP speculative decoding vs plain decoding with the shipped tiny pair.

``python -m jaxspec.demo [--device cpu|gpu] [--config chain|tree|both] [--batch 8] [--max-new 64]``

Loads the checkpoint directory ``jaxspec/assets/tiny_pair`` (or ``--weights DIR``), decodes a batch of corpus
prompts of different lengths with the whole generation in one XLA ``while_loop`` (speculative and plain),
checks the outputs are identical token for token (prints "outputs identical", else exits 1), and prints
the mean accept length and tokens/s of each.
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
    ap.add_argument("--batch", type=int, default=8, help="number of prompts decoded together (default: %(default)s)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens generated per prompt (default: %(default)s)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (default: %(default)s)")
    ap.add_argument("--weights", default=None, metavar="DIR",
                    help="checkpoint directory of a target + MTP pair (default: the shipped jaxspec/assets/tiny_pair)")
    return ap


def _parse(argv):
    return _parser().parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    # Pick the platform before JAX initialises a backend.
    os.environ["JAX_PLATFORMS"] = "cpu" if args.device == "cpu" else "cuda"
    import jax
    import numpy as np
    from tqdm import tqdm

    from jaxspec.config import SpecConfig
    from jaxspec.corpus import make_prompts
    from jaxspec.engine import Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MockVocab, MTPDrafter, load_pair

    model = load_pair(args.weights or DEFAULT_WEIGHTS)
    vocab = MockVocab(vocab_size=model.vocab_size)
    texts = make_prompts(args.batch)
    prompts = [vocab.encode(t) for t in texts]
    configs = {"chain": SpecConfig(3, 1, 4), "tree": SpecConfig(3, 2, 6)}
    names = ["chain", "tree"] if args.config == "both" else [args.config]
    width = max(len(p) for p in prompts) + args.max_new + max(configs[n].num_draft_tokens for n in names)
    max_context = -(-width // args.page_size) * args.page_size
    print(f"device: {jax.devices()[0]}  batch {args.batch}  prompt lengths {[len(p) for p in prompts]}  "
          f"max_new {args.max_new}  page size {args.page_size}")

    kw = dict(max_context=max_context, page_size=args.page_size, max_batch=args.batch)
    engines = {"plain": Engine(model, None, spec=None, **kw)}
    for n in names:
        engines[n] = Engine(model, MTPDrafter(model), spec=configs[n], **kw)
    results, timing = {}, {}
    with tqdm(total=2 * len(engines), desc="demo", unit="stage") as bar:
        for name, eng in engines.items():
            bar.set_postfix_str(f"compile {name}")
            t0 = time.perf_counter()
            jax.block_until_ready(eng.run(*eng.prepare(prompts, args.max_new)).out_tokens)  # compile + warm-up
            compile_s = time.perf_counter() - t0
            bar.update()
            bar.set_postfix_str(f"run {name}")
            inputs = jax.block_until_ready(eng.prepare(prompts, args.max_new))
            t0 = time.perf_counter()
            state = jax.block_until_ready(eng.run(*inputs))
            run_s = time.perf_counter() - t0
            results[name] = Engine.result(state)
            timing[name] = (compile_s, run_s)
            bar.update()

    ok = True
    plain = results["plain"]
    for name in names:
        same = all(np.array_equal(a, b) for a, b in zip(results[name].tokens, plain.tokens))
        ok &= same
        if not same:
            bad = [i for i, (a, b) in enumerate(zip(results[name].tokens, plain.tokens)) if not np.array_equal(a, b)]
            print(f"{name}: outputs DIFFER from plain decoding for requests {bad}")
    print()
    print(f"{'mode':<8}{'accept len':>12}{'tokens/s':>12}{'run s':>10}{'compile s':>11}")
    for name, res in results.items():
        toks = sum(len(t) for t in res.tokens)
        compile_s, run_s = timing[name]
        print(f"{name:<8}{res.mean_accept_length:>12.3f}{toks / run_s:>12.1f}{run_s:>10.3f}{compile_s:>11.1f}")
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
