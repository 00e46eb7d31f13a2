"""The public round (``jaxspec.pipeline``: organize -> plan_verify -> commit) as ONE jitted program, no host sync.

Random draft lists come from ``jaxspec.testing.draft_lists`` over random softmax scores (as the EAGLE draft
loop produces them); the tree, verify and bonus results are compared with the NumPy oracles
(tests/np_oracle_tree.py and np_oracle_verify.py), and the committed KV pool with the accepted rows moved
to the window front (every other slot untouched).
"""

import jax
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.ops.draft import organize_draft_results
from jaxspec.protocols import PagedKVCache, make_req_to_token
from jaxspec.pipeline import VerifyGreedyPredict, commit, plan_verify
from jaxspec.testing import draft_lists

VOCAB = 50


def _dirichlet_topk(rng, rows, k, vocab):
    """Top-k of random (tie-free) Dirichlet distributions over the vocabulary."""
    p = rng.dirichlet(np.ones(vocab), size=rows).astype(np.float32)
    idx = np.argsort(-p, axis=1)[:, :k]
    return np.take_along_axis(p, idx, 1), idx.astype(np.int64)


def _draft_lists(rng, bs, cfg):
    """Score/token/parent lists of an S-step EAGLE draft over random (tie-free) softmax scores (int32 ids)."""
    d = draft_lists(rng, bs, cfg.num_steps, cfg.topk, vocab=VOCAB, draw=_dirichlet_topk)
    return d.score_list, [t.astype(np.int32) for t in d.token_list], [p.astype(np.int32) for p in d.parents_list]


@pytest.mark.parametrize("cfg", [SpecConfig(5, 4, 8), SpecConfig(3, 1, 4), SpecConfig(1, 3, 3)], ids=str)
def test_pipeline_one_jit_no_transfer(cfg):
    from np_oracle_tree import build_tree as np_build_tree, organize as np_organize
    from np_oracle_verify import verify_greedy as np_verify

    rng = np.random.default_rng()
    bs = 6
    score_list, token_list, parents_list = _draft_lists(rng, bs, cfg)
    bonus = rng.integers(0, VOCAB, bs).astype(np.int32)
    seq_lens = rng.integers(1, 40, bs).astype(np.int32)
    n = cfg.num_draft_tokens
    r2t = make_req_to_token(bs, 64, 1, seed=2)
    slots = int(r2t.max()) + 1
    pool = np.arange(slots, dtype=np.float32).reshape(1, slots, 1, 1) + 0.5  # slot x holds x + 0.5

    @jax.jit
    def step(score_list, token_list, parents_list, bonus, seq_lens, target_predict, cache):
        d = organize_draft_results(score_list, token_list, parents_list, num_draft_tokens=n)
        plan = plan_verify(cfg, bonus, d, seq_lens, cache.req_to_token, page_size=1)
        return plan, commit(cfg, plan, cache, VerifyGreedyPredict(target_predict))

    # target_predict that follows a random tree path for a random number of levels.
    pl, sel, dt = np_organize(score_list, token_list, parents_list, n)
    _, pos, ri, nt, ns, toks, _ = np_build_tree(bonus, pl, sel, dt, seq_lens.astype(np.int64), cfg.topk,
                                             cfg.num_steps, n, 1)
    cand = toks.reshape(bs, n)
    tp = rng.integers(0, VOCAB, (bs, n))
    for b in range(bs):
        cur, stop = 0, rng.integers(0, cfg.num_steps + 1)
        for _ in range(stop):
            kids = [j for j in range(n) if j and nt[b, cur] != -1 and _is_child(nt, ns, b, cur, j)]
            if not kids:
                break
            child = kids[rng.integers(len(kids))]
            tp[b, cur] = cand[b, child]
            cur = child
    tp = tp.astype(np.int32)

    cache = PagedKVCache(k=pool, v=-pool, req_to_token=r2t)
    args = jax.device_put((score_list, token_list, parents_list, bonus, seq_lens, tp, cache))
    step.lower(*args).compile()
    with jax.transfer_guard("disallow"):
        plan, out = jax.block_until_ready(step(*args))
    t = plan.tree

    pred, acc, num = np_verify(cand, ri, nt, ns, tp, cfg.num_steps + 1)
    lens = num + 1
    np.testing.assert_array_equal(np.asarray(t.positions), pos)
    np.testing.assert_array_equal(np.asarray(plan.meta.positions), pos.reshape(bs, n))
    np.testing.assert_array_equal(np.asarray(t.retrieve_next_token), nt)
    np.testing.assert_array_equal(np.asarray(t.retrieve_next_sibling), ns)
    window = r2t[np.arange(bs)[:, None], seq_lens[:, None] + np.arange(n)[None, :]]
    np.testing.assert_array_equal(np.asarray(plan.cache_locs), window)
    np.testing.assert_array_equal(np.asarray(out.accept_index), acc)
    np.testing.assert_array_equal(np.asarray(out.accept_lens), lens)
    np.testing.assert_array_equal(np.asarray(out.bonus), pred[acc[np.arange(bs), num]])
    np.testing.assert_array_equal(np.asarray(out.seq_lens), seq_lens + lens)
    want_k = pool.copy()
    for b in range(bs):
        valid = acc[b, : lens[b]]
        np.testing.assert_array_equal(np.asarray(out.accepted)[b, : lens[b]], pred[valid])
        np.testing.assert_array_equal(np.asarray(out.window_tokens)[b, : lens[b]], pred[valid])
        want_k[0, window[b, : lens[b]]] = pool[0, window[b, valid - b * n]]  # accepted rows -> window front
    np.testing.assert_array_equal(np.asarray(out.cache.k), want_k)
    np.testing.assert_array_equal(np.asarray(out.cache.v), -want_k)


def _is_child(nt, ns, b, parent, j):
    c = nt[b, parent]
    while c != -1:
        if c == j:
            return True
        c = ns[b, c]
    return False
