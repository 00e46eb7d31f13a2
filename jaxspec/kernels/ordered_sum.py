"""``ordered_sum``: a float sum along the last axis whose order of additions is written out, so it is the same
for every shape of the other axes (and on every backend).

A reduction left to XLA is not: its emitters pick the order by the whole shape (measured on XLA:CPU: the
sum over a 128-wide last axis of a ``[2, 5, 7, 128]`` array differs in the last bit from the same row summed
alone), which is enough to make a bf16 argmax depend on the batch. Here the axis is cut into blocks of
``BLOCK``; each block is summed by halving (element ``i`` plus element ``i + h``, ``h = BLOCK/2, BLOCK/4, ...``:
elementwise adds XLA neither reorders nor reassociates), and the block sums are added left to right. Zero
padding (to a power of two below ``BLOCK``, to whole blocks above) adds exact zeros, so trailing zeros never
change a sum: a row's result depends on its values, not on the length it is padded to.
"""

import functools
import operator

import jax.numpy as jnp

from jaxspec.kernels._dispatch import next_pow2

BLOCK = 128

__all__ = ["BLOCK", "ordered_sum"]


def _halve(x):
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:]
    return x[..., 0]


def ordered_sum(x):
    """``x [..., n]`` summed along the last axis in a fixed order (module docstring); ``x``'s dtype."""
    n = x.shape[-1]
    width = next_pow2(n) if n <= BLOCK else -(-n // BLOCK) * BLOCK
    if width != n:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    if width <= BLOCK:
        return _halve(x)
    blocks = _halve(x.reshape(*x.shape[:-1], width // BLOCK, BLOCK))
    return functools.reduce(operator.add, [blocks[..., t] for t in range(width // BLOCK)])
