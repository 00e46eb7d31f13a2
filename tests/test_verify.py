"""Tests for jaxspec.ops.verify against SGLang 0.5.23 semantics (golden fixtures + NumPy loop oracles).

Random breadth runs at one padded shape (B_PAD, N_PAD, S_PAD): every hypothesis example is a fresh tree
of random (K, S, N, B) embedded into it, so hundreds of cases cost one compile. A few real (unpadded)
shapes cover the exact layouts, including B=1, K=1 chains, S=8 and the largest N.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import np_oracle_verify as oracle
from jaxspec.ops.verify import (
    VerifyOutput,
    sample_residual,
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
    verify_tree_greedy,
)

B_PAD, N_PAD, S_PAD, V_PAD = 64, 464, 8, 64  # N_PAD >= 1 + (8 + 7 * 64) = 457, the largest valid N for K, S <= 8

# Real shapes: (batch, topk, steps, num_draft_tokens, vocab).
REAL_CONFIGS = [
    (1, 1, 1, 2, 8),  # smallest chain
    (1, 4, 5, 8, 32),  # SGLang Llama default (5, 4, 8), B=1
    (7, 1, 8, 9, 16),  # K=1 chain at max depth
    (3, 3, 1, 4, 16),  # S=1: all nodes are root children
    (64, 8, 8, 457, 64),  # largest N, B=64
    (5, 2, 3, 1, 8),  # N=1: root only
    (9, 8, 2, 30, 40),
]


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------


@st.composite
def tree_configs(draw, max_batch=B_PAD):
    topk = draw(st.integers(1, 8))
    steps = draw(st.integers(1, 8))
    n = draw(st.sampled_from(oracle.valid_num_draft_tokens(topk, steps)))
    batch = draw(st.integers(1, max_batch))
    seed = draw(st.integers(0, 2**31 - 1))
    return batch, topk, steps, n, seed


def greedy_target(rng, tree, vocab, p_follow=0.75):
    """target_predict that follows a random child with probability p_follow (long accepted paths)."""
    cand, _, nt, ns = tree
    b, n = cand.shape
    tp = rng.integers(0, vocab, (b, n)).astype(np.int64)
    for i in range(b):
        for j in range(n):
            kids = oracle.children(nt, ns, i, j)
            if kids and rng.random() < p_follow:
                tp[i, j] = cand[i, rng.choice(kids)]
    return tp


def dyadic_probs(rng, tree, vocab, zero_child=0.15):
    """(B, N, V) float32 target distributions with values k / 2**g (g in {2, 4, 10}) favouring children."""
    cand, _, nt, ns = tree
    b, n = cand.shape
    probs = np.zeros((b, n, vocab), np.float32)
    for i in range(b):
        for j in range(n):
            g = int(rng.choice([2, 4, 10]))
            kids = [int(cand[i, c]) for c in oracle.children(nt, ns, i, j)]
            support = set(rng.choice(vocab, int(rng.integers(1, 4)), replace=False).tolist())
            support |= {t for t in kids if rng.random() > zero_child}
            support = np.array(sorted(support))
            w = rng.multinomial(2**g, rng.dirichlet(np.ones(len(support))))
            probs[i, j, support] = w / np.float32(2**g)
    return probs


def coins_for(rng, shape):
    """float32 coins in [0, 1): half exact multiples of 1/16 (CDF boundaries), half random."""
    grid = rng.integers(0, 16, shape).astype(np.float32) / np.float32(16)
    rand = rng.random(shape, dtype=np.float32)
    return np.where(rng.random(shape) < 0.5, grid, rand).astype(np.float32)


def i32(x):
    return np.asarray(x).astype(np.int32)


def assert_verify_equal(out: VerifyOutput, ref):
    pred, acc, num = ref
    np.testing.assert_array_equal(np.asarray(out.accept_index), acc)
    np.testing.assert_array_equal(np.asarray(out.num_correct_drafts), num)
    np.testing.assert_array_equal(np.asarray(out.predict), pred)
    for x in out:
        assert x.dtype == jnp.int32


# ----------------------------------------------------------------------------------------------------
# verify_tree_greedy
# ----------------------------------------------------------------------------------------------------

# Source: SGLang test/registered/kernels/ops/speculative/test_eagle_utils.py::test_verify_tree_greedy
# (identical case in sgl-kernel/tests/speculative/test_eagle_utils.py), word for word.
GOLDEN_CANDIDATES = [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
GOLDEN_RETRIEVE_INDEX = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
GOLDEN_NEXT_TOKEN = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
GOLDEN_NEXT_SIBLING = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]
GOLDEN_PREDICTS_UPSTREAM = [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]  # upstream initialises to -1
GOLDEN_ACCEPT_INDEX = [[0, 3, 4, 5], [6, 10, 11, -1]]
GOLDEN_ACCEPT_TOKEN_NUM = [3, 2]


def golden_target_logits():
    """The fixture's target_logits (2, 6, 20): 1 everywhere, a 10 at the chosen token of each row."""
    target_logits = np.full((2, 6, 20), 1, dtype=np.float32)
    target_logits[0, 0, 3] = 10
    target_logits[0, 3, 4] = 10
    target_logits[0, 4, 5] = 10
    target_logits[1, 0, 11] = 10
    target_logits[1, 4, 12] = 10
    for i in range(target_logits.shape[0]):
        for j in range(target_logits.shape[1]):
            if np.max(target_logits[i][j]) < 10:
                target_logits[i][j][18] = 10
    return target_logits


