"""Teacher-forced check of an EAGLE-3 head: training's step predictions vs the drafter's inference proposals.

``.venv/bin/python bench/draft_consistency.py [--head DIR] [--num-prompts 4] [--new-tokens 64] [--synth]``

SmolLM2 (f32, the fetched GGUF) answers the demo's chat prompts greedily (``--synth``: also Magpie-style
self-synthesized user turns, as ``jaxspec.data.self_distill`` makes them). On each conversation:

* train side: the training forward (``jaxspec.models.distill.eagle3_step_logits``) (the target's dense forward, ``ttt_forward``) gives, at row ``t``,
  step 0's draft token for ``t + 2`` and step 1's for ``t + 3`` (step 1 teacher-forced: fed token ``t + 2``);
* inference side: for every response prefix ``tokens[:c]`` (one batch row each) the target's paged prefill,
  ``EAGLE3Drafter.extend_after_prefill`` and the chain ``propose`` (``SpecConfig(3, 1, 4)``) give the drafts
  ``draft0`` (for ``c + 1``), ``draft1`` (``c + 2``) as the engine computes them;

and prints, per conversation and in all, how often the two sides agree position by position (``row c - 1`` vs
prefix ``c``; step 1 only where ``draft0`` is the true token, so both sides are fed the same tokens) and each side's
top-1 agreement with the target's greedy tokens.
"""

from _chat_head import check_parser, load_check


def train_side(head, target, tokens):
    """Step 0 / step 1 draft tokens (target ids) of the training forward (``jaxspec.models.distill``): ``[2, T]``
    for one sequence."""
    import jax.numpy as jnp

    from jaxspec.models.distill import eagle3_step_logits

    _, outs = eagle3_step_logits(head, target, jnp.asarray(tokens, jnp.int32)[None], 2)
    ids = head.token_ids[...]
    return jnp.stack([ids[jnp.argmax(lg, -1)][0] for lg in outs])


