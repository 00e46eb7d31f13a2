"""Sampling at every positive temperature: tiny temperatures give the tempered distribution (one-hot at the
argmax for logits a float32 can tell apart), never NaN and never the ``V - 1`` sentinel; ordinary
temperatures still give ``softmax(logits / T)``; ``generate`` at temperatures 1e-37 .. 1e-6 returns the greedy
tokens in every engine mode (target-only chain and tree, plain decoding, draft-probs chain)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.corpus import make_prompts
from jaxspec.engine import Engine
from jaxspec.models import MockVocab, MTPDrafter, load_pair
from jaxspec.ops.accept import sample_from_probs, sampling_probs
from jaxspec.ops.temperature import tempered_probs

TINY = [1e-37, 1e-20, 1e-10, 1e-9, 1e-6, 1e-45]  # 1e-45: a subnormal float32 (1 / T overflows)


def _logits(b=6, m=3, v=64, scale=3.0, seed=0):
    return np.random.default_rng(seed).normal(size=(b, m, v)).astype(np.float32) * np.float32(scale)


@pytest.mark.parametrize("scale", [0.01, 3.0, 300.0])
def test_tiny_temperatures_are_one_hot_at_the_argmax(scale):
    logits = _logits(scale=scale)
    want = np.eye(64, dtype=np.float32)[logits.argmax(-1)]
    t = jnp.asarray(TINY, jnp.float32)
    for kw in ({}, dict(top_ks=jnp.full((6,), 64, jnp.int32), top_ps=jnp.full((6,), 1.0, jnp.float32)),
               dict(top_ks=jnp.full((6,), 5, jnp.int32), top_ps=jnp.full((6,), 0.5, jnp.float32))):
        probs = np.asarray(sampling_probs(jnp.asarray(logits), t, **kw))
        assert np.isfinite(probs).all(), kw
        np.testing.assert_array_equal(probs, want, err_msg=str(kw))
    coins = jnp.asarray(np.random.default_rng(1).uniform(size=18) * 0.999, jnp.float32)
    tokens = np.asarray(sample_from_probs(jnp.asarray(want.reshape(18, 64)), coins))
    np.testing.assert_array_equal(tokens, logits.argmax(-1).reshape(18))


def test_bf16_logits_at_tiny_temperature():
    logits = jnp.asarray(_logits(), jnp.bfloat16)
    probs = np.asarray(sampling_probs(logits, jnp.asarray(TINY, jnp.float32)))
    assert np.isfinite(probs).all()
    np.testing.assert_array_equal(probs.argmax(-1), np.asarray(jnp.argmax(logits, -1)))
    np.testing.assert_array_equal(probs.max(-1), 1.0)


def test_ties_at_a_tiny_temperature_share_the_mass():
    logits = np.zeros((1, 1, 8), np.float32)
    logits[0, 0, [2, 5]] = 4.0
    probs = np.asarray(sampling_probs(jnp.asarray(logits), jnp.asarray([1e-30], jnp.float32)))[0, 0]
    np.testing.assert_array_equal(probs, np.where(np.isin(np.arange(8), [2, 5]), 0.5, 0.0).astype(np.float32))


@pytest.mark.parametrize("t", [1e-3, 0.05, 0.7, 1.0, 3.0, 1e4])
def test_ordinary_temperatures_are_softmax_of_logits_over_t(t):
    logits = _logits(b=2)
    x = logits.astype(np.float64) / t
    want = np.exp(x - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    probs = np.asarray(sampling_probs(jnp.asarray(logits), jnp.full((2,), t, jnp.float32)))
    np.testing.assert_allclose(probs, want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_masked_logits_and_limits():
    logits = np.array([[1.0, -np.inf, 3.0, 2.0]], np.float32)
    # an infinite temperature (traced; the engine refuses it on the host) is uniform over the finite logits
    probs = np.asarray(tempered_probs(jnp.asarray(logits), jnp.asarray([np.inf], jnp.float32)))
    np.testing.assert_array_equal(probs, np.float32([[1 / 3, 0.0, 1 / 3, 1 / 3]]))
    for t in (1e-38, 1e-12, 0.5):
        probs = np.asarray(tempered_probs(jnp.asarray(logits), jnp.asarray([t], jnp.float32)))
        assert np.isfinite(probs).all() and probs[0, 1] == 0.0 and probs[0].argmax() == 2
    # T <= 0 or NaN: greedy (first argmax)
    probs = np.asarray(tempered_probs(jnp.asarray(np.zeros((3, 4), np.float32)),
                                      jnp.asarray([0.0, -1.0, np.nan], jnp.float32)))
    np.testing.assert_array_equal(probs, np.eye(4, dtype=np.float32)[[0, 0, 0]])


W = 64
MAX_NEW = 12
ENGINES = {
    "chain": (SpecConfig(num_steps=3, topk=1, num_draft_tokens=4), {}),
    "tree": (SpecConfig(num_steps=3, topk=2, num_draft_tokens=6), {}),
    "plain": (None, {}),
    "chain_draft_probs": (SpecConfig(num_steps=3, topk=1, num_draft_tokens=4), dict(verify="draft_probs")),
}


@pytest.fixture(scope="module")
def model():
    return load_pair()


@pytest.fixture(scope="module")
def prompts():
    vocab = MockVocab()
    return [vocab.encode(t) for t in make_prompts(4, seed=5, min_len=3, max_len=12)]


@pytest.fixture(scope="module")
def greedy(model, prompts):
    return Engine(model, None, max_context=W).generate(prompts, MAX_NEW).tokens


@pytest.mark.parametrize("name", list(ENGINES))
def test_generate_at_tiny_temperatures_gives_the_greedy_tokens(model, prompts, greedy, name):
    spec, kw = ENGINES[name]
    drafter = None if spec is None else MTPDrafter(model, sample_drafts=kw.get("verify") == "draft_probs")
    eng = Engine(model, drafter, spec=spec, max_context=W, **kw)
    res = eng.generate(prompts, MAX_NEW, temperature=[1e-37, 1e-20, 1e-9, 1e-6], seed=[3, 4, 5, 6])
    for i in range(len(prompts)):
        np.testing.assert_array_equal(res.tokens[i], greedy[i], err_msg=f"request {i}")
        assert not (np.asarray(res.tokens[i]) == model.cfg.vocab_size - 1).all()
