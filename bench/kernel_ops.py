"""Check every cache-location / KV-move Pallas kernel against its jnp reference ON the device and time it
against the XLA reference: device time per op (R repetitions inside one jit) and wall time per call.
For the KV move also achieved GB/s (bytes read + written) vs a device-to-device copy measured in the
same run. One command on the H200:

    python bench/kernel_ops.py --json /tmp/kernels.json

CPU smoke test (interpret mode, tiny sizes; timings meaningless):

    python bench/kernel_ops.py --interpret --small

The TokenSpeed paged cache-location and MTP helper cases come from ``bench/kernels_paged.py``: its
``CASES``, a list of callables ``case(ctx: BenchContext) -> list[dict]``, append rows to the table (same
column names; any missing column prints as "-"). ``BenchContext`` carries ``interpret``, ``small``, ``reps`` and the
helpers ``check_equal``, ``time_op`` (see below) so cases stay a few lines each.
"""

import dataclasses
import json
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import _cli  # bench/ is a folder of scripts: its siblings import from the script's own directory
import _timing
import kernels_paged
from jaxspec.kernels import cache_locs as C
from jaxspec.kernels import kv_move as M
from jaxspec.testing import random_accept_index

UNROLL = 25  # cache-location ops per timing-loop trip (one XLA:GPU loop trip costs ~10 us on the H200)

COLUMNS = ["kernel", "case", "bs", "locs", "check", "pallas_gpu_us", "ref_gpu_us", "speedup",
           "pallas_wall_us", "ref_wall_us", "GB/s", "%copy", "config"]