def golden_tree(dtype=np.int64):
    return tuple(
        np.asarray(x, dtype)
        for x in (GOLDEN_CANDIDATES, GOLDEN_RETRIEVE_INDEX, GOLDEN_NEXT_TOKEN, GOLDEN_NEXT_SIBLING)
    )


def assert_golden_predicts(predict):
    # Upstream initialises predicts to -1 and the kernel writes only the accepted path + bonus; ours is
    # zero-initialised (what eagle_sample does). Compare the written entries, and zeros elsewhere.
    expected = np.asarray(GOLDEN_PREDICTS_UPSTREAM)
    written = expected != -1
    np.testing.assert_array_equal(np.asarray(predict)[written], expected[written])
    np.testing.assert_array_equal(np.asarray(predict)[~written], 0)


def test_verify_tree_greedy_golden():
    target_predict = np.argmax(golden_target_logits(), axis=-1)
    out = verify_tree_greedy(*golden_tree(), target_predict, num_steps=3)
    assert_golden_predicts(out.predict)
    assert np.asarray(out.accept_index).tolist() == GOLDEN_ACCEPT_INDEX
    assert np.asarray(out.num_correct_drafts).tolist() == GOLDEN_ACCEPT_TOKEN_NUM
    # The oracle with upstream's -1 initialisation reproduces the full upstream predicts.
    pred, _, _ = oracle.verify_greedy(*golden_tree(), target_predict, 4, init=-1)
    assert pred.tolist() == GOLDEN_PREDICTS_UPSTREAM


@pytest.mark.parametrize("batch,topk,steps,n,vocab", REAL_CONFIGS)
def test_verify_tree_greedy_real_shapes(batch, topk, steps, n, vocab):
    rng = np.random.default_rng(batch * 1000 + topk * 100 + steps * 10 + n)
    tree = oracle.random_tree(rng, batch, topk, steps, n, vocab)
    tp = greedy_target(rng, tree, vocab)
    ref = oracle.verify_greedy(*tree, tp, steps + 1)
    # while_loop scan, and the loop-free scan bounded by K (its unrolled S*K bodies compile slowly on CPU)
    for bound in (None, topk) if topk * steps <= 24 else (None,):
        out = verify_tree_greedy(*tree, tp, num_steps=steps, topk=bound)
        assert_verify_equal(out, ref)
        assert out.accept_index.shape == (batch, steps + 1)


@settings(max_examples=220)
@given(cfg=tree_configs())
def test_verify_tree_greedy_random_trees(cfg):
    batch, topk, steps, n, seed = cfg
    rng = np.random.default_rng(seed)
    tree = oracle.pad_tree(oracle.random_tree(rng, batch, topk, steps, n, V_PAD), B_PAD, N_PAD, rng, V_PAD)
    tp = greedy_target(rng, tree, V_PAD)
    out = verify_tree_greedy(*(i32(x) for x in tree), i32(tp), num_steps=S_PAD)
    assert_verify_equal(out, oracle.verify_greedy(*tree, tp, S_PAD + 1))


