"""The continuous-batching core (``jaxspec.serving``) on the shipped tiny pair, on CPU.

Lossless under interleaving: requests arriving at random steps (random prompt lengths and limits, some
aborted mid-generation, more requests than slots and a pool too small for all of them at once) each get
exactly their solo plain greedy output (``Engine.generate`` on that prompt alone; an aborted request a prefix
of it), plain and speculative, page sizes 1 and 16, whole prompts and chunked ones (a prefill budget of 8
tokens a step: prompts and budgets straddle chunk boundaries), greedy and sampled. No page leak: after every
schedule the free list holds every page; an abort frees the request's pages before it returns. Nothing
recompiles as requests join and leave (after ``warmup``: every slot bucket and chunk bucket). Compiles are
shared: one ServingEngine per (spec, page size, prefill budget), reused by every example (the budget is no part
of an executable: cores of one engine configuration share theirs), its KV pool filled with NaN at creation (a
request reading a slot it did not write would turn NaN).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair
from jaxspec.protocols import PagedKVCache
from jaxspec.serving import RequestParams, PagePool, ServingEngine
from jaxspec.testing import CompileCounter

W = 64
SLOTS = 4
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
# Pools smaller than SLOTS full requests (worst case prompt 20 + 16 new + verify width): requests wait.
NUM_PAGES = {1: 100, 16: 7}
SPECS = {"plain": None, "chain": CHAIN, "tree": TREE}


COMPILES = CompileCounter()
_CACHE: dict = {}


def _add(se, prompt, max_new, request_id=None, **sampling):
    """Submit ``prompt`` for ``max_new`` tokens (sampling keywords as in ``RequestParams``); returns its handle
    (a finished request leaves ``se.requests``; its handle still reads it)."""
    return se.submit(prompt, RequestParams(max_new_tokens=max_new, **sampling), request_id=request_id)


def _model():
    if "model" not in _CACHE:
        _CACHE["model"] = load_pair(DEFAULT_WEIGHTS)
    return _CACHE["model"]


CHUNKED = 8  # a prefill budget that chunks most prompts
WHOLE = 256  # the default budget: every prompt (at most W) whole


def _serving(spec: str, page_size: int, budget: int = WHOLE) -> ServingEngine:
    key = (spec, page_size, budget)
    if key not in _CACHE:
        m, s = _model(), SPECS[spec]
        eng = Engine(m, None if s is None else MTPDrafter(m), spec=s, max_context=W, page_size=page_size,
                     max_batch=SLOTS, num_pages=NUM_PAGES[page_size])
        _CACHE[key] = se = ServingEngine(eng, max_prefill_tokens=budget)
        _poison(se)  # every shared core starts from a NaN pool (see _poison)
    return _CACHE[key]


def _solo(prompt: tuple, max_new: int) -> list:
    """The request's own plain greedy output, alone in a batch (cached)."""
    if "solo" not in _CACHE:
        _CACHE["solo"] = Engine(_model(), None, max_context=W, max_batch=1)
    key = ("ref", prompt, max_new)
    if key not in _CACHE:
        _CACHE[key] = _CACHE["solo"].generate([np.array(prompt, np.int32)], max_new).tokens[0].tolist()
    return _CACHE[key]


