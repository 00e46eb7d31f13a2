"""Chunked prefill: ``engine.step.prefill_chunk`` (a non-final chunk) and the serving core's prefill budget.

Step level, on CPU: a prompt prefilled as non-final chunks then ``prefill`` of its last chunk writes the target
K/V, the drafter's K/V and proposal, and the first token that one whole-prompt ``prefill`` writes (plain, MTP
chain and tree, EAGLE-3; greedy and sampled: the first token's key does not depend on the chunks), and without
the MTP lookahead the draft K/V of a chunk's last rows would differ. Host level: the budget's schedule (FCFS,
the head always goes, the last chunk keeps the drafter's lookahead). The served outputs with chunking are
checked against solo generation in tests/test_serving.py (the hypothesis schedules, the poisoned pool, sampled
requests) and tests/test_serving_drafters.py (EAGLE-3, adaptive).
"""

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.engine.step import prefill, prefill_chunk, prefill_lookahead
from jaxspec.models import DEFAULT_WEIGHTS, Decoder, DecoderConfig, MTPDrafter, load_pair
from jaxspec.models.eagle3 import EAGLE3Model, Eagle3Config, aux_layers_from_ids
from jaxspec.models.eagle3_drafter import EAGLE3Drafter
from jaxspec.protocols import PagedKVCache
from jaxspec.serving import PagePool, Request, Scheduler, ServingEngine
from jaxspec.serving.scheduler import chunk_length

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
WIDTH = 16  # every chunk (and the whole prompt) padded to one width: one executable per function
_CACHE: dict = {}


def _pair():
    if "pair" not in _CACHE:
        _CACHE["pair"] = load_pair(DEFAULT_WEIGHTS)
    return _CACHE["pair"]


def _eagle3():
    cfg = DecoderConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                        rope_theta=10000.0)
    target = Decoder(cfg, rngs=nnx.Rngs(4), aux_layers=aux_layers_from_ids((0, 1, 2), 3), kv_dtype=jnp.float32)
    head_cfg = Eagle3Config.for_target(cfg, draft_vocab_size=40, aux_layer_ids=(0, 1, 2))
    d2t = np.sort(np.random.default_rng(5).choice(80, 40, replace=False)) - np.arange(40)
    head = EAGLE3Model(head_cfg, rngs=nnx.Rngs(5), param_dtype=jnp.float32, kv_dtype=jnp.float32, d2t=d2t)
    return target, EAGLE3Drafter(head, target)


class _NoLookahead:
    """An MTP drafter that hides ``prefill_lookahead`` (so ``prefill_chunk`` feeds it the next token only)."""

    def __init__(self, inner):
        self._inner = inner

    def extend_after_prefill(self, *args, **kw):
        return self._inner.extend_after_prefill(*args, **kw)


def _engine(kind: str):
    if kind == "eagle3":
        target, drafter = _eagle3()
        return Engine(target, drafter, spec=CHAIN, max_context=48, page_size=4, max_batch=1)
    m = _pair()
    spec = {"plain": None, "chain": CHAIN, "tree": TREE}[kind]
    return Engine(m, None if spec is None else MTPDrafter(m), spec=spec, max_context=48, page_size=4, max_batch=1)


def _fns(eng, blind: bool = False):
    """Jitted ``prefill`` and ``prefill_chunk`` of ``eng`` (the weights as arguments, as the engine's); ``blind``:
    the chunk's drafter without its lookahead."""

    def models(params):
        target, drafter = nnx.merge(eng.graphdef, jax.tree.unflatten(eng.treedef, params))
        return target, (_NoLookahead(drafter) if blind else drafter)

    whole = jax.jit(lambda p, st, tok, n: prefill(*models(p), eng.opts, st, tok, n))
    part = jax.jit(lambda p, st, tok, n, f: prefill_chunk(*models(p), eng.opts, st, tok, n, f))
    return functools.partial(whole, eng.params), functools.partial(part, eng.params)


def _pad(x):
    out = np.zeros((1, WIDTH), np.int32)
    out[0, : x.size] = x
    return jnp.asarray(out)


def _chunked(eng, fns, prompt, cuts, look, **sampling):
    """The state after prefilling ``prompt`` as chunks ending at ``cuts`` (then the rest as the last chunk)."""
    whole, part = fns
    state, _, _ = eng.prepare([prompt], 8, **sampling)
    start = 0
    for end in cuts:
        nxt = np.zeros((1, look), np.int32)
        nxt[0] = prompt[end: end + look]
        state = part(state, _pad(prompt[start:end]), jnp.asarray([end - start], jnp.int32), jnp.asarray(nxt))
        assert int(state.seq_lens[0]) == end and int(state.num_generated[0]) == 0
        start = end
    return whole(state, _pad(prompt[start:]), jnp.asarray([prompt.size - start], jnp.int32))


def _written(state, n):
    """Every cache's K/V at the request's first ``n`` positions, and the draft states' other leaves."""
    caches = [c for c in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, PagedKVCache))
              if isinstance(c, PagedKVCache)]
    slots = np.asarray(state.target_cache.req_to_token)[0, :n]
    kv = [np.asarray(x)[:, slots] for c in caches for x in (c.k, c.v)]
    rest = [np.asarray(x) for d in state.draft
            for x in jax.tree.leaves(dataclasses.replace(d, cache=None))]
    return kv, rest


