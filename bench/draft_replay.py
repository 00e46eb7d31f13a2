"""A draft head's replayed accept length by chain depth, on greedy conversations (``jaxspec.models.replay``).

``python bench/draft_replay.py --model GGUF --head DIR --data PATH [--depths 1,2,3,4,5,6,7,8] [--rows 512]
[--batch 32] [--device cpu|gpu] [--json PATH]``

``--data``: greedy conversations (a ``data.npz`` or a seeded data folder, e.g. ``python -m jaxspec.train_draft
--stage data --recipe seeded --greedy-fraction 1 --seed 1``: held out of the head's training); the first
``--rows`` are replayed. One teacher-forced forward of ``max(--depths)`` draft steps per batch of rows gives the
rounds of every chain depth at once: the accept length (tokens per round) a greedy chain ``SpecConfig(S, 1, S + 1)``
would reach on these replies, per depth, without decoding. Weighing each depth against its round cost (a round of
``S + 1`` verify rows, ``bench/e2e.py``) picks the chain to ship; trees are not replayed.
"""

import json
import sys
import time

import _cli


def main(argv=None):
    ap = _cli.parser("draft_replay.py", __doc__)
    ap.add_argument("--model", required=True, help="the target: a .gguf file or a checkpoint directory")
    ap.add_argument("--head", required=True, help="an EAGLE-3 or MTP head directory (jaxspec.models.head_kind)")
    ap.add_argument("--data", required=True, help="greedy conversations: a data.npz or a seeded data folder")
    ap.add_argument("--depths", default="1,2,3,4,5,6,7,8", help="comma list of chain depths S")
    ap.add_argument("--rows", type=int, default=512, help="conversations replayed (the first N)")
    ap.add_argument("--batch", type=int, default=32, help="conversations per forward")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform")
    ap.add_argument("--json", default=None, help="write the result here")
    args = _cli.parse_on_device(lambda a: ap.parse_args(a), argv)
    depths = sorted({int(x) for x in args.depths.split(",") if x})
    if not depths or depths[0] < 1:
        raise SystemExit(f"--depths: expected chain depths >= 1, got {args.depths!r}")
    import jax
    import jax.numpy as jnp

    from jaxspec.data.self_distill import load_data
    from jaxspec.models.distill_step import distill_step
    from jaxspec.models.heads import head_kind, load_target_with_head
    from jaxspec.models.replay import replay_accept_length

    kind = head_kind(args.head)
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    tw = load_target_with_head(args.model, args.head, kind=kind, param_dtype=dtype, head_param_dtype=dtype,
                               num_draft_steps=depths[-1] if kind == "mtp" else None)
    if kind == "eagle3":
        ds = distill_step(tw.target, tw.drafter.model, "eagle3", steps=1, lr=1e-3, ttt_length=depths[-1])
    else:
        ds = distill_step(tw.target, tw.target, "mtp", steps=1, lr=1e-3, mtp_steps=depths[-1])
    tokens, lens, rs = (a[:args.rows] for a in load_data(args.data))
    t0 = time.perf_counter()
    res = replay_accept_length(lambda t: ds.predict(ds.master, ds.frozen, jnp.asarray(t), depths[-1]), tokens, lens,
                               rs, batch=min(args.batch, len(lens)), depths=depths)
    out = dict(model=args.model, head=args.head, kind=kind, data=args.data, rows=int(len(lens)),
               seconds=time.perf_counter() - t0, device=str(jax.devices()[0].device_kind),
               accept_by_depth={int(d): a for d, a in res["by_depth"].items()})
    for d, a in out["accept_by_depth"].items():
        print(f"chain depth {d}: replayed accept length {a:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