def test_verify_tree_greedy_depth_cap():
    # A chain deeper than num_steps: the walk stops after S accepted drafts (accept width S + 1).
    rng = np.random.default_rng(0)
    tree = oracle.random_tree(rng, 4, 1, 6, 7, 16)
    tp = greedy_target(rng, tree, 16, p_follow=1.0)
    for s in (1, 3, 6):
        out = verify_tree_greedy(*tree, tp, num_steps=s)
        assert_verify_equal(out, oracle.verify_greedy(*tree, tp, s + 1))
        assert (np.asarray(out.num_correct_drafts) == s).all()


def test_verify_tree_greedy_first_sibling_wins():
    # Two siblings carry the target token: the first in sibling order is accepted.
    cand = np.array([[5, 7, 7, 9]])
    ri = np.array([[0, 1, 2, 3]])
    nt = np.array([[1, -1, 3, -1]])
    ns = np.array([[-1, 2, -1, -1]])
    tp = np.array([[7, 1, 9, 2]])
    out = verify_tree_greedy(cand, ri, nt, ns, tp, num_steps=2)
    assert np.asarray(out.accept_index).tolist() == [[0, 1, -1]]
    assert np.asarray(out.predict).tolist() == [7, 1, 0, 0]


def test_verify_tree_greedy_empty_batch():
    z = np.zeros((0, 4), np.int32)
    out = verify_tree_greedy(z, z, z, z, z, num_steps=3)
    assert out.predict.shape == (0,) and out.accept_index.shape == (0, 4) and out.num_correct_drafts.shape == (0,)


# ----------------------------------------------------------------------------------------------------
# tree_speculative_sampling_target_only
# ----------------------------------------------------------------------------------------------------

