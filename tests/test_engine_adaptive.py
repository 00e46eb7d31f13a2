"""Adaptive speculation (``engine.policy``), simulated acceptance (``engine.simulate``) and ``Engine.run_decode``.

Adaptive engines must be lossless whatever mode the policy picks: greedy output == plain greedy output with
round costs that favour plain, the chain, the tree, and with calibrated costs. Simulated acceptance must
accept exactly the drawn lengths (integer means are exact: every round accepts that many nodes, the first
ones as in SGLang, clipped to S + 1). A small random MTP model keeps the compiles short; one
engine per configuration is shared by the module (every generate has the same shapes).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine, SimulatedAccept
from jaxspec.engine.policy import MAX_BACKOFF, choose_mode, init_policy_state, update_policy
from jaxspec.engine.simulate import draw_accept_lens, simulated_accept_path
from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel
from jaxspec.ops.tree import TreeMaskMode, build_chain_tree, build_tree
from jaxspec.testing import draft_lists, organize

CFG = DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)
CHAIN = SpecConfig(3, 1, 4)
TREE = SpecConfig(3, 2, 6)
KW = dict(max_context=96, page_size=8, max_batch=4)
MAX_NEW = 20


@pytest.fixture(scope="module")
def model():
    return MTPModel(CFG, rngs=nnx.Rngs(7), kv_dtype=jnp.float32, num_mtp_layers=3)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(0, CFG.vocab_size, n).astype(np.int32) for n in (5, 9, 3)]


@pytest.fixture(scope="module")
def plain(model, prompts):
    return Engine(model, None, **KW).generate(prompts, MAX_NEW)


@pytest.fixture(scope="module")
def adaptive(model):
    return Engine(model, MTPDrafter(model), spec=(CHAIN, TREE), adaptive=AdaptivePolicy(probe_interval=4), **KW)


def _same(a, b):
    assert len(a.tokens) == len(b.tokens)
    for x, y in zip(a.tokens, b.tokens):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("favour", [0, 1, 2])
def test_adaptive_lossless_in_every_mode(adaptive, plain, prompts, favour):
    """Costs favouring one mode: that mode runs (bar probes) and the output is plain greedy decoding's."""
    costs = np.full((3,), 50.0, np.float32)
    costs[favour] = 1.0
    adaptive.round_costs[4] = costs
    res = adaptive.generate(prompts, MAX_NEW)
    _same(res, plain)
    assert res.mode_rounds.shape == (3,)
    assert int(np.argmax(res.mode_rounds)) == favour, res.mode_rounds
    if favour == 0:  # a draft shape at 50x plain's cost cannot win even accepting all 4 nodes: never probed
        assert res.mode_rounds[1:].sum() == 0, res.mode_rounds


def test_adaptive_calibrated(adaptive, plain, prompts):
    """An uncalibrated bucket is measured on first use: 3 positive costs, then a lossless generate."""
    adaptive.round_costs.clear()
    res = adaptive.generate(prompts, MAX_NEW)
    assert set(adaptive.round_costs) == {4} and adaptive.round_costs[4].shape == (3,)
    assert np.all(adaptive.round_costs[4] > 0)
    _same(res, plain)


def test_calibration_rows_ignore_the_stop_token(adaptive):
    """Calibration times full rounds: a row that draws the EOS keeps decoding (a finished row would make the timed
    calls run empty rounds and price every mode at ~0). The EOS is the token calibration's first round drew."""
    calls = []
    run_decode = adaptive.run_decode

    def spy(state, **kw):
        rows, before = ~np.asarray(state.done), np.asarray(state.num_generated)  # run_decode donates state
        out = run_decode(state, **kw)
        new = np.asarray(out.num_generated) - before
        last = np.asarray(out.out_tokens)[0, int(out.num_generated[0]) - 1]
        calls.append((kw["max_rounds"], rows, new, np.asarray(out.done), int(last)))
        return out

    eos_id, costs = adaptive.eos_id, dict(adaptive.round_costs)
    try:
        adaptive.run_decode = spy
        adaptive.calibrate(2)
        adaptive.eos_id = calls[0][4]
        calls.clear()
        adaptive.calibrate(2)
    finally:
        del adaptive.run_decode
        adaptive.eos_id = eos_id
        adaptive.round_costs.clear()
        adaptive.round_costs.update(costs)
    assert calls
    for trips, rows, new, done, _ in calls:
        assert rows[:2].all() and not done[:2].any()
        assert (new[:2] >= trips).all(), (trips, new)


