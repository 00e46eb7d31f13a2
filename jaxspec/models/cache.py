"""Paged KV cache as a value: k/v pools ``(L, X, Hkv, E)`` plus the ``req_to_token (R, W)`` int32 table.

Layout follows SGLang's token-to-KV pool: ``req_to_token[r, pos]`` is the KV slot id of logical token
``pos`` of request row ``r``. Slots are allocated page-aligned (``page_size`` G tokens per page, pages are
a host-side shuffled permutation so a request's pages are not contiguous); page 0 (slots ``[0, G)``) is the
reserved dummy page, so slot 0 is never a real token and zero-padded location buffers write harmlessly there.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models.config import ModelConfig
from jaxspec.protocols import PagedKVCache


def num_pages_needed(num_reqs: int, max_tokens_per_req: int, page_size: int) -> int:
    """Pages a fully reserved batch needs, including the dummy page 0."""
    return num_reqs * math.ceil(max_tokens_per_req / page_size) + 1


def make_req_to_token(
    num_reqs: int, max_tokens_per_req: int, page_size: int, *, num_pages: int | None = None, seed: int = 0
) -> np.ndarray:
    """Host-side allocator: reserve ``ceil(W / G)`` shuffled pages per request row; ``int32[R, W]``.

    Raises ``ValueError`` when the pool (``num_pages`` including the dummy page) cannot hold every row's
    reservation -- page exhaustion is reported at the host boundary, never clamped silently.
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if num_reqs < 1 or max_tokens_per_req < 1:
        raise ValueError(f"num_reqs and max_tokens_per_req must be >= 1, got {num_reqs}, {max_tokens_per_req}")
    pages_per_req = math.ceil(max_tokens_per_req / page_size)
    need = num_pages_needed(num_reqs, max_tokens_per_req, page_size)
    if num_pages is None:
        num_pages = need
    if num_pages < need:
        raise ValueError(
            f"KV page pool exhausted: {num_reqs} requests x {pages_per_req} pages of {page_size} tokens "
            f"(+1 dummy page) = {need} pages needed, pool has num_pages={num_pages}"
        )
    rng = np.random.default_rng(seed)
    pages = rng.permutation(np.arange(1, num_pages, dtype=np.int64))[: num_reqs * pages_per_req]
    pages = pages.reshape(num_reqs, pages_per_req)
    pos = np.arange(max_tokens_per_req, dtype=np.int64)
    table = pages[:, pos // page_size] * page_size + pos[None, :] % page_size
    return table.astype(np.int32)


def init_cache(
    num_layers: int,
    cfg: ModelConfig,
    req_to_token,
    *,
    page_size: int,
    num_pages: int | None = None,
    dtype=jnp.float32,
) -> PagedKVCache:
    """Zero k/v pools sized for ``num_pages`` pages (default: just enough for ``req_to_token``)."""
    req_to_token = np.asarray(req_to_token, np.int32)
    if num_pages is None:
        num_pages = int(req_to_token.max()) // page_size + 1
    num_slots = num_pages * page_size
    if int(req_to_token.max()) >= num_slots:
        raise ValueError(f"req_to_token refers to slot {int(req_to_token.max())} >= pool size {num_slots}")
    shape = (num_layers, num_slots, cfg.num_kv_heads, cfg.head_dim)
    return PagedKVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), req_to_token=jnp.asarray(req_to_token))