# Source: SGLang 0.5.23-era test/registered/kernels/ops/speculative/test_speculative_sampling.py
# (JIT expectations): thresholds (1, 1) and (0, 0) both expect accept_index [[0,3,4,5],[6,10,11,-1]];
# the AOT test (sgl-kernel/tests/speculative/test_speculative_sampling.py) expected
# [[0,1,2,-1],[6,10,11,-1]] for (0, 0), before the `<` rule and the `p > 0` guard.
SAMPLING_CASES = [
    (1, 1, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    (0, 0, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "threshold_single,threshold_acc,expected_predicts,expected_accept_index,expected_accept_token_num",
    SAMPLING_CASES,
)
def test_sampling_golden(
    seed, threshold_single, threshold_acc, expected_predicts, expected_accept_index, expected_accept_token_num
):
    temperatures = np.array([0.01, 0.01], dtype=np.float32)
    target_probs = jax.nn.softmax(jnp.asarray(golden_target_logits()) / temperatures[:, None, None], axis=-1)
    rng = np.random.default_rng(seed)  # upstream uses torch.rand coins; any coins in [0, 1) give this result
    coins = rng.random((2, 6), dtype=np.float32)
    final = rng.random(2, dtype=np.float32)
    out = tree_speculative_sampling_target_only(
        *golden_tree(),
        coins,
        final,
        target_probs,
        np.zeros((2, 6, 20), np.float32),
        num_steps=len(expected_accept_index[0]) - 1,
        threshold_single=threshold_single,
        threshold_acc=threshold_acc,
    )
    assert_golden_predicts(out.predict)
    assert np.asarray(out.predict).tolist() == [0 if x == -1 else x for x in expected_predicts]
    assert np.asarray(out.accept_index).tolist() == expected_accept_index
    assert np.asarray(out.num_correct_drafts).tolist() == expected_accept_token_num


# Source: SGLang test/registered/kernels/ops/speculative/test_speculative_sampling.py::
# test_target_only_sampling_cdf_boundaries, word for word.
CDF_BOUNDARY_CASES = [
    ([2], [0.0, 1.0, 0.0], 0.0, 0.0, 1, 0),
    ([2], [0.0, 1.0, 0.0], 0.0, 1.0, 1, 0),
    ([1, 2, 3], [0.0, 0.25, 0.0, 0.75], 0.25, 1.0, 3, 1),
    ([1], [0.0, 0.25, 0.75], 0.0, 1.0, 1, 1),
    ([1], [0.0, 1.0], 1.0 - 2**-24, 1.0, 1, 1),
]
CDF_BOUNDARY_IDS = [
    "zero-mass-zero-threshold",
    "zero-mass-default-threshold",
    "interior-boundary",
    "lower-endpoint",
    "upper-endpoint",
]


@pytest.mark.parametrize(
    "candidate_tokens,target_probabilities,coin,threshold_single,expected_token,expected_accept_token_num",
    CDF_BOUNDARY_CASES,
    ids=CDF_BOUNDARY_IDS,
)
def test_sampling_cdf_boundaries(
    candidate_tokens, target_probabilities, coin, threshold_single, expected_token, expected_accept_token_num
):
    num_candidates = len(candidate_tokens)
    candidates = np.array([[0, *candidate_tokens]], dtype=np.int64)
    num_draft_tokens = candidates.shape[1]
    retrive_index = np.arange(num_draft_tokens, dtype=np.int64)[None, :]
    retrive_next_token = np.full_like(retrive_index, -1)
    retrive_next_token[0, 0] = 1
    retrive_next_sibling = np.full_like(retrive_index, -1)
    if num_candidates > 1:
        retrive_next_sibling[0, 1:num_candidates] = np.arange(2, num_candidates + 1, dtype=np.int64)
    target_probs = np.zeros((1, num_draft_tokens, len(target_probabilities)), dtype=np.float32)
    target_probs[0, 0] = np.array(target_probabilities, dtype=np.float32)
    target_probs[0, 1:, 0] = 1.0
    draft_probs = np.zeros_like(target_probs)
    coins = np.zeros((1, num_draft_tokens), dtype=np.float32)
    coins[0, 0] = coin
    out = tree_speculative_sampling_target_only(
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        coins,
        np.zeros((1,), dtype=np.float32),
        target_probs,
        draft_probs,
        num_steps=1,  # accept_index width 2 upstream
        threshold_single=threshold_single,
        threshold_acc=1.0,
    )
    assert int(out.predict[0]) == expected_token
    assert int(out.num_correct_drafts[0]) == expected_accept_token_num


def test_sampling_strict_less_than():
    # Dyadic chain: coin exactly equal to prob_acc rejects (0.5.23 `<`; AOT `<=` accepted).
    cand = np.array([[0, 1, 2]])
    ri = np.array([[0, 1, 2]])
    nt = np.array([[1, -1, -1]])
    ns = np.array([[-1, 2, -1]])
    probs = np.zeros((1, 3, 4), np.float32)
    probs[0, 0] = [0.0, 0.5, 0.25, 0.25]
    probs[0, 1:, 3] = 1.0
    for coin, accepted, token in ((0.5, 2, 2), (0.5 - 2**-24, 1, 1), (0.75, 0, 3)):
        out = tree_speculative_sampling_target_only(
            cand, ri, nt, ns, np.array([[coin, 0, 0]], np.float32), np.array([0.5], np.float32), probs, num_steps=1
        )
        assert int(out.accept_index[0, 1]) == (accepted if accepted else -1)
        assert int(out.predict[0]) == token


@pytest.mark.parametrize("batch,topk,steps,n,vocab", [REAL_CONFIGS[i] for i in (0, 1, 2, 5, 6)])
def test_sampling_real_shapes(batch, topk, steps, n, vocab):
    rng = np.random.default_rng(7 + batch * 1000 + topk * 100 + steps * 10 + n)
    tree = oracle.random_tree(rng, batch, topk, steps, n, vocab)
    probs = dyadic_probs(rng, tree, vocab)
    coins, final = coins_for(rng, (batch, n)), coins_for(rng, (batch,))
    ref = oracle.sampling_target_only(*tree, coins, final, probs, None, steps + 1)
    for bound in (None, topk) if topk * steps <= 16 else (None,):  # unrolled S*K bodies compile slowly
        out = tree_speculative_sampling_target_only(*tree, coins, final, probs, num_steps=steps, topk=bound)
        assert_verify_equal(out, ref)


N_PAD_S, V_S = 64, 32  # sampling breadth: trees with N <= 48 (K > 1) or chains, embedded at N_PAD_S


def sampling_case(rng, batch, topk, steps, n, b_pad, use_draft):
    """One padded sampling case: a random tree of `batch` rows, dyadic target (and draft) probs, coins."""
    n_used = n if topk == 1 else min(n, 48)  # keep the per-node NumPy fill cheap
    tree = oracle.random_tree(rng, batch, topk, steps, n_used, V_S)
    padded = oracle.pad_tree(tree, b_pad, N_PAD_S, rng, V_S)
    probs = np.zeros((b_pad, N_PAD_S, V_S), np.float32)
    probs[:batch, :n_used] = dyadic_probs(rng, tree, V_S)
    probs[batch:, 0, 0] = 1.0
    draft = np.zeros_like(probs)
    if use_draft:
        draft = (rng.integers(0, 5, probs.shape) / np.float32(16)).astype(np.float32)
    coins, final = coins_for(rng, (b_pad, N_PAD_S)), coins_for(rng, (b_pad,))
    return padded, probs, draft, coins, final


@settings(max_examples=220)
@given(cfg=tree_configs(), use_draft=st.booleans())
def test_sampling_random_trees(cfg, use_draft):
    batch, topk, steps, n, seed = cfg
    rng = np.random.default_rng(seed)
    tree, probs, draft, coins, final = sampling_case(rng, batch, topk, steps, n, B_PAD, use_draft)
    out = tree_speculative_sampling_target_only(*(i32(x) for x in tree), coins, final, probs, draft, num_steps=S_PAD)
    assert_verify_equal(out, oracle.sampling_target_only(*tree, coins, final, probs, draft, S_PAD + 1))


@pytest.mark.parametrize("threshold_single,threshold_acc", [(0.0, 0.0), (0.5, 0.5), (1.0, 0.25), (0.25, 1.0)])
def test_sampling_thresholds(threshold_single, threshold_acc):
    # Thresholds are static (one compile each): many random trees per call, 8 calls per threshold pair.
    rng = np.random.default_rng(int(threshold_single * 100 + threshold_acc * 10))
    for _ in range(8):
        topk, steps = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        n = int(rng.choice(oracle.valid_num_draft_tokens(topk, steps)))
        tree, probs, draft, coins, final = sampling_case(rng, B_PAD, topk, steps, n, B_PAD, bool(rng.random() < 0.5))
        out = tree_speculative_sampling_target_only(
            *(i32(x) for x in tree), coins, final, probs, draft, num_steps=S_PAD,
            threshold_single=threshold_single, threshold_acc=threshold_acc,
        )
        ref = oracle.sampling_target_only(
            *tree, coins, final, probs, draft, S_PAD + 1, threshold_single, threshold_acc
        )
        assert_verify_equal(out, ref)


def test_sampling_full_depth_ignores_draft_probs():
    # k == S: the bonus is sampled from the target row alone (upstream: "no draft_probs for the bonus").
    cand = np.array([[0, 1]])
    ri = np.array([[0, 1]])
    nt = np.array([[1, -1]])
    ns = np.array([[-1, -1]])
    probs = np.zeros((1, 2, 4), np.float32)
    probs[0, 0, 1] = 1.0
    probs[0, 1] = [0.25, 0.25, 0.25, 0.25]
    draft = np.zeros_like(probs)
    draft[0, 1] = [0.25, 0.25, 0.25, 0.0]  # would force token 3 if it were used
    out = tree_speculative_sampling_target_only(
        cand, ri, nt, ns, np.zeros((1, 2), np.float32), np.array([0.1], np.float32), probs, draft, num_steps=1
    )
    assert np.asarray(out.predict).tolist() == [1, 0]
    out = tree_speculative_sampling_target_only(
        cand, ri, nt, ns, np.zeros((1, 2), np.float32), np.array([0.1], np.float32), probs, draft, num_steps=2
    )
    assert np.asarray(out.predict).tolist() == [1, 3]


def test_sample_residual_rule():
    r = np.array(
        [[0.0, 0.25, 0.0, 0.75], [0.0, 0.25, 0.0, 0.75], [0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]], np.float32
    )
    coin = np.array([0.0, 1.0 / 3.0 + 0.0, 0.5, 0.999], np.float32)
    # coin 0 -> first positive index; u exactly on a boundary goes right (strict >); all-zero -> V-1.
    assert np.asarray(sample_residual(jnp.asarray(r), jnp.asarray(coin))).tolist() == [1, 3, 3, 0]
    coin = np.array([0.25, 0.2499, 0.0, 0.0], np.float32)
    assert np.asarray(sample_residual(jnp.asarray(r), jnp.asarray(coin))).tolist()[:2] == [3, 1]


def test_sampling_follows_target_distribution():
    """Thresholds 1/1: the first token after the root (accepted child or correction) ~ target q."""
    draws, vocab = 200_000, 16
    rng = np.random.default_rng(1234)
    q = rng.dirichlet(np.ones(vocab) * 2.0).astype(np.float32)
    q[5] = 0.0  # a zero-mass child: never accepted, never sampled
    q /= q.sum(dtype=np.float32)
    child_tokens = [3, 5, 9, 0]
    n = 1 + len(child_tokens)
    cand = np.array([[0, *child_tokens]], np.int32)
    nt = np.array([[1, -1, -1, -1, -1]], np.int32)
    ns = np.array([[-1, 2, 3, 4, -1]], np.int32)
    probs = np.full((1, n, vocab), 1.0 / vocab, np.float32)
    probs[0, 0] = q
    key = jax.random.PRNGKey(0)

    @jax.jit
    def run(key):
        k1, k2 = jax.random.split(key)
        coins = jax.random.uniform(k1, (draws, n), jnp.float32)
        final = jax.random.uniform(k2, (draws,), jnp.float32)
        bt = lambda x: jnp.broadcast_to(jnp.asarray(x), (draws,) + x.shape[1:])  # noqa: E731
        ri = jnp.arange(draws * n, dtype=jnp.int32).reshape(draws, n)
        out = tree_speculative_sampling_target_only(
            bt(cand), ri, bt(nt), bt(ns), coins, final, bt(probs), num_steps=1
        )
        return out.predict.reshape(draws, n)[:, 0], out.num_correct_drafts

    first, num = (np.asarray(x) for x in run(key))
    counts = np.bincount(first, minlength=vocab)
    assert counts[5] == 0
    expected = draws * q.astype(np.float64)
    pos = expected > 0
    chi2 = float((((counts - expected) ** 2)[pos] / expected[pos]).sum())
    assert pos.sum() == 15
    assert chi2 < 36.12, chi2  # 0.999 quantile of chi-square with 14 degrees of freedom
    tv = 0.5 * np.abs(counts / draws - q).sum()
    assert tv < 0.01, tv
    # Acceptance rate = mass of the (positive) child tokens.
    np.testing.assert_allclose(num.mean(), q[child_tokens].sum(), atol=0.005)


def test_sampling_empty_batch():
    z = np.zeros((0, 3), np.int32)
    out = tree_speculative_sampling_target_only(
        z, z, z, z, np.zeros((0, 3), np.float32), np.zeros((0,), np.float32), np.zeros((0, 3, 8), np.float32),
        num_steps=2,
    )
    assert out.predict.shape == (0,) and out.accept_index.shape == (0, 3)


# ----------------------------------------------------------------------------------------------------
# top-k / top-p renorm
# ----------------------------------------------------------------------------------------------------


def dyadic_rows(rng, rows, vocab):
    out = np.zeros((rows, vocab), np.float32)
    for r in range(rows):
        g = int(rng.choice([3, 6, 10]))
        # coarse grids make ties at the top-k / top-p pivot frequent
        out[r] = rng.multinomial(2**g, rng.dirichlet(np.ones(vocab) * 0.5)) / np.float32(2**g)
    return out


def test_top_k_renorm_matches_oracle():
    rng = np.random.default_rng(3)
    rows, vocab = 400, 24
    probs = dyadic_rows(rng, rows, vocab)
    top_k = rng.integers(1, vocab + 5, rows).astype(np.int32)
    top_k[:3] = [1, vocab, 1 << 30]  # SGLang's TOP_K_ALL keeps everything
    out = np.asarray(top_k_renorm_prob(probs, top_k))
    keep = oracle.top_k_keep(probs, top_k)
    np.testing.assert_array_equal(out > 0, keep & (probs > 0))
    ref = np.where(keep, probs, 0) / np.where(keep, probs, 0).sum(1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=0)
    assert (keep.sum(1) >= np.minimum(top_k, vocab)).all()


def test_top_p_renorm_matches_oracle():
    rng = np.random.default_rng(4)
    rows, vocab = 400, 24
    probs = dyadic_rows(rng, rows, vocab)
    top_p = (rng.integers(1, 65, rows) / np.float32(64)).astype(np.float32)  # exact boundaries happen
    top_p[:2] = [1.0, 2**-10]
    out = np.asarray(top_p_renorm_prob(probs, top_p))
    keep = oracle.top_p_keep(probs, top_p)
    np.testing.assert_array_equal(out > 0, keep & (probs > 0))
    ref = np.where(keep, probs, 0) / np.where(keep, probs, 0).sum(1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=0)


def test_top_p_boundary_keeps_smallest_prefix():
    # mass of {0.5} == p exactly: FlashInfer keeps the single top token (the HIP fallback would keep 2).
    probs = np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]], np.float32)
    out = np.asarray(top_p_renorm_prob(probs, np.array([0.5, 0.75], np.float32)))
    # row 1: prefix {0.5} has 0.5 < 0.75, {0.5, 0.25} reaches it; the 0.25 tie group is kept whole.
    assert out.tolist() == [[1.0, 0.0, 0.0], [0.25, 0.5, 0.25]]


