"""Mirrors SGLang 0.5.23 ``select_top_k_tokens`` (python/sglang/srt/speculative/spec_utils.py), ``organize_draft_results`` (python/sglang/srt/speculative/eagle_utils.py) and ``MultiLayerEagleDraftWorker._draft_forward_organize`` + the K == 1 chain constants (multi_layer_eagle_worker_v2.py, base_spec_worker.py).

Draft-tree organisation (docs/ops.md: ``select_top_k_tokens``, ``organize_draft_results``): the per-step
beam expansion of the EAGLE draft loop and the top-(N-1) selection that turns the recorded candidates into
``parent_list`` / ``top_scores_index`` / ``draft_tokens`` for :func:`jaxspec.ops.tree.build_tree`.

Every function here is pure and jittable. Static sizes (``step``, ``topk``, ``num_draft_tokens``,
``config``) are keyword-only (``step`` is positional as upstream, but must be a Python int). The
public functions validate shapes/dtypes at trace time and then call a ``jax.jit`` core; they can
themselves be called inside a caller's ``jit``.

dtypes: SGLang carries token ids and flat candidate indices as int64; jaxspec returns the same
values as int32 (``jaxspec._validate.index_array``: concrete int64 inputs are range-checked before they
are narrowed; traced int64 / uint32 inputs are refused, pass int32 inside ``jit``).
Scores stay float32 (the score product is one IEEE fp32 multiply, bit-identical to torch).
"""

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Float32, Int32, Integer

from jaxspec._validate import check_shape, float_array, index_array, static_int
from jaxspec.config import SpecConfig, check_config

__all__ = [
    "TreeInfo",
    "SelectTopKOutput",
    "DraftResults",
    "select_top_k_tokens",
    "organize_draft_results",
    "organize_mtp_draft_results",
    "chain_draft_results",
    "fast_topk",
]


class TreeInfo(NamedTuple):
    """Per-step candidate record (upstream ``tree_info`` tuple).

    step 0: ``scores (B, 1, K)``, ``tokens (B, K)``, ``parents (B, K+1) = [-1, 0, .., K-1]``.
    step i >= 1: ``scores (B, K, K)`` (all K² path scores), ``tokens (B, K*K)``,
    ``parents (B, K)`` = flat score-list index of each selected beam (``cs_idx + K*K*(i-1) + K``).
    """

    scores: Float32[Array, "B _ K"]
    tokens: Int32[Array, "B _"]
    parents: Int32[Array, "B _"]


class SelectTopKOutput(NamedTuple):
    """Result of :func:`select_top_k_tokens`.

    input_ids: ``(B*K,)`` int32 tokens of the new beams, row-major (request, beam).
    hidden_states: ``(B*K, H)`` hidden state of each new beam's parent beam, or ``None``.
    scores: ``(B, K)`` float32 cumulative beam scores.
    tree_info: :class:`TreeInfo` candidate record of this step.
    """

    input_ids: Int32[Array, " BK"]
    hidden_states: Float[Array, "BK H"] | None
    scores: Float32[Array, "B K"]
    tree_info: TreeInfo


class DraftResults(NamedTuple):
    """Result of :func:`organize_draft_results` (all int32).

    parent_list: ``(B, J)``, ``J = K*(S-1)+1`` or 0 when ``S == 1``: flat candidate index of the
      beam held in each parent-beam slot.
    top_scores_index: ``(B, N-1)`` flat indices of the N-1 best candidates, sorted ascending.
    draft_tokens: ``(B, N-1)`` tokens of those candidates.
    """

    parent_list: Int32[Array, "B J"]
    top_scores_index: Int32[Array, "B N1"]
    draft_tokens: Int32[Array, "B N1"]


# --------------------------------------------------------------------------------------------
# select_top_k_tokens
# --------------------------------------------------------------------------------------------


def _total_order_key(x: jax.Array) -> jax.Array:
    """``f32`` -> ``i32`` keys in IEEE total order (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN)."""
    i = jax.lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where(i < 0, i ^ jnp.int32(0x7FFFFFFF), i)


