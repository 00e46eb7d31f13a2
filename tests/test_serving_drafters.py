"""The continuous-batching core with every kind of engine it serves, on CPU: an EAGLE-3 drafter (random head on a
random target, so drafts are mostly rejected and the verify path runs its partial-accept branches) and an
adaptive engine (MTP with a chain and a tree, a policy that probes often so it switches modes mid-request).
Requests arrive at different steps, more than there are slots, their prompts prefilled in chunks (a budget of 8
tokens a step); each one's greedy output must equal its solo plain greedy output, the pool ends with every page
free, and a steady stream of further requests compiles nothing new. The adaptive core prices each slot bucket's
rounds at that bucket's costs."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine
from jaxspec.models import DEFAULT_WEIGHTS, Decoder, DecoderConfig, MTPDrafter, load_pair
from jaxspec.models.eagle3 import EAGLE3Model, Eagle3Config, aux_layers_from_ids
from jaxspec.models.eagle3_drafter import EAGLE3Drafter
from jaxspec.serving import RequestParams, ServingEngine
from jaxspec.testing import CompileCounter

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
V = 80
TARGET = DecoderConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0)
IDS = (0, 1, 2)
KW = dict(max_context=64, page_size=4, max_batch=2, num_pages=40)


def _add(se, prompt, max_new, request_id=None, **sampling):
    """Submit ``prompt`` for ``max_new`` tokens (sampling keywords as in ``RequestParams``); returns its handle."""
    return se.submit(prompt, RequestParams(max_new_tokens=max_new, **sampling), request_id=request_id)


def _eagle3_pair():
    target = Decoder(TARGET, rngs=nnx.Rngs(4), aux_layers=aux_layers_from_ids(IDS, 3), kv_dtype=jnp.float32)
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=40, aux_layer_ids=IDS)
    d2t = np.sort(np.random.default_rng(5).choice(V, 40, replace=False)) - np.arange(40)
    head = EAGLE3Model(cfg, rngs=nnx.Rngs(5), param_dtype=jnp.float32, kv_dtype=jnp.float32, d2t=d2t)
    return target, EAGLE3Drafter(head, target)


def _schedule(vocab: int, seed: int):
    """(arrival step, prompt, max_new) of 5 requests: prompt lengths 1..12, limits 3..12."""
    rng = np.random.default_rng(seed)
    return [(int(a), rng.integers(2, vocab, size=int(rng.integers(1, 13))).astype(np.int32),
             int(rng.integers(3, 13))) for a in (0, 0, 1, 3, 4)]


def _drive(se: ServingEngine, schedule) -> list:
    ids, step = [None] * len(schedule), 0
    while step <= max(a for a, _, _ in schedule) or se.has_unfinished():
        for i, (arrive, prompt, max_new) in enumerate(schedule):
            if arrive == step:
                ids[i] = _add(se, prompt, max_new)
        se.step()
        step += 1
        assert step < 200
    assert se.pool.num_free == se.pool.capacity and not se.scheduler.running  # no leak
    return [h.output for h in ids]


def _solo(target, schedule) -> list:
    eng = Engine(target, None, max_context=64, max_batch=1)
    return [eng.generate([p], m).tokens[0].tolist() for _, p, m in schedule]


@pytest.mark.parametrize("kind", ["eagle3", "adaptive"])
def test_served_outputs_equal_solo_plain_and_nothing_recompiles(kind):
    if kind == "eagle3":
        target, drafter = _eagle3_pair()
        eng = Engine(target, drafter, spec=CHAIN, **KW)
    else:
        target = load_pair(DEFAULT_WEIGHTS)
        eng = Engine(target, MTPDrafter(target), spec=(CHAIN, TREE), adaptive=AdaptivePolicy(probe_interval=2, probe_requests=1), **KW)
        eng.round_costs[2] = np.ones((3,), np.float32)  # equal costs (CPU timings are noise): every mode competes
        eng.round_costs[1] = np.full((3,), 2.0, np.float32)  # slot bucket 1's own (equal again)
    se = ServingEngine(eng, rounds_per_step=2, max_prefill_tokens=8)
    se.warmup()  # slot buckets 1 and 2, chunk bucket 8
    priced = []  # (slot bucket, the costs its decode was given)
    decode_slots = eng.decode_slots

    def priced_decode(state, *, bucket, **kw):  # the policy's price as the decode is given it
        priced.append((bucket, np.asarray(state.policy.round_cost)) if state.policy is not None else (bucket, None))
        return decode_slots(state, bucket=bucket, **kw)

    eng.decode_slots = priced_decode
    vocab = int(target.vocab_size)
    first = _schedule(vocab, 0)
    assert _drive(se, first) == _solo(target, first)
    if kind == "adaptive":
        rounds = np.asarray(se._state.policy.mode_rounds)
        assert rounds[1] > 0 and rounds[2] > 0, rounds  # both draft shapes ran
    # the same prompts (so the same prompt buckets) in another order and other arrival steps
    again = [(a, p, m) for a, (_, p, m) in zip((0, 2, 2, 2, 5), reversed(first))]
    want = _solo(target, again)
    counter = CompileCounter()
    assert _drive(se, again) == want
    assert counter.count == 0
    if kind == "adaptive":
        lone = [(0, first[1][1], 9)]  # alone in slot 0: slot bucket 1
        assert _drive(se, lone) == _solo(target, lone)
        assert {b for b, _ in priced} == {1, 2}
        for b, cost in priced:  # the bucket's in-loop costs plus the step overhead (far below a second here)
            low = {1: 2.0, 2: 1.0}[b]
            assert np.all((cost >= low - 1e-6) & (cost < low + 0.5)), (b, cost)
