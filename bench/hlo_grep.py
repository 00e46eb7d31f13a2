"""Pick the lines that explain an XLA:GPU executable's structure out of an ``--xla_dump_to`` folder, small enough
to bring back: per module, its after-optimizations HLO's dynamic-slice fusions (``DynamicSliceFusion``: what keeps
a loop out of a command buffer) and async starts, each with its metadata (the jax function it came from), and
the thunk sequence's command-buffer / while / dynamic-slice structure, and the loops the host drives: every
``while`` outside a command buffer, with what in its body and condition is not a command buffer (opcode, fusion
kind, custom-call target, the jax op it came from): what keeps that loop off the device.

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


_NOOPS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\s([a-z][a-z\-]*)\((.*)$")


def computations(text: str) -> dict:
    """``{name: [instruction line, ...]}`` of an HLO module's text (``ENTRY`` under its own name)."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m and not line.startswith(" "):
            name = m.group(1)
            out[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None and line.strip():
            out[name].append(line)
    return out


def _describe(line: str, opcode: str) -> str:
    kind = re.search(r'"kind":"(\w+)"', line) or re.search(r"kind=(\w+)", line)
    target = re.search(r'custom_call_target="([^"]+)"', line)
    op_name = re.search(r'op_name="([^"]+)"', line)
    return " ".join(x for x in (opcode, kind and f"kind={kind.group(1)}", target and f"target={target.group(1)}",
                                op_name and f"op_name={op_name.group(1)[-160:]}") if x)


def host_loops(text: str) -> list[str]:
    """Lines describing each ``while`` that is not inside a command buffer (a computation whose name starts with
    ``command_buffer``), and per loop the instructions of its body and condition that are neither no-ops nor
    calls of command buffers."""
    comps = computations(text)
    inside = set()  # computations reachable from a command buffer
    todo = [c for c in comps if c.startswith("command_buffer")]
    while todo:
        c = todo.pop()
        if c in inside or c not in comps:
            continue
        inside.add(c)
        for line in comps[c]:
            todo += re.findall(r"(?:condition|body|to_apply|calls|branch_computations=\{)=?%([\w.\-]+)", line)
    out = []
    for comp, lines in comps.items():
        if comp in inside:
            continue
        for line in lines:
            m = _INSTR.match(line)
            if not m or m.group(2) != "while":
                continue
            cond = re.search(r"condition=%([\w.\-]+)", line).group(1)
            body = re.search(r"body=%([\w.\-]+)", line).group(1)
            out.append(f"host-driven while {m.group(1)} (in {comp}): condition {cond}, body {body}")
            for part in (cond, body):
                graphs, other = 0, []
                for inner in comps.get(part, []):
                    im = _INSTR.match(inner)
                    if not im or im.group(2) in _NOOPS:
                        continue
                    if im.group(2) == "call" and re.search(r"to_apply=%command_buffer", inner):
                        graphs += 1
                    else:
                        other.append(_describe(inner, im.group(2)))
                out.append(f"  {part}: {graphs} command buffers, {len(other)} other instructions")
                out += [f"    {o[:400]}" for o in other]
    return out


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
        for line in host_loops(text):
            print(line)
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
