"""The matmuls of a SmolLM2-135M forward alone on XLA:CPU, by row count: do Q rows cost one read of the weights?

``python bench/cpu_matmul_probe.py [--rows 1,2,4,6] [--repeats 15] [--dtype float32|bfloat16]``

Random weights of SmolLM2-135M's shapes (hidden 576, 30 layers, MLP 1536, 9 + 2 x 3 heads of 64, tied 49152-row
head), too big together for the caches, so every call streams them from memory:

* ``layers_kn``: the 30 layers' four products chained (q/k/v ``[576, 960]``, o ``[576, 576]``, gate/up ``[576,
  3072]``, down ``[1536, 576]``; 425 MB in f32), each ``x @ W`` with ``W [in, out]`` as ``jaxspec.models.Decoder``
  stores it; ``layers_nk``: the same with ``W`` stored ``[out, in]`` and computed as ``(W @ x.T).T``;
* ``head_qd_vd``: the tied LM head as ``Decoder.logits`` computes it (``einsum("qd,vd->qv")``, 113 MB in f32);
  ``head_w_xT``: the same as ``(W @ x.T).T``.

Each function is called once (compile), then ``--repeats`` times interleaved with the others; the FASTEST call is
its cost (other processes on a shared CPU only ever add time). Run once per ``XLA_FLAGS`` setting; prints one JSON
line ``{"name/rows": ms}``.
"""

import json
import os
import time

import _cli


def main(argv=None):
    ap = _cli.parser("cpu_matmul_probe.py", __doc__)
    ap.add_argument("--rows", default="1,2,4,6", help="comma list of row counts")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per function and row count")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weight dtype")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    prec = jax.lax.Precision.HIGHEST
    dt = jnp.dtype(args.dtype)
    rng = np.random.default_rng(0)
    shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
    ws = [[jnp.asarray(rng.standard_normal(s) * 0.03, dt) for s in shapes] for _ in range(30)]
    wts = [[jnp.asarray(np.asarray(w, np.float32).T, dt) for w in layer] for layer in ws]
    head = jnp.asarray(rng.standard_normal((49152, 576)) * 0.03, dt)

    def dot(x, w):
        return jnp.dot(x.astype(dt), w, precision=prec, preferred_element_type=jnp.float32)

    def dot_t(x, w):
        return jnp.dot(w, x.astype(dt).T, precision=prec, preferred_element_type=jnp.float32).T

    def layers(mm):
        def run(x, weights):
            for a, b, c, d in weights:
                x = mm(x, a)[:, :576] + mm(x, b)
                x = x + mm(mm(x, c)[:, :1536], d)
            return x
        return run

    fns = {"layers_kn": (jax.jit(layers(dot)), ws), "layers_nk": (jax.jit(layers(dot_t)), wts),
           "head_qd_vd": (jax.jit(lambda x, w: jnp.einsum("qd,vd->qv", x.astype(dt), w, precision=prec,
                                                          preferred_element_type=jnp.float32)), head),
           "head_w_xT": (jax.jit(dot_t), head)}
    res = {}
    for q in [int(r) for r in args.rows.split(",")]:
        x = jnp.full((q, 576), 0.01, jnp.float32)
        for f, w in fns.values():
            jax.block_until_ready(f(x, w))
        best = {k: float("inf") for k in fns}
        for _ in range(args.repeats):
            for k, (f, w) in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f(x, w))
                best[k] = min(best[k], time.perf_counter() - t0)
        res.update({f"{k}/{q}": round(1e3 * v, 2) for k, v in best.items()})
    print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""), "dtype": args.dtype, "ms": res}))


if __name__ == "__main__":
    main()
