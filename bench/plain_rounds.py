"""What a plain round costs inside an adaptive engine, against plain decoding's step, in one run.

``python bench/plain_rounds.py [--weights DIR] [--batch 8] [--max-new 96] [--repeats 7] [--device cpu|gpu]
[--json PATH]``

The same random prompts (``--prompt`` tokens each) decoded greedily by a plain ``Engine`` and by an adaptive
``Engine`` (the pair's MTP drafter, draft shape ``(3, 1, 4)``, ``AdaptivePolicy()``) with every round forced to
plain decoding (``Engine.run_decode(mode=0)``: the adaptive loop's own executable), then by the adaptive engine
left to its policy with both modes priced alike (``round_costs`` of 1: the policy probes the shape and keeps
whichever accepts more per round). Per row: ms per round (the decode loop's wall time over its rounds, prefill
excluded, fastest of ``--repeats`` calls interleaved with the other rows'), rounds, the ratio to the plain row,
and whether the tokens equal plain decoding's (they must: every mode is lossless). ``--weights``: a jaxspec
pair directory (``jaxspec.models.load_pair``; default the shipped tiny pair); the adaptive engine's plain rounds
carry the drafter (its catch-up extends) and the policy, which is what the forced row measures.
"""

import json
import sys
import time

import _cli


def _parse(argv):
    ap = _cli.parser("plain_rounds.py", __doc__)
    ap.add_argument("--weights", default=None, help="a jaxspec pair directory (default: the shipped tiny pair)")
    ap.add_argument("--batch", type=int, default=8, help="requests per call")
    ap.add_argument("--prompt", type=int, default=24, help="tokens per prompt")
    ap.add_argument("--max-new", type=int, default=96, help="tokens generated per request")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per row (the fastest counts)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="JAX platform")
    ap.add_argument("--json", default=None, help="write the rows here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _cli.parse_on_device(_parse, argv)
    import jax
    import numpy as np

    from jaxspec.config import SpecConfig
    from jaxspec.engine import AdaptivePolicy, Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair

    if min(args.batch, args.prompt, args.max_new, args.repeats) < 1:
        raise SystemExit("--batch, --prompt, --max-new and --repeats: expected positive ints")
    model = load_pair(args.weights or DEFAULT_WEIGHTS)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, int(model.vocab_size), args.prompt).astype(np.int32) for _ in range(args.batch)]
    kw = dict(max_context=args.prompt + args.max_new + 16, max_batch=args.batch)
    plain = Engine(model, None, **kw)
    adaptive = Engine(model, MTPDrafter(model), spec=(SpecConfig(3, 1, 4),), adaptive=AdaptivePolicy(), **kw)
    bucket = int(plain.prepare(prompts, args.max_new)[0].done.shape[0])
    adaptive.round_costs[bucket] = np.ones((2,), np.float32)  # both modes priced alike: acceptance decides

    def call(eng, mode):
        state = jax.block_until_ready(eng.run_prefill(*eng.prepare(prompts, args.max_new)))
        t0 = time.perf_counter()
        state = jax.block_until_ready(eng.run_decode(state) if mode is None else eng.run_decode(state, mode=mode))
        return time.perf_counter() - t0, state

    rows = [("plain", plain, None), ("adaptive, every round plain", adaptive, 0), ("adaptive, its policy", adaptive, None)]
    outs, best = {}, {}
    for name, eng, mode in rows:  # compiles, and the tokens
        _, outs[name] = call(eng, mode)
        best[name] = float("inf")
    for _ in range(args.repeats):
        for name, eng, mode in rows:
            best[name] = min(best[name], call(eng, mode)[0])
    want = np.asarray(outs["plain"].out_tokens)
    doc = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, args=vars(args), rows=[])
    base = None
    print(f"{'row':<30s} {'rounds':>6s} {'ms/round':>9s} {'x plain':>8s}  same tokens")
    for name, _, _ in rows:
        st = outs[name]
        rounds = int(np.max(np.asarray(st.num_rounds)))
        ms = best[name] / rounds * 1e3
        base = ms if base is None else base
        same = bool((np.asarray(st.out_tokens) == want).all())
        modes = None if st.policy is None else np.asarray(st.policy.mode_rounds).tolist()
        doc["rows"].append(dict(row=name, rounds=rounds, ms_per_round=ms, ratio=ms / base, same_as_plain=same,
                                mode_rounds=modes, seconds=best[name]))
        print(f"{name:<30s} {rounds:6d} {ms:9.3f} {ms / base:8.3f}  {same}" + (f"  (rounds per mode {modes})"
                                                                              if modes else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if not all(r["same_as_plain"] for r in doc["rows"]):
        print("tokens differ from plain decoding", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
