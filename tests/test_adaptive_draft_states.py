"""Adaptive engines keep every draft shape's drafter state whole whatever mode the rounds run.

A shape that drafts after rounds of another mode (plain decoding, or another shape) must draft from a state that
holds every committed position: the draft K/V of a position is the draft layer applied to the target's features
there and the token that follows it, which one whole-sequence prefill computes too. Shapes whose states the drafter
declares equal (``state_key``: EAGLE-3 chains of any length) share one state. A random EAGLE-3 head on a random
target in float32 (rows of different forwards agree to float32 rounding: 1e-5 here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine
from jaxspec.engine.step import PLAIN_EXTEND_WINDOW, state_groups
from jaxspec.models import Decoder, DecoderConfig, MTPDrafter, MTPModel
from jaxspec.models.eagle3 import EAGLE3Model, Eagle3Config, aux_layers_from_ids
from jaxspec.models.eagle3_drafter import EAGLE3Drafter

V = 64
TARGET = DecoderConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0)
IDS = (0, 1, 2)
SPECS = (SpecConfig(3, 1, 4), SpecConfig(5, 1, 6), SpecConfig(3, 2, 6))  # two chains (one state) and a tree
KW = dict(max_context=80, page_size=4, max_batch=2)
TOL = 1e-5


@pytest.fixture(scope="module")
def pair():
    target = Decoder(TARGET, rngs=nnx.Rngs(21), aux_layers=aux_layers_from_ids(IDS, 3), kv_dtype=jnp.float32)
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=V, aux_layer_ids=IDS)
    head = EAGLE3Model(cfg, rngs=nnx.Rngs(22), param_dtype=jnp.float32, kv_dtype=jnp.float32,
                       d2t=np.zeros((V,), np.int64))
    return target, EAGLE3Drafter(head, target)


@pytest.fixture(scope="module")
def engine(pair):
    eng = Engine(*pair, spec=SPECS, adaptive=AdaptivePolicy(), **KW)
    eng.round_costs[2] = np.ones((4,), np.float32)
    return eng


def _draft_kv(state, shape: int, row: int, upto: int):
    """The draft layer's K and V of request ``row`` at positions ``[0, upto)`` (gathered through its slots)."""
    cache = state.draft[shape].cache
    slots = np.asarray(cache.req_to_token)[row, :upto]
    return np.asarray(cache.k)[:, slots], np.asarray(cache.v)[:, slots]


def _whole_prefill(engine, state, rows):
    """A fresh prefill of each row's committed sequence (prompt + committed outputs): the reference state."""
    seq, out = np.asarray(state.seq_lens), np.asarray(state.out_tokens)
    prompts = []
    for r, p in enumerate(rows):
        done = int(seq[r]) - len(p)  # outputs committed (the last output is the pending bonus)
        prompts.append(np.concatenate([p, out[r, :done]]).astype(np.int32))
    return engine.run_prefill(*engine.prepare(prompts, 8)), prompts


@pytest.mark.parametrize("mode, rounds", [(0, 5), (0, PLAIN_EXTEND_WINDOW), (0, 2 * PLAIN_EXTEND_WINDOW + 3), (1, 3),
                                         (3, 2)])
def test_every_shape_holds_every_committed_position(engine, mode, rounds):
    """After rounds of one mode (plain, the short chain, the tree), every shape's draft K/V over the committed
    positions and its next proposal equal those of a whole-sequence prefill, and the two chains hold one state.
    Plain rounds catch the drafter up once per run of ``PLAIN_EXTEND_WINDOW`` rounds: part of a run, one whole
    run, and two whole runs plus part of a third."""
    rng = np.random.default_rng(5 + mode)
    rows = [rng.integers(0, V, n).astype(np.int32) for n in (7, 4)]
    state = engine.run_prefill(*engine.prepare(rows, 40))
    state = engine.run_decode(state, max_rounds=rounds, mode=mode)
    ref, prompts = _whole_prefill(engine, state, rows)
    np.testing.assert_array_equal(np.asarray(ref.seq_lens), np.asarray(state.seq_lens))
    np.testing.assert_array_equal(np.asarray(ref.bonus), np.asarray(state.bonus))  # the same next token
    for shape in range(len(SPECS)):
        for r, p in enumerate(prompts):
            got, want = _draft_kv(state, shape, r, len(p)), _draft_kv(ref, shape, r, len(p))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=f"mode {mode}, shape {shape}, row {r}")
        np.testing.assert_array_equal(np.asarray(state.draft[shape].topk_index),
                                      np.asarray(ref.draft[shape].topk_index), err_msg=f"shape {shape}")
        np.testing.assert_allclose(np.asarray(state.draft[shape].hidden), np.asarray(ref.draft[shape].hidden),
                                   rtol=TOL, atol=TOL)
    for a, b in zip(jax.tree.leaves(state.draft[0]), jax.tree.leaves(state.draft[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # one state for the two chains


def test_state_groups_follow_the_drafters_key(pair):
    assert state_groups(pair[1], SPECS) == [[0, 1], [2]]
    mtp = MTPModel(DecoderConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=8),
                   rngs=nnx.Rngs(0), num_mtp_layers=3)
    specs = (SpecConfig(3, 1, 4), SpecConfig(3, 1, 4), SpecConfig(2, 1, 3), SpecConfig(3, 2, 6))
    assert state_groups(MTPDrafter(mtp), specs) == [[0, 1], [2], [3]]  # MTP: a layer per step, so S matters
    assert state_groups(object(), specs) == [[0], [1], [2], [3]]  # no state_key: every shape alone
