"""Benchmark cases: TokenSpeed paged cache-location kernels and the MTP helpers (SGLang 0.5.12), Pallas vs jnp reference.

``CASES`` is a list of callables ``case(args) -> list[dict]`` (``bench/kernel_ops.py`` imports it and prints
the table). Every case first checks the Pallas kernel against its reference on the same inputs (exact; a
mismatch is reported as ``check = "MISMATCH"``), then times both:

  * ``*_gpu_us``: R repetitions inside one jitted ``lax.fori_loop`` (inputs threaded through an
    ``optimization_barrier`` so nothing is hoisted; table updates carry the donated table), one
    ``block_until_ready``, divided by R -- device time per op without host dispatch;
  * ``*_wall_us``: wall time per call of the public jitted function from a Python loop (host dispatch
    included), one ``block_until_ready`` at the end.

``args`` is ``bench/kernel_ops.py``'s ``BenchContext`` (``interpret``, ``small``, ``reps``) or this script's
CLI (``device`` "cuda" | "cpu", ``batch_sizes`` "1,16,64,256", ``quick``); anything missing is defaulted.
Device time comes from ``bench/_timing.py`` with ``UNROLL`` ops per loop trip: a plain ``fori_loop`` trip
cost ~10 us on the H200 (measured: 15 us/op rolled vs 3-5 us/op with 25 ops unrolled per trip). On CPU the kernels run in Pallas interpret mode with small sizes (a smoke
test: timings there mean nothing). ``python bench/kernels_paged.py [--device cpu]`` runs it alone.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import _cli  # bench/ is a folder of scripts: its siblings import from the script's own directory
import _timing
from jaxspec.kernels import _backend
from jaxspec.kernels import multi_layer_eagle as mle
from jaxspec.kernels import paged_cache_locs as pcl

PAGE_SIZE = 16
MAX_PAGES = 512  # 8192-token rows
UNIFORM = 4  # verify width of the chain config (S 3, K 1, N 4): decode tokens per request
HIDDEN = 7168  # DeepSeek-V3 hidden size (MTP)
MTP_WIDTH = 2  # S - 1 for S = 3
UNROLL = 25  # ops traced back to back per fori_loop trip in gpu_time_us


# ------------------------------------------------------------------------------------------------
# Settings and timing helpers.
# ------------------------------------------------------------------------------------------------


def _settings(args):
    """Read ``bench/kernel_ops.py``'s ``BenchContext`` (``interpret``, ``small``, ``reps``) or this script's
    CLI namespace (``device``, ``batch_sizes``, ``quick``); anything missing is defaulted."""
    interpret = getattr(args, "interpret", None)
    device = getattr(args, "device", None)
    if interpret is None:
        interpret = (device == "cpu") if device else not _backend.gpu_available()
    on_gpu = not interpret
    small = bool(getattr(args, "small", False)) or not on_gpu
    bss = getattr(args, "batch_sizes", None) or ((1, 4) if small else (1, 16, 64, 256))
    if isinstance(bss, str):
        bss = tuple(int(b) for b in bss.split(","))
    quick = bool(getattr(args, "quick", False))
    reps = getattr(args, "reps", None) or ((50 if quick else 200) if on_gpu else 2)
    calls = (20 if quick else 200) if on_gpu else 2
    return dict(interpret=interpret, batch_sizes=tuple(bss), reps=int(reps), calls=calls, on_gpu=on_gpu)


def _block(x):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready(), x)


def _first(out):
    return jax.tree_util.tree_leaves(out)[0].reshape(-1)[:1].astype(jnp.float32).sum()


def gpu_time_us(fn, args, reps, *, carry_index=None):
    """Device time per call: ``reps`` calls inside one jitted loop (``_timing.device_time_us``, ``UNROLL``
    calls per trip; ``args`` are donated). ``carry_index`` names the argument the op returns updated (a
    donated table), which is then carried through the loop."""

    def step(state):
        a, acc = lax.optimization_barrier(state)
        out = fn(*a)
        if carry_index is not None:
            a = a[:carry_index] + (out,) + a[carry_index + 1:]
        return a, acc + _first(out)

    unroll = min(UNROLL, reps)
    us, _ = _timing.device_time_us(step, (tuple(args), jnp.float32(0)), reps=max(reps // unroll, 2), trials=3,
                                   unroll=unroll)
    return us


def wall_time_us(fn, args, calls, *, carry_index=None):
    """Wall time per call of the public (jitted) function from a Python loop."""
    args = list(args)
    out = fn(*[_fresh(a) for a in args])
    _block(out)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
        if carry_index is not None:
            args[carry_index] = out
    _block(out)
    return (time.perf_counter() - t0) / calls * 1e6


def _fresh(a):
    return jnp.array(a, copy=True) if isinstance(a, jax.Array) else a


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _run_case(name, bs, shape, make_fn, args, st, *, carry_index=None):
    """Check Pallas == reference exactly (``check`` = "ok" / "MISMATCH"), then time both. Row keys follow
    ``bench/kernel_ops.py``'s columns."""
    fns = {impl: make_fn(impl) for impl in ("pallas", "reference")}
    outs = {impl: jax.device_get(fns[impl](*[_fresh(a) for a in args])) for impl in fns}
    leaves = zip(jax.tree_util.tree_leaves(outs["pallas"]), jax.tree_util.tree_leaves(outs["reference"]))
    row = dict(kernel=name, case=shape, bs=bs, check="ok" if all(_same(g, w) for g, w in leaves) else "MISMATCH")
    for impl, key in (("pallas", "pallas"), ("reference", "ref")):
        row[f"{key}_gpu_us"] = round(gpu_time_us(fns[impl], [_fresh(a) for a in args], st["reps"],
                                                 carry_index=carry_index), 2)
        row[f"{key}_wall_us"] = round(wall_time_us(fns[impl], [_fresh(a) for a in args], st["calls"],
                                                   carry_index=carry_index), 2)
    row["speedup"] = round(row["ref_gpu_us"] / max(row["pallas_gpu_us"], 1e-9), 2)
    return row


