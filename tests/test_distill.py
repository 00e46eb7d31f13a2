"""The draft heads' training losses and step (``jaxspec.models.distill``, ``jaxspec.models.distill_step``) on a tiny
random target, f32 on the CPU: the teacher/student losses equal the formulation with full-vocabulary logits and
per-step shifted copies, a few steps lower the loss, 16-bit layers' gradients are the products' gradients, and a
full-vocabulary head initialised from the target round-trips through its checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxspec.models import Decoder, DecoderConfig
from jaxspec.models.decoder import Linear
from jaxspec.models.distill import eagle3_losses, eagle3_step_logits, mtp_losses, mtp_step_logits, shift_rows
from jaxspec.models.distill_step import distill_step
from jaxspec.models.eagle3 import (EAGLE3Model, Eagle3Config, aux_layers_from_ids, init_lm_head_from_target,
                                   load_eagle3, save_eagle3)
from jaxspec.models.mtp import add_mtp_layers

V, L, B, T, K = 64, 3, 8, 16, 3
CFG = DecoderConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=L, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0)
IDS = (0, 1, 2)
# f32: the two formulations sum the same products in a different order (the draft columns as their own product,
# the loss over sliced rows); losses are O(1-5): 1e-5 relative is ~100 ulps, far below a wrong row or column.
TOL = dict(rtol=1e-5, atol=1e-6)


def _target(tied=False):
    cfg = DecoderConfig(**{**CFG.__dict__, "tie_word_embeddings": tied})
    t = Decoder(cfg, rngs=nnx.Rngs(1), aux_layers=aux_layers_from_ids(IDS, L), kv_dtype=jnp.float32)
    if not tied:
        t.lm_head.kernel.set_value(t.lm_head.kernel[...] * 3.0)  # sharp teacher: argmaxes far from ties
    return t


def _head(vd, seed=3):
    cfg = Eagle3Config.for_target(CFG, draft_vocab_size=vd, aux_layer_ids=IDS)
    d2t = np.sort(np.random.default_rng(2).choice(V, vd, replace=False)) - np.arange(vd)
    return EAGLE3Model(cfg, rngs=nnx.Rngs(seed), param_dtype=jnp.float32, kv_dtype=jnp.float32, d2t=d2t)


def _batch():
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, V, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), bool)
    mask[:, 4:] = True
    mask[1, 9:] = False  # a shorter reply: padding at the end
    return jnp.asarray(tokens), jnp.asarray(mask)


def _eagle3_losses_with_copies(draft, target, tokens, mask, k_steps):
    """The loss as first written: full-vocabulary target logits, the draft columns gathered from them, and each
    step's targets and masks as shifted copies (``shift_rows``)."""
    logits, step_logits = eagle3_step_logits(draft, target, tokens, k_steps)
    ids = draft.token_ids[...]
    in_draft = draft.t2d[...][jnp.argmax(logits, -1)]
    target_p = jax.nn.softmax(logits[..., ids], axis=-1)
    losses, accs = [], []
    for k, lg in enumerate(step_logits):
        lm = shift_rows(mask, 2 + k)
        pm = lm & shift_rows(in_draft, 1 + k)
        p = shift_rows(target_p, 1 + k)
        logp = jax.nn.log_softmax(lg, axis=-1)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        losses.append(-jnp.sum(jnp.where(pm, jnp.sum(p * logp, -1), 0.0)) / n)
        hit = (jnp.argmax(lg, -1) == jnp.argmax(p, -1)) & pm
        accs.append(jnp.sum(hit.astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)


def _mtp_losses_with_copies(model, tokens, mask, steps):
    logits, step_logits = mtp_step_logits(model, tokens, steps)
    labels = jnp.argmax(logits, -1).astype(jnp.int32)
    losses, accs = [], []
    for s, lg in enumerate(step_logits):
        lab, lm = shift_rows(labels, s + 1), shift_rows(mask, s + 2)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        ce = optax.softmax_cross_entropy_with_integer_labels(lg, lab)
        losses.append(jnp.sum(jnp.where(lm, ce, 0.0)) / n)
        accs.append(jnp.sum(((jnp.argmax(lg, -1) == lab) & lm).astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)


@pytest.mark.parametrize("vd,tied", [(40, False), (V, False), (40, True)], ids=["reduced", "full-vocab", "tied"])
def test_eagle3_losses_equal_the_formulation_with_copies(vd, tied):
    target, head = _target(tied), _head(vd)
    tokens, mask = _batch()
    got_l, got_a = eagle3_losses(head, target, tokens, mask, K)
    want_l, want_a = _eagle3_losses_with_copies(head, target, tokens, mask, K)
    assert float(want_l[0]) > 0.5 and float(jnp.max(want_a)) > 0  # a live check: loss and some hits
    np.testing.assert_allclose(np.asarray(got_l), np.asarray(want_l), **TOL)
    np.testing.assert_array_equal(np.asarray(got_a), np.asarray(want_a))
    g_new = nnx.grad(lambda h: eagle3_losses(h, target, tokens, mask, K)[0].sum())(head)
    g_old = nnx.grad(lambda h: _eagle3_losses_with_copies(h, target, tokens, mask, K)[0].sum())(head)
    for (path, a), (_, b) in zip(nnx.to_flat_state(g_new), nnx.to_flat_state(g_old)):
        np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()), rtol=1e-4, atol=1e-6,
                                   err_msg=str(path))


