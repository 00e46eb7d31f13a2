"""``jaxspec.pipeline.commit``: the greedy verifiers from logits and from their argmax agree, inactive rows
are frozen (no KV move, lengths and roots kept), temperature-0 sampling verifies as greedy, and the argument
contract. The oracle comparison of the whole round
is tests/test_pipeline_jit.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.ops.draft import organize_draft_results
from jaxspec.protocols import PagedKVCache, make_req_to_token
from jaxspec.pipeline import (RoundSampling, VerifyDraftProbs, VerifyGreedy, VerifyGreedyPredict,
                              VerifyTargetOnly, commit, plan_verify)
from test_pipeline_jit import VOCAB, _draft_lists

CFG = SpecConfig(3, 2, 6)


def test_commit_logits_path_and_frozen_rows():
    rng = np.random.default_rng(4)
    bs, n = 4, CFG.num_draft_tokens
    lists = _draft_lists(rng, bs, CFG)
    bonus = rng.integers(0, VOCAB, bs).astype(np.int32)
    seq = rng.integers(1, 30, bs).astype(np.int32)
    r2t = make_req_to_token(bs, 48, 1, seed=1)
    slots = int(r2t.max()) + 1
    pool = np.arange(slots, dtype=np.float32).reshape(1, slots, 1, 1)
    cache = PagedKVCache(k=pool, v=pool + 0.5, req_to_token=r2t)
    plan = jax.jit(lambda *a: plan_verify(CFG, *a, page_size=1))(
        bonus, organize_draft_results(*lists, num_draft_tokens=n), seq, r2t
    )
    # Target predictions that accept the first child at every level: long accepted paths, real KV moves.
    toks = np.asarray(plan.tokens)
    nt = np.asarray(plan.tree.retrieve_next_token)
    tp = rng.integers(0, VOCAB, (bs, n)).astype(np.int32)
    for b in range(bs):
        cur = 0
        while nt[b, cur] != -1:
            tp[b, cur] = toks[b, nt[b, cur]]
            cur = nt[b, cur]
    logits = jax.nn.one_hot(tp, VOCAB, dtype=jnp.float32)
    active = np.array([True, False, True, False])
    run = jax.jit(lambda c, lg, tp, act: (commit(CFG, plan, c, VerifyGreedy(lg), active=act),
                                           commit(CFG, plan, c, VerifyGreedyPredict(tp), active=act)))
    by_logits, by_predict = run(cache, logits, tp, active)
    for a, b in zip(jax.tree.leaves(by_logits), jax.tree.leaves(by_predict)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    out = by_logits
    lens = np.asarray(out.accept_lens)
    assert (lens[active] > 1).all()
    np.testing.assert_array_equal(np.asarray(out.seq_lens), np.where(active, seq + lens, seq))
    np.testing.assert_array_equal(np.asarray(out.bonus)[~active], bonus[~active])
    k = np.asarray(out.cache.k)
    window = np.asarray(plan.cache_locs)
    acc = np.asarray(out.accept_index)
    want = pool.copy()
    for b in np.nonzero(active)[0]:
        want[0, window[b, : lens[b]]] = pool[0, window[b, acc[b, : lens[b]] - b * n]]
    np.testing.assert_array_equal(k, want)  # frozen rows' windows untouched
    np.testing.assert_array_equal(np.asarray(out.cache.v), want + 0.5)
    # Sampling with every temperature 0 (one-hot target rows) verifies exactly as greedy.
    zeros = jnp.zeros((bs,), jnp.float32)
    smp = RoundSampling(zeros, jnp.full((bs,), VOCAB, jnp.int32), zeros + 1, jnp.full((bs, n), 0.5), zeros + 0.5)
    sampled = jax.jit(lambda c, lg, act: commit(CFG, plan, c, VerifyTargetOnly(lg, smp), active=act))(
        cache, logits, active)
    for a, b in zip(jax.tree.leaves(sampled), jax.tree.leaves(by_logits)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="sampled chains only"):
        commit(CFG, plan, cache, VerifyDraftProbs(logits, smp, jnp.zeros((bs, 3, VOCAB))))
    with pytest.raises(ValueError, match="^verifier: expected one of VerifyGreedy, VerifyGreedyPredict"):
        commit(CFG, plan, cache, logits)
    with pytest.raises(ValueError, match="target_predict: expected leading dim"):
        commit(CFG, plan, cache, VerifyGreedyPredict(tp[:2]))
    with pytest.raises(ValueError, match="needs a DraftResults"):
        plan_verify(CFG, bonus, np.zeros((bs, 3), np.int32), seq, r2t, page_size=1)
