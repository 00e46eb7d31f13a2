"""Verify-side sampling and bonus tokens: SGLang 0.5.23 ``srt/speculative/eagle_utils.py::eagle_sample``.

Also mirrors ``python/sglang/kernels/ops/speculative/eagle.py::fill_bonus_tokens`` (0.5.23; the older
v2 ``fill_new_verified_id`` used the wrong row stride ``N`` for ``topk > 1`` trees -- here the stride is
``accept_index.shape[1] = S + 1``, as in 0.5.23).

Out of scope (handled by the caller or not ported): relaxed penalties, logit bias, the grammar bitmask,
watermarking, NaN sanitising, TP broadcasts, ``SGLANG_SIMULATE_ACC_LEN``, the rejection-sampling chain
verifier and the murmur-hash seeded coins (``make_coins`` draws coins from a JAX PRNG key instead).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify
import numpy as np
from jaxtyping import Array, Float, Int32

from jaxspec import _validate
from jaxspec._validate import check_shape, float_array, index_array
from jaxspec.config import SpecConfig
from jaxspec.ops.args import host_values, threshold, top_k_arg, top_p_arg
from jaxspec.ops.renorm import top_k_renorm, top_p_renorm
from jaxspec.ops.tree_walk import (Tree, VerifyOutput, sample_residual, tree_speculative_sampling_core,
                                   verify_tree_greedy_core)
from jaxspec.ops.temperature import tempered_probs

_LOGIT_DTYPES = (np.float32, jnp.bfloat16, np.float16)
MAX_COIN = 1.0 - 2.0**-24  # largest float32 below 1: coins must lie in [0, 1) (a coin of 1.0 can pick a p=0 token)


class EagleSampleOutput(NamedTuple):
    """Result of ``eagle_sample``.

    predict: ``(B*N,)`` int32; zeros except the accepted path (the next accepted token after each
        accepted node) and the bonus/correction token after the last accepted node.
    accept_lens: ``(B,)`` int32 = accepted drafts + 1 (the +1 is the root/bonus slot).
    accept_index: ``(B, S+1)`` int32 global node ids of the accepted path, -1 padded. For an empty
        batch this is ``(0, S+1)`` (upstream returns ``(0,)``).
    """

    predict: Int32[Array, "T"]
    accept_lens: Int32[Array, "B"]
    accept_index: Int32[Array, "B A"]


def make_coins(key: Array, batch: int, num_draft_tokens: int) -> tuple[Float[Array, "B N"], Float[Array, "B"]]:
    """``(uniform_samples (B, N), uniform_samples_for_final_sampling (B,))`` float32 coins in ``[0, 1)``.

    The JAX counterpart of upstream's ``torch.rand`` coins (its murmur-hash path with per-request seeds is not ported).
    Jittable with static ``batch`` / ``num_draft_tokens``.
    """
    k_nodes, k_final = jax.random.split(key)
    coins = jax.random.uniform(k_nodes, (batch, num_draft_tokens), jnp.float32)
    final = jax.random.uniform(k_final, (batch,), jnp.float32)
    # jax.random.uniform is [0, 1) already; the clamp documents (and enforces) the kernel's contract.
    return jnp.minimum(coins, jnp.float32(MAX_COIN)), jnp.minimum(final, jnp.float32(MAX_COIN))


def _to_output(out: VerifyOutput) -> EagleSampleOutput:
    # accept_lens = num_correct_drafts + 1 (out of place, as in 0.5.23), computed inside jit.
    return EagleSampleOutput(out.predict, out.num_correct_drafts + 1, out.accept_index)


@functools.partial(jax.jit, static_argnames=("num_steps", "topk"))
def _greedy(logits, tree, *, num_steps, topk):
    b, n = tree.candidates.shape
    # torch.argmax / jnp.argmax: first maximal index, NaN counts as the maximum.
    target_predict = jnp.argmax(logits, axis=-1).astype(jnp.int32).reshape(b, n)
    return _to_output(verify_tree_greedy_core(tree, target_predict, num_steps=num_steps, topk=topk))


def _sampling_probs(logits, temperatures, top_ks, top_ps, *, checks):
    """``logits (B, M, V)`` -> float32 probabilities ``(B, M, V)`` (traced; see ``sampling_probs``)."""
    b, n, v = logits.shape
    if checks:
        checkify.check(jnp.all(temperatures >= 0), "temperatures: expected values >= 0 (0 = greedy)")
    # softmax(logits / T) in float32, T repeated per node (upstream: repeat_interleave(temperatures, N)),
    # finite for every T > 0; a request with T <= 0 (or NaN) samples greedily (one-hot at the first argmax).
    probs = tempered_probs(logits, jnp.broadcast_to(temperatures[:, None], (b, n))).reshape(b * n, v)
    if top_ks is not None:
        probs = top_k_renorm(probs, jnp.repeat(top_ks, n, total_repeat_length=b * n), checks=checks)
    if top_ps is not None:
        probs = top_p_renorm(probs, jnp.repeat(top_ps, n, total_repeat_length=b * n), checks=checks)
    return probs.reshape(b, n, v)


def sampling_probs(
    logits: Float[Array, "B M V"],
    temperatures: Float[Array, "B"],
    top_ks: Int32[Array, "B"] | None = None,
    top_ps: Float[Array, "B"] | None = None,
) -> Float[Array, "B M V"]:
    """The sampling distribution ``eagle_sample(greedy=False)`` verifies against, for any logits.

    ``softmax(logits / T)`` in float32 (each request's temperature over its ``M`` rows; ``T == 0`` gives a
    one-hot row at the first argmax, i.e. greedy), then ``top_k_renorm_prob`` when ``top_ks`` is given and
    ``top_p_renorm_prob`` when ``top_ps`` is given -- the exact processing of ``eagle_sample``'s sampling
    path (which calls this), so a plain sampler, a drafter and the verifier share one definition.
    Jittable; values are checked in checked mode only (host values are the caller's to check).
    """
    logits = float_array("logits", logits, (None, None, None), _LOGIT_DTYPES)
    b = logits.shape[0]
    temperatures = float_array("temperatures", temperatures, (b,), (np.float32,))
    if top_ks is not None:
        top_ks = index_array("top_ks", top_ks, (b,))
    if top_ps is not None:
        top_ps = float_array("top_ps", top_ps, (b,), (np.float32,))
    return _validate.call_checked(_sampling_probs_jit, logits, temperatures, top_ks, top_ps)


_sampling_probs_jit = jax.jit(_sampling_probs, static_argnames=("checks",))


def sample_from_probs(probs: Float[Array, "B V"], coins: Float[Array, "B"]) -> Int32[Array, "B"]:
    """One token per row of ``probs`` by inverse CDF with ``coins`` in ``[0, 1)`` (FlashInfer's index rule,
    ``ops.verify.sample_residual``): a one-hot row returns its index whatever the coin."""
    return sample_residual(probs, coins)


@functools.partial(jax.jit, static_argnames=("num_steps", "topk", "threshold_single", "threshold_acc", "checks"))
def _sampling(
    logits, tree, temperatures, top_ks, top_ps, coins, final, *, num_steps, topk, threshold_single, threshold_acc,
    checks,
):
    b, n = tree.candidates.shape
    v = logits.shape[-1]
    probs = _sampling_probs(logits.reshape(b, n, v), temperatures, top_ks, top_ps, checks=checks).reshape(b * n, v)
    out = tree_speculative_sampling_core(
        tree,
        coins,
        final,
        probs.reshape(b, n, v),
        None,  # tree mode: zero draft probs
        num_steps=num_steps,
        topk=topk,
        threshold_single=threshold_single,
        threshold_acc=threshold_acc,
        checks=checks,
    )
    return _to_output(out)


def eagle_sample(
    logits: Float[Array, "T V"],
    draft_tokens: Int32[Array, "T"] | Int32[Array, "B N"],
    retrieve_index: Int32[Array, "B N"],
    retrieve_next_token: Int32[Array, "B N"],
    retrieve_next_sibling: Int32[Array, "B N"],
    *,
    config: SpecConfig,
    temperatures: Float[Array, "B"] | None = None,
    top_ks: Int32[Array, "B"] | None = None,
    top_ps: Float[Array, "B"] | None = None,
    uniform_samples: Float[Array, "B N"] | None = None,
    uniform_samples_for_final_sampling: Float[Array, "B"] | None = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    greedy: bool = True,
) -> EagleSampleOutput:
    """Verify a draft tree against the target logits (SGLang 0.5.23 ``eagle_sample``, tree mode).

    ``greedy=True`` (static; upstream's ``is_all_greedy``): ``target_predict = argmax(logits)`` (first
    max) and ``verify_tree_greedy``. ``greedy=False``: ``softmax(logits / T)`` with each request's
    temperature repeated over its ``N`` nodes, then ``top_k_renorm_prob`` if ``top_ks`` is given and
    ``top_p_renorm_prob`` if ``top_ps`` is given (upstream's ``need_top_k/p_sampling``), then
    ``tree_speculative_sampling_target_only`` with zero draft probs and the given coins. A request with
    temperature 0 (or, unchecked, a negative / NaN one) samples greedily: its probability rows are one-hot
    at the first argmax, which accepts exactly what ``greedy=True`` accepts. Checked mode
    (``jaxspec.checks()``) flags negative temperatures, ``top_ks < 1``, ``top_ps`` outside ``(0, 1]`` and
    coins outside ``[0, 1)`` for traced values (host values raise ``ValueError``). The sibling scan
    is bounded by ``config.topk`` (every ``build_tree`` node has at most ``K`` children), which makes the
    walk loop-free.

    Args:
      logits: ``(B*N, V)`` float32/bfloat16/float16 target logits of every tree node.
      draft_tokens: ``(B*N,)`` (as ``build_tree`` returns) or ``(B, N)`` int node tokens.
      retrieve_index, retrieve_next_token, retrieve_next_sibling: ``(B, N)`` int tree links.
      config: static ``SpecConfig`` (``N = config.num_draft_tokens``, ``S = config.num_steps``).
      temperatures: ``(B,)`` (or ``(B, 1)``) float32, ``>= 0``, required when ``greedy=False``.
      top_ks: optional ``(B,)`` int, values ``>= 1``; top_ps: optional ``(B,)`` float32 in ``(0, 1]``.
      uniform_samples, uniform_samples_for_final_sampling: ``(B, N)`` / ``(B,)`` float32 coins in
        ``[0, 1)``, required when ``greedy=False`` (see ``make_coins``).
      threshold_single, threshold_acc: static acceptance thresholds (SGLang defaults 1.0 / 1.0).
      greedy: static path selector.

    Returns:
      ``EagleSampleOutput(predict (B*N,), accept_lens (B,), accept_index (B, S+1))``, int32.
    """
    if not isinstance(config, SpecConfig):
        raise ValueError(f"config: expected a SpecConfig, got {type(config).__name__}")
    if not isinstance(greedy, bool):
        raise ValueError(f"greedy: expected a Python bool (static), got {greedy!r}")
    n, s = config.num_draft_tokens, config.num_steps
    retrieve_index = index_array("retrieve_index", retrieve_index, (None, n))
    b = retrieve_index.shape[0]
    tree = Tree(
        candidates=index_array(
            "draft_tokens", draft_tokens, (b * n,) if np.ndim(draft_tokens) == 1 else (b, n)
        ).reshape(b, n),
        retrieve_index=retrieve_index,
        next_token=index_array("retrieve_next_token", retrieve_next_token, (b, n)),
        next_sibling=index_array("retrieve_next_sibling", retrieve_next_sibling, (b, n)),
    )
    logits = float_array("logits", logits, (b * n, None), _LOGIT_DTYPES)
    if logits.shape[1] < 1:
        raise ValueError(f"logits: expected a vocab size >= 1, got {logits.shape=}")

    if greedy:
        out = _greedy(logits, tree, num_steps=s, topk=config.topk)
    else:
        if temperatures is None:
            raise ValueError("temperatures: required (shape (B,), float32) when greedy=False")
        if np.ndim(temperatures) == 2:
            check_shape("temperatures", temperatures, (b, 1))
            temperatures = jnp.reshape(temperatures, (b,))
        host_t = host_values(temperatures)
        temperatures = float_array("temperatures", temperatures, (b,), (np.float32,))
        if host_t is not None and host_t.size and not (host_t >= 0).all():
            raise ValueError(f"temperatures: expected values >= 0 (0 = greedy), got min={host_t.min()}")
        if top_ks is not None:
            top_ks = top_k_arg("top_ks", top_ks, b)
        if top_ps is not None:
            top_ps = top_p_arg("top_ps", top_ps, b, (np.float32,))
        if uniform_samples is None or uniform_samples_for_final_sampling is None:
            raise ValueError(
                "uniform_samples / uniform_samples_for_final_sampling: required ((B, N) and (B,) float32 "
                "coins in [0, 1), see make_coins) when greedy=False"
            )
        coins = float_array("uniform_samples", uniform_samples, (b, n), (np.float32,))
        final = float_array(
            "uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (b,), (np.float32,)
        )
        out = _validate.call_checked(
            _sampling,
            logits,
            tree,
            temperatures,
            top_ks,
            top_ps,
            coins,
            final,
            num_steps=s,
            topk=config.topk,
            threshold_single=threshold("threshold_single", threshold_single),
            threshold_acc=threshold("threshold_acc", threshold_acc),
        )
    return out


@jax.jit
def _fill_bonus_tokens(predict, accept_index, accept_lens):
    col = jnp.clip(accept_lens - 1, 0, accept_index.shape[1] - 1)
    node = jnp.take_along_axis(accept_index, col[:, None], axis=1)[:, 0]
    return jnp.take(predict, node, mode="clip")


def fill_bonus_tokens(
    predict: Int32[Array, "T"], accept_index: Int32[Array, "B A"], accept_lens: Int32[Array, "B"]
) -> Int32[Array, "B"]:
    """``bonus[b] = predict[accept_index[b, accept_lens[b] - 1]]`` (SGLang 0.5.23 ``fill_bonus_tokens``).

    The 0.5.23 row stride ``accept_index.shape[1]`` is implied by the 2-D indexing. For valid inputs
    (``1 <= accept_lens <= S+1``) the read node is never a -1 pad; out-of-range values are clipped
    here (upstream would read a neighbouring row or wrap to ``predict[-1]``). Output ``(B,)`` int32.
    """
    predict = index_array("predict", predict, (None,))
    accept_index = index_array("accept_index", accept_index, (None, None))
    accept_lens = index_array("accept_lens", accept_lens, (accept_index.shape[0],))
    return _fill_bonus_tokens(predict, accept_index, accept_lens)
