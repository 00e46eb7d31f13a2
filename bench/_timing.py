"""Timing helpers shared by the bench scripts (no profiler; JAX has no CUDA events).

* ``device_time_us(step, state, reps)``: per-op device time. ``step: state -> state`` is run ``reps``
  times inside ONE jitted ``lax.fori_loop`` (state donated, so in-place ops stay in place), timed around
  ``jax.block_until_ready``; the same loop with 1 repetition is subtracted, which removes the launch and
  sync overhead. Median over ``trials``. ``unroll`` traces ``step`` that many times per loop trip: an
  XLA:GPU while loop reads its predicate back to the host every trip (~10 us on the H200), which would
  otherwise swamp 3-5 us kernels.
* ``wall_time_us(fn, *args)``: wall time per call of a jitted function in a Python loop (host dispatch
  included), blocking only at the end. For donating functions use ``wall_time_us_state``.
* ``copy_ceiling_gbps(nbytes)``: device-to-device copy bandwidth (bytes read + written) of a plain XLA
  copy, measured in the same process: the ceiling the KV move is reported against.
* ``best_block_wall_us(fn, calls, sync)``: wall time per call of any ``fn`` (JAX or torch), the best of
  ``WALL_BLOCKS`` blocks of calls, synchronising with ``sync()`` once per block.
* ``cupti_kernel_us(call)``: the sum of the GPU kernel durations per call, through CUPTI as jax's Mosaic GPU
  extension exposes it (a ``jax._src`` API: None when unavailable).
"""

import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp


def _loop(step, reps, unroll):
    def trip(_, s):
        for _ in range(unroll):
            s = step(s)
        return s

    def run(state):
        return jax.lax.fori_loop(0, reps, trip, state)

    return jax.jit(run, donate_argnums=0)


def device_time_us(step, state, *, reps: int = 50, trials: int = 5, unroll: int = 1):
    """Median device time (us) per ``step`` call inside one jitted loop of ``reps`` trips of ``unroll``
    calls each; returns (us, state)."""
    one, many = _loop(step, 1, unroll), _loop(step, reps, unroll)
    state = jax.block_until_ready(one(state))  # compile + warm
    state = jax.block_until_ready(many(state))
    samples = []
    for _ in range(trials):
        t0 = time.perf_counter()
        state = jax.block_until_ready(one(state))
        t1 = time.perf_counter()
        state = jax.block_until_ready(many(state))
        t2 = time.perf_counter()
        samples.append(((t2 - t1) - (t1 - t0)) / ((reps - 1) * unroll) * 1e6)
    return max(statistics.median(samples), 0.0), state


def wall_time_us(fn, *args, iters: int = 50):
    """Wall time per call (us) of ``fn(*args)`` from a Python loop (dispatch included)."""
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters * 1e6


def wall_time_us_state(fn, state, *, iters: int = 50):
    """Like ``wall_time_us`` for ``fn: state -> state`` with donated state; returns (us, state)."""
    state = jax.block_until_ready(fn(state))
    t0 = time.perf_counter()
    for _ in range(iters):
        state = fn(state)
    state = jax.block_until_ready(state)
    return (time.perf_counter() - t0) / iters * 1e6, state


def copy_ceiling_gbps(nbytes: int, *, reps: int = 20):
    """Device-to-device copy bandwidth in GB/s (read + write counted) for a buffer of ``nbytes``."""
    n = max(nbytes // 4, 1024)
    x = jnp.zeros((n,), jnp.float32)

    def step(a):
        # One full read + one full write per iteration, in place on the donated loop carry (a 2-buffer
        # swap would add a hidden carry copy and halve the apparent bandwidth).
        return a + jnp.float32(1)

    us, _ = device_time_us(step, x, reps=reps)
    return 2 * n * 4 / (us * 1e-6) / 1e9 if us > 0 else float("nan"), us


WALL_BLOCKS = 4  # wall per call = the best of this many blocks of calls (the host is noisy: +-2x seen)


def best_block_wall_us(fn, calls: int, sync) -> float:
    """Wall time per call (us) of ``fn()``: one warm-up call, then the best of ``WALL_BLOCKS`` blocks of
    ``calls / WALL_BLOCKS`` calls (one block when ``calls < WALL_BLOCKS``), ``sync()`` closing each block."""
    fn()
    sync()
    per = max(1, calls // WALL_BLOCKS)
    best = math.inf
    for _ in range(WALL_BLOCKS if calls >= WALL_BLOCKS else 1):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / per)
    return best * 1e6


def cupti_kernels(call, sync, iterations: int, calls: int | None = None) -> dict | None:
    """Kernel name -> us per iteration (CUPTI through jax's Mosaic GPU extension), or None when unavailable.
    ``call()`` runs ``calls`` times (default ``iterations``; 1 when ``call`` itself loops ``iterations`` times on
    the device); ``sync()`` waits for the whole device (e.g. ``torch.cuda.synchronize``)."""
    try:
        from jax._src.lib import mosaic_gpu as mgpu  # noqa: PLC0415 - optional, GPU-only
    except Exception:  # noqa: BLE001
        return None
    ext = getattr(mgpu, "_mosaic_gpu_ext", None)
    if ext is None or not hasattr(ext, "_cupti_init"):
        return None
    try:
        sync()
        ext._cupti_init()
        try:
            for _ in range(iterations if calls is None else calls):
                call()
            sync()
        finally:
            timings = ext._cupti_get_timings(True)
    except Exception as e:  # noqa: BLE001
        print(f"  (CUPTI timing unavailable: {e})", file=sys.stderr)
        return None
    if not timings:
        return None
    per_kernel: dict = {}
    for name, t in timings:
        per_kernel[name] = per_kernel.get(name, 0.0) + t * 1e3 / iterations  # ms -> us
    cupti_kernels.last_count = len(timings) / iterations
    cupti_kernels.last_timings = [(name, t * 1e3) for name, t in timings]  # in order, us each
    return per_kernel


def cupti_kernel_us(call, sync, iterations: int = 10):
    """Sum of kernel durations per call (``cupti_kernels``); None if unavailable. ``last_top`` / ``last_count``:
    the 8 costliest kernels and the kernels per call of the last measurement."""
    per_kernel = cupti_kernels(call, sync, iterations)
    if per_kernel is None:
        return None
    cupti_kernel_us.last_top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]
    cupti_kernel_us.last_count = cupti_kernels.last_count
    return sum(per_kernel.values())


