"""Random-input generators shared by jaxspec's tests, the interop harness and the benchmarks (NumPy, host side), and a
counter of XLA compiles for tests that show a loop is not recompiled."""

import dataclasses
from typing import NamedTuple

import numpy as np


def random_accept_index(rng: np.random.Generator, bs: int, accept_width: int, num_draft_tokens: int):
    """A legal ``(accept_index (B, A) int32, accept_lens (B,) int32)`` pair, as verify produces them.

    Row ``b`` holds ``accept_lens[b]`` global node ids ``b*N + j``: the root (``j = 0``) first, then
    distinct non-root nodes in increasing order; the rest is -1.
    """
    lens = rng.integers(1, accept_width + 1, bs)
    ai = -np.ones((bs, accept_width), np.int32)
    for b in range(bs):
        nodes = np.sort(rng.choice(np.arange(1, num_draft_tokens), lens[b] - 1, replace=False)) if lens[b] > 1 else []
        ai[b, : lens[b]] = b * num_draft_tokens + np.concatenate([[0], nodes]).astype(np.int32)
    return ai, lens.astype(np.int32)


def checked_call(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` with jaxspec's in-jit value checks on, under ``checkify``.

    Returns ``(err, out)``; ``err.throw()`` raises the first failed check (``JAXSPEC_CHECKS`` mode).
    """
    from jax.experimental import checkify

    from jaxspec import _validate

    with _validate.checks():
        return checkify.checkify(lambda *a: fn(*a, **kwargs))(*args)


# ----------------------------------------------------------------------------------------------------
# draft lists and trees (docs/ops.md: select_top_k_tokens, organize_draft_results, build_tree): THE generators for tests, the interop harness and
# the benchmarks


class DraftLists(NamedTuple):
    """What ``num_steps`` rounds of ``select_top_k_tokens`` record, plus the per-step inputs that drove them.

    ``score_list``: float32 ``(B, 1, K)`` then ``(B, K, K)`` per later step; ``token_list``: int64 ``(B, K)``
    then ``(B, K*K)``; ``parents_list``: int64 ``(B, K+1)`` then ``(B, K)``; ``step_inputs[i]``: the
    ``(topk_p, topk_index)`` of step ``i`` (``B`` rows at step 0, ``B*K`` after)."""

    score_list: list
    token_list: list
    parents_list: list
    step_inputs: list


def uniform_topk(lo: float = 0.05, hi: float = 0.95, distinct: bool = False):
    """A draft distribution: top-k probabilities uniform in ``[lo, hi)`` (descending float32) and random tokens
    (``distinct``: no repeated token within a row). With ``lo > 0`` and ``hi < 1`` every child scores strictly
    below its parent, so the top-(N-1) selection is parent-closed."""

    def draw(rng, rows: int, k: int, vocab: int):
        p = -np.sort(-rng.uniform(lo, hi, (rows, k)).astype(np.float32), axis=1)
        if distinct:
            tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(rows)]).astype(np.int64)
        else:
            tokens = rng.integers(0, vocab, (rows, k)).astype(np.int64)
        return p, tokens

    return draw


def softmax_topk(width: int = 64, scale: float = 3.0):
    """A draft distribution: the top-k of a softmax over ``width`` random logits (``* scale``), distinct tokens."""

    def draw(rng, rows: int, k: int, vocab: int):
        logits = rng.standard_normal((rows, width)).astype(np.float32) * scale
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
        probs = np.take_along_axis(p, np.argsort(-p, axis=1, kind="stable")[:, :k], 1)
        tokens = rng.integers(0, vocab, size=(rows, k), dtype=np.int64)
        for r in range(rows):  # a beam's top-k tokens are distinct
            while len(set(tokens[r].tolist())) < k:
                tokens[r] = rng.integers(0, vocab, size=k, dtype=np.int64)
        return probs, tokens

    return draw


def draft_lists(rng: np.random.Generator, bs: int, num_steps: int, topk: int, *, vocab: int,
                draw=None) -> DraftLists:
    """A beam draft of ``num_steps`` rounds, expanded exactly as ``select_top_k_tokens`` does:
    scores multiply in float32, each round keeps the top-K of the K*K children (ties: lower index first).
    ``draw(rng, rows, k, vocab) -> (probs (rows, k) float32 descending, tokens (rows, k) int64)`` gives each
    round's top-k (default ``uniform_topk()``)."""
    draw = draw or uniform_topk()
    k = topk
    p0, t0 = draw(rng, bs, k, vocab)
    score_list, token_list = [p0[:, None, :]], [t0]
    parents_list = [np.broadcast_to(np.arange(-1, k, dtype=np.int64), (bs, k + 1)).copy()]
    step_inputs = [(p0, t0)]
    scores = p0
    for i in range(1, num_steps):
        p, t = draw(rng, bs * k, k, vocab)
        step_inputs.append((p, t))
        expand = (scores[:, :, None] * p.reshape(bs, k, k)).astype(np.float32)
        flat = expand.reshape(bs, k * k)
        cs_idx = np.argsort(-flat, axis=1, kind="stable")[:, :k]
        scores = np.take_along_axis(flat, cs_idx, 1)
        score_list.append(expand)
        token_list.append(t.reshape(bs, k * k))
        parents_list.append(cs_idx.astype(np.int64) + (k * k * (i - 1) + k))
    return DraftLists(score_list, token_list, parents_list, step_inputs)


def organize(score_list, token_list, parents_list, num_draft_tokens: int):
    """``organize_draft_results`` (the top-(N-1) selection and parent map): int64 ``(parent_list (B, Q), top_scores_index (B, N-1),
    draft_tokens (B, N-1))``; ties in the top-(N-1) resolve to the lower index."""
    n = num_draft_tokens
    s = np.concatenate([x.reshape(x.shape[0], -1) for x in score_list], 1)
    t = np.concatenate(token_list, 1)
    sel = np.sort(np.argsort(-s, axis=1, kind="stable")[:, : n - 1], axis=1)
    if len(parents_list) > 1:
        pl = np.concatenate(parents_list[:-1], 1).astype(np.int64)
    else:
        pl = np.zeros((s.shape[0], 0), np.int64)
    return pl, sel.astype(np.int64), np.take_along_axis(t, sel, 1).astype(np.int64)


def tree_links(parent_list, top_scores_index, topk: int, num_draft_tokens: int):
    """``(retrieve_index, retrieve_next_token, retrieve_next_sibling)`` (int64, ``(B, N)``) of a draft tree, as
    ``build_tree`` links it (docs/ops.md, "Parents and links"): a node whose parent is not selected stays unlinked."""
    sel, n = top_scores_index, num_draft_tokens
    bs = sel.shape[0]
    ri = (np.arange(bs)[:, None] * n + np.arange(n)[None, :]).astype(np.int64)
    nt = np.full((bs, n), -1, np.int64)
    ns = np.full((bs, n), -1, np.int64)
    for b in range(bs):
        for t in range(n - 1, 0, -1):
            ptb = sel[b, t - 1] // topk
            if ptb == 0:
                p = 0
            else:
                hits = np.nonzero(sel[b, : n - 1] == parent_list[b, ptb])[0]
                if hits.size == 0:
                    continue
                p = int(hits[0]) + 1
            if nt[b, p] != -1:
                ns[b, t] = nt[b, p]
            nt[b, p] = t
    return ri, nt, ns


def children(next_token, next_sibling, b: int, j: int) -> list[int]:
    """The children of node ``j`` of request ``b``, in link order."""
    out, c = [], next_token[b, j]
    while c != -1:
        out.append(int(c))
        c = next_sibling[b, c]
    return out


# ----------------------------------------------------------------------------------------------------
# one bookkeeping step's inputs (bench/step.py, jaxspec/interop/original_step.py)


@dataclasses.dataclass(frozen=True)
class PoolShape:
    """KV pool: ``layers`` x (K, V) x ``slots`` rows of ``kv_heads * head_dim`` elements (bf16)."""

    layers: int
    kv_heads: int
    head_dim: int
    slots: int

    @property
    def row_elems(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def row_bytes(self) -> int:
        return 2 * self.row_elems

    @property
    def nbytes(self) -> int:
        return self.layers * 2 * self.slots * self.row_bytes


@dataclasses.dataclass
class StepInputs:
    """The host inputs of one speculative bookkeeping step (int64 where SGLang is int64)."""

    S: int
    K: int
    N: int
    score_list: list  # f32: (B,1,K), then (B,K,K) per later step
    token_list: list  # i64: (B,K), then (B,K*K)
    parents_list: list  # i64: (B,K+1), then (B,K)
    chain_draft_tokens: np.ndarray  # i64 (B,S): the K == 1 draft buffer (= concat(token_list))
    bonus_tokens: np.ndarray  # i32 (B,)
    seq_lens: np.ndarray  # i64 (B,)
    req_pool_indices: np.ndarray  # i64 (B,)
    req_to_token: np.ndarray  # i32 (R, W)
    out_cache_loc: np.ndarray  # i64 (B*N,): verify window req_to_token[req, seq + 0..N-1]
    target_predict: np.ndarray  # i64 (B, N)
    expected_accept_lens: np.ndarray  # i32 (B,): the path length target_predict was built for

    @property
    def bs(self) -> int:
        return int(self.seq_lens.shape[0])


STEP_VOCAB = 128256  # Llama 3's vocabulary: token ids of the step inputs


def _tie_free_tree(lists: DraftLists, S: int, K: int, N: int):
    """``(top_scores_index, draft_tokens, children)`` of the organized draft, or None when the top-(N-1)
    boundary is a tie (torch.topk's choice is unspecified there) or a selected node's parent is not selected."""
    pl, sel, dt = organize(lists.score_list, lists.token_list, lists.parents_list, N)
    bs = sel.shape[0]
    s = np.concatenate([x.reshape(bs, -1) for x in lists.score_list], 1)
    if N - 1 < s.shape[1]:
        kth, nxt = -np.sort(-s, axis=1)[:, N - 2 : N].T
        if np.any(kth == nxt):
            return None
    for b in range(bs):
        for t in range(1, N):
            ptb = sel[b, t - 1] // K
            if ptb != 0 and not np.any(sel[b] == pl[b, ptb]):
                return None
    _, nt, ns = tree_links(pl, sel, K, N)
    return sel, dt, [[children(nt, ns, b, j) for j in range(N)] for b in range(bs)]


def make_step_inputs(S: int, K: int, N: int, bs: int, slots: int, max_bs: int, seed: int) -> StepInputs:
    """Random inputs of one step of config (S, K, N) at batch ``bs`` over a pool of ``slots`` slots.

    The draft is a softmax beam (tie-free at the top-(N-1) boundary); ``target_predict`` copies the draft
    tokens along a random root-ward path and stops at a random depth with a token that matches no child
    there, so accept lengths spread over 1..S+1; ``req_to_token`` is a random permutation of slots 1..X-1
    (slot 0 is the dummy) over ``max_bs + 1`` rows."""
    rng = np.random.default_rng(seed)
    for _ in range(100):
        lists = draft_lists(rng, bs, S, K, vocab=STEP_VOCAB, draw=softmax_topk())
        tree = _tie_free_tree(lists, S, K, N)
        if tree is not None:
            break
    else:  # pragma: no cover
        raise RuntimeError("could not draw a tie-free draft tree")
    sel, dt, kids = tree
    cand = np.concatenate([np.zeros((bs, 1), np.int64), dt], 1)
    target = rng.integers(0, STEP_VOCAB, size=(bs, N), dtype=np.int64)
    accept = np.ones(bs, np.int32)
    for b in range(bs):
        stop, node = int(rng.integers(0, S + 1)), 0
        for _ in range(stop):
            if not kids[b][node]:
                break
            child = kids[b][node][int(rng.integers(0, len(kids[b][node])))]
            target[b, node] = cand[b, child]
            node = child
            accept[b] += 1
        taken = {int(cand[b, c]) for c in kids[b][node]}
        while int(target[b, node]) in taken:
            target[b, node] = int(rng.integers(0, STEP_VOCAB))
    rows = max_bs + 1
    width = (slots - 1) // rows
    margin = S + 1 + max(N, K * S) + 1
    if width < margin + 8:
        raise ValueError(f"slots: a pool of {slots} slots is too small for {rows} request rows")
    perm = rng.permutation(np.arange(1, slots, dtype=np.int32))[: rows * width]
    req_to_token = perm.reshape(rows, width)
    req_pool_indices = rng.choice(np.arange(1, rows), size=bs, replace=False).astype(np.int64)
    seq_lens = rng.integers(4, width - margin, size=bs).astype(np.int64)
    window = req_to_token[req_pool_indices[:, None], seq_lens[:, None] + np.arange(N)[None, :]]
    bonus = rng.integers(0, STEP_VOCAB, size=bs).astype(np.int32)
    return StepInputs(
        S=S, K=K, N=N,
        score_list=lists.score_list, token_list=lists.token_list, parents_list=lists.parents_list,
        chain_draft_tokens=np.concatenate(lists.token_list, 1).astype(np.int64),
        bonus_tokens=bonus, seq_lens=seq_lens, req_pool_indices=req_pool_indices,
        req_to_token=req_to_token, out_cache_loc=window.reshape(-1).astype(np.int64),
        target_predict=target, expected_accept_lens=accept,
    )


def random_tree_qmask(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    """``bool[batch, n, n]``: each row's visibility in a random tree over ``n`` tokens (token ``t``'s parent
    is uniform in ``[0, t)``; a token sees itself and its ancestors): the QLEN_ONLY mask of a verify."""
    qm = np.zeros((batch, n, n), bool)
    for b in range(batch):
        parent = [-1] + [int(rng.integers(0, t)) for t in range(1, n)]
        for t in range(n):
            a = t
            while a >= 0:
                qm[b, t, a] = True
                a = parent[a]
    return qm


class CompileCounter:
    """Counts XLA backend compiles from its creation on (jax's ``/jax/core/compile/backend_compile_duration``
    event): read ``count`` before and after a call to see how many executables it compiled (compiles on other
    threads too, e.g. ``ServingEngine.warmup(threads=)``'s)."""

    def __init__(self):
        import threading  # noqa: PLC0415
        import jax  # noqa: PLC0415 (the rest of this module is NumPy only)

        self.count = 0
        self._lock = threading.Lock()  # the event fires on the compiling thread
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            with self._lock:
                self.count += 1