# ------------------------------------------------------------------------------------------------
# Inputs.
# ------------------------------------------------------------------------------------------------


def _paged_inputs(rng, bs, max_pages):
    num_rows = 2 * bs + 1
    pools = rng.permutation(num_rows)[:bs].astype(np.int32)
    table = rng.permutation(num_rows * max_pages).astype(np.int32).reshape(num_rows, max_pages) + 1
    cap = max_pages * PAGE_SIZE
    starts = rng.integers(0, cap - UNIFORM, size=bs).astype(np.int32)
    return num_rows, jnp.asarray(pools), jnp.asarray(table), jnp.asarray(starts)


def _max_pages(st):
    return MAX_PAGES if st["on_gpu"] else 8


# ------------------------------------------------------------------------------------------------
# Cases.
# ------------------------------------------------------------------------------------------------


def _per_batch(args, build):
    """One row per batch size: ``build(st, bs, rng) -> (name, shape, op, inputs, carry_index)``; ``op`` is the
    public function (static arguments bound with ``functools.partial``), run with each ``implementation``."""
    st = _settings(args)
    rows = []
    for bs in st["batch_sizes"]:
        name, shape, op, inputs, carry_index = build(st, bs, np.random.default_rng(bs))

        def make(impl, op=op):
            return functools.partial(op, implementation=impl, interpret=st["interpret"])

        rows.append(_run_case(name, bs, shape, make, inputs, st, carry_index=carry_index))
    return rows


CASES = []  # callables case(args) -> rows, in table order (bench/kernel_ops.py appends their rows)


def _case(build):
    """Register ``build(st, bs, rng) -> (name, shape, op, inputs, carry_index)`` as a ``CASES`` entry."""

    def case(args):
        return _per_batch(args, build)

    case.__name__ = f"case_{build.__name__}"
    CASES.append(case)
    return build


@_case
def compute_out_cache_loc_uniform(st, bs, rng):
    _, pools, table, starts = _paged_inputs(rng, bs, _max_pages(st))
    op = functools.partial(pcl.compute_out_cache_loc_uniform, page_size=PAGE_SIZE, uniform_input_length=UNIFORM)
    return "compute_out_cache_loc_uniform", f"U={UNIFORM} P={PAGE_SIZE}", op, (starts, pools, table), None