@pytest.mark.slow
def test_adaptive_sampling_keeps_greedy_rows(adaptive, plain, prompts):
    """A sampling batch (its own executable) keeps its temperature-0 rows plain greedy in every mode."""
    for favour in range(3):
        costs = np.full((3,), 50.0, np.float32)
        costs[favour] = 1.0
        adaptive.round_costs[4] = costs
        mixed = adaptive.generate(prompts, MAX_NEW, temperature=[0.0, 0.9, 0.0], seed=[1, 2, 3])
        assert int(np.argmax(mixed.mode_rounds)) == favour
        for i in (0, 2):
            np.testing.assert_array_equal(mixed.tokens[i], plain.tokens[i])


def test_adaptive_loop_has_no_conditional(adaptive, prompts):
    """The compiled adaptive loop is nested ``while`` loops only (``step.decode_loop``): a conditional carrying the
    state copies buffers (measured on the H200: the ``lax.switch`` version ran 7.5% under the fixed chain at
    batch 8, mean 2.0, the loop of segments 0.6-0.9%). Outer loop, one
    segment per mode (plain, chain, tree), each mode's own inner loops (here the tree mask's pointer jumps are
    unrolled): at least 4 ``while``s and no ``case`` / ``if`` in the lowered decode."""
    state, _, _ = adaptive.prepare(prompts, MAX_NEW)
    text = adaptive._entry_points(False).decode.lower(adaptive.params, state, np.int32(-1), np.int32(5), np.bool_(False),
                                                          bucket=state.done.shape[0]).as_text()
    assert text.count("stablehlo.case") == 0 and text.count("stablehlo.if") == 0
    assert text.count("stablehlo.while") >= 4


def test_policy_choice_probe_and_average():
    ps = init_policy_state([1.0, 2.0, 4.0], [1.0, 4.0, 4.0])
    pol = AdaptivePolicy(ema_weight=0.5, probe_interval=3, probe_rounds=1, probe_requests=1)
    np.testing.assert_array_equal(np.asarray(ps.seen), [1, 0, 0])
    assert int(choose_mode(pol, ps)) == 1  # optimistic start: 4/2 beats 1/1 and 4/4
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(3.0))  # first chain round: 3 replaces the start 4
    np.testing.assert_allclose(np.asarray(ps.accept), [1.0, 3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(ps.idle), [1, 0, 1])
    np.testing.assert_array_equal(np.asarray(ps.mode_rounds), [0, 1, 0])
    assert int(ps.seen[1]) == 1  # one request-round since the restart
    np.testing.assert_array_equal(np.asarray(ps.backoff), [1, 1, 1])  # 3/2 is the best rate: no back-off
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(0.5))  # then averaged: (3 + 0.5) / 2 = 1.75
    np.testing.assert_allclose(np.asarray(ps.accept), [1.0, 1.75, 4.0])
    np.testing.assert_array_equal(np.asarray(ps.backoff), [1, 2, 1])  # 0.875 lost to plain's 1: back-off doubles
    assert int(choose_mode(pol, ps)) == 0

    def plain_rounds(ps, n):
        for _ in range(n):
            ps = update_policy(pol, ps, jnp.int32(0), jnp.float32(1.0))
        return ps

    # The chain's probe waits probe_interval * backoff rounds of its own cost: 3 * 2 * 2 = 12 plain rounds
    # (idle counts from its last round); the tree (4/4) can never beat plain's 1/1, so it is never probed.
    ps = plain_rounds(ps, 11)
    assert int(ps.idle[1]) == 11 and int(choose_mode(pol, ps)) == 0
    ps = plain_rounds(ps, 1)
    assert int(choose_mode(pol, ps)) == 1
    # a probe after >= probe_interval idle rounds measures afresh: its round replaces the old 1.75; lost: back-off 4
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0))
    np.testing.assert_allclose(np.asarray(ps.accept), [1.0, 1.0, 4.0])
    assert int(ps.seen[1]) == 1  # one request-round since the restart
    np.testing.assert_array_equal(np.asarray(ps.backoff), [1, 4, 1])
    ps = plain_rounds(ps, 23)
    assert int(choose_mode(pol, ps)) == 0  # 23 < 3 * 4 * 2
    ps = plain_rounds(ps, 1)
    assert int(choose_mode(pol, ps)) == 1
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(4.0))  # a won probe: 4 / 2 > 1, back-off reset
    np.testing.assert_allclose(float(ps.accept[1]), 4.0)
    np.testing.assert_array_equal(np.asarray(ps.backoff), [1, 1, 1])
    assert int(choose_mode(pol, ps)) == 1
    ps = dataclasses.replace(ps, round_cost=jnp.asarray([1.0, 5.0, 5.0]))
    assert int(choose_mode(pol, ps)) == 0  # 4/5 can never beat plain: no probe
    np.testing.assert_allclose(np.asarray(ps.accept)[0], 1.0)  # plain's accept never moves


