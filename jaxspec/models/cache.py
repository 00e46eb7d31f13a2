"""Paged KV cache as a value: k/v pools ``(L, X, Hkv, E)`` plus the ``req_to_token (R, W)`` int32 table.

Layout follows SGLang's token-to-KV pool: ``req_to_token[r, pos]`` is the KV slot id of logical token
``pos`` of request row ``r``. Slots are allocated page-aligned (``page_size`` G tokens per page, pages are
a host-side shuffled permutation so a request's pages are not contiguous); page 0 (slots ``[0, G)``) is the
reserved dummy page, so slot 0 is never a real token and zero-padded location buffers write harmlessly there.
"""

import jax.numpy as jnp
import numpy as np

from jaxspec.models.config import ModelConfig
from jaxspec.protocols import PagedKVCache
from jaxspec.protocols import make_req_to_token as make_req_to_token  # the allocator sits below models and engine
from jaxspec.protocols import num_pages_needed as num_pages_needed


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