def _check_pages(se: ServingEngine) -> None:
    """Every page is either free or held by exactly one running request, within its budget, and every
    committed position of a running request lies on one of its own pages in the device's token table."""
    held = [p for r in se.scheduler.running.values() for p in r.pages]
    assert len(held) == len(set(held))
    table = np.asarray(se._state.target_cache.req_to_token)
    for r in se.scheduler.running.values():
        assert len(r.pages) <= r.worst_pages
        on = set((table[r.slot, : r.seq_len] // se.page_size).tolist())
        assert on <= set(r.pages), (r.request_id, sorted(on - set(r.pages)))
    assert sorted(held + se.pool.free_pages()) == list(range(1, se.pool.num_pages))


def _run(se: ServingEngine, schedule, aborts=()):
    """Drive ``se``: request ``i`` = ``(arrival step, prompt, max_new)`` is added at its step; ``aborts`` =
    ``(request index, step)``. Returns the request ids and what each step streamed per id."""
    ids = [None] * len(schedule)
    streamed: dict = {}
    last = max([a for a, _, _ in schedule] + [s for _, s in aborts])
    step = 0
    while step <= last or se.has_unfinished():
        for i, (arrive, prompt, max_new) in enumerate(schedule):
            if arrive == step:
                ids[i] = _add(se, np.array(prompt, np.int32), max_new)
        for i, at in aborts:
            if at == step and ids[i] is not None:
                req = ids[i]._req
                held, free = len(req.pages), se.pool.num_free
                se.cancel(ids[i])
                assert req.status == "finished" and req.pages == []
                assert se.pool.num_free == free + held  # freed at once
        for out in se.step():
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
        _check_pages(se)
        step += 1
        assert step < 500
    assert se.pool.num_free == se.pool.capacity and not se.scheduler.running  # no leak
    return ids, streamed


def _check_outputs(se, schedule, ids, streamed, aborts=()):
    aborted = {i for i, _ in aborts}
    for i, (_, prompt, max_new) in enumerate(schedule):
        req = ids[i]
        want = _solo(tuple(prompt), max_new)
        assert streamed.get(req.request_id, []) == req.output
        if req.finish_reason == "abort":
            assert i in aborted and req.output == want[: len(req.output)], (i, req.output, want)
        else:
            assert req.output == want, (i, req.finish_reason, req.output, want)
            assert req.finish_reason == "length"


def _prompt(seed: int, n: int) -> tuple:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(0, 64, n))


REQUEST = st.tuples(st.integers(0, 6), st.integers(0, 2**16), st.integers(1, 20), st.integers(1, 16))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", ["plain", "chain"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(REQUEST, min_size=1, max_size=7), abort=st.one_of(st.none(), st.tuples(st.integers(0, 6),
                                                                                             st.integers(0, 8))))
def test_interleaved_equals_solo(spec, page_size, reqs, abort):
    """Random arrivals (more requests than slots, a pool too small for all at once), one optional abort (also
    mid-prefill), a prefill budget of 8 tokens a step (prompts of 1 to 20 tokens: some whole, most in chunks,
    the budget shared by the requests admitted together): every request's output equals its solo plain greedy
    output (an aborted one: a prefix of it), what was streamed equals the output, and every page is back on the
    free list afterwards. (Whole prompts of every bucket: the other tests, at the default budget.)"""
    se = _serving(spec, page_size, CHUNKED)
    schedule = [(a, _prompt(seed, n), m) for a, seed, n, m in reqs]
    aborts = () if abort is None or abort[0] >= len(schedule) else (abort,)
    ids, streamed = _run(se, schedule, aborts)
    _check_outputs(se, schedule, ids, streamed, aborts)


def test_tree_interleaved_equals_solo():
    """Tree speculation (S3 K2 N6), page size 16: a fixed interleaving, prompts chunked (a budget of 8), solo
    outputs, no leak."""
    se = _serving("tree", 16, CHUNKED)
    schedule = [(0, _prompt(1, 5), 12), (0, _prompt(2, 17), 9), (1, _prompt(3, 3), 16), (2, _prompt(4, 11), 1),
                (4, _prompt(5, 20), 14), (5, _prompt(6, 8), 6)]
    ids, streamed = _run(se, schedule)
    _check_outputs(se, schedule, ids, streamed)


