"""Plot bench/step.py results: latency per step vs batch size (log-log), one panel per config.

Reads the JSON that `python bench/step.py --json RESULT.json` writes (bench/step.py --png calls plot()
directly). The y axis spans the measured series only; the physical floor (bytes / copy bandwidth) is
drawn where it falls inside that range, and a floor far below it is stated in the panel instead of
stretching the axis over decades.
"""

import json
import sys

import _cli

SERIES = (  # (row key, label, style)
    ("ours_wall_us", "jaxspec wall / call", dict(color="tab:blue", marker="o", ls="-")),
    ("ours_gpu_us", "jaxspec GPU kernels / call (CUPTI)", dict(color="tab:blue", marker="s", ls="--")),
    ("ours_loop_us", "jaxspec GPU / step (R steps in one jit)", dict(color="tab:cyan", marker="^", ls=":")),
    ("orig_eager_wall_us", "SGLang eager wall / step", dict(color="tab:red", marker="o", ls="-")),
    ("orig_eager_gpu_us", "SGLang eager GPU / step (do_bench)", dict(color="tab:red", marker="s", ls="--")),
    ("orig_graph_gpu_us", "SGLang CUDA graph GPU / replay", dict(color="tab:orange", marker="^", ls=":")),
    ("floor_us", "physical floor (bytes / copy BW)", dict(color="black", marker="", ls="-.")),
)


def plot(result: dict, path: str) -> list[tuple[float, float]]:
    """Write the figure to ``path``; returns each panel's y range (us)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(6.5 * len(configs), 4.8), squeeze=False)
    for ax, cfg in zip(axes[0], configs):
        sub = sorted((r for r in rows if r["config"] == cfg), key=lambda r: r["bs"])
        r0 = sub[0]
        measured = [r[k] for r in sub for k, _, _ in SERIES if k != "floor_us" and r.get(k) is not None and r[k] > 0]
        lo, hi = (min(measured) / 1.5, max(measured) * 1.5) if measured else (None, None)
        for key, label, style in SERIES:
            pts = [(r["bs"], r[key]) for r in sub if r.get(key) is not None and r[key] > 0]
            if key == "floor_us" and lo is not None and pts and max(y for _, y in pts) < lo:
                ax.text(0.02, 0.02, f"physical floor <= {max(y for _, y in pts):.2g} us (below this axis)",
                        transform=ax.transAxes, fontsize=7)
                continue
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if lo is not None:
            ax.set_ylim(lo, hi)  # the measured series decide the range; the floor is clipped to it
        ax.set_xticks([r["bs"] for r in sub])
        ax.set_xticklabels([str(r["bs"]) for r in sub])
        ax.set_xlabel("batch size")
        ax.set_ylabel("us per step")
        ax.set_title(f"{cfg}: S={r0['S']} K={r0['K']} N={r0['N']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    meta = result.get("meta", {})
    fig.suptitle(
        f"one speculative bookkeeping step, jaxspec vs SGLang 0.5.23 ({meta.get('gpu') or meta.get('device', '')})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [ax.get_ylim() for ax in axes[0]]


def main(argv=None) -> int:
    ap = _cli.parser("plot_step.py", __doc__)
    ap.add_argument("result", help="JSON written by `python bench/step.py --json RESULT.json`")
    ap.add_argument("out", help="PNG to write")
    args = ap.parse_args(argv)
    with open(args.result) as f:
        plot(json.load(f), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
