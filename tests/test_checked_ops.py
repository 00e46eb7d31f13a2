"""Checked mode and defined results for the ops layer (checks in the jit key, traced top-k/top-p flagged, rows
without probability mass)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxspec
from jaxspec import SpecConfig, build_chain_tree, build_tree, chain_draft_results, eagle_sample, make_coins
from jaxspec import top_k_renorm_prob, top_p_renorm_prob, tree_speculative_sampling_target_only
from jaxspec.testing import checked_call

CFG = SpecConfig(num_steps=2, topk=1, num_draft_tokens=3)
I32 = np.int32


def _tree_args(seq_lens):
    dr = chain_draft_results(np.array([[5, 6], [7, 8]], I32), config=CFG)
    return (jnp.array([1, 2], jnp.int32), dr.parent_list, dr.top_scores_index, dr.draft_tokens, seq_lens)


def test_build_tree_checks_are_in_the_jit_key_and_flag_bad_seq_lens():
    """Host values (NumPy, or a concrete jax array passed eagerly) are checked on the host in every mode; traced
    ones in checked mode only, and the switch is part of build_tree's jit key: a traced plain call, then a
    checked one (flagged), then a plain one again (the defined result, no check)."""
    bad = jnp.array([9, 9], jnp.int32)  # sum 18 > max_seq_lens_sum 10
    with pytest.raises(ValueError, match="exceeds max_seq_lens_sum=10"):
        build_tree(*_tree_args(bad), config=CFG, max_seq_lens_sum=10)

    def traced():  # a fresh caller's jit each time (its own cache does not know the switch)
        return jax.jit(lambda s: build_tree(*_tree_args(s), config=CFG, max_seq_lens_sum=10))

    traced()(bad)  # plain first (defined, documented result)
    err, _ = checked_call(traced(), bad)
    with pytest.raises(checkify.JaxRuntimeError, match="exceeds max_seq_lens_sum=10"):
        err.throw()
    traced()(bad)  # plain after checked
    err, _ = checked_call(traced(), jnp.array([-3, 2], jnp.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="seq_lens: expected non-negative"):
        err.throw()
    chain = jax.jit(lambda s: build_chain_tree(jnp.array([1, 2], jnp.int32), jnp.array([[5, 6], [7, 8]], jnp.int32),
                                               s, config=CFG))
    err, _ = checked_call(chain, jnp.array([-1, 0], jnp.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="seq_lens: expected non-negative"):
        err.throw()
    with pytest.raises(ValueError, match="seq_lens: expected non-negative values"):
        build_tree(*_tree_args(np.array([-3, 2], I32)), config=CFG, max_seq_lens_sum=10)


def test_traced_top_k_top_p_are_flagged_in_checked_mode():
    """Traced top_k / top_p (inside a caller's jit) are flagged by checked mode; host values are refused on the
    host."""
    probs = jnp.full((1, 4), 0.25, jnp.float32)
    err, _ = checked_call(jax.jit(top_k_renorm_prob), probs, jnp.array([0], jnp.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="top_k: expected values >= 1"):
        err.throw()
    with pytest.raises(ValueError, match="top_k: expected values >= 1"):
        top_k_renorm_prob(probs, jnp.array([0], jnp.int32))
    for p in (0.0, 1.5, float("nan")):
        err, _ = checked_call(jax.jit(top_p_renorm_prob), probs, jnp.array([p], jnp.float32))
        with pytest.raises(checkify.JaxRuntimeError, match=r"top_p: expected values in \(0, 1\]"):
            err.throw()
    err, _ = checked_call(jax.jit(top_p_renorm_prob), probs, jnp.array([0.5], jnp.float32))
    assert err.get() is None


def test_renorm_of_a_row_without_mass_is_zero_not_nan():
    probs = jnp.array([[0.0, 0.0, 0.0], [0.2, 0.5, 0.3]], jnp.float32)
    for out in (top_k_renorm_prob(probs, np.array([2, 2], I32)), top_p_renorm_prob(probs, np.array([0.5, 0.5], np.float32))):
        out = np.asarray(out)
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(out[0], 0.0)


def _chain(b=2):
    cfg = SpecConfig(num_steps=2, topk=1, num_draft_tokens=3)
    t = build_chain_tree(np.arange(b, dtype=I32), np.ones((b, 2), I32), np.full((b,), 4, I32), config=cfg)
    return cfg, t


def test_temperature_zero_samples_greedily():
    cfg, t = _chain()
    v = 7
    logits = jax.random.normal(jax.random.PRNGKey(0), (2 * 3, v), jnp.float32)
    logits = logits.at[:, 1].set(5.0)  # every node's argmax is token 1 == the drafted token: all accepted
    logits = logits.at[5, 3].set(9.0)
    coins, final = make_coins(jax.random.PRNGKey(1), 2, 3)
    args = (logits, t.draft_tokens, t.retrieve_index, t.retrieve_next_token, t.retrieve_next_sibling)
    greedy = eagle_sample(*args, config=cfg)
    sampled = eagle_sample(*args, config=cfg, greedy=False, temperatures=jnp.zeros((2,), jnp.float32),
                           uniform_samples=coins, uniform_samples_for_final_sampling=final)
    for a, b in zip(greedy, sampled):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(np.asarray(sampled.predict)[5]) == 3  # the bonus token is the argmax, not V - 1
    with pytest.raises(ValueError, match="temperatures: expected values >= 0"):
        eagle_sample(*args, config=cfg, greedy=False, temperatures=np.array([-1.0, 1.0], np.float32),
                     uniform_samples=coins, uniform_samples_for_final_sampling=final)
    err, _ = checked_call(jax.jit(lambda temps: eagle_sample(*args, config=cfg, greedy=False, temperatures=temps,
                                                             uniform_samples=coins,
                                                             uniform_samples_for_final_sampling=final)),
                          jnp.array([-1.0, 1.0], jnp.float32))
    with pytest.raises(checkify.JaxRuntimeError, match="temperatures: expected values >= 0"):
        err.throw()


def test_target_rows_without_mass_give_the_documented_sentinel_and_are_flagged():
    cfg, t = _chain(1)
    v = 5
    probs = jnp.full((1, 3, v), jnp.nan, jnp.float32)
    coins, final = make_coins(jax.random.PRNGKey(2), 1, 3)
    args = (t.draft_tokens.reshape(1, 3), t.retrieve_index, t.retrieve_next_token, t.retrieve_next_sibling, coins,
            final, probs)
    out = tree_speculative_sampling_target_only(*args, num_steps=2)
    assert int(np.asarray(out.num_correct_drafts)[0]) == 0
    assert int(np.asarray(out.predict)[0]) == v - 1
    err, _ = checked_call(tree_speculative_sampling_target_only, *args, num_steps=2)
    with pytest.raises(checkify.JaxRuntimeError, match="target_probs: expected finite, non-negative"):
        err.throw()
