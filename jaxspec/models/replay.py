"""Accept length by replay: a draft head's chain rounds over the target's own greedy replies, offline.

At temperature 0 a chain round with the bonus token at position ``p`` drafts ``S`` tokens for ``p + 1 .. p + S``
and keeps the longest prefix that equals the target's greedy tokens, plus the target's next token. Along the kept
prefix the drafts were fed exactly the reply's tokens, so the teacher-forced training-time test over the reply
(``distill.eagle3_step_logits`` / ``mtp_step_logits``: step ``k``'s row ``t`` is fed token ``t + 1 + k`` and
predicts token ``t + 2 + k``) gives every round's outcome: ``hits[k, t]`` = step ``k``'s prediction at row
``t`` is the reply's token ``t + 2 + k``, and the rounds walk the reply from its first token (the prefill's).
So one dense forward per batch of replies measures what the engine's ``mean_accept_length`` would be on them,
without decoding: the metric to choose a checkpoint by (``jaxspec.train_draft --dev-data``).
"""

import numpy as np


def chain_rounds(hits, start: int, end: int) -> tuple[int, int]:
    """``(rounds, tokens)`` of a chain of ``K`` drafts over one reply: ``hits bool[K, T]`` (above), the reply's
    first token at ``start`` (the prefill's, before any round) and its last at ``end - 1``."""
    k_max = hits.shape[0]
    rounds = tokens = 0
    p = start  # the bonus token's position
    while p < end - 1:
        t, n = p - 1, 0
        while n < k_max and t + 2 + n <= end - 1 and hits[n, t]:
            n += 1
        step = min(n + 1, end - 1 - p)  # the accepted drafts and the target's next token, within the reply
        rounds, tokens, p = rounds + 1, tokens + step, p + step
    return rounds, tokens


def step_hits(predictions, tokens):
    """``bool[B, K, T]`` from ``predictions i32[B, K, T]`` (step ``k``'s predicted token at row ``t``) and the
    replies ``tokens i32[B, T]``: ``predictions[:, k, t] == tokens[:, t + 2 + k]`` (False past the sequence)."""
    predictions, tokens = np.asarray(predictions), np.asarray(tokens)
    b, k_max, t = predictions.shape
    hits = np.zeros((b, k_max, t), bool)
    for k in range(k_max):
        r = max(t - 2 - k, 0)
        hits[:, k, :r] = predictions[:, k, :r] == tokens[:, 2 + k:2 + k + r]
    return hits


def replay_accept_length(predict, tokens, lens, resp_start, *, batch: int, depths=None) -> dict:
    """The chain's accept length over greedy replies (module docstring).

    Args:
        predict: ``tokens i32[batch, T] -> i32[batch, K, T]``, the head's predicted token per step and row (a
            ``DistillStep.predict`` closed over its state, say); called on fixed-size batches (the last one
            padded with copies of its first row), so one compile serves the whole set.
        tokens, lens, resp_start: greedy conversations (``jaxspec.data.self_distill.load_data``).
        batch: rows per ``predict`` call.
        depths: also replay chains of these lengths (each ``<= K``) from the same forward: the result gains
            ``"by_depth": {S: accept length}``.

    Returns:
        ``{"accept_length": tokens / rounds over all replies, "rounds", "tokens", "per_row": [accept per row],
        "row_rounds": [rounds per row]}`` for the chain of all ``K`` steps. The engine's ``num_rounds`` of the
        same greedy decode equals ``row_rounds`` up to the draft's numerics; its ``num_accepted`` may count a last
        round's drafts past the reply's end, which ``tokens`` does not.
    """
    tokens = np.asarray(tokens, np.int32)
    n = tokens.shape[0]
    per_row, row_rounds, all_rounds, all_tokens = [], [], 0, 0
    sums = {int(d): [0, 0] for d in (depths or ())}
    for lo in range(0, n, batch):
        rows = tokens[lo:lo + batch]
        pad = batch - rows.shape[0]
        if pad:
            rows = np.concatenate([rows, np.repeat(rows[:1], pad, axis=0)])
        hits = step_hits(np.asarray(predict(rows)), rows)
        for d in sums:
            if not 1 <= d <= hits.shape[1]:
                raise ValueError(f"depths: expected chain lengths in [1, {hits.shape[1]}] (the steps predict "
                                 f"returns), got {d}")
        for i in range(min(batch, n - lo)):
            start, end = int(resp_start[lo + i]), int(lens[lo + i])
            r, t = chain_rounds(hits[i], start, end)
            all_rounds, all_tokens = all_rounds + r, all_tokens + t
            per_row.append(t / r if r else float("nan"))
            row_rounds.append(r)
            for d, acc in sums.items():
                rd, td = chain_rounds(hits[i, :d], start, end)
                acc[0], acc[1] = acc[0] + rd, acc[1] + td
    out = dict(accept_length=all_tokens / max(all_rounds, 1), rounds=all_rounds, tokens=all_tokens, per_row=per_row,
               row_rounds=row_rounds)
    if depths is not None:
        out["by_depth"] = {d: t / max(r, 1) for d, (r, t) in sums.items()}
    return out
