"""Adaptive speculation's policy (``jaxspec.engine.policy``) replayed offline against the fixed modes it chooses from.

``python bench/policy_sim.py --real-model real_model.json [--config eagle3-chain3] [--batches 1,8,32]
[--costs "1:1.224,1.469,1.556;8:1.005,1.45,1.75;32:1.091,1.888,2.128"] [--calls 8] [--seeds 3] [--json PATH]``

Each simulated decode call draws ``B`` requests: an accept length per request from ``--config``'s per-request
mean accept lengths in a ``bench/real_model.py`` JSON (its T=0 acceptance row), turned into a per-draft acceptance
probability ``a`` of a chain of 3 (``1 + a + a**2 + a**3`` = the mean), and an output length uniform in
``[--min-new, --max-new]``. A round of mode ``m`` (plain, chain (3,1,4), chain (7,1,8): the modes of
``real_model.py``'s ``eagle3-adaptive``) costs ``--costs``' milliseconds for the batch bucket (``Engine.calibrate``'s
figures for the real model, e.g. from ``real_model.json``'s ``round_costs_ms``), and yields per running request
``1 + (drafts accepted in a row)``, capped by what the request has left. The policy runs on the jitted
``choose_mode`` / ``update_policy`` of the library, warm-started from call to call as ``Engine.policy_memory``
does; each fixed mode runs the same requests with the same coins. Output per batch: adaptive tokens per ms over
the best fixed mode's, mean and worst call over ``--calls`` x ``--seeds``, and the rounds per mode. The model of
acceptance ignores what a real reply does (acceptance that drifts within a reply); it isolates the policy's
choices from the GPU.
"""

import json
import os

import _cli
import numpy as np

SPECS = (0, 3, 7)  # plain, chain (3,1,4), chain (7,1,8)


def chain_alpha(mean: float, steps: int = 3) -> float:
    """The per-draft acceptance ``a`` of a chain of ``steps`` drafts whose mean accept length is ``mean``."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a**k for k in range(steps + 1)) < mean else (lo, a)
    return (lo + hi) / 2


def one_call(alpha, lengths, costs, rng, mode=None, policy=None):
    """One decode call over requests with per-draft acceptance ``alpha`` and output ``lengths``: a fixed ``mode``,
    or ``policy = (choose, update, state)``. Returns ``(tokens per ms, rounds per mode, final policy state)``."""
    import jax.numpy as jnp

    left = lengths.copy()
    b = len(left)
    tokens = spent = 0.0
    rounds = [0] * len(costs)
    ps = None if policy is None else policy[2]
    while (left > 0).any():
        m = mode if policy is None else int(policy[0](ps))
        running = left > 0
        accept = np.ones(b)
        alive = np.ones(b, bool)
        for _ in range(SPECS[m]):
            alive &= rng.random(b) < alpha
            accept += alive
        accept = np.minimum(accept, left) * running
        left -= accept.astype(int)
        tokens, spent = tokens + accept.sum(), spent + costs[m]
        rounds[m] += 1
        if policy is not None:
            n = int(running.sum())
            ps = policy[1](ps, jnp.int32(m), jnp.float32(accept[running].mean()), jnp.int32(n))
    return tokens / spent, rounds, ps


def simulate(means, batch, costs, *, calls, seed, min_new, max_new):
    """``calls`` warm-started calls at ``batch``: per call adaptive / best fixed, and the rounds per mode."""
    import jax

    from jaxspec.engine.policy import AdaptivePolicy, choose_mode, init_policy_state, update_policy

    pol = AdaptivePolicy()
    choose = jax.jit(lambda ps: choose_mode(pol, ps))
    update = jax.jit(lambda ps, m, a, n: update_policy(pol, ps, m, a, n))
    rng = np.random.default_rng(seed)
    learned, ratios, modes = None, [], np.zeros(len(costs), int)
    for c in range(calls):
        alpha = np.array([chain_alpha(m) for m in rng.choice(means, batch)])
        lengths = rng.integers(min_new, max_new + 1, batch)
        coins = seed * 1000 + c  # the same coins for every mode and the policy
        fixed = [one_call(alpha, lengths, costs, np.random.default_rng(coins), mode=m)[0] for m in range(len(costs))]
        ps = init_policy_state(costs, [1.0 + s for s in SPECS], learned)
        rate, rounds, learned = one_call(alpha, lengths, costs, np.random.default_rng(coins), policy=(choose, update, ps))
        ratios.append(rate / max(fixed))
        modes += rounds
    return ratios, modes


def main(argv=None):
    ap = _cli.parser("policy_sim.py", __doc__)
    ap.add_argument("--real-model", required=True, help="a bench/real_model.py JSON with the config's T=0 row")
    ap.add_argument("--config", default="eagle3-chain3", help="the row whose per-request accept lengths are drawn")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes")
    ap.add_argument("--costs", default="1:1.224,1.469,1.556;8:1.005,1.45,1.75;32:1.091,1.888,2.128",
                    help="per batch: ms per round of plain, chain (3,1,4), chain (7,1,8) ('B:p,c3,c7;...')")
    ap.add_argument("--calls", type=int, default=8, help="warm-started calls per seed")
    ap.add_argument("--seeds", type=int, default=3, help="seeds (requests, lengths and coins)")
    ap.add_argument("--min-new", type=int, default=32, help="shortest output")
    ap.add_argument("--max-new", type=int, default=256, help="longest output")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the policy's few scalar ops: no accelerator needed
    with open(args.real_model) as f:
        rows = json.load(f)["rows"]
    src = [r for r in rows if r.get("config") == args.config and "accept_per_request" in r
           and r.get("temperature", 0.0) == 0.0]
    if not src:
        raise SystemExit(f"--real-model: no T=0 row of {args.config!r} with accept_per_request")
    means = np.asarray(src[0]["accept_per_request"], np.float64)
    costs = {}
    for part in args.costs.split(";"):
        b, _, c = part.partition(":")
        costs[int(b)] = [float(x) for x in c.split(",")]
    out = []
    for b in (int(x) for x in args.batches.split(",") if x):
        if b not in costs or len(costs[b]) != len(SPECS):
            raise SystemExit(f"--costs: expected {len(SPECS)} costs for batch {b}, got {costs.get(b)}")
        ratios, modes = [], np.zeros(len(SPECS), int)
        for s in range(args.seeds):
            r, m = simulate(means, b, costs[b], calls=args.calls, seed=s, min_new=args.min_new, max_new=args.max_new)
            ratios += r
            modes += m
        row = dict(batch=b, costs_ms=costs[b], calls=len(ratios), mean_ratio=float(np.mean(ratios)),
                   worst_ratio=float(np.min(ratios)), mode_rounds=modes.tolist())
        print(f"batch {b:3d}: adaptive / best fixed mean {row['mean_ratio']:.3f}, worst call {row['worst_ratio']:.3f}; "
              f"rounds plain / chain 3 / chain 7 {row['mode_rounds']}", flush=True)
        out.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(config=args.config, source=args.real_model, rows=out), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
