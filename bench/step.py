"""One speculative "bookkeeping" step, jaxspec (one jit) vs the original SGLang 0.5.23 torch/Triton pipeline.

What one step is (model forwards left out), given per-request draft score/token/parent lists (produced
once up front, as ``select_top_k_tokens`` would), ``seq_lens``, ``req_to_token``, the verify
``out_cache_loc`` window, ``target_predict`` and the KV pool:

    organize draft results -> build tree (QLEN_ONLY) -> greedy verify -> bonus tokens
    -> accept (K > 1 only, as upstream: fill_accept_out_cache_loc src, fill_front_out_cache_loc tgt
       (0.5.23: the verify window front), KV move of all layers)
    -> next-step cache locations (new_seq_lens = seq_lens + accept_lens; next verify window
       req_to_token[req, new_seq_lens + 0..N-1]; next draft slots req_to_token[req, new_seq_lens + 0..K*S-1]).

jaxspec side: ONE jitted function per step, KV pool donated: the public round (``jaxspec.pipeline.plan_verify``
-> ``commit``, the same composition the engine runs) plus the next round's cache locations. Timed as wall per call from a Python loop (one
``block_until_ready`` at the end), as GPU kernel time per call (CUPTI, when jax's Mosaic GPU profiler
extension is present) and as R steps inside one jit (``lax.fori_loop``) divided by R.

Original side: ``jaxspec.interop.original_step.OriginalStep`` (SGLang 0.5.23 as its CUDA worker runs it;
files from ``python -m jaxspec.interop.fetch``). Timed eagerly (wall per step in a Python loop; GPU time
with ``triton.testing.do_bench``) and captured once in a ``torch.cuda.CUDAGraph`` (``do_bench`` of
``replay``).

Both run on the same inputs in the same process and every output is compared exactly (tree arrays,
predict, accept_index, accept_lens, bonus, new_seq_lens, move src/tgt, the whole KV pool bit-exact,
next cache locations) before anything is timed; a mismatch raises.

Physical floor (``bench/_step_report.py``): the step's bytes over the device-to-device copy bandwidth
measured in the same run. Inputs: ``jaxspec.testing.make_step_inputs``; timing helpers: ``bench/_timing.py``.

CLI: ``python bench/step.py --help``. ``--device cpu`` runs tiny pools under the Triton interpreter and
Pallas interpret mode (the smoke-test path; timings there are meaningless). The step's inputs go in as
two packed buffers (``PackedStep``; ``--no-pack`` passes the ~25 arrays).
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import _cli
import _timing
import plot_step
from _step_report import count_pool_copies, finish_rows, print_table, step_bytes, while_loop_report
from jaxspec.config import SpecConfig
from jaxspec.interop.original_step import OriginalStep, compare_outputs, compare_pools, jax_pool_from_torch, to_numpy
from jaxspec.kernels import cache_locs as kcl
from jaxspec import pipeline
from jaxspec.ops import draft
from jaxspec.protocols import PagedKVCache
from jaxspec.testing import PoolShape, StepInputs, make_step_inputs

CONFIGS = {"tree": (5, 4, 8), "chain": (3, 1, 4)}  # (S, K, N): SGLang's Llama / DeepSeek defaults

GPU_POOL = PoolShape(layers=32, kv_heads=8, head_dim=128, slots=2**17)  # 17.2 GB per copy
CPU_POOL = PoolShape(layers=2, kv_heads=2, head_dim=64, slots=2**11)


@dataclasses.dataclass(frozen=True)
class Reps:
    wall_calls: int  # Python-loop calls timed for wall per step
    loop_steps: int  # R: steps inside one jit (fori_loop)
    bench_ms: int  # do_bench rep budget (ms)


FULL_REPS = Reps(wall_calls=200, loop_steps=200, bench_ms=100)
QUICK_REPS = Reps(wall_calls=50, loop_steps=50, bench_ms=30)
CPU_REPS = Reps(wall_calls=2, loop_steps=2, bench_ms=0)


# XLA GPU command buffers (CUDA graphs) for the whole step, while loops included: XLA otherwise launches
# each of the step's ~60 kernels from the host (tens of us of dispatch at bs 1). Opt-in: --command-buffers.
COMMAND_BUFFER_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"

def configure(device: str, command_buffers: bool = False) -> None:
    """Set the environment for ``device`` before the first JAX computation or original kernel load."""
    if command_buffers:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + COMMAND_BUFFER_FLAGS).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        jax.config.update("jax_platforms", "cpu")
    if device == "cuda" and jax.default_backend() != "gpu":
        raise RuntimeError(f"--device cuda: jax sees no GPU (default backend {jax.default_backend()!r})")


# --------------------------------------------------------------------------------------------------
# the jaxspec step: one jit, pool donated


def jax_inputs(inp: StepInputs) -> dict:
    i32 = lambda x: jnp.asarray(np.asarray(x).astype(np.int32))  # noqa: E731 - values fit (checked ranges)
    return dict(
        score_list=[jnp.asarray(x) for x in inp.score_list], token_list=[i32(x) for x in inp.token_list],
        parents_list=[i32(x) for x in inp.parents_list], chain_draft_tokens=i32(inp.chain_draft_tokens),
        bonus_tokens=i32(inp.bonus_tokens), seq_lens=i32(inp.seq_lens), req_pool_indices=i32(inp.req_pool_indices),
        req_to_token=i32(inp.req_to_token), out_cache_loc=i32(inp.out_cache_loc), target_predict=i32(inp.target_predict),
    )


STAGES = ("plan", "commit", "locs")  # prefixes of the step, for --breakdown


def make_jax_step(S: int, K: int, N: int, interpret: bool, upto: str = "locs"):
    """``step(k_pool, v_pool, inputs) -> (k_pool, v_pool, outputs)``: one round's bookkeeping exactly as
    ``jaxspec.pipeline`` composes it for every caller (``plan_verify`` -> [target forward, here replaced by the
    given ``target_predict``] -> ``commit``), plus the next round's cache locations that SGLang's step also
    computes. Traceable, no host syncs. The accepted path's KV moves with ``move_accept_tokens_to_target_kvcache``
    (the pairs of 0.5.23's ``fill_front/fill_accept_out_cache_loc`` laid out request-aligned, fully parallel;
    ``make_move_pairs`` checks those pairs against the original's separately)."""
    cfg = SpecConfig(num_steps=S, topk=K, num_draft_tokens=N)
    kern = dict(implementation="pallas", interpret=True) if interpret else {}

    def step(k_pool, v_pool, x):
        if K > 1:
            d = draft.organize_draft_results(x["score_list"], x["token_list"], x["parents_list"], num_draft_tokens=N)
        else:
            d = x["chain_draft_tokens"]
        plan = pipeline.plan_verify(cfg, x["bonus_tokens"], d, x["seq_lens"], x["req_to_token"], page_size=1,
                               req_pool_indices=x["req_pool_indices"], **kern)
        tr = plan.tree
        out = dict(
            tree_mask=tr.tree_mask, positions=tr.positions, retrieve_index=tr.retrieve_index,
            retrieve_next_token=tr.retrieve_next_token, retrieve_next_sibling=tr.retrieve_next_sibling,
            draft_tokens=tr.draft_tokens,
        )
        if upto == "plan":
            return k_pool, v_pool, out
        cache = PagedKVCache(k=k_pool, v=v_pool, req_to_token=x["req_to_token"])
        c = pipeline.commit(cfg, plan, cache, pipeline.VerifyGreedyPredict(x["target_predict"]), **kern)
        k_pool, v_pool = c.cache.k, c.cache.v
        out.update(predict=c.predict, accept_index=c.accept_index, accept_lens=c.accept_lens,
                   bonus_tokens=c.bonus, new_seq_lens=c.seq_lens)
        if upto == "commit":
            return k_pool, v_pool, out
        out["next_out_cache_loc"] = kcl.assign_extend_cache_locs_uniform(
            x["req_pool_indices"], x["req_to_token"], c.seq_lens, width=N, **kern
        ).out_cache_loc
        out["next_draft_cache_loc"] = kcl.assign_draft_cache_locs(
            x["req_pool_indices"], x["req_to_token"], c.seq_lens, topk=K, num_steps=S, **kern
        ).out_cache_loc
        return k_pool, v_pool, out

    return step


def _move_pairs(S: int, kern: dict, accept_index, accept_lens, out_cache_loc) -> dict:
    """SGLang 0.5.23's packed move pairs: targets from ``fill_front_out_cache_loc``, sources from
    ``fill_accept_out_cache_loc``."""
    tgt = kcl.fill_front_out_cache_loc(accept_lens, out_cache_loc, width=S + 1, **kern)
    src = kcl.fill_accept_out_cache_loc(accept_index, out_cache_loc, **kern)
    return dict(move_tgt=tgt, move_src=src)


def make_move_pairs(S: int, interpret: bool):
    """jaxspec's 0.5.23 move pairs (tgt, src) as one jitted function, checked against the original's (not part
    of the timed step, whose accept move builds the same pairs request-aligned)."""
    kern = dict(interpret=True) if interpret else {}
    return jax.jit(lambda accept_index, accept_lens, out_cache_loc: _move_pairs(
        S, kern, accept_index, accept_lens, out_cache_loc))


def _perturb(x: dict, token):
    """Make the step's inputs depend on the previous iteration (``token`` is always True at run time)
    so XLA cannot hoist loop-invariant work out of the in-jit timing loop."""
    y = dict(x)
    y["seq_lens"] = jnp.where(token, x["seq_lens"], jnp.zeros_like(x["seq_lens"]))
    y["score_list"] = [jnp.where(token, s, jnp.zeros_like(s)) for s in x["score_list"]]
    y["chain_draft_tokens"] = jnp.where(token, x["chain_draft_tokens"], jnp.zeros_like(x["chain_draft_tokens"]))
    y["target_predict"] = jnp.where(token, x["target_predict"], jnp.zeros_like(x["target_predict"]))
    return y


class PackedStep:
    """The step with its ~25 small input arrays packed into one int32 and one float32 buffer (static slices
    inside the jit, free for XLA). jit's per-call dispatch cost grows with the number of argument buffers
    (a few us each), which at small batch is much of the wall time of a ~15-60-kernel step. Outputs stay a
    dict: packing them too (concatenate, or dynamic_update_slice into one buffer) made XLA's CPU compile of
    the tree step take minutes (jax 0.10.2), a risk not worth taking untested on the GPU compiler."""

    def __init__(self, step, x_example: dict):
        leaves, self.in_tree = jax.tree_util.tree_flatten(x_example)
        self.in_layout = []  # (kind, offset, shape)
        off = {"i": 0, "f": 0}
        for leaf in leaves:
            kind = "f" if jnp.issubdtype(leaf.dtype, jnp.floating) else "i"
            self.in_layout.append((kind, off[kind], leaf.shape))
            off[kind] += leaf.size
        self.step = step

        def packed(k_pool, v_pool, ints, floats):
            leaves = []
            for kind, o, shape in self.in_layout:
                buf = floats if kind == "f" else ints
                leaves.append(jax.lax.slice(buf, (o,), (o + math.prod(shape),)).reshape(shape))
            return step(k_pool, v_pool, jax.tree_util.tree_unflatten(self.in_tree, leaves))

        self.jit = jax.jit(packed, donate_argnums=(0, 1))

    def pack(self, x: dict):
        leaves = jax.tree_util.tree_leaves(x)
        ints = [np.asarray(l).reshape(-1) for l, (k, _, _) in zip(leaves, self.in_layout) if k == "i"]
        floats = [np.asarray(l).reshape(-1) for l, (k, _, _) in zip(leaves, self.in_layout) if k == "f"]
        return (jnp.asarray(np.concatenate(ints).astype(np.int32)),
                jnp.asarray(np.concatenate(floats).astype(np.float32) if floats else np.zeros((0,), np.float32)))

    @staticmethod
    def unpack(out) -> dict:
        return {name: np.asarray(v) for name, v in out.items()}


def make_jax_loop(step, steps: int):
    """R steps in one jit: carry (pool, outputs); each step's inputs depend on the previous outputs."""

    def loop(k_pool, v_pool, x, out0):
        def body(_, carry):
            k_pool, v_pool, out = carry
            token = (out["accept_lens"][0] > 0) if "accept_lens" in out else (out["positions"][0] >= 0)
            return step(k_pool, v_pool, _perturb(x, token))

        return jax.lax.fori_loop(0, steps, body, (k_pool, v_pool, out0))

    return jax.jit(loop, donate_argnums=(0, 1))

def copy_bandwidth(device: str, orig: OriginalStep) -> dict:
    """Device-to-device copy bandwidth (read + write bytes per second, GB/s), jnp and torch."""
    nbytes = (2 << 30) if device == "cuda" else (16 << 20)
    jax_gbps, _ = _timing.copy_ceiling_gbps(nbytes, reps=20 if device == "cuda" else 3)
    torch_gbps = orig.copy_gbps(nbytes, 3, lambda fn, calls: _timing.best_block_wall_us(fn, calls, orig.sync))
    return {"jax_gbps": jax_gbps, "torch_gbps": torch_gbps}


# --------------------------------------------------------------------------------------------------
# one (config, batch size)


def run_case(name, S, K, N, bs, args, pool: PoolShape, orig: OriginalStep, reps: Reps, max_bs: int) -> dict:
    """One (config, batch size): compare the two steps exactly, then (unless ``check_only``) time both."""
    on_gpu = args.device == "cuda"
    inp = make_step_inputs(S, K, N, bs, pool.slots, max_bs=max_bs, seed=1000 * bs + S * 10 + K)
    ti = orig.inputs(inp)
    xi = jax_inputs(inp)
    where = f"{name} bs={bs}"

    # ---- correctness: same inputs, same pool bits, one step each
    orig.fill_pool(seed=bs)
    k_pool, v_pool = jax_pool_from_torch(orig.kv)
    step = make_jax_step(S, K, N, interpret=not on_gpu)
    if args.pack:
        ps = PackedStep(step, xi)
        jstep, xargs = ps.jit, ps.pack(xi)
    else:
        ps, jstep, xargs = None, jax.jit(step, donate_argnums=(0, 1)), (xi,)
    t0 = time.perf_counter()
    compiled = jstep.lower(k_pool, v_pool, *xargs).compile()
    compile_s = time.perf_counter() - t0
    k_pool, v_pool, out_j = jstep(k_pool, v_pool, *xargs)  # the jit fast path (same executable, cached)
    if ps is not None:
        out_j = ps.unpack(out_j)
    out_t = orig.step(ti, S, K, N)
    orig.sync()
    if K > 1 and "move_tgt" not in out_j:
        out_j = dict(out_j)
        out_j.update(make_move_pairs(S, interpret=not on_gpu)(out_j["accept_index"], out_j["accept_lens"], xi["out_cache_loc"]))
    compare_outputs(out_j, out_t, where)
    compare_pools(k_pool, v_pool, orig.kv, where)
    accept_lens = to_numpy(out_t["accept_lens"])
    print(f"  {where}: outputs equal (tree, verify, bonus, move pairs, KV pool bit-exact, next cache locs); "
          f"mean accept_len {accept_lens.mean():.2f}; jax compile {compile_s:.1f}s", flush=True)
    if args.debug:
        txt = compiled.as_text()
        print(f"  [debug] {where}: pool-sized copy ops in the compiled step HLO: "
              f"{count_pool_copies(txt, pool)}; {while_loop_report(txt)}", flush=True)

    row = dict(config=name, S=S, K=K, N=N, bs=bs, mean_accept_len=float(accept_lens.mean()), checked=True)
    row.update(step_bytes(inp, pool))
    # rows that really change (tgt != src: not the root self-copy, not the 0 <- 0 padding)
    eff = int((to_numpy(out_t["move_tgt"]) != to_numpy(out_t["move_src"])).sum()) if K > 1 else 0
    row["moved_rows_effective"] = eff
    row["total_bytes_effective"] = row["total_bytes"] - row["kv_bytes"] + 2 * eff * pool.layers * 2 * pool.row_bytes
    if args.check_only:
        del k_pool, v_pool
        return row

    # ---- ours: wall per call (Python loop, one block at the end)
    # (calls go through jit's C++ dispatch path; calling the AOT ``Compiled`` object flattens pytrees in
    # Python and costs ~100 us more per call)
    k_pool, v_pool, out_p = jstep(k_pool, v_pool, *xargs)
    box = [k_pool, v_pool, out_p]

    def call():
        box[0], box[1], box[2] = jstep(box[0], box[1], *xargs)

    row["ours_wall_us"] = _timing.best_block_wall_us(call, reps.wall_calls, lambda: jax.block_until_ready(box))
    k_pool, v_pool, out_p = box

    # ---- ours: GPU kernel time per call (CUPTI)
    row["ours_gpu_us"] = None
    if on_gpu:
        box = [k_pool, v_pool]

        def call():
            box[0], box[1], _o = jstep(box[0], box[1], *xargs)

        row["ours_gpu_us"] = _timing.cupti_kernel_us(call, orig.sync)
        if args.debug and row["ours_gpu_us"] is not None:
            top = ", ".join(f"{n[:48]} {t:.1f}" for n, t in _timing.cupti_kernel_us.last_top)
            print(f"  [debug] {where}: {_timing.cupti_kernel_us.last_count:.0f} kernels/step; top (us): {top}",
                  flush=True)
        k_pool, v_pool = box
        del box

    # ---- ours: R steps in one jit
    loop = make_jax_loop(step, reps.loop_steps)
    _, _, shapes = jax.eval_shape(step, k_pool, v_pool, xi)
    out_j = {k: jnp.ones(sd.shape, sd.dtype) for k, sd in shapes.items()}  # loop carry seed (accept_lens > 0)
    lc = loop.lower(k_pool, v_pool, xi, out_j).compile()
    if args.debug:
        print(f"  [debug] {where}: pool-sized copy ops in the compiled loop HLO: "
              f"{count_pool_copies(lc.as_text(), pool)}", flush=True)
    k_pool, v_pool, out_l = lc(k_pool, v_pool, xi, out_j)
    jax.block_until_ready(out_l)
    best = math.inf
    for _ in range(3 if on_gpu else 1):
        t0 = time.perf_counter()
        k_pool, v_pool, out_l = lc(k_pool, v_pool, xi, out_l)
        jax.block_until_ready((k_pool, v_pool, out_l))
        best = min(best, time.perf_counter() - t0)
    row["ours_loop_us"] = best / reps.loop_steps * 1e6
    out_t.pop("move_tgt", None), out_t.pop("move_src", None)
    compare_outputs(out_l, out_t, where + " (in-jit loop outputs)")  # same inputs -> same outputs
    del out_l
    if args.breakdown:
        prev, parts = 0.0, {}
        for stage in STAGES[:-1]:
            sub = make_jax_step(S, K, N, interpret=not on_gpu, upto=stage)
            _, _, o0 = jax.jit(sub)(k_pool, v_pool, xi)
            sl = make_jax_loop(sub, reps.loop_steps).lower(k_pool, v_pool, xi, o0).compile()
            k_pool, v_pool, o = sl(k_pool, v_pool, xi, o0)
            jax.block_until_ready(o)
            t0 = time.perf_counter()
            k_pool, v_pool, o = sl(k_pool, v_pool, xi, o)
            jax.block_until_ready((k_pool, v_pool, o))
            t = (time.perf_counter() - t0) / reps.loop_steps * 1e6
            parts[stage], prev = t - prev, t
        parts["locs"] = row["ours_loop_us"] - prev
        row["breakdown_loop_us"] = parts
        print(f"  [breakdown] {where}: in-jit loop us/step by stage: "
              + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), flush=True)
    del k_pool, v_pool, out_j, out_p

    # ---- original: eager wall, eager GPU, CUDA graph GPU
    fn = lambda: orig.step(ti, S, K, N)  # noqa: E731
    row["orig_eager_wall_us"] = _timing.best_block_wall_us(fn, reps.wall_calls, orig.sync)
    row["orig_eager_gpu_us"] = orig.gpu_time_us(fn, reps.bench_ms) if on_gpu else None
    row["orig_graph_gpu_us"] = None
    if on_gpu:
        g = orig.capture_graph(fn)
        row["orig_graph_gpu_us"] = orig.gpu_time_us(g.replay, reps.bench_ms)
        del g
    return row


