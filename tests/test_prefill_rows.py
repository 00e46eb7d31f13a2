"""Prefill scores each prompt's last row only: ``TargetModel.forward(..., rows=)`` on jaxspec's decoder, and the
engine's prefill never builds the ``[B, P, V]`` logits (at a wide generation batch they are tens of GB), while a
target without ``rows`` (a third party's) still runs through the gathered full logits. CPU, f32."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import pipeline
from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.engine import step as step_mod
from jaxspec.models import MTPDrafter, load_pair

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def pair():
    model = load_pair()
    return model, MTPDrafter(model)


def test_forward_rows_equal_the_full_logits_rows(pair):
    target, _ = pair
    rng = np.random.default_rng()
    b, p = 3, 9
    tokens = jnp.asarray(rng.integers(0, target.vocab_size, (b, p)), jnp.int32)
    meta = pipeline.dense_metadata(b, p)
    full, hid_full, _ = target.forward(tokens, meta, None)
    rows = jnp.asarray(rng.integers(0, b * p, (5,)), jnp.int32)
    part, hid_part, _ = target.forward(tokens, meta, None, rows=rows)
    assert part.shape == (5, target.vocab_size)
    np.testing.assert_array_equal(np.asarray(hid_part), np.asarray(hid_full))  # the trunk is untouched
    # the LM head over 5 rows instead of 27: XLA:CPU may tile the f32 dot differently by row count, so a few ulps
    np.testing.assert_allclose(np.asarray(part), np.asarray(full).reshape(b * p, -1)[np.asarray(rows)],
                               rtol=1e-5, atol=1e-5)


def _avals(jaxpr):
    """Every intermediate's abstract value in ``jaxpr`` and its sub-jaxprs (loops, conds, pjit calls)."""
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield v.aval
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from _avals(inner)


class _NoRows:
    """The decoder seen through the protocol's required signature only (a third party's target)."""

    def __init__(self, target):
        self._t = target
        self.vocab_size = target.vocab_size
        self.feature_size = target.feature_size

    def forward(self, tokens, meta, cache):
        return self._t.forward(tokens, meta, cache)


@pytest.mark.parametrize("with_rows", [True, False], ids=["rows", "no-rows"])
def test_prefill_builds_no_full_prompt_logits(pair, with_rows):
    target, drafter = pair
    eng = Engine(target, drafter, spec=CHAIN, max_context=64, max_batch=4)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [11, 12, 13, 14, 15]]
    state, padded, lens = eng.prepare(prompts, 4)
    b, p = padded.shape
    tgt = target if with_rows else _NoRows(target)
    fn = functools.partial(step_mod.prefill, tgt, drafter, eng.opts)
    closed = jax.make_jaxpr(fn)(state, padded, lens)
    v = target.vocab_size
    full = [a.shape for a in _avals(closed.jaxpr) if getattr(a, "shape", None) in ((b, p, v), (b * p, v))]
    assert bool(full) == (not with_rows), full
    out = fn(state, padded, lens)
    ref = eng.run_prefill(*eng.prepare(prompts, 4))
    np.testing.assert_array_equal(np.asarray(out.bonus), np.asarray(ref.bonus))
    np.testing.assert_array_equal(np.asarray(out.seq_lens), np.asarray(ref.seq_lens))
