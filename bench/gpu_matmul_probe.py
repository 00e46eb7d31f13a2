"""A decode layer's four products at a few rows on the GPU: XLA's path as the decoder runs it against one Pallas
Triton kernel per product with the neighbouring small ops fused in.

``python bench/gpu_matmul_probe.py [--rows 1,16] [--layers 30] [--json PATH]``

SmolLM2-135M-Instruct's widths (hidden 576, MLP 1536, q/k/v 960 columns; random bf16 weights): ``--layers`` layers
of the products alone, chained as a layer chains them (attention left out: the q/k/v output, 960 wide, feeds the o
product directly, whose weight is ``[960, 576]`` here):

* ``xla``: ``jaxspec.models.Decoder``'s own modules (``RMSNorm``, ``Linear``, ``MLP``; a single row padded to two
  as the decoder pads it), so XLA:GPU fuses, pads and picks its GEMMs as in a decode step;
* ``pallas bn/bk/warps/stages``: one kernel per product: the RMSNorm in the q/k/v and gate/up kernels (the rows'
  mean square over the same pass, the scale after the product), SwiGLU in the gate/up kernel (a program computes a
  block of gate columns and the same block of up columns), the residual add in the o and down kernels; rows padded
  to 16 inside the kernel; a program per ``bn`` output columns walking ``K`` in ``bk`` steps.

Per variant: GPU time per chain (CUPTI, the sum of its kernels), kernels per chain, and the largest difference from
``xla`` over the last layer's output (bf16 products: the two sum in different orders). A probe of whether fusing
the small ops into the products pays on a launch-bound decode step; the library's decoder does not use it.
"""

import functools
import json
import time

import _cli
from _timing import cupti_kernels

MB = 16  # rows of a program's tile (tl.dot needs 16)


