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

Upstream runs one CUDA thread (block) per request and walks the tree scalar by scalar. Here the same
walk is vectorised over the batch: an unrolled loop over the ``S`` depth levels and, per level, a
sibling scan: ``topk`` unrolled steps when the caller gives the ``topk`` bound (``eagle_sample`` always
does; straight-line code), else an early-exit ``lax.while_loop`` bounded by ``N`` iterations. Shapes
are static; nothing syncs to the host. Checked mode (``jaxspec.checks()``) is a static argument of the
jitted cores that carry value checks (sampling, renormalisation).

Outputs are functional (upstream mutates ``predicts`` / ``accept_index`` / ``accept_token_num`` and
``draft_probs`` in place). All integer outputs are int32; SGLang carries the tree arrays as int64 --
the values are identical. Inputs are assumed to be a valid tree as produced by ``build_tree``:
``retrieve_index[b, j] == b*N + j`` is what upstream produces, and duplicated or out-of-range global ids
give unspecified (but memory-safe) results here, where upstream would write out of bounds.

Size note: this module is over 500 lines on purpose: greedy verify and the target-only / chain
rejection samplers share one tree walk (``_Walk``, ``_Siblings``) and its argument checks, and upstream
keeps them in one file pair (``speculative/tree.py`` + ``sampling.py``); splitting them would put the
walk and its checks in a third module that both halves import.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify
from jaxtyping import Array, Bool, Float, Int32

from jaxspec import _validate
from jaxspec._validate import check_shape, float_array, index_array, static_int


def _unroll_walk() -> bool:
    """Unroll the tree walk's static loops (S levels x K siblings) on accelerators, where a rolled loop reads its
    predicate on the host every trip; keep them rolled on CPU, where XLA's fusion duplicates an unrolled walk
    into every consumer and the LLVM compile grows super-linearly (measured, tree SpecConfig(5, 4, 8) engine
    step: > 150 s at batch 4 unrolled, seconds rolled)."""
    return jax.default_backend() != "cpu"


THRESHOLD_ACC_MIN = 1e-9  # the 0.5.23 launcher clamps threshold_acc to >= 1e-9 (sampling.cuh host code)
_FLOAT_DTYPES = (np.float32,)


class VerifyOutput(NamedTuple):
    """Result of tree verification (greedy or target-only sampling).

    predict: ``(B*N,)`` int32. ``predict[g]`` is the token chosen *after* node ``g`` on the accepted
        path (the next accepted draft, or the bonus/correction token after the last accepted node).
        Every other entry is 0: upstream leaves them at the caller's initial value, which is 0 in
        ``eagle_sample`` (and -1 in SGLang's kernel unit tests).
    accept_index: ``(B, S+1)`` int32 global node ids (``retrieve_index`` values) of the accepted path,
        root first, padded with -1.
    num_correct_drafts: ``(B,)`` int32 number of accepted draft tokens (excludes the root/bonus);
        upstream's ``accept_token_num``.
    """

    predict: Int32[Array, "T"]
    accept_index: Int32[Array, "B A"]
    num_correct_drafts: Int32[Array, "B"]


class _Tree(NamedTuple):
    candidates: Int32[Array, "B N"]
    retrieve_index: Int32[Array, "B N"]
    next_token: Int32[Array, "B N"]
    next_sibling: Int32[Array, "B N"]


class _Walk(NamedTuple):
    """Per-request state of the acceptance walk (vectorised over B)."""

    node: Int32[Array, "B"]  # local index of the last accepted node (= row of the current parent)
    last: Int32[Array, "B"]  # its global id (retrieve_index value)
    num: Int32[Array, "B"]  # accepted drafts so far
    alive: Bool[Array, "B"]  # the previous level accepted a child (the walk goes on)
    accept_index: Int32[Array, "B A"]
    accept_tokens: Int32[Array, "B A"]  # accept_tokens[b, i] = candidate token of the i-th accepted node
    prob_acc: Float[Array, "B"]  # sampling only: target mass of the siblings tried at this level
    coin: Float[Array, "B"]  # sampling only: coin of the last accepted node
    rejected: Bool[Array, "B N"]  # sampling only: siblings rejected under the current row


class _Siblings(NamedTuple):
    """State of the inner sibling scan of one level."""

    cur: Int32[Array, "B"]  # candidate under test (local index); -1 when the sibling list is exhausted
    searching: Bool[Array, "B"]
    found: Bool[Array, "B"]
    prob_acc: Float[Array, "B"]
    rejected: Bool[Array, "B N"]
    steps: Int32[Array, ""]