@dataclasses.dataclass
class BenchContext:
    interpret: bool
    small: bool
    reps: int
    copy_gbps: float = float("nan")

    def impl_kw(self):
        return dict(implementation="pallas", interpret=self.interpret)

    @staticmethod
    def check_equal(a, b) -> str:
        ok = all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
        return "ok" if ok else "MISMATCH"

    def time_op(self, fn, args):
        """Device time (us) of ``fn(*args)`` in a jitted loop (outputs fed back so nothing is hoisted) and
        wall time per call of ``jax.jit(fn)``."""

        def step(state):
            args, acc = state
            out = fn(*args)
            leaf = jax.tree.leaves(out)[0]
            tick = jnp.minimum(leaf.reshape(-1)[:1].sum().astype(jnp.int32), 0) if leaf.size else jnp.int32(0)
            args = tuple(a + tick.astype(a.dtype) if (i == 0 and jnp.issubdtype(a.dtype, jnp.integer)) else a
                         for i, a in enumerate(args))
            return args, acc + tick

        reps = self.reps
        unroll = 1 if self.small else UNROLL
        dev, _ = _timing.device_time_us(step, (tuple(jnp.asarray(a) for a in args), jnp.int32(0)),
                                        reps=max(reps // unroll, 2), trials=3 if self.small else 5, unroll=unroll)
        wall = _timing.wall_time_us(jax.jit(fn), *args, iters=max(reps // 2, 3))
        return dev, wall


# ----------------------------------------------------------------------------------------------------
# cache-location kernels
# ----------------------------------------------------------------------------------------------------


def _cache_loc_inputs(rng, bs, n, width=4096):
    rows = max(bs * 2, 4)
    r2t = (1 + rng.permutation(rows * width)).astype(np.int32).reshape(rows, width) % (1 << 30)
    rpi = rng.permutation(rows)[:bs].astype(np.int32)
    seq = rng.integers(0, width - 2 * n, bs).astype(np.int32)
    return rpi, r2t, seq




def cache_loc_rows(ctx: BenchContext, batch_sizes, s=5, k=4, n=8):
    rng = np.random.default_rng(0)
    rows = []
    a = s + 1
    for bs in batch_sizes:
        rpi, r2t, seq = _cache_loc_inputs(rng, bs, n, width=512 if ctx.small else 4096)
        ai, lens = random_accept_index(rng, bs, a, n)
        ocl = (1 + rng.permutation(bs * n * 4)[: bs * n]).astype(np.int32)
        ops = {
            "assign_extend_cache_locs": (
                lambda rpi, r2t, seq, lens, impl, **kw: C.assign_extend_cache_locs(
                    rpi, r2t, seq, seq + lens, out_size=bs * a, implementation=impl, **kw),
                (rpi, r2t, seq, lens)),
            "assign_extend_cache_locs_uniform": (
                lambda rpi, r2t, seq, impl, **kw: C.assign_extend_cache_locs_uniform(
                    rpi, r2t, seq, width=n, with_positions=True, implementation=impl, **kw),
                (rpi, r2t, seq)),
            "fill_front_out_cache_loc": (
                lambda lens, ocl, impl, **kw: C.fill_front_out_cache_loc(lens, ocl, width=a, implementation=impl, **kw),
                (lens, ocl)),
            "fill_accept_out_cache_loc": (
                lambda ai, ocl, impl, **kw: C.fill_accept_out_cache_loc(ai, ocl, implementation=impl, **kw),
                (ai, ocl)),
            "assign_draft_cache_locs": (
                lambda rpi, r2t, seq, impl, **kw: C.assign_draft_cache_locs(
                    rpi, r2t, seq, topk=k, num_steps=s, implementation=impl, **kw),
                (rpi, r2t, seq)),
        }
        for name, (f, args) in ops.items():
            row = dict(kernel=name, case=f"S{s}K{k}N{n}", bs=bs, locs=bs * a)
            try:
                pal = lambda *x, f=f: f(*x, "pallas", interpret=ctx.interpret)  # noqa: E731
                ref = lambda *x, f=f: f(*x, "reference")  # noqa: E731
                row["check"] = ctx.check_equal(pal(*args), ref(*args))
                row["pallas_gpu_us"], row["pallas_wall_us"] = ctx.time_op(pal, args)
                row["ref_gpu_us"], row["ref_wall_us"] = ctx.time_op(ref, args)
                row["speedup"] = row["ref_gpu_us"] / max(row["pallas_gpu_us"], 1e-9)
            except Exception as e:  # keep the rest of the table
                row["check"] = f"ERROR {type(e).__name__}: {str(e)[:120]}"
                traceback.print_exc()
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------
# KV move
# ----------------------------------------------------------------------------------------------------


def _pool(shape, dtype=jnp.bfloat16, offset=0):
    n = int(np.prod(shape))
    bits = ((jnp.arange(n, dtype=jnp.uint32) + offset) % 0x7F00).astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(bits, dtype).reshape(shape)


def _move_patterns(rng, bs, s, n, num_slots):
    """(name, accept inputs or None, tgt, src): the spec-accept move and a hazard-free random move."""
    a = s + 1
    ai, lens = random_accept_index(rng, bs, a, n)
    ocl = (1 + rng.permutation(num_slots - 1)[: bs * n]).astype(np.int32)
    perm = 1 + rng.permutation(num_slots - 1)
    m = bs * a
    return [
        ("accept", (ai, lens, ocl)),
        ("random", (perm[:m].astype(np.int32), perm[m: 2 * m].astype(np.int32))),
    ]


def move_rows(ctx: BenchContext, batch_sizes, big_locs, layers, heads, dim, slots, configs, s=5, n=8):
    rows = []
    shape = (layers, slots, heads, dim)
    row_bytes = heads * dim * 2
    rng = np.random.default_rng(1)
    check_shape = (layers, min(slots, 1 << 14), heads, dim)
    k_big, v_big = _pool(shape, offset=0), _pool(shape, offset=7)  # the timing pool (donated through)
    sizes = [(bs, None) for bs in batch_sizes] + [(None, big_locs)]
    for bs, locs in sizes:
        b = bs if bs is not None else -(-big_locs // (s + 1))
        for pattern, data in _move_patterns(rng, b, s, n, check_shape[1]):
            if pattern == "accept":
                ai, lens, ocl = data
                active = int(np.sum(lens)) - b  # root self-copies move nothing; count real rows
                moved_rows = int(np.sum(lens))
            else:
                tgt, src = data
                active = moved_rows = tgt.shape[0]
            nbytes = 2 * active * 2 * layers * row_bytes  # read + write, K and V
            for cfg, span_mode in configs:
                if pattern == "accept" and span_mode == "seq":
                    continue  # the accept move always runs request-aligned spans
                row = dict(kernel=f"move_{pattern}", case=f"L{layers}H{heads}E{dim}", bs=b, locs=moved_rows,
                           config=f"rows{cfg.rows}w{cfg.num_warps}" + (f"/{span_mode}" if pattern == "random" else ""))
                span = None if span_mode == "seq" else cfg.rows
                try:
                    if pattern == "accept":
                        fp = lambda k, v, cfg=cfg: M.move_accept_tokens_to_target_kvcache(  # noqa: E731
                            k, v, ai, lens, ocl, config=cfg, implementation="pallas", interpret=ctx.interpret)
                        fr = lambda k, v: M.move_accept_tokens_to_target_kvcache(  # noqa: E731
                            k, v, ai, lens, ocl, implementation="reference")
                    else:
                        fp = lambda k, v, cfg=cfg, span=span: M.move_kv_cache(  # noqa: E731
                            k, v, tgt, src, span=span, config=cfg, implementation="pallas", interpret=ctx.interpret)
                        fr = lambda k, v: M.move_kv_cache(k, v, tgt, src, implementation="reference")  # noqa: E731
                    # exactness on the device, on a smaller pool (both results must be kept)
                    got = fp(_pool(check_shape), _pool(check_shape, offset=7))
                    want = fr(_pool(check_shape), _pool(check_shape, offset=7))
                    row["check"] = ctx.check_equal(
                        jax.tree.map(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16), got),
                        jax.tree.map(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16), want))
                    del got, want
                    step_p = lambda st, fp=fp: tuple(fp(*st))  # noqa: E731
                    step_r = lambda st, fr=fr: tuple(fr(*st))  # noqa: E731
                    row["pallas_gpu_us"], (k_big, v_big) = _timing.device_time_us(step_p, (k_big, v_big), reps=ctx.reps)
                    row["ref_gpu_us"], (k_big, v_big) = _timing.device_time_us(step_r, (k_big, v_big), reps=ctx.reps)
                    jp = jax.jit(lambda st, fp=fp: tuple(fp(*st)), donate_argnums=0)
                    jr = jax.jit(lambda st, fr=fr: tuple(fr(*st)), donate_argnums=0)
                    row["pallas_wall_us"], (k_big, v_big) = _timing.wall_time_us_state(jp, (k_big, v_big), iters=max(ctx.reps // 2, 3))
                    row["ref_wall_us"], (k_big, v_big) = _timing.wall_time_us_state(jr, (k_big, v_big), iters=max(ctx.reps // 2, 3))
                    row["speedup"] = row["ref_gpu_us"] / max(row["pallas_gpu_us"], 1e-9)
                    row["GB/s"] = nbytes / max(row["pallas_gpu_us"], 1e-9) / 1e3
                    row["%copy"] = 100 * row["GB/s"] / ctx.copy_gbps
                    row["MB_moved"] = nbytes / 2 / 1e6
                except Exception as e:
                    row["check"] = f"ERROR {type(e).__name__}: {str(e)[:120]}"
                    traceback.print_exc()
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) < 1e5 else f"{v:.3g}"
    return str(v)


def print_table(rows):
    cols = COLUMNS
    table = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(x.ljust(w) for x, w in zip(t, widths)))


def main(argv=None):
    p = _cli.parser("kernel_ops.py", __doc__)
    p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU smoke test)")
    p.add_argument("--small", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--json", default=None, help="write rows as JSON to this path")
    p.add_argument("--reps", type=int, default=None, help="repetitions inside one jit (default 50; 3 with --small)")
    p.add_argument("--skip-move", action="store_true", help="skip the KV-move kernels")
    p.add_argument("--skip-cache-locs", action="store_true", help="skip the cache-location kernels")
    p.add_argument("--move-configs", default="16x1,32x1,8x2,16x2,8x4",
                   help="KV-move MoveConfig sweep as ROWSxWARPS,... (fewer = faster GPU run)")
    p.add_argument("--span-modes", default="par,seq", help="span modes of the generic move: par,seq")
    p.add_argument("--no-extra", action="store_true", help="skip the TokenSpeed/MTP cases of bench/kernels_paged.py")
    args = p.parse_args(argv)
    ctx = BenchContext(interpret=args.interpret, small=args.small, reps=args.reps or (3 if args.small else 50))
    print(f"jax {jax.__version__} backend={jax.default_backend()} devices={jax.devices()}", flush=True)

    if args.small:
        layers, heads, dim, slots, batch_sizes, big_locs = 2, 2, 16, 256, (1, 4), 24
        configs = [(M.MoveConfig(rows=4), "seq"), (M.MoveConfig(rows=4), "par")]
        copy_bytes = 1 << 20
    else:
        layers, heads, dim, slots, batch_sizes, big_locs = 32, 8, 128, 1 << 17, (1, 16, 64, 256), 4096
        sweep = [tuple(int(v) for v in c.split("x")) for c in args.move_configs.split(",")]
        configs = [(M.MoveConfig(rows=r, num_warps=w), sm) for r, w in sweep for sm in args.span_modes.split(",")]
        copy_bytes = 1 << 30
    ctx.copy_gbps, copy_us = _timing.copy_ceiling_gbps(copy_bytes, reps=ctx.reps)
    print(f"device-to-device copy ceiling: {ctx.copy_gbps:.0f} GB/s (read+write, {copy_bytes >> 20} MiB, {copy_us:.1f} us)",
          flush=True)

    rows = []
    if not args.skip_cache_locs:
        rows += cache_loc_rows(ctx, batch_sizes)
        print_table(rows)
    if not args.skip_move:
        # dedupe configs for the accept pattern (span mode only matters for the generic move)
        move = move_rows(ctx, batch_sizes, big_locs, layers, heads, dim, slots, configs)
        seen, kept = set(), []
        for r in move:
            key = (r["kernel"], r["bs"], r["config"])
            if key not in seen:
                seen.add(key)
                kept.append(r)
        rows += kept
    for case in ([] if args.no_extra else kernels_paged.CASES):
        try:
            rows += case(ctx)
        except Exception as e:
            rows.append(dict(kernel=getattr(case, "__name__", "case"), check=f"ERROR {type(e).__name__}: {e}"))
            traceback.print_exc()
    print()
    print_table(rows)
    bad = [r for r in rows if r.get("check") not in ("ok", None)]
    summary = dict(jax=jax.__version__, backend=jax.default_backend(), copy_gbps=ctx.copy_gbps,
                   interpret=args.interpret, small=args.small, reps=ctx.reps, rows=rows, failures=len(bad))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=float)
        print(f"wrote {args.json}")
    print(f"{len(rows)} rows, {len(bad)} failed checks")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
