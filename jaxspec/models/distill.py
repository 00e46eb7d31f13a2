"""The self-distillation objectives of the draft heads: the teacher-forced forwards and per-step losses
``python -m jaxspec.train_draft`` minimises, over a frozen target's dense forward (no KV cache).

EAGLE-3 (``eagle3_step_logits``, ``eagle3_losses``): SpecForge's training-time test unrolled ``K`` steps; step
``k``'s row ``t`` is fed token ``t + 1 + k`` and trained toward the target's distribution at row ``t + 1 + k``
restricted to the draft vocabulary, rows masked where the predicted token is no response token or the target's
top-1 lies outside the draft vocabulary. MTP (``mtp_step_logits``, ``mtp_losses``): step ``s``'s row ``t`` is fed
step ``s - 1``'s hidden and token ``t + s + 1`` and trained toward the target's own argmax at row ``t + s + 1``.
Each loss is normalised by the response rows; accept: top-1 agreement with the target over them.

Each loss is split in two: the teacher (``eagle3_teacher``, ``mtp_teacher``: the frozen target's forward, once per
batch, and what the loss reads of it) and the student (``eagle3_student_losses``, ``mtp_student_losses``: the
head's forward and losses, the part a gradient is taken of). The teacher keeps only what the loss needs: for
EAGLE-3 the target's distribution over the draft vocabulary (``f32[B, T, Vd]``), its top-1 there and whether the
full-vocabulary top-1 is in it; the steps read it shifted by slicing, never by copies.
"""

import dataclasses

import jax

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3Teacher:
    """What the EAGLE-3 losses read of the frozen target, per row ``t`` of a batch ``[B, T]``.

    aux: ``f32[B, T, F]``, the target's tapped hidden states (the head's ``project`` input).
    probs: ``f32[B, T, Vd]``, the target's next-token distribution restricted (softmax) to the draft vocabulary.
    top: ``i32[B, T]``, its argmax (a draft-vocabulary column).
    in_draft: ``bool[B, T]``, whether the target's full-vocabulary top-1 lies in the draft vocabulary.
    """

    aux: jax.Array
    probs: jax.Array
    top: jax.Array
    in_draft: jax.Array


def eagle3_teacher(draft, target, tokens, attention: str = "reference") -> Eagle3Teacher:
    """The frozen target's side of the EAGLE-3 losses, computed once per batch.

    Args:
        draft: an ``EAGLE3Model`` (only its draft vocabulary is read).
        target: its target (a ``Decoder`` tapping the head's aux layers).
        tokens: ``i32[B, T]`` sequences.
        attention: the target's dense attention (``pipeline.dense_metadata``'s ``attention``).

    Returns:
        An ``Eagle3Teacher`` (gradient-free). The full-vocabulary logits are formed only for their argmax, and not
        at all when the draft vocabulary is the whole vocabulary; the draft columns are their own product.
    """
    import jax.numpy as jnp

    from jaxspec.models.eagle3 import target_head_columns

    b, t = tokens.shape
    x, aux, _ = target.trunk(tokens, dense_metadata(b, t, attention=attention), None)
    h = target.norm(x)
    ids = draft.token_ids[...]
    w = target_head_columns(target, ids)
    cols = jnp.einsum("btd,dv->btv", h.astype(w.dtype), w, preferred_element_type=jnp.float32)
    if ids.shape[0] == target.vocab_size:
        in_draft = jnp.ones((b, t), bool)
    else:
        in_draft = draft.t2d[...][jnp.argmax(target.logits(x), -1)]
    probs = jax.nn.softmax(cols, axis=-1)
    teacher = Eagle3Teacher(aux=aux, probs=probs, top=jnp.argmax(cols, -1).astype(jnp.int32), in_draft=in_draft)
    return jax.lax.stop_gradient(teacher)


def _input_embeddings(target_embed, tokens, ttt_length: int):
    """Step ``k``'s input embeddings ``f32[B, T, H]``: row ``t`` holds token ``t + 1 + k``."""
    import jax.numpy as jnp

    return [jax.lax.stop_gradient(target_embed[shift_rows(tokens, 1 + k)].astype(jnp.float32))
            for k in range(ttt_length)]


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
    b, t = tokens.shape
    meta = dense_metadata(b, t)
    x, aux, _ = target.trunk(tokens, meta, None)
    logits, aux = jax.lax.stop_gradient(target.logits(x)), jax.lax.stop_gradient(aux)
    embs = _input_embeddings(target.embed_tokens[...], tokens, ttt_length)
    outs = draft.ttt_forward(embs, draft.project(aux), meta.positions)
    return logits, [draft.logits(out) for out in outs]


