"""Memory of the decode loops: the KV pools' size estimate (refused up front when it would not fit) and the
allocation of a batch's ``DecodeState`` padded to the compile-cache buckets.

Buckets: the batch is padded to the next power of two (padding rows are done from the start and use the
dummy page), the output buffer to the next power of two of the largest ``max_new_tokens`` (the per-request
limit is an array), the prompts to the next power of two of the longest (at least ``MIN_PROMPT_BUCKET``, at
most ``max_context``: ``prompt_bucket``); the pool size is fixed per engine. The prompt width only shapes the
prefill's executable: the decode loop's is one per batch and output bucket whatever the prompts' lengths.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.engine.state import DecodeState, SamplingParams
from jaxspec.kernels import next_pow2

MIN_PROMPT_BUCKET = 8  # the narrowest prompt width (prompts are right-padded to a power of two >= this)
MIN_OUTPUT_BUCKET = 8  # smallest output-buffer width T
MEMORY_FRACTION = 0.7  # default share of free memory the KV pools may take (the rest: weights, activations)


def free_memory_bytes() -> tuple[int, str]:
    """Free memory of the default device (GPU: allocator limit minus use; CPU: ``MemAvailable``)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), f"{jax.devices()[0]} free memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "host MemAvailable"
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host physical memory"


def check_pool_bytes(target, drafter, specs, *, num_pages: int, page_size: int, max_batch: int, max_context: int,
                     limit: int | None) -> int:
    """Bytes of the KV pools (target + drafter per slot, and the ``req_to_token`` table); ``ValueError`` when
    they exceed ``limit`` (default ``MEMORY_FRACTION`` of the free memory), with the bytes they would need."""
    slots = num_pages * page_size
    per_slot = int(target.kv_bytes_per_slot())
    for spec in specs:
        per_slot += int(drafter.kv_bytes_per_slot(spec))
    rows = next_pow2(max_batch)
    table = rows * max_context * 4  # req_to_token, int32
    need = slots * per_slot + table
    if limit is None:
        free, what = free_memory_bytes()
        limit = int(free * MEMORY_FRACTION)
        what = f"{MEMORY_FRACTION:.0%} of the {free} bytes of {what}"
    else:
        what = "memory_limit_bytes"
    if need > limit:
        raise ValueError(
            f"max_context={max_context}: the KV pools need {need} bytes ({slots} slots x {per_slot} "
            f"bytes per slot (target + drafter) + {table} bytes of req_to_token), more than {limit} bytes "
            f"({what}); lower max_context, max_batch or num_pages"
        )
    return need


def _pad(x: np.ndarray, b: int, fill) -> np.ndarray:
    out = np.full((b,), fill, x.dtype)
    out[: x.size] = x
    return out


def prompt_bucket(length: int, max_context: int) -> int:
    """The padded prompt width of a batch whose longest prompt has ``length`` tokens: the next power of two,
    at least ``MIN_PROMPT_BUCKET`` and at most ``max_context`` (a prompt never exceeds it)."""
    return min(max(MIN_PROMPT_BUCKET, next_pow2(length)), max_context)


def padded_prompts(arrs: list[np.ndarray], max_context: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prompts i32[B, P], prompt_lens i32[B])`` of the batch bucket ``B``; padding rows hold one token (id 0)."""
    n, b = len(arrs), next_pow2(len(arrs))
    lens = np.ones((b,), np.int32)  # padding rows: one token (id 0) on the dummy page
    lens[:n] = [a.size for a in arrs]
    p = prompt_bucket(int(lens.max()), max_context)
    padded = np.zeros((b, p), np.int32)
    for i, a in enumerate(arrs):
        padded[i, : a.size] = a
    return padded, lens


def allocate_state(target_cache, draft, *, num_requests: int, max_new_tokens: np.ndarray, eos_id: int,
                   sampling: tuple[np.ndarray, ...], vocab_size: int, policy, simulate) -> DecodeState:
    """A fresh ``DecodeState`` of the batch bucket of ``num_requests`` (rows past it are padding, done from the
    start); ``sampling`` = ``(temperature, top_k, top_p, seed)`` per real request."""
    n, b = num_requests, next_pow2(num_requests)
    temps, top_ks, top_ps, seeds = sampling
    limits = np.zeros((b,), np.int32)
    limits[:n] = max_new_tokens
    t = max(MIN_OUTPUT_BUCKET, next_pow2(int(max_new_tokens.max())))

    def zeros():  # a fresh buffer per field: the state is donated, so no two leaves may share one
        return jnp.zeros((b,), jnp.int32)

    return DecodeState(
        target_cache=target_cache,
        draft=draft,
        seq_lens=zeros(),
        bonus=zeros(),
        out_tokens=jnp.zeros((b, t), jnp.int32),
        num_generated=zeros(),
        max_new_tokens=jnp.asarray(limits),
        done=jnp.asarray(np.arange(b) >= n),
        eos_id=jnp.int32(eos_id),
        num_rounds=zeros(),
        num_accepted=zeros(),
        sampling=SamplingParams(
            temperature=jnp.asarray(_pad(temps, b, 0.0)),
            top_k=jnp.asarray(_pad(top_ks, b, vocab_size)),
            top_p=jnp.asarray(_pad(top_ps, b, 1.0)),
            seed=jnp.asarray(_pad(seeds, b, 0)),
        ),
        policy=policy,
        simulate=simulate,
        all_greedy=bool(np.all(temps == 0)),
    )
