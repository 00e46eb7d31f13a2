"""organize -> build_tree -> verify_tree_greedy -> fill_bonus_tokens as ONE jitted program, no host sync.

Random draft lists come from select_top_k_tokens over random softmax scores (as the EAGLE draft loop
produces them); the result is compared with the NumPy oracle of Appendix A (tests/np_oracle_tree.py
and np_oracle_verify.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.ops.accept import fill_bonus_tokens
from jaxspec.ops.draft import organize_draft_results
from jaxspec.ops.tree import TreeMaskMode, build_tree
from jaxspec.ops.verify import verify_tree_greedy
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

    @jax.jit
    def step(score_list, token_list, parents_list, bonus, seq_lens, target_predict):
        d = organize_draft_results(score_list, token_list, parents_list, num_draft_tokens=n)
        t = build_tree(bonus, d.parent_list, d.top_scores_index, d.draft_tokens, seq_lens,
                       config=cfg, mask_mode=TreeMaskMode.QLEN_ONLY)
        v = verify_tree_greedy(t.draft_tokens.reshape(bs, n), t.retrieve_index, t.retrieve_next_token,
                               t.retrieve_next_sibling, target_predict, num_steps=cfg.num_steps)
        accept_lens = v.num_correct_drafts + 1
        bonus_next = fill_bonus_tokens(v.predict, v.accept_index, accept_lens)
        return t, v, bonus_next, seq_lens + accept_lens

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

    args = jax.device_put((score_list, token_list, parents_list, bonus, seq_lens, tp))
    step.lower(*args).compile()
    with jax.transfer_guard("disallow"):
        t, v, bonus_next, new_seq = step(*args)
        jax.block_until_ready((t, v, bonus_next, new_seq))

    pred, acc, num = np_verify(cand, ri, nt, ns, tp, cfg.num_steps + 1)
    np.testing.assert_array_equal(np.asarray(t.positions), pos)
    np.testing.assert_array_equal(np.asarray(t.retrieve_next_token), nt)
    np.testing.assert_array_equal(np.asarray(t.retrieve_next_sibling), ns)
    np.testing.assert_array_equal(np.asarray(v.accept_index), acc)
    np.testing.assert_array_equal(np.asarray(v.num_correct_drafts), num)
    np.testing.assert_array_equal(np.asarray(v.predict), pred)
    np.testing.assert_array_equal(np.asarray(bonus_next), pred[acc[np.arange(bs), num]])
    np.testing.assert_array_equal(np.asarray(new_seq), seq_lens + num + 1)


def _is_child(nt, ns, b, parent, j):
    c = nt[b, parent]
    while c != -1:
        if c == j:
            return True
        c = ns[b, c]
    return False
