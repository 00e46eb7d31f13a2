"""``jaxspec.train_tiny``'s MTP labels: the corpus's tokens, or the target's own greedy predictions of them
(self-distillation, what the shipped demo pair's MTP layers were trained on)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.models import load_pair
from jaxspec.round import causal_qmask
from jaxspec.protocols import AttentionMetadata
from jaxspec.train_tiny import _mtp_labels, accuracies, losses


def _dense(b, n):
    pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (b, n))
    return AttentionMetadata(positions=pos, qmask=causal_qmask(b, n), prefix_lens=jnp.zeros((b,), jnp.int32),
                             page_table=jnp.zeros((b, 0), jnp.int32))


def test_mtp_labels():
    model = load_pair()  # the tests' tiny pair: 3 MTP layers
    s_n, ctx, b = model.num_mtp_layers, 10, 3
    seqs = jnp.asarray(np.random.default_rng(0).integers(0, model.vocab_size, (b, ctx + s_n + 1)), jnp.int32)
    logits, h, labels = _mtp_labels(model, seqs, ctx, "data")
    assert logits.shape == (b, ctx, model.vocab_size) and h.shape[:2] == (b, ctx)
    for s in range(s_n):
        np.testing.assert_array_equal(labels[s], seqs[:, s + 2 : s + 2 + ctx])
    # "target": the greedy token the target predicts for position p + s + 2 from the corpus prefix up to
    # p + s + 1, from an independent forward over ctx + S tokens; the target's own logits and hidden are its
    # first ctx positions (causal: the extra tokens change nothing before them)
    full, full_h, _ = model.forward(seqs[:, : ctx + s_n], _dense(b, ctx + s_n), None)
    greedy = np.asarray(jnp.argmax(full, -1))
    t_logits, t_h, t_labels = _mtp_labels(model, seqs, ctx, "target")
    np.testing.assert_allclose(t_logits, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t_h, h, rtol=1e-5, atol=1e-5)
    for s in range(s_n):
        np.testing.assert_array_equal(t_labels[s], greedy[:, s + 1 : s + 1 + ctx])
        assert t_labels[s].dtype == jnp.int32
    # the labels differ from the corpus's on random tokens (else the test could not tell the modes apart)
    assert not all(np.array_equal(a, c) for a, c in zip(t_labels, labels))
    # no gradient flows through the distillation labels: the loss is finite and differentiable
    per_head = losses(model, seqs, ctx, "target")
    assert per_head.shape == (1 + s_n,) and bool(jnp.all(jnp.isfinite(per_head)))
    agree = np.asarray(accuracies(model, seqs, ctx, "target"))
    assert agree.shape == (1 + s_n,) and ((0 <= agree) & (agree <= 1)).all()
    with pytest.raises(ValueError, match="mtp_labels"):
        _mtp_labels(model, seqs, ctx, "teacher")