def test_policy_probes_run_probe_rounds_and_average_them():
    """A speculative mode, once it runs, runs ``probe_rounds`` rounds in a row and is judged on their mean (weights
    ``max(ema_weight, 1/n)``): one bad round does not switch it off; the back-off doubles once per lost probe."""
    pol = AdaptivePolicy(ema_weight=0.25, probe_interval=2, probe_rounds=3, probe_requests=1)
    ps = init_policy_state([1.0, 1.5], [1.0, 4.0])
    assert int(choose_mode(pol, ps)) == 1  # optimistic 4 / 1.5
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0))  # rate 1/1.5 < plain, yet the probe goes on
    assert int(choose_mode(pol, ps)) == 1 and int(ps.backoff[1]) == 1
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(2.0))  # weight 1/2: mean 1.5
    np.testing.assert_allclose(float(ps.accept[1]), 1.5)
    assert int(choose_mode(pol, ps)) == 1
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.5))  # weight 1/3: mean 1.5; 1.5 / 1.5 = plain's 1
    np.testing.assert_allclose(float(ps.accept[1]), 1.5)
    np.testing.assert_array_equal(np.asarray(ps.seen), [1, 3])
    np.testing.assert_array_equal(np.asarray(ps.streak), [0, 3])
    assert int(ps.backoff[1]) == 1  # a tie is no loss
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(0.5))  # weight 1/4 = ema_weight: 1.25, lost: back-off 2
    np.testing.assert_allclose(float(ps.accept[1]), 1.25)
    assert int(ps.backoff[1]) == 2 and int(choose_mode(pol, ps)) == 0
    ps = update_policy(pol, ps, jnp.int32(0), jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(ps.streak), [1, 0])
    for _ in range(5):  # probe due after probe_interval * backoff = 4 rounds of its cost: 6 plain rounds
        assert int(choose_mode(pol, ps)) == 0
        ps = update_policy(pol, ps, jnp.int32(0), jnp.float32(1.0))
    assert int(choose_mode(pol, ps)) == 1
    for accept in (1.0, 1.0):  # a losing probe: the back-off doubles once, at its last round
        ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(accept))
        assert int(choose_mode(pol, ps)) == 1 and int(ps.backoff[1]) == 2
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0))
    assert int(ps.backoff[1]) == 4 and int(choose_mode(pol, ps)) == 0
    with pytest.raises(ValueError, match="probe_rounds"):
        AdaptivePolicy(probe_rounds=0)


