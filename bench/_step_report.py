"""bench/step.py's accounting and reporting: the step's bytes and physical floor, HLO scraping, the table.

Physical floor: the step's bytes (KV move ``2 * bs*(S+1) * layers * 2 * row_bytes`` plus the small index
arrays) over the device-to-device copy bandwidth measured in the same run (jnp and torch).
"""

import re

import numpy as np

from jaxspec.testing import PoolShape, StepInputs


def step_bytes(inp: StepInputs, pool: PoolShape) -> dict:
    """Bytes one step must read + write: the KV move plus every small input/output array once."""
    bs, S, K, N = inp.bs, inp.S, inp.K, inp.N
    moved = bs * (S + 1) if K > 1 else 0  # the move runs over bs*(S+1) (tgt, src) pairs, as upstream
    kv = 2 * moved * pool.layers * 2 * pool.row_bytes
    small_in = sum(x.size * 4 for x in inp.score_list + inp.token_list + inp.parents_list)
    small_in += 4 * (3 * bs + 2 * bs * N)  # bonus, seq_lens, req idx, window, target_predict
    small_in += 4 * bs * (N + K * S)  # req_to_token entries read
    small_out = 4 * bs * (N * N / 4 + 7 * N + 3 * (S + 1) + 4 + N + K * S)  # tree (mask as bytes), verify, locs
    return {"moved_locations": moved, "kv_bytes": kv, "total_bytes": int(kv + small_in + small_out)}


def while_loop_report(compiled_text: str) -> str:
    """How many HLO while loops the compiled step has and how many have a known trip count (XLA GPU
    evaluates the predicate of the others on the host: a device->host round trip per iteration)."""
    total = known = 0
    for line in compiled_text.splitlines():
        if re.search(r"\swhile\(", line):
            total += 1
            known += "known_trip_count" in line
    return f"{total} while loops ({known} with a known trip count)"


def count_pool_copies(compiled_text: str, pool: PoolShape) -> int:
    """Copy ops in the compiled HLO whose result has the pool's element count."""
    n_elems = pool.layers * pool.slots * pool.row_elems
    count = 0
    for line in compiled_text.splitlines():
        s = line.strip()
        if "=" not in s:
            continue
        lhs, rhs = s.split("=", 1)
        op = rhs.strip()
        # "%copy.3 = bf16[32,131072,8,128]{...} copy(%p)" / copy-start / fusion kinds named copy
        m = re.match(r"(bf16|s16|u16|f16)\[([0-9,]*)\]\S*\s+(copy|copy-start)\(", op)
        if m:
            dims = [int(d) for d in m.group(2).split(",") if d]
            if dims and int(np.prod(dims)) == n_elems:
                count += 1
    return count


def finish_rows(rows: list, bw: dict) -> None:
    gbps = max(bw.get("jax_gbps", 0.0), bw.get("torch_gbps", 0.0))
    for r in rows:
        r["floor_us"] = r["total_bytes"] / (gbps * 1e9) * 1e6 if gbps else None
        r["floor_effective_us"] = r["total_bytes_effective"] / (gbps * 1e9) * 1e6 if gbps else None
        ours_gpu = r["ours_gpu_us"] if r["ours_gpu_us"] is not None else r["ours_loop_us"]
        r["ratio_wall_vs_eager"] = r["ours_wall_us"] / r["orig_eager_wall_us"]
        r["ratio_gpu_vs_graph"] = ours_gpu / r["orig_graph_gpu_us"] if r["orig_graph_gpu_us"] else None
        r["ratio_loop_vs_graph"] = r["ours_loop_us"] / r["orig_graph_gpu_us"] if r["orig_graph_gpu_us"] else None
        r["ratio_vs_floor"] = ours_gpu / r["floor_us"] if r["floor_us"] else None


def _f(v, nd=1):
    if v is None:
        return "-"
    return f"{v:.{nd}f}"


COLUMNS = (  # (header, row key, decimals)
    ("bs", "bs", None),
    ("ours wall", "ours_wall_us", 1),
    ("ours GPU", "ours_gpu_us", 1),
    ("ours loop", "ours_loop_us", 1),
    ("orig eager wall", "orig_eager_wall_us", 1),
    ("orig eager GPU", "orig_eager_gpu_us", 1),
    ("orig graph GPU", "orig_graph_gpu_us", 1),
    ("wall/eager", "ratio_wall_vs_eager", 3),
    ("GPU/graph", "ratio_gpu_vs_graph", 3),
    ("loop/graph", "ratio_loop_vs_graph", 3),
    ("floor", "floor_us", 2),
    ("GPU/floor", "ratio_vs_floor", 2),
    ("floor eff", "floor_effective_us", 2),
    ("acc len", "mean_accept_len", 2),
)


def print_table(rows: list, bw: dict) -> None:
    print(f"\ndevice-to-device copy bandwidth (read+write): jnp {bw['jax_gbps']:.0f} GB/s, "
          f"torch {bw['torch_gbps']:.0f} GB/s (floor uses the larger)")
    widths = [max(8, len(h)) for h, _, _ in COLUMNS]
    for cfg in dict.fromkeys(r["config"] for r in rows):
        sub = [r for r in rows if r["config"] == cfg]
        r0 = sub[0]
        print(f"\n{cfg}: S={r0['S']} K={r0['K']} N={r0['N']}  -- us per step. ours GPU = kernel time per call "
              f"(CUPTI); ours loop = R steps in one jit / R; orig GPU = do_bench (eager) / do_bench of the graph "
              f"replay; floor = bytes (move over bs*(S+1) pairs) / copy BW; floor eff = only rows with tgt != src")
        print("  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths)))
        for r in sub:
            cells = [str(r[k]) if nd is None else _f(r.get(k), nd) for _, k, nd in COLUMNS]
            print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))