def test_without_overlap_each_step_reads_itself():
    """``overlap=False``: each step reads and returns its own tokens (nothing is left in flight after it); a
    random interleaving with an abort (chain, page size 16, chunked prompts, on the shared core's engine) still
    gives every request its solo output and frees every page."""
    se = ServingEngine(_serving("chain", 16).engine, max_prefill_tokens=CHUNKED, overlap=False)
    rng = np.random.default_rng()
    schedule = [(int(rng.integers(0, 6)), _prompt(int(rng.integers(0, 2**16)), int(rng.integers(1, 21))),
                 int(rng.integers(1, 17))) for _ in range(6)]
    step = se.step
    se.step = lambda: step() if not se._pending else pytest.fail("a step left before it was read")
    ids, streamed = _run(se, schedule, aborts=((2, 3),))
    assert not se._pending
    _check_outputs(se, schedule, ids, streamed, aborts=((2, 3),))
    with pytest.raises(ValueError, match="overlap"):
        ServingEngine(se.engine, overlap=1)


def _poison(se: ServingEngine) -> None:
    """Fill every KV pool (target and drafter, the dummy page included) with NaN: attention masks what it
    must not read (a masked NaN contributes nothing), so a NaN can only reach a logit through a read of a slot
    the request did not write itself."""

    def noise(x):
        return jnp.full(x.shape, jnp.nan, x.dtype)

    se._state = jax.tree.map(
        lambda c: PagedKVCache(noise(c.k), noise(c.v), c.req_to_token) if isinstance(c, PagedKVCache) else c,
        se._state, is_leaf=lambda c: isinstance(c, PagedKVCache))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("spec", ["plain", "chain"])
def test_poisoned_pool(spec, page_size):
    """With every KV slot of the pool poisoned first, and many admissions and retirements through a
    pool too small for all requests at once, prompts prefilled in chunks, outputs still equal the solo ones: no
    request reads a slot it did not write itself (nor writes into another request's pages), a chunk reads its
    prefix from its own pages."""
    se = _serving(spec, page_size, CHUNKED)
    _poison(se)
    rng = np.random.default_rng(7)
    schedule = [(int(rng.integers(0, 10)), _prompt(100 + i, int(rng.integers(1, 21))), int(rng.integers(1, 17)))
                for i in range(10)]
    ids, streamed = _run(se, schedule)
    _check_outputs(se, schedule, ids, streamed)


def test_abort_frees_pages_at_once():
    """An abort mid-generation returns the request's pages before it returns; the other request is unaffected
    and a request queued behind the page budget is admitted into the freed pages."""
    se = _serving("chain", 16)
    a = _add(se, np.array(_prompt(11, 20), np.int32), 16)
    b = _add(se, np.array(_prompt(12, 9), np.int32), 16)
    c = _add(se, np.array(_prompt(13, 20), np.int32), 16)  # 3 pages worst case each: c waits
    se.step()
    se.step()
    assert c.status == "waiting"
    held = len(se.requests[a.request_id].pages)
    assert held > 0 and a.output
    free = se.pool.num_free
    se.cancel(a)
    assert se.pool.num_free == free + held and a.finish_reason == "abort"
    se.step()
    assert c.status == "running"
    se.run_until_done()
    assert se.pool.num_free == se.pool.capacity
    assert b.output == _solo(_prompt(12, 9), 16)
    assert c.output == _solo(_prompt(13, 20), 16)
    se.cancel(a)  # already finished: nothing happens
    with pytest.raises(ValueError, match="request"):
        se.cancel("nope")


