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
from jaxspec.engine import DecodeState, SamplingParams
from jaxspec.engine.slots import bucket_view, put_rows, take_rows, write_bucket
from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair
from jaxspec.protocols import PagedKVCache
from jaxspec.serving import PagePool, Request, RequestParams, Scheduler, ServingEngine
from jaxspec.serving.core import chunk_batch_buckets, prompt_buckets
from jaxspec.testing import CompileCounter


def _req(name, n=4):
    return Request(name, np.arange(n, dtype=np.int32), 4, worst_pages=1)


def test_slots_lowest_first_and_the_decode_rows():
    """Admitted requests take the lowest free slots; a freed low slot is taken again before any higher one; a
    plan decodes the rows up to the highest occupied slot (0 rows when none decodes)."""
    sched = Scheduler(8, PagePool(64), max_context=16, max_prefill_tokens=64)
    assert sched.schedule().decode_rows == 0
    reqs = [_req(f"r{i}") for i in range(5)]
    for r in reqs[:3]:
        sched.add(r)
    assert sched.schedule().decode_rows == 3
    assert [r.slot for r in reqs[:3]] == [0, 1, 2]
    sched.abort(reqs[0])
    sched.abort(reqs[2])
    assert sched.schedule().decode_rows == 2  # slot 1 alone
    for r in reqs[3:]:
        sched.add(r)
    assert sched.schedule().decode_rows == 3
    assert [reqs[3].slot, reqs[4].slot] == [0, 2]
    sched.abort(reqs[1])
    sched.abort(reqs[4])
    assert sched.schedule().decode_rows == 1  # slot 0 alone


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
    sub = bucket_view(state, 2)
    assert sub.seq_lens.shape == (2,) and sub.target_cache.req_to_token.shape == (2, 6)
    np.testing.assert_array_equal(sub.out_tokens, state.out_tokens[:2])
    assert sub.target_cache.k is state.target_cache.k
    new_k = sub.target_cache.k + 1
    sub = dataclasses.replace(sub, seq_lens=sub.seq_lens + 100, out_tokens=sub.out_tokens * 0 - 1,
                              target_cache=PagedKVCache(new_k, sub.target_cache.v, sub.target_cache.req_to_token))
    out = write_bucket(state, sub)
    np.testing.assert_array_equal(out.seq_lens[:2], state.seq_lens[:2] + 100)
    np.testing.assert_array_equal(out.seq_lens[2:], state.seq_lens[2:])
    np.testing.assert_array_equal(out.out_tokens[2:], state.out_tokens[2:])
    assert np.all(np.asarray(out.out_tokens[:2]) == -1)
    np.testing.assert_array_equal(out.target_cache.k, new_k)
    np.testing.assert_array_equal(out.target_cache.req_to_token, state.target_cache.req_to_token)
    np.testing.assert_array_equal(out.sampling.seed, state.sampling.seed)


def test_take_and_put_rows():
    """Gathered rows (a chunk batch's slots, one out of range: a padding chunk) read those rows and, out of
    range, zeros (the dummy page); the scatter writes exactly the gathered rows back and drops the padding
    one."""
    state = _state()
    rows = jnp.asarray([2, 0, 4], jnp.int32)
    sub = take_rows(state, rows)
    np.testing.assert_array_equal(sub.seq_lens, [state.seq_lens[2], state.seq_lens[0], 0])
    np.testing.assert_array_equal(sub.target_cache.req_to_token[2], np.zeros(6))
    np.testing.assert_array_equal(sub.target_cache.req_to_token[0], state.target_cache.req_to_token[2])
    sub = dataclasses.replace(sub, seq_lens=jnp.asarray([70, 71, 72], jnp.int32))
    out = put_rows(state, sub, rows)
    np.testing.assert_array_equal(out.seq_lens, [71, state.seq_lens[1], 70, state.seq_lens[3]])
    np.testing.assert_array_equal(out.bonus, state.bonus)
    np.testing.assert_array_equal(out.target_cache.req_to_token, state.target_cache.req_to_token)


def test_prefill_buckets_fit_the_budget():
    """A prefill call's (chunk count, width) buckets: ``c`` chunks (more than half of ``c`` real ones, each at
    least a token) with the longest in the width's bucket must fit the step's budget."""
    assert chunk_batch_buckets([1, 2, 4], [8, 16], 16) == [(1, 8), (2, 8), (4, 8), (1, 16), (2, 16), (4, 16)]
    assert chunk_batch_buckets([1, 2, 4, 8], [8], 4) == [(1, 8), (2, 8), (4, 8)]  # 5 chunks (bucket 8) need 5
    assert chunk_batch_buckets([1, 2, 4], [8, 16, 32], 18) == [(1, 8), (2, 8), (4, 8), (1, 16), (2, 16), (4, 16),
                                                               (1, 32), (2, 32)]


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


def test_warmup_calibrates_the_slot_buckets_ahead():
    """An adaptive core's ``warmup`` calibrates the slot buckets the engine has no costs for, their executables
    compiled ahead with the others (the calibration itself compiles nothing), and prices each bucket at its own
    costs; ``calibrate=False`` leaves a bucket at the slot count's; ``calibrate=True`` on a core that is not
    adaptive, or a non-bool, is refused before anything compiles."""
    m = load_pair(DEFAULT_WEIGHTS)
    spec = (SpecConfig(num_steps=2, topk=1, num_draft_tokens=3),)
    eng = Engine(m, MTPDrafter(m), spec=spec, adaptive=AdaptivePolicy(), max_context=48, max_batch=2, num_pages=128)
    se = ServingEngine(eng, max_prefill_tokens=8)  # calibrates the slot count's bucket (2)
    assert set(eng.round_costs) == {2} and se.slot_buckets == [1, 2]
    np.testing.assert_array_equal(se._bucket_costs[1], eng.round_costs[2])
    with pytest.raises(ValueError, match="calibrate: expected None or a bool"):
        se.warmup(calibrate=1)
    compiles, calibrate = [], eng.calibrate

    def counted(batch_size, **kw):
        counter = CompileCounter()
        out = calibrate(batch_size, **kw)
        compiles.append((batch_size, counter.count))
        return out

    eng.calibrate = counted
    names = []
    se.warmup(progress=lambda done, total, what: names.append(what), threads=2)
    assert compiles == [(1, 0)]  # compiled ahead on the warm-up's threads
    assert "calibrate 1 slots" in names and set(eng.round_costs) == {1, 2}
    np.testing.assert_array_equal(se._bucket_costs[1], eng.round_costs[1])
    del eng.round_costs[1]
    se._bucket_costs[1] = np.asarray(eng.round_costs[2], np.float64)
    se.warmup(calibrate=False)  # everything compiled already: calls only
    assert compiles == [(1, 0)] and set(eng.round_costs) == {2}
    np.testing.assert_array_equal(se._bucket_costs[1], eng.round_costs[2])
    plain = ServingEngine(Engine(m, None, max_context=48, max_batch=2, num_pages=128))
    with pytest.raises(ValueError, match="only an adaptive engine"):
        plain.warmup(calibrate=True)