# --------------------------------------------------------------------------------------------------
# driver


def run(device: str = "cuda", batch_sizes=(1, 16, 64, 256), configs=("tree", "chain"), quick: bool = False,
        debug: bool = False, pool: PoolShape | None = None, check_only: bool = False,
        breakdown: bool = False, command_buffers: bool = False, pack: bool | None = None) -> dict:
    """Run the benchmark; returns the JSON-able result. ``check_only``: the correctness path only (every
    (config, batch size) compiled once and compared exactly, nothing timed). On CPU timings are tokens."""
    configure(device, command_buffers=command_buffers)
    if pack is None:
        pack = True
    args = argparse.Namespace(device=device, debug=debug, check_only=check_only, breakdown=breakdown,
                              pack=pack)
    pool = pool or (GPU_POOL if device == "cuda" else CPU_POOL)
    reps = CPU_REPS if device == "cpu" else (QUICK_REPS if quick else FULL_REPS)
    t_start = time.perf_counter()
    orig = OriginalStep(pool, device)
    max_bs = max(batch_sizes)
    rows = []
    for name in configs:
        S, K, N = CONFIGS[name]
        for bs in batch_sizes:
            rows.append(run_case(name, S, K, N, bs, args, pool, orig, reps, max_bs))
    if check_only:
        return dict(meta=dict(device=device, check_only=True, total_s=time.perf_counter() - t_start), rows=rows)
    bw = copy_bandwidth(device, orig)
    finish_rows(rows, bw)
    print_table(rows, bw)
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.1f}s")
    meta = dict(device=device, packed=pack, command_buffers=command_buffers, xla_flags=os.environ.get("XLA_FLAGS", ""), pool=dataclasses.asdict(pool), reps=dataclasses.asdict(reps),
                jax=jax.__version__, **orig.versions(), total_s=total)
    return dict(meta=meta, bandwidth=bw, rows=rows)


