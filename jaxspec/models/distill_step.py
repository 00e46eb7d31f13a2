"""The optimizer step of a draft head's self-distillation (``jaxspec.models.distill``), in three jitted stages.

``distill_step(target, head, arch, ...)`` returns a ``DistillStep``: float32 master weights of the head's trainable
parameters (a flat ``{name: array}`` dict, serializable), the AdamW state (gradient clip 0.5, linear warmup over
``steps // 30`` then cosine decay to ``lr / 10``), and the stages:

1. ``teacher(master, frozen, tokens)``: the frozen target's forward, once per batch (``eagle3_teacher`` /
   ``mtp_teacher``);
2. ``student(master, frozen, teacher, tokens, mask)``: the head's forward and backward, ``(grads, losses,
   accept)``; the loss is ``sum_k 0.8 ** k * losses[k]``;
3. ``update(master, opt_state, grads)``: the optimizer.

``step`` is the three in one jitted function (what training runs); ``bench/train_profile.py`` times them apart.
``head(master)`` is the head module with the master weights cast to its parameter dtype; ``predict(master, frozen,
tokens, k)`` (jitted, ``k`` static) its predicted token ``i32[B, k, T]`` per draft step and row in the
teacher-forced forward (what ``jaxspec.models.replay`` scores a checkpoint by).
"""

import dataclasses
from typing import Any, Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class DistillStep:
    """The stages and initial state of ``distill_step`` (module docstring); ``frozen`` holds the non-trained
    arrays the stages take as an argument (the target's weights, the head's draft map)."""

    master: dict
    opt_state: Any
    frozen: Any
    teacher: Callable
    student: Callable
    update: Callable
    step: Callable
    head: Callable
    predict: Callable


def _schedule(lr: float, steps: int):
    import jax.numpy as jnp

    warm, total = max(1, steps // 30), max(steps, 2)

    def sched(count):  # linear warmup, cosine decay to lr / 10 (written out: optax's uses a weakly typed power)
        c = count.astype(jnp.float32)
        frac = jnp.clip((c - warm) / max(1, total - warm), 0.0, 1.0)
        cos = lr * (0.1 + 0.9 * 0.5 * (1.0 + jnp.cos(jnp.float32(np.pi) * frac)))
        return jnp.where(c < warm, lr * c / warm, cos)

    return sched


def distill_step(target, head, arch: str, *, steps: int, lr: float, ttt_length: int = 7,
                 mtp_steps: int = 3, teacher_attention: str = "reference") -> DistillStep:
    """The training step of ``head`` against ``target``.

    Args:
        target: the frozen target (a ``Decoder``; for EAGLE-3 tapping the head's aux layers).
        head: ``arch == "eagle3"``: an ``EAGLE3Model``; ``"mtp"``: an ``MTPModel`` holding ``target``'s weights
            (its ``mtp_layers`` are trained, ``target`` itself is not read).
        arch: ``"eagle3"`` or ``"mtp"``.
        steps: the optimizer steps of the run (the learning-rate schedule's length).
        lr: the peak learning rate.
        ttt_length: EAGLE-3's training-time test steps.
        mtp_steps: the MTP draft steps.
        teacher_attention: the frozen target's dense attention in the teacher (``pipeline.dense_metadata``'s
            ``attention``: ``"reference"``, ``"xla"`` or ``"cudnn"``); the student's attention is its own.

    Returns:
        A ``DistillStep``.
    """
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxspec.models.distill import (eagle3_step_logits, eagle3_student_losses, eagle3_teacher, mtp_step_logits,
                                        mtp_student_losses, mtp_teacher)

    from jaxspec.pipeline import DENSE_ATTENTION

    if teacher_attention not in DENSE_ATTENTION:
        raise ValueError(f"teacher_attention: expected one of {DENSE_ATTENTION}, got {teacher_attention!r}")
    if arch == "eagle3":
        graphdef, params, rest = nnx.split(head, nnx.Param, ...)
        tgd, tstate = nnx.split(target)
        n_steps = ttt_length

        def teacher_of(h, frozen, toks):
            return eagle3_teacher(h, nnx.merge(tgd, frozen[1]), toks, teacher_attention)

        def losses_of(h, frozen, teach, toks, msk):
            embed = nnx.merge(tgd, frozen[1]).embed_tokens[...]
            return eagle3_student_losses(h, embed, teach, toks, msk, ttt_length)

        def predict_of(h, frozen, toks, k):
            _, logits = eagle3_step_logits(h, nnx.merge(tgd, frozen[1]), toks, k)
            return jnp.stack([h.token_ids[...][jnp.argmax(lg, -1)] for lg in logits], axis=1)
    elif arch == "mtp":
        graphdef, params, rest = nnx.split(head, nnx.All(nnx.Param, nnx.PathContains("mtp_layers")), ...)
        tstate = None
        n_steps = mtp_steps

        def teacher_of(h, frozen, toks):
            return mtp_teacher(h, toks, teacher_attention)

        def losses_of(h, frozen, teach, toks, msk):
            return mtp_student_losses(h, teach, toks, msk, mtp_steps)

        def predict_of(h, frozen, toks, k):
            _, logits = mtp_step_logits(h, toks, k)
            return jnp.stack([jnp.argmax(lg, -1).astype(jnp.int32) for lg in logits], axis=1)
    else:
        raise ValueError(f"arch: expected 'eagle3' or 'mtp', got {arch!r}")
    weights = jnp.asarray([0.8**k for k in range(n_steps)], jnp.float32)
    opt = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(_schedule(lr, steps), weight_decay=0.0))
    flat = nnx.to_flat_state(params)
    paths = [k for k, _ in flat]
    names = ["/".join(str(x) for x in k) for k in paths]
    dtypes = {n: v.get_value().dtype for n, (_, v) in zip(names, flat)}
    master = {n: v.get_value().astype(jnp.float32) for n, (_, v) in zip(names, flat)}
    frozen = (rest, tstate)

    def module(m, frozen):
        p = nnx.from_flat_state([(k, m[n].astype(dtypes[n])) for k, n in zip(paths, names)])
        return nnx.merge(graphdef, p, frozen[0])

    def teacher(m, frozen, toks):
        return teacher_of(module(m, frozen), frozen, toks)

    def student(m, frozen, teach, toks, msk):
        def f(mm):
            losses, accs = losses_of(module(mm, frozen), frozen, teach, toks, msk)
            return jnp.sum(weights * losses), (losses, accs)

        (_, (losses, accs)), grads = jax.value_and_grad(f, has_aux=True)(m)
        return grads, losses, accs

    def update(m, opt_state, grads):
        with jax.numpy_dtype_promotion("standard"):  # optax's bias correction: float ** int step
            updates, opt_state = opt.update(grads, opt_state, m)
        return optax.apply_updates(m, updates), opt_state

    def predict(m, frozen, toks, k):
        return predict_of(module(m, frozen), frozen, toks, k)

    def step(m, opt_state, frozen, toks, msk):
        grads, losses, accs = student(m, frozen, teacher(m, frozen, toks), toks, msk)
        m, opt_state = update(m, opt_state, grads)
        return m, opt_state, losses, accs

    return DistillStep(master=master, opt_state=opt.init(master), frozen=frozen, teacher=jax.jit(teacher),
                       student=jax.jit(student), update=jax.jit(update), step=jax.jit(step),
                       head=lambda m: module(m, frozen), predict=jax.jit(predict, static_argnums=3))