@pytest.mark.parametrize("kind", ["plain", "chain", "tree", "eagle3"])
def test_chunks_write_what_one_prefill_writes(kind):
    """A 13-token prompt as chunks 5 + 4 + 4 (each non-final chunk fed the prompt's next tokens) leaves the
    committed length, the first token, the target's and the drafter's K/V at every prompt position and the
    drafter's proposal as one prefill of the whole prompt leaves them (greedy; MTP chain also sampled)."""
    eng = _engine(kind)
    look = prefill_lookahead(eng.drafter, eng.opts)
    assert look == (3 if kind in ("chain", "tree") else 1)
    fns = _fns(eng)
    prompt = np.random.default_rng(1).integers(1, int(eng.vocab_size), 13).astype(np.int32)
    for sampling in (dict(), dict(temperature=1.0, seed=11))[: 2 if kind == "chain" else 1]:
        state, _, _ = eng.prepare([prompt], 8, **sampling)
        want = fns[0](state, _pad(prompt), jnp.asarray([13], jnp.int32))
        got = _chunked(eng, fns, prompt, (5, 9), look, **sampling)
        assert int(got.seq_lens[0]) == 13
        assert np.asarray(got.out_tokens)[0, 0] == np.asarray(want.out_tokens)[0, 0]
        assert int(got.bonus[0]) == int(want.bonus[0]) and int(got.num_generated[0]) == 1
        for a, b in zip(*(_written(s, 13) for s in (got, want))):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-5)


def test_mtp_chunks_need_the_lookahead():
    """Without the lookahead (the drafter fed only the token after the chunk) the MTP layers after the first
    compute the chunk's last rows from their own predictions: the draft K/V there differ from one prefill."""
    eng = _engine("chain")
    prompt = np.random.default_rng(1).integers(1, int(eng.vocab_size), 13).astype(np.int32)
    state, _, _ = eng.prepare([prompt], 8)
    blind = _fns(eng, blind=True)
    want = blind[0](state, _pad(prompt), jnp.asarray([13], jnp.int32))
    got = _chunked(eng, blind, prompt, (5, 9), 1)
    draft_kv = lambda s: _written(s, 13)[0][2:]  # noqa: E731  (the target's K, V first)
    assert any(not np.allclose(x, y, atol=1e-4) for x, y in zip(draft_kv(got), draft_kv(want)))


def _req(name, n):
    return Request(name, np.arange(n, dtype=np.int32) % 50, 4, worst_pages=1)


def test_chunk_length():
    """All remaining tokens when they fit the budget left, else the budget, never leaving the last chunk fewer
    than the lookahead."""
    assert chunk_length(5, 8, 3) == 5
    assert chunk_length(20, 8, 3) == 8
    assert chunk_length(10, 8, 3) == 7  # 8 would leave 2 < 3
    assert chunk_length(4, 2, 3) == 1
    assert chunk_length(3, 2, 3) == 0  # any chunk would leave fewer than 3: wait
    assert chunk_length(9, 8, 1) == 8


def test_schedule_is_fcfs_under_the_budget():
    """The part-prefilled request first, then admissions in order while the budget lasts; each step at most the
    budget; the head always goes; every prompt whole after its chunks."""
    sched = Scheduler(8, PagePool(64), max_context=32, page_size=16, max_prefill_tokens=8, lookahead=3)
    reqs = [_req("a", 20), _req("b", 5), _req("c", 3), _req("d", 9), _req("e", 2)]
    for r in reqs:
        sched.add(r)
    steps = []
    while sched.waiting or sched.prefilling:
        chunks = sched.schedule().chunks
        assert chunks and sum(c.length for c in chunks) <= 8
        steps.append([(c.req.request_id, c.start, c.length) for c in chunks])
    assert steps == [[("a", 0, 8)], [("a", 8, 8)], [("a", 16, 4), ("b", 0, 2)],  # b keeps 3 for its last chunk
                     [("b", 2, 3), ("c", 0, 3), ("d", 0, 2)], [("d", 2, 7)], [("e", 0, 2)]]  # e: 1 token left: waits
    assert [r.slot for r in reqs] == [0, 1, 2, 3, 4]
    assert all(r.prefilled == r.prompt.size and r.status == "running" for r in reqs)
    done = collections.Counter()
    for step in steps:
        for name, _, n in step:
            done[name] += n
    assert dict(done) == {"a": 20, "b": 5, "c": 3, "d": 9, "e": 2}


def test_max_prefill_tokens_is_validated():
    """``max_prefill_tokens`` must be an int of at least the drafter's lookahead (MTP: its draft steps)."""
    m = _pair()
    plain = Engine(m, None, max_context=32, max_batch=1)
    spec = Engine(m, MTPDrafter(m), spec=CHAIN, max_context=32, max_batch=1)
    assert ServingEngine(plain, max_prefill_tokens=1).max_prefill_tokens == 1
    assert ServingEngine(spec, max_prefill_tokens=3).lookahead == 3
    for eng, bad in [(plain, 0), (plain, True), (plain, 8.0), (spec, 2)]:
        with pytest.raises(ValueError, match="max_prefill_tokens"):
            ServingEngine(eng, max_prefill_tokens=bad)
