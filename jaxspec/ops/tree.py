"""Mirrors SGLang 0.5.23 ``build_tree_kernel_efficient`` (python/sglang/srt/speculative/eagle_utils.py -> kernels/jit/include/sgl_kernel/speculative/eagle.cuh ``build_tree_efficient`` / ``build_tree_efficient_partial_packed``) and ``build_chain_tree`` (python/sglang/kernels/ops/speculative/eagle.py).

Tree construction for verification (docs/ops.md, ``build_tree``): from the organised draft (``parent_list``,
``top_scores_index``, ``draft_tokens``) build the attention mask, the RoPE positions and the
first-child / next-sibling links that the greedy and sampling verifiers walk.

Formulation (vectorised, O(S·N²) per request, no per-request Python loops):

* parent search: node ``t >= 1`` holds candidate ``sel[t-1]``; its parent beam slot is
  ``ptb = sel[t-1] // K``; ``ptb == 0`` -> the root, else the first ``q in [0, N-2]`` with
  ``sel[q] == parent_list[ptb]`` gives parent node ``q + 1`` (one ``(N-1)×(N-1)`` compare + argmax);
* links: ``next_token[p] = min{t : parent(t) == p}``, ``next_sibling[t] = min{t' > t :
  parent(t') == parent(t)}`` (what the CUDA thread-0 loop's head insertion in descending ``t``
  produces);
* ancestor sets / depth: ``S`` pointer jumps up the parent array, each marking one node.

Malformed trees (a selected node whose parent candidate is not selected: NaN or exactly tied
draft scores) follow the Triton / CPU kernels and SGLang's later malformed-tree oracle
(``test_build_eagle_tree_malformed.py``), not the 0.5.23 CUDA kernel whose mask/position threads
run off the row (undefined behaviour): the parent lookup scans only the request's own ``N-1``
entries (a match in the next request's row is "not found"); a node with a missing parent is left
unlinked (no ``next_token``/``next_sibling`` entry points to or from it, its ``retrieve_index`` is
still set); the root-ward walk that sets the mask bits and counts the depth marks the node itself,
then each ancestor, and stops at a root child, at a missing ancestor, or after ``S`` marks (a
cyclic ``parent_list`` therefore yields depth ``S``). On well-formed trees this is bit-identical
to the CUDA kernel. ``top_scores_index`` values must lie in ``[0, K + (S-1)*K²)`` (out-of-range
values read out of bounds upstream; here the ``parent_list`` gather clamps). With ``S == 1``
(empty ``parent_list``) a node with ``ptb != 0`` counts as having a missing parent.

dtypes: SGLang returns positions / retrieve arrays / tokens as int64; jaxspec returns the same
values as int32.
"""

import enum
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import checkify
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Int32, Integer, Shaped

from jaxspec import _validate
from jaxspec._validate import INT32_MAX, index_array, static_int
from jaxspec.config import SpecConfig, check_config
from jaxspec.ops.args import host_values

__all__ = ["TreeMaskMode", "TreeOutput", "build_tree", "build_chain_tree", "packed_mask_dtype"]

NO_NODE = -1  # sentinel in retrieve_next_token / retrieve_next_sibling (and "no parent" internally)
FULL_MASK_PAD = False  # value of FULL_MASK entries past ``tree_mask_len`` (unused tail of the buffer)
MAX_BITPACK_DRAFT_TOKENS = 32  # widest packed row is one uint32