def test_policy_backoff_is_capped_and_warm_start_keeps_learning():
    pol = AdaptivePolicy(probe_interval=1)
    ps = init_policy_state([1.0, 2.0], [1.0, 4.0])
    for _ in range(20):  # every chain round loses to plain: the back-off doubles up to its cap
        ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0))
    assert int(ps.backoff[1]) == MAX_BACKOFF
    warm = init_policy_state([1.0, 3.0], [1.0, 4.0], learned=ps)
    np.testing.assert_allclose(np.asarray(warm.round_cost), [1.0, 3.0])  # the given costs, not the learned ones
    for f in ("accept", "seen", "idle", "backoff"):
        np.testing.assert_array_equal(np.asarray(getattr(warm, f)), np.asarray(getattr(ps, f)), err_msg=f)
    np.testing.assert_array_equal(np.asarray(warm.mode_rounds), [0, 0])  # statistics are per call
    assert int(choose_mode(pol, warm)) == 0  # no optimistic restart: the learned 1.0 / 3.0 loses to plain
    with pytest.raises(ValueError, match="learned"):
        init_policy_state([1.0, 2.0, 2.0], [1.0, 4.0, 4.0], learned=ps)


def test_engine_warm_start(adaptive, model, prompts, plain):
    """The engine carries a bucket's learned policy to its next call (and only with warm_start)."""
    adaptive.policy_memory.clear()
    adaptive.round_costs[4] = np.asarray([1.0, 1.5, 1.6], np.float32)  # every shape worth exploring
    first = adaptive.generate(prompts, MAX_NEW)
    assert set(adaptive.policy_memory) == {4}
    learned = jax.tree.map(np.asarray, adaptive.policy_memory[4])
    assert (learned.seen > 0).all(), learned
    np.testing.assert_array_equal(learned.mode_rounds, first.mode_rounds)
    second = adaptive.generate(prompts, MAX_NEW)
    _same(first, plain)
    _same(second, plain)
    state = adaptive.prepare(prompts, MAX_NEW)[0]
    np.testing.assert_array_equal(np.asarray(state.policy.seen) > 0, [True, True, True])
    # a forced-mode call (what calibrate runs) teaches nothing
    before = jax.tree.map(np.asarray, adaptive.policy_memory[4])
    adaptive.run_decode(adaptive.run_prefill(*adaptive.prepare(prompts, MAX_NEW)), mode=0)
    np.testing.assert_array_equal(np.asarray(adaptive.policy_memory[4].idle), before.idle)
    cold = Engine(model, MTPDrafter(model), spec=(CHAIN, TREE), adaptive=AdaptivePolicy(warm_start=False), **KW)
    cold.round_costs[4] = adaptive.round_costs[4]
    cold.policy_memory[4] = adaptive.policy_memory[4]
    np.testing.assert_array_equal(np.asarray(cold.prepare(prompts, MAX_NEW)[0].policy.seen), [1, 0, 0])
    with pytest.raises(ValueError, match="warm_start"):
        AdaptivePolicy(warm_start=1)


@pytest.mark.parametrize("bad, match", [
    (dict(ema_weight=0.0), "ema_weight"), (dict(ema_weight=1.5), "ema_weight"), (dict(probe_interval=0), "probe_interval"), (dict(probe_requests=0), "probe_requests"),
])
def test_policy_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        AdaptivePolicy(**bad)
    with pytest.raises(ValueError, match="round_cost"):
        init_policy_state([1.0, 0.0], [1.0, 4.0])


def test_engine_argument_errors(model):
    d = MTPDrafter(model)
    with pytest.raises(ValueError, match="needs adaptive=True"):
        Engine(model, d, spec=[CHAIN, TREE], **KW)
    with pytest.raises(ValueError, match="distinct SpecConfigs"):
        Engine(model, d, spec=[CHAIN, CHAIN], adaptive=True, **KW)
    with pytest.raises(ValueError, match="adaptive: expected"):
        Engine(model, d, spec=CHAIN, adaptive="yes", **KW)
    with pytest.raises(ValueError, match="simulate_accept: needs speculative"):
        Engine(model, None, simulate_accept=SimulatedAccept(mean=2.0), **KW)
    eng = Engine(model, d, spec=CHAIN, **KW)
    with pytest.raises(ValueError, match="mode: expected"):
        eng.run_decode(None, mode=0)
    with pytest.raises(ValueError, match="calibrate: only adaptive"):
        eng.calibrate(1)


