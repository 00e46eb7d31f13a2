"""Sampling in the compiled loop: executable choice, greedy rows, seeds, validation, no recompiles, no host sync.

Greedy stays bit-identical: the sampling-capable executable with every temperature 0 (forced with
``all_greedy=False``) and temperature-0 rows inside a sampling batch produce exactly the greedy tokens
(chain, tree, plain, and the ``draft_probs`` chain). Coins depend on the request's seed and own round
counter only: a request alone, or at another row among other requests, draws the same tokens. The
distribution itself is tested in ``test_sampling_distribution.py``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.corpus import make_prompts
from jaxspec.engine import Engine
from jaxspec.models import MockVocab, MTPDrafter, load_pair

W = 64
MAX_NEW = 16
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
SAMPLING = dict(temperature=[0.8, 1.0, 0.6, 1.2], top_k=[-1, 8, None, 3], top_p=[0.9, 1.0, 0.8, 1.0], seed=[11, 12, 13, 14])


@pytest.fixture(scope="module")
def model():
    return load_pair()


@pytest.fixture(scope="module")
def prompts():
    vocab = MockVocab()
    return [vocab.encode(t) for t in make_prompts(4, seed=3, min_len=3, max_len=15)]


def _engine(model, spec, **kw):
    drafter = None if spec is None else MTPDrafter(model, sample_drafts=kw.get("verify") == "draft_probs")
    return Engine(model, drafter, spec=spec, max_context=W, **kw)


ENGINES = {
    "chain": (CHAIN, {}),
    "tree": (TREE, {}),
    "plain": (None, {}),
    "chain_draft_probs": (CHAIN, dict(verify="draft_probs")),
}


@pytest.fixture(scope="module")
def greedy(model, prompts):
    return _engine(model, CHAIN).generate(prompts, MAX_NEW).tokens


def _same(a, b, rows=None):
    for i in range(len(a)) if rows is None else rows:
        np.testing.assert_array_equal(a[i], b[i], err_msg=f"request {i}")


@pytest.mark.parametrize("name", list(ENGINES))
def test_sampling_executable_at_temperature_zero_is_greedy(model, prompts, greedy, name):
    spec, kw = ENGINES[name]
    eng = _engine(model, spec, **kw)
    _same(eng.generate(prompts, MAX_NEW).tokens, greedy)  # the greedy executable
    state, p, lens = eng.prepare(prompts, MAX_NEW, top_k=3, top_p=0.5, seed=[5, 6, 7, 8])
    assert state.all_greedy
    forced = eng.run(dataclasses.replace(state, all_greedy=False), p, lens)  # sampling executable, T = 0
    _same(Engine.result(forced, 4).tokens, greedy)
    # temperature-0 rows inside a sampling batch stay greedy; the others sample
    res = eng.generate(prompts, MAX_NEW, temperature=[0.0, 1.0, 0.0, 0.9], seed=[1, 2, 3, 4])
    _same(res.tokens, greedy, rows=[0, 2])
    assert 1.0 <= res.mean_accept_length <= (1 if spec is None else spec.num_steps + 1)


@pytest.mark.parametrize("name", ["chain", "tree", "chain_draft_probs"])
def test_seed_decides_tokens_not_batch(model, prompts, name):
    spec, kw = ENGINES[name]
    eng = _engine(model, spec, **kw)
    a = eng.generate(prompts, MAX_NEW, **SAMPLING).tokens
    # request 2 again, at row 0, among different requests with other seeds and parameters
    order = [2, 3, 0, 1]
    b = eng.generate([prompts[i] for i in order], MAX_NEW, temperature=[0.6, 0.3, 1.5, 0.0],
                     top_k=[None, 5, -1, -1], top_p=[0.8, 1.0, 0.7, 1.0], seed=[13, 99, 98, 97]).tokens
    np.testing.assert_array_equal(a[2], b[0])
    again = eng.generate(prompts, MAX_NEW, **SAMPLING).tokens
    _same(a, again)
    other = eng.generate(prompts, MAX_NEW, **{**SAMPLING, "seed": [21, 22, 23, 24]}).tokens
    assert any(not np.array_equal(x, y) for x, y in zip(a, other))


def test_request_alone_equals_request_in_batch(model, prompts):
    eng = _engine(model, CHAIN)
    full = eng.generate(prompts, MAX_NEW, **SAMPLING).tokens
    alone = eng.generate([prompts[1]], MAX_NEW, temperature=1.0, top_k=8, top_p=1.0, seed=12).tokens
    np.testing.assert_array_equal(full[1], alone[0])


def test_changing_parameters_never_recompiles(model, prompts):
    eng = _engine(model, CHAIN)
    fn = eng._entry_points(False).decode
    eng.generate(prompts, MAX_NEW, **SAMPLING)
    eng.generate(prompts, MAX_NEW)
    size = fn._cache_size()
    for t, k, p, s in [(0.3, 2, 0.5, 1), (2.0, -1, 1.0, 123456), ([0.0, 0.5, 1.0, 1.5], [1, 2, 64, -1], 0.95, [1, 2, 3, 4])]:
        eng.generate(prompts, MAX_NEW, temperature=t, top_k=k, top_p=p, seed=s)
    eng.generate(prompts[:3], [4, 8, 12], temperature=0.9, seed=3)  # same batch / output bucket
    assert fn._cache_size() == size


def test_no_host_sync_inside_sampling_loop(model, prompts):
    eng = _engine(model, CHAIN)
    eng.run(*eng.prepare(prompts, MAX_NEW, **SAMPLING))  # warm
    args = jax.block_until_ready(eng.prepare(prompts, MAX_NEW, **SAMPLING))
    with jax.transfer_guard("disallow"):
        state = jax.block_until_ready(eng.run(*args))
    assert not state.all_greedy
    assert int(jnp.min(state.num_generated)) == MAX_NEW


def test_host_driven_sampling_matches_loop(model, prompts):
    eng = _engine(model, CHAIN)
    _same(eng.generate(prompts, MAX_NEW, **SAMPLING).tokens, eng.generate_host_driven(prompts, MAX_NEW, **SAMPLING).tokens)


def test_sampling_parameter_errors(model, prompts):
    eng = _engine(model, CHAIN)
    bad = [
        (dict(temperature=[0.5, -0.1, 1.0, 1.0]), r"temperature\[1\] \(request 1\)"),
        (dict(temperature=float("nan")), r"temperature\[0\]"),
        (dict(temperature=float("inf")), r"temperature\[0\]"),
        (dict(temperature=[1.0, 1.0]), r"temperature: expected a scalar or one value per request \(4\)"),
        (dict(top_k=[1, 2, 0, 3]), r"top_k\[2\] \(request 2\)"),
        (dict(top_k=65), r"top_k\[0\].*\[1, 64\]"),
        (dict(top_k=2.5), r"top_k\[0\]"),
        (dict(top_p=[1.0, 1.0, 1.0, 0.0]), r"top_p\[3\] \(request 3\)"),
        (dict(top_p=1.5), r"top_p\[0\]"),
        (dict(seed=-1), r"seed\[0\]"),
        (dict(seed=2**31), r"seed\[0\]"),
        (dict(seed=[1, 2, 3.0, 4]), r"seed\[2\]"),
    ]
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            eng.prepare(prompts, MAX_NEW, **kw)


def test_verify_option_errors(model):
    with pytest.raises(ValueError, match="verify: expected"):
        _engine(model, CHAIN, verify="greedy")
    with pytest.raises(ValueError, match=r"chains \(spec.topk == 1\) only"):
        Engine(model, MTPDrafter(model), spec=TREE, max_context=W, verify="draft_probs")
    with pytest.raises(ValueError, match="sample_drafts=True"):
        Engine(model, MTPDrafter(model), spec=CHAIN, max_context=W, verify="draft_probs")
    with pytest.raises(ValueError, match="target_only"):
        _engine(model, CHAIN, verify="draft_probs", threshold_acc=0.5)
    with pytest.raises(ValueError, match="threshold_single"):
        _engine(model, CHAIN, threshold_single=1.5)
    with pytest.raises(ValueError, match="chains only"):
        Engine(model, MTPDrafter(model, sample_drafts=True), spec=TREE, max_context=W).prepare([[1, 2]], 4)