@pytest.mark.parametrize("spec", ["plain", "chain"])
def test_steady_state_compiles_nothing(spec):
    """After ``warmup`` (the table refresh, the decode loop of every slot bucket, the last chunks' prefill of every
    chunk bucket, the non-final chunk's of every width), a long random schedule of arrivals, aborts (some
    mid-prefill) and retirements, with prompts of any length (whole or in chunks of a 16-token budget), compiles
    nothing, decodes at every slot bucket and prefills non-final chunks one per call; outputs solo."""
    se = _serving(spec, 1, 16)
    rng = np.random.default_rng(5 if spec == "plain" else 6)
    schedule = [(int(rng.integers(0, 40)), _prompt(300 + i, int(rng.integers(1, 45))), int(rng.integers(1, 17)))
                for i in range(30)]
    aborts = ((3, 12), (17, 30), (25, 33))
    for _, prompt, max_new in schedule:
        _solo(prompt, max_new)  # the references compile on their own
    calls = []
    se.warmup(progress=lambda done, total, what: calls.append((done, total, what)))
    eng = se.engine
    assert se.slot_buckets == [1, 2, 4] and se.chunk_buckets == [8, 16]
    # every (chunk count, width) bucket a 16-token budget allows: up to 4 chunks of 8, and of 16 (9 + 1 + 1 + 1)
    assert se.prefill_buckets == [(1, 8), (2, 8), (4, 8), (1, 16), (2, 16), (4, 16)]
    assert se.prefill_chunk_buckets == [(1, 8), (1, 16)]  # a step has at most one non-final chunk
    # the progress line: one call before each executable (the table refresh, a non-final prefill per width, a
    # last-chunk prefill per prefill bucket, a decode per slot bucket, the copy of a step's outputs)
    names = ["page tables", "prefill 1 chunks of 8", "prefill 1 chunks of 16"]
    names += [f"last {c} chunks of {p}" for c, p in se.prefill_buckets]
    names += ["decode 1 slots", "decode 2 slots", "decode 4 slots", "step outputs", "done"]
    assert calls == [(i, 13, what) for i, what in enumerate(names)]
    entries = eng._entry_points(False)
    compiled = (entries.decode._cache_size(), entries.prefill._cache_size(), entries.prefill_chunk._cache_size())
    buckets, widths, partial = [], [], []
    decode, prefill = se._decode, se._prefill
    se._decode = lambda b: buckets.append(b) or decode(b)
    se._prefill = lambda chunks, final, *a: (widths if final else partial).append(len(chunks)) or prefill(
        chunks, final, *a)
    before = COMPILES.count
    try:
        ids, streamed = _run(se, schedule, aborts)
    finally:
        del se._decode, se._prefill
    assert COMPILES.count == before, COMPILES.count - before
    assert set(buckets) == {1, 2, 4}, sorted(set(buckets))
    assert max(widths) >= 2  # requests admitted together shared one prefill call
    assert partial and set(partial) == {1}  # chunked prompts, one non-final chunk per call
    assert (entries.decode._cache_size(), entries.prefill._cache_size(),
            entries.prefill_chunk._cache_size()) == compiled
    _check_outputs(se, schedule, ids, streamed, aborts)



def test_parallel_warmup_compiles_each_executable_once():
    """``warmup(threads=2)`` lowers every executable, compiles them on two threads, then calls each, which finds it
    compiled: as many compiles as executables, the progress line naming each and counting up to the total. A
    random schedule of long prompts after it (chunked: a 16-token budget, MTP's 3-token lookahead, two slots)
    compiles nothing and gets the solo outputs. A bad ``threads`` is refused naming it."""
    m = _model()
    eng = Engine(m, MTPDrafter(m), spec=CHAIN, max_context=48, page_size=4, max_batch=2, num_pages=29)
    se = ServingEngine(eng, max_prefill_tokens=16)  # a configuration no other test compiles
    rng = np.random.default_rng(21)
    schedule = [(int(rng.integers(0, 12)), _prompt(500 + i, int(rng.integers(12, 33))), int(rng.integers(1, 9)))
                for i in range(10)]
    for _, prompt, max_new in schedule:
        _solo(prompt, max_new)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            se.warmup(threads=bad)
    calls = []
    before = COMPILES.count
    se.warmup(progress=lambda done, total, what: calls.append((done, total, what)), threads=2)
    names = ["page tables"] + [f"prefill 1 chunks of {p}" for p in se.chunk_buckets]
    names += [f"last {c} chunks of {p}" for c, p in se.prefill_buckets] + ["decode 1 slots", "decode 2 slots"]
    names += ["step outputs"]
    total = len(names)
    assert total == 1 + 2 + 4 + 2 + 1 and COMPILES.count - before == total  # nothing compiled twice
    assert calls[-1] == (total, total, "done") and len(calls) == 2 * total + 1  # lowered, compiled; the end
    assert sorted(what for _, _, what in calls[:-1]) == sorted(names * 2)
    assert [d for d, _, _ in calls] == sorted(d for d, _, _ in calls) and {t for _, t, _ in calls} == {total}
    before = COMPILES.count
    ids, streamed = _run(se, schedule)
    assert COMPILES.count == before
    _check_outputs(se, schedule, ids, streamed)