def prefixes(tokens, starts, spec, rows: int, width: int, page_size=16):
    """``rows`` right-padded prefixes ``tokens[:c]`` of ``width`` tokens (``c`` in ``starts``, the last one repeated
    to fill the rows: one compile for all sequences), their lengths and a slot table."""
    import numpy as np

    from jaxspec.protocols import make_req_to_token

    if len(starts) > rows or max(starts) > width:
        raise ValueError(f"starts: {len(starts)} prefixes up to {max(starts)} tokens exceed {rows} x {width}")
    starts = list(starts) + [starts[-1]] * (rows - len(starts))
    b, p = rows, width
    width = -(-(p + spec.num_steps + 2) // page_size) * page_size
    prompts = np.zeros((b, p), np.int32)
    for i, c in enumerate(starts):
        prompts[i, :c] = tokens[:c]
    return prompts, np.asarray(starts, np.int32), make_req_to_token(b, width, page_size)


def inference_side(target, drafter, spec, prompts, lens, r2t, zeros, slots: int, page_size=16):
    """Chain drafts ``i32[B, S]`` of the drafter after the target's paged prefill of each right-padded prefix
    (``prompts [B, P]``, ``lens``), as the engine's prefill + first ``propose`` compute them, and the target's
    first token per prefix."""
    import jax.numpy as jnp

    from jaxspec import pipeline

    b, p = prompts.shape
    meta = pipeline.prefill_metadata(lens, r2t, p, page_size=page_size, prefix_lens=zeros)  # run-time zeros (no constant folding)
    logits, hidden, _ = target.forward(prompts, meta, target.make_cache(r2t, slots))
    first = jnp.argmax(logits[jnp.arange(b), lens - 1], -1).astype(jnp.int32)
    st = drafter.init_state(spec, r2t, slots)
    st = drafter.extend_after_prefill(spec, st, prompts, hidden, meta, lens, first)
    root = pipeline.root_metadata(lens, r2t, page_size=page_size)
    drafts, _ = drafter.propose(spec, st, first, root)
    return drafts, first


def jitted_sides(target, drafter, spec, train_fn, infer_fn):
    """``(state, f_train(state, seq), f_inf(state, prompts, lens, r2t, zeros, slots))``: ``train_fn(target,
    drafter, seq)`` and ``infer_fn(target, drafter, spec, ...)`` jitted with the models split once."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split((target, drafter))
    f_train = jax.jit(lambda s, t: train_fn(*nnx.merge(graphdef, s), t))
    f_inf = jax.jit(lambda s, pr, ln, r2t, z, n: infer_fn(*nnx.merge(graphdef, s), spec, pr, ln, r2t, z, n),
                    static_argnums=(5,))
    return state, f_train, f_inf


def prefix_drafts(f_inf, state, seq, starts, spec, rows: int, width: int):
    """``(drafts i32[len(starts), S], c)``: the inference side's drafts after every prefix ``seq[:c]`` (``c`` in
    ``starts``), checked: each paged prefill's first token is the greedy reply's ``seq[c]``."""
    import numpy as np

    pr, ln, r2t = prefixes(seq, starts, spec, rows, width)
    drafts, first = f_inf(state, pr, ln, r2t, np.zeros((rows,), np.int32), int(r2t.max()) + 1)
    drafts, first = np.asarray(drafts)[:len(starts)], np.asarray(first)[:len(starts)]
    c = np.asarray(starts)
    assert (first == seq[c]).all(), "paged prefill's first token differs from the greedy reply"
    return drafts, c


def main(argv=None):
    ap = check_parser("draft_consistency.py", __doc__, "eagle3", 4)
    ap.add_argument("--synth", action="store_true", help="also self-synthesized user turns (train_draft's recipe)")
    args = ap.parse_args(argv)
    setup, spec, eng = load_check(args, "eagle3")
    target, drafter = setup.target, setup.drafter
    import numpy as np

    sets = {"chat": [np.asarray(p, np.int32) for p in setup.prompts]}
    if args.synth:
        from jaxspec.data.self_distill import chatml_ids

        user, asst, _ = chatml_ids(setup.gguf)
        users = eng.generate([np.asarray(user, np.int32)] * args.num_prompts, 48, temperature=1.0, top_p=0.95,
                             seed=list(range(args.num_prompts)))
        synth = []
        for u in users.tokens:
            u = [int(x) for x in u]
            u = u[:u.index(setup.eos_id)] if setup.eos_id in u else u
            synth.append(np.asarray(list(user) + u + list(asst), np.int32))
        sets["synth"] = synth
    state, f_train, f_inf = jitted_sides(target, drafter, spec, lambda t, d, seq: train_side(d.model, t, seq),
                                         inference_side)
    rows, width = args.new_tokens, 192
    for name, prompts in sets.items():
        replies = eng.generate(prompts, args.new_tokens)
        tot, cnt = np.zeros(6), 0
        for k, (p, r) in enumerate(zip(prompts, replies.tokens)):
            r = [int(x) for x in r]
            seq = np.concatenate([p, np.asarray(r, np.int32)])
            rs = len(p)
            starts = tuple(range(rs, len(seq) - 2))  # prefix c: tokens[c] is the target's, draft0 predicts tokens[c + 1]
            tr = np.asarray(f_train(state, seq))
            drafts, c = prefix_drafts(f_inf, state, seq, starts, spec, rows, width)
            t0, i0, true1 = tr[0, c - 1], drafts[:, 0], seq[c + 1]
            ok = i0 == true1
            c2 = c[c + 2 < len(seq)]
            sel = ok[:len(c2)]
            t1, i1, true2 = tr[1, c2 - 1][sel], drafts[:len(c2), 1][sel], seq[c2 + 2][sel]
            row = np.array([np.mean(t0 == i0), np.mean(t0 == true1), np.mean(ok),
                            np.mean(t1 == i1) if sel.any() else np.nan,
                            np.mean(t1 == true2) if sel.any() else np.nan, np.mean(i1 == true2) if sel.any() else np.nan])
            tot += np.nan_to_num(row) * len(c)
            cnt += len(c)
            print(f"{name}[{k}] n={len(c):3d}  step0: train==infer {row[0]:.3f}  train acc {row[1]:.3f}  infer acc "
                  f"{row[2]:.3f} | step1 (draft0 right, n={int(sel.sum())}): train==infer {row[3]:.3f}  train acc "
                  f"{row[4]:.3f}  infer acc {row[5]:.3f}", flush=True)
            bad = np.flatnonzero(t0 != i0)[:8]
            if bad.size:
                print("   step0 mismatches at prefix c:", [(int(c[j]), int(t0[j]), int(i0[j]), int(true1[j])) for j in bad])
        print(f"{name}: position-weighted [step0 train==infer, train acc, infer acc, step1 ...]: "
              f"{np.round(tot / max(1, cnt), 3).tolist()}", flush=True)


if __name__ == "__main__":
    main()