def main(argv=None) -> int:
    p = _cli.parser("step.py", __doc__)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: the H200 measurement; cpu: tiny pools, Triton interpreter + Pallas interpret (smoke test)")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,16,64,256 on cuda, 1,4 on cpu)")
    p.add_argument("--configs", default="tree,chain", help=f"comma list of step configs from {sorted(CONFIGS)}")
    p.add_argument("--json", default=None, help="write the result (meta, bandwidth, rows) as JSON to this path")
    p.add_argument("--png", default=None, help="plot the result (bench/plot_step.py) to this PNG path")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--check-only", action="store_true", help="correctness only (compare every output), no timing")
    p.add_argument("--no-pack", action="store_true",
                   help="pass the step's ~25 inputs as separate arrays (default: two packed buffers)")
    p.add_argument("--command-buffers", action="store_true",
                   help="run the jaxspec step as XLA command buffers (CUDA graphs), while loops included")
    p.add_argument("--breakdown", action="store_true", help="also time step prefixes (plan_verify, +commit, +next locations) in-jit")
    p.add_argument("--debug", action="store_true",
                   help="print pool-sized copy ops and while loops of the compiled HLO and the top kernels (CUPTI)")
    a = p.parse_args(argv)
    bss = a.batch_sizes or ("1,16,64,256" if a.device == "cuda" else "1,4")
    batch_sizes = tuple(int(x) for x in bss.split(",") if x)
    configs = tuple(c for c in a.configs.split(",") if c)
    for c in configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown config {c!r} (choose from {', '.join(CONFIGS)})")
    res = run(a.device, batch_sizes, configs, quick=a.quick, debug=a.debug, check_only=a.check_only,
              breakdown=a.breakdown, command_buffers=a.command_buffers,
              pack=False if a.no_pack else None)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.json}")
    if a.png and not a.check_only:
        try:
            plot_step.plot(res, a.png)
            print(f"wrote {a.png}")
        except ImportError as e:  # matplotlib absent: the JSON still holds everything
            print(f"--png skipped: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
