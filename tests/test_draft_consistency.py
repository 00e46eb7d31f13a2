"""Training vs inference of the draft heads on the same prefix (a tiny random target and heads, f32).

EAGLE-3:

* Step 0: ``train_draft``'s forward at row ``c - 1`` (fed token ``c``, features of row ``c - 1``) gives the same draft
  logits as ``EAGLE3Drafter`` after the target's paged prefill of ``tokens[:c]`` with first token ``tokens[c]``, and
  as the drafter's state after every engine round (the verify-window extend), for every prefix.
* Step 1: the chain's second draft is the head run at position ``c`` over the committed draft K/V (rows
  ``0 .. c - 1``) and itself (SGLang's draft decode), checked against a dense forward of those rows;
  ``train_draft``'s step 1 at row ``c - 1`` (SpecForge's training-time test, fed the same token) gives the same
  logits.

MTP: ``train_draft``'s teacher-forced steps 0 and 1 at row ``c - 1`` give ``MTPDrafter``'s chain after the prefill
of ``tokens[:c]`` (step 1 fed the step-0 draft on both sides).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import pipeline
from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import Decoder, DecoderConfig
from jaxspec.models.eagle3 import EAGLE3Model, Eagle3Config, aux_layers_from_ids
from jaxspec.models.eagle3_drafter import EAGLE3Drafter
from jaxspec.models.mtp import add_mtp_layers
from jaxspec.models.mtp_drafter import MTPDrafter
from jaxspec.protocols import AttentionMetadata, make_req_to_token
from jaxspec.pipeline import causal_qmask
from jaxspec.models.distill import eagle3_step_logits, mtp_step_logits

V, H, F, HQ, HKV, E, VD, L = 64, 32, 64, 4, 2, 8, 48, 3
TARGET = DecoderConfig(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L, num_attention_heads=HQ,
                       num_key_value_heads=HKV, head_dim=E, rms_norm_eps=1e-5, rope_theta=10000.0)
IDS = (0, 1, 2)
T, PAGE = 14, 8
TOL = dict(rtol=2e-4, atol=2e-4)  # f32, paged vs dense attention: a few ulps on O(1) logits


@pytest.fixture(scope="module")
def pair():
    target = Decoder(TARGET, rngs=nnx.Rngs(1), aux_layers=aux_layers_from_ids(IDS, L), kv_dtype=jnp.float32)
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=VD, aux_layer_ids=IDS)
    d2t = np.sort(np.random.default_rng(2).choice(V, VD, replace=False)) - np.arange(VD)
    head = EAGLE3Model(cfg, rngs=nnx.Rngs(3), param_dtype=jnp.float32, kv_dtype=jnp.float32, d2t=d2t)
    _scale_up(head)
    tokens = np.random.default_rng(4).integers(1, V, T).astype(np.int32)
    return target, EAGLE3Drafter(head, target), tokens


def _scale_up(module, factor=3.0):
    """Matrices times ``factor``: logits far from uniform, so argmax disagreements would be visible."""
    for _, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        if var.get_value().ndim == 2:
            var.set_value(var.get_value() * factor)


def _prefill_drafts(target, drafter, tokens, starts, spec):
    """Drafter state and chain drafts after the target's paged prefill of each prefix ``tokens[:c]`` (one batch
    row each) with first token ``tokens[c]``: the engine's prefill + first ``propose``."""
    b, p = len(starts), max(starts)
    prompts = np.zeros((b, p), np.int32)
    for i, c in enumerate(starts):
        prompts[i, :c] = tokens[:c]
    lens = jnp.asarray(starts, jnp.int32)
    r2t_np = make_req_to_token(b, -(-(p + spec.num_steps + 1) // PAGE) * PAGE, PAGE)
    r2t, slots = jnp.asarray(r2t_np), int(r2t_np.max()) + 1
    meta = pipeline.prefill_metadata(lens, r2t, p, page_size=PAGE, prefix_lens=jnp.zeros((b,), jnp.int32))
    _, hidden, _ = target.forward(jnp.asarray(prompts), meta, target.make_cache(r2t, slots))
    first = jnp.asarray(tokens[np.asarray(starts)], jnp.int32)
    st = drafter.init_state(spec, r2t, slots)
    st = drafter.extend_after_prefill(spec, st, jnp.asarray(prompts), hidden, meta, lens, first)
    drafts, _ = drafter.propose(spec, st, first, pipeline.root_metadata(lens, r2t, page_size=PAGE))
    return st, np.asarray(drafts)


def _dense(head, emb, h, positions):
    """The head over ``emb, h [1, R, H]`` at ``positions [R]``, causal, no cache: pre-norm outputs ``[R, H]``."""
    r = positions.shape[0]
    meta = AttentionMetadata(positions=jnp.asarray(positions, jnp.int32)[None], qmask=causal_qmask(1, r),
                             prefix_lens=jnp.zeros((1,), jnp.int32), page_table=jnp.zeros((1, 0), jnp.int32))
    return head.forward(emb, h, meta, None)[0][0]


def test_step0_after_prefill_is_the_training_forwards_prediction(pair):
    target, drafter, tokens = pair
    head = drafter.model
    _, (step0,) = eagle3_step_logits(head, target, jnp.asarray(tokens)[None], 1)
    starts = list(range(1, T - 1))
    st, drafts = _prefill_drafts(target, drafter, tokens, starts, SpecConfig(2, 1, 3))
    rows = np.asarray(starts) - 1
    want = np.asarray(step0[0])[rows]
    np.testing.assert_allclose(np.asarray(head.logits(st.hidden)), want, **TOL)
    np.testing.assert_array_equal(drafts[:, 0], np.asarray(head.token_ids[...])[want.argmax(-1)])


def test_step0_after_every_engine_round_is_the_training_forwards_prediction(pair):
    target, drafter, tokens = pair
    head = drafter.model
    spec = SpecConfig(3, 1, 4)
    eng = Engine(target, drafter, spec=spec, max_context=48, page_size=PAGE, max_batch=1)
    state = eng.run_prefill(*eng.prepare([tokens[:5]], 16))
    seen = []  # (committed length c, bonus, the drafter's step-0 logits at row c - 1)
    while not bool(np.asarray(state.done)[0]):
        state = eng.run_decode(state, max_rounds=1)
        d = state.draft[0]
        seen.append((int(np.asarray(state.seq_lens)[0]), int(np.asarray(state.bonus)[0]),
                     np.asarray(head.logits(d.hidden))[0]))
    out = np.asarray(state.out_tokens)[0, :int(np.asarray(state.num_generated)[0])]
    seq = np.concatenate([tokens[:5], out])
    _, (step0,) = eagle3_step_logits(head, target, jnp.asarray(seq)[None], 1)
    assert len(seen) >= 3
    for c, bonus, lg in seen:
        assert seq[c] == bonus
        np.testing.assert_allclose(lg, np.asarray(step0[0, c - 1]), **TOL)


def test_step1_is_sglangs_draft_decode_and_the_training_step_1(pair):
    target, drafter, tokens = pair
    head = drafter.model
    ids = np.asarray(head.token_ids[...])
    starts = list(range(2, T - 2))
    st, drafts = _prefill_drafts(target, drafter, tokens, starts, SpecConfig(2, 1, 3))
    _, aux, _ = target.forward(jnp.asarray(tokens)[None], pipeline.dense_metadata(1, T), None)
    h0 = head.project(aux)  # [1, T, H]
    emb = target.embed_tokens[...].astype(jnp.float32)
    step0_in = emb[np.roll(tokens, -1)][None]  # row t fed token t + 1
    for i, c in enumerate(starts):
        draft0 = int(drafts[i, 0])
        h_last = jnp.asarray(st.hidden[i])[None, None]
        # SGLang: step 1 at position c over the committed rows 0 .. c - 1 and itself
        e = jnp.concatenate([step0_in[:, :c], emb[draft0][None, None]], 1)
        h = jnp.concatenate([h0[:, :c], h_last], 1)
        ref = head.logits(_dense(head, e, h, np.arange(c + 1))[-1])
        assert ids[int(jnp.argmax(ref))] == drafts[i, 1]
        # SpecForge's training-time test: step 1 of row c - 1, fed draft0 in place of token c + 1
        seq = tokens.copy()
        seq[c + 1] = draft0
        _, (_, step1) = eagle3_step_logits(head, target, jnp.asarray(seq)[None], 2)
        np.testing.assert_allclose(np.asarray(step1[0, c - 1]), np.asarray(ref), **TOL)


def test_mtp_steps_after_prefill_are_the_training_forwards_predictions():
    model = add_mtp_layers(Decoder(TARGET, rngs=nnx.Rngs(5), kv_dtype=jnp.float32), 1, rngs=nnx.Rngs(6),
                           num_draft_steps=2)
    _scale_up(model.mtp_layers)
    tokens = np.random.default_rng(7).integers(1, V, T).astype(np.int32)
    starts = list(range(1, T - 2))
    spec = SpecConfig(2, 1, 3)
    st, _ = _prefill_drafts(model, MTPDrafter(model), tokens, starts, spec)
    drafts, probs = np.asarray(st.topk_index), np.asarray(st.topk_p)
    c = np.asarray(starts)
    _, (step0,) = mtp_step_logits(model, jnp.asarray(tokens)[None], 1)
    want0 = np.asarray(jax.nn.softmax(step0[0], -1))[c - 1]
    np.testing.assert_array_equal(drafts[:, 0], want0.argmax(-1))
    np.testing.assert_allclose(probs[:, 0], want0.max(-1), **TOL)
    seqs = np.repeat(tokens[None], len(c), 0)
    seqs[np.arange(len(c)), c + 1] = drafts[:, 0]  # step 1 fed the step-0 draft, as the drafter does
    _, (_, step1) = mtp_step_logits(model, jnp.asarray(seqs), 2)
    want1 = np.asarray(jax.nn.softmax(step1, -1))[np.arange(len(c)), c - 1]
    np.testing.assert_array_equal(drafts[:, 1], want1.argmax(-1))
    np.testing.assert_allclose(probs[:, 1], want1.max(-1), **TOL)
