"""Simulated acceptance for benchmarking (SGLang's ``SIMULATE_ACC_LEN`` / ``SIMULATE_ACC_METHOD``).

Random-weight models accept nothing, so their speculative rounds say nothing about the speed at a real
accept length. ``SimulatedAccept`` makes every speculative round accept a drawn number of nodes, the first
ones as SGLang's simulation does (``round.simulated_accept_path``): the KV move, the compaction, the drafter
extend and the output bookkeeping then do the work of a real round of that accept length. The OUTPUT IS NOT
the target's (never lossless): never the default, and benches print it in every row it touches.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


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


__all__ = ["SimulatedAccept", "draw_accept_lens"]