def test_refusals():
    """A request that overflows the context, or whose worst case exceeds the whole pool, is refused at
    submit; bad engine arguments are refused at construction."""
    m = _model()
    se = ServingEngine(Engine(m, None, max_context=W, page_size=16, max_batch=2, num_pages=3))
    with pytest.raises(ValueError, match="context overflow"):
        _add(se, np.arange(60) % 64, 8)
    with pytest.raises(ValueError, match="KV pages"):
        _add(se, np.arange(30) % 64, 8)  # 3 pages of 16 needed, the pool has 2
    rid = _add(se, np.arange(10) % 64, 8)
    with pytest.raises(ValueError, match="request_id"):
        _add(se, np.arange(10) % 64, 8, request_id=rid.request_id)
    with pytest.raises(ValueError, match="rounds_per_step"):
        ServingEngine(se.engine, rounds_per_step=0)
    with pytest.raises(ValueError, match="engine"):
        ServingEngine(object())


def test_eos_finishes_with_stop():
    """A request whose solo output reaches EOS stops there (reason "stop"), its EOS kept, slot reused."""
    prompt = _prompt(40, 7)
    ref = _solo(prompt, 16)
    eos = ref[3]
    want = ref[: ref.index(eos) + 1]
    m = _model()
    se = ServingEngine(Engine(m, MTPDrafter(m), spec=CHAIN, max_context=W, page_size=16, max_batch=SLOTS,
                              num_pages=NUM_PAGES[16], eos_id=eos))
    rid = _add(se, np.array(prompt, np.int32), 16)
    se.run_until_done()
    assert rid.output == want and rid.finish_reason == "stop"
    assert se.pool.num_free == se.pool.capacity


def test_page_pool():
    """The free list hands out pages 1.. (never the dummy page), refuses over-allocation and double frees."""
    pool = PagePool(5)
    got = pool.allocate(4)
    assert sorted(got) == [1, 2, 3, 4] and pool.num_free == 0
    with pytest.raises(RuntimeError, match="asked for"):
        pool.allocate(1)
    pool.free(got[:2])
    with pytest.raises(RuntimeError, match="not allocated"):
        pool.free(got[:1])
    with pytest.raises(ValueError, match="num_pages"):
        PagePool(1)


def test_several_rounds_per_step():
    """``rounds_per_step=3`` (pages reserved for three speculative rounds ahead, page size 1: the reservation is
    tight at every token): solo outputs, no leak, and the same decode executable as one round per step. The
    loop leaves when a request finishes: a step with one that ends after a round ran one round."""
    m = _model()
    eng = Engine(m, MTPDrafter(m), spec=CHAIN, max_context=W, page_size=1, max_batch=SLOTS,
                 num_pages=NUM_PAGES[1])
    se = ServingEngine(eng, rounds_per_step=3)
    schedule = [(0, _prompt(50, 9), 40), (0, _prompt(51, 2), 11), (1, _prompt(52, 19), 30), (1, _prompt(53, 14), 16),
                (2, _prompt(54, 5), 3), (3, _prompt(55, 12), 36)]
    ids, streamed = _run(se, schedule)
    _check_outputs(se, schedule, ids, streamed)
    assert eng._entry_points(False).decode._cache_size() <= 3  # one per slot bucket 1, 2, 4, whatever R
    for overlap in (False, True):  # with overlap a step returns the step before it: the first returns nothing
        se = ServingEngine(eng, rounds_per_step=4, overlap=overlap)
        short = _add(se, np.array(_prompt(56, 4), np.int32), 2)  # its first round ends it
        long = _add(se, np.array(_prompt(57, 4), np.int32), 40)
        if overlap:
            assert se.step() == [] and short.status == "running" and long.output == []
        se.step()
        assert short.status == "finished"
        assert 2 <= len(long.output) <= 1 + CHAIN.num_steps + 1  # prefill's token + one round
        se.run_until_done()
        assert long.output == _solo(_prompt(57, 4), 40)


