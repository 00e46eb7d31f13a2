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
"""

import statistics
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
