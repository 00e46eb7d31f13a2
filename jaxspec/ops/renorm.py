"""Top-k / top-p renormalisation cores with FlashInfer's semantics (``top_k_renorm_probs`` /
``top_p_renorm_probs``), jitted with checked mode as a static argument; the public ops are
``ops.verify.top_k_renorm_prob`` / ``top_p_renorm_prob``, and ``ops.accept``'s sampling path calls these."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from jaxspec.ops.tree_walk import row_take


def sorted_desc(probs):
    return jnp.flip(jnp.sort(probs, axis=-1), axis=-1)


def renorm_keep(probs, pivot):
    kept = jnp.where(probs >= pivot[:, None], probs, 0.0)
    total = jnp.sum(kept, axis=-1, keepdims=True)
    return jnp.where(total > 0, kept / total, kept)  # a row without mass stays all-zero (not 0/0 = NaN)


def check_top_k(top_k):
    checkify.check(jnp.all(top_k >= 1), "top_k: expected values >= 1")


def check_top_p(top_p):
    checkify.check(jnp.all((top_p > 0) & (top_p <= 1)), "top_p: expected values in (0, 1]")


@functools.partial(jax.jit, static_argnames=("checks",))
def top_k_renorm(probs, top_k, *, checks=False):
    if checks:
        check_top_k(top_k)
    v = probs.shape[-1]
    k = jnp.clip(top_k, 1, v)
    pivot = row_take(sorted_desc(probs), k - 1)
    return renorm_keep(probs, pivot)


@functools.partial(jax.jit, static_argnames=("checks",))
def top_p_renorm(probs, top_p, *, checks=False):
    if checks:
        check_top_p(top_p)
    v = probs.shape[-1]
    desc = sorted_desc(probs)
    reached = jnp.cumsum(desc, axis=-1) >= top_p[:, None]
    idx = jnp.where(jnp.any(reached, axis=-1), jnp.argmax(reached, axis=-1), v - 1).astype(jnp.int32)
    return renorm_keep(probs, row_take(desc, idx))