@pytest.mark.parametrize("bad, match", [
    (dict(), "exactly one"), (dict(mean=2.0, probs=(1.0,)), "exactly one"), (dict(mean=0.5), "mean"),
    (dict(mean=float("nan")), "mean"), (dict(probs=(0.0, 0.0)), "probs"), (dict(probs=(0.5, -0.1)), "probs"),
])
def test_simulated_accept_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        SimulatedAccept(**bad)


def test_simulated_accept_tables_and_draws():
    np.testing.assert_allclose(SimulatedAccept(mean=2.25).table(4), [0, 0.75, 0.25, 0])
    np.testing.assert_allclose(SimulatedAccept(mean=7.0).table(4), [0, 0, 0, 1])  # clipped to S + 1
    np.testing.assert_allclose(SimulatedAccept(probs=(1, 1, 1, 1, 4)).table(3), [0.125, 0.125, 0.75])
    keys = jax.random.split(jax.random.key(5), 20000)
    lens = np.asarray(draw_accept_lens(jnp.asarray([0.1, 0.2, 0.3, 0.4], jnp.float32), keys))
    assert lens.min() >= 1 and lens.max() <= 4
    # 20000 draws: each frequency within 5 standard errors (<= 0.017) of its probability
    np.testing.assert_allclose(np.bincount(lens, minlength=5)[1:] / lens.size, [0.1, 0.2, 0.3, 0.4], atol=0.02)


def test_simulated_accept_path_follows_first_children():
    b, seq = 2, jnp.array([5, 9], jnp.int32)
    bonus = jnp.array([1, 2], jnp.int32)
    chain = build_chain_tree(bonus, jnp.array([[10, 11, 12], [20, 21, 22]], jnp.int32), seq, config=CHAIN)
    predict = jnp.full((b * 4,), -7, jnp.int32)
    logits = jax.nn.one_hot(jnp.arange(b * 4) % 32, 32)  # the target's argmax at node g is g % 32
    p, idx, lens = simulated_accept_path(chain, predict, jnp.array([3, 9], jnp.int32), CHAIN, logits=logits)
    np.testing.assert_array_equal(np.asarray(lens), [3, 4])
    np.testing.assert_array_equal(np.asarray(idx), [[0, 1, 2, -1], [4, 5, 6, 7]])
    # accepted nodes but the last predict the next draft; the last gets the target's argmax
    np.testing.assert_array_equal(np.asarray(p), [10, 11, 2, -7, 20, 21, 22, 7])
    # a tree: the first L nodes, as SGLang's simulation (the work of an L-node accept, path or not)
    lists = draft_lists(np.random.default_rng(0), b, TREE.num_steps, TREE.topk, vocab=32)
    parent_list, top_index, draft = organize(lists[0], lists[1], lists[2], TREE.num_draft_tokens)
    tree = build_tree(bonus, jnp.asarray(parent_list, jnp.int32), jnp.asarray(top_index, jnp.int32),
                      jnp.asarray(draft, jnp.int32), seq, config=TREE, mask_mode=TreeMaskMode.QLEN_ONLY)
    n = TREE.num_draft_tokens
    p, idx, lens = simulated_accept_path(tree, jnp.zeros((b * n,), jnp.int32), jnp.array([4, 0], jnp.int32), TREE)
    tok = np.asarray(tree.draft_tokens)
    np.testing.assert_array_equal(np.asarray(lens), [4, 1])  # 0 is clipped to 1 (the root alone)
    np.testing.assert_array_equal(np.asarray(idx), [[0, 1, 2, 3], [n, -1, -1, -1]])
    np.testing.assert_array_equal(np.asarray(p)[:3], tok[1:4])
    assert not np.asarray(p)[4:].any() and not np.asarray(p)[n:].any()


