"""Tests for jaxspec.ops.accept (eagle_sample, fill_bonus_tokens, make_coins); SGLang 0.5.23 semantics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import np_oracle_verify as oracle
from jaxspec.config import SpecConfig
from jaxspec.ops.accept import EagleSampleOutput, eagle_sample, fill_bonus_tokens, make_coins
from jaxspec.ops.verify import top_k_renorm_prob, top_p_renorm_prob, tree_speculative_sampling_target_only
from test_verify import (
    GOLDEN_ACCEPT_INDEX,
    GOLDEN_ACCEPT_TOKEN_NUM,
    assert_golden_predicts,
    golden_target_logits,
    golden_tree,
    greedy_target,
)

# (config, batch, vocab): SGLang's Llama default (5, 4, 8), the DeepSeek MTP chain (3, 1, 4), S=1.
CONFIGS = [(SpecConfig(5, 4, 8), 6, 48), (SpecConfig(3, 1, 4), 5, 32), (SpecConfig(1, 3, 4), 3, 16)]


def random_inputs(rng, cfg, batch, vocab, follow=0.75):
    cand, ri, nt, ns = oracle.random_tree(rng, batch, cfg.topk, cfg.num_steps, cfg.num_draft_tokens, vocab)
    tp = greedy_target(rng, (cand, ri, nt, ns), vocab, p_follow=follow)
    logits = rng.normal(size=(batch * cfg.num_draft_tokens, vocab)).astype(np.float32)
    logits[np.arange(logits.shape[0]), tp.reshape(-1)] = 6.0
    return cand, ri, nt, ns, logits


def test_eagle_sample_greedy_golden():
    # Source: SGLang test_eagle_utils.py::test_verify_tree_greedy tree + logits, through eagle_sample.
    cfg = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
    cand, ri, nt, ns = golden_tree()
    out = eagle_sample(golden_target_logits().reshape(12, 20), cand.reshape(-1), ri, nt, ns, config=cfg)
    assert isinstance(out, EagleSampleOutput)
    assert_golden_predicts(out.predict)
    assert np.asarray(out.accept_index).tolist() == GOLDEN_ACCEPT_INDEX
    assert np.asarray(out.accept_lens).tolist() == [x + 1 for x in GOLDEN_ACCEPT_TOKEN_NUM]
    np.testing.assert_array_equal(np.asarray(fill_bonus_tokens(out.predict, out.accept_index, out.accept_lens)), [18, 18])


@pytest.mark.parametrize("threshold_single,threshold_acc", [(1.0, 1.0), (0.0, 0.0)])
def test_eagle_sample_sampling_golden(threshold_single, threshold_acc):
    # Source: SGLang test/registered/kernels/ops/speculative/test_speculative_sampling.py (JIT
    # expectations, temperature 0.01): accept_index [[0,3,4,5],[6,10,11,-1]] for both threshold pairs.
    cfg = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
    cand, ri, nt, ns = golden_tree()
    coins, final = make_coins(jax.random.PRNGKey(0), 2, 6)
    out = eagle_sample(
        golden_target_logits().reshape(12, 20), cand, ri, nt, ns, config=cfg,
        temperatures=np.array([0.01, 0.01], np.float32), uniform_samples=coins,
        uniform_samples_for_final_sampling=final, threshold_single=threshold_single,
        threshold_acc=threshold_acc, greedy=False,
    )
    assert_golden_predicts(out.predict)
    assert np.asarray(out.accept_index).tolist() == GOLDEN_ACCEPT_INDEX
    assert np.asarray(out.accept_lens).tolist() == [4, 3]


@pytest.mark.parametrize("cfg,batch,vocab", CONFIGS)
def test_eagle_sample_greedy_matches_oracle(cfg, batch, vocab):
    rng = np.random.default_rng(cfg.num_draft_tokens * 7 + batch)
    for _ in range(4):  # several random cases per shape, one compile
        cand, ri, nt, ns, logits = random_inputs(rng, cfg, batch, vocab)
        logits[3] = 6.0  # an all-tie row: argmax is the first index
        out = eagle_sample(logits, cand.reshape(-1), ri, nt, ns, config=cfg)
        tp = np.argmax(logits, axis=-1).reshape(batch, -1)
        pred, acc, num = oracle.verify_greedy(cand, ri, nt, ns, tp, cfg.accept_width)
        np.testing.assert_array_equal(np.asarray(out.predict), pred)
        np.testing.assert_array_equal(np.asarray(out.accept_index), acc)
        np.testing.assert_array_equal(np.asarray(out.accept_lens), num + 1)
        assert all(x.dtype == jnp.int32 for x in out)


def test_eagle_sample_greedy_bf16_logits():
    cfg, batch, vocab = CONFIGS[0]
    rng = np.random.default_rng(5)
    cand, ri, nt, ns, logits = random_inputs(rng, cfg, batch, vocab)
    lb = jnp.asarray(logits).astype(jnp.bfloat16)
    out = eagle_sample(lb, cand, ri, nt, ns, config=cfg)
    tp = np.argmax(np.asarray(lb.astype(jnp.float32)), axis=-1).reshape(batch, -1)
    np.testing.assert_array_equal(np.asarray(out.accept_index), oracle.verify_greedy(cand, ri, nt, ns, tp, 6)[1])


@pytest.mark.parametrize("use_top_k,use_top_p", [(False, False), (True, True)])
def test_eagle_sample_sampling_composition(use_top_k, use_top_p):
    """Sampling path == softmax(logits/T) -> renorms -> tree_speculative_sampling_target_only (zero draft)."""
    cfg, batch, vocab = SpecConfig(2, 3, 6), 6, 48
    n = cfg.num_draft_tokens
    rng = np.random.default_rng(9)
    cand, ri, nt, ns, logits = random_inputs(rng, cfg, batch, vocab)
    temps = rng.uniform(0.3, 1.5, batch).astype(np.float32)
    top_ks = rng.integers(1, vocab, batch).astype(np.int32) if use_top_k else None
    top_ps = rng.uniform(0.3, 1.0, batch).astype(np.float32) if use_top_p else None
    coins, final = make_coins(jax.random.PRNGKey(3), batch, n)
    out = eagle_sample(
        logits, cand.reshape(-1), ri, nt, ns, config=cfg, temperatures=temps, top_ks=top_ks, top_ps=top_ps,
        uniform_samples=coins, uniform_samples_for_final_sampling=final, greedy=False,
    )
    probs = jax.nn.softmax(jnp.asarray(logits).reshape(batch, n, vocab) / temps[:, None, None], axis=-1)
    probs = probs.reshape(batch * n, vocab)
    if use_top_k:
        probs = top_k_renorm_prob(probs, np.repeat(top_ks, n))
        assert ((np.asarray(probs) > 0).sum(1) >= np.repeat(top_ks, n)).all()
    if use_top_p:
        probs = top_p_renorm_prob(probs, np.repeat(top_ps, n))
    ref = tree_speculative_sampling_target_only(
        cand, ri, nt, ns, coins, final, probs.reshape(batch, n, vocab), num_steps=cfg.num_steps
    )
    np.testing.assert_array_equal(np.asarray(out.predict), np.asarray(ref.predict))
    np.testing.assert_array_equal(np.asarray(out.accept_index), np.asarray(ref.accept_index))
    np.testing.assert_array_equal(np.asarray(out.accept_lens), np.asarray(ref.num_correct_drafts) + 1)
    # and the NumPy loop oracle agrees on these (non-dyadic) probabilities for this seed
    pred, acc, num = oracle.sampling_target_only(
        cand, ri, nt, ns, np.asarray(coins), np.asarray(final), np.asarray(probs).reshape(batch, n, vocab),
        None, cfg.accept_width,
    )
    np.testing.assert_array_equal(np.asarray(out.accept_index), acc)
    np.testing.assert_array_equal(np.asarray(out.predict), pred)


def test_eagle_sample_top_k_one_is_greedy():
    # top_k = 1 makes every row one-hot: sampling then accepts exactly the greedy path.
    cfg, batch, vocab = SpecConfig(2, 3, 6), 6, 48
    rng = np.random.default_rng(21)
    cand, ri, nt, ns, logits = random_inputs(rng, cfg, batch, vocab, follow=0.9)
    coins, final = make_coins(jax.random.PRNGKey(1), batch, cfg.num_draft_tokens)
    greedy = eagle_sample(logits, cand, ri, nt, ns, config=cfg)
    sampled = eagle_sample(
        logits, cand, ri, nt, ns, config=cfg, temperatures=np.ones(batch, np.float32),
        top_ks=np.ones(batch, np.int32), uniform_samples=coins, uniform_samples_for_final_sampling=final,
        greedy=False,
    )
    for a, b in zip(greedy, sampled):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fill_bonus_tokens_matches_oracle():
    rng = np.random.default_rng(2)
    b, a, n = 33, 6, 8  # K > 1: accept width S + 1 = 6 != N = 8 (the 0.5.23 stride)
    predict = rng.integers(0, 1000, b * n).astype(np.int32)
    lens = rng.integers(1, a + 1, b).astype(np.int32)
    acc = np.full((b, a), -1, np.int32)
    for i in range(b):
        acc[i, : lens[i]] = i * n + np.sort(rng.choice(n, lens[i], replace=False))
    got = fill_bonus_tokens(predict, acc, lens)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), oracle.fill_bonus(predict, acc, lens))
    # the old v2 stride (N instead of S + 1) would read other cells
    old = predict.reshape(-1)[np.clip(np.arange(b) * n + lens - 1, 0, b * n - 1)]
    assert not np.array_equal(old, np.asarray(got))


def test_make_coins():
    coins, final = make_coins(jax.random.PRNGKey(0), 4, 7)
    assert coins.shape == (4, 7) and final.shape == (4,)
    assert coins.dtype == jnp.float32 and final.dtype == jnp.float32
    c = np.asarray(coins)
    assert (c >= 0).all() and (c < 1).all()
    c2, _ = jax.jit(make_coins, static_argnums=(1, 2))(jax.random.PRNGKey(0), 4, 7)
    np.testing.assert_array_equal(c, np.asarray(c2))


def test_empty_batch():
    cfg = SpecConfig(3, 1, 4)
    z = np.zeros((0, 4), np.int32)
    out = eagle_sample(np.zeros((0, 16), np.float32), np.zeros((0,), np.int32), z, z, z, config=cfg)
    assert out.predict.shape == (0,) and out.accept_lens.shape == (0,) and out.accept_index.shape == (0, 4)
    assert fill_bonus_tokens(out.predict, out.accept_index, out.accept_lens).shape == (0,)


def test_jit_no_host_transfers():
    cfg, batch, vocab = CONFIGS[1]
    rng = np.random.default_rng(4)
    cand, ri, nt, ns, logits = (jnp.asarray(x) for x in random_inputs(rng, cfg, batch, vocab))
    cand, ri, nt, ns = (x.astype(jnp.int32) for x in (cand, ri, nt, ns))
    temps = jnp.full((batch,), 0.7, jnp.float32)
    key = jax.random.PRNGKey(0)

    @jax.jit
    def step(logits, cand, ri, nt, ns, temps, key):
        g = eagle_sample(logits, cand.reshape(-1), ri, nt, ns, config=cfg)
        coins, final = make_coins(key, batch, cfg.num_draft_tokens)
        s = eagle_sample(
            logits, cand.reshape(-1), ri, nt, ns, config=cfg, temperatures=temps, uniform_samples=coins,
            uniform_samples_for_final_sampling=final, greedy=False,
        )
        return g, s, fill_bonus_tokens(g.predict, g.accept_index, g.accept_lens), fill_bonus_tokens(s.predict, s.accept_index, s.accept_lens)

    args = (logits, cand, ri, nt, ns, temps, key)
    expected = jax.device_get(step(*args))
    with jax.transfer_guard("disallow"):
        got = jax.block_until_ready(step(*args))
        eager = jax.block_until_ready(eagle_sample(logits, cand, ri, nt, ns, config=cfg))
        bonus = jax.block_until_ready(fill_bonus_tokens(eager.predict, eager.accept_index, eager.accept_lens))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(jax.device_get(got))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(bonus), expected[2])


def _args(**over):
    cfg = SpecConfig(3, 1, 4)
    z = np.zeros((2, 4), np.int32)
    kw = dict(
        logits=np.zeros((8, 16), np.float32), draft_tokens=np.zeros((8,), np.int32), retrieve_index=z,
        retrieve_next_token=z, retrieve_next_sibling=z, config=cfg,
    )
    kw.update(over)
    return kw


SAMPLING = dict(
    greedy=False, temperatures=np.ones(2, np.float32), uniform_samples=np.zeros((2, 4), np.float32),
    uniform_samples_for_final_sampling=np.zeros(2, np.float32),
)


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(logits=np.zeros((8, 16), np.int32)), "logits: expected dtype float32 or bfloat16 or float16"),
        (dict(logits=np.zeros((6, 16), np.float32)), r"logits: expected shape \(8, \*\)"),
        (dict(draft_tokens=np.zeros((7,), np.int32)), r"draft_tokens: expected shape \(8,\)"),
        (dict(draft_tokens=np.zeros((8,), np.float32)), "draft_tokens: expected an integer dtype"),
        (dict(retrieve_index=np.zeros((2, 5), np.int32)), r"retrieve_index: expected shape \(\*, 4\)"),
        (dict(retrieve_next_token=np.zeros((2, 4), np.float32)), "retrieve_next_token: expected an integer"),
        (dict(retrieve_next_sibling=np.zeros((3, 4), np.int32)), "retrieve_next_sibling: expected shape"),
        (dict(config=(3, 1, 4)), "config: expected a SpecConfig"),
        (dict(greedy=1), "greedy: expected a Python bool"),
        (dict(SAMPLING, temperatures=None), "temperatures: required"),
        (dict(SAMPLING, temperatures=np.ones(2, np.float64)), "temperatures: expected dtype float32"),
        (dict(SAMPLING, temperatures=np.ones(3, np.float32)), "temperatures: expected shape"),
        (dict(SAMPLING, top_ks=np.array([1, 0], np.int32)), "top_ks: expected values >= 1"),
        (dict(SAMPLING, top_ks=np.array([1.0, 2.0], np.float32)), "top_ks: expected an integer"),
        (dict(SAMPLING, top_ps=np.array([0.5, 1.5], np.float32)), r"top_ps: expected values in \(0, 1\]"),
        (dict(SAMPLING, uniform_samples=None), "uniform_samples.*required"),
        (dict(SAMPLING, uniform_samples=np.zeros((2, 4), np.float64)), "uniform_samples: expected dtype float32"),
        (dict(SAMPLING, uniform_samples_for_final_sampling=np.zeros((2, 1), np.float32)), "final_sampling: exp"),
        (dict(SAMPLING, threshold_acc=2.0), "threshold_acc: expected a value in"),
    ],
)
def test_eagle_sample_value_errors(over, match):
    with pytest.raises(ValueError, match=match):
        eagle_sample(**_args(**over))


def test_int64_inputs():
    cfg = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
    cand, ri, nt, ns = golden_tree(np.int64)
    out = eagle_sample(golden_target_logits().reshape(12, 20), cand, ri, nt, ns, config=cfg)
    assert np.asarray(out.accept_index).tolist() == GOLDEN_ACCEPT_INDEX
    bad = ri.copy()
    bad[1, 0] = -(2**35)
    with pytest.raises(ValueError, match="retrieve_index.*does not fit in int32"):
        eagle_sample(golden_target_logits().reshape(12, 20), cand, bad, nt, ns, config=cfg)


def test_fill_bonus_value_errors():
    with pytest.raises(ValueError, match="accept_lens: expected shape"):
        fill_bonus_tokens(np.zeros(8, np.int32), np.zeros((2, 4), np.int32), np.ones(3, np.int32))
    with pytest.raises(ValueError, match="predict: expected an integer"):
        fill_bonus_tokens(np.zeros(8, np.float32), np.zeros((2, 4), np.int32), np.ones(2, np.int32))
    with pytest.raises(ValueError, match="accept_index: expected shape"):
        fill_bonus_tokens(np.zeros(8, np.int32), np.zeros((8,), np.int32), np.ones(2, np.int32))


def test_temperatures_checked_for_concrete_device_arrays():
    """Negative temperatures given as a concrete jax array (an eager call) are refused as NumPy ones are."""
    with pytest.raises(ValueError, match="temperatures: expected values >= 0"):
        eagle_sample(**_args(**dict(SAMPLING, temperatures=jnp.array([0.5, -1.0], jnp.float32))))
