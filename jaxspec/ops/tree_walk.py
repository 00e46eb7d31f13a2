"""The tree walk shared by the verifiers (``ops.verify``, ``ops.accept``): SGLang 0.5.23's acceptance walk of
``VerifyTreeGreedy`` / ``TreeSpeculativeSamplingTargetOnly`` vectorised over the batch, and the jitted cores of
greedy verification and target-only tree speculative sampling built on it.

Upstream runs one CUDA thread (block) per request and walks the tree scalar by scalar. Here the same walk is
vectorised over the batch: a loop over the ``S`` depth levels and, per level, a sibling scan: ``topk`` steps
when the caller gives the ``topk`` bound (``eagle_sample`` always does; straight-line code), else an
early-exit ``lax.while_loop`` bounded by ``N`` iterations. Shapes are static; nothing syncs to the host.
The cores take validated arrays (``ops.args``); the public ops in ``ops.verify`` / ``ops.accept`` check
their arguments and call them.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify
from jaxtyping import Array, Bool, Float, Int32


def unroll_walk() -> bool:
    """Unroll the tree walk's static loops (S levels x K siblings) on accelerators, where a rolled loop reads its
    predicate on the host every trip; keep them rolled on CPU, where XLA's fusion duplicates an unrolled walk
    into every consumer and the LLVM compile grows super-linearly (measured, tree SpecConfig(5, 4, 8) engine
    step: > 150 s at batch 4 unrolled, seconds rolled)."""
    return jax.default_backend() != "cpu"


THRESHOLD_ACC_MIN = 1e-9  # the 0.5.23 launcher clamps threshold_acc to >= 1e-9 (sampling.cuh host code)


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


class Tree(NamedTuple):
    candidates: Int32[Array, "B N"]
    retrieve_index: Int32[Array, "B N"]
    next_token: Int32[Array, "B N"]
    next_sibling: Int32[Array, "B N"]


class Walk(NamedTuple):
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


class Siblings(NamedTuple):
    """State of the inner sibling scan of one level."""

    cur: Int32[Array, "B"]  # candidate under test (local index); -1 when the sibling list is exhausted
    searching: Bool[Array, "B"]
    found: Bool[Array, "B"]
    prob_acc: Float[Array, "B"]
    rejected: Bool[Array, "B N"]
    steps: Int32[Array, ""]


def row_take(x, idx):
    """``x[b, idx[b]]`` for every row ``b`` (indices clipped into range)."""
    return jnp.take_along_axis(x, idx[:, None], axis=1, mode="clip")[:, 0]


def walk_tree(tree: Tree, num_steps: int, topk: int | None, accept_fn, coins=None) -> Walk:
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
    init = Walk(
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

    def sibling_body(s: Siblings, walk: Walk) -> Siblings:
        cur = jnp.clip(s.cur, 0, n - 1)
        tok = row_take(tree.candidates, cur)
        accept, new_acc = accept_fn(walk, cur, tok, s.prob_acc)
        accept = accept & s.searching
        reject = s.searching & ~accept
        nxt = jnp.where(reject, row_take(tree.next_sibling, cur), s.cur)
        return Siblings(
            cur=nxt,
            searching=reject & (nxt != -1),
            found=s.found | accept,
            prob_acc=jnp.where(s.searching, new_acc, s.prob_acc),
            rejected=s.rejected | (reject[:, None] & (iota_n == cur[:, None])),
            steps=s.steps + 1,
        )

    def level(_, walk: Walk) -> Walk:
        first = jnp.where(walk.alive, row_take(tree.next_token, walk.node), -1)
        s0 = Siblings(
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
            s = lax.fori_loop(0, topk, lambda _, s: sibling_body(s, walk), s0, unroll=unroll_walk())
        found = s.found
        node = jnp.clip(s.cur, 0, n - 1)
        gid = row_take(tree.retrieve_index, node)
        num = walk.num + found.astype(jnp.int32)
        slot = found[:, None] & (iota_a == num[:, None])
        coin = walk.coin if coins is None else jnp.where(found, row_take(coins, node), walk.coin)
        return Walk(
            node=jnp.where(found, node, walk.node),
            last=jnp.where(found, gid, walk.last),
            num=num,
            alive=found,
            accept_index=jnp.where(slot, gid[:, None], walk.accept_index),
            accept_tokens=jnp.where(slot, row_take(tree.candidates, node)[:, None], walk.accept_tokens),
            prob_acc=jnp.where(found, 0.0, s.prob_acc),
            coin=coin,
            rejected=s.rejected & ~found[:, None],
        )

    return lax.fori_loop(0, num_steps, level, init, unroll=unroll_walk())


def scatter_predict(num_nodes: int, accept_index, values):
    """``predict`` (zeros) with ``predict[accept_index[b, i]] = values[b, i]`` for every valid entry."""
    idx = jnp.where(accept_index >= 0, accept_index, num_nodes)  # -1 padding -> out of range -> dropped
    return jnp.zeros((num_nodes,), jnp.int32).at[idx.reshape(-1)].set(values.reshape(-1), mode="drop")


@functools.partial(jax.jit, static_argnames=("num_steps", "topk"))
def verify_tree_greedy_core(tree: Tree, target_predict, *, num_steps: int, topk: int | None) -> VerifyOutput:
    b, n = tree.candidates.shape
    tp_flat = target_predict.reshape(-1)  # indexed with *global* node ids, as upstream

    def accept_fn(walk, cur, tok, prob_acc):
        return tok == tp_flat[jnp.clip(walk.last, 0, b * n - 1)], prob_acc

    walk = walk_tree(tree, num_steps, topk, accept_fn)
    # predict[g] = target_predict.flat[g] on the path: for an accepted step that value equals the
    # accepted child's token; after the last accepted node it is the bonus token.
    values = tp_flat[jnp.clip(walk.accept_index, 0, b * n - 1)]
    predict = scatter_predict(b * n, walk.accept_index, values)
    return VerifyOutput(predict, walk.accept_index, walk.num)


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


def check_probs(name, probs):
    """Checked mode: finite, non-negative probabilities with positive mass in every row."""
    checkify.check(jnp.all(jnp.isfinite(probs) & (probs >= 0)), f"{name}: expected finite, non-negative values")
    checkify.check(jnp.all(jnp.sum(probs, axis=-1) > 0), f"{name}: a row has no probability mass")


def check_coins(name, coins):
    checkify.check(jnp.all((coins >= 0) & (coins < 1)), f"{name}: expected coins in [0, 1)")


@functools.partial(jax.jit, static_argnames=("num_steps", "topk", "threshold_single", "threshold_acc", "checks"))
def tree_speculative_sampling_core(
    tree: Tree, coins, final_coins, target_probs, draft_probs, *, num_steps, topk, threshold_single, threshold_acc,
    checks=False,
) -> VerifyOutput:
    if checks:
        check_probs("target_probs", target_probs)
        check_coins("uniform_samples", coins)
        check_coins("uniform_samples_for_final_sampling", final_coins)
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

    walk = walk_tree(tree, num_steps, topk, accept_fn, coins=coins)

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
    predict = scatter_predict(b * n, walk.accept_index, values)
    return VerifyOutput(predict, walk.accept_index, walk.num)
