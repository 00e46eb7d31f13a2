"""Side-by-side check of every jaxspec op against its original kernel: one table, non-zero exit on mismatch.

CPU (default) runs the original Triton kernels under the Triton interpreter (TRITON_INTERPRET=1 is set
here before any kernel file is loaded) and the jaxspec Pallas kernels in interpret mode, plus their jnp
references. --device cuda runs both natively and adds SGLang 0.5.23's run-time-compiled CUDA tree build
(3 mask modes), greedy verify and target-only sampling (needs `python -m jaxspec.interop.fetch --cuda`
beforehand, nvcc and CUDA_HOME).

Each (op, config, implementation) row runs --cases random cases; "mismatches" counts the cases with any
differing output element (or an error raised by it). An original that cannot run here (not fetched, or modified
on disk) stops the check with exit 2 and says why (for a missing file, the fetch command). Inputs in a documented
known-difference class (e.g. exact score ties for select_top_k_tokens, where torch's top-k order is
implementation-defined) are counted in the "known" column as "differing/cases [class]" and explained under the
table; they do not fail the run.
Most of the CPU time is JAX compilation (one per config and implementation); the cases are cheap.
"""

import argparse
import os
import sys
import time

from tqdm import tqdm

from jaxspec.cli_help import DocHelpFormatter, parser


def _parser() -> argparse.ArgumentParser:
    ap = parser("jaxspec.interop.check", __doc__, formatter=DocHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: Triton interpreter + Pallas interpret mode; cuda: native kernels and the CUDA originals")
    ap.add_argument("--seed", type=int, default=0, help="base seed of the random cases")
    ap.add_argument("--cases", type=int, default=3, help="random cases per (op, config, implementation)")
    ap.add_argument("--ops", nargs="*", default=None, metavar="OP",
                    help="restrict to these ops (default: every op registered for the device)")
    ap.add_argument("--max-configs", type=int, default=None, metavar="K", help="use only the first K configs of each op")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the first failing report of each row")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    from jaxspec.interop import harness, originals, pins

    try:
        ops = harness.ops_for(args.device, args.ops)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(len(harness.OPS[op].configs[: args.max_configs]) * len(harness.implementations(op, args.device))
                for op in ops) * args.cases
    header = f"{'op':44s} {'config':44s} {'impl':17s} {'cases':>5s} {'mismatches':>10s}  known"
    print(header)
    print("-" * len(header))
    failed, seen_classes, t0 = 0, {}, time.time()
    bar = tqdm(total=total, unit="case", desc="side by side", disable=not sys.stderr.isatty(), leave=False)
    try:
        for op in ops:
            try:
                rows = harness.run_cases(op, seed=args.seed, cases=args.cases, device=args.device,
                                         max_configs=args.max_configs, progress=lambda: bar.update(1))
            except (originals.OriginalsMissing, pins.PinMismatch) as e:
                bar.close()
                print(f"error: {e}", file=sys.stderr)
                return 2
            for row in rows:
                failed += row.mismatches
                known = "-"
                if row.known_class is not None:
                    known = f"{row.known_differing}/{row.known} [{row.known_class}]"
                    seen_classes[(op, row.known_class)] = harness.OPS[op].known_differences[row.known_class]
                line = (f"{op:44s} {harness.OPS[op].label(row.config):44s} {row.implementation:17s} "
                        f"{row.cases:5d} {row.mismatches:10d}  {known}")
                tqdm.write(line)  # above the bar when there is one
                if row.mismatches and args.verbose:
                    tqdm.write("    " + row.first_failure.replace("\n", "\n    "))
    finally:
        bar.close()
    print("-" * len(header))
    for (op, name), why in seen_classes.items():
        print(f"known difference {op} [{name}]: {why}")
    status = "FAIL" if failed else "OK"
    print(f"{status}: {failed} mismatching case(s); device={args.device} seed={args.seed} "
          f"({time.time() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
