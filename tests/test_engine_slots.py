"""The engine's slot API (``jaxspec.engine.slots``) on the shipped tiny pair, on CPU: several requests' prompts
prefilled into chosen slots in one call (with a padding chunk that writes nothing), then decoded over the slot
bucket, give each request its solo ``Engine.generate`` output; a prompt prefilled in two chunks (a non-final
one, then the last) gives the same; the rows no chunk went to are untouched; bad buckets are refused."""

import jax
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine, SamplingParams, SlotChunks, with_tables
from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair
from jaxspec.protocols import make_req_to_token

W = 48
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def model():
    return load_pair(DEFAULT_WEIGHTS)


def _chunks(eng, rows, width, following=None):
    """``SlotChunks`` of ``rows = [(slot, tokens, prefix, max_new)]`` padded to ``width``; greedy."""
    c = len(rows)
    tokens = np.zeros((c, width), np.int32)
    for i, (_, t, _, _) in enumerate(rows):
        tokens[i, : len(t)] = t
    greedy = SamplingParams(np.zeros(c, np.float32), np.full(c, eng.vocab_size, np.int32), np.ones(c, np.float32),
                            np.zeros(c, np.int32))
    return jax.device_put(SlotChunks(
        tokens=tokens, lengths=np.array([max(1, len(t)) for _, t, _, _ in rows], np.int32),
        slots=np.array([s for s, _, _, _ in rows], np.int32), prefix=np.array([p for _, _, p, _ in rows], np.int32),
        following=None if following is None else np.asarray(following, np.int32),
        max_new_tokens=np.array([m for _, _, _, m in rows], np.int32), sampling=greedy))


@pytest.mark.parametrize("spec", [None, CHAIN])
def test_prefill_into_slots_then_decode_equals_solo(model, spec):
    eng = Engine(model, None if spec is None else MTPDrafter(model), spec=spec, max_context=W, max_batch=4)
    solo = Engine(model, None, max_context=W, max_batch=1)
    rng = np.random.default_rng(3)
    a, b, c = (rng.integers(0, 64, n).astype(np.int32) for n in (5, 11, 9))
    state = eng.fresh_slots()
    state = with_tables(state, jax.device_put(make_req_to_token(4, W, 1, num_pages=eng.num_pages)))
    before = np.asarray(state.out_tokens[1]).copy(), bool(state.done[1])
    look = eng.prefill_lookahead
    # c's first 5 tokens as a non-final chunk (its next `look` tokens following), alone in its call
    state = eng.prefill_slots(state, _chunks(eng, [(3, c[:5], 0, 7)], 8, [c[5: 5 + look]]), final=False)
    # a into slot 2, b into slot 0, c's last chunk into slot 3, and a padding chunk (slot 4: out of range)
    rows = [(2, a, 0, 9), (0, b, 0, 6), (3, c[5:], 5, 7), (4, [], 0, 0)]
    state = eng.prefill_slots(state, _chunks(eng, rows, 16), final=True)
    state = eng.decode_slots(state, bucket=4, rounds=jax.device_put(np.int32(64)), first_finish=False)
    out, num = np.asarray(state.out_tokens), np.asarray(state.num_generated)
    for slot, prompt, limit in [(2, a, 9), (0, b, 6), (3, c, 7)]:
        want = solo.generate([prompt], limit).tokens[0].tolist()
        assert num[slot] == limit and out[slot, :limit].tolist() == want, slot
    assert np.array_equal(out[1], before[0]) and bool(state.done[1]) == before[1] and num[1] == 0  # untouched


def test_first_finish_and_bad_bucket(model):
    """``first_finish``: the loop leaves when the first decoding row finishes (the other row is part-way);
    a bucket that is not a power of two up to the rows is refused naming it."""
    eng = Engine(model, None, max_context=W, max_batch=2)
    state = with_tables(eng.fresh_slots(), jax.device_put(make_req_to_token(2, W, 1, num_pages=eng.num_pages)))
    state = eng.prefill_slots(state, _chunks(eng, [(0, [3, 4, 5], 0, 3), (1, [6, 7], 0, 12)], 8), final=True)
    state = eng.decode_slots(state, bucket=2, rounds=jax.device_put(np.int32(64)))
    assert np.asarray(state.num_generated).tolist() == [3, 3]
    for bad in (0, 3, 4, True):
        with pytest.raises(ValueError, match="bucket"):
            eng.decode_slots(state, bucket=bad, rounds=jax.device_put(np.int32(1)))
    with pytest.raises(ValueError, match="first_finish: expected a bool"):
        eng.decode_slots(state, bucket=2, rounds=jax.device_put(np.int32(1)), first_finish=1)
    state = eng.decode_slots(state, bucket=2, rounds=jax.device_put(np.int32(1)), first_finish=False)
    assert np.asarray(state.num_generated).tolist() == [3, 4]  # row 0 is done; row 1 runs its one round
