"""Per-stage time of the EAGLE-3 drafter's training step (``jaxspec.models.distill_step``) on random weights shaped like
SmolLM2-135M (hidden 576, 30 layers, 9 heads, 3 KV heads, MLP 1536, vocabulary 49152, tied embeddings; no
download): the target's forward (``teacher``), the draft's training-time test forward + backward (``student``), the
optimizer (``update``), and the step as training runs it, per draft vocabulary.

``python bench/train_profile.py --out train_profile.json [--batch 64] [--seq 329] [--ttt-length 7]
[--draft-vocabs 8192,32768] [--teacher-attention reference,cudnn] [--reps 5] [--fused] [--device cpu|gpu|auto]``

The recipe's shape (``bench/train_heads.sh``): batch 64, sequences of at most 3 + 64 + 6 + 256 = 329 tokens (user
prefix, user turn, assistant prefix, reply), TTT 7, the loss over the reply rows. Each stage is jitted alone and
timed ``--reps`` times after a warm-up call (median, blocking on its result); ``step`` is the three stages called
back to back, blocking once at the end; ``--fused`` also times ``DistillStep.step``, the single jitted function
``jaxspec.train_draft`` runs (one more compilation). bf16 weights on a GPU, f32 on the CPU. Tokens per second count
``batch * seq`` per step. ``--teacher-attention``: the teacher's dense attention (``pipeline.dense_metadata``'s
``attention``), one row per value and vocabulary: the A/B of the same step in one run. Writes JSON to ``--out``.
"""

import json
import os
import statistics
import time

import _cli


def smollm2_135m_config(num_layers: int = 30):
    """SmolLM2-135M's shape as a ``DecoderConfig`` (random weights need no checkpoint)."""
    from jaxspec.models import DecoderConfig

    return DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=num_layers,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                         rope_theta=100000.0, rms_norm_eps=1e-5)


def _median_ms(fn, reps: int) -> float:
    import jax

    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def profile(cfg, *, batch: int, seq: int, draft_vocab: int, ttt_length: int, reps: int, fused: bool,
            reply_start: int = 73, seed: int = 0, teacher_attention: str = "reference") -> dict:
    """One draft vocabulary's stage times (milliseconds) and tokens per second."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.models import Decoder
    from jaxspec.models.distill_step import distill_step
    from jaxspec.models.eagle3 import EAGLE3Model, Eagle3Config, aux_layers_from_ids, default_aux_layer_ids

    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    n = cfg.num_hidden_layers
    ids = default_aux_layer_ids(n) if n >= 7 else tuple(range(min(3, n)))
    target = Decoder(cfg, rngs=nnx.Rngs(seed), param_dtype=dtype,
                     aux_layers=aux_layers_from_ids(ids, cfg.num_hidden_layers))
    vd = min(draft_vocab, cfg.vocab_size)
    ecfg = Eagle3Config.for_target(cfg, draft_vocab_size=vd, aux_layer_ids=ids)
    d2t = np.sort(np.random.default_rng(seed).choice(cfg.vocab_size, vd, replace=False)) - np.arange(vd)
    head = EAGLE3Model(ecfg, rngs=nnx.Rngs(seed + 1), param_dtype=dtype, kv_dtype=target.kv_dtype, d2t=d2t)
    ds = distill_step(target, head, "eagle3", steps=1000, lr=5e-4, ttt_length=ttt_length,
                      teacher_attention=teacher_attention)
    rng = np.random.default_rng(seed)
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, seq)), jnp.int32)
    mask = np.zeros((batch, seq), bool)
    mask[:, min(reply_start, seq // 4):] = True
    msk = jnp.asarray(mask)
    m, o, fr = ds.master, ds.opt_state, ds.frozen
    t0 = time.perf_counter()
    teach = jax.block_until_ready(ds.teacher(m, fr, toks))
    grads, losses, _ = jax.block_until_ready(ds.student(m, fr, teach, toks, msk))
    jax.block_until_ready(ds.update(m, o, grads))
    compile_s = time.perf_counter() - t0

    def chained():
        g, lo, _ = ds.student(m, fr, ds.teacher(m, fr, toks), toks, msk)
        return ds.update(m, o, g), lo

    row = dict(draft_vocab=vd, teacher_attention=teacher_attention, batch=batch, seq=seq, ttt_length=ttt_length,
               dtype=jnp.dtype(dtype).name,
               compile_s=round(compile_s, 1), loss_step0=float(losses[0]),
               teacher_ms=_median_ms(lambda: ds.teacher(m, fr, toks), reps),
               student_ms=_median_ms(lambda: ds.student(m, fr, teach, toks, msk), reps),
               update_ms=_median_ms(lambda: ds.update(m, o, grads), reps),
               step_ms=_median_ms(chained, reps))
    if fused:
        row["fused_step_ms"] = _median_ms(lambda: ds.step(m, o, fr, toks, msk), reps)
    best = min(row["step_ms"], row.get("fused_step_ms", row["step_ms"]))
    row["tokens_per_s"] = batch * seq / (best / 1e3)
    row["head_params"] = int(sum(v.size for v in m.values()))
    return row


def main(argv=None):
    ap = _cli.parser("train_profile.py", __doc__)
    ap.add_argument("--out", required=True, help="JSON result path")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--seq", type=int, default=329, help="tokens per sequence")
    ap.add_argument("--ttt-length", type=int, default=7, help="training-time test steps")
    ap.add_argument("--draft-vocabs", default="8192,32768", help="comma-separated draft vocabularies (49152: all)")
    ap.add_argument("--teacher-attention", default="reference",
                    help="comma list of the teacher's dense attention: reference, xla, cudnn (GPU, bf16)")
    ap.add_argument("--layers", type=int, default=30, help="target layers (SmolLM2-135M: 30; fewer for a smoke run)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per stage (median)")
    ap.add_argument("--fused", action="store_true", help="also time the single jitted step training runs")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="JAX platform")
    args = _cli.parse_on_device(ap.parse_args, argv)
    for name in ("batch", "seq", "ttt_length", "layers", "reps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    vocabs = [int(v) for v in args.draft_vocabs.split(",") if v.strip()]
    if not vocabs or min(vocabs) < 1:
        raise ValueError(f"--draft-vocabs: expected positive integers, got {args.draft_vocabs!r}")
    import jax

    from jaxspec.pipeline import DENSE_ATTENTION

    atts = [a.strip() for a in args.teacher_attention.split(",") if a.strip()]
    if not atts or any(a not in DENSE_ATTENTION for a in atts):
        raise ValueError(f"--teacher-attention: expected a comma list of {', '.join(DENSE_ATTENTION)}, got "
                         f"{args.teacher_attention!r}")

    cfg = smollm2_135m_config(args.layers)
    rows = []
    for vd in vocabs:
        for att in atts:
            row = profile(cfg, batch=args.batch, seq=args.seq, draft_vocab=vd, ttt_length=args.ttt_length,
                          reps=args.reps, fused=args.fused, teacher_attention=att)
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = dict(backend=jax.default_backend(), device=str(jax.devices()[0].device_kind),
                  target="SmolLM2-135M shape, random weights", layers=args.layers, rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