# ----------------------------------------------------------------------------------------------------
# jit, transfer guard, validation
# ----------------------------------------------------------------------------------------------------


def test_jit_and_no_host_transfers():
    rng = np.random.default_rng(11)
    tree = tuple(jnp.asarray(i32(x)) for x in oracle.random_tree(rng, 4, 4, 5, 8, 32))
    probs = jnp.asarray(dyadic_probs(rng, tuple(np.asarray(x) for x in tree), 32))
    tp = jnp.asarray(i32(greedy_target(rng, tuple(np.asarray(x) for x in tree), 32)))
    coins, final = jnp.asarray(coins_for(rng, (4, 8))), jnp.asarray(coins_for(rng, (4,)))
    topk = jnp.full((32,), 3, jnp.int32)
    topp = jnp.full((32,), 0.5, jnp.float32)

    @jax.jit
    def step(tree, tp, coins, final, probs):
        g = verify_tree_greedy(*tree, tp, num_steps=5)
        s = tree_speculative_sampling_target_only(*tree, coins, final, probs, num_steps=5, threshold_acc=0.5)
        flat = probs.reshape(32, 32)
        return g, s, top_k_renorm_prob(flat, topk), top_p_renorm_prob(flat, topp)

    expected = jax.device_get(step(tree, tp, coins, final, probs))
    with jax.transfer_guard("disallow"):
        got = step(tree, tp, coins, final, probs)
        jax.block_until_ready(got)
        # eager public calls on device arrays do not transfer either
        eager = verify_tree_greedy(*tree, tp, num_steps=5)
        jax.block_until_ready(eager)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(jax.device_get(got))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(eager.predict), expected[0].predict)


