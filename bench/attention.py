"""Paged attention on one Llama-3.1-8B layer: jaxspec's kernel vs SGLang 0.5.23's Triton kernels vs jnp.

Shape: 32 query heads, 8 KV heads, head_dim 128, bf16. Grid: batch 1/16/64/128 x prefix 512/4096/16384 x
N = 1 (decode), 4 (chain: causal mask), 8 (a random tree mask). Ours reads a page-size-16 pool through a
page table of random pages; SGLang reads the same pool at its page size 1 layout (``kv_indices`` = the
same slots), ``decode_attention_fwd`` for N = 1 (8 kv splits, SGLang's default) and
``extend_attention_fwd`` with ``custom_mask`` for N > 1 (what SGLang's Triton backend runs for verify).

Every shape is checked first: ours vs the jnp reference and vs the original (max |diff| reported; bf16
tolerance 2^-6, see tests/test_kernels_paged_attention.py). Timing:

* ours / jnp: ``C`` calls back to back per trip of one jitted ``fori_loop`` whose trip count is an argument
  (one compile), each call on its own copy of the pools (``C * kv_bytes >= ~200 MB``: no L2 reuse
  between calls, as between the layers of a model) and on a ``q`` that carries one element of the
  previous output (no merging or hoisting of calls); per call = (t(R trips) - t(1 trip)) / ((R - 1) C),
  median of trials;
* SGLang: ``triton.testing.do_bench`` (CUDA events, median) of the host call.

Reported: us per call; KV bytes read (prefix K+V, bf16) / time as GB/s and as % of the copy bandwidth
measured in the same run (``_timing.copy_ceiling_gbps``, bytes read + written); ours/original.
``--quick`` runs a small subset. JSON (``--json``) + PNG (``--png``). ``--backend`` picks ours
(auto | mosaic | triton); ``--triton`` also times the Pallas-Triton kernel beside it.
"""

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import _cli
import _timing
from jaxspec.testing import random_tree_qmask
from jaxspec.kernels.paged_attention import (
    paged_attention,
    paged_attention_reference,
    resolve_attention_implementation,
)

HQ, HKV, E, G = 32, 8, 128, 16
DTYPE = jnp.bfloat16
TOL = 2.0**-6


