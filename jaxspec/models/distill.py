"""The self-distillation objectives of the draft heads: the teacher-forced forwards and per-step losses
``python -m jaxspec.train_draft`` minimises, over a frozen target's dense forward (no KV cache).

EAGLE-3 (``eagle3_step_logits``, ``eagle3_losses``): SpecForge's training-time test unrolled ``K`` steps; step
``k``'s row ``t`` is fed token ``t + 1 + k`` and trained toward the target's distribution at row ``t + 1 + k``
restricted to the draft vocabulary, rows masked where the predicted token is no response token or the target's
top-1 lies outside the draft vocabulary. MTP (``mtp_step_logits``, ``mtp_losses``): step ``s``'s row ``t`` is fed
step ``s - 1``'s hidden and token ``t + s + 1`` and trained toward the target's own argmax at row ``t + s + 1``.
Each loss is normalised by the response rows; accept: top-1 agreement with the target over them.
"""

from jaxspec.pipeline import dense_metadata


def shift_rows(x, n: int):
    """Row ``t`` of a batch of sequences replaced by row ``t + n``: what a training step predicting ``n`` tokens
    ahead compares against.

    Args:
        x: an array ``[B, T, ...]``.
        n: how far ahead (``>= 0``).

    Returns:
        ``x[:, n:]`` padded at the end with zeros to ``x``'s length ``T``.
    """
    import jax.numpy as jnp

    pad = jnp.zeros((x.shape[0], n) + x.shape[2:], x.dtype)
    return jnp.concatenate([x[:, n:], pad], axis=1)


def eagle3_step_logits(draft, target, tokens, ttt_length: int):
    """The EAGLE-3 training-time test's forward: the target's dense forward, then the head's ``ttt_forward``.

    Args:
        draft: an ``EAGLE3Model``.
        target: its target (a ``Decoder`` tapping the head's aux layers).
        tokens: ``i32[B, T]`` sequences.
        ttt_length: the steps ``K`` unrolled.

    Returns:
        ``(target_logits f32[B, T, V], [draft logits f32[B, T, Vd]] * K)``: step ``k``'s row ``t`` is fed token
        ``t + 1 + k`` and predicts token ``t + 2 + k``; column ``j`` of the draft logits is ``draft.token_ids[j]``.
    """
    import jax
    import jax.numpy as jnp

    b, t = tokens.shape
    meta = dense_metadata(b, t)
    logits, aux, _ = target.forward(tokens, meta, None)
    logits, aux = jax.lax.stop_gradient(logits), jax.lax.stop_gradient(aux)
    emb = target.embed_tokens[...]
    embs = [jax.lax.stop_gradient(emb[shift_rows(tokens, 1 + k)].astype(jnp.float32)) for k in range(ttt_length)]
    outs = draft.ttt_forward(embs, draft.project(aux), meta.positions)
    return logits, [draft.logits(out) for out in outs]


def eagle3_losses(draft, target, tokens, mask, ttt_length: int):
    """The EAGLE-3 head's per-step losses and accept rates (module docstring).

    Args:
        draft, target, tokens, ttt_length: as ``eagle3_step_logits``.
        mask: ``bool[B, T]``, the response tokens (the ones a loss covers).

    Returns:
        ``(losses f32[K], accept f32[K])``, step ``k`` unweighted.
    """
    import jax
    import jax.numpy as jnp

    logits, step_logits = eagle3_step_logits(draft, target, tokens, ttt_length)
    ids = draft.token_ids[...]
    in_draft = draft.t2d[...][jnp.argmax(logits, -1)]
    target_p = jax.nn.softmax(logits[..., ids], axis=-1)
    losses, accs = [], []
    for k, lg in enumerate(step_logits):
        lm = shift_rows(mask, 2 + k)  # row t predicts token t + 2 + k
        pm = lm & shift_rows(in_draft, 1 + k)
        p = shift_rows(target_p, 1 + k)
        logp = jax.nn.log_softmax(lg, axis=-1)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        losses.append(-jnp.sum(jnp.where(pm, jnp.sum(p * logp, -1), 0.0)) / n)
        hit = (jnp.argmax(lg, -1) == jnp.argmax(p, -1)) & pm
        accs.append(jnp.sum(hit.astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)


def mtp_step_logits(model, tokens, num_steps: int):
    """The MTP layers' teacher-forced training forward.

    Args:
        model: an ``MTPModel``.
        tokens: ``i32[B, T]`` sequences.
        num_steps: the draft steps ``S``.

    Returns:
        ``(target_logits f32[B, T, V], [step logits f32[B, T, V]] * S)``: step ``s``'s row ``t`` is fed step
        ``s - 1``'s hidden at row ``t`` and token ``t + s + 1``, and predicts token ``t + s + 2``.
    """
    import jax

    b, t = tokens.shape
    meta = dense_metadata(b, t)
    logits, h, _ = model.forward(tokens, meta, None)
    h = jax.lax.stop_gradient(h)
    out = []
    for s in range(num_steps):
        lg, h, _ = model.mtp_forward(s, h, shift_rows(tokens, s + 1), meta, None)
        out.append(lg)
    return jax.lax.stop_gradient(logits), out


def mtp_losses(model, tokens, mask, num_steps: int):
    """The self-distilled MTP layers' per-step losses and accept rates (module docstring).

    Args:
        model, tokens, num_steps: as ``mtp_step_logits``.
        mask: ``bool[B, T]``, the response tokens.

    Returns:
        ``(losses f32[S], accept f32[S])``, step ``s`` unweighted.
    """
    import jax.numpy as jnp
    import optax

    logits, step_logits = mtp_step_logits(model, tokens, num_steps)
    labels = jnp.argmax(logits, -1).astype(jnp.int32)
    losses, accs = [], []
    for s, lg in enumerate(step_logits):
        lab, lm = shift_rows(labels, s + 1), shift_rows(mask, s + 2)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        ce = optax.softmax_cross_entropy_with_integer_labels(lg, lab)
        losses.append(jnp.sum(jnp.where(lm, ce, 0.0)) / n)
        accs.append(jnp.sum(((jnp.argmax(lg, -1) == lab) & lm).astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)