def test_int64_inputs_are_narrowed_and_range_checked():
    tree = golden_tree(np.int64)
    tp = np.argmax(golden_target_logits(), axis=-1).astype(np.int64)
    out = verify_tree_greedy(*tree, tp, num_steps=3)
    assert np.asarray(out.accept_index).tolist() == GOLDEN_ACCEPT_INDEX
    bad = tree[0].copy()
    bad[0, 1] = 2**40
    with pytest.raises(ValueError, match="candidates.*int32"):
        verify_tree_greedy(bad, *tree[1:], tp, num_steps=3)


def _sampling_args(**over):
    z = np.zeros((2, 3), np.int32)
    args = dict(
        candidates=z, retrieve_index=z, retrieve_next_token=z, retrieve_next_sibling=z,
        uniform_samples=np.zeros((2, 3), np.float32), uniform_samples_for_final_sampling=np.zeros((2,), np.float32),
        target_probs=np.zeros((2, 3, 5), np.float32),
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over,kw,match",
    [
        (dict(candidates=np.zeros((2, 4), np.int32)), {}, r"candidates: expected shape \(2, 3\)"),
        (dict(retrieve_index=np.zeros((2, 3), np.float32)), {}, "retrieve_index: expected an integer dtype"),
        (dict(retrieve_next_token=np.zeros((3,), np.int32)), {}, "retrieve_next_token: expected shape"),
        (dict(retrieve_next_sibling=np.zeros((2, 3), bool)), {}, "retrieve_next_sibling: expected an integer"),
        (dict(uniform_samples=np.zeros((2, 3), np.float64)), {}, "uniform_samples: expected dtype float32"),
        (dict(uniform_samples=np.zeros((2, 4), np.float32)), {}, "uniform_samples: expected shape"),
        (dict(uniform_samples_for_final_sampling=np.zeros((3,), np.float32)), {}, "final_sampling: expected shape"),
        (dict(target_probs=np.zeros((2, 3, 5), np.float16)), {}, "target_probs: expected dtype float32"),
        (dict(target_probs=np.zeros((2, 4, 5), np.float32)), {}, "target_probs: expected shape"),
        (dict(draft_probs=np.zeros((2, 3, 6), np.float32)), {}, "draft_probs: expected shape"),
        ({}, dict(num_steps=0), "num_steps: expected >= 1"),
        ({}, dict(topk=0), "topk: expected >= 1"),
        ({}, dict(threshold_acc=1.5), "threshold_acc: expected a value in"),
        ({}, dict(threshold_single=jnp.float32(0.5)), "threshold_single: expected a Python float"),
    ],
)
def test_sampling_value_errors(over, kw, match):
    kw = dict(num_steps=2) | kw
    with pytest.raises(ValueError, match=match):
        tree_speculative_sampling_target_only(**_sampling_args(**over), **kw)