@_case
def compute_out_cache_loc(st, bs, rng):
    _, pools, table, starts = _paged_inputs(rng, bs, _max_pages(st))
    lens = jnp.asarray(rng.integers(1, 2 * UNIFORM + 1, size=bs).astype(np.int32))
    out_size = max(128, 1 << int(np.ceil(np.log2(bs * 2 * UNIFORM))))
    op = functools.partial(pcl.compute_out_cache_loc, page_size=PAGE_SIZE, out_size=out_size)
    return ("compute_out_cache_loc", f"ragged 1..{2 * UNIFORM} out={out_size}", op, (starts, lens, pools, table),
            None)


@_case
def fused_decode_input_prep(st, bs, rng):
    num_rows, pools, table, starts = _paged_inputs(rng, bs, _max_pages(st))
    vcl = jnp.zeros((num_rows,), jnp.int32).at[pools].set(starts)
    op = functools.partial(pcl.fused_decode_input_prep, page_size=PAGE_SIZE, uniform_input_length=UNIFORM)
    return "fused_decode_input_prep", f"U={UNIFORM} P={PAGE_SIZE}", op, (vcl, pools, table), None


@_case
def update_req_to_page(st, bs, rng):
    _, pools, table, _ = _paged_inputs(rng, bs, _max_pages(st))
    num = rng.integers(0, 3, size=bs).astype(np.int32)  # 0-2 new pages per request per step
    starts = rng.integers(0, _max_pages(st) - 2, size=bs).astype(np.int32)
    total = max(128, 1 << int(np.ceil(np.log2(max(2 * bs, 1)))))
    pages = np.zeros(total, np.int32)
    pages[: num.sum()] = rng.integers(1, 1 << 20, size=num.sum())
    inputs = (table, pools, jnp.asarray(pages), jnp.asarray(num), jnp.asarray(starts))
    return "update_req_to_page", f"0-2 pages/req M={_max_pages(st)}", pcl.update_req_to_page, inputs, 0


@_case
def rotate_input_ids(st, bs, rng):
    seg = UNIFORM  # decode draft-extend window (N tokens per request)
    ids = jnp.asarray(rng.integers(0, 128000, size=bs * seg).astype(np.int32))
    starts = jnp.asarray((np.arange(bs) * seg).astype(np.int32))
    lens = jnp.full((bs,), seg, jnp.int32)
    topk = jnp.asarray(rng.integers(0, 128000, size=(bs, 1)).astype(np.int32))
    select = starts + jnp.asarray(rng.integers(0, seg, size=bs).astype(np.int32))
    return "rotate_input_ids", f"N={seg} select", mle.rotate_input_ids, (ids, starts, lens, topk, select), 0


@_case
def assign_hidden_states_pool(st, bs, rng):
    hidden_dim = HIDDEN if st["on_gpu"] else 96
    seg = UNIFORM
    num_rows = 2 * bs + 1
    hidden = jnp.asarray(rng.standard_normal((bs * seg, hidden_dim), np.float32)).astype(jnp.bfloat16)
    pool = jnp.zeros((num_rows, MTP_WIDTH, hidden_dim), jnp.bfloat16)
    pools = jnp.asarray(rng.permutation(num_rows)[:bs].astype(np.int32))
    starts = jnp.asarray((np.arange(bs) * seg).astype(np.int32))
    lens = jnp.full((bs,), seg, jnp.int32)
    return ("assign_hidden_states_pool", f"W={MTP_WIDTH} H={hidden_dim} bf16", mle.assign_hidden_states_pool,
            (hidden, pools, pool, lens, starts), 2)




def main(argv=None):
    p = _cli.parser("kernels_paged.py", __doc__)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cpu: Pallas interpret mode, small sizes (default: cuda when jax sees a GPU)")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,16,64,256; small on cpu)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    cols = ["kernel", "case", "bs", "check", "pallas_gpu_us", "ref_gpu_us", "speedup", "pallas_wall_us",
            "ref_wall_us"]
    print(" | ".join(cols))
    bad = 0
    for case in CASES:
        for row in case(args):
            bad += row["check"] != "ok"
            print(" | ".join(str(row[c]) for c in cols), flush=True)
    if bad:
        raise SystemExit(f"{bad} case(s) where Pallas differs from the reference")


if __name__ == "__main__":
    main()
