"""``jaxspec.serving.costs.StepCosts``: the overhead per round is the median of what steps took beyond their rounds'
in-loop cost, and it shifts every mode's price equally."""

import numpy as np
import pytest

from jaxspec.engine.policy import init_policy_state
from jaxspec.serving.costs import StepCosts


def test_no_steps_means_the_in_loop_costs():
    c = StepCosts([1e-3, 2.5e-3])
    assert c.overhead == 0.0
    np.testing.assert_array_equal(c.round_cost(), np.float32([1e-3, 2.5e-3]))
    assert c.round_cost().dtype == np.float32


def test_overhead_is_the_median_per_round():
    base = np.array([1e-3, 2.5e-3])
    c = StepCosts(base, window=5)
    # steps of 4 plain rounds with 6 ms of overhead (1.5 ms per round), one that compiled (2 s), one mixed step
    for _ in range(3):
        c.observe(4 * 1e-3 + 6e-3, [4, 0])
    c.observe(2.0, [4, 0])
    c.observe(1e-3 + 3 * 2.5e-3 + 6e-3, [1, 3])
    assert c.overhead == pytest.approx(1.5e-3)
    np.testing.assert_allclose(c.round_cost(), base + 1.5e-3, rtol=1e-6)


def test_the_window_forgets_old_steps():
    c = StepCosts([1e-3], window=2)
    c.observe(1e-3 + 9e-3, [1])
    c.observe(2e-3, [2])
    c.observe(2e-3, [2])
    assert c.overhead == 0.0


def test_a_step_faster_than_its_rounds_costs_nothing_extra():
    c = StepCosts([2e-3, 4e-3])
    c.observe(1e-3, [2, 0])
    assert c.overhead == 0.0


def test_a_step_without_rounds_is_skipped():
    c = StepCosts([1e-3, 2e-3])
    c.observe(5.0, [0, 0])
    assert c.overhead == 0.0


def test_overhead_can_turn_the_policy_to_speculation():
    """In-loop, a shape accepting 2 per round at 2.5x plain's cost loses (2/2.5 < 1); with 1.5x plain's cost of
    step overhead per round it wins ((2 / 4) > (1 / 2.5))."""
    c = StepCosts([1e-3, 2.5e-3])
    accept = np.array([1.0, 2.0])
    assert np.argmax(accept / c.round_cost()) == 0
    c.observe(4e-3 + 6e-3, [4, 0])
    assert np.argmax(accept / c.round_cost()) == 1
    init_policy_state(c.round_cost(), [1.0, 4.0])  # a valid policy cost vector


@pytest.mark.parametrize("base, window, match", [
    ([0.0, 1e-3], 8, "base"), ([np.nan], 8, "base"), ([], 8, "base"), ([[1e-3]], 8, "base"),
    ([1e-3], 0, "window"), ([1e-3], True, "window"), ([1e-3], 2.0, "window"),
])
def test_bad_arguments_are_named(base, window, match):
    with pytest.raises(ValueError, match=match):
        StepCosts(base, window=window)


def test_bad_rounds_are_named():
    c = StepCosts([1e-3, 2e-3])
    with pytest.raises(ValueError, match="rounds"):
        c.observe(1.0, [1])
    with pytest.raises(ValueError, match="rounds"):
        c.observe(1.0, [1, -1])


def _adaptive_pair(layers: int):
    """``(target, engine)``: a small random MTP target and an adaptive engine over one draft shape, 2 slots."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.config import SpecConfig
    from jaxspec.engine import AdaptivePolicy, Engine
    from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel

    cfg = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                        rope_theta=10000.0)
    target = MTPModel(cfg, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_mtp_layers=1, num_draft_steps=2)
    eng = Engine(target, MTPDrafter(target), spec=(SpecConfig(num_steps=2, topk=1, num_draft_tokens=3),),
                 adaptive=AdaptivePolicy(), max_context=48, page_size=4, max_batch=2, num_pages=32)
    return target, eng


def test_an_adaptive_core_prices_its_policy_with_the_step_overhead():
    """After steps of an adaptive core, the policy state's round costs are the calibrated ones plus the measured
    overhead per round (> 0: a step costs host time beyond its rounds), and greedy output stays its own."""
    from jaxspec.engine import Engine
    from jaxspec.serving import RequestParams, ServingEngine
    from jaxspec.serving.core import REPRICE_TOLERANCE

    target, eng = _adaptive_pair(layers=2)
    base = np.float32([1e-6, 2e-6])
    eng.round_costs[2] = base
    se = ServingEngine(eng, rounds_per_step=2)
    prompts = [np.arange(3, 9, dtype=np.int32), np.arange(5, 8, dtype=np.int32)]
    given = []  # (the policy's round costs a decode was given, the overhead then)
    decode_slots = eng.decode_slots
    eng.decode_slots = lambda state, **kw: (given.append((np.asarray(state.policy.round_cost),
                                                          se.step_costs.overhead)) or decode_slots(state, **kw))
    out = se.generate(prompts, RequestParams(max_new_tokens=9))
    assert se.step_costs.overhead > 0 and len(given) >= 2
    for cost, overhead in given:  # the prices the state holds: within the re-pricing tolerance of the current
        assert np.all(np.abs(cost - (base + overhead)) <= REPRICE_TOLERANCE * cost * (1 + 1e-5)), (cost, overhead)
    assert given[-1][1] > 0  # the later steps are priced with the measured overhead
    modes = se.stats().mode_rounds  # the batch's rounds per mode, as the policy counted them
    assert len(modes) == 2 and 0 < sum(modes) == int(np.sum(np.asarray(se._state.policy.mode_rounds)))
    solo = Engine(target, None, max_context=48, max_batch=1)
    assert out == [solo.generate([p], 9).tokens[0].tolist() for p in prompts]


def test_an_adaptive_core_reprices_only_when_a_price_moves():
    """The policy's prices are a new device array only when the slot bucket changes or a price moves by more than
    ``REPRICE_TOLERANCE``; otherwise the decode is given the state as it is (the donated buffer stays in place, so
    no command buffer that reads it is updated on a GPU)."""
    from jaxspec.serving import ServingEngine
    from jaxspec.serving.core import REPRICE_TOLERANCE

    _, eng = _adaptive_pair(layers=1)
    eng.round_costs[2] = np.float32([1e-3, 2e-3])
    eng.round_costs[1] = np.float32([0.8e-3, 1.2e-3])
    se = ServingEngine(eng, rounds_per_step=2)

    class Overhead:  # StepCosts' overhead, set by the test
        overhead = 1e-3

    se.step_costs = Overhead()

    def priced(bucket):
        st = se._decode_state(bucket)
        if st is se._state:
            return None  # no new prices: the state as it is
        se._state = st
        return np.asarray(st.policy.round_cost)

    np.testing.assert_allclose(priced(2), [2e-3, 3e-3], rtol=1e-6)  # the first decode is always priced
    Overhead.overhead = 1e-3 * (1 + 0.9 * REPRICE_TOLERANCE)  # every price moves by less than the tolerance
    assert priced(2) is None
    Overhead.overhead = 1.2e-3  # plain's price moves by 10%
    np.testing.assert_allclose(priced(2), [2.2e-3, 3.2e-3], rtol=1e-6)
    assert priced(2) is None
    np.testing.assert_allclose(priced(1), [2.0e-3, 2.4e-3], rtol=1e-6)  # another bucket: its own prices
    np.testing.assert_allclose(priced(2), [2.2e-3, 3.2e-3], rtol=1e-6)  # and back
    assert priced(2) is None
