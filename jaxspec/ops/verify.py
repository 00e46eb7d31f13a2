"""Tree verification: SGLang 0.5.23 ``python/sglang/kernels/ops/speculative/{tree,sampling}.py``.

Mirrors, as pure jittable JAX:

* ``verify_tree_greedy`` -- ``tree.py::verify_tree_greedy`` (device code ``VerifyTreeGreedy`` in
  ``kernels/jit/include/sgl_kernel/speculative/eagle.cuh``), SGLang 0.5.23;
* ``tree_speculative_sampling_target_only`` -- ``sampling.py::tree_speculative_sampling_target_only``
  (device code ``TreeSpeculativeSamplingTargetOnly`` in ``.../speculative/sampling.cuh``), SGLang 0.5.23:
  strict ``coin < prob_acc / thr_acc`` and the ``p > 0`` guard (the older AOT ``sgl-kernel`` used
  ``<=`` and no guard);
* ``top_k_renorm_prob`` / ``top_p_renorm_prob`` -- FlashInfer ``top_k_renorm_probs`` /
  ``top_p_renorm_probs`` as resolved by ``python/sglang/kernels/ops/sampling/renorm.py`` on CUDA.

The tree walk both verifiers share is ``ops.tree_walk`` (vectorised over the batch, static shapes, no host
sync), the argument checks ``ops.args`` and the renormalisation cores ``ops.renorm``. Checked mode
(``jaxspec.checks()``) is a static argument of the jitted cores that carry value checks (sampling,
renormalisation).

Outputs are functional (upstream mutates ``predicts`` / ``accept_index`` / ``accept_token_num`` and
``draft_probs`` in place). All integer outputs are int32; SGLang carries the tree arrays as int64 --
the values are identical. Inputs are assumed to be a valid tree as produced by ``build_tree``:
``retrieve_index[b, j] == b*N + j`` is what upstream produces, and duplicated or out-of-range global ids
give unspecified (but memory-safe) results here, where upstream would write out of bounds.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int32

from jaxspec import _validate
from jaxspec._validate import float_array, index_array, static_int
from jaxspec.ops.args import FLOAT_DTYPES, threshold, top_k_arg, top_p_arg, validate_tree
from jaxspec.ops.renorm import top_k_renorm, top_p_renorm
from jaxspec.ops.tree_walk import (VerifyOutput, check_coins, check_probs, sample_residual, scatter_predict,
                                   tree_speculative_sampling_core, verify_tree_greedy_core)

__all__ = ["VerifyOutput", "chain_speculative_sampling", "sample_residual", "top_k_renorm_prob", "top_p_renorm_prob",
           "tree_speculative_sampling_target_only", "verify_tree_greedy"]


def verify_tree_greedy(
    candidates: Int32[Array, "B N"],
    retrieve_index: Int32[Array, "B N"],
    retrieve_next_token: Int32[Array, "B N"],
    retrieve_next_sibling: Int32[Array, "B N"],
    target_predict: Int32[Array, "B N"],
    *,
    num_steps: int,
    topk: int | None = None,
) -> VerifyOutput:
    """Greedy tree verification (SGLang 0.5.23 ``verify_tree_greedy``).

    Walks the tree from the root: at each level the first child (in sibling order) whose token equals
    the target's argmax after the current node is accepted; stops at the first level with no match or
    after ``num_steps`` accepted drafts.

    Args:
      candidates: ``(B, N)`` int tokens of the tree nodes (flat ``draft_tokens`` reshaped).
      retrieve_index, retrieve_next_token, retrieve_next_sibling: ``(B, N)`` int tree links (-1 = none).
      target_predict: ``(B, N)`` int target argmax per node, read with *global* node ids
        (``target_predict.flat[retrieve_index[b, j]]``) as upstream does.
      num_steps: static ``S``; ``accept_index`` has width ``S + 1``.
      topk: optional static ``K`` (upstream's ``verify_tree_greedy_func(topk=)``): promises at most
        ``K`` children per node (true of ``build_tree`` outputs) and makes the walk loop-free. With more
        siblings than ``K`` the scan stops after ``K`` of them. ``None``: no assumption.

    Returns:
      ``VerifyOutput(predict (B*N,), accept_index (B, S+1), num_correct_drafts (B,))``, all int32.
      Off-path ``predict`` entries are 0 (upstream: untouched caller buffer, zeros in eagle_sample).
    """
    num_steps = static_int("num_steps", num_steps, lo=1)
    tree = validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling)
    target_predict = index_array("target_predict", target_predict, tuple(tree.candidates.shape))
    topk = None if topk is None else static_int("topk", topk, lo=1)
    return verify_tree_greedy_core(tree, target_predict, num_steps=num_steps, topk=topk)


# ----------------------------------------------------------------------------------------------------
# tree_speculative_sampling_target_only
# ----------------------------------------------------------------------------------------------------


def tree_speculative_sampling_target_only(
    candidates: Int32[Array, "B N"],
    retrieve_index: Int32[Array, "B N"],
    retrieve_next_token: Int32[Array, "B N"],
    retrieve_next_sibling: Int32[Array, "B N"],
    uniform_samples: Float[Array, "B N"],
    uniform_samples_for_final_sampling: Float[Array, "B"],
    target_probs: Float[Array, "B N V"],
    draft_probs: Float[Array, "B N V"] | None = None,
    *,
    num_steps: int,
    topk: int | None = None,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> VerifyOutput:
    """Tree speculative sampling against target probabilities (SGLang 0.5.23 semantics).

    Acceptance walk: at each level the children of the last accepted node are tried in sibling order,
    accumulating ``prob_acc += p`` (``p = target_probs[b, parent, token]``); a child is accepted iff
    ``p > 0 and (coin < prob_acc / max(threshold_acc, 1e-9) or p >= threshold_single)``, where ``coin``
    is ``uniform_samples[b, parent]`` (the root's coin, then the coin of each accepted node). Each
    rejected child's mass is copied into the residual's ``draft_probs`` (functionally; the caller's
    array is never modified). With thresholds ``1/1`` this samples the target distribution exactly.

    The bonus/correction token after the last accepted node is drawn from ``max(q - p, 0)`` (``q`` the
    target row, ``p`` the residual draft row, or 0 once ``S`` drafts were accepted) with
    ``uniform_samples_for_final_sampling`` by inverse CDF (see ``sample_residual`` for the index rule
    and float-order caveat: exact for dyadic probabilities, else equal away from CDF boundaries).

    Invalid values: a target row without positive finite mass (all zero, all NaN) accepts no child and
    samples the sentinel token ``V - 1`` (FlashInfer's fallback index). Checked mode
    (``jaxspec.checks()``) flags non-finite or negative probabilities, rows without mass and coins
    outside ``[0, 1)``.

    Args:
      candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling: ``(B, N)`` int tree.
      uniform_samples: ``(B, N)`` float32 coins in ``[0, 1)`` (one per node).
      uniform_samples_for_final_sampling: ``(B,)`` float32 coins in ``[0, 1)``.
      target_probs: ``(B, N, V)`` float32 target distribution after each node.
      draft_probs: optional ``(B, N, V)`` float32; ``None`` means zeros (what eagle_sample passes).
      num_steps: static ``S``.
      topk: optional static ``K`` bound on children per node (see ``verify_tree_greedy``).
      threshold_single, threshold_acc: static acceptance thresholds in ``[0, 1]`` (used as float32).

    Returns:
      ``VerifyOutput`` (int32); off-path ``predict`` entries are 0.
    """
    num_steps = static_int("num_steps", num_steps, lo=1)
    tree = validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling)
    b, n = tree.candidates.shape
    coins = float_array("uniform_samples", uniform_samples, (b, n), FLOAT_DTYPES)
    final = float_array("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (b,))
    target_probs = float_array("target_probs", target_probs, (b, n, None), FLOAT_DTYPES)
    if target_probs.shape[-1] < 1:
        raise ValueError(f"target_probs: expected a vocab size >= 1, got {target_probs.shape=}")
    if draft_probs is not None:
        draft_probs = float_array("draft_probs", draft_probs, tuple(target_probs.shape), FLOAT_DTYPES)
    return _validate.call_checked(
        tree_speculative_sampling_core,
        tree,
        coins,
        final,
        target_probs,
        draft_probs,
        num_steps=num_steps,
        topk=None if topk is None else static_int("topk", topk, lo=1),
        threshold_single=threshold("threshold_single", threshold_single),
        threshold_acc=threshold("threshold_acc", threshold_acc),
    )


# ----------------------------------------------------------------------------------------------------
# chain_speculative_sampling: the classic rule with draft probabilities (not an SGLang op)
# ----------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("checks",))
def _chain_speculative_sampling(candidates, coins, final_coins, target_probs, draft_probs, *, checks=False):
    if checks:
        check_probs("target_probs", target_probs)
        check_coins("uniform_samples", coins)
        check_coins("uniform_samples_for_final_sampling", final_coins)
    b, n, v = target_probs.shape
    s = n - 1
    x = jnp.clip(candidates[:, 1:], 0, v - 1)  # (B, S) drafts; draft i+1 is judged on the row of node i
    p = jnp.take_along_axis(target_probs[:, :s], x[..., None], axis=2)[..., 0]
    q = jnp.take_along_axis(draft_probs, x[..., None], axis=2)[..., 0]
    # Accept with probability min(1, p/q): coin < p/q, written without a division (q = 0 accepts iff p > 0).
    ok = (p > 0) & (coins[:, :s] * q < p)
    num = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    # Correction after a rejection at depth `num`: norm(max(p - q, 0)); after S acceptances: p itself.
    row_p = _row_take3(target_probs, num)
    row_q = jnp.where((num < s)[:, None], _row_take3(draft_probs, jnp.minimum(num, s - 1)), 0.0)
    residual = jnp.maximum(row_p - row_q, 0.0)
    residual = jnp.where(jnp.sum(residual, axis=-1, keepdims=True) > 0, residual, row_p)  # float-rounding guard
    bonus = sample_residual(residual, final_coins)
    iota = lax.broadcasted_iota(jnp.int32, (b, s + 1), 1)
    gid = jnp.arange(b, dtype=jnp.int32)[:, None] * n + iota
    accept_index = jnp.where(iota <= num[:, None], gid, -1)
    shifted = jnp.concatenate([candidates[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
    values = jnp.where(iota == num[:, None], bonus[:, None], shifted)
    return VerifyOutput(scatter_predict(b * n, accept_index, values), accept_index, num)


def _row_take3(x, idx):
    """``x[b, idx[b], :]`` for ``x (B, M, V)``."""
    return jnp.take_along_axis(x, idx[:, None, None], axis=1, mode="clip")[:, 0]


def chain_speculative_sampling(
    candidates: Int32[Array, "B N"],
    uniform_samples: Float[Array, "B N"],
    uniform_samples_for_final_sampling: Float[Array, "B"],
    target_probs: Float[Array, "B N V"],
    draft_probs: Float[Array, "B S V"],
) -> VerifyOutput:
    """Speculative sampling of a chain with the draft's probabilities (Leviathan et al. / Chen et al. 2023).

    Node ``0`` of ``candidates`` is the root, node ``j >= 1`` the ``j``-th draft token ``x_j``, which the
    drafter SAMPLED from ``draft_probs[b, j - 1]`` (``q_j``, its processed distribution given the root and
    ``x_1..x_{j-1}``); ``target_probs[b, j]`` (``p_j``) is the target's distribution after node ``j``. Drafts
    are accepted in order, ``x_j`` with probability ``min(1, p_{j-1}(x_j) / q_j(x_j))``
    (``coin[b, j-1] * q < p``, coins ``uniform_samples``); at the first rejection the correction token is
    drawn from ``norm(max(p - q, 0))`` of that depth, after ``S`` acceptances from ``p_S``
    (``uniform_samples_for_final_sampling``, inverse CDF, ``sample_residual``). Every committed token is
    then distributed exactly as sampling the target token by token, whatever ``q`` is, provided the
    drafts really were drawn from ``q`` with coins independent of the verify coins. A one-hot ``p`` (greedy
    target row) accepts exactly the target's argmax and corrects to it.

    Not an SGLang op (SGLang's ``tree_speculative_sampling_target_only`` accepts with ``p`` alone and uses
    no draft probabilities): this is the classic rule, exact for chains. Outputs follow the tree ops'
    layout: ``VerifyOutput(predict (B*N,), accept_index (B, N) = b*N + i for i <= accepted else -1,
    num_correct_drafts (B,))`` (``build_chain_tree``'s ``retrieve_index`` numbering).

    Args:
      candidates: ``(B, N)`` int chain tokens (root first), ``N = S + 1 >= 2``.
      uniform_samples: ``(B, N)`` float32 coins in ``[0, 1)`` (column ``j`` judges draft ``j + 1``; the
        last column is unused, kept for the tree ops' coin shape).
      uniform_samples_for_final_sampling: ``(B,)`` float32 coins in ``[0, 1)``.
      target_probs: ``(B, N, V)`` float32; draft_probs: ``(B, N - 1, V)`` float32.
    """
    candidates = index_array("candidates", candidates, (None, None))
    b, n = candidates.shape
    if n < 2:
        raise ValueError(f"candidates: expected a chain of N >= 2 nodes (root + drafts), got shape {candidates.shape}")
    coins = float_array("uniform_samples", uniform_samples, (b, n))
    final = float_array("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (b,))
    target_probs = float_array("target_probs", target_probs, (b, n, None))
    v = target_probs.shape[-1]
    if v < 1:
        raise ValueError(f"target_probs: expected a vocab size >= 1, got {target_probs.shape=}")
    draft_probs = float_array("draft_probs", draft_probs, (b, n - 1, v))
    return _validate.call_checked(_chain_speculative_sampling, candidates, coins, final, target_probs, draft_probs)


# ----------------------------------------------------------------------------------------------------
# top-k / top-p renormalisation (FlashInfer semantics)
# ----------------------------------------------------------------------------------------------------


def top_k_renorm_prob(probs: Float[Array, "R V"], top_k: Int32[Array, "R"]) -> Float[Array, "R V"]:
    """Keep each row's top-``k`` probabilities and renormalise (FlashInfer ``top_k_renorm_probs``).

    The pivot is the ``k``-th largest value (``k`` clipped to ``V``; SGLang's "no top-k" value ``1 << 30``
    keeps everything) and every entry ``>= pivot`` is kept, so ties at the pivot are all kept (the set
    may exceed ``k``): FlashInfer's pivot search and SGLang's HIP fallback behave the same way.
    Renormalised float values may differ from FlashInfer's in the last ulp (different sum order and
    FlashInfer multiplies by an approximate reciprocal); the kept set is exact.

    ``top_k`` values must be ``>= 1``: ``ValueError`` for host values, flagged in checked mode for traced
    ones; unchecked, a traced ``top_k < 1`` acts as 1. A row without mass comes back all-zero.
    """
    probs = float_array("probs", probs, (None, None), FLOAT_DTYPES)
    return _validate.call_checked(top_k_renorm, probs, top_k_arg("top_k", top_k, probs.shape[0]))


def top_p_renorm_prob(probs: Float[Array, "R V"], top_p: Float[Array, "R"]) -> Float[Array, "R V"]:
    """Keep each row's smallest top prefix with mass ``>= p`` and renormalise (FlashInfer semantics).

    Rows are sorted descending; the pivot is the first sorted value whose inclusive prefix sum reaches
    ``p`` (the last value if rounding never reaches it), and every entry ``>= pivot`` is kept, so a tie
    group at the boundary is kept whole. This is FlashInfer's ``top_p_renorm_probs`` (pivot search with
    invariant ``sum(probs > low) >= p``); SGLang's HIP Triton fallback keeps the set with mass ``> p``
    instead and differs when a prefix sum equals ``p`` exactly. Prefix sums use a plain cumsum, so a
    prefix within rounding distance of ``p`` may resolve differently from FlashInfer's block reduction.

    ``top_p`` values must lie in ``(0, 1]``: ``ValueError`` for host values, flagged in checked mode for
    traced ones; unchecked, a traced ``top_p <= 0`` keeps the top tie group and ``top_p > 1`` or NaN
    keeps the whole row. A row without mass comes back all-zero.
    """
    probs = float_array("probs", probs, (None, None), FLOAT_DTYPES)
    return _validate.call_checked(top_p_renorm, probs, top_p_arg("top_p", top_p, probs.shape[0]))