def test_greedy_value_errors():
    z = np.zeros((2, 3), np.int32)
    with pytest.raises(ValueError, match="target_predict: expected shape"):
        verify_tree_greedy(z, z, z, z, np.zeros((6,), np.int32), num_steps=2)
    with pytest.raises(ValueError, match="target_predict: expected an integer"):
        verify_tree_greedy(z, z, z, z, np.zeros((2, 3), np.float32), num_steps=2)
    with pytest.raises(ValueError, match="num_steps: expected a Python int"):
        verify_tree_greedy(z, z, z, z, z, num_steps=2.0)
    with pytest.raises(ValueError, match="retrieve_index: expected shape"):
        verify_tree_greedy(z, np.zeros((6,), np.int32), z, z, z, num_steps=2)


def test_renorm_value_errors():
    probs = np.full((2, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match="top_k: expected values >= 1"):
        top_k_renorm_prob(probs, np.array([1, 0], np.int32))
    with pytest.raises(ValueError, match="top_k: expected shape"):
        top_k_renorm_prob(probs, np.array([1, 2, 3], np.int32))
    with pytest.raises(ValueError, match=r"top_p: expected values in \(0, 1\]"):
        top_p_renorm_prob(probs, np.array([0.5, 0.0], np.float32))
    with pytest.raises(ValueError, match="probs: expected dtype float32"):
        top_p_renorm_prob(probs.astype(np.float64), np.array([0.5, 0.5], np.float32))


def test_value_checks_read_concrete_device_arrays():
    """The host value checks run for concrete jax arrays passed eagerly, as for NumPy inputs (an explicit
    device read, allowed under a disallowing transfer guard); under jit the values are traced and unchecked."""
    probs = jnp.full((2, 4), 0.25, jnp.float32)
    with jax.transfer_guard("disallow"):
        with pytest.raises(ValueError, match="top_k: expected values >= 1"):
            top_k_renorm_prob(probs, jax.device_put(np.array([1, 0], np.int32)))
        with pytest.raises(ValueError, match=r"top_p: expected values in \(0, 1\]"):
            top_p_renorm_prob(probs, jax.device_put(np.array([0.5, 0.0], np.float32)))
    ranked = jnp.asarray([[0.4, 0.3, 0.2, 0.1]] * 2, jnp.float32)
    out = jax.jit(top_k_renorm_prob)(ranked, jnp.array([1, 0], jnp.int32))  # traced: unchecked, acts as 1
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 0, 0, 0], [1.0, 0, 0, 0]])