@pytest.mark.parametrize("spec, mean, want", [(CHAIN, 3.0, 3.0), (CHAIN, 9.0, 4.0), (TREE, 3.0, 3.0)])
def test_engine_simulated_accept_is_exact_for_integer_means(model, prompts, spec, mean, want):
    eng = Engine(model, MTPDrafter(model), spec=spec, simulate_accept=SimulatedAccept(mean=mean), **KW)
    res = eng.generate(prompts, MAX_NEW)
    assert res.mean_accept_length == want
    assert [len(t) for t in res.tokens] == [MAX_NEW] * len(prompts)


def test_run_decode_matches_generate_and_stops_at_max_rounds(model, prompts):
    eng = Engine(model, MTPDrafter(model), spec=CHAIN, **KW)
    ref = eng.generate(prompts, MAX_NEW)
    state = eng.run_prefill(*eng.prepare(prompts, MAX_NEW))
    part = eng.run_decode(state, max_rounds=2)
    assert np.asarray(part.num_rounds)[: len(prompts)].tolist() == [2] * len(prompts)
    _same(Engine.result(eng.run_decode(part), len(prompts)), ref)


def test_policy_weighs_a_round_by_its_requests():
    """A round of ``n`` active requests weighs as ``n`` request-rounds of ``ema_weight`` each (once the average has
    ``1 / ema_weight`` of them): the same as ``n`` one-request rounds of that mean; a round of none changes nothing."""
    pol = AdaptivePolicy(ema_weight=0.125, probe_interval=1000, probe_rounds=1)
    ps = init_policy_state([1.0, 1.2], [1.0, 4.0])
    ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(3.0), jnp.int32(16))  # first round replaces the start
    np.testing.assert_allclose(float(ps.accept[1]), 3.0)
    assert int(ps.seen[1]) == 16
    one = ps
    for _ in range(8):
        one = update_policy(pol, one, jnp.int32(1), jnp.float32(2.0), jnp.int32(1))
    many = update_policy(pol, ps, jnp.int32(1), jnp.float32(2.0), jnp.int32(8))
    np.testing.assert_allclose(float(many.accept[1]), float(one.accept[1]), rtol=1e-6)
    np.testing.assert_allclose(float(many.accept[1]), 2.0 + (1 - 0.125) ** 8, rtol=1e-6)
    none = update_policy(pol, many, jnp.int32(1), jnp.float32(0.0), jnp.int32(0))
    np.testing.assert_allclose(float(none.accept[1]), float(many.accept[1]))
    # before 1 / ema_weight = 8 request-rounds, their plain mean: 2 at 3.0, then 1 at 1.0 -> 7 / 3
    few = init_policy_state([1.0, 1.2], [1.0, 4.0])
    few = update_policy(pol, few, jnp.int32(1), jnp.float32(3.0), jnp.int32(2))
    few = update_policy(pol, few, jnp.int32(1), jnp.float32(1.0), jnp.int32(1))
    np.testing.assert_allclose(float(few.accept[1]), 7 / 3, rtol=1e-6)


