"""Pick the lines that explain an XLA:GPU executable's structure out of an ``--xla_dump_to`` folder, small enough
to bring back: per module, its after-optimizations HLO's dynamic-slice fusions (``DynamicSliceFusion``: what keeps
a loop out of a command buffer) and async starts, each with its metadata (the jax function it came from), and
the thunk sequence's command-buffer / while / dynamic-slice structure.

Usage: ``python bench/hlo_grep.py DUMP_DIR [--module-re RE] > out.txt`` on the GPU machine, right after the dump
(``GPU_XLA_FLAGS_EXTRA="--xla_dump_to=DIR ..." bash bench/gpu_all.sh e2e``): the dump itself is too big to keep.
"""

import glob
import os
import re
import sys

import _cli

PATTERN = re.compile(r"dynamic_slice_fusion|dynamic-slice-fusion|address_computation|fusion-start|async-start|"
                     r"copy-start|DynamicSlice", re.IGNORECASE)
THUNKS = re.compile(r"kCommandBuffer|kWhile|kDynamicSliceFusion|kConditional")


def main(argv=None) -> int:
    ap = _cli.parser("hlo_grep.py", __doc__)
    ap.add_argument("dump_dir", help="the --xla_dump_to folder")
    ap.add_argument("--module-re", default=".*", help="only modules whose file name matches")
    args = ap.parse_args(argv)
    mod_re = re.compile(args.module_re)
    for path in sorted(glob.glob(os.path.join(args.dump_dir, "*after_optimizations.txt"))):
        if not mod_re.search(os.path.basename(path)):
            continue
        with open(path) as f:
            text = f.read()
        print(f"=== {os.path.basename(path)} ({len(text)} chars)")
        lines = text.splitlines()
        starts = {m.group(1): i for i, l in enumerate(lines) if (m := re.match(r"^%?([\w.\-]+) .*\{$", l))}
        for i, line in enumerate(lines):
            if PATTERN.search(line):
                print(f"{i}: {line.strip()[:900]}")
                called = re.search(r"calls=%?([\w.\-]+)", line)
                if called and called.group(1) in starts:  # the fused computation: what it slices
                    j = starts[called.group(1)]
                    for body in lines[j:j + 12]:
                        print(f"      {body.strip()[:300]}")
                        if body.startswith("}"):
                            break
        module = os.path.basename(path).split(".")[0]
        for p in glob.glob(os.path.join(args.dump_dir, f"{module}.*thunk_sequence_after_thunk_passes.txt"))[:1]:
            print(f"--- {os.path.basename(p)}")
            with open(p) as f:
                for j, line in enumerate(f):
                    if THUNKS.search(line):
                        print(f"{j}: {line.rstrip()[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