def _gemv(x, w, nw, r, *, bn, bk, warps, stages, norm_eps=None, swiglu=False):
    """``x f32[M, K] @ w bf16[K, N]`` (``N`` doubled for SwiGLU: gate then up) -> f32[M, N or N/2], rows padded to
    ``MB`` inside; ``nw``: RMSNorm weight (with ``norm_eps``); ``r``: residual f32[M, N] or None."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from jaxspec.kernels._triton import compiler_params, load, store

    m, k = x.shape
    n = w.shape[1] // (2 if swiglu else 1)
    steps = -(-k // bk)

    def kernel(x_ref, w_ref, nw_ref, r_ref, o_ref):
        rows = jnp.arange(MB, dtype=jnp.int32)
        row_ok = rows < m
        cols = pl.program_id(0) * bn + jnp.arange(bn, dtype=jnp.int32)
        col_ok = cols < n

        def step(t, carry):
            acc, acc_u, ss = carry
            ks = t * bk + jnp.arange(bk, dtype=jnp.int32)
            k_ok = ks < k
            a = load(x_ref.at[rows[:, None], ks[None, :]], mask=row_ok[:, None] & k_ok[None, :], other=0)
            if norm_eps is not None:
                ss = ss + jnp.sum(a * a, axis=1)
                a = a * load(nw_ref.at[ks], mask=k_ok, other=0).astype(jnp.float32)[None, :]
            a = a.astype(w_ref.dtype)
            wm = k_ok[:, None] & col_ok[None, :]
            b = load(w_ref.at[ks[:, None], cols[None, :]], mask=wm, other=0)
            acc = acc + jnp.dot(a, b, preferred_element_type=jnp.float32)
            if swiglu:
                bu = load(w_ref.at[ks[:, None], n + cols[None, :]], mask=wm, other=0)
                acc_u = acc_u + jnp.dot(a, bu, preferred_element_type=jnp.float32)
            return acc, acc_u, ss

        z = jnp.zeros((MB, bn), jnp.float32)
        acc, acc_u, ss = jax.lax.fori_loop(0, steps, step, (z, z, jnp.zeros((MB,), jnp.float32)))
        if norm_eps is not None:
            scale = jax.lax.rsqrt(ss / jnp.float32(k) + jnp.float32(norm_eps))[:, None]
            acc, acc_u = acc * scale, acc_u * scale
        if swiglu:
            acc = acc * jax.nn.sigmoid(acc) * acc_u
        ok = row_ok[:, None] & col_ok[None, :]
        if r is not None:
            acc = acc + load(r_ref.at[rows[:, None], cols[None, :]], mask=ok, other=0)
        store(o_ref.at[rows[:, None], cols[None, :]], acc, mask=ok)

    dummy = jnp.zeros((1,), jnp.float32)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(-(-n // bn),),
                          compiler_params=compiler_params(num_warps=warps, num_stages=stages),
                          interpret=jax.default_backend() == "cpu", name=f"probe_gemv_k{k}_n{n}")(
        x, w, dummy if nw is None else nw, dummy if r is None else r)


def main(argv=None):
    ap = _cli.parser("gpu_matmul_probe.py", __doc__)
    ap.add_argument("--rows", default="1,16", help="comma list of row counts (at most 16)")
    ap.add_argument("--layers", type=int, default=30, help="layers in the chain")
    ap.add_argument("--configs", default="16/64/4/3,32/64/4/3,64/64/4/3,16/128/4/3,32/128/4/3,64/128/4/3,"
                    "16/256/4/2,32/256/4/2,16/64/2/4,32/64/2/4,16/128/2/3,32/128/2/3",
                    help="comma list of bn/bk/warps/stages")
    ap.add_argument("--iterations", type=int, default=20, help="chains per CUPTI measurement")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.models import Decoder, DecoderConfig
    from jaxspec.models.decoder import _with_zero_row

    cfg = DecoderConfig(vocab_size=256, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
                        num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    model = Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    rng = np.random.default_rng(0)
    o_w = [jnp.asarray(rng.normal(0, 960 ** -0.5, (960, 576)), jnp.bfloat16) for _ in range(args.layers)]
    eps = cfg.rms_norm_eps
    layers = list(model.layers)
    sync = lambda: jax.block_until_ready(jnp.zeros(()))  # noqa: E731

    @jax.jit
    def xla_chain(x):
        b = x.shape[0]
        x = x[:, None, :]
        for layer, ow in zip(layers, o_w):
            two = b == 1
            h = layer.input_layernorm(_with_zero_row(x) if two else x)
            qkv = layer.self_attn.qkv_proj(h)[:b]
            x = x + jnp.einsum("bqd,df->bqf", qkv.astype(jnp.bfloat16), ow, preferred_element_type=jnp.float32)
            x = x + layer.mlp(layer.post_attention_layernorm(_with_zero_row(x) if two else x))[:b]
        return x[:, 0, :]

    def pallas_chain(cfgs):
        bn, bk, warps, stages = cfgs
        kw = dict(bn=bn, bk=bk, warps=warps, stages=stages)

        @jax.jit
        def run(x):
            for layer, ow in zip(layers, o_w):
                qkv = _gemv(x, layer.self_attn.qkv_proj.kernel[...], layer.input_layernorm.weight[...], None,
                            norm_eps=eps, **kw)
                x = _gemv(qkv, ow, None, x, **kw)
                h = _gemv(x, layer.mlp.gate_up_proj.kernel[...], layer.post_attention_layernorm.weight[...], None,
                          norm_eps=eps, swiglu=True, **kw)
                x = _gemv(h, layer.mlp.down_proj.kernel[...], None, x, **kw)
            return x

        return run

    rows_out = []
    for m in (int(r) for r in args.rows.split(",") if r):
        x = jnp.asarray(rng.normal(size=(m, 576)), jnp.float32)
        ref = np.asarray(jax.block_until_ready(xla_chain(x)))
        variants = [("xla", xla_chain)] + [
            ("pallas " + c, pallas_chain(tuple(int(v) for v in c.split("/")))) for c in args.configs.split(",") if c]
        for name, fn in variants:
            t0 = time.perf_counter()
            try:
                out = np.asarray(jax.block_until_ready(fn(x)))
            except Exception as e:  # noqa: BLE001 -- a config the Triton compiler refuses is a row of its own
                rows_out.append(dict(rows=m, variant=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
                print(f"rows {m:2d} {name:24s} error {type(e).__name__}", flush=True)
                continue
            compile_s = time.perf_counter() - t0
            per = cupti_kernels(lambda: fn(x), sync, args.iterations)
            us = None if per is None else sum(per.values())
            count = getattr(cupti_kernels, "last_count", None)
            diff = float(np.max(np.abs(out - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
            row = dict(rows=m, variant=name, gpu_us=us, kernels=count, compile_s=compile_s, max_rel_diff=diff,
                       top=None if per is None else sorted(per.items(), key=lambda kv: -kv[1])[:6])
            rows_out.append(row)
            print(f"rows {m:2d} {name:24s} {us if us is None else round(us, 1)} us  {count} kernels  "
                  f"diff {diff:.2e}  (compile {compile_s:.1f} s)", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(device=str(jax.devices()[0].device_kind), layers=args.layers, rows=rows_out), f,
                              indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