@pytest.mark.parametrize("mean_accept", [2.1, 1.1])
def test_policy_at_batch_one_keeps_the_better_mode(mean_accept):
    """At batch 1 a round's accept length is a single draw (1 to ``S + 1``): the policy must not switch a chain that
    pays (mean accept 2.1 where 1.2 breaks even: the chain-of-3 round costs 1.2 plain rounds, as measured on the
    GPU) off on a run of rejections, nor keep a chain that does not pay (mean 1.1). Rounds drawn from a chain
    whose drafts are accepted with probability ``a`` each (mean ``1 + a + a**2 + a**3``), fresh seed; tokens per
    unit of cost over 600 rounds >= 0.93 of the better fixed mode's expectation (the draws' own noise is ~2%)."""
    pol = AdaptivePolicy()
    cost = [1.0, 1.2]
    choose = jax.jit(lambda ps: choose_mode(pol, ps))
    update = jax.jit(lambda ps, m, acc: update_policy(pol, ps, m, acc, jnp.int32(1)))
    a = next(x for x in np.linspace(0, 1, 100001) if 1 + x + x**2 + x**3 >= mean_accept)
    rng = np.random.default_rng()
    ps = init_policy_state(cost, [1.0, 4.0])
    tokens = spent = 0.0
    for _ in range(600):
        mode = int(choose(ps))
        accept = 1.0 if mode == 0 else 1.0 + float(np.argmin(np.append(rng.random(3) < a, False)))
        ps = update(ps, jnp.int32(mode), jnp.float32(accept))
        tokens, spent = tokens + accept, spent + cost[mode]
    best = max(1.0 / cost[0], mean_accept / cost[1])
    assert tokens / spent >= 0.93 * best, (tokens / spent, best, np.asarray(ps.mode_rounds))


def test_policy_fresh_average_runs_until_probe_requests():
    """A fresh average (a mode's first run) goes on past ``probe_rounds`` rounds until it holds ``probe_requests``
    request-rounds: at batch 1 that is ``probe_requests`` rounds, at batch 16 the first round; then it is judged."""
    pol = AdaptivePolicy(probe_interval=1000, probe_rounds=2, probe_requests=6)
    for rows, rounds in ((1, 6), (16, 2), (4, 2), (3, 2), (2, 3)):
        ps = init_policy_state([1.0, 1.5], [1.0, 4.0])
        ran = 0
        while int(choose_mode(pol, ps)) == 1:  # every round accepts 1: the chain loses once judged
            ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0), jnp.int32(rows))
            ran += 1
        assert ran == rounds, (rows, ran)
        assert int(ps.backoff[1]) == 2


def test_calibration_prices_rounds_it_cannot_time_by_the_whole_call(adaptive, monkeypatch):
    """Where a mode's extra rounds time at or below the one-round call (rounds cheaper than the clock's noise: every
    call here takes one tick), every mode is priced at its longer call's time per round, not at ~0 (which the
    policy would choose whatever the mode accepts); with a clock that resolves them, the calls' difference."""
    import jaxspec.engine.calibrate as cal

    ticks = iter(range(10**6))
    monkeypatch.setattr(cal.time, "perf_counter", lambda: float(next(ticks)))  # every call takes one tick
    costs = dict(adaptive.round_costs)
    try:
        got = adaptive.calibrate(2, rounds=3)
        np.testing.assert_allclose(got, [1 / 4] * 3)
        clock = [0.0]

        def tick():  # a call of n rounds takes 1 + n ticks (read before and after each call: + n on the second)
            clock[0] += 0.5
            return clock[0]

        calls = []
        run_decode = adaptive.run_decode

        def spy(state, **kw):
            calls.append(kw["max_rounds"])
            clock[0] += kw["max_rounds"]
            return run_decode(state, **kw)

        monkeypatch.setattr(cal.time, "perf_counter", tick)
        monkeypatch.setattr(adaptive, "run_decode", spy)
        got = adaptive.calibrate(2, rounds=3)
        np.testing.assert_allclose(got, [1.0] * 3)  # (4.5 - 1.5 ticks) / 3 extra rounds
        assert set(calls) == {1, 4}
    finally:
        adaptive.round_costs.clear()
        adaptive.round_costs.update(costs)