_ints = index_array  # tracer-safe; no host read for int32 arrays


def _floats(name: str, x, shape=None, dtypes=_FLOAT_DTYPES):
    return float_array(name, x, shape, dtypes)


def _row_take(x, idx):
    """``x[b, idx[b]]`` for every row ``b`` (indices clipped into range)."""
    return jnp.take_along_axis(x, idx[:, None], axis=1, mode="clip")[:, 0]


def _tree_walk(tree: _Tree, num_steps: int, topk: int | None, accept_fn, coins=None) -> _Walk:
    """The shared acceptance walk of ``VerifyTreeGreedy`` / ``TreeSpeculativeSamplingTargetOnly``.

    ``accept_fn(walk, cur, tok, prob_acc) -> (accept, new_prob_acc)`` decides, for every request, whether
    candidate ``cur`` (token ``tok``) is accepted; it is only consulted for requests still searching.

    ``topk`` given: every node has at most ``topk`` children (true of every ``build_tree`` output), so
    the sibling scan is ``topk`` unrolled steps and the whole walk is straight-line code (no
    ``while_loop``, whose per-iteration predicate costs a device round trip on GPU). ``topk=None``: an
    early-exit ``while_loop`` bounded by ``N`` (any sibling-list length).
    """
    b, n = tree.candidates.shape
    a = num_steps + 1
    iota_n = lax.broadcasted_iota(jnp.int32, (b, n), 1)
    iota_a = lax.broadcasted_iota(jnp.int32, (b, a), 1)
    root = tree.retrieve_index[:, 0]
    zeros_b = jnp.zeros((b,), jnp.int32)
    init = _Walk(
        node=zeros_b,
        last=root,
        num=zeros_b,
        alive=jnp.ones((b,), bool),
        accept_index=jnp.where(iota_a == 0, root[:, None], -1),
        accept_tokens=jnp.zeros((b, a), jnp.int32),
        prob_acc=jnp.zeros((b,), jnp.float32),
        coin=jnp.zeros((b,), jnp.float32) if coins is None else coins[:, 0],
        rejected=jnp.zeros((b, n), bool),
    )

    def sibling_body(s: _Siblings, walk: _Walk) -> _Siblings:
        cur = jnp.clip(s.cur, 0, n - 1)
        tok = _row_take(tree.candidates, cur)
        accept, new_acc = accept_fn(walk, cur, tok, s.prob_acc)
        accept = accept & s.searching
        reject = s.searching & ~accept
        nxt = jnp.where(reject, _row_take(tree.next_sibling, cur), s.cur)
        return _Siblings(
            cur=nxt,
            searching=reject & (nxt != -1),
            found=s.found | accept,
            prob_acc=jnp.where(s.searching, new_acc, s.prob_acc),
            rejected=s.rejected | (reject[:, None] & (iota_n == cur[:, None])),
            steps=s.steps + 1,
        )

    def level(_, walk: _Walk) -> _Walk:
        first = jnp.where(walk.alive, _row_take(tree.next_token, walk.node), -1)
        s0 = _Siblings(
            cur=first,
            searching=first != -1,
            found=jnp.zeros((b,), bool),
            prob_acc=walk.prob_acc,
            rejected=walk.rejected,
            steps=jnp.zeros((), jnp.int32),
        )
        if topk is None:
            # Bounded by N: a valid sibling list has fewer than N entries (upstream loops unboundedly).
            s = lax.while_loop(
                lambda s: (s.steps < n) & jnp.any(s.searching), lambda s: sibling_body(s, walk), s0
            )
        else:
            s = lax.fori_loop(0, topk, lambda _, s: sibling_body(s, walk), s0, unroll=_unroll_walk())
        found = s.found
        node = jnp.clip(s.cur, 0, n - 1)
        gid = _row_take(tree.retrieve_index, node)
        num = walk.num + found.astype(jnp.int32)
        slot = found[:, None] & (iota_a == num[:, None])
        coin = walk.coin if coins is None else jnp.where(found, _row_take(coins, node), walk.coin)
        return _Walk(
            node=jnp.where(found, node, walk.node),
            last=jnp.where(found, gid, walk.last),
            num=num,
            alive=found,
            accept_index=jnp.where(slot, gid[:, None], walk.accept_index),
            accept_tokens=jnp.where(slot, _row_take(tree.candidates, node)[:, None], walk.accept_tokens),
            prob_acc=jnp.where(found, 0.0, s.prob_acc),
            coin=coin,
            rejected=s.rejected & ~found[:, None],
        )

    return lax.fori_loop(0, num_steps, level, init, unroll=_unroll_walk())


