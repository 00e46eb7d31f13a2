"""Tempered probabilities ``softmax(logits / T)`` that stay finite for every temperature.

The textbook form ``softmax(logits / T)`` breaks for small positive ``T``: ``logits / T`` overflows to
``inf`` (``T = 1e-37``), and where it stays finite (``T = 1e-10``) XLA compiles ``x / T`` as
``x * (1 / T)`` and may contract the softmax's ``x * r - max`` into one fused multiply-add, so the maximal
entry is off by rounding errors of order ``ulp(max / T)``: ``exp`` of that overflows and the row becomes
``inf / inf = NaN`` (the sampler then returns its ``V - 1`` sentinel for every token).

Here the maximum is subtracted first: ``d = logits - max(logits)`` is exact at the maximal entries (0) and
negative elsewhere, so ``z = d / T`` lies in ``[-inf, 0]`` for every ``T > 0`` (an overflow goes to
``-inf``, whose ``exp`` is 0), the maximal entries are pinned to ``z = 0`` (no ``0 * (1 / T)`` with an
infinite reciprocal for a subnormal ``T``) and ``exp(z)`` sums to at least 1. For ``T`` where
``logits / T`` is finite this is the same distribution (rounding aside); as ``T -> 0`` it tends to the
uniform distribution over the tied maxima (at ``T = 1e-6`` and below, for logits a float32 can tell apart:
one-hot at the argmax). ``T = inf`` gives the uniform distribution over the finite logits.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def tempered_probs(logits: Float[Array, "... V"], temperatures: Float[Array, "..."]) -> Float[Array, "... V"]:
    """float32 ``softmax(logits / T)`` over the last axis, finite for every ``T > 0`` (see the module
    docstring); a row whose ``T`` is ``<= 0`` or NaN is one-hot at its first argmax (greedy).

    ``temperatures`` has ``logits``' leading shape (one per row). Jittable.
    """
    x = logits.astype(jnp.float32)
    t = jnp.asarray(temperatures, jnp.float32)[..., None]
    greedy = ~(t > 0)
    d = x - jnp.max(x, axis=-1, keepdims=True)
    z = jnp.where(d == 0, 0.0, jnp.where(d == -jnp.inf, -jnp.inf, d / jnp.where(greedy, 1.0, t)))
    e = jnp.exp(z)
    probs = e / jnp.sum(e, axis=-1, keepdims=True)
    one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy, one_hot, probs)