def test_one_host_read_per_step(monkeypatch):
    """A step transfers nothing implicitly (``jax.transfer_guard("disallow")``) and reads the device once (the step
    before it: ``overlap``): one
    ``jax.device_get`` of six arrays, and no other array read back (``bool`` / ``int`` / ``tolist`` of a device
    array go through ``_value``, counted; NumPy's buffer protocol on a CPU array is not seen here); an abort
    reads nothing, and neither does a step that only prefilled a non-final chunk."""
    se = _serving("chain", 16)
    calls, reads = [], []
    real = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: calls.append(1) or real(x))
    cls = type(jnp.zeros(1))
    value = cls._value
    monkeypatch.setattr(cls, "_value", property(lambda self: reads.append(1) or value.fget(self)))
    a = _add(se, np.array(_prompt(60, 6), np.int32), 10)
    _add(se, np.array(_prompt(61, 13), np.int32), 12)
    steps = 0
    with jax.transfer_guard("disallow"):
        while se.has_unfinished():
            se.step()
            steps += 1
            if steps == 2:
                n, m = len(calls), len(reads)
                se.cancel(a)
                assert (len(calls), len(reads)) == (n, m)
    # overlap: a step reads the step before it; the first has none, and the last also reads its own (no request left)
    assert len(calls) == steps and len(reads) == 6 * steps
    se = _serving("chain", 16, CHUNKED)
    calls.clear()
    reads.clear()
    h = se.submit(np.array(_prompt(62, 20), np.int32), RequestParams(max_new_tokens=6))
    steps = 0
    with jax.transfer_guard("disallow"):
        while se.has_unfinished():
            se.step()
            steps += 1
    # chunks 8, 8 (4 left: at least the MTP lookahead of 3), then 4 and the decode
    assert len(calls) == steps - 2 and len(reads) == 6 * (steps - 2)
    assert h.output == _solo(_prompt(62, 20), 6)


