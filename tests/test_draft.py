"""Tests for jaxspec.ops.draft (select_top_k_tokens, organize_draft_results, MTP/chain organisation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import np_oracle_tree as oracle
from jaxspec.config import SpecConfig
from jaxspec.ops.draft import (
    DraftResults,
    SelectTopKOutput,
    TreeInfo,
    chain_draft_results,
    organize_draft_results,
    organize_mtp_draft_results,
    select_top_k_tokens,
)
from jaxspec.ops.tree import TreeMaskMode, build_tree


def _softmax_topk(rng, rows, k, vocab=64):
    """Per-row top-k of a random softmax (fp32, distinct values: no ties to break)."""
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    tok = rng.integers(0, 100_000, (rows, vocab))
    return np.take_along_axis(p, idx, -1), np.take_along_axis(tok, idx, -1)


def _select_inputs(rng, step, b, k, hidden_dim):
    rows = b if step == 0 else b * k
    p, idx = _softmax_topk(rng, rows, k)
    hidden = None if hidden_dim is None else rng.standard_normal((rows, hidden_dim)).astype(np.float32)
    scores = None if step == 0 else rng.random((b, k)).astype(np.float32)
    return p, idx, hidden, scores


def _check_select(step, b, k, hidden_dim, seed):
    rng = np.random.default_rng(seed)
    p, idx, hidden, scores = _select_inputs(rng, step, b, k, hidden_dim)
    got = select_top_k_tokens(step, p, idx, hidden, scores, topk=k)
    ids, hid, sc, info = oracle.select_top_k_tokens(step, p, idx, hidden, scores, k)
    assert isinstance(got, SelectTopKOutput) and isinstance(got.tree_info, TreeInfo)
    np.testing.assert_array_equal(got.input_ids, ids)
    assert got.input_ids.dtype == jnp.int32 and got.input_ids.shape == (b * k,)
    if hidden is None:
        assert got.hidden_states is None
    else:
        np.testing.assert_array_equal(got.hidden_states, hid)
    np.testing.assert_array_equal(got.scores, sc)
    assert got.scores.dtype == jnp.float32
    np.testing.assert_array_equal(got.tree_info.scores, info[0])  # one fp32 multiply: bit-exact
    np.testing.assert_array_equal(got.tree_info.tokens, info[1])
    np.testing.assert_array_equal(got.tree_info.parents, info[2])
    assert got.tree_info.tokens.dtype == jnp.int32 and got.tree_info.parents.dtype == jnp.int32


# 4 topk x 3 steps x 64 rows: 768 requests (each row is an independent case) in 12 compiles.
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("step", [0, 1, 5])
def test_select_top_k_tokens_sweep(step, k):
    _check_select(step, 64, k, 3, seed=17 * step + k)


@settings(max_examples=20, deadline=None)
@given(
    step=st.integers(0, 7),
    k=st.integers(1, 8),
    b=st.sampled_from([1, 64]),
    hidden_dim=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_select_top_k_tokens_matches_oracle(step, k, b, hidden_dim, seed):
    _check_select(step, b, k, hidden_dim, seed)


def test_select_top_k_tokens_k1_first_max_and_empty_hidden():
    # K == 1 uses max semantics: the first maximal index wins on exact ties
    scores = np.array([[0.5]], np.float32)
    p = np.array([[0.25]], np.float32)
    out = select_top_k_tokens(1, p, np.array([[7]]), None, scores, topk=1)
    np.testing.assert_array_equal(out.input_ids, [7])
    k = 2
    scores = np.array([[0.5, 0.5]], np.float32)
    p = np.array([[0.5, 0.25], [0.5, 0.25]], np.float32)  # tie between beam 0 child 0 and beam 1 child 0
    out = select_top_k_tokens(2, p, np.array([[1, 2], [3, 4]]), np.zeros((0, 4), np.float32), scores, topk=k)
    np.testing.assert_array_equal(out.tree_info.parents, [[0 + 6, 2 + 6]])  # lax.top_k: lower index first
    assert out.hidden_states.shape == (0, 4)  # a 0-row hidden skips the gather (as upstream)


def test_select_top_k_tokens_jit():
    rng = np.random.default_rng(3)
    p, idx, hidden, scores = _select_inputs(rng, 2, 4, 3, 5)
    f = jax.jit(select_top_k_tokens, static_argnames=("step", "topk"))
    got = f(step=2, topk_p=jnp.asarray(p), topk_index=jnp.asarray(idx, jnp.int32), hidden_states=jnp.asarray(hidden),
            scores=jnp.asarray(scores), topk=3)
    want = oracle.select_top_k_tokens(2, p, idx, hidden, scores, 3)
    np.testing.assert_array_equal(got.input_ids, want[0])
    np.testing.assert_array_equal(got.hidden_states, want[1])


# ---------------------------------------------------------------------------------------------
# organize_draft_results
# ---------------------------------------------------------------------------------------------


def _check_organize(cfg, b, seed):
    s, k, n = cfg.num_steps, cfg.topk, cfg.num_draft_tokens
    _, lists, want = oracle.draft_pipeline(np.random.default_rng(seed), b, s, k, n)
    got = organize_draft_results(*lists, num_draft_tokens=n)
    assert isinstance(got, DraftResults)
    for g, w, name in zip(got, want, DraftResults._fields):
        np.testing.assert_array_equal(g, w, err_msg=name)
        assert g.dtype == jnp.int32, name
    assert got.parent_list.shape == (b, cfg.parent_list_width)


SWEEP_CONFIGS = [(5, 4, 8), (3, 1, 4), (1, 4, 4), (8, 8, 64), (4, 2, 15), (2, 3, 13), (6, 3, 1)]


@pytest.mark.parametrize("s, k, n", SWEEP_CONFIGS)
def test_organize_draft_results_sweep(s, k, n):
    _check_organize(SpecConfig(num_steps=s, topk=k, num_draft_tokens=n), 64, seed=s * 100 + k * 10 + n)


@st.composite
def spec_configs(draw):
    s, k = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    n = s + 1 if k == 1 else draw(st.integers(1, k + (s - 1) * k * k + 1))  # every valid N
    return SpecConfig(num_steps=s, topk=k, num_draft_tokens=n)


@settings(max_examples=10, deadline=None)
@given(cfg=spec_configs(), b=st.sampled_from([1, 32]), seed=st.integers(0, 2**32 - 1))
def test_organize_draft_results_matches_oracle(cfg, b, seed):
    _check_organize(cfg, b, seed)


def test_organize_jit_and_pipeline_all_modes():
    """jax select (S steps) -> organize -> build_tree, all under one jit, vs the NumPy pipeline."""
    cfg = SpecConfig(num_steps=4, topk=3, num_draft_tokens=10)
    s, k, n = cfg.num_steps, cfg.topk, cfg.num_draft_tokens
    b = 16
    rng = np.random.default_rng(11)
    inputs, lists, want = oracle.draft_pipeline(rng, b, s, k, n)
    seq = rng.integers(0, 30, b).astype(np.int32)
    bonus = rng.integers(0, 1000, b).astype(np.int32)

    @jax.jit
    def pipeline(inputs, bonus, seq):
        scores, sl, tl, pl = None, [], [], []
        for i, (p, idx) in enumerate(inputs):
            out = select_top_k_tokens(i, p, idx, None, scores, topk=k)
            scores = out.scores
            sl.append(out.tree_info.scores)
            tl.append(out.tree_info.tokens)
            pl.append(out.tree_info.parents)
        org = organize_draft_results(sl, tl, pl, num_draft_tokens=n)
        trees = [
            build_tree(bonus, *org, seq, config=cfg, mask_mode=m, max_seq_lens_sum=30 * b) for m in TreeMaskMode
        ]
        return org, trees

    jin = [(jnp.asarray(p), jnp.asarray(i, jnp.int32)) for p, i in inputs]
    org, trees = pipeline(jin, jnp.asarray(bonus), jnp.asarray(seq))
    for g, w in zip(org, want):
        np.testing.assert_array_equal(g, w)
    for mode, tree in zip(TreeMaskMode, trees):
        ref = oracle.build_tree(bonus, *want, seq, k, s, n, int(mode), max_seq_lens_sum=30 * b)
        for g, w in zip(tree, ref):
            np.testing.assert_array_equal(np.asarray(g), w)


# ---------------------------------------------------------------------------------------------
# MTP / chain organisation
# ---------------------------------------------------------------------------------------------


def _mtp_oracle(topk_p, topk_index, s, k, n):
    """``organize_mtp_draft_results`` (MultiLayerEagleDraftWorker._draft_forward_organize) on the NumPy oracle."""
    _, _, _, info = oracle.select_top_k_tokens(0, topk_p, topk_index, None, None, k)
    if s == 1:
        lists = [info[0]], [info[1]], [info[2]]
    else:
        b = topk_p.shape[0]
        lists = (
            [info[0][:, :, i : i + 1] for i in range(s)],
            [info[1][:, i : i + 1] for i in range(s)],
            [info[2] if i == 0 else np.full((b, 1), i, np.int64) for i in range(s)],
        )
    return oracle.organize(*lists, n)


@pytest.mark.parametrize("s, k, n", [(1, 1, 2), (3, 1, 4), (8, 1, 9), (1, 4, 3), (1, 8, 9)])
def test_organize_mtp_draft_results(s, k, n):
    cfg = SpecConfig(num_steps=s, topk=k, num_draft_tokens=n)
    rng = np.random.default_rng(s * 10 + k)
    b = 32
    p = rng.random((b, s * k)).astype(np.float32)
    idx = rng.integers(0, 1 << 20, (b, s * k))
    got = organize_mtp_draft_results(p, idx, config=cfg)
    want = _mtp_oracle(p, idx, s, k, n)
    for g, w, name in zip(got, want, DraftResults._fields):
        np.testing.assert_array_equal(g, w, err_msg=name)
        assert g.dtype == jnp.int32
    if k == 1:  # chain constants of SGLang 0.5.23 (base_spec_worker.py)
        np.testing.assert_array_equal(got.parent_list[0], np.arange(-1, s - 1) if s > 1 else [])
        np.testing.assert_array_equal(got.top_scores_index[0], np.arange(s))
        np.testing.assert_array_equal(got.draft_tokens, idx)


@pytest.mark.parametrize("s", [1, 2, 5])
def test_chain_draft_results_equals_generic(s):
    cfg = SpecConfig(num_steps=s, topk=1, num_draft_tokens=s + 1)
    b = 8
    inputs, lists, want = oracle.draft_pipeline(np.random.default_rng(s), b, s, 1, s + 1)
    draft_tokens = np.concatenate(lists[1], axis=1)
    got = chain_draft_results(draft_tokens, config=cfg)
    generic = organize_draft_results(*lists, num_draft_tokens=s + 1)
    for g, r, w in zip(got, generic, want):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(r, w)
    f = jax.jit(chain_draft_results, static_argnames=("config",))
    np.testing.assert_array_equal(f(jnp.asarray(draft_tokens, jnp.int32), config=cfg).parent_list, want[0])


# ---------------------------------------------------------------------------------------------
# ValueErrors
# ---------------------------------------------------------------------------------------------


def test_select_top_k_tokens_value_errors():
    p0 = np.full((2, 3), 0.5, np.float32)
    i0 = np.zeros((2, 3), np.int64)
    p1 = np.full((6, 3), 0.5, np.float32)
    i1 = np.zeros((6, 3), np.int64)
    sc = np.ones((2, 3), np.float32)
    cases = [
        (lambda: select_top_k_tokens(-1, p0, i0, None, None, topk=3), "step: expected >= 0"),
        (lambda: select_top_k_tokens(0.0, p0, i0, None, None, topk=3), "step: expected a Python int"),
        (lambda: select_top_k_tokens(0, p0, i0, None, None, topk=0), "topk: expected >= 1"),
        (lambda: select_top_k_tokens(0, p0.astype(np.float64), i0, None, None, topk=3), "topk_p: expected dtype float32"),
        (lambda: select_top_k_tokens(0, p0, i0, None, None, topk=2), r"topk_p: expected shape \(\*, 2\)"),
        (lambda: select_top_k_tokens(0, p0, i0[:1], None, None, topk=3), r"topk_index: expected shape \(2, 3\)"),
        (lambda: select_top_k_tokens(0, p0, p0, None, None, topk=3), "topk_index: expected an integer dtype"),
        (lambda: select_top_k_tokens(0, p0, i0 + 2**33, None, None, topk=3), "topk_index: int64 value .* does not fit"),
        (lambda: select_top_k_tokens(0, p0, i0, np.zeros((3, 4), np.float32), None, topk=3),
         r"hidden_states: expected shape \(2, \*\)"),
        (lambda: select_top_k_tokens(1, p1, i1, None, None, topk=3), "scores: expected a float32"),
        (lambda: select_top_k_tokens(1, p1, i1, None, sc.astype(np.float16), topk=3), "scores: expected dtype float32"),
        (lambda: select_top_k_tokens(1, p0, i1, None, sc, topk=3), r"topk_p: expected shape \(6, 3\)"),
        (lambda: select_top_k_tokens(1, p1, i0, None, sc, topk=3), r"topk_index: expected shape \(6, 3\)"),
        (lambda: select_top_k_tokens(1, p1, i1, np.zeros((2, 4), np.float32), sc, topk=3),
         r"hidden_states: expected shape \(6, \*\)"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()


def test_organize_value_errors():
    s0 = np.ones((2, 1, 3), np.float32)
    t0 = np.zeros((2, 3), np.int64)
    p0 = np.zeros((2, 4), np.int64)
    s1 = np.ones((2, 3, 3), np.float32)
    t1 = np.zeros((2, 9), np.int64)
    p1 = np.zeros((2, 3), np.int64)
    cases = [
        (lambda: organize_draft_results([s0, s1], [t0], [p0, p1], num_draft_tokens=4), "expected equal non-zero lengths"),
        (lambda: organize_draft_results([], [], [], num_draft_tokens=4), "expected equal non-zero lengths"),
        (lambda: organize_draft_results([s0], [t1], [p0], num_draft_tokens=4), r"token_list\[0\]: expected shape \(2, 3\)"),
        (lambda: organize_draft_results([s0, s1[:1]], [t0, t1], [p0, p1], num_draft_tokens=4),
         r"score_list\[1\]: expected leading dimension B=2"),
        (lambda: organize_draft_results([s0.astype(np.float64)], [t0], [p0], num_draft_tokens=2),
         r"score_list\[0\]: expected dtype float32"),
        (lambda: organize_draft_results([s0], [t0.astype(np.float32)], [p0], num_draft_tokens=2),
         r"token_list\[0\]: expected an integer dtype"),
        (lambda: organize_draft_results([s0], [t0], [p0.astype(np.float32)], num_draft_tokens=2),
         r"parents_list\[0\]: expected an integer dtype"),
        (lambda: organize_draft_results([s0], [t0], [p0], num_draft_tokens=5), "N - 1 = 4 exceeds the 3 recorded"),
        (lambda: organize_draft_results([s0], [t0], [p0], num_draft_tokens=0), "num_draft_tokens: expected >= 1"),
        (lambda: organize_draft_results([s0], [t0 - 2**40], [p0], num_draft_tokens=2), r"token_list\[0\]: int64 value"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()


def test_mtp_and_chain_value_errors():
    cfg_k2 = SpecConfig(num_steps=3, topk=2, num_draft_tokens=5)
    p = np.ones((2, 6), np.float32)
    i = np.zeros((2, 6), np.int64)
    with pytest.raises(ValueError, match="organize_mtp_draft_results supports topk == 1"):
        organize_mtp_draft_results(p, i, config=cfg_k2)
    cfg = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
    with pytest.raises(ValueError, match=r"topk_p: expected shape \(\*, 3\)"):
        organize_mtp_draft_results(p, i, config=cfg)
    with pytest.raises(ValueError, match=r"topk_index: expected shape \(2, 3\)"):
        organize_mtp_draft_results(p[:, :3], i, config=cfg)
    with pytest.raises(ValueError, match="config: expected a jaxspec.config.SpecConfig"):
        organize_mtp_draft_results(p, i, config=(3, 1, 4))
    with pytest.raises(ValueError, match="config.topk: chain_draft_results needs topk == 1"):
        chain_draft_results(i, config=cfg_k2)
    with pytest.raises(ValueError, match=r"draft_tokens: expected shape \(\*, 3\)"):
        chain_draft_results(i, config=cfg)
    with pytest.raises(ValueError, match="SpecConfig: topk == 1 requires num_draft_tokens == num_steps"):
        SpecConfig(num_steps=3, topk=1, num_draft_tokens=3)
