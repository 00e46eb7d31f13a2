"""Adaptive speculation's policy (``jaxspec.engine.policy``) replayed offline against the fixed modes it chooses from.

``python bench/policy_sim.py --real-model real_model.json [--modes eagle3-chain3:3,eagle3-chain3:3:7]
[--batches 1,8,32] [--costs "1:1.224,1.469,1.556;8:1.005,1.45,1.75;32:1.091,1.888,2.128"] [--calls 8] [--seeds 3]
[--ramp F:T] [--json PATH]``

The modes besides plain decoding (``--modes``, each ``CONFIG:D[:S]``): a request accepts as it did in ``CONFIG``'s
T=0 acceptance row of a ``bench/real_model.py`` JSON (the per-request mean accept lengths, ``accept_per_request``;
the rows list the same prompts in the same order), whose drafts were ``D`` deep: its mean ``L`` becomes a per-draft
acceptance ``a`` (``1 + a + .. + a**D = L``), and a round of the mode drafts ``S`` deep (default ``D``), yielding
``1 + (drafts accepted in a row)``, capped by what the request has left. The default is ``real_model.py``'s
``eagle3-adaptive``: chain (3,1,4) and chain (7,1,8), both from the chain of 3's row; ``eagle3-chain3:3,
eagle3-tree:5`` is its ``eagle3-adaptive-tree`` (plain, chain 3, tree (5,4,16), the tree's acceptance modelled as
a chain's of the same depth and mean). Each simulated decode call draws ``B`` requests (prompt indices) and an
output length per request uniform in ``[--min-new, --max-new]``. A round of each mode costs ``--costs``' milliseconds for the batch bucket (plain first, then
the modes in order; ``Engine.calibrate``'s figures, e.g. ``real_model.json``'s ``round_costs_ms``). The policy runs on the jitted
``choose_mode`` / ``update_policy`` of the library, warm-started from call to call as ``Engine.policy_memory``
does; each fixed mode runs the same requests with the same coins. Output per batch: adaptive tokens per ms over
the call's best fixed mode's, mean and worst call over ``--calls`` x ``--seeds`` (an oracle that knows each call's
requests); the workload ratio: adaptive's tokens per ms over all calls together against the best single fixed mode's
(the comparison a user makes, who picks one config for the workload); and the rounds per mode. It isolates the
policy's choices from the GPU.

Acceptance within a reply: constant by default. ``--ramp F:T`` makes it rise along the reply, as a trained head's
does (it agrees least with the target in a reply's first tokens): at output position ``p`` a request's per-draft
acceptance is ``a * (F + (1 - F) * min(1, p / T)) / r``, ``r`` that factor's mean over the request's own output
(capped at 0.999), so the reply's mean per-draft acceptance stays ``a`` while its first rounds draw less; every
mode and the policy see the same ramp.
"""

import json
import os

import _cli
import numpy as np

DEFAULT_MODES = "eagle3-chain3:3,eagle3-chain3:3:7"  # real_model.py's eagle3-adaptive: chain (3,1,4), chain (7,1,8)


def chain_alpha(mean: float, steps: int = 3) -> float:
    """The per-draft acceptance ``a`` of a chain of ``steps`` drafts whose mean accept length is ``mean``."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a**k for k in range(steps + 1)) < mean else (lo, a)
    return (lo + hi) / 2


def ramp_factor(lengths, ramp):
    """``pos -> f[B]``: the per-draft acceptance factor at output positions ``pos i[B]`` of requests of ``lengths``
    under ``ramp = (F, T)`` (module docstring; ``None``: 1); each request's mean over its output is computed once."""
    if ramp is None:
        return lambda pos: np.ones(len(pos))
    f, t = ramp

    def shape(p):
        return f + (1 - f) * np.minimum(1.0, p / t)

    mean = np.array([shape(np.arange(n)).mean() for n in lengths])
    return lambda pos: shape(np.asarray(pos, np.float64)) / mean