def _scatter_predict(num_nodes: int, accept_index, values):
    """``predict`` (zeros) with ``predict[accept_index[b, i]] = values[b, i]`` for every valid entry."""
    idx = jnp.where(accept_index >= 0, accept_index, num_nodes)  # -1 padding -> out of range -> dropped
    return jnp.zeros((num_nodes,), jnp.int32).at[idx.reshape(-1)].set(values.reshape(-1), mode="drop")


def _validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling):
    retrieve_index = _ints("retrieve_index", retrieve_index)
    if retrieve_index.ndim != 2:
        check_shape("retrieve_index", retrieve_index, (None, None))
    shape = tuple(retrieve_index.shape)
    return _Tree(
        candidates=_ints("candidates", candidates, shape),
        retrieve_index=retrieve_index,
        next_token=_ints("retrieve_next_token", retrieve_next_token, shape),
        next_sibling=_ints("retrieve_next_sibling", retrieve_next_sibling, shape),
    )


# ----------------------------------------------------------------------------------------------------
# verify_tree_greedy (§4)
# ----------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_steps", "topk"))
def _verify_tree_greedy(tree: _Tree, target_predict, *, num_steps: int, topk: int | None) -> VerifyOutput:
    b, n = tree.candidates.shape
    tp_flat = target_predict.reshape(-1)  # indexed with *global* node ids, as upstream

    def accept_fn(walk, cur, tok, prob_acc):
        return tok == tp_flat[jnp.clip(walk.last, 0, b * n - 1)], prob_acc

    walk = _tree_walk(tree, num_steps, topk, accept_fn)
    # predict[g] = target_predict.flat[g] on the path: for an accepted step that value equals the
    # accepted child's token; after the last accepted node it is the bonus token.
    values = tp_flat[jnp.clip(walk.accept_index, 0, b * n - 1)]
    predict = _scatter_predict(b * n, walk.accept_index, values)
    return VerifyOutput(predict, walk.accept_index, walk.num)


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
    tree = _validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling)
    target_predict = _ints("target_predict", target_predict, tuple(tree.candidates.shape))
    topk = None if topk is None else static_int("topk", topk, lo=1)
    return _verify_tree_greedy(tree, target_predict, num_steps=num_steps, topk=topk)


# ----------------------------------------------------------------------------------------------------
# tree_speculative_sampling_target_only (§5)
# ----------------------------------------------------------------------------------------------------


def sample_residual(
    residual: Float[Array, "B V"], coin: Float[Array, "B"]
) -> Int32[Array, "B"]:
    """Inverse-CDF sampling from the unnormalised ``residual`` with FlashInfer's index rule.

    ``u = coin * sum(residual)``; the sample is the first index ``i`` with ``residual[i] > 0`` and
    inclusive prefix sum ``> u``; if there is none, the last index with ``residual > 0``, else ``V - 1``.

    Float order: this uses a plain ``sum`` / ``cumsum``. FlashInfer reduces with a 1024-thread block
    reduce and a deterministic block scan, so the two agree exactly whenever the partial sums are exact
    (e.g. dyadic probabilities such as multiples of 2**-10), and otherwise only away from CDF boundaries
    (``u`` within rounding distance of a prefix sum may pick a neighbouring index).
    """
    v = residual.shape[-1]
    total = jnp.sum(residual, axis=-1)
    u = coin * total
    positive = residual > 0  # NaN entries are not positive: a row without positive mass samples V - 1
    hit = positive & (jnp.cumsum(residual, axis=-1) > u[:, None])
    first_hit = jnp.argmax(hit, axis=-1).astype(jnp.int32)
    last_positive = (v - 1 - jnp.argmax(positive[:, ::-1], axis=-1)).astype(jnp.int32)
    fallback = jnp.where(jnp.any(positive, axis=-1), last_positive, v - 1)
    return jnp.where(jnp.any(hit, axis=-1), first_hit, fallback)


def _check_probs(name, probs):
    """Checked mode: finite, non-negative probabilities with positive mass in every row."""
    checkify.check(jnp.all(jnp.isfinite(probs) & (probs >= 0)), f"{name}: expected finite, non-negative values")
    checkify.check(jnp.all(jnp.sum(probs, axis=-1) > 0), f"{name}: a row has no probability mass")


