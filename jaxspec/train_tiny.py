"""Train a shipped target + MTP draft pair on the repo's corpus and save it as a checkpoint directory.

``python -m jaxspec.train_tiny --out DIR [--config tiny|demo] [--steps 3000] [--batch 64]``. ``--config tiny``
(``TINY_PAIR_CONFIG``, the shipped ``jaxspec/assets/tiny_pair``: target / MTP top-1 accuracy 0.92 /
0.93-0.94): ~70 s on one H200; on CPU use e.g. ``--steps 600 --batch 32`` (a few minutes). ``--config demo``
(``DEMO_PAIR_CONFIG``, 24 layers 32 wide, the shipped ``jaxspec/assets/demo_pair``: accuracy 0.92 / 0.93-0.94):
the shipped one is ``--config demo --steps 2500 --batch 32``, 1545 s on a 2-core CPU (a few
minutes on one H200). ``DIR`` gets
``config.json`` + ``model.safetensors`` (``jaxspec.models.checkpoint``'s layout, float32: the loaded model is
exactly the trained one); load it with ``jaxspec.models.load_pair(DIR)`` or ``python -m jaxspec.demo
--weights DIR``. Losses: target next-token cross-entropy, plus for MTP layer ``s`` the next-``(s+2)``-token
cross-entropy given the previous layer's hidden state (target hidden for ``s == 0``) and the embedding of
token ``p + s + 1``.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from jaxspec.corpus import make_stream
from jaxspec.models import DecoderConfig, MockVocab, MTPModel, save_pair
from jaxspec.models.io import PAIR_CONFIGS
from jaxspec.protocols import AttentionMetadata
from jaxspec.pipeline import causal_qmask


def _dense_meta(b: int, ctx: int) -> AttentionMetadata:
    """A causal forward over ``ctx`` fresh tokens with no cache (training)."""
    pos = jnp.broadcast_to(jnp.arange(ctx, dtype=jnp.int32)[None], (b, ctx))
    return AttentionMetadata(positions=pos, qmask=causal_qmask(b, ctx), prefix_lens=jnp.zeros((b,), jnp.int32),
                             page_table=jnp.zeros((b, 0), jnp.int32))


def losses(model: MTPModel, seqs: jax.Array, ctx: int):
    """Per-head mean cross-entropies. ``seqs: i32[B, ctx + S + 1]``; returns ``f32[1 + S]``."""
    inp = _dense_meta(seqs.shape[0], ctx)
    logits, h, _ = model.forward(seqs[:, :ctx], inp, None)
    out = [optax.softmax_cross_entropy_with_integer_labels(logits, seqs[:, 1 : ctx + 1]).mean()]
    for s in range(model.num_mtp_layers):
        logits, h, _ = model.mtp_forward(s, h, seqs[:, s + 1 : s + 1 + ctx], inp, None)
        out.append(optax.softmax_cross_entropy_with_integer_labels(logits, seqs[:, s + 2 : s + 2 + ctx]).mean())
    return jnp.stack(out)


def accuracies(model: MTPModel, seqs: jax.Array, ctx: int):
    """Greedy top-1 accuracy per head (target, MTP 0..S-1)."""
    inp = _dense_meta(seqs.shape[0], ctx)
    logits, h, _ = model.forward(seqs[:, :ctx], inp, None)
    acc = [jnp.mean((jnp.argmax(logits, -1) == seqs[:, 1 : ctx + 1]).astype(jnp.float32))]
    for s in range(model.num_mtp_layers):
        logits, h, _ = model.mtp_forward(s, h, seqs[:, s + 1 : s + 1 + ctx], inp, None)
        acc.append(jnp.mean((jnp.argmax(logits, -1) == seqs[:, s + 2 : s + 2 + ctx]).astype(jnp.float32)))
    return jnp.stack(acc)


def train(cfg: DecoderConfig, *, steps: int, batch: int, ctx: int, lr: float, seed: int):
    vocab = MockVocab(vocab_size=cfg.vocab_size)
    data = vocab.encode(make_stream(seed=seed))
    model = MTPModel(cfg, rngs=nnx.Rngs(seed), kv_dtype=jnp.float32)
    graphdef, params = nnx.split(model, nnx.Param)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, min(100, steps // 10 + 1), steps, lr * 0.05)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))
    opt_state = opt.init(params)
    span = ctx + cfg.num_nextn_predict_layers + 1

    @jax.jit
    def step(params, opt_state, seqs):
        def loss_fn(p):
            per_head = losses(nnx.merge(graphdef, p), seqs, ctx)
            return per_head[0] + 0.5 * jnp.sum(per_head[1:]), per_head

        (_, per_head), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, per_head

    rng = np.random.default_rng(seed)
    bar = tqdm(range(steps), desc="train", mininterval=2.0)
    for i in bar:
        starts = rng.integers(0, len(data) - span, batch)
        seqs = jnp.asarray(np.stack([data[s : s + span] for s in starts]))
        params, opt_state, per_head = step(params, opt_state, seqs)
        if i % 100 == 0 or i == steps - 1:
            bar.set_postfix(loss=" ".join(f"{x:.3f}" for x in np.asarray(per_head)))
    model = nnx.merge(graphdef, params)
    starts = np.random.default_rng(seed + 7).integers(0, len(data) - span, 64)
    acc = np.asarray(accuracies(model, jnp.asarray(np.stack([data[s : s + span] for s in starts])), ctx))
    return model, acc


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.train_tiny",
        description="Train the tiny target + MTP draft pair on the repo's corpus and save it as a checkpoint "
                    "directory (config.json + model.safetensors) at --out.",
    )
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="checkpoint directory to write (created; never defaults into the installed package)")
    ap.add_argument("--config", choices=sorted(PAIR_CONFIGS), default="tiny",
                    help="model shape: tiny (TINY_PAIR_CONFIG, 2 target layers: the tests' pair) or demo "
                         "(DEMO_PAIR_CONFIG, 24 target layers, 32 wide: the demo's pair) (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step (default: %(default)s)")
    ap.add_argument("--ctx", type=int, default=64, help="context length of a training sequence (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3,
                    help="peak AdamW learning rate, warmup + cosine decay (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the initialisation, corpus and batches (default: %(default)s)")
    return ap


def main(argv=None):
    args = _parser().parse_args(argv)
    cfg = PAIR_CONFIGS[args.config]
    t0 = time.time()
    model, acc = train(cfg, steps=args.steps, batch=args.batch, ctx=args.ctx, lr=args.lr, seed=args.seed)
    print(f"trained in {time.time() - t0:.0f}s; top-1 accuracy target / MTP layers: {np.round(acc, 3).tolist()}")
    save_pair(model, args.out, steps=args.steps, accuracy=[float(a) for a in acc])
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
