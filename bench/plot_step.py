"""Plot bench/step.py results: latency per step vs batch size (log-log), one panel per config.

Usage: ``python bench/plot_step.py RESULT.json OUT.png`` (``bench/step.py --png`` calls :func:`plot`).
"""

import json
import sys

SERIES = (  # (row key, label, style)
    ("ours_wall_us", "jaxspec wall / call", dict(color="tab:blue", marker="o", ls="-")),
    ("ours_gpu_us", "jaxspec GPU kernels / call (CUPTI)", dict(color="tab:blue", marker="s", ls="--")),
    ("ours_loop_us", "jaxspec GPU / step (R steps in one jit)", dict(color="tab:cyan", marker="^", ls=":")),
    ("orig_eager_wall_us", "SGLang eager wall / step", dict(color="tab:red", marker="o", ls="-")),
    ("orig_eager_gpu_us", "SGLang eager GPU / step (do_bench)", dict(color="tab:red", marker="s", ls="--")),
    ("orig_graph_gpu_us", "SGLang CUDA graph GPU / replay", dict(color="tab:orange", marker="^", ls=":")),
    ("floor_us", "physical floor (bytes / copy BW)", dict(color="black", marker="", ls="-.")),
)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(configs), figsize=(6.5 * len(configs), 4.8), squeeze=False)
    for ax, cfg in zip(axes[0], configs):
        sub = sorted((r for r in rows if r["config"] == cfg), key=lambda r: r["bs"])
        r0 = sub[0]
        for key, label, style in SERIES:
            pts = [(r["bs"], r[key]) for r in sub if r.get(key) is not None and r[key] > 0]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
