"""What a round costs an adaptive serving core: the compiled loop's cost per round plus the step's own overhead.

``Engine.calibrate`` measures each mode's cost per round inside the compiled decode loop, the fixed cost of a
call cancelled out. That is the right price in ``Engine.generate``, whose one loop runs until the batch is done.
A serving step runs at most ``R`` rounds and then pays a price of its own whatever the rounds were: the one
host read, retiring and admitting, the prefills of admitted requests, the page-table refresh. A round of mode
``m`` really costs ``c_m + o``, ``o`` that overhead spread over the step's rounds, and the policy's choice
(highest ``accept(m) / cost(m)``) must use that price: with ``o`` near ``c_plain`` a draft shape that accepts
two tokens per round at twice plain's in-loop cost is a clear win, where the in-loop costs alone call it a tie.

``StepCosts`` keeps ``o`` as the median, over the last ``window`` steps that ran rounds, of each step's host
wall time less the in-loop cost of the rounds it ran, per round (a median, so the few steps that compiled
something or admitted a burst do not set the price), and hands the policy ``c + o``. Host only; the core
writes the costs into its policy state between steps (values: nothing recompiles).
"""

import collections

import numpy as np


class StepCosts:
    """The per-round cost of each mode a serving core's policy compares (module docstring).

    Args:
      base: ``f32[M]`` in-loop seconds per round of each mode (``Engine.calibrate`` at the slot count).
      window: how many recent steps the overhead's median is over (>= 1).
    """

    def __init__(self, base, window: int = 64):
        base = np.asarray(base, np.float64)
        if base.ndim != 1 or base.size < 1 or not np.all(np.isfinite(base)) or np.any(base <= 0):
            raise ValueError(f"base: expected positive finite seconds per round, one per mode; got {base}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window: expected an int >= 1, got {window!r}")
        self.base = base
        self._per_round = collections.deque(maxlen=window)

    @property
    def overhead(self) -> float:
        """``o``: the step's own seconds per round (0 before the first observed step)."""
        return float(np.median(self._per_round)) if self._per_round else 0.0

    def observe(self, seconds: float, rounds) -> None:
        """One step took ``seconds`` of host wall time and ran ``rounds[m]`` rounds of each mode (``i[M]``; a
        step without rounds says nothing about their price and is skipped)."""
        rounds = np.asarray(rounds, np.float64)
        if rounds.shape != self.base.shape or np.any(rounds < 0):
            raise ValueError(f"rounds: expected {self.base.size} non-negative counts, got {rounds}")
        n = rounds.sum()
        if n <= 0:
            return
        self._per_round.append(max(0.0, (float(seconds) - float(rounds @ self.base)) / n))

    def round_cost(self) -> np.ndarray:
        """``f32[M]``: ``base + overhead``, the price of a round of each mode in this core."""
        return (self.base + self.overhead).astype(np.float32)


__all__ = ["StepCosts"]
