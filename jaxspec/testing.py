"""Random-input generators shared by jaxspec's tests and benchmarks (NumPy, host side)."""

import numpy as np


def random_accept_index(rng: np.random.Generator, bs: int, accept_width: int, num_draft_tokens: int):
    """A legal ``(accept_index (B, A) int32, accept_lens (B,) int32)`` pair, as verify produces them.

    Row ``b`` holds ``accept_lens[b]`` global node ids ``b*N + j``: the root (``j = 0``) first, then
    distinct non-root nodes in increasing order; the rest is -1.
    """
    lens = rng.integers(1, accept_width + 1, bs)
    ai = -np.ones((bs, accept_width), np.int32)
    for b in range(bs):
        nodes = np.sort(rng.choice(np.arange(1, num_draft_tokens), lens[b] - 1, replace=False)) if lens[b] > 1 else []
        ai[b, : lens[b]] = b * num_draft_tokens + np.concatenate([[0], nodes]).astype(np.int32)
    return ai, lens.astype(np.int32)


def checked_call(fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` with jaxspec's in-jit value checks on, under ``checkify``.

    Returns ``(err, out)``; ``err.throw()`` raises the first failed check (``JAXSPEC_CHECKS`` mode).
    """
    from jax.experimental import checkify

    from jaxspec import _validate

    with _validate.checks():
        return checkify.checkify(lambda *a: fn(*a, **kwargs))(*args)
