"""NumPy loop oracle for select_top_k_tokens, organize_draft_results and build_tree (docs/ops.md).

Written from the operators' definitions (docs/ops.md) and SGLang 0.5.23's kernels: scalar loops per
request, in the order the CUDA/Triton kernels run them, so that it can be read against them.
Malformed trees follow the Triton/CPU kernels (row-bounded parent search, unlinked nodes, walk
stopping at a missing ancestor or after S marks). Int64 throughout, as SGLang.
"""

import numpy as np

from jaxspec.testing import draft_lists, organize  # noqa: F401 - organize is part of this oracle's API

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


# ------------------------------------------------------------------ select_top_k_tokens


def fast_topk(values, k):
    """K == 1: max with the first maximal index; K > 1: descending, lower index first on ties."""
    if k == 1:
        idx = np.argmax(values, axis=-1)[:, None]
    else:
        idx = np.argsort(-values, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(values, idx, -1), idx.astype(np.int64)


def select_top_k_tokens(step, topk_p, topk_index, hidden, scores, k):
    if step == 0:
        b = topk_p.shape[0]
        ids = topk_index.reshape(-1).astype(np.int64)
        hid = None if hidden is None else np.repeat(hidden, k, axis=0)
        parents = np.tile(np.arange(-1, k, dtype=np.int64), (b, 1))
        return ids, hid, topk_p, (topk_p[:, None, :], topk_index.astype(np.int64), parents)
    b = scores.shape[0]
    expand = (scores[:, :, None] * topk_p.reshape(b, k, k)).astype(np.float32)
    cs_p, cs_idx = fast_topk(expand.reshape(b, k * k), k)
    flat_tok = topk_index.reshape(b, k * k).astype(np.int64)
    ids = np.take_along_axis(flat_tok, cs_idx, 1).reshape(-1)
    hid = hidden
    if hidden is not None and hidden.shape[0] > 0:
        rows = np.empty(b * k, np.int64)
        for r in range(b):
            for j in range(k):
                rows[r * k + j] = r * k + cs_idx[r, j] // k
        hid = hidden[rows]
    return ids, hid, cs_p, (expand, flat_tok, cs_idx + (k * k * (step - 1) + k))


# ------------------------------------------------------------------ organize_draft_results + drafts

# organize lives with the generators in jaxspec.testing: one copy for tests, harness and bench.


def draft_pipeline(rng, b, s, k, n, vocab=1000):
    """Random but realistic draft: S steps of select_top_k over random softmax top-k, then organize.

    Returns ``(inputs, lists, organized)``: ``inputs`` the per-step ``(topk_p, topk_index)``.
    """
    def rand_topk(rng, rows, k, vocab):
        logits = rng.standard_normal((rows, 64)).astype(np.float32) * 3
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        tok = rng.integers(0, vocab, (rows, 64))
        return np.take_along_axis(p, idx, -1), np.take_along_axis(tok, idx, -1)

    d = draft_lists(rng, b, s, k, vocab=vocab, draw=rand_topk)
    lists = (d.score_list, d.token_list, d.parents_list)
    return d.step_inputs, lists, organize(*lists, n)


# ------------------------------------------------------------------ build_tree


def packed_dtype(n):
    return [np.uint8, np.uint16, np.uint32, np.uint32][(n - 1) // 8]


def build_tree(bonus, pl, sel, dt, seq, k, s, n, mode, max_seq_lens_sum=None):
    """Returns ``(mask, positions, retrieve_index, next_token, next_sibling, tokens, mask_len)``.

    FULL_MASK is laid out in a buffer of ``max_seq_lens_sum*n + bs*n*n`` (default: exact size),
    prefix True, tail False.
    """
    bs = len(seq)
    tokens = np.concatenate([np.asarray(bonus)[:, None].astype(np.int64), dt], 1).reshape(-1)
    ri, nt, ns = (np.full((bs, n), -1, np.int64) for _ in range(3))
    pos = np.zeros(bs * n, np.int64)
    if mode == FULL_MASK:
        total = int(seq.sum()) * n + n * n * bs
        size = total if max_seq_lens_sum is None else max_seq_lens_sum * n + n * n * bs
        mask = np.zeros(size, bool)
        mask[:total] = True
        mask_len = total
    elif mode == QLEN_ONLY:
        mask = np.ones(n * n * bs, bool)
        mask_len = mask.size
    else:
        mask = np.zeros(bs * n, packed_dtype(n))
        mask_len = mask.size

    def find(b, v):  # search bounded to the request's own n-1 entries
        for q in range(n - 1):
            if sel[b, q] == v:
                return q
        return None

    def parent(b, t):  # local parent node index, None if the parent is not selected
        ptb = int(sel[b, t - 1]) // k
        if ptb == 0:
            return 0
        if pl.shape[1] == 0:
            return None
        q = find(b, pl[b, ptb])
        return None if q is None else q + 1

    for b in range(bs):
        L = int(seq[b])
        pos[b * n] = L
        for t in range(n - 1, 0, -1):  # thread-0 link loop, descending t, head insertion
            ri[b, t] = b * n + t
            p = parent(b, t)
            if p is None:
                continue
            if nt[b, p] != -1:
                ns[b, t] = nt[b, p]
            nt[b, p] = t
        ri[b, 0] = b * n
        for t in range(n):
            vis, cur, depth = [0], t, 0
            while t > 0 and depth < s:  # walk bounded by S marks
                vis.append(cur)
                depth += 1
                nxt = parent(b, cur)
                if nxt is None or nxt == 0:
                    break
                cur = nxt
            if t:
                pos[b * n + t] = L + depth
            if mode == FULL_MASK:
                r = int(seq[:b].sum()) * n + n * n * b + (L + n) * t + L
                mask[r : r + n] = False
                for v in vis:
                    mask[r + v] = True
            elif mode == QLEN_ONLY:
                r = n * n * b + n * t
                mask[r : r + n] = False
                for v in vis:
                    mask[r + v] = True
            else:
                mask[b * n + t] = sum(1 << v for v in set(vis))
    return mask, pos, ri, nt, ns, tokens, mask_len


def decode_mask(mask, seq, n, mode):
    """Logical ``(bs, n, n)`` visibility matrix from any layout (tree columns only)."""
    bs = len(seq)
    out = np.zeros((bs, n, n), bool)
    if mode == QLEN_ONLY:
        return np.asarray(mask).reshape(bs, n, n)
    off = 0
    for b in range(bs):
        for t in range(n):
            if mode == FULL_MASK:
                L = int(seq[b])
                base = off + (L + n) * t + L
                out[b, t] = mask[base : base + n]
            else:
                out[b, t] = [(int(mask[b * n + t]) >> j) & 1 for j in range(n)]
        if mode == FULL_MASK:
            off += (int(seq[b]) + n) * n
    return out