def one_call(alpha, steps, lengths, costs, rng, mode=None, policy=None, ramp=None):
    """One decode call over requests with per-draft acceptance ``alpha [modes, B]`` (row 0, plain, unused) in modes
    of depth ``steps`` (0 for plain) and output ``lengths``: a fixed ``mode``, or ``policy = (choose, update,
    state)``; ``ramp``: acceptance rising along a reply (``ramp_factor``). Returns ``(tokens per ms, rounds per
    mode, final policy state)``."""
    import jax.numpy as jnp

    left = lengths.copy()
    b = len(left)
    tokens = spent = 0.0
    rounds = [0] * len(costs)
    ps = None if policy is None else policy[2]
    factor = ramp_factor(lengths, ramp)
    while (left > 0).any():
        m = mode if policy is None else int(policy[0](ps))
        running = left > 0
        accept = np.ones(b)
        alive = np.ones(b, bool)
        a = np.minimum(alpha[m] * factor(lengths - left), 0.999)
        for _ in range(steps[m]):
            alive &= rng.random(b) < a
            accept += alive
        accept = np.minimum(accept, left) * running
        left -= accept.astype(int)
        tokens, spent = tokens + accept.sum(), spent + costs[m]
        rounds[m] += 1
        if policy is not None:
            n = int(running.sum())
            ps = policy[1](ps, jnp.int32(m), jnp.float32(accept[running].mean()), jnp.int32(n))
    return tokens, spent, rounds, ps


def simulate(means, depths, steps, batch, costs, *, calls, seed, min_new, max_new, policy=None, same=False,
             ramp=None):
    """``calls`` warm-started calls at ``batch`` (``means [modes, P]``: each mode's per-request mean accept lengths
    measured ``depths`` deep; row 0 plain's, unused): per call adaptive / the call's best fixed mode, the rounds per
    mode, and the tokens and milliseconds of all calls together (``[adaptive, mode 0, mode 1, ...]``). ``same``:
    every call decodes the first ``batch`` prompts with the same lengths (as ``real_model.py``'s timed calls do).
    ``policy``: the ``AdaptivePolicy`` replayed (default settings when None); ``ramp``: ``one_call``'s."""
    import jax

    from jaxspec.engine.policy import AdaptivePolicy, choose_mode, init_policy_state, update_policy

    pol = AdaptivePolicy() if policy is None else policy
    choose = jax.jit(lambda ps: choose_mode(pol, ps))
    update = jax.jit(lambda ps, m, a, n: update_policy(pol, ps, m, a, n))
    rng = np.random.default_rng(seed)
    learned, ratios, modes = None, [], np.zeros(len(costs), int)
    tokens, spent = np.zeros(len(costs) + 1), np.zeros(len(costs) + 1)
    for c in range(calls):
        req = np.arange(batch) % means.shape[1] if same else rng.integers(0, means.shape[1], batch)
        alpha = np.array([[chain_alpha(means[m, r], d) if d else 0.0 for r in req] for m, d in enumerate(depths)])
        if not same or c == 0:
            lengths = rng.integers(min_new, max_new + 1, batch)
        coins = seed * 1000 + c  # the same coins for every mode and the policy
        fixed = [one_call(alpha, steps, lengths, costs, np.random.default_rng(coins), mode=m, ramp=ramp)[:2]
                 for m in range(len(costs))]
        ps = init_policy_state(costs, [1.0 + s for s in steps], learned)
        tok, ms, rounds, learned = one_call(alpha, steps, lengths, costs, np.random.default_rng(coins),
                                            policy=(choose, update, ps), ramp=ramp)
        ratios.append((tok / ms) / max(t / s for t, s in fixed))
        modes += rounds
        tokens += [tok] + [t for t, _ in fixed]
        spent += [ms] + [s for _, s in fixed]
    return ratios, modes, tokens, spent


