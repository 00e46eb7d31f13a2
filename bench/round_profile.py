"""Where a decoding round's GPU time goes, by kernel class: plain steps and speculative rounds side by side.

Reads the JSON of ``python bench/e2e.py --profile`` (each row's ``loop_profile.round_kernels``: the CUPTI kernel
sequence of one middle round of the decode loop, name and microseconds each), sorts every kernel into a class by
its name, and prints per (model, config, batch) row: microseconds per round per class, kernels per round per
class, and the round's cost in plain steps (its wall time over the plain row's at the same batch and context).
``--png``: one stacked bar per row, grouped by batch; ``--json``: the table.

    python bench/e2e.py --models smollm2 --batches 1,8,32 --configs plain,chain,tree16 --profile --json e2e.json
    python bench/round_profile.py e2e.json --png round_profile.png --json round_profile.json

Classes (kernel names as XLA:GPU, cuBLAS and Mosaic GPU emit them): gemm (Triton GEMM fusions, cuBLAS/nvjet),
attention (jaxspec's Mosaic GPU paged attention), top-k (XLA's top-k custom kernel), sort, softmax, reduce (norms,
argmax, any/all), data movement (pad, concatenate, transpose, slice, gather, scatter, dynamic-update-slice,
convert, copy) and other fusions (elementwise and the loop's own small kernels).
"""

import json
import sys

import _cli

CLASSES = ("gemm", "attention", "top-k", "sort", "softmax", "reduce", "data movement", "other fusions")
COLORS = dict(zip(CLASSES, ("tab:blue", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:orange",
                            "tab:gray")))
_MOVES = ("pad", "concatenate", "transpose", "slice", "gather", "scatter", "dynamic_update", "convert", "copy")


def kernel_class(name: str) -> str:
    """The class of a kernel, from its name."""
    n = name.lower()
    if "stream_executor" in n and "run" in n:  # xla/stream_executor/gpu top-k kernel: Run<K, KeyT, ValT>
        return "top-k"
    if "mosaic" in n or "attention" in n:
        return "attention"
    if any(t in n for t in ("gemm", "cublas", "nvjet", "cutlass", "xmma", "matmul")) or n.startswith("sm90_"):
        return "gemm"
    if n.startswith("sort"):
        return "sort"
    if "softmax" in n:
        return "softmax"
    if "reduce" in n:
        return "reduce"
    if any(t in n for t in _MOVES):
        return "data movement"
    return "other fusions"


def classify(round_kernels) -> dict:
    """``{class: {"us": ..., "kernels": ...}}`` of one round's ``[(name, us), ...]``."""
    out = {c: {"us": 0.0, "kernels": 0} for c in CLASSES}
    for name, us in round_kernels:
        c = out[kernel_class(name)]
        c["us"] += us
        c["kernels"] += 1
    return out


def table(result: dict) -> list[dict]:
    """One entry per profiled row: classes, totals, and the round's cost in plain steps."""
    # e2e.py profiles a speculative row's loop at simulated mean 3.0 and attaches it to each setting's row: keep that
    # one (plain rows have the one setting "-")
    rows = [r for r in result["rows"] if r.get("loop_profile", {}).get("round_kernels")
            and r["sim"] in ("-", "engine sim mean 3.0")]
    plain = {(r["model"], r["batch"], r["context"]): r["ms_round"] for r in rows if r["config"] == "plain"}
    out = []
    for r in rows:
        p = r["loop_profile"]
        cls = classify(p["round_kernels"])
        base = plain.get((r["model"], r["batch"], r["context"]))
        out.append(dict(model=r["model"], config=r["config"], draft_vocab=r.get("draft_vocab", 0), batch=r["batch"],
                        context=r["context"], sim=r["sim"], accept=r["accept"], ms_round=r["ms_round"],
                        plain_steps=None if base is None else r["ms_round"] / base,
                        kernels=sum(c["kernels"] for c in cls.values()),
                        kernel_us=sum(c["us"] for c in cls.values()), classes=cls))
    return out


def print_table(entries: list[dict]) -> None:
    head = f"{'model':<8} {'config':<14} {'batch':>5} {'ms/round':>8} {'x plain':>7} {'kernels':>7}  " + "  ".join(
        f"{c:>13}" for c in CLASSES)
    print("us per round (kernels per round) by class\n" + head)
    for e in entries:
        xp = "-" if e["plain_steps"] is None else f"{e['plain_steps']:.2f}"
        cells = "  ".join(f"{e['classes'][c]['us']:>7.0f} ({e['classes'][c]['kernels']:>3})" for c in CLASSES)
        print(f"{e['model']:<8} {e['config']:<14} {e['batch']:>5} {e['ms_round']:>8.3f} {xp:>7} {e['kernels']:>7}  {cells}")


def plot(entries: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({e["batch"] for e in entries})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 4.6), squeeze=False, sharey=False)
    for ax, b in zip(axes[0], batches):
        sub = [e for e in entries if e["batch"] == b]
        for i, e in enumerate(sub):
            bottom = 0.0
            for c in CLASSES:
                us = e["classes"][c]["us"]
                ax.bar(i, us, bottom=bottom, color=COLORS[c], label=c if i == 0 else None, width=0.7)
                bottom += us
            xp = "" if e["plain_steps"] is None else f"{e['plain_steps']:.2f}x plain\n"
            ax.text(i, bottom, f"{xp}{e['kernels']} kernels", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(sub)), [e["config"] for e in sub], fontsize=8)
        ax.set_title(f"batch {b}", fontsize=10)
        ax.set_ylabel("GPU us per round (CUPTI)")
        ax.margins(y=0.18)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(CLASSES))
    m = entries[0]
    fig.suptitle(f"{m['model']}: one decode round's kernels by class (context {m['context']})", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = _cli.parser("round_profile.py", __doc__)
    ap.add_argument("result", help="bench/e2e.py --profile JSON")
    ap.add_argument("--png", default=None, help="write the stacked bar plot here")
    ap.add_argument("--json", default=None, help="write the table here")
    args = ap.parse_args(argv)
    with open(args.result) as f:
        entries = table(json.load(f))
    if not entries:
        print(f"{args.result}: no row carries a loop profile (run bench/e2e.py with --profile on a GPU)",
              file=sys.stderr)
        return 1
    print_table(entries)
    if args.png:
        plot(entries, args.png)
        print(f"wrote {args.png}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(entries, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
