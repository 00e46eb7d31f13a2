"""Teacher-forced check of the MTP head: training's step predictions vs ``MTPDrafter``'s after a prefill.

``.venv/bin/python bench/draft_mtp_consistency.py [--head DIR] [--num-prompts 3] [--new-tokens 64]``

SmolLM2 (f32) answers the demo's chat prompts greedily. Train side: ``jaxspec.models.distill.mtp_step_logits``
(step ``s`` at row ``t`` fed the step ``s - 1`` hidden and token ``t + s + 1``, predicting token ``t + s + 2``).
Inference side: for every response prefix ``tokens[:c]``, the target's paged prefill and
``MTPDrafter.extend_after_prefill`` (chain ``SpecConfig(3, 1, 4)``): the drafts ``draft0, draft1, draft2``. Printed: per step,
how often the two sides agree at row ``c - 1`` (step ``s > 0`` only where ``draft0 .. draft(s-1)`` are the true tokens, so
both sides are fed the same tokens) and each side's agreement with the target's greedy tokens.
"""

from _chat_head import check_parser, load_check
from draft_consistency import jitted_sides, prefix_drafts


def train_side(model, tokens, steps):
    """Each step's draft tokens of the training forward (``jaxspec.models.distill``): ``[steps, T]`` for one
    sequence."""
    import jax.numpy as jnp

    from jaxspec.models.distill import mtp_step_logits

    _, outs = mtp_step_logits(model, jnp.asarray(tokens, jnp.int32)[None], steps)
    return jnp.stack([jnp.argmax(lg, -1)[0] for lg in outs])


def inference_side(model, drafter, spec, prompts, lens, r2t, zeros, slots: int, page_size=16):
    """``(topk_index i32[B, S], first i32[B])``: ``MTPDrafter``'s chain after the target's paged prefill of each
    right-padded prefix, and the target's first token per prefix."""
    import jax.numpy as jnp

    from jaxspec import pipeline

    b, p = prompts.shape
    meta = pipeline.prefill_metadata(lens, r2t, p, page_size=page_size, prefix_lens=zeros)
    logits, hidden, _ = model.forward(prompts, meta, model.make_cache(r2t, slots))
    first = jnp.argmax(logits[jnp.arange(b), lens - 1], -1).astype(jnp.int32)
    st = drafter.init_state(spec, r2t, slots)
    st = drafter.extend_after_prefill(spec, st, prompts, hidden, meta, lens, first)
    return st.topk_index, first


def main(argv=None):
    args = check_parser("draft_mtp_consistency.py", __doc__, "mtp", 3).parse_args(argv)
    setup, spec, eng = load_check(args, "mtp")
    model, drafter = setup.target, setup.drafter
    import numpy as np

    prompts = [np.asarray(p, np.int32) for p in setup.prompts]
    replies = eng.generate(prompts, args.new_tokens)
    state, f_train, f_inf = jitted_sides(model, drafter, spec, lambda m, d, seq: train_side(m, seq, spec.num_steps),
                                         inference_side)
    rows, width = args.new_tokens, 192
    agree, acc_t, acc_i, count = (np.zeros(spec.num_steps) for _ in range(4))
    for p, r in zip(prompts, replies.tokens):
        seq = np.concatenate([p, np.asarray(r, np.int32)])
        starts = tuple(range(len(p), len(seq) - spec.num_steps))
        if not starts:
            continue
        tr = np.asarray(f_train(state, seq))
        drafts, c = prefix_drafts(f_inf, state, seq, starts, spec, rows, width)
        ok = np.ones(len(c), bool)
        for s in range(spec.num_steps):
            t_s, i_s, true = tr[s, c - 1][ok], drafts[ok, s], seq[c + 1 + s][ok]
            agree[s] += (t_s == i_s).sum()
            acc_t[s] += (t_s == true).sum()
            acc_i[s] += (i_s == true).sum()
            count[s] += ok.sum()
            ok = ok & (drafts[:, s] == seq[c + 1 + s])
    for s in range(spec.num_steps):
        n = max(1.0, count[s])
        print(f"step {s} (n={int(count[s])}{', earlier drafts right' if s else ''}): train==infer {agree[s] / n:.3f}  "
              f"train acc {acc_t[s] / n:.3f}  infer acc {acc_i[s] / n:.3f}", flush=True)


if __name__ == "__main__":
    main()