def test_policy_probe_wait_grows_with_the_probe_length():
    """A probe that must run ``ceil(probe_requests / rows)`` rounds (more than ``probe_rounds``: a small batch) waits
    that much longer, so probing a losing shape costs the same share of the time at batch 1 as at batch 8; the
    warm start keeps the batch size it planned for."""
    pol = AdaptivePolicy(probe_interval=2, probe_rounds=2, probe_requests=8)
    for rows, probe, wait in ((8, 2, 5), (4, 2, 5), (2, 4, 10), (1, 8, 20)):
        n = jnp.int32(rows)
        ps = init_policy_state([1.0, 1.25], [1.0, 4.0])
        ran = 0
        while int(choose_mode(pol, ps)) == 1:  # accepting 1 a round: 1 / 1.25 loses to plain once judged
            ps = update_policy(pol, ps, jnp.int32(1), jnp.float32(1.0), n)
            ran += 1
        assert ran == probe and int(ps.backoff[1]) == 2 and int(ps.rows) == rows, (rows, ran)
        idle = 0  # due after probe_interval * backoff * cost * (probe / probe_rounds) = 2 * 2 * 1.25 * stretch
        while int(choose_mode(pol, ps)) == 0:
            ps = update_policy(pol, ps, jnp.int32(0), jnp.float32(1.0), n)
            idle += 1
        assert idle == wait, (rows, idle)
        assert int(init_policy_state([1.0, 1.25], [1.0, 4.0], learned=ps).rows) == rows
    assert int(init_policy_state([1.0, 1.25], [1.0, 4.0]).rows) == 1  # before any round: planned for one


@pytest.mark.parametrize("seed", range(6))
def test_a_run_of_plain_rounds_is_one_policy_update(seed):
    """From random policy states that choose plain: ``plain_rounds_left`` is the number of rounds ``choose_mode``
    goes on choosing plain under one ``update_policy`` per round (rows fixed), at most that many when rows fall
    during the run, and ``advance_plain`` over any prefix of the run equals the per-round updates, every field."""
    from jaxspec.engine.policy import PolicyState, advance_plain, plain_rounds_left, update_policy

    rng = np.random.default_rng(seed)
    policy = AdaptivePolicy(probe_interval=int(rng.integers(1, 9)), probe_rounds=int(rng.integers(1, 5)),
                            probe_requests=int(rng.integers(1, 20)))
    choose = jax.jit(lambda ps: choose_mode(policy, ps))
    update = jax.jit(lambda ps, rows: update_policy(policy, ps, jnp.int32(0), jnp.float32(1.0), rows))
    left_fn = jax.jit(lambda ps: plain_rounds_left(policy, ps))
    tried = 0
    while tried < 8:
        m = 3
        top = np.float32([1.0, 4.0, 8.0])
        cost = rng.uniform(0.5, 3.0, m).astype(np.float32)
        cost[0] = rng.uniform(0.3, 1.0)
        ps = PolicyState(round_cost=jnp.asarray(cost), max_accept=jnp.asarray(top),
                         accept=jnp.asarray(np.float32([1.0, rng.uniform(1, 2), rng.uniform(1, 3)])),
                         seen=jnp.asarray(rng.integers(1, 50, m), jnp.int32), streak=jnp.zeros((m,), jnp.int32),
                         idle=jnp.asarray(rng.integers(0, 40, m), jnp.int32),
                         backoff=jnp.asarray(rng.choice([1, 2, 4, 16], m), jnp.int32),
                         mode_rounds=jnp.asarray(rng.integers(0, 9, m), jnp.int32),
                         rows=jnp.asarray(rng.integers(1, 9), jnp.int32))
        if int(choose(ps)) != 0:
            continue
        tried += 1
        left = int(left_fn(ps))
        rows = int(ps.rows)
        st, n, total = ps, 0, 0
        while n < 300 and int(choose(st)) == 0:  # rows fixed: the policy's own count
            st = update(st, jnp.int32(rows))
            n, total = n + 1, total + rows
            if n in (1, min(left, 300) // 2 + 1, min(left, 300)):
                bulk = advance_plain(ps, jnp.int32(n), jnp.int32(total), jnp.int32(rows))
                for a, b in zip(jax.tree.leaves(bulk), jax.tree.leaves(st)):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert left == n or (left >= 300 and n == 300), (left, n)
        st, n, shrinking = ps, 0, rows
        while n < 300 and int(choose(st)) == 0:  # rows falling during the run: only longer
            shrinking = max(1, shrinking - int(rng.integers(0, 2)))
            st, n = update(st, jnp.int32(shrinking)), n + 1
        assert left <= n or n == 300
