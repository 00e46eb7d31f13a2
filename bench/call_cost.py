"""The fixed cost of one decode call next to the cost of a round: plain, chain and adaptive engines at one batch
and context (8B shape, simulated mean accept 3.0 for the speculative ones).

``python bench/call_cost.py [--batch 1] [--context 1024] [--rounds 8] [--json PATH] [--profile]``

Per engine, ``Engine.run_decode`` calls of 1 and ``1 + rounds`` rounds, three of each, timed two ways:
* fresh: every call starts from a newly prefilled state (new device buffers, as ``bench/e2e.py``'s loops and
  every ``Engine.generate`` call do);
* reused: the calls chain on one state (each call donates it and returns it in the same buffers, as
  ``Engine.calibrate`` does).
Per way: round ms = (fastest ``1 + rounds`` call - fastest 1-round call) / rounds, and call ms = the fastest
1-round call - round ms (what a call costs besides its rounds). With XLA:GPU command buffers a call whose
buffers moved re-records the commands that use them (``TF_CPP_VMODULE=command_buffer_thunk=3`` logs each
update and its microseconds); the two ways separate that from the rest of a call's cost.

``--profile``: also each engine's kernels in one ``1 + rounds``-round call (CUPTI, GPU only): kernels and their
summed device time per round next to the round's wall time, and every kernel's us per round (in the JSON), so
two engines' rounds can be compared kernel by kernel.
"""

import json
import sys
import time

import _cli
from _e2e_parts import prefilled


def _parse(argv):
    ap = _cli.parser("call_cost.py", __doc__)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform to run on")
    ap.add_argument("--model", default="8b", help="8b, 1b or tiny (bench/e2e.py's shapes)")
    ap.add_argument("--batch", type=int, default=1, help="batch size")
    ap.add_argument("--context", type=int, default=1024, help="tokens already in the KV")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the long call")
    ap.add_argument("--configs", default="plain,chain,adaptive",
                    help="comma list of plain, chain, adaptive (plain, chain and tree), adaptive-chain (plain and chain)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--profile", action="store_true", help="also the kernels of one call per engine (docstring)")
    return ap.parse_args(argv)


def _pointer(state) -> int:
    return state.target_cache.k.unsafe_buffer_pointer()


def measure(eng, batch: int, context: int, rounds: int, max_new: int) -> dict:
    import jax

    def timed(state, trips):
        state = jax.block_until_ready(state)
        t0 = time.perf_counter()
        state = jax.block_until_ready(eng.run_decode(state, max_rounds=trips))
        return state, time.perf_counter() - t0

    state, _ = timed(prefilled(eng, batch, context, max_new), 1 + rounds)  # compile + first record
    del state
    fresh = {1: [], 1 + rounds: []}
    pointers = []
    for _ in range(3):
        for trips in fresh:
            st = prefilled(eng, batch, context, max_new)
            pointers.append(_pointer(st))
            st, dt = timed(st, trips)
            fresh[trips].append(dt)
            del st
    reused = {1: [], 1 + rounds: []}
    st = prefilled(eng, batch, context, max_new)
    st, _ = timed(st, 1)
    same = []
    for _ in range(3):
        for trips in reused:
            p = _pointer(st)
            st, dt = timed(st, trips)
            same.append(p == _pointer(st))
            reused[trips].append(dt)
    del st
    out = {}
    for way, t in (("fresh", fresh), ("reused", reused)):
        round_ms = (min(t[1 + rounds]) - min(t[1])) / rounds * 1e3
        out[way] = dict(round_ms=round_ms, call_ms=min(t[1]) * 1e3 - round_ms,
                        times_ms={k: [x * 1e3 for x in v] for k, v in t.items()})
    out["fresh_states_share_buffers"] = len(set(pointers)) == 1
    out["reused_state_keeps_buffers"] = all(same)
    return out


def profile_call(eng, batch: int, context: int, rounds: int, max_new: int) -> dict:
    """Kernels of one warm ``1 + rounds``-round call (``--profile``), per round."""
    import jax
    from _timing import cupti_kernels

    n = 1 + rounds  # measure() ran this engine already: compiled and warm
    st = [prefilled(eng, batch, context, max_new)]
    out = []

    def call():
        out.append(eng.run_decode(st.pop(), max_rounds=n))

    per = cupti_kernels(call, lambda: jax.block_until_ready(out[-1] if out else None), n, calls=1)
    if per is None:
        return {}
    return dict(kernels_per_round=cupti_kernels.last_count, kernel_us_per_round=sum(per.values()),
                per_kernel_us={k[:100]: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])})


def main(argv=None) -> int:
    args = _parse(argv)
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu" if args.device == "cpu" else "cuda")
    import jax
    import jax.numpy as jnp

    from e2e import ADAPTIVE_SPECS, _specs, make_model, model_configs
    from jaxspec.engine import Engine, SimulatedAccept
    from jaxspec.kernels._dispatch import next_pow2
    from jaxspec.models import MTPDrafter, with_draft_vocab

    import numpy as np

    dtype = jnp.bfloat16 if args.device == "gpu" else jnp.float32
    specs = _specs()
    model = make_model(model_configs()[args.model], max(s.num_steps for s in specs.values() if s), dtype, dtype)
    if args.model != "tiny":
        model = with_draft_vocab(model, np.arange(32000))
    max_new = 4 * (4 + 6 * (1 + args.rounds))
    width = -(-(args.context + max_new + 32) // 16) * 16
    kw = dict(max_context=width, page_size=16, max_batch=args.batch)
    sim = SimulatedAccept(mean=3.0)
    print(f"device {jax.devices()[0]}; {args.model} batch {args.batch} context {args.context}; XLA_FLAGS="
          f"{os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    results = {}
    for name in args.configs.split(","):
        if name == "plain":
            eng = Engine(model, None, **kw)
        elif name == "chain":
            eng = Engine(model, MTPDrafter(model), spec=specs["chain"], simulate_accept=sim, **kw)
        elif name in ("adaptive", "adaptive-chain"):  # adaptive-chain: plain decoding and the chain only
            shapes = ADAPTIVE_SPECS if name == "adaptive" else ("chain",)
            eng = Engine(model, MTPDrafter(model), spec=tuple(specs[c] for c in shapes), adaptive=True,
                         simulate_accept=sim, **kw)
            # costs that make the chain the policy's choice (its rounds are what is compared)
            eng.round_costs[next_pow2(args.batch)] = np.array([1.0, 1.0, 10.0][:1 + len(shapes)], np.float32)
        else:
            raise SystemExit(f"--configs: unknown config {name!r}")
        t0 = time.perf_counter()
        r = results[name] = measure(eng, args.batch, args.context, args.rounds, max_new)
        print(f"{name:<9} fresh: round {r['fresh']['round_ms']:.3f} ms, call {r['fresh']['call_ms']:.3f} ms | "
              f"reused: round {r['reused']['round_ms']:.3f} ms, call {r['reused']['call_ms']:.3f} ms | fresh states "
              f"share buffers: {r['fresh_states_share_buffers']}, reused keeps them: {r['reused_state_keeps_buffers']}"
              f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        if args.profile:
            p = r["profile"] = profile_call(eng, args.batch, args.context, args.rounds, max_new)
            if p:
                top = list(p["per_kernel_us"].items())[:6]
                print(f"  kernels: {p['kernels_per_round']:.0f} per round, {p['kernel_us_per_round'] / 1e3:.3f} ms of "
                      f"device time per round; top us: {top}", flush=True)
        del eng
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
