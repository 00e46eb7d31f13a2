"""Slot buckets of the serving core, host side and on small synthetic states (nothing compiled here; the served
outputs at every bucket and the no-recompile steady state are in tests/test_serving.py, the adaptive pricing per
bucket in tests/test_serving_drafters.py).

Slots go lowest first, so the decode bucket ``next_pow2(highest occupied slot + 1)`` stays small under light
load; the bucket view and its write-back touch rows ``[0, b)`` only and carry the KV pools whole; the chunk
buckets are the prompt buckets up to the budget; an adaptive core prices a bucket at its own calibrated costs
when the engine has them, else at the slot count's."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine
from jaxspec.engine.state import DecodeState, SamplingParams
from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair
from jaxspec.protocols import PagedKVCache
from jaxspec.serving import PagePool, Request, RequestParams, Scheduler, ServingEngine
from jaxspec.serving.core import _rows_view, _write_rows, prompt_buckets


def _req(name, n=4):
    return Request(name, np.arange(n, dtype=np.int32), 4, worst_pages=1)


def test_slots_lowest_first_and_the_bucket():
    """Admitted requests take the lowest free slots; a freed low slot is taken again before any higher one; the
    bucket is the power of two above the highest occupied slot (0 when none)."""
    sched = Scheduler(8, PagePool(64))
    assert sched.bucket() == 0
    reqs = [_req(f"r{i}") for i in range(5)]
    sched.waiting.extend(reqs[:3])
    sched.schedule(64, 1)
    assert [r.slot for r in reqs[:3]] == [0, 1, 2] and sched.bucket() == 4
    sched.release(reqs[0])
    sched.release(reqs[2])
    assert sched.bucket() == 2  # slot 1 alone
    sched.waiting.extend(reqs[3:])
    sched.schedule(64, 1)
    assert [reqs[3].slot, reqs[4].slot] == [0, 2] and sched.bucket() == 4
    sched.release(reqs[1])
    sched.release(reqs[4])
    assert sched.bucket() == 1  # slot 0 alone


def _state(b=4, w=6, x=16):
    rng = np.random.default_rng(0)
    cache = PagedKVCache(jnp.asarray(rng.standard_normal((1, x, 2))), jnp.asarray(rng.standard_normal((1, x, 2))),
                         jnp.asarray(rng.integers(0, x, (b, w)), jnp.int32))
    rows = lambda dtype=jnp.int32: jnp.asarray(rng.integers(0, 9, (b,)), dtype)  # noqa: E731
    return DecodeState(
        target_cache=cache, draft=(), seq_lens=rows(), bonus=rows(), out_tokens=jnp.asarray(rng.integers(0, 9, (b, 8))),
        num_generated=rows(), max_new_tokens=rows(), done=rows(bool), eos_id=jnp.int32(-1), num_rounds=rows(),
        num_accepted=rows(), sampling=SamplingParams(rows(jnp.float32), rows(), rows(jnp.float32), rows()))


def test_bucket_view_and_write_back():
    """The view of rows [0, 2) is those rows of every per-row leaf and of the token table, the pools whole; the
    write-back changes rows [0, 2) and the pools only."""
    state = _state()
    sub = _rows_view(state, 0, 2)
    assert sub.seq_lens.shape == (2,) and sub.target_cache.req_to_token.shape == (2, 6)
    np.testing.assert_array_equal(sub.out_tokens, state.out_tokens[:2])
    assert sub.target_cache.k is state.target_cache.k
    new_k = sub.target_cache.k + 1
    sub = dataclasses.replace(sub, seq_lens=sub.seq_lens + 100, out_tokens=sub.out_tokens * 0 - 1,
                              target_cache=PagedKVCache(new_k, sub.target_cache.v, sub.target_cache.req_to_token))
    out = _write_rows(state, sub, 0, None)
    np.testing.assert_array_equal(out.seq_lens[:2], state.seq_lens[:2] + 100)
    np.testing.assert_array_equal(out.seq_lens[2:], state.seq_lens[2:])
    np.testing.assert_array_equal(out.out_tokens[2:], state.out_tokens[2:])
    assert np.all(np.asarray(out.out_tokens[:2]) == -1)
    np.testing.assert_array_equal(out.target_cache.k, new_k)
    np.testing.assert_array_equal(out.target_cache.req_to_token, state.target_cache.req_to_token)
    np.testing.assert_array_equal(out.sampling.seed, state.sampling.seed)


@pytest.mark.parametrize("budget, width, want", [(16, 64, [8, 16]), (256, 64, [8, 16, 32, 64]), (24, 48, [8, 16, 32]),
                                                 (5, 64, [8]), (256, 48, [8, 16, 32, 48])])
def test_chunk_buckets(budget, width, want):
    """A chunk of at most ``min(budget, W)`` tokens is padded to a power of two >= 8, at most W."""
    assert prompt_buckets(min(budget, width), width) == want


def test_bucket_costs_and_warmup_refusal():
    """An adaptive core prices each slot bucket at ``Engine.round_costs[bucket]`` where the engine has it, else
    at the slot count's; the buckets are 1, 2, 4 for 4 slots; ``warmup`` refuses a core with requests."""
    m = load_pair(DEFAULT_WEIGHTS)
    spec = (SpecConfig(num_steps=2, topk=1, num_draft_tokens=3),)
    eng = Engine(m, MTPDrafter(m), spec=spec, adaptive=AdaptivePolicy(), max_context=32, max_batch=4, num_pages=64)
    eng.round_costs[4] = np.float32([1.0, 3.0])
    eng.round_costs[1] = np.float32([0.5, 0.6])
    se = ServingEngine(eng)
    assert se.slot_buckets == [1, 2, 4]
    np.testing.assert_array_equal(se._bucket_costs[1], np.float32([0.5, 0.6]))
    np.testing.assert_array_equal(se._bucket_costs[2], [1.0, 3.0])
    np.testing.assert_array_equal(se.step_costs.base, [1.0, 3.0])
    se.submit(np.arange(5), RequestParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="warmup"):
        se.warmup()