def _check_coins(name, coins):
    checkify.check(jnp.all((coins >= 0) & (coins < 1)), f"{name}: expected coins in [0, 1)")


@functools.partial(jax.jit, static_argnames=("num_steps", "topk", "threshold_single", "threshold_acc", "checks"))
def _tree_speculative_sampling(
    tree: _Tree, coins, final_coins, target_probs, draft_probs, *, num_steps, topk, threshold_single, threshold_acc,
    checks=False,
) -> VerifyOutput:
    if checks:
        _check_probs("target_probs", target_probs)
        _check_coins("uniform_samples", coins)
        _check_coins("uniform_samples_for_final_sampling", final_coins)
    b, n, v = target_probs.shape
    rows = jnp.arange(b, dtype=jnp.int32) * n
    target2d = target_probs.reshape(b * n, v)
    # float32 like the CUDA kernel's DType thresholds; clamp as the 0.5.23 launcher does.
    thr_acc = np.float32(max(threshold_acc, THRESHOLD_ACC_MIN))
    thr_single = np.float32(threshold_single)

    def accept_fn(walk, cur, tok, prob_acc):
        # Target mass of the candidate under the current parent's row (rows use *local* node indices).
        p = target2d[rows + walk.node, jnp.clip(tok, 0, v - 1)]
        acc = prob_acc + p
        accept = (p > 0) & ((walk.coin < acc / thr_acc) | (p >= thr_single))
        return accept, acc

    walk = _tree_walk(tree, num_steps, topk, accept_fn, coins=coins)

    # Bonus / correction token: sample max(q - p, 0) on the last accepted node's row. Upstream wrote
    # p[row, tok] = q[row, tok] for every rejected sibling (mutating draft_probs); the only such writes
    # on the row read here are the siblings rejected after the last acceptance, tracked in `rejected`.
    row = rows + walk.node
    q = target2d[row]
    p = jnp.zeros_like(q) if draft_probs is None else draft_probs.reshape(b * n, v)[row]
    tok = jnp.clip(tree.candidates, 0, v - 1)
    p = p.at[jnp.arange(b)[:, None], jnp.where(walk.rejected, tok, v)].set(
        jnp.take_along_axis(q, tok, axis=1), mode="drop"
    )
    p = jnp.where((walk.num == num_steps)[:, None], 0.0, p)  # "no draft probs for the bonus token"
    bonus = sample_residual(jnp.maximum(q - p, 0.0), final_coins)

    # predict[accept_index[b, i]] = token of the (i+1)-th accepted node; bonus after the last one.
    iota_a = lax.broadcasted_iota(jnp.int32, walk.accept_index.shape, 1)
    shifted = jnp.concatenate([walk.accept_tokens[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
    values = jnp.where(iota_a == walk.num[:, None], bonus[:, None], shifted)
    predict = _scatter_predict(b * n, walk.accept_index, values)
    return VerifyOutput(predict, walk.accept_index, walk.num)


def _threshold(name: str, x) -> float:
    """Thresholds are static Python floats (server configuration, as upstream's ``float`` arguments)."""
    if not isinstance(x, (int, float, np.floating, np.integer)) or isinstance(x, bool):
        raise ValueError(f"{name}: expected a Python float in [0, 1] (static), got {x!r}")
    if not 0.0 <= float(x) <= 1.0:
        raise ValueError(f"{name}: expected a value in [0, 1], got {x}")
    return float(x)


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
    tree = _validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling)
    b, n = tree.candidates.shape
    coins = _floats("uniform_samples", uniform_samples, (b, n), _FLOAT_DTYPES)
    final = _floats("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (b,))
    target_probs = _floats("target_probs", target_probs, (b, n, None), _FLOAT_DTYPES)
    if target_probs.shape[-1] < 1:
        raise ValueError(f"target_probs: expected a vocab size >= 1, got {target_probs.shape=}")
    if draft_probs is not None:
        draft_probs = _floats("draft_probs", draft_probs, tuple(target_probs.shape), _FLOAT_DTYPES)
    return _validate.call_checked(
        _tree_speculative_sampling,
        tree,
        coins,
        final,
        target_probs,
        draft_probs,
        num_steps=num_steps,
        topk=None if topk is None else static_int("topk", topk, lo=1),
        threshold_single=_threshold("threshold_single", threshold_single),
        threshold_acc=_threshold("threshold_acc", threshold_acc),
    )


# ----------------------------------------------------------------------------------------------------
# chain_speculative_sampling: the classic rule with draft probabilities (not an SGLang op)
# ----------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("checks",))
def _chain_speculative_sampling(candidates, coins, final_coins, target_probs, draft_probs, *, checks=False):
    if checks:
        _check_probs("target_probs", target_probs)
        _check_coins("uniform_samples", coins)
        _check_coins("uniform_samples_for_final_sampling", final_coins)
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
    return VerifyOutput(_scatter_predict(b * n, accept_index, values), accept_index, num)


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
    candidates = _ints("candidates", candidates, (None, None))
    b, n = candidates.shape
    if n < 2:
        raise ValueError(f"candidates: expected a chain of N >= 2 nodes (root + drafts), got shape {candidates.shape}")
    coins = _floats("uniform_samples", uniform_samples, (b, n))
    final = _floats("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (b,))
    target_probs = _floats("target_probs", target_probs, (b, n, None))
    v = target_probs.shape[-1]
    if v < 1:
        raise ValueError(f"target_probs: expected a vocab size >= 1, got {target_probs.shape=}")
    draft_probs = _floats("draft_probs", draft_probs, (b, n - 1, v))
    return _validate.call_checked(_chain_speculative_sampling, candidates, coins, final, target_probs, draft_probs)


# ----------------------------------------------------------------------------------------------------
# top-k / top-p renormalisation (FlashInfer semantics)
# ----------------------------------------------------------------------------------------------------


def _sorted_desc(probs):
    return jnp.flip(jnp.sort(probs, axis=-1), axis=-1)


def _renorm_keep(probs, pivot):
    kept = jnp.where(probs >= pivot[:, None], probs, 0.0)
    total = jnp.sum(kept, axis=-1, keepdims=True)
    return jnp.where(total > 0, kept / total, kept)  # a row without mass stays all-zero (not 0/0 = NaN)


def _check_top_k(top_k):
    checkify.check(jnp.all(top_k >= 1), "top_k: expected values >= 1")


def _check_top_p(top_p):
    checkify.check(jnp.all((top_p > 0) & (top_p <= 1)), "top_p: expected values in (0, 1]")


@functools.partial(jax.jit, static_argnames=("checks",))
def _top_k_renorm(probs, top_k, *, checks=False):
    if checks:
        _check_top_k(top_k)
    v = probs.shape[-1]
    k = jnp.clip(top_k, 1, v)
    pivot = _row_take(_sorted_desc(probs), k - 1)
    return _renorm_keep(probs, pivot)


@functools.partial(jax.jit, static_argnames=("checks",))
def _top_p_renorm(probs, top_p, *, checks=False):
    if checks:
        _check_top_p(top_p)
    v = probs.shape[-1]
    desc = _sorted_desc(probs)
    reached = jnp.cumsum(desc, axis=-1) >= top_p[:, None]
    idx = jnp.where(jnp.any(reached, axis=-1), jnp.argmax(reached, axis=-1), v - 1).astype(jnp.int32)
    return _renorm_keep(probs, _row_take(desc, idx))


def _host_values(x):
    """Host-side values for a value check, only when ``x`` already lives on the host (no device sync)."""
    return np.asarray(x) if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float)) else None


def _top_k_arg(name: str, top_k, rows: int):
    """Validate per-row ``top_k`` (int, shape ``(rows,)``, values ``>= 1`` when known on the host)."""
    vals = _host_values(top_k)
    top_k = _ints(name, top_k, (rows,))
    if vals is not None and vals.size and vals.min() < 1:
        raise ValueError(f"{name}: expected values >= 1, got {int(vals.min())}")
    return top_k


def _top_p_arg(name: str, top_p, rows: int, dtypes=_FLOAT_DTYPES):
    """Validate per-row ``top_p`` (float, shape ``(rows,)``, values in ``(0, 1]`` when known on the host)."""
    vals = _host_values(top_p)
    top_p = _floats(name, top_p, (rows,), dtypes)
    if vals is not None and vals.size and not ((vals > 0).all() and (vals <= 1).all()):
        raise ValueError(f"{name}: expected values in (0, 1], got min={vals.min()} max={vals.max()}")
    return top_p


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
    probs = _floats("probs", probs, (None, None), _FLOAT_DTYPES)
    return _validate.call_checked(_top_k_renorm, probs, _top_k_arg("top_k", top_k, probs.shape[0]))


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
    probs = _floats("probs", probs, (None, None), _FLOAT_DTYPES)
    return _validate.call_checked(_top_p_renorm, probs, _top_p_arg("top_p", top_p, probs.shape[0]))