def main(argv=None):
    ap = _cli.parser("policy_sim.py", __doc__)
    ap.add_argument("--real-model", required=True, help="a bench/real_model.py JSON with the config's T=0 row")
    ap.add_argument("--modes", default=DEFAULT_MODES,
                    help="comma list of CONFIG:D[:S], the modes besides plain (CONFIG's T=0 accept lengths, measured D "
                         "drafts deep; the mode drafts S deep, default D)")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes")
    ap.add_argument("--costs", default="1:1.224,1.469,1.556;8:1.005,1.45,1.75;32:1.091,1.888,2.128",
                    help="per batch: ms per round of plain, then of each mode ('B:p,m1,m2;...')")
    ap.add_argument("--calls", type=int, default=8, help="warm-started calls per seed")
    ap.add_argument("--seeds", type=int, default=3, help="seeds (requests, lengths and coins)")
    ap.add_argument("--min-new", type=int, default=32, help="shortest output")
    ap.add_argument("--max-new", type=int, default=256, help="longest output")
    ap.add_argument("--same-requests", action="store_true",
                    help="every call decodes the first B prompts with the same lengths (real_model.py's timed calls)")
    ap.add_argument("--policy", default="", help="AdaptivePolicy settings, e.g. 'probe_interval=128,probe_requests=8'")
    ap.add_argument("--ramp", default=None,
                    help="F:T: acceptance rising along a reply, factor F at its first token to 1 at token T (docstring)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    policy, fields = {}, ("ema_weight", "probe_interval", "probe_rounds", "probe_requests")
    for kv in (x for x in args.policy.split(",") if x):
        k, _, v = kv.partition("=")
        if k not in fields:
            raise SystemExit(f"--policy: expected KEY=VALUE with KEY one of {fields}, got {kv!r}")
        try:
            policy[k] = float(v) if k == "ema_weight" else int(v)
        except ValueError:
            raise SystemExit(f"--policy: expected {k}=a number, got {kv!r}") from None
    ramp = None
    if args.ramp is not None:
        try:
            f, t = (float(x) for x in args.ramp.split(":"))
        except ValueError:
            raise SystemExit(f"--ramp: expected F:T, got {args.ramp!r}") from None
        if not 0.0 < f <= 1.0 or not t >= 1.0:
            raise SystemExit(f"--ramp: expected F in (0, 1] and T >= 1, got {args.ramp!r}")
        ramp = (f, t)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the policy's few scalar ops: no accelerator needed
    from jaxspec.engine.policy import AdaptivePolicy

    try:
        pol = AdaptivePolicy(**policy)
    except ValueError as e:
        raise SystemExit(f"--policy: {e}") from None
    with open(args.real_model) as f:
        rows = json.load(f)["rows"]
    modes = [m.split(":") for m in args.modes.split(",") if m]
    if not modes or any(len(m) not in (2, 3) or not all(x.isdigit() and int(x) >= 1 for x in m[1:]) for m in modes):
        raise SystemExit(f"--modes: expected a comma list of CONFIG:D[:S] (D, S >= 1), got {args.modes!r}")
    depths = [0] + [int(m[1]) for m in modes]
    steps = [0] + [int(m[-1]) for m in modes]
    per = []
    for name, *_ in modes:
        src = [r for r in rows if r.get("config") == name and "accept_per_request" in r
               and r.get("temperature", 0.0) == 0.0]
        if not src:
            raise SystemExit(f"--real-model: no T=0 row of {name!r} with accept_per_request")
        per.append(np.asarray(src[0]["accept_per_request"], np.float64))
    if len({p.size for p in per}) != 1:
        raise SystemExit(f"--real-model: the modes' rows hold different request counts {[p.size for p in per]}")
    means = np.stack([np.ones_like(per[0])] + per)
    costs = {}
    for part in args.costs.split(";"):
        b, _, c = part.partition(":")
        costs[int(b)] = [float(x) for x in c.split(",")]
    out = []
    for b in (int(x) for x in args.batches.split(",") if x):
        if b not in costs or len(costs[b]) != len(steps):
            raise SystemExit(f"--costs: expected {len(steps)} costs for batch {b}, got {costs.get(b)}")
        ratios, rounds = [], np.zeros(len(steps), int)
        tokens, spent = np.zeros(len(steps) + 1), np.zeros(len(steps) + 1)
        for s in range(args.seeds):
            r, m, t, ms = simulate(means, depths, steps, b, costs[b], calls=args.calls, seed=s, min_new=args.min_new,
                                   max_new=args.max_new, policy=pol, same=args.same_requests, ramp=ramp)
            ratios += r
            rounds += m
            tokens += t
            spent += ms
        rates = tokens / spent
        row = dict(batch=b, costs_ms=costs[b], calls=len(ratios), mean_ratio=float(np.mean(ratios)),
                   worst_ratio=float(np.min(ratios)), workload_ratio=float(rates[0] / rates[1:].max()),
                   best_fixed_mode=int(np.argmax(rates[1:])), mode_rounds=rounds.tolist())
        print(f"batch {b:3d}: adaptive / best fixed mean {row['mean_ratio']:.3f}, worst call {row['worst_ratio']:.3f}; "
              f"workload {row['workload_ratio']:.3f} of mode {row['best_fixed_mode']}; "
              f"rounds plain / {' / '.join(args.modes.split(','))} {row['mode_rounds']}", flush=True)
        out.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(modes=args.modes, policy=policy, ramp=args.ramp, source=args.real_model, rows=out), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