def test_mtp_losses_equal_the_formulation_with_copies():
    target = Decoder(CFG, rngs=nnx.Rngs(1), kv_dtype=jnp.float32)
    target.lm_head.kernel.set_value(target.lm_head.kernel[...] * 3.0)
    model = add_mtp_layers(target, 1, rngs=nnx.Rngs(2), num_draft_steps=2)
    tokens, mask = _batch()
    got, want = mtp_losses(model, tokens, mask, 2), _mtp_losses_with_copies(model, tokens, mask, 2)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), **TOL)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("arch", ["eagle3", "mtp"])
def test_a_few_steps_lower_the_loss(arch):
    if arch == "eagle3":
        target, head = _target(), _head(40)
    else:
        target = Decoder(CFG, rngs=nnx.Rngs(1), kv_dtype=jnp.float32)
        head = add_mtp_layers(target, 1, rngs=nnx.Rngs(2), num_draft_steps=2)
    ds = distill_step(target, head, arch, steps=20, lr=3e-3, ttt_length=K, mtp_steps=2)
    tokens, mask = _batch()
    master, opt_state = ds.master, ds.opt_state
    first = None
    for _ in range(20):
        master, opt_state, losses, _ = ds.step(master, opt_state, ds.frozen, tokens, mask)
        first = float(losses[0]) if first is None else first
    assert float(losses[0]) < 0.8 * first, (first, float(losses[0]))
    # the stages one by one are the step
    teach = ds.teacher(master, ds.frozen, tokens)
    grads, l2, _ = ds.student(master, ds.frozen, teach, tokens, mask)
    m2, _ = ds.update(master, opt_state, grads)
    m3, _, l3, _ = ds.step(master, opt_state, ds.frozen, tokens, mask)
    np.testing.assert_allclose(np.asarray(l2), np.asarray(l3), rtol=1e-6)
    for n in m2:
        np.testing.assert_allclose(np.asarray(m2[n]), np.asarray(m3[n]), rtol=1e-5, atol=1e-7, err_msg=n)


def test_16bit_linear_gradients_are_the_products_gradients():
    """A bf16 layer's backward multiplies in bf16 with f32 accumulation: within bf16 rounding of the f32
    gradient of the same bf16 weights, and the forward unchanged."""
    lin = Linear(48, 24, bias=False, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 48), jnp.float32)
    g = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 24), jnp.float32)
    w = lin.kernel[...]

    def ref(x, w):
        return jnp.einsum("...d,df->...f", x.astype(jnp.bfloat16).astype(jnp.float32), w.astype(jnp.float32),
                          precision=jax.lax.Precision.HIGHEST)

    np.testing.assert_allclose(np.asarray(lin(x)), np.asarray(ref(x, w)), rtol=1e-6, atol=1e-6)
    dx = jax.grad(lambda x: jnp.sum(lin(x) * g))(x)
    dw = nnx.grad(lambda m: jnp.sum(m(x) * g))(lin)["kernel"].get_value()
    rx, rw = jax.grad(lambda x, w: jnp.sum(ref(x, w) * g), argnums=(0, 1))(x, w)
    assert dx.dtype == jnp.float32 and dw.dtype == jnp.bfloat16
    jaxpr = jax.make_jaxpr(nnx.grad(lambda m: jnp.sum(m(x) * g)))(lin)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) >= 2 and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars), dots
    scale = float(jnp.max(jnp.abs(rw)))
    np.testing.assert_allclose(np.asarray(dw, np.float32), np.asarray(rw, np.float32), atol=2e-2 * scale)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(rx), atol=2e-2 * float(jnp.max(jnp.abs(rx))))


def test_full_vocabulary_head_from_the_target_round_trips(tmp_path):
    target = _target(tied=True)
    cfg = Eagle3Config.for_target(CFG, draft_vocab_size=V, aux_layer_ids=IDS)
    head = EAGLE3Model(cfg, rngs=nnx.Rngs(3), param_dtype=jnp.float32, kv_dtype=jnp.float32,
                       d2t=np.zeros((V,), np.int64))
    init_lm_head_from_target(head, target)
    np.testing.assert_array_equal(np.asarray(head.lm_head.kernel[...]), np.asarray(target.embed_tokens[...]).T)
    save_eagle3(head, str(tmp_path / "h"), dtype=jnp.float32)
    back = load_eagle3(str(tmp_path / "h"), kv_dtype=jnp.float32)
    assert back.cfg.draft_vocab_size == V and bool(np.all(np.asarray(back.t2d[...])))
    np.testing.assert_array_equal(np.asarray(back.lm_head.kernel[...]), np.asarray(head.lm_head.kernel[...]))
    with pytest.raises(ValueError, match="target: hidden size"):
        init_lm_head_from_target(head, Decoder(DecoderConfig(**{**CFG.__dict__, "hidden_size": 16,
                                                                  "tie_word_embeddings": True}), rngs=nnx.Rngs(0)))