def fast_topk(values: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """SGLang ``fast_topk`` along the last axis: ``K == 1`` is ``max`` (first maximal index),
    ``K > 1`` a descending top-k with the lower index first on ties (as ``lax.top_k``; torch.topk's
    tie order is unspecified, so tied inputs are outside the bit-exact contract).

    ``K > 1`` on float32 is ``K`` first-index argmaxes over total-order integer keys, each pick's key then
    replaced by the smallest int32: the same values and indices as ``lax.top_k``, in ``K`` reductions
    (on the H200, XLA's top-k kernel took ~12 us a call over an 8,192-token draft vocabulary, a fixed
    ~100 us of a tree round). Other dtypes, and ``K > 8``, use ``lax.top_k``."""
    if k == 1:
        idx = jnp.argmax(values, axis=-1, keepdims=True).astype(jnp.int32)
        return jnp.take_along_axis(values, idx, axis=-1), idx
    if values.dtype != jnp.float32 or k > 8:
        vals, idx = jax.lax.top_k(values, k)
        return vals, idx.astype(jnp.int32)
    keys = _total_order_key(values)
    iota = jax.lax.broadcasted_iota(jnp.int32, keys.shape, keys.ndim - 1)
    picks = []
    for _ in range(k):
        i = jnp.argmax(keys, axis=-1).astype(jnp.int32)
        picks.append(i)
        keys = jnp.where(iota == i[..., None], jnp.iinfo(jnp.int32).min, keys)
    idx = jnp.stack(picks, axis=-1)
    return jnp.take_along_axis(values, idx, axis=-1), idx


@functools.partial(jax.jit, static_argnames=("step", "topk"))
def _select_top_k_tokens_jit(topk_p, topk_index, hidden_states, scores, *, step, topk):
    k = topk
    if step == 0:
        b = topk_p.shape[0]
        input_ids = topk_index.reshape(b * k)
        if hidden_states is not None:
            hidden_states = jnp.repeat(hidden_states, k, axis=0, total_repeat_length=b * k)
        parents = jnp.broadcast_to(jnp.arange(-1, k, dtype=jnp.int32)[None, :], (b, k + 1))
        info = TreeInfo(topk_p[:, None, :], topk_index, parents)
        return SelectTopKOutput(input_ids, hidden_states, topk_p, info)

    b = scores.shape[0]
    expand = scores[:, :, None] * topk_p.reshape(b, k, k)  # (B, K, K): score(beam j) * p(child c)
    cs_p, cs_idx = fast_topk(expand.reshape(b, k * k), k)  # (B, K)
    flat_tok = topk_index.reshape(b, k * k)
    input_ids = jnp.take_along_axis(flat_tok, cs_idx, axis=1).reshape(b * k)
    if hidden_states is not None and hidden_states.shape[0] > 0:
        parent_row = jnp.arange(b, dtype=jnp.int32)[:, None] * k + cs_idx // k  # parent beam's row
        hidden_states = hidden_states[parent_row.reshape(b * k)]
    parents = cs_idx + jnp.int32(k * k * (step - 1) + k)
    return SelectTopKOutput(input_ids, hidden_states, cs_p, TreeInfo(expand, flat_tok, parents))


def select_top_k_tokens(
    step: int,
    topk_p: Float32[ArrayLike, "_ K"],
    topk_index: Integer[ArrayLike, "_ K"],
    hidden_states: Float[ArrayLike, "_ H"] | None,
    scores: Float32[ArrayLike, "B K"] | None,
    *,
    topk: int,
) -> SelectTopKOutput:
    """One beam-expansion step of the EAGLE draft loop (docs/ops.md, ``select_top_k_tokens``), jittable.

    ``step == 0``: ``topk_p``/``topk_index`` are ``(B, K)`` (the previous draft-extend's top-k),
    ``hidden_states (B, H)`` or ``None``, ``scores`` ignored (may be ``None``).
    ``step >= 1``: ``topk_p``/``topk_index`` are ``(B*K, K)`` (per-beam top-k of this step's draft
    forward), ``hidden_states (B*K, H)`` or ``None`` (a 0-row array also skips the gather),
    ``scores (B, K)`` float32 cumulative beam scores from the previous step.

    ``step`` is static (a Python int; it enters the flat-index offset), ``topk`` is static.
    Returns :class:`SelectTopKOutput`; ``input_ids`` and ``tree_info.tokens/parents`` are int32
    (int64 upstream, same values).

    Agreement with SGLang's torch original: exact (same tokens, parents, hidden rows, bit-equal
    scores) outside two classes of input, which the side-by-side harness generates and reports as
    named known differences (``python -m jaxspec.interop.check``, column "known"):

    * ties: when a row's ``K*K`` cumulative scores hold exactly equal values, jaxspec resolves the
      tie to the lowest flat index (``lax.top_k``); torch's top-k order among equal values is
      implementation-defined, so the chosen beams may differ (the selected score values do not).
    * subnormals: cumulative scores below ``1.18e-38`` (float32 subnormals) compare as 0 in
      jaxspec (XLA flushes subnormals to zero), so they tie at 0 and resolve to the lowest index;
      torch keeps them. Deep, wide trees over flat draft distributions can reach such scores.
    """
    step = static_int("step", step, lo=0)
    k = static_int("topk", topk, lo=1)
    if step == 0:
        p = float_array("topk_p", topk_p, (None, k))
        b = p.shape[0]
        idx = index_array("topk_index", topk_index, (b, k))
        if hidden_states is not None:
            check_shape("hidden_states", hidden_states, (b, None))
            hidden_states = jnp.asarray(hidden_states)
        return _select_top_k_tokens_jit(p, idx, hidden_states, None, step=0, topk=k)

    if scores is None:
        raise ValueError(f"scores: expected a float32 (B, {k}) array for step {step} >= 1, got None")
    s = float_array("scores", scores, (None, k))
    b = s.shape[0]
    p = float_array("topk_p", topk_p, (b * k, k))
    idx = index_array("topk_index", topk_index, (b * k, k))
    if hidden_states is not None:
        rows = np.shape(hidden_states)[0] if np.ndim(hidden_states) == 2 else -1
        if rows != 0:
            check_shape("hidden_states", hidden_states, (b * k, None))
        hidden_states = jnp.asarray(hidden_states)
    return _select_top_k_tokens_jit(p, idx, hidden_states, s, step=step, topk=k)


# --------------------------------------------------------------------------------------------
# organize_draft_results
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_draft_tokens",))
def _organize_jit(score_list, token_list, parents_list, *, num_draft_tokens):
    b = score_list[0].shape[0]
    scores_flat = jnp.concatenate([s.reshape(b, -1) for s in score_list], axis=1)
    tokens_flat = jnp.concatenate(token_list, axis=1)
    n1 = num_draft_tokens - 1
    if n1 > 0:
        _, sel = jax.lax.top_k(scores_flat, n1)  # values ignored, as upstream
        sel = jnp.sort(sel.astype(jnp.int32), axis=1)
    else:
        sel = jnp.zeros((b, 0), jnp.int32)
    draft_tokens = jnp.take_along_axis(tokens_flat, sel, axis=1)
    if len(parents_list) > 1:
        parent_list = jnp.concatenate(parents_list[:-1], axis=1)  # last step's beams have no children
    else:
        parent_list = jnp.zeros((b, 0), jnp.int32)
    return DraftResults(parent_list, sel, draft_tokens)


def organize_draft_results(
    score_list: Sequence[Float32[ArrayLike, "B ..."]],
    token_list: Sequence[Integer[ArrayLike, "B _"]],
    parents_list: Sequence[Integer[ArrayLike, "B _"]],
    *,
    num_draft_tokens: int,
) -> DraftResults:
    """Top-(N-1) candidate selection over all recorded draft steps (docs/ops.md, ``organize_draft_results``), jittable.

    ``score_list[i]`` / ``token_list[i]`` / ``parents_list[i]`` are the ``tree_info`` fields of
    step ``i`` (scores are flattened per request; token widths must match score widths).
    ``num_draft_tokens`` (N, static) includes the root, so ``N - 1`` candidates are kept, sorted
    by ascending flat index. ``parent_list`` concatenates every step's parents but the last one
    (``(B, 0)`` when there is a single step). Ties in the scores: ``lax.top_k`` keeps the lower
    index (torch.topk's order is unspecified). Returns int32 :class:`DraftResults`.
    """
    n = static_int("num_draft_tokens", num_draft_tokens, lo=1)
    if not (len(score_list) == len(token_list) == len(parents_list) >= 1):
        raise ValueError(
            "score_list, token_list, parents_list: expected equal non-zero lengths, got "
            f"{len(score_list)}, {len(token_list)}, {len(parents_list)}"
        )
    b = np.shape(score_list[0])[0] if np.ndim(score_list[0]) >= 1 else -1
    scores, tokens, parents = [], [], []
    width = 0
    for i, (s, t, p) in enumerate(zip(score_list, token_list, parents_list)):
        s = float_array(f"score_list[{i}]", s)
        if s.ndim < 1 or s.shape[0] != b:
            raise ValueError(f"score_list[{i}]: expected leading dimension B={b}, got shape {s.shape}")
        w = int(np.prod(s.shape[1:], dtype=np.int64))
        scores.append(s)
        tokens.append(index_array(f"token_list[{i}]", t, (b, w)))
        parents.append(index_array(f"parents_list[{i}]", p, (b, None)))
        width += w
    if n - 1 > width:
        raise ValueError(
            f"num_draft_tokens: N - 1 = {n - 1} exceeds the {width} recorded candidates per request"
        )
    return _organize_jit(scores, tokens, parents, num_draft_tokens=n)


# --------------------------------------------------------------------------------------------
# K == 1 chain constants and the multi-layer (MTP) organisation
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_steps",))
def _chain_jit(draft_tokens, *, num_steps):
    b = draft_tokens.shape[0]
    q = num_steps if num_steps > 1 else 0  # the last step's beam is dropped, as in the generic path
    parent_list = jnp.broadcast_to(jnp.arange(-1, q - 1, dtype=jnp.int32)[None, :], (b, q))
    score_index = jnp.broadcast_to(jnp.arange(num_steps, dtype=jnp.int32)[None, :], (b, num_steps))
    return DraftResults(parent_list, score_index, draft_tokens)


def chain_draft_results(draft_tokens: Integer[ArrayLike, "B S"], *, config: SpecConfig) -> DraftResults:
    """K == 1 shortcut of SGLang 0.5.23 (preallocated constants in ``base_spec_worker.py``).

    ``parent_list = [-1, 0, .., S-2]`` (width S, or 0 when S == 1), ``top_scores_index = [0..S-1]``,
    ``draft_tokens`` passed through (int32) — exactly what :func:`organize_draft_results` yields for
    a chain. Requires ``config.topk == 1`` (then ``N == S + 1``).
    """
    cfg = check_config(config)
    if cfg.topk != 1:
        raise ValueError(f"config.topk: chain_draft_results needs topk == 1, got {cfg.topk}")
    s = cfg.num_steps
    tok = index_array("draft_tokens", draft_tokens, (None, s))
    return _chain_jit(tok, num_steps=s)


def organize_mtp_draft_results(
    topk_p: Float32[ArrayLike, "B SK"],
    topk_index: Integer[ArrayLike, "B SK"],
    *,
    config: SpecConfig,
) -> DraftResults:
    """Multi-layer EAGLE / MTP organisation (docs/ops.md, ``organize_mtp_draft_results``), jittable.

    ``topk_p``/``topk_index`` are ``(B, S*K)``: all S chain steps produced by draft-extend.
    ``K == 1`` gives the chain constants (``parent_list = [-1, 0, .., S-2]``, ``top_scores_index =
    [0..S-1]``, ``draft_tokens = topk_index``), which is what upstream's generic path computes.
    ``S == 1`` with ``K > 1`` is the plain one-step top-(N-1) selection (upstream is correct there).
    ``S > 1`` with ``K > 1`` raises ``ValueError``: upstream's per-step slicing ``[:, :, i]``
    silently reads the wrong columns for K > 1, so there is no meaningful reference.
    """
    cfg = check_config(config)
    s, k = cfg.num_steps, cfg.topk
    if k > 1 and s > 1:
        raise ValueError(
            f"config: organize_mtp_draft_results supports topk == 1 (or num_steps == 1); got topk={k}, "
            f"num_steps={s} (SGLang's MTP organisation indexes the wrong columns when topk > 1)"
        )
    p = float_array("topk_p", topk_p, (None, s * k))
    b = p.shape[0]
    idx = index_array("topk_index", topk_index, (b, s * k))
    if k == 1:
        return _chain_jit(idx, num_steps=s)
    parents = jnp.broadcast_to(jnp.arange(-1, k, dtype=jnp.int32)[None, :], (b, k + 1))
    return _organize_jit([p[:, None, :]], [idx], [parents], num_draft_tokens=cfg.num_draft_tokens)
