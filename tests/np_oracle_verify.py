"""NumPy loop oracles for jaxspec.ops.verify / accept, written from docs/ops.md (verify_tree_greedy to fill_bonus_tokens)

Golden reference: SGLang 0.5.23 (strict ``coin < prob_acc / thr_acc`` and the ``p > 0`` guard). The
loops follow the per-request scalar walks of the CUDA kernels line for line (one request at a time,
float32 scalars, the ``draft_probs`` residual mutated in place on a private copy) so that the
vectorised JAX implementation can be compared with them exactly on integers.

Random valid trees: the generators of ``jaxspec.testing`` (beam draft, ``organize``, the
link-building part of ``build_tree``), composed here.
"""

import numpy as np

from jaxspec.testing import children, draft_lists, organize, tree_links, uniform_topk  # noqa: F401 - children: API

F32 = np.float32


# ----------------------------------------------------------------------------------------------------
# Tree generation (select_top_k_tokens, organize_draft_results, build_tree's links)
# ----------------------------------------------------------------------------------------------------


def random_draft(rng, bs, topk, steps, vocab):
    """Score/token/parent lists of an S-step beam draft (the ``tree_info`` tuples of select_top_k_tokens)."""
    d = draft_lists(rng, bs, steps, topk, vocab=vocab, draw=uniform_topk(0.01, 1.0, distinct=True))
    return d.score_list, d.token_list, d.parents_list


def random_tree(rng, bs, topk, steps, n, vocab):
    """A valid tree as build_tree would produce it: ``(candidates, retrieve_index, next_token, next_sibling)``."""
    sl, tl, pl_ = random_draft(rng, bs, topk, steps, vocab)
    pl, sel, dt = organize(sl, tl, pl_, n)
    ri, nt, ns = tree_links(pl, sel, topk, n)
    bonus = rng.integers(0, vocab, bs)
    cand = np.concatenate([bonus[:, None], dt], 1).astype(np.int64)
    return cand, ri, nt, ns


def valid_num_draft_tokens(topk, steps):
    """All N accepted by SpecConfig for (S, K)."""
    if topk == 1:
        return [steps + 1]
    return list(range(1, 1 + min(topk + (steps - 1) * topk * topk, 1023) + 1))


def pad_tree(tree, b_pad, n_pad, rng, vocab):
    """Embed a (B, N) tree into (b_pad, n_pad): padding nodes are unlinked, padding rows are root-only."""
    cand, ri, nt, ns = tree
    b, n = cand.shape
    pc = rng.integers(0, vocab, (b_pad, n_pad)).astype(np.int64)
    pr = (np.arange(b_pad)[:, None] * n_pad + np.arange(n_pad)[None, :]).astype(np.int64)
    pt = np.full((b_pad, n_pad), -1, np.int64)
    ps = np.full((b_pad, n_pad), -1, np.int64)
    pc[:b, :n] = cand
    pt[:b, :n] = nt
    ps[:b, :n] = ns
    return pc, pr, pt, ps


# ----------------------------------------------------------------------------------------------------
# verify_tree_greedy
# ----------------------------------------------------------------------------------------------------


def verify_greedy(cand, ri, nt, ns, target_predict, a, init=0):
    bs, n = cand.shape
    tp = target_predict.reshape(-1)
    pred = np.full(bs * n, init, np.int32)
    acc = np.full((bs, a), -1, np.int32)
    num = np.zeros(bs, np.int32)
    for b in range(bs):
        last = ri[b, 0]
        acc[b, 0] = last
        k = 0
        cur = 0
        for _ in range(1, a):
            cur = nt[b, cur]
            while cur != -1 and cand[b, cur] != tp[last]:
                cur = ns[b, cur]
            if cur == -1:
                break
            pred[last] = tp[last]
            k += 1
            last = ri[b, cur]
            acc[b, k] = last
        num[b] = k
        pred[last] = tp[last]
    return pred, acc, num


# ----------------------------------------------------------------------------------------------------
# tree_speculative_sampling_target_only, SGLang 0.5.23 rule
# ----------------------------------------------------------------------------------------------------


def sample_residual_row(r, coin):
    """FlashInfer index rule on one row, plain sequential float32 sums (exact for dyadic values)."""
    v = r.shape[0]
    cdf = np.cumsum(r, dtype=F32)  # sequential
    u = F32(coin) * (cdf[-1] if v else F32(0))
    for i in range(v):
        if r[i] > 0 and cdf[i] > u:
            return i
    pos = np.nonzero(r > 0)[0]
    return int(pos[-1]) if len(pos) else v - 1


def sampling_target_only(
    cand, ri, nt, ns, coins, final_coins, target_probs, draft_probs, a, thr_single=1.0, thr_acc=1.0, init=0
):
    bs, n, v = target_probs.shape
    draft = np.zeros_like(target_probs) if draft_probs is None else draft_probs.copy()  # "mutable" upstream
    thr_single = F32(thr_single)
    thr_acc = F32(max(thr_acc, 1e-9))
    pred = np.full(bs * n, init, np.int32)
    acc = np.full((bs, a), -1, np.int32)
    num = np.zeros(bs, np.int32)
    for b in range(bs):
        prob_acc = F32(0)
        row = 0  # local node index of the current parent's prob row
        coin = F32(coins[b, 0])
        last = ri[b, 0]
        acc[b, 0] = last
        k = 0
        cur = 0
        for _ in range(1, a):
            cur = nt[b, cur]
            while cur != -1:
                tok = cand[b, cur]
                p = F32(target_probs[b, row, tok])
                prob_acc = F32(prob_acc + p)
                if p > 0 and (coin < F32(prob_acc / thr_acc) or p >= thr_single):
                    prob_acc = F32(0)
                    row = cur
                    coin = F32(coins[b, cur])
                    pred[last] = tok
                    k += 1
                    last = ri[b, cur]
                    acc[b, k] = last
                    break
                draft[b, row, tok] = target_probs[b, row, tok]
                cur = ns[b, cur]
            if cur == -1:
                break
        num[b] = k
        q = target_probs[b, row]
        p = draft[b, row] if k != a - 1 else np.zeros_like(q)
        pred[last] = sample_residual_row(np.maximum(q - p, F32(0)), final_coins[b])
    return pred, acc, num


# ----------------------------------------------------------------------------------------------------
# top-k / top-p renorm (FlashInfer semantics), bonus tokens
# ----------------------------------------------------------------------------------------------------


def top_k_keep(probs, top_k):
    """Kept mask: every entry >= the k-th largest value of its row."""
    keep = np.zeros(probs.shape, bool)
    for r in range(probs.shape[0]):
        k = min(max(int(top_k[r]), 1), probs.shape[1])
        pivot = np.sort(probs[r])[::-1][k - 1]
        keep[r] = probs[r] >= pivot
    return keep


def top_p_keep(probs, top_p):
    """Kept mask: the smallest tie-complete top group set whose mass (float64) reaches p."""
    keep = np.zeros(probs.shape, bool)
    for r in range(probs.shape[0]):
        values = np.unique(probs[r])[::-1]
        chosen = values[-1]
        for val in values:
            if probs[r][probs[r] >= val].astype(np.float64).sum() >= float(top_p[r]):
                chosen = val
                break
        keep[r] = probs[r] >= chosen
    return keep


def fill_bonus(predict, accept_index, accept_lens):
    return np.array(
        [predict[accept_index[b, accept_lens[b] - 1]] for b in range(accept_index.shape[0])], np.int32
    )