class TreeMaskMode(enum.IntEnum):
    """Verify attention-mask layouts (SGLang ``spec_tree.TreeMaskMode``)."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


class TreeOutput(NamedTuple):
    """Result of :func:`build_tree` / :func:`build_chain_tree` (ints are int32).

    tree_mask: FULL_MASK ``(max_seq_lens_sum*N + B*N*N,)`` bool (valid prefix ``tree_mask_len``,
      tail ``FULL_MASK_PAD``); QLEN_ONLY ``(B*N*N,)`` bool; QLEN_ONLY_BITPACKING ``(B*N,)``
      uint8 / uint16 / uint32 (``packed_mask_dtype(N)``), bit ``j`` <-> node ``j``.
    positions: ``(B*N,)`` ``seq_lens[b] + depth(node)``.
    retrieve_index: ``(B, N)`` global node id ``b*N + j``.
    retrieve_next_token: ``(B, N)`` first child (smallest node index) or -1.
    retrieve_next_sibling: ``(B, N)`` next sibling (next larger node index, same parent) or -1.
    draft_tokens: ``(B*N,)`` ``concat(bonus_tokens[:, None], draft_tokens, 1).reshape(-1)``.
    tree_mask_len: int32 scalar, number of meaningful ``tree_mask`` entries (FULL_MASK:
      ``sum(seq_lens)*N + B*N*N``; other modes: ``tree_mask.size``).
    """

    tree_mask: Shaped[Array, " M"]
    positions: Int32[Array, " BN"]
    retrieve_index: Int32[Array, "B N"]
    retrieve_next_token: Int32[Array, "B N"]
    retrieve_next_sibling: Int32[Array, "B N"]
    draft_tokens: Int32[Array, " BN"]
    tree_mask_len: Int32[Array, ""]


def packed_mask_dtype(num_draft_tokens: int):
    """uint8 for N <= 8, uint16 for N <= 16, uint32 for N <= 32 (SGLang's ``ceil(log2((N+7)//8))``)."""
    n = num_draft_tokens
    if not 0 < n <= MAX_BITPACK_DRAFT_TOKENS:
        raise ValueError(
            f"num_draft_tokens: QLEN_ONLY_BITPACKING needs 1 <= N <= {MAX_BITPACK_DRAFT_TOKENS}, got {n}"
        )
    return np.dtype(np.uint8) if n <= 8 else np.dtype(np.uint16) if n <= 16 else np.dtype(np.uint32)


# --------------------------------------------------------------------------------------------
# shared structure: parents, links, ancestor sets
# --------------------------------------------------------------------------------------------


class _Structure(NamedTuple):
    parent: jax.Array  # i32[B, N]: local parent node, NO_NODE for the root and unlinked nodes
    visible: jax.Array  # bool[B, N, N]: row t may attend to node j
    depth: jax.Array  # i32[B, N]: walk length (0 for the root)


def _parents(parent_list, sel, *, topk, num_draft_tokens):
    """Local parent of every node (NO_NODE for the root / missing parent), ``(B, N)`` int32."""
    b, n = sel.shape[0], num_draft_tokens
    q_width = parent_list.shape[1]
    if n == 1:  # the root alone
        return jnp.full((b, 1), NO_NODE, jnp.int32)
    ptb = jax.lax.div(sel, jnp.int32(topk))  # C integer division, as the kernels
    if q_width == 0:  # S == 1: every well-formed node is a root child
        found = jnp.zeros(sel.shape, jnp.bool_)
        q = jnp.zeros(sel.shape, jnp.int32)
    else:
        target = jnp.take_along_axis(parent_list, jnp.clip(ptb, 0, q_width - 1), axis=1)  # (B, N-1)
        match = sel[:, None, :] == target[:, :, None]  # (B, node, candidate): row-bounded search
        found = jnp.any(match, axis=-1)
        q = jnp.argmax(match, axis=-1).astype(jnp.int32)  # first match
    par = jnp.where(ptb == 0, jnp.int32(0), jnp.where(found, q + 1, jnp.int32(NO_NODE)))
    return jnp.concatenate([jnp.full((b, 1), NO_NODE, jnp.int32), par], axis=1)


def _links(parent):
    """First-child / next-sibling links from the parent array, ``(B, N)`` int32 each."""
    n = parent.shape[1]
    node = jnp.arange(n, dtype=jnp.int32)
    is_child = parent[:, None, :] == node[None, :, None]  # (B, p, t): parent(t) == p
    next_token = jnp.where(
        jnp.any(is_child, axis=-1), jnp.argmax(is_child, axis=-1).astype(jnp.int32), jnp.int32(NO_NODE)
    )
    later = node[None, :] > node[:, None]  # (t, t'): t' > t
    same = (parent[:, :, None] == parent[:, None, :]) & (parent[:, :, None] != NO_NODE) & later[None]
    next_sibling = jnp.where(
        jnp.any(same, axis=-1), jnp.argmax(same, axis=-1).astype(jnp.int32), jnp.int32(NO_NODE)
    )
    return next_token, next_sibling


def _ancestors(parent, *, num_steps):
    """Bounded root-ward walk: visible sets and depths (``S`` pointer jumps)."""
    b, n = parent.shape
    node = jnp.arange(n, dtype=jnp.int32)
    cur0 = jnp.broadcast_to(node[None, :], (b, n))
    visible0 = jnp.broadcast_to((node == 0)[None, None, :], (b, n, n))  # everyone sees the root
    alive0 = cur0 >= 1  # the root row marks nothing else

    def jump(_, carry):
        cur, alive, visible, depth = carry
        visible = visible | (alive[:, :, None] & (cur[:, :, None] == node[None, None, :]))
        depth = depth + alive.astype(jnp.int32)
        nxt = jnp.take_along_axis(parent, cur, axis=1)
        alive = alive & (nxt >= 1)  # stop at a root child (nxt == 0) or a missing parent
        return jnp.where(alive, nxt, cur), alive, visible, depth

    carry = (cur0, alive0, visible0, jnp.zeros((b, n), jnp.int32))
    # Unrolled: S is small and static, and an XLA:GPU while loop pays a device->host predicate read per
    # trip (~10 us on the H200), which dominated the tree step in bench/step.py.
    _, _, visible, depth = jax.lax.fori_loop(0, num_steps, jump, carry, unroll=True)
    return visible, depth


def _structure(parent_list, sel, *, topk, num_steps, num_draft_tokens) -> _Structure:
    parent = _parents(parent_list, sel, topk=topk, num_draft_tokens=num_draft_tokens)
    visible, depth = _ancestors(parent, num_steps=num_steps)
    return _Structure(parent, visible, depth)


# --------------------------------------------------------------------------------------------
# mask encodings
# --------------------------------------------------------------------------------------------


def _full_mask(visible, seq_lens, *, max_seq_lens_sum):
    """Ragged FULL_MASK in a static buffer; returns ``(mask, tree_mask_len)``."""
    b, n, _ = visible.shape
    size = max_seq_lens_sum * n + b * n * n
    prefix = jnp.cumsum(seq_lens) - seq_lens  # exclusive prefix sum of seq_lens
    req = jnp.arange(b, dtype=jnp.int32)
    base = prefix * n + req * (n * n)  # (B,) start of request b's N x (L+N) block
    node = jnp.arange(n, dtype=jnp.int32)
    idx = (
        base[:, None, None]
        + (seq_lens[:, None, None] + n) * node[None, :, None]
        + seq_lens[:, None, None]
        + node[None, None, :]
    )  # (B, t, j): column seq_len + j of row t
    mask_len = jnp.sum(seq_lens) * n + jnp.int32(b * n * n)
    # prefix columns True (SGLang's fill_prefix_mask=True); tail past tree_mask_len FULL_MASK_PAD.
    mask = jnp.arange(size, dtype=jnp.int32) < mask_len
    idx = jnp.where((idx >= 0) & (idx < size), idx, size)  # out-of-buffer rows are dropped
    mask = mask.at[idx.reshape(-1)].set(visible.reshape(-1), mode="drop")
    return mask, mask_len


def _packed_mask(visible):
    n = visible.shape[-1]
    weights = jnp.left_shift(jnp.uint32(1), jnp.arange(n, dtype=jnp.uint32))
    packed = jnp.sum(jnp.where(visible, weights[None, None, :], jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
    return packed.reshape(-1).astype(packed_mask_dtype(n))


# --------------------------------------------------------------------------------------------
# build_tree
# --------------------------------------------------------------------------------------------


def _check_seq_lens(seq_lens, max_seq_lens_sum):
    """Checked mode: non-negative ``seq_lens`` whose sum fits the FULL_MASK buffer (``None``: QLEN layouts)."""
    checkify.check(jnp.all(seq_lens >= 0), "seq_lens: expected non-negative values")
    if max_seq_lens_sum is not None:
        checkify.check(jnp.sum(seq_lens) <= max_seq_lens_sum,
                       f"seq_lens: sum(seq_lens) exceeds max_seq_lens_sum={max_seq_lens_sum}")


@functools.partial(
    jax.jit, static_argnames=("topk", "num_steps", "num_draft_tokens", "mask_mode", "max_seq_lens_sum", "checks")
)
def _build_tree_jit(
    bonus_tokens, parent_list, sel, draft_tokens, seq_lens, *, topk, num_steps, num_draft_tokens, mask_mode,
    max_seq_lens_sum, checks,
):
    if checks:
        _check_seq_lens(seq_lens, max_seq_lens_sum)
    b, n = seq_lens.shape[0], num_draft_tokens
    st = _structure(parent_list, sel, topk=topk, num_steps=num_steps, num_draft_tokens=n)
    next_token, next_sibling = _links(st.parent)
    positions = (seq_lens[:, None] + st.depth).reshape(b * n)
    retrieve_index = jnp.arange(b * n, dtype=jnp.int32).reshape(b, n)
    tokens = jnp.concatenate([bonus_tokens[:, None], draft_tokens], axis=1).reshape(b * n)
    if mask_mode == TreeMaskMode.FULL_MASK:
        mask, mask_len = _full_mask(st.visible, seq_lens, max_seq_lens_sum=max_seq_lens_sum)
    elif mask_mode == TreeMaskMode.QLEN_ONLY:
        mask, mask_len = st.visible.reshape(b * n * n), jnp.int32(b * n * n)
    else:
        mask, mask_len = _packed_mask(st.visible), jnp.int32(b * n)
    return TreeOutput(mask, positions, retrieve_index, next_token, next_sibling, tokens, mask_len)


def _check_mask_mode(mask_mode) -> TreeMaskMode:
    try:
        return TreeMaskMode(mask_mode)
    except ValueError:
        raise ValueError(f"mask_mode: expected a TreeMaskMode (0, 1 or 2), got {mask_mode!r}") from None


def build_tree(
    bonus_tokens: Integer[ArrayLike, " B"],
    parent_list: Integer[ArrayLike, "B J"],
    top_scores_index: Integer[ArrayLike, "B N1"],
    draft_tokens: Integer[ArrayLike, "B N1"],
    seq_lens: Integer[ArrayLike, " B"],
    *,
    config: SpecConfig,
    mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
    max_seq_lens_sum: int | None = None,
) -> TreeOutput:
    """Build the verify tree (SGLang ``build_tree_kernel_efficient``; docs/ops.md, ``build_tree``), jittable.

    Args: ``bonus_tokens (B,)`` root token per request; ``parent_list (B, J)`` with
    ``J = config.parent_list_width``; ``top_scores_index (B, N-1)`` sorted flat candidate
    indices; ``draft_tokens (B, N-1)``; ``seq_lens (B,)`` committed lengths (exclude the root).
    All integer arrays: int32, or int64 within int32 range. ``config`` (static) gives S, K, N.
    ``mask_mode`` (static) picks the mask layout (see :class:`TreeOutput`). ``max_seq_lens_sum``
    (static, required for FULL_MASK) sizes the ragged FULL_MASK buffer. ``seq_lens`` must be
    non-negative with ``sum(seq_lens) <= max_seq_lens_sum``: checked on the host (``ValueError``) for
    concrete ``seq_lens``, flagged in checked mode (``jaxspec.checks()``) for traced ones. Unchecked,
    traced values that break it give a defined but meaningless result: rows past the buffer are
    dropped while ``tree_mask_len`` still reports the full ragged length (it may exceed the buffer),
    and a negative ``seq_lens[b]`` gives negative positions and shifts later requests' mask rows.
    FULL_MASK prefix columns are True (SGLang's default ``fill_prefix_mask=True``); entries from
    ``tree_mask_len`` on are ``FULL_MASK_PAD``.

    Malformed trees: see the module docstring (bounded walk of the Triton/CPU kernels).
    """
    cfg = check_config(config)
    k, s, n = cfg.topk, cfg.num_steps, cfg.num_draft_tokens
    mode = _check_mask_mode(mask_mode)
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING and n > MAX_BITPACK_DRAFT_TOKENS:
        raise ValueError(
            f"config.num_draft_tokens: QLEN_ONLY_BITPACKING needs N <= {MAX_BITPACK_DRAFT_TOKENS}, got {n}"
        )
    seq = index_array("seq_lens", seq_lens, (None,))
    b = seq.shape[0]
    bonus = index_array("bonus_tokens", bonus_tokens, (b,))
    plist = index_array("parent_list", parent_list, (b, cfg.parent_list_width))
    sel = index_array("top_scores_index", top_scores_index, (b, n - 1))
    dtok = index_array("draft_tokens", draft_tokens, (b, n - 1))
    if mode == TreeMaskMode.FULL_MASK:
        if max_seq_lens_sum is None:
            raise ValueError(
                "max_seq_lens_sum: FULL_MASK needs a static upper bound on sum(seq_lens) to size its buffer"
            )
        max_seq_lens_sum = static_int("max_seq_lens_sum", max_seq_lens_sum, lo=0)
        size = max_seq_lens_sum * n + b * n * n
        if size > INT32_MAX:
            raise ValueError(
                f"max_seq_lens_sum: FULL_MASK buffer of {size} entries exceeds int32 indexing (N={n}, B={b})"
            )
    else:
        max_seq_lens_sum = None  # not part of the compiled shape for the QLEN layouts
    host = host_values(seq_lens)  # known before the op runs (not traced): checked here
    if host is not None:
        dynamic_validate_build_tree(host, max_seq_lens_sum=max_seq_lens_sum)
    return _validate.call_checked(
        _build_tree_jit, bonus, plist, sel, dtok, seq, topk=k, num_steps=s, num_draft_tokens=n, mask_mode=mode,
        max_seq_lens_sum=max_seq_lens_sum,
    )


# --------------------------------------------------------------------------------------------
# build_chain_tree (K == 1)
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("num_draft_tokens", "checks"))
def _build_chain_tree_jit(bonus_tokens, draft_tokens, seq_lens, *, num_draft_tokens, checks):
    if checks:
        _check_seq_lens(seq_lens, None)
    b, n = seq_lens.shape[0], num_draft_tokens
    col = jnp.arange(n, dtype=jnp.int32)
    mask = jnp.broadcast_to(col[None, None, :] <= col[None, :, None], (b, n, n)).reshape(b * n * n)
    positions = (seq_lens[:, None] + col[None, :]).reshape(b * n)
    retrieve_index = jnp.arange(b * n, dtype=jnp.int32).reshape(b, n)
    next_token = jnp.broadcast_to(jnp.where(col < n - 1, col + 1, jnp.int32(NO_NODE))[None, :], (b, n))
    next_sibling = jnp.full((b, n), NO_NODE, jnp.int32)
    tokens = jnp.concatenate([bonus_tokens[:, None], draft_tokens], axis=1).reshape(b * n)
    return TreeOutput(mask, positions, retrieve_index, next_token, next_sibling, tokens, jnp.int32(b * n * n))


def build_chain_tree(
    bonus_tokens: Integer[ArrayLike, " B"],
    draft_tokens: Integer[ArrayLike, "B S"],
    seq_lens: Integer[ArrayLike, " B"],
    *,
    config: SpecConfig,
) -> TreeOutput:
    """K == 1 shortcut (SGLang 0.5.23 ``build_chain_tree``), QLEN_ONLY mask, jittable.

    Equal to ``build_tree(..., mask_mode=QLEN_ONLY)`` on the chain from :func:`chain_draft_results`:
    lower-triangular mask, positions ``seq_len + col``, ``next_token = col + 1`` (-1 last),
    ``next_sibling = -1``. The fused ``out_cache_loc`` / M-RoPE outputs of upstream are not part of
    this op. Requires ``config.topk == 1`` (so ``N == S + 1``).
    """
    cfg = check_config(config)
    if cfg.topk != 1:
        raise ValueError(f"config.topk: build_chain_tree needs topk == 1, got {cfg.topk}")
    seq = index_array("seq_lens", seq_lens, (None,))
    b = seq.shape[0]
    bonus = index_array("bonus_tokens", bonus_tokens, (b,))
    dtok = index_array("draft_tokens", draft_tokens, (b, cfg.num_steps))
    host = host_values(seq_lens)  # known before the op runs (not traced): checked here
    if host is not None:
        dynamic_validate_build_tree(host)
    return _validate.call_checked(_build_chain_tree_jit, bonus, dtok, seq, num_draft_tokens=cfg.num_draft_tokens)


def dynamic_validate_build_tree(seq_lens, *, max_seq_lens_sum: int | None = None) -> None:
    """Host-side (tier b) check on concrete values: non-negative ``seq_lens`` within the FULL_MASK bound."""
    seq = np.asarray(seq_lens).astype(np.int64)
    if seq.size and seq.min() < 0:
        raise ValueError(f"seq_lens: expected non-negative values, got min {int(seq.min())}")
    if max_seq_lens_sum is not None and int(seq.sum(dtype=np.int64)) > max_seq_lens_sum:
        raise ValueError(f"seq_lens: sum(seq_lens)={int(seq.sum())} exceeds max_seq_lens_sum={max_seq_lens_sum}")
