"""Tests for jaxspec.ops.tree (build_tree, build_chain_tree) against the NumPy oracle and upstream fixtures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import np_oracle_tree as oracle
from jaxspec._validate import checks
from jaxspec.config import SpecConfig
from jaxspec.ops.draft import chain_draft_results, organize_draft_results
from jaxspec.ops.tree import (
    FULL_MASK_PAD,
    TreeMaskMode,
    TreeOutput,
    build_chain_tree,
    build_tree,
    packed_mask_dtype,
)

MODES = list(TreeMaskMode)
FIELDS = ("tree_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "draft_tokens")

# ---------------------------------------------------------------------------------------------
# Upstream golden fixture, word for word from SGLang test/srt/test_build_eagle_tree.py
# (TestBuildEagleTree.test_build_tree_kernel_efficient; K=4, S=4, N=8, seq_lens=[5, 10]).
# ---------------------------------------------------------------------------------------------
F32 = np.float32
VERIFIED_ID = np.array([29974, 13], np.int32)
SCORE_LIST = [
    np.array(
        [
            [[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]],
            [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]],
        ],
        F32,
    ),
    np.array(
        [
            [
                [6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03],
                [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
                [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08],
                [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05],
            ],
            [
                [8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02],
                [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
                [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05],
                [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08],
            ],
        ],
        F32,
    ),
    np.array(
        [
            [
                [6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06],
                [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
                [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05],
                [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05],
            ],
            [
                [2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03],
                [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
                [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04],
                [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04],
            ],
        ],
        F32,
    ),
    np.array(
        [
            [
                [6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06],
                [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
                [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05],
                [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05],
            ],
            [
                [5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04],
                [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
                [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03],
                [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04],
            ],
        ],
        F32,
    ),
]
TOKEN_LIST = [
    np.array([[29896, 29906, 29900, 29945], [13, 2, 29871, 28956]], np.int64),
    np.array(
        [
            [29889, 29974, 29945, 29900, 29974, 29922, 29930, 29958,
             29889, 29974, 29930, 29945, 29974, 29922, 29930, 29958],
            [22550, 4136, 16492, 8439, 29871, 2, 3001, 13,
             2, 13, 29906, 29946, 2, 13, 29871, 259],
        ],
        np.int64,
    ),
    np.array(
        [
            [29946, 29945, 29953, 29906, 29896, 29945, 29900, 29906,
             29896, 29945, 29906, 29953, 29896, 29945, 29906, 29946],
            [29871, 2, 29901, 29889, 29871, 2, 395, 259,
             29901, 29871, 2, 29889, 3001, 1234, 7146, 2186],
        ],
        np.int64,
    ),
    np.array(
        [
            [29946, 29974, 29945, 29930, 29889, 29922, 29974, 29930,
             29974, 29946, 29930, 29922, 29889, 29974, 29945, 29922],
            [29941, 29906, 2, 29946, 29871, 450, 319, 14990,
             29946, 29941, 2, 29906, 29871, 2, 3001, 13],
        ],
        np.int64,
    ),
]
PARENTS_LIST = [
    np.array([[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]], np.int64),
    np.array([[4, 8, 9, 10], [4, 5, 6, 7]], np.int64),
    np.array([[20, 24, 21, 28], [24, 28, 20, 21]], np.int64),
    np.array([[36, 40, 41, 44], [36, 40, 44, 45]], np.int64),
]
SEQ_LENS = np.array([5, 10], np.int64)
FIXTURE_CONFIG = SpecConfig(num_steps=4, topk=4, num_draft_tokens=8)
EXPECTED_POSITIONS = [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
EXPECTED_RETRIEVE_INDEX = [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
EXPECTED_NEXT_TOKEN = [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
EXPECTED_NEXT_SIBLING = [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
EXPECTED_DRAFT_TOKENS = [29974, 29896, 29906, 29889, 29974, 29946, 29896, 29946,
                         13, 13, 22550, 4136, 16492, 8439, 29871, 29941]
# Selected flat indices and the bit-packed masks (derived, not an upstream assertion).
EXPECTED_TOP_SCORES_INDEX = [[0, 1, 4, 8, 20, 24, 36], [0, 4, 5, 6, 7, 24, 36]]
EXPECTED_PACKED_MASK = [1, 3, 5, 11, 21, 43, 85, 171, 1, 3, 7, 11, 19, 35, 75, 203]


def _fixture_tree(mode):
    org = organize_draft_results(SCORE_LIST, TOKEN_LIST, PARENTS_LIST, num_draft_tokens=8)
    out = build_tree(
        VERIFIED_ID, org.parent_list, org.top_scores_index, org.draft_tokens, SEQ_LENS,
        config=FIXTURE_CONFIG, mask_mode=mode, max_seq_lens_sum=15,
    )
    return org, out


@pytest.mark.parametrize("mode", MODES)
def test_upstream_fixture(mode):
    org, out = _fixture_tree(mode)
    np.testing.assert_array_equal(org.top_scores_index, EXPECTED_TOP_SCORES_INDEX)
    np.testing.assert_array_equal(out.positions, EXPECTED_POSITIONS)
    np.testing.assert_array_equal(out.retrieve_index, EXPECTED_RETRIEVE_INDEX)
    np.testing.assert_array_equal(out.retrieve_next_token, EXPECTED_NEXT_TOKEN)
    np.testing.assert_array_equal(out.retrieve_next_sibling, EXPECTED_NEXT_SIBLING)
    np.testing.assert_array_equal(out.draft_tokens, EXPECTED_DRAFT_TOKENS)
    for name in FIELDS[1:]:
        assert getattr(out, name).dtype == jnp.int32, name
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        assert out.tree_mask.dtype == jnp.uint8
        np.testing.assert_array_equal(out.tree_mask, EXPECTED_PACKED_MASK)
    # every layout decodes to the same visibility as the packed golden values
    vis = oracle.decode_mask(np.asarray(out.tree_mask), SEQ_LENS, 8, int(mode))
    packed = np.array(EXPECTED_PACKED_MASK).reshape(2, 8)
    np.testing.assert_array_equal(vis, (packed[:, :, None] >> np.arange(8)) & 1 == 1)


def test_upstream_fixture_full_mask_layout():
    _, out = _fixture_tree(TreeMaskMode.FULL_MASK)
    mask = np.asarray(out.tree_mask)
    assert mask.shape == (15 * 8 + 2 * 64,) and int(out.tree_mask_len) == 15 * 8 + 2 * 64
    want = oracle.build_tree(VERIFIED_ID, *[np.asarray(x) for x in organize_draft_results(
        SCORE_LIST, TOKEN_LIST, PARENTS_LIST, num_draft_tokens=8)], SEQ_LENS, 4, 4, 8, 0)[0]
    np.testing.assert_array_equal(mask, want)
    # prefix columns of request 1, row 3 are True (fill_prefix_mask=True)
    r = 5 * 8 + 2 * 0 + 64 + (10 + 8) * 3
    assert mask[r : r + 10].all()


# ---------------------------------------------------------------------------------------------
# Random comparisons with the NumPy oracle
# ---------------------------------------------------------------------------------------------


def _compare(out: TreeOutput, want, n, mode):
    mask, pos, ri, nt, ns, tok, mask_len = want
    np.testing.assert_array_equal(np.asarray(out.tree_mask), mask)
    assert out.tree_mask.dtype == (mask.dtype if mode == TreeMaskMode.QLEN_ONLY_BITPACKING else jnp.bool_)
    np.testing.assert_array_equal(out.positions, pos)
    np.testing.assert_array_equal(out.retrieve_index, ri)
    np.testing.assert_array_equal(out.retrieve_next_token, nt)
    np.testing.assert_array_equal(out.retrieve_next_sibling, ns)
    np.testing.assert_array_equal(out.draft_tokens, tok)
    assert int(out.tree_mask_len) == mask_len


@st.composite
def spec_configs(draw, max_steps=8, max_topk=8, max_n=None):
    s = draw(st.integers(1, max_steps))
    k = draw(st.integers(1, max_topk))
    if k == 1:
        n = s + 1
    else:
        hi = k + (s - 1) * k * k + 1
        if max_n is not None:
            hi = min(hi, max_n)
        n = draw(st.integers(1, hi))
    return SpecConfig(num_steps=s, topk=k, num_draft_tokens=n)


def _batch_for(draw, n):
    # several cases per call (rows), bounded so the Python-loop oracle stays fast
    cap = max(1, min(64, 2048 // max(n, 1)))
    return draw(st.sampled_from(sorted({1, cap})))


def _realistic_case(cfg, b, mode, seed):
    s, k, n = cfg.num_steps, cfg.topk, cfg.num_draft_tokens
    rng = np.random.default_rng(seed)
    _, _, (pl, sel, dt) = oracle.draft_pipeline(rng, b, s, k, n)
    seq = rng.integers(0, 40, b)
    bonus = rng.integers(0, 1000, b).astype(np.int32)
    max_sum = 40 * b
    out = build_tree(bonus, pl, sel, dt, seq, config=cfg, mask_mode=mode, max_seq_lens_sum=max_sum)
    want = oracle.build_tree(bonus, pl, sel, dt, seq, k, s, n, int(mode), max_seq_lens_sum=max_sum)
    _compare(out, want, n, mode)
    if mode == TreeMaskMode.FULL_MASK:
        assert not np.asarray(out.tree_mask)[want[-1] :].any()  # FULL_MASK_PAD tail
        assert FULL_MASK_PAD is False


# Each row of a call is an independent random tree, so one compiled shape checks B cases:
# 5 configs x 64 rows = 320 realistic cases per mask mode, plus the hypothesis sweep below.
SWEEP_CONFIGS = [(5, 4, 8), (3, 1, 4), (1, 4, 4), (8, 8, 32), (4, 2, 15), (2, 3, 13)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("s, k, n", SWEEP_CONFIGS)
def test_build_tree_matches_oracle_sweep(mode, s, k, n):
    _realistic_case(SpecConfig(num_steps=s, topk=k, num_draft_tokens=n), 64, mode, seed=1000 * s + 10 * k + n)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_build_tree_matches_oracle_realistic(mode, data):
    """Any (S, K) in 1..8 and any valid N (each example is a fresh compile, so few examples)."""
    max_n = 32 if mode == TreeMaskMode.QLEN_ONLY_BITPACKING else None
    cfg = data.draw(spec_configs(max_n=max_n))
    b = _batch_for(data.draw, cfg.num_draft_tokens)
    _realistic_case(cfg, b, mode, data.draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_build_tree_matches_oracle_malformed(mode, data):
    """Random (mostly malformed) parent lists / selections: bounded-walk semantics."""
    cfg = data.draw(spec_configs(max_steps=5, max_topk=4, max_n=20))
    s, k, n = cfg.num_steps, cfg.topk, cfg.num_draft_tokens
    b = data.draw(st.sampled_from([1, 16]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    c = cfg.num_candidates
    sel = rng.integers(0, c, (b, n - 1))
    if data.draw(st.booleans()):
        sel = np.sort(sel, axis=1)
    pl = rng.integers(-1, c + 3, (b, cfg.parent_list_width))  # values may be absent from sel
    hit = rng.random(pl.shape) < 0.5  # make about half of the lookups succeed
    if n > 1 and pl.size:
        pl = np.where(hit, np.take_along_axis(sel, rng.integers(0, n - 1, pl.shape), 1), pl)
    dt = rng.integers(0, 1000, (b, n - 1))
    seq = rng.integers(0, 9, b)
    bonus = rng.integers(0, 1000, b)
    out = build_tree(bonus, pl, sel, dt, seq, config=cfg, mask_mode=mode, max_seq_lens_sum=9 * b)
    want = oracle.build_tree(bonus, pl, sel, dt, seq, k, s, n, int(mode), max_seq_lens_sum=9 * b)
    _compare(out, want, n, mode)


# ---------------------------------------------------------------------------------------------
# Malformed-tree cases of SGLang test/registered/spec/utils/test_build_eagle_tree_malformed.py
# (inputs word for word; TOPK=2, NUM_STEPS=3, DRAFT_TOKEN_NUM=4, BS=2; upstream compares with an
# oracle, as we do, plus hand-derived positions below).
# ---------------------------------------------------------------------------------------------
MAL_CFG = SpecConfig(num_steps=3, topk=2, num_draft_tokens=4)
MAL_SELECTED = np.array([[4, 2, 0], [2, 4, 0]], np.int64)
MAL_SEQ_LENS = np.array([7, 11], np.int64)
MAL_CASES = {
    "valid_chain": np.array([[0, 0, 2, 0, 0], [0, 4, 0, 0, 0]], np.int64),
    "missing_direct_parent": np.array([[0, 99, 2, 0, 0], [0, 99, 0, 0, 0]], np.int64),
    "missing_ancestor": np.array([[0, 99, 99, 99, 99], [0, 99, 99, 99, 99]], np.int64),
    "cyclic_ancestor": np.array([[0, 2, 2, 0, 0], [0, 4, 4, 0, 0]], np.int64),
    "max_valid_depth": np.array([[0, 0, 4, 2, 0], [0, 0, 2, 4, 0]], np.int64),
}
CROSS_ROW_SELECTED = np.array([[4, 2, 0], [6, 4, 0]], np.int64)
CROSS_ROW_PARENT = np.array([[0, 6, 4, 0, 0], [0, 0, 6, 4, 0]], np.int64)
def _mal_check(parent_list, selected, mode):
    bonus = np.array([1, 2], np.int32)
    dt = np.arange(6, dtype=np.int64).reshape(2, 3)
    out = build_tree(bonus, parent_list, selected, dt, MAL_SEQ_LENS, config=MAL_CFG, mask_mode=mode,
                     max_seq_lens_sum=18)
    want = oracle.build_tree(bonus, parent_list, selected, dt, MAL_SEQ_LENS, 2, 3, 4, int(mode))
    _compare(out, want, 4, mode)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(MAL_CASES))
def test_malformed_upstream_cases(case, mode):
    out = _mal_check(MAL_CASES[case], MAL_SELECTED, mode)
    np.testing.assert_array_equal(out.retrieve_index, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_malformed_hand_derived():
    """Hand-derived expectations for two cases (independent of the oracle)."""
    mode = TreeMaskMode.QLEN_ONLY
    # missing_direct_parent, request 0: node1 = cand 4 (ptb 2 -> parent_list[2] = 2 = sel[1] -> node 2),
    # node2 = cand 2 (ptb 1 -> parent_list[1] = 99, missing), node3 = cand 0 (root child).
    out = _mal_check(MAL_CASES["missing_direct_parent"], MAL_SELECTED, mode)
    np.testing.assert_array_equal(out.positions[:4], [7, 9, 8, 8])
    np.testing.assert_array_equal(out.retrieve_next_token[0], [3, -1, 1, -1])  # node 2 unlinked
    np.testing.assert_array_equal(out.retrieve_next_sibling[0], [-1, -1, -1, -1])
    vis = np.asarray(out.tree_mask).reshape(2, 4, 4)[0]
    np.testing.assert_array_equal(vis, [[1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0], [1, 0, 0, 1]])
    # cyclic_ancestor, request 0: node2 = cand 2, ptb 1 -> parent_list[1] = 2 = itself: depth S = 3.
    out = _mal_check(MAL_CASES["cyclic_ancestor"], MAL_SELECTED, mode)
    np.testing.assert_array_equal(out.positions[:4], [7, 10, 10, 8])
    # max_valid_depth, request 1: node2 = cand 4 -> parent_list[2] = 2 = node 1 -> parent_list[1] = 0
    # = node 3 (root child): depth exactly S = 3, not cut by the bound.
    out = _mal_check(MAL_CASES["max_valid_depth"], MAL_SELECTED, mode)
    np.testing.assert_array_equal(out.positions[4:], [11, 13, 14, 12])
    np.testing.assert_array_equal(np.asarray(out.tree_mask).reshape(2, 4, 4)[1, 2], [1, 1, 1, 1])


@pytest.mark.parametrize("mode", MODES)
def test_malformed_cross_row_lookup(mode):
    out = _mal_check(CROSS_ROW_PARENT, CROSS_ROW_SELECTED, mode)
    # request 0, node 2 = cand 2: parent_list[1] = 6 is only in request 1's row -> unlinked, depth 1
    assert int(out.positions[2]) == 7 + 1
    assert 2 not in np.asarray(out.retrieve_next_token[0]).tolist()


# ---------------------------------------------------------------------------------------------
# build_chain_tree (K == 1)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=4, deadline=None)
@given(s=st.integers(1, 8), b=st.sampled_from([1, 64]), seed=st.integers(0, 2**32 - 1))
def test_chain_tree_equals_build_tree(s, b, seed):
    cfg = SpecConfig(num_steps=s, topk=1, num_draft_tokens=s + 1)
    rng = np.random.default_rng(seed)
    dt = rng.integers(0, 1 << 20, (b, s))
    seq = rng.integers(0, 500, b)
    bonus = rng.integers(0, 1 << 20, b).astype(np.int32)
    chain = chain_draft_results(dt, config=cfg)
    ref = build_tree(bonus, chain.parent_list, chain.top_scores_index, chain.draft_tokens, seq, config=cfg,
                     mask_mode=TreeMaskMode.QLEN_ONLY)
    got = build_chain_tree(bonus, dt, seq, config=cfg)
    for name in TreeOutput._fields:
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    n = s + 1
    np.testing.assert_array_equal(np.asarray(got.tree_mask).reshape(b, n, n)[0], np.tril(np.ones((n, n), bool)))


# ---------------------------------------------------------------------------------------------
# jit, edge cases
# ---------------------------------------------------------------------------------------------


def test_build_tree_under_jit():
    cfg = FIXTURE_CONFIG

    @jax.jit
    def f(bonus, pl, sel, dt, seq):
        return build_tree(bonus, pl, sel, dt, seq, config=cfg, mask_mode=TreeMaskMode.FULL_MASK,
                          max_seq_lens_sum=32)

    org = organize_draft_results(SCORE_LIST, TOKEN_LIST, PARENTS_LIST, num_draft_tokens=8)
    out = f(jnp.asarray(VERIFIED_ID), org.parent_list, org.top_scores_index, org.draft_tokens,
            jnp.asarray(SEQ_LENS, jnp.int32))
    np.testing.assert_array_equal(out.positions, EXPECTED_POSITIONS)
    assert out.tree_mask.shape == (32 * 8 + 2 * 64,)
    assert int(out.tree_mask_len) == 15 * 8 + 128
    assert not np.asarray(out.tree_mask)[15 * 8 + 128 :].any()

    g = jax.jit(build_chain_tree, static_argnames=("config",))
    c1 = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    out = g(jnp.array([7], jnp.int32), jnp.array([[1, 2, 3]], jnp.int32), jnp.array([10], jnp.int32), config=c1)
    np.testing.assert_array_equal(out.draft_tokens, [7, 1, 2, 3])
    np.testing.assert_array_equal(out.positions, [10, 11, 12, 13])


def test_single_step_and_root_only():
    # S == 1: empty parent_list, every node a root child
    cfg = SpecConfig(num_steps=1, topk=4, num_draft_tokens=4)
    sel = np.array([[0, 1, 3]])
    out = build_tree(np.array([5]), np.zeros((1, 0), np.int64), sel, np.array([[7, 8, 9]]), np.array([3]),
                     config=cfg, mask_mode=TreeMaskMode.QLEN_ONLY)
    np.testing.assert_array_equal(out.positions, [3, 4, 4, 4])
    np.testing.assert_array_equal(out.retrieve_next_token, [[1, -1, -1, -1]])
    np.testing.assert_array_equal(out.retrieve_next_sibling, [[-1, 2, 3, -1]])
    # N == 1: the root alone
    cfg = SpecConfig(num_steps=2, topk=2, num_draft_tokens=1)
    out = build_tree(np.array([5, 6]), np.zeros((2, 3), np.int64), np.zeros((2, 0), np.int64),
                     np.zeros((2, 0), np.int64), np.array([3, 4]), config=cfg,
                     mask_mode=TreeMaskMode.QLEN_ONLY_BITPACKING)
    np.testing.assert_array_equal(out.tree_mask, [1, 1])
    np.testing.assert_array_equal(out.positions, [3, 4])
    # idle batch
    cfg = FIXTURE_CONFIG
    out = build_tree(np.zeros(0, np.int32), np.zeros((0, 13), np.int64), np.zeros((0, 7), np.int64),
                     np.zeros((0, 7), np.int64), np.zeros(0, np.int64), config=cfg,
                     mask_mode=TreeMaskMode.QLEN_ONLY)
    assert out.tree_mask.shape == (0,) and out.positions.shape == (0,)


@pytest.mark.parametrize("n, dtype", [(8, np.uint8), (9, np.uint16), (16, np.uint16), (17, np.uint32), (32, np.uint32)])
def test_packed_dtype(n, dtype):
    assert packed_mask_dtype(n) == dtype


def test_checked_mode_max_seq_lens_sum():
    cfg = SpecConfig(num_steps=1, topk=2, num_draft_tokens=2)

    def f(seq):
        return build_tree(jnp.zeros(2, jnp.int32), jnp.zeros((2, 0), jnp.int32), jnp.zeros((2, 1), jnp.int32),
                          jnp.zeros((2, 1), jnp.int32), seq, config=cfg, max_seq_lens_sum=10).positions

    with checks():
        checked = checkify.checkify(jax.jit(f))
        err, _ = checked(jnp.array([4, 6], jnp.int32))
        err.throw()  # no error at the bound
        err, _ = checked(jnp.array([4, 7], jnp.int32))
        with pytest.raises(checkify.JaxRuntimeError, match="max_seq_lens_sum"):
            err.throw()


# ---------------------------------------------------------------------------------------------
# ValueErrors
# ---------------------------------------------------------------------------------------------


def _good():
    org = organize_draft_results(SCORE_LIST, TOKEN_LIST, PARENTS_LIST, num_draft_tokens=8)
    return dict(
        bonus_tokens=VERIFIED_ID, parent_list=np.asarray(org.parent_list, np.int64),
        top_scores_index=np.asarray(org.top_scores_index, np.int64),
        draft_tokens=np.asarray(org.draft_tokens, np.int64), seq_lens=SEQ_LENS,
    )


@pytest.mark.parametrize(
    "name, bad, match",
    [
        ("bonus_tokens", np.zeros(3, np.int32), r"bonus_tokens: expected shape \(2,\)"),
        ("bonus_tokens", np.zeros(2, np.float32), "bonus_tokens: expected an integer dtype"),
        ("parent_list", np.zeros((2, 12), np.int64), r"parent_list: expected shape \(2, 13\)"),
        ("parent_list", np.zeros((2, 13), np.float32), "parent_list: expected an integer dtype"),
        ("top_scores_index", np.zeros((2, 8), np.int64), r"top_scores_index: expected shape \(2, 7\)"),
        ("top_scores_index", np.zeros((2, 7), bool), "top_scores_index: expected an integer dtype"),
        ("draft_tokens", np.zeros((2, 6), np.int64), r"draft_tokens: expected shape \(2, 7\)"),
        ("draft_tokens", np.full((2, 7), 2**40, np.int64), "draft_tokens: int64 value .* does not fit"),
        ("seq_lens", np.zeros((2, 1), np.int64), r"seq_lens: expected shape \(\*,\)"),
        ("seq_lens", np.zeros(2, np.float64), "seq_lens: expected an integer dtype"),
    ],
)
def test_build_tree_value_errors(name, bad, match):
    args = _good()
    args[name] = bad
    with pytest.raises(ValueError, match=match):
        build_tree(**args, config=FIXTURE_CONFIG, mask_mode=TreeMaskMode.QLEN_ONLY)


def test_build_tree_config_errors():
    args = _good()
    with pytest.raises(ValueError, match="max_seq_lens_sum: FULL_MASK needs"):
        build_tree(**args, config=FIXTURE_CONFIG)
    with pytest.raises(ValueError, match=r"seq_lens: sum\(seq_lens\)=15 exceeds max_seq_lens_sum=14"):
        build_tree(**args, config=FIXTURE_CONFIG, max_seq_lens_sum=14)
    with pytest.raises(ValueError, match="max_seq_lens_sum: expected >= 0"):
        build_tree(**args, config=FIXTURE_CONFIG, max_seq_lens_sum=-1)
    with pytest.raises(ValueError, match="max_seq_lens_sum: FULL_MASK buffer"):
        build_tree(**args, config=FIXTURE_CONFIG, max_seq_lens_sum=2**30)
    with pytest.raises(ValueError, match="mask_mode: expected a TreeMaskMode"):
        build_tree(**args, config=FIXTURE_CONFIG, mask_mode=3)
    with pytest.raises(ValueError, match="config: expected a jaxspec.config.SpecConfig"):
        build_tree(**args, config=(4, 4, 8))
    with pytest.raises(ValueError, match="SpecConfig.num_draft_tokens must be in"):
        SpecConfig(num_steps=4, topk=4, num_draft_tokens=1025)
    with pytest.raises(ValueError, match="SpecConfig.num_draft_tokens - 1 must be"):
        SpecConfig(num_steps=1, topk=4, num_draft_tokens=6)
    cfg33 = SpecConfig(num_steps=4, topk=4, num_draft_tokens=33)
    b = 1
    with pytest.raises(ValueError, match="QLEN_ONLY_BITPACKING needs N <= 32, got 33"):
        build_tree(np.zeros(b, np.int32), np.zeros((b, 13), np.int32), np.zeros((b, 32), np.int32),
                   np.zeros((b, 32), np.int32), np.zeros(b, np.int32), config=cfg33,
                   mask_mode=TreeMaskMode.QLEN_ONLY_BITPACKING)
    with pytest.raises(ValueError, match="num_draft_tokens: QLEN_ONLY_BITPACKING needs"):
        packed_mask_dtype(33)


def test_build_chain_tree_value_errors():
    c1 = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    ok = dict(bonus_tokens=np.zeros(2, np.int32), draft_tokens=np.zeros((2, 3), np.int64), seq_lens=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="config.topk: build_chain_tree needs topk == 1"):
        build_chain_tree(**ok, config=FIXTURE_CONFIG)
    for name, bad, match in [
        ("draft_tokens", np.zeros((2, 4), np.int64), r"draft_tokens: expected shape \(2, 3\)"),
        ("bonus_tokens", np.zeros(1, np.int32), r"bonus_tokens: expected shape \(2,\)"),
        ("seq_lens", np.zeros(2, np.float32), "seq_lens: expected an integer dtype"),
        ("draft_tokens", np.full((2, 3), -(2**40), np.int64), "draft_tokens: int64 value"),
    ]:
        args = dict(ok)
        args[name] = bad
        with pytest.raises(ValueError, match=match):
            build_chain_tree(**args, config=c1)


def test_seq_lens_checked_for_concrete_device_arrays():
    """``seq_lens`` given as a concrete jax array (an eager call) is value-checked as a NumPy one is."""
    c1 = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    bonus, drafts = jnp.zeros((2,), jnp.int32), jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="seq_lens: expected non-negative values, got min -1"):
        build_chain_tree(bonus, drafts, jnp.array([3, -1], jnp.int32), config=c1)
    lists = chain_draft_results(drafts, config=c1)
    with pytest.raises(ValueError, match="seq_lens: expected non-negative values, got min -2"):
        build_tree(bonus, lists.parent_list, lists.top_scores_index, lists.draft_tokens, jnp.array([-2, 0], jnp.int32),
                   config=c1, mask_mode=TreeMaskMode.QLEN_ONLY)