def make_case(rng, batch, prefix, n, mask):
    """Inputs on the default device: a pool with exactly the requests' pages (random order, page 0 unused)."""
    pages_per_req = -(-prefix // G)
    num_pages = batch * pages_per_req + 1
    perm = rng.permutation(np.arange(1, num_pages)).astype(np.int32).reshape(batch, pages_per_req)
    key = jax.random.PRNGKey(int(rng.integers(1 << 30)))
    ks = jax.random.split(key, 5)
    x = num_pages * G
    pool = lambda k: jax.random.normal(k, (x, HKV, E), jnp.float32).astype(DTYPE)  # noqa: E731
    fresh = lambda k, h: jax.random.normal(k, (batch, n, h, E), jnp.float32).astype(DTYPE)  # noqa: E731
    if mask == "tree":
        qm = random_tree_qmask(rng, batch, n)
    else:  # chain / decode: causal
        qm = np.tril(np.ones((n, n), bool))[None].repeat(batch, 0)
    return dict(q=fresh(ks[0], HQ), k_new=fresh(ks[1], HKV), v_new=fresh(ks[2], HKV), k_pool=pool(ks[3]),
                v_pool=pool(ks[4]), page_table=jnp.asarray(perm), prefix_lens=jnp.full((batch,), prefix, jnp.int32),
                qmask=jnp.asarray(qm))


def loop_time_us(fn, a, *, copies, trials=5, target_us=20000.0):
    """Device time per ``fn(**a)`` (module docstring); one compile (inputs are arguments, not constants).

    ``copies`` pool pairs (separate buffers) are read in turn by the ``copies`` calls of one loop trip, so
    a call never finds the previous call's KV in L2 (60 MB on the H200) when ``copies * kv_bytes`` exceeds
    it. ``q`` is carried and its first element is replaced by the previous call's output before each call:
    consecutive calls have different inputs, so XLA can neither merge (CSE) nor hoist them.
    """
    pools = [(a["k_pool"], a["v_pool"])] + [(a["k_pool"] + 0, a["v_pool"] + 0) for _ in range(copies - 1)]
    rest = {k: v for k, v in a.items() if k not in ("k_pool", "v_pool", "q")}

    def run(trips, q, pools, rest):
        def trip(_, q):
            for kp, vp in pools:
                out = fn(q=q, k_pool=kp, v_pool=vp, **rest)
                q = lax.dynamic_update_slice(q, out[:1, :1, :1, :1], (0, 0, 0, 0))
            return q
        return lax.fori_loop(0, trips, trip, q)

    f = jax.jit(run)
    jax.block_until_ready(f(1, a["q"], pools, rest))

    def t(trips):
        t0 = time.perf_counter()
        jax.block_until_ready(f(trips, a["q"], pools, rest))
        return time.perf_counter() - t0

    one = min(t(1) for _ in range(3))
    est = max(one * 1e6 / copies, 1.0)
    reps = int(min(200, max(4, target_us / (est * copies))))
    samples = [(t(reps) - t(1)) / ((reps - 1) * copies) * 1e6 for _ in range(trials)]
    del pools
    return max(statistics.median(samples), 0.0)


def num_copies(kv_bytes: int) -> int:
    """Pool copies so that one loop trip's working set is >= ~200 MB (over 3x the H200's L2), at least 2."""
    return int(min(32, max(2, -(-(200 << 20) // kv_bytes))))


def _prefix_kernel(impl, scale):
    """Our prefix kernel alone (``prefix_partials``, the paged part of ``paged_attention``), one element out."""
    if impl == "mosaic":
        from jaxspec.kernels.paged_attention_mosaic import prefix_partials
    else:
        from jaxspec.kernels.paged_attention_triton import prefix_partials

    def call(q, k_new, v_new, k_pool, v_pool, page_table, prefix_lens, qmask):
        acc, _, _ = prefix_partials(q, k_new.shape[2], k_pool, v_pool, page_table, prefix_lens, page_size=G,
                                    sm_scale=scale)
        return acc.reshape(-1)[:1].reshape(1, 1, 1, 1).astype(q.dtype)

    return call


def original_time_us(a, n, device="cuda"):
    """(us, output f32 numpy, kernel name) of SGLang's kernel on the same buffers."""
    import triton

    from jaxspec.interop import attention_originals as ao

    kw = dict(page_size=G, sm_scale=E**-0.5, device=device)
    if n == 1:
        run, o = ao.decode_call(**{k: v for k, v in a.items() if k != "qmask"}, **kw)
        name = "decode_attention_fwd"
    else:
        run, o = ao.extend_call(**a, **kw)
        name = "extend_attention_fwd"
    run()
    us = triton.testing.do_bench(run, warmup=5, rep=50, return_mode="median") * 1e3
    return us, o.float().cpu().numpy().reshape(a["q"].shape), name


def main(argv=None):
    p = _cli.parser("attention.py", __doc__)
    p.add_argument("--quick", action="store_true", help="batch 1/64, prefix 4096/16384, N 1/8")
    p.add_argument("--backend", default="auto", choices=["auto", "mosaic", "triton", "pallas"],
                   help="which of our kernels to time (auto: Mosaic GPU on Hopper, else Pallas-Triton)")
    p.add_argument("--triton", action="store_true", help="also time the Pallas-Triton kernel")
    p.add_argument("--no-original", action="store_true", help="skip SGLang's kernels (checked and timed by default)")
    p.add_argument("--no-reference", action="store_true", help="skip timing the jnp reference (still checked)")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default: the issue's grid)")
    p.add_argument("--prefix", default=None, help="comma-separated prefix lengths (default: the issue's grid)")
    p.add_argument("--n", default=None, help="comma-separated query tokens per request (1 decode, 4 chain, 8 tree)")
    p.add_argument("--json", default=None, help="write the rows as JSON here (rewritten after every row)")
    p.add_argument("--png", default=None, help="write the plot here")
    p.add_argument("--seed", type=int, default=0, help="seed of the random pages, lengths, masks and values")
    p.add_argument("--breakdown", action="store_true",
                   help="also time our prefix kernel alone (kernel_us); the rest of ours_us is the jnp glue around "
                        "it (query reshape, the fresh tokens' partial, the merge of the partial softmaxes)")
    args = p.parse_args(argv)
    quick = args.quick
    bss = [int(x) for x in (args.batch or ("1,64" if quick else "1,16,64,128")).split(",")]
    prefixes = [int(x) for x in (args.prefix or ("4096,16384" if quick else "512,4096,16384")).split(",")]
    ns = [int(x) for x in (args.n or ("1,8" if quick else "1,4,8")).split(",")]
    rng = np.random.default_rng(args.seed)
    ceiling, _ = _timing.copy_ceiling_gbps(1 << 30)
    print(f"jax {jax.__version__} {jax.devices()[0].device_kind}; copy ceiling {ceiling:.0f} GB/s", flush=True)
    rows = []
    scale = E**-0.5
    for batch in bss:
        for prefix in prefixes:
            for n in ns:
                mask = "tree" if n == 8 else ("chain" if n > 1 else "decode")
                a = make_case(rng, batch, prefix, n, mask)
                impl = resolve_attention_implementation(args.backend, a["q"], G, False, hkv=a["k_new"].shape[2])
                ours = lambda **kw: paged_attention(**kw, page_size=G, sm_scale=scale, implementation=impl)  # noqa
                ref = lambda **kw: paged_attention_reference(**kw, page_size=G, sm_scale=scale)  # noqa: E731
                want = np.asarray(ref(**a).astype(jnp.float32))
                got = np.asarray(ours(**a).astype(jnp.float32))
                row = dict(batch=batch, prefix=prefix, n=n, mask=mask, backend=impl,
                           err_ref=float(np.abs(got - want).max()))
                kv_bytes = batch * prefix * HKV * E * 2 * 2
                row["kv_bytes"] = kv_bytes
                copies = num_copies(kv_bytes)
                row["copies"] = copies
                row["ours_us"] = loop_time_us(ours, a, copies=copies)
                if args.breakdown and impl in ("mosaic", "triton"):
                    row["kernel_us"] = loop_time_us(_prefix_kernel(impl, scale), a, copies=copies)
                    row["glue_us"] = row["ours_us"] - row["kernel_us"]
                if args.triton and impl != "triton":
                    tri = lambda **kw: paged_attention(**kw, page_size=G, sm_scale=scale, implementation="triton")  # noqa
                    row["triton_err_ref"] = float(np.abs(np.asarray(tri(**a).astype(jnp.float32)) - want).max())
                    row["triton_us"] = loop_time_us(tri, a, copies=copies)
                if not args.no_reference:
                    row["ref_us"] = loop_time_us(ref, a, copies=min(copies, 4), trials=3)
                if not args.no_original:
                    try:
                        us, o, name = original_time_us(a, n)
                        row.update(orig_us=us, orig_kernel=name, err_orig=float(np.abs(o - want).max()))
                    except Exception as ex:  # report and keep going (e.g. originals not extracted)
                        row["orig_error"] = f"{type(ex).__name__}: {ex}"[:300]
                for k in ("ours", "triton", "ref", "orig"):
                    if f"{k}_us" in row and row[f"{k}_us"] > 0:
                        gbps = kv_bytes / (row[f"{k}_us"] * 1e-6) / 1e9
                        row[f"{k}_gbps"] = gbps
                        row[f"{k}_pct_copy"] = 100 * gbps / ceiling
                if "orig_us" in row:
                    row["ours_over_orig"] = row["ours_us"] / row["orig_us"]
                row["ok"] = row["err_ref"] <= TOL and row.get("err_orig", 0.0) <= 2 * TOL
                rows.append(row)
                if args.json:  # written after every shape: a run cut short still leaves its rows
                    _dump(args.json, rows, ceiling)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
                del a
    for n in ns:  # verify-vs-decode cost
        for batch in bss:
            for prefix in prefixes:
                r1 = [r for r in rows if (r["batch"], r["prefix"], r["n"]) == (batch, prefix, 1)]
                rn = [r for r in rows if (r["batch"], r["prefix"], r["n"]) == (batch, prefix, n)]
                if r1 and rn and n > 1:
                    rn[0]["ours_over_ours_n1"] = rn[0]["ours_us"] / r1[0]["ours_us"]
    _table(rows)
    if args.json:
        _dump(args.json, rows, ceiling)
    if args.png:
        _plot(rows, ceiling, args.png)
    return 0 if all(r["ok"] for r in rows) else 1


def _dump(path, rows, ceiling):
    result = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, copy_gbps=ceiling,
                  shape=dict(hq=HQ, hkv=HKV, head_dim=E, dtype="bfloat16", page_size=G), rows=rows)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def _table(rows):
    hdr = "| bs | prefix | N | ours (backend) us | % copy | SGLang us | % copy | ours/SGLang | jnp us | N/N=1 |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        f = lambda k, fmt="{:.1f}": fmt.format(r[k]) if k in r else "-"  # noqa: E731
        print(f"| {r['batch']} | {r['prefix']} | {r['n']} | {f('ours_us')} ({r['backend']}) | {f('ours_pct_copy')}% | "
              f"{f('orig_us')} | {f('orig_pct_copy')}% | {f('ours_over_orig', '{:.2f}')} | {f('ref_us')} | "
              f"{f('ours_over_ours_n1', '{:.2f}')} |" + (f" kernel {f('kernel_us')} glue {f('glue_us')}" if "kernel_us" in r else ""))


def _plot(rows, ceiling, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(6 * len(ns), 4.5), squeeze=False)
    for ax, n in zip(axes[0], ns):
        sub = [r for r in rows if r["n"] == n]
        labels = [f"{r['batch']}x{r['prefix']}" for r in sub]
        x = np.arange(len(sub))
        for i, (k, name) in enumerate((("ours", "jaxspec"), ("orig", "SGLang"), ("ref", "jnp"), ("triton", "Pallas-Triton"))):
            vals = [r.get(f"{k}_pct_copy", 0.0) for r in sub]
            if any(vals):
                ax.bar(x + (i - 1.5) * 0.2, vals, 0.2, label=name)
        ax.set_xticks(x, labels, rotation=60, fontsize=7)
        ax.set_title(f"N = {n}")
        ax.set_ylabel(f"% of copy bandwidth ({ceiling:.0f} GB/s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