def test_sampled_requests_draw_what_they_draw_alone():
    """A sampling core (chain speculation, page size 16, prompts of 3 to 8 tokens prefilled in chunks of a budget
    of 4): requests with their own temperature / top-k / top-p / seed, interleaved, each produce exactly the
    tokens the same engine configuration draws for them alone, unchunked (``Engine.generate`` of that one prompt
    with those parameters); a temperature-0 request stays greedy."""
    m = _model()

    def engine(batch, pages):
        return Engine(m, MTPDrafter(m), spec=CHAIN, max_context=W, page_size=16, max_batch=batch, num_pages=pages)

    se = ServingEngine(engine(SLOTS, NUM_PAGES[16]), sampling=True, max_prefill_tokens=4)  # chunks of 2 to 4
    solo = engine(1, 5)
    params = [dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=8, seed=5), dict(temperature=0.0),
              dict(temperature=1.3, top_p=0.9, seed=7), dict(temperature=1.0, seed=3)]
    schedule = [(i // 2, _prompt(70 + i, 3 + (5 * i) % 6), 12 + i) for i in range(len(params))]  # 3, 8, 7, 6, 5
    ids = [None] * len(schedule)
    step = 0
    while step < 3 or se.has_unfinished():
        for i, (arrive, prompt, max_new) in enumerate(schedule):
            if arrive == step:
                ids[i] = _add(se, np.array(prompt, np.int32), max_new, **params[i])
        se.step()
        _check_pages(se)
        step += 1
    assert se.pool.num_free == se.pool.capacity
    for i, (_, prompt, max_new) in enumerate(schedule):
        want = solo.generate([np.array(prompt, np.int32)], max_new, **params[i]).tokens[0].tolist()
        assert ids[i].output == want, (i, params[i])
    assert ids[2].output == _solo(schedule[2][1], schedule[2][2])
    with pytest.raises(ValueError, match="greedy"):
        _add(_serving("chain", 16), np.arange(5), 4, temperature=1.0)


def test_generate_a_list_longer_than_the_slots():
    """``generate``: ten prompts through four slots (and a pool for two or three at once) each give their solo
    greedy output, in order."""
    se = _serving("chain", 16)
    prompts = [np.array(_prompt(80 + i, 2 + 2 * i), np.int32) for i in range(10)]
    limits = [1 + (7 * i) % 16 for i in range(10)]
    got = se.generate(prompts, [RequestParams(max_new_tokens=m) for m in limits])
    assert got == [_solo(tuple(p.tolist()), m) for p, m in zip(prompts, limits)]
    assert se.pool.num_free == se.pool.capacity
    with pytest.raises(ValueError, match="params"):
        se.generate(prompts, [RequestParams(max_new_tokens=4)])


def test_checked_mode():
    """With the in-jit checks on (``JAXSPEC_CHECKS``), the core's executables are functionalised and its
    output is unchanged (a small one-layer decoder, page size 4, one slot, prompts in chunks of 4 tokens)."""
    from flax import nnx

    from jaxspec._validate import checks
    from jaxspec.models import Decoder, DecoderConfig

    cfg = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    m = Decoder(cfg, rngs=nnx.Rngs(3), param_dtype=jnp.float32, kv_dtype=jnp.float32)
    prompts = [np.arange(1, 6), np.arange(3, 11), np.arange(7, 9)]
    want = [Engine(m, None, max_context=32, max_batch=1).generate([p], 6).tokens[0].tolist() for p in prompts]
    with checks():
        se = ServingEngine(Engine(m, None, max_context=32, max_batch=1, page_size=4, num_pages=12),
                           max_prefill_tokens=4)
        se.warmup(threads=2)  # the checked executables lowered and compiled ahead, then called
        before = COMPILES.count
        assert se.generate(prompts, RequestParams(max_new_tokens=6)) == want
        assert COMPILES.count == before


def test_handle_stream_stop_tokens_and_stats():
    """A ``RequestHandle`` iterates its tokens (driving ``step`` itself) and they equal the solo output; a stop id
    of ``RequestParams`` ends a request there (reason "stop", the stop token kept) while the other request
    runs on; ``stats`` counts tokens, rounds and pages; bad parameters are refused naming the field."""
    se = _serving("chain", 16)
    p1, p2 = _prompt(90, 7), _prompt(91, 11)
    ref = _solo(p2, 16)
    stop = ref[4]
    h1 = se.submit(np.array(p1, np.int32), RequestParams(max_new_tokens=16))
    h2 = se.submit(np.array(p2, np.int32), RequestParams(max_new_tokens=16, stop_token_ids=[stop]))
    before = se.stats()
    assert before.waiting >= 2 and before.pages_total == se.pool.capacity
    assert list(h1) == _solo(p1, 16) and h1.finish_reason == "length" and h1.num_prompt_tokens == 7
    se.run_until_done()
    assert h2.output == ref[: ref.index(stop) + 1] and h2.finish_reason == "stop"
    st = se.stats()
    assert st.running == st.waiting == st.pages_in_use == 0
    assert st.generated_tokens - before.generated_tokens == len(h1.output) + len(h2.output)
    assert st.rounds > before.rounds and 1.0 <= st.mean_accept_length <= CHAIN.num_steps + 1
    for bad, field in [(dict(max_new_tokens=0), "max_new_tokens"), (dict(stop_token_ids="x"), "stop_token_ids"),
                       (dict(stop_token_ids=[-1]), "stop_token_ids")]:
        with pytest.raises(ValueError, match=field):
            RequestParams(**bad)
    with pytest.raises(ValueError, match="stop_token_ids"):
        se.submit(np.arange(4), RequestParams(stop_token_ids=[10**6]))
    with pytest.raises(ValueError, match="params"):
        se.submit(np.arange(4), {"max_new_tokens": 4})
