"""Simulated acceptance for benchmarking (SGLang's ``SIMULATE_ACC_LEN`` / ``SIMULATE_ACC_METHOD``).

Random-weight models accept nothing, so their speculative rounds say nothing about the speed at a real
accept length. ``SimulatedAccept`` makes every speculative round accept a drawn number of nodes, the first
ones as SGLang's simulation does (``simulated_accept_path``; in a round, ``SimulatedVerify`` wraps the
round's verifier): the KV move, the compaction, the drafter
extend and the output bookkeeping then do the work of a real round of that accept length. The OUTPUT IS NOT
the target's (never lossless): never the default, and benches print it in every row it touches.
"""

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int32

from jaxspec.config import SpecConfig
from jaxspec.ops.tree import TreeOutput


@dataclasses.dataclass(frozen=True)
class SimulatedAccept:
    """The accept-length distribution of simulated rounds; give exactly one of ``mean`` and ``probs``.

    mean: SGLang's ``match-expected`` method: each round accepts ``floor(mean)`` or ``ceil(mean)`` nodes
      (root included, so 1 = no draft accepted) with the weights that make the mean exact; clipped to
      ``[1, min(S + 1, N)]`` of the round's draft shape.
    probs: ``probs[i]`` = probability of accept length ``i + 1`` (e.g. a histogram measured with a trained
      pair); lengths beyond a shape's ``S + 1`` count as ``S + 1``. Normalised here; must not all be 0.
    """

    mean: float | None = None
    probs: tuple[float, ...] | None = None

    def __post_init__(self):
        if (self.mean is None) == (self.probs is None):
            raise ValueError("SimulatedAccept: give exactly one of mean= and probs=")
        if self.mean is not None:
            m = self.mean
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 1:
                raise ValueError(f"SimulatedAccept.mean: expected a finite float >= 1 (1 = accept nothing), got {m!r}")
        else:
            p = np.asarray(self.probs, np.float64)
            if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
                raise ValueError(f"SimulatedAccept.probs: expected non-negative finite weights of accept lengths "
                                 f"1, 2, ... (not all 0), got {self.probs!r}")
            object.__setattr__(self, "probs", tuple(float(x) for x in p / p.sum()))

    def table(self, width: int) -> np.ndarray:
        """``f32[width]``: probability of accept length ``1..width`` (the tail folded into ``width``)."""
        p = np.zeros((width,), np.float64)
        if self.mean is not None:
            m = min(float(self.mean), float(width))
            lo = int(math.floor(m))
            p[lo - 1] = 1.0 - (m - lo)
            if lo < width:
                p[lo] = m - lo
        else:
            q = np.asarray(self.probs)
            p[: min(width, q.size)] = q[:width]
            p[width - 1] += q[width:].sum()
        return p.astype(np.float32)


def draw_accept_lens(table: jax.Array, keys: jax.Array) -> jax.Array:
    """``i32[B]`` accept lengths in ``[1, len(table)]``, one per row key (inverse CDF of ``table``)."""
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    cdf = jnp.cumsum(table)[:-1]
    return 1 + jnp.sum((u[:, None] >= cdf[None, :]).astype(jnp.int32), axis=1)


def simulated_accept_path(
    tree: TreeOutput, predict: Int32[Array, " T"], accept_lens: Int32[Array, " B"], spec: SpecConfig, *,
    logits: Float[Array, "T V"] | None = None, target_predict: Int32[Array, " T"] | None = None,
) -> tuple[Int32[Array, " T"], Int32[Array, "B A"], Int32[Array, " B"]]:
    """A forced accepted path (benchmarking): SGLang's ``generate_simulated_accept_index``.

    Row ``b`` accepts its first ``L = clip(accept_lens[b], 1, min(S + 1, N))`` nodes ``0..L-1``, as upstream:
    for chains that is the chain itself; for trees it is the same amount of work (the KV move, compaction and
    drafter extend of ``L`` nodes) whether or not those nodes form a path, which random-weight trees (the
    point of simulating) rarely grow as deep as ``L``. Returns ``(predict, accept_index, accept_lens)`` as a
    verify would: ``predict`` at each accepted node but the last is the next node's draft token (the committed
    tokens are those drafts, then the token after the last node), ``accept_index`` the global node ids, -1
    padded. The token after the last node is the target's argmax there (``logits`` rows, or
    ``target_predict``), whatever the verify drew.
    """
    s, n = spec.num_steps, spec.num_draft_tokens
    b = accept_lens.shape[0]
    rows = jnp.arange(b, dtype=jnp.int32)
    lens = jnp.clip(accept_lens.astype(jnp.int32), 1, min(s + 1, n))
    col = jnp.arange(s + 1, dtype=jnp.int32)[None, :]
    accept_index = jnp.where(col < lens[:, None], rows[:, None] * n + jnp.minimum(col, n - 1), -1)
    nxt = jnp.minimum(rows[:, None] * n + col[:, :s] + 1, b * n - 1)  # the draft token of the next node
    write = jnp.where(col[:, :s] < lens[:, None] - 1, accept_index[:, :s], predict.shape[0])
    predict = predict.at[write.reshape(-1)].set(tree.draft_tokens[nxt].reshape(-1), mode="drop")
    last = jnp.take_along_axis(accept_index, lens[:, None] - 1, axis=1)[:, 0]
    if logits is not None:  # B rows of the logits, not B*N: the argmax costs B*V reads
        last_tok = jnp.argmax(logits[last], axis=-1).astype(jnp.int32)
    elif target_predict is not None:
        last_tok = target_predict[last]
    else:
        last_tok = predict[last]
    return predict.at[last].set(last_tok), accept_index, lens


class SimulatedVerify(NamedTuple):
    """A verifier for ``pipeline.commit`` (BENCHMARKING ONLY, never lossless): SGLang's ``SIMULATE_ACC_LEN``
    mode. ``inner`` (a greedy or sampling verifier) runs, then its result is replaced by ``accept_lens``
    (``i32[B]`` in ``[1, S+1]``) accepted nodes (the first ones, as upstream; the chain itself for chains):
    their drafts are taken as accepted and the target's token after the last is the bonus, so the KV move,
    compaction and drafter extend do the work of a real round with that accept length
    (``simulated_accept_path``)."""

    inner: object
    accept_lens: Int32[Array, " B"]

    def verify(self, spec: SpecConfig, plan):
        predict, _, _ = self.inner.verify(spec, plan)
        b, n = plan.tokens.shape[0], spec.num_draft_tokens
        if self.accept_lens.shape != (b,):
            raise ValueError(f"accept_lens: expected shape ({b},), got {self.accept_lens.shape}")
        logits = getattr(self.inner, "logits", None)
        target_predict = getattr(self.inner, "target_predict", None)
        return simulated_accept_path(
            plan.tree, predict, self.accept_lens, spec,
            logits=None if logits is None else logits.reshape(b * n, -1),
            target_predict=None if target_predict is None else target_predict.reshape(-1),
        )


__all__ = ["SimulatedAccept", "SimulatedVerify", "draw_accept_lens", "simulated_accept_path"]
