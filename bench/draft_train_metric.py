"""An EAGLE-3 head's training metric (top-1 agreement per TTT step) on fresh conversations of the training recipe
and on the demo's chat prompts, split by where in the response the predicted token lies.

``.venv/bin/python bench/draft_train_metric.py [--head DIR] [--num-prompts 8] [--response-len 256] [--seed 1]``

Train-like: the training data stage (``jaxspec.data.self_distill``) on this machine (f32; ``--seed`` other than the shipped head's 0
gives conversations it has not seen), greedy for the first half, T=0.7 for the rest. Chat: the demo's prompts
(SmolLM2's chat template), greedy replies of ``--response-len`` tokens. Per set: ``eagle3_losses``' accept per
step (what training logs), then step 0's agreement by response-position bucket and by greedy / sampled rows.
"""

import os
import sys
import tempfile

import _cli
from _chat_head import load_chat_head


def main(argv=None):
    ap = _cli.parser("draft_train_metric.py", __doc__)
    ap.add_argument("--head", default=None, help="EAGLE-3 head directory (default: the shipped SmolLM2 head)")
    ap.add_argument("--num-prompts", type=int, default=8, help="conversations per set")
    ap.add_argument("--response-len", type=int, default=256, help="reply tokens per conversation")
    ap.add_argument("--seed", type=int, default=1, help="data seed (training used 0: 1 gives unseen conversations)")
    ap.add_argument("--ttt-length", type=int, default=3, help="draft steps measured")
    ap.add_argument("--out", default=None, help="data folder (default: a temporary one)")
    ap.add_argument("--sets", default="train-like,chat,chat-user-only",
                    help="comma-separated: train-like, chat (the demo's prompts in SmolLM2's chat template, which "
                         "adds a default system turn), chat-user-only (the same prompts in train_draft's format: "
                         "user turn only, as the training data)")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.data.chat_prompts import CHAT_PROMPTS as PROMPTS
    from jaxspec.data.self_distill import chatml_ids, generate_data, load_data, response_mask
    from jaxspec.engine import Engine
    from jaxspec.models.distill import eagle3_losses, eagle3_step_logits, shift_rows

    setup = load_chat_head(args.head, "eagle3", len(PROMPTS))
    target, head = setup.target, setup.drafter.model
    want = set(args.sets.split(","))
    user, asst, eot = chatml_ids(setup.gguf)
    sets = {}
    if "train-like" in want:
        out = args.out or tempfile.mkdtemp(prefix="draft_metric_")
        os.makedirs(out, exist_ok=True)
        generate_data(target, out, num_prompts=args.num_prompts, prompt_len=64, response_len=args.response_len,
                      gen_batch=args.num_prompts, user_prefix=user, assistant_prefix=asst, eot_id=eot, seed=args.seed)
        tokens, lens, rs = load_data(os.path.join(out, "data.npz"))
        sets["train-like"] = (tokens, lens, rs, np.arange(len(lens)) < int(round(0.5 * args.num_prompts)))
    chats = {"chat": setup.prompts}
    if "chat-user-only" in want:
        from jaxspec.text import Tokenizer

        tok = Tokenizer.from_file(setup.gguf)
        chats["chat-user-only"] = [list(user) + tok.encode(t, add_special_tokens=False) + list(asst) for t in PROMPTS]
    for name, prompts in chats.items():
        if name not in want:
            continue
        ctx = -(-(max(len(p) for p in prompts) + args.response_len + 8) // 16) * 16
        eng = Engine(target, None, max_context=ctx, page_size=16, max_batch=len(prompts), eos_id=setup.eos_id)
        replies = eng.generate([np.asarray(p, np.int32) for p in prompts], args.response_len)
        seqs = [np.concatenate([np.asarray(p, np.int32), np.asarray(r, np.int32)]) for p, r in zip(prompts,
                                                                                                    replies.tokens)]
        ct = np.zeros((len(seqs), max(len(q) for q in seqs)), np.int32)
        for i, q in enumerate(seqs):
            ct[i, :len(q)] = q
        sets[name] = (ct, np.asarray([len(q) for q in seqs], np.int32), np.asarray([len(p) for p in prompts], np.int32),
                      np.ones(len(seqs), bool))
    graphdef, state = nnx.split((target, head))
    k = args.ttt_length

    @jax.jit
    def metrics(st, toks, msk):
        tg, hd = nnx.merge(graphdef, st)
        _, acc = eagle3_losses(hd, tg, toks, msk, k)
        logits, (s0, *_) = eagle3_step_logits(hd, tg, toks, 1)
        hit = hd.token_ids[...][jnp.argmax(s0, -1)] == shift_rows(jnp.argmax(logits, -1), 1)
        return acc, hit, shift_rows(msk, 2)

    for name, (toks, ln, start, greedy) in sets.items():
        msk = response_mask(toks, ln, start)
        acc, hit, lm = (np.asarray(x) for x in metrics(state, jnp.asarray(toks), jnp.asarray(msk)))
        print(f"{name}: {len(ln)} conversations, {int(msk.sum())} response tokens, mean response "
              f"{float(np.mean(ln - start)):.0f} tokens; training's accept per step {np.round(acc, 3).tolist()}")
        pos = np.arange(toks.shape[1])[None, :] + 2 - start[:, None]  # response index of the predicted token
        for lo, hi in ((0, 32), (32, 64), (64, 128), (128, 256), (256, 10**6)):
            sel = lm & (pos >= lo) & (pos < hi)
            if sel.any():
                print(f"  step 0, response tokens [{lo}, {hi}): {hit[sel].mean():.3f} (n={int(sel.sum())})")
        for label, rows in (("greedy", greedy), ("sampled", ~greedy)):
            sel = lm & rows[:, None]
            if sel.any():
                print(f"  step 0, {label} replies: {hit[sel].mean():.3f} (n={int(sel.sum())})")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
