"""The cost of a Q-row target forward against a 1-row one on XLA:CPU, for a real checkpoint at batch 1.

``python bench/cpu_forward_probe.py [--model smollm2-135m-instruct|random] [--rows 1,2,4,6] [--prefix 160]
[--repeats 15] [--dtype float32|bfloat16] [--parts]``

Loads the target (a named model is fetched into the user cache; ``random``: random weights at SmolLM2-135M's
shape, ``RANDOM_SMOLLM2``, which is all a timing needs), builds a paged cache whose committed prefix is
``--prefix`` tokens, and times the jitted ``forward`` over ``Q`` fresh rows (causal ``qmask``, K/V written past the
prefix) for each ``Q`` in ``--rows``: one compile call each, then ``--repeats`` timed calls interleaved across the row
counts; each row count's FASTEST call is its cost (on a shared CPU other processes only ever add time), the median
and the ratio of medians are printed beside it. ``--parts`` also times the LM head product alone (as
``Decoder.logits`` computes it) and one decoder layer's matmuls alone. Run it once per ``XLA_FLAGS`` setting (the flags are read when JAX starts its CPU backend)::

    XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=" .venv/bin/python bench/cpu_forward_probe.py

Prints one line per row count and a JSON line (``--json PATH`` writes it to a file too).
"""

import json
import os
import time

import _cli

# SmolLM2-135M-Instruct's shape (its config.json), for ``--model random``.
RANDOM_SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                      rope_theta=100000.0, tie_word_embeddings=True)


def _parse(argv=None):
    ap = _cli.parser("cpu_forward_probe.py", __doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a named model, .gguf file, HF directory or 'random'")
    ap.add_argument("--rows", default="1,2,4,6", help="comma list of fresh-row counts Q")
    ap.add_argument("--prefix", type=int, default=160, help="committed tokens attended to (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per row count (default: %(default)s)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weight dtype")
    ap.add_argument("--parts", action="store_true", help="also time the LM head product and one layer's matmuls")
    ap.add_argument("--json", default=None, help="write the result here too")
    return ap.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.models import Decoder, DecoderConfig, fetch_model, load_model, make_req_to_token
    from jaxspec.models.decoder import tied_head
    from jaxspec.models.fetch import MODELS
    from jaxspec.pipeline import causal_qmask
    from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token

    dtype = jnp.dtype(args.dtype)
    t0 = time.perf_counter()
    if args.model == "random":
        path = "random-smollm2-135m"
        model = Decoder(DecoderConfig(**RANDOM_SMOLLM2), rngs=nnx.Rngs(0), param_dtype=dtype)
    else:
        path = str(fetch_model(args.model, quiet=True)) if args.model in MODELS else args.model
        model = load_model(path, param_dtype=dtype)
    load_s = time.perf_counter() - t0
    rows = [int(r) for r in args.rows.split(",")]
    g, width = 16, -(-(args.prefix + max(rows) + 1) // 16) * 16
    r2t = jnp.asarray(make_req_to_token(1, width, g))
    graphdef, params = nnx.split(model)

    @jax.jit
    def fwd(params, tokens, meta, cache):
        m = nnx.merge(graphdef, params)
        logits, _, cache = m.forward(tokens, meta, cache)
        return jnp.argmax(logits, -1), cache

    def meta_for(q):
        pos = args.prefix + jnp.arange(q, dtype=jnp.int32)[None]
        return AttentionMetadata(positions=pos, qmask=causal_qmask(1, q),
                                 prefix_lens=jnp.array([args.prefix], jnp.int32),
                                 page_table=page_table_from_req_to_token(r2t, g),
                                 write_locs=r2t[:, args.prefix:args.prefix + q], page_size=g)

    cache = model.make_cache(r2t, int(r2t.max()) + 1)
    inputs = {q: (jnp.ones((1, q), jnp.int32), meta_for(q)) for q in rows}
    compile_s, times = {}, {q: [] for q in rows}
    for q in rows:
        t0 = time.perf_counter()
        out, cache = jax.block_until_ready(fwd(params, *inputs[q], cache))
        compile_s[q] = time.perf_counter() - t0
    for _ in range(args.repeats):
        for q in rows:
            t0 = time.perf_counter()
            out, cache = jax.block_until_ready(fwd(params, *inputs[q], cache))
            times[q].append(time.perf_counter() - t0)
    best = {q: min(ts) for q, ts in times.items()}
    res = {"model": os.path.basename(path), "dtype": args.dtype, "prefix": args.prefix,
           "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_s": round(load_s, 1),
           "forward_ms": {q: round(1e3 * best[q], 2) for q in rows},
           "median_ms": {q: round(1e3 * float(np.median(times[q])), 2) for q in rows},
           "over_1row": {q: round(best[q] / best[rows[0]], 3) for q in rows},
           "median_over_1row": {q: round(float(np.median(times[q]) / np.median(times[rows[0]])), 3) for q in rows},
           "compile_s": {q: round(compile_s[q], 1) for q in rows}}
    if args.parts:
        c = model.cfg
        w_head = model.embed_tokens[...] if model.lm_head is None else model.lm_head.kernel[...]
        layer = model.layers[0]
        ws = [layer.self_attn.qkv_proj.kernel[...], layer.self_attn.o_proj.kernel[...],
              layer.mlp.gate_up_proj.kernel[...], layer.mlp.down_proj.kernel[...]]
        prec = jax.lax.Precision.HIGHEST
        # the head as Decoder.logits computes it (tied: decoder.tied_head; else the lm_head Linear's product)
        head = jax.jit(tied_head if model.lm_head is None else
                       lambda x, w: jnp.dot(x, w, precision=prec, preferred_element_type=jnp.float32))
        mats = jax.jit(lambda x, ws: [jnp.dot(x[:, : w.shape[0]] if x.shape[1] >= w.shape[0] else
                                              jnp.tile(x, (1, -(-w.shape[0] // x.shape[1])))[:, : w.shape[0]], w,
                                              precision=prec, preferred_element_type=jnp.float32) for w in ws])
        xs = {q: jnp.ones((q, c.hidden_size), dtype) for q in rows}
        part = {"head": {q: [] for q in rows}, "layer_matmuls": {q: [] for q in rows}}
        for q in rows:
            jax.block_until_ready(head(xs[q], w_head))
            jax.block_until_ready(mats(xs[q], ws))
        for _ in range(args.repeats):
            for q in rows:
                t0 = time.perf_counter()
                jax.block_until_ready(head(xs[q], w_head))
                part["head"][q].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                jax.block_until_ready(mats(xs[q], ws))
                part["layer_matmuls"][q].append(time.perf_counter() - t0)
        res["parts_ms"] = {k: {q: round(1e3 * min(v[q]), 2) for q in rows} for k, v in part.items()}
    for q in rows:
        print(f"Q={q}: forward {res['forward_ms'][q]:.1f} ms (median {res['median_ms'][q]:.1f}) = "
              f"{res['over_1row'][q]:.2f} one-row forwards (medians: {res['median_over_1row'][q]:.2f}); "
              f"compile {res['compile_s'][q]:.1f} s")
    print(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
