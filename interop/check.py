"""Side-by-side check of every jaxspec op against its original kernel: one table, non-zero exit on mismatch.

Usage::

    python -m jaxspec.interop.check [--device cpu|cuda] [--seed S] [--cases N] [--ops OP ...] [--max-configs K]

CPU (default) runs the original Triton kernels under the Triton interpreter (``TRITON_INTERPRET=1`` is
set here before any kernel file is loaded) and the jaxspec Pallas kernels with ``interpret=True``, plus
their jnp references. ``--device cuda`` runs both natively and adds SGLang 0.5.23's run-time-compiled
CUDA tree build (3 mask modes), greedy verify and target-only sampling (``interop/cuda_originals.py``;
needs ``python -m jaxspec.interop.fetch --cuda`` beforehand, nvcc and CUDA_HOME).

Each (op, config, implementation) row runs ``--cases`` random cases; ``mismatches`` counts the cases
with any differing output element (or an error). Ops whose jaxspec module is not importable yet are
listed as unavailable and do not fail the run. Most of the CPU time is JAX compilation (one per config
and implementation); the cases themselves are cheap.
"""

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxspec.interop.check", description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=3, help="random cases per (op, config, implementation)")
    ap.add_argument("--ops", nargs="*", default=None, help="restrict to these ops (default: all for the device)")
    ap.add_argument("--max-configs", type=int, default=None, help="use only the first K configs of each op")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the first failing report of each row")
    args = ap.parse_args(argv)

    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    from jaxspec.interop import harness, originals

    try:
        ops = harness.ops_for(args.device, args.ops)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    header = f"{'op':44s} {'config':44s} {'impl':17s} {'cases':>5s} {'mismatches':>10s}"
    print(header)
    print("-" * len(header))
    failed, unavailable, t0 = 0, [], time.time()
    for op in ops:
        ok, why = harness.available(op)
        if not ok:
            unavailable.append((op, why))
            print(f"{op:44s} {'-':44s} {'unavailable':17s} {0:5d} {'-':>10s}")
            continue
        try:
            rows = harness.run_cases(op, seed=args.seed, cases=args.cases, device=args.device,
                                     max_configs=args.max_configs)
        except originals.OriginalsMissing as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for config, label, cases, bad, first in rows:
            failed += bad
            print(f"{op:44s} {harness.OPS[op].label(config):44s} {label:17s} {cases:5d} {bad:10d}", flush=True)
            if bad and args.verbose:
                print("    " + first.replace("\n", "\n    "))
    print("-" * len(header))
    for op, why in unavailable:
        print(f"unavailable: {op} ({why})")
    status = "FAIL" if failed else "OK"
    print(f"{status}: {failed} mismatching case(s); device={args.device} seed={args.seed} "
          f"({time.time() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