def eagle3_student_losses(draft, target_embed, teacher: Eagle3Teacher, tokens, mask, ttt_length: int):
    """The head's side of the EAGLE-3 losses: its training-time test against a teacher.

    Args:
        draft: an ``EAGLE3Model``.
        target_embed: the target's token embedding ``[V, H]``.
        teacher: ``eagle3_teacher(draft, target, tokens)``.
        tokens: ``i32[B, T]`` sequences.
        mask: ``bool[B, T]``, the response tokens (the ones a loss covers).
        ttt_length: the steps ``K`` unrolled.

    Returns:
        ``(losses f32[K], accept f32[K])``, step ``k`` unweighted. Step ``k``'s row ``t`` is scored against the
        teacher's row ``t + 1 + k``: the rows ``t < T - 2 - k`` (the others predict past the sequence) read the
        teacher through slices.
    """
    import jax.numpy as jnp

    b, t = tokens.shape
    positions = dense_metadata(b, t).positions
    outs = draft.ttt_forward(_input_embeddings(target_embed, tokens, ttt_length), draft.project(teacher.aux),
                             positions)
    losses, accs = [], []
    for k, out in enumerate(outs):
        r = max(t - 2 - k, 0)  # rows t whose predicted token t + 2 + k lies in the sequence
        lm = mask[:, 2 + k:]
        pm = lm & teacher.in_draft[:, 1 + k:t - 1]
        lg = draft.logits(out[:, :r])
        logp = jax.nn.log_softmax(lg, axis=-1)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        p = teacher.probs[:, 1 + k:t - 1]
        losses.append(-jnp.sum(jnp.where(pm, jnp.sum(p * logp, -1), 0.0)) / n)
        hit = (jnp.argmax(lg, -1) == teacher.top[:, 1 + k:t - 1]) & pm
        accs.append(jnp.sum(hit.astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)


def eagle3_losses(draft, target, tokens, mask, ttt_length: int):
    """The EAGLE-3 head's per-step losses and accept rates (module docstring): ``eagle3_student_losses`` against
    ``eagle3_teacher``.

    Args:
        draft, target, tokens, ttt_length: as ``eagle3_step_logits``.
        mask: ``bool[B, T]``, the response tokens (the ones a loss covers).

    Returns:
        ``(losses f32[K], accept f32[K])``, step ``k`` unweighted.
    """
    teacher = eagle3_teacher(draft, target, tokens)
    return eagle3_student_losses(draft, target.embed_tokens[...], teacher, tokens, mask, ttt_length)


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
    b, t = tokens.shape
    meta = dense_metadata(b, t)
    logits, h, _ = model.forward(tokens, meta, None)
    h = jax.lax.stop_gradient(h)
    out = []
    for s in range(num_steps):
        lg, h, _ = model.mtp_forward(s, h, shift_rows(tokens, s + 1), meta, None)
        out.append(lg)
    return jax.lax.stop_gradient(logits), out


def mtp_teacher(model, tokens, attention: str = "reference"):
    """The frozen target's side of the MTP losses, once per batch: ``(hidden f32[B, T, D], labels i32[B, T])``,
    the last pre-norm hidden (MTP step 0's input) and the target's argmax next token (gradient-free);
    ``attention``: the target's dense attention (``pipeline.dense_metadata``'s)."""
    import jax.numpy as jnp

    b, t = tokens.shape
    x, h, _ = model.trunk(tokens, dense_metadata(b, t, attention=attention), None)
    return jax.lax.stop_gradient((h, jnp.argmax(model.logits(x), -1).astype(jnp.int32)))


def mtp_student_losses(model, teacher, tokens, mask, num_steps: int):
    """The MTP layers' side of the MTP losses against ``mtp_teacher(model, tokens)``.

    Args:
        model: an ``MTPModel``.
        teacher: ``(hidden, labels)`` of ``mtp_teacher``.
        tokens: ``i32[B, T]`` sequences.
        mask: ``bool[B, T]``, the response tokens.
        num_steps: the draft steps ``S``.

    Returns:
        ``(losses f32[S], accept f32[S])``, step ``s`` unweighted.
    """
    import jax.numpy as jnp
    import optax

    h, labels = teacher
    b, t = tokens.shape
    meta = dense_metadata(b, t)
    losses, accs = [], []
    for s in range(num_steps):
        lg, h, _ = model.mtp_forward(s, h, shift_rows(tokens, s + 1), meta, None)
        lab, lm = shift_rows(labels, s + 1), shift_rows(mask, s + 2)
        n = jnp.maximum(jnp.sum(lm.astype(jnp.float32)), 1.0)
        ce = optax.softmax_cross_entropy_with_integer_labels(lg, lab)
        losses.append(jnp.sum(jnp.where(lm, ce, 0.0)) / n)
        accs.append(jnp.sum(((jnp.argmax(lg, -1) == lab) & lm).astype(jnp.float32)) / n)
    return jnp.stack(losses), jnp.stack(accs)


def mtp_losses(model, tokens, mask, num_steps: int):
    """The self-distilled MTP layers' per-step losses and accept rates (module docstring).

    Args:
        model, tokens, num_steps: as ``mtp_step_logits``.
        mask: ``bool[B, T]``, the response tokens.

    Returns:
        ``(losses f32[S], accept f32[S])``, step ``s`` unweighted.
    """
    return mtp_student_losses(model, mtp_teacher(model, tokens), tokens, mask, num_steps)
