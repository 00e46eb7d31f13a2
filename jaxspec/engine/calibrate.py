"""Calibration of adaptive engines: the measured seconds per round of each mode (plain, then each draft
shape) at a batch bucket, which the policy weighs against the running acceptance (``engine.policy``)."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.engine.checks import is_int
from jaxspec.engine.slots import SlotChunks
from jaxspec.engine.step import draft_spec_max_accept
from jaxspec.kernels import next_pow2


def calibration_tokens(specs, rounds: int) -> int:
    """Tokens one mode's calibration rounds may commit (untimed + 3 timed pairs, each round <= S + 1)."""
    return (7 + 3 * rounds) * int(max(draft_spec_max_accept(specs))) + 1


def _settings(engine, batch_size, context, rounds) -> tuple[int, int, int]:
    """``(rounds, max_new, ctx)`` of a calibration at ``batch_size`` (``calibrate``'s checks and defaults)."""
    opts = engine.opts
    if opts.adaptive is None:
        raise ValueError("calibrate: only adaptive engines (adaptive=True) choose modes by cost")
    if not is_int(batch_size) or not 1 <= batch_size <= engine.max_batch:
        raise ValueError(f"batch_size: expected an int in [1, max_batch={engine.max_batch}], got {batch_size!r}")
    width = opts.verify_width
    if rounds is None:  # the most (up to 4) whose calibration rounds fit in max_context
        fits = [r for r in (4, 3, 2, 1) if 1 + width + calibration_tokens(opts.specs, r) <= engine.max_context]
        rounds = fits[0] if fits else 1
    if not is_int(rounds) or rounds < 1:
        raise ValueError(f"rounds: expected None or an int >= 1, got {rounds!r}")
    max_new = calibration_tokens(opts.specs, rounds)
    room = engine.max_context - 1 - width - max_new
    if room < 0:
        raise ValueError(f"calibrate: max_context={engine.max_context} leaves no room for the calibration rounds "
                         f"(rounds={rounds}: needs > {1 + width + max_new}); lower rounds")
    if context is not None and (not is_int(context) or context < 0):
        raise ValueError(f"context: expected None or an int >= 0, got {context!r}")
    return int(rounds), max_new, min(room, engine.max_context // 2 if context is None else int(context))


def _batch(engine, batch_size: int, max_new: int):
    """A throw-away batch of ``batch_size`` one-token prompts: ``engine.prepare``'s ``(state, prompts, lens)``."""
    return engine.prepare([np.zeros((1,), np.int32)] * batch_size, max_new)


def lower_calibration(engine, batch_size: int, *, context: int | None = None, rounds: int | None = None) -> list:
    """``Engine.lower_calibration`` (see there): the prefill and the decode loop ``calibrate(batch_size)`` runs,
    lowered for its batch's shapes, neither compiled nor run."""
    _, max_new, _ = _settings(engine, batch_size, context, rounds)
    state, prompts, lens = _batch(engine, batch_size, max_new)
    # run_decode's executable is decode_slots' over every row of the batch (its mode and round limit are values)
    rounds_arg = jax.device_put(np.int32(1))
    return [engine.lower_prefill_slots(state, SlotChunks(prompts, lens), final=True),
            engine.lower_decode_slots(state, bucket=int(state.done.shape[0]), rounds=rounds_arg, first_finish=False)]


def calibrate(engine, batch_size: int, *, context: int | None = None, rounds: int | None = None) -> np.ndarray:
    """``Engine.calibrate`` (see there): the per-round cost of each mode at the batch bucket of ``batch_size``."""
    rounds, max_new, ctx = _settings(engine, batch_size, context, rounds)
    m = 1 + len(engine.opts.specs)
    b = next_pow2(int(batch_size))
    fastest = np.zeros((m, 2))  # per mode: the fastest 1-round and 1+rounds-round calls
    for mode in range(m):  # a fresh batch per mode (the previous one's pools are freed first)
        state = None
        state, prompts, lens = _batch(engine, batch_size, max_new)
        state = engine.run_prefill(state, prompts, lens)
        # no stop token: a row that drew the EOS (likely after a context of whatever the pools hold) would finish,
        # and the timed calls would run empty rounds. Host arithmetic (no eager op): the executables a
        # calibration runs are its prefill and decode loop only (``lower_calibration``'s)
        seq, done = np.asarray(state.seq_lens), np.asarray(state.done)
        state = dataclasses.replace(state, seq_lens=jax.device_put(np.where(done, seq, seq + ctx).astype(np.int32)),
                                    eos_id=jnp.int32(-1))
        state = engine.run_decode(state, max_rounds=1, mode=mode)  # untimed (the bucket's first call compiles)
        elapsed = {1: [], 1 + rounds: []}
        for _ in range(3):
            for trips in elapsed:  # the difference cancels the call's fixed cost (dispatch, loop entry)
                state = jax.block_until_ready(state)
                t0 = time.perf_counter()
                state = jax.block_until_ready(engine.run_decode(state, max_rounds=trips, mode=mode))
                elapsed[trips].append(time.perf_counter() - t0)
        # the fastest call of each length: a call's fixed cost varies (measured on the H200 with the loop in
        # one CUDA graph: single pairs gave plain decoding 0 s per round), and noise only adds time
        fastest[mode] = min(elapsed[1]), min(elapsed[1 + rounds])
    spent = fastest[:, 1] - fastest[:, 0]
    if np.all(spent > 0):
        costs = (spent / rounds).astype(np.float32)
    else:  # some mode's extra rounds cost less than the timing noise (a tiny model): every mode priced alike, at
        # its longer call's time per round (the call's fixed cost included), never at ~0 (which the policy would
        # choose whatever the mode accepts)
        costs = (fastest[:, 1] / (1 + rounds)).astype(np.float32)
    engine.round_costs[b] = costs
    return costs
