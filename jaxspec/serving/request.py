"""What a caller of the serving core hands in and gets back: ``RequestParams`` (limits, sampling, stop tokens),
``RequestHandle`` (a request's token stream and its cancel), ``RequestOutput`` (one step's tokens of one
request) and ``ServingStats`` (counters of the core)."""

import dataclasses
import math
import numbers
from typing import NamedTuple

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: a larger temperature would overflow to inf


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and type(x).__name__ != "bool_"


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and type(x).__name__ != "bool_"


@dataclasses.dataclass(frozen=True)
class RequestParams:
    """Per-request parameters of ``ServingEngine.submit``.

    max_new_tokens: most tokens to generate (an int in [1, 2**31); the prompt plus these must fit the engine's
      context).
    temperature / top_k / top_p / seed: sampling as in ``Engine.prepare`` (temperature 0 = greedy; anything
      else needs a ``sampling=True`` core): temperature a finite float32 >= 0, top_k None / -1 (off) or an int
      >= 1 (at most the vocabulary, checked at submit), top_p in (0, 1], seed an int in [0, 2**31).
    stop_token_ids: token ids that end the request (finish reason ``"stop"``, the stop token kept as the last
      output token), on top of the engine's ``eos_id``. They are matched on the host after each step: the
      device may decode a few more tokens in that step, which are dropped.
    min_tokens: a stop token at output position ``i < min_tokens`` does not end the request (it stays in the
      output and decoding goes on; an int in [0, max_new_tokens]). Only for engines without a device ``eos_id``
      (``submit`` refuses it otherwise).
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple = ()
    min_tokens: int = 0

    def __post_init__(self):
        if not _is_int(self.max_new_tokens) or not 1 <= self.max_new_tokens <= INT32_MAX:
            raise ValueError(f"max_new_tokens: expected an int in [1, 2**31), got {self.max_new_tokens!r}")
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or not 0 <= t <= FLOAT32_MAX:
            raise ValueError(f"temperature: expected a finite number in [0, {FLOAT32_MAX:.8g}] (float32), got {t!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or not (self.top_k == -1 or 1 <= self.top_k
                                                                         <= INT32_MAX)):
            raise ValueError(f"top_k: expected None, -1 (off) or an int >= 1, got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.seed) or not 0 <= self.seed <= INT32_MAX:
            raise ValueError(f"seed: expected an int in [0, 2**31), got {self.seed!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"min_tokens: expected an int in [0, max_new_tokens={self.max_new_tokens}], got "
                             f"{self.min_tokens!r}")
        ids = self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"stop_token_ids: expected a sequence of token ids, got {ids!r}")
        ids = tuple(ids)
        if not all(_is_int(i) and 0 <= i <= INT32_MAX for i in ids):
            raise ValueError(f"stop_token_ids: expected ints >= 0, got {ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)


class RequestOutput(NamedTuple):
    """What a ``step`` produced for one request: the tokens new since the last step, and whether it ended."""

    request_id: str
    new_token_ids: list
    finished: bool
    finish_reason: str | None


class ServingStats(NamedTuple):
    """Counters of a ``ServingEngine`` (``stats()``): requests ``running`` / ``waiting``, KV ``pages_in_use`` of
    ``pages_total`` (the dummy page excluded), batch ``num_slots``; since construction: ``generated_tokens``,
    verify ``rounds`` (per request, summed) and the tokens they accepted (``accepted_tokens``), whose ratio is
    ``mean_accept_length`` (1.0 for plain decoding; 0.0 before any round); an adaptive core's ``mode_rounds``:
    the batch's rounds of each mode (plain, then each draft shape) as of the last step read (else None)."""

    running: int
    waiting: int
    pages_in_use: int
    pages_total: int
    num_slots: int
    generated_tokens: int
    rounds: int
    accepted_tokens: int
    mean_accept_length: float
    mode_rounds: tuple[int, ...] | None = None


class RequestHandle:
    """A submitted request. ``request_id``, ``status`` (``"waiting"`` / ``"running"`` / ``"finished"``),
    ``finish_reason`` (``"stop"`` / ``"length"`` / ``"abort"``, or None), ``output`` (token ids so far),
    ``num_prompt_tokens``, ``request`` (the core's ``Request``: times and counters). Iterating yields its token
    ids as they come; when none is buffered it runs the core's ``step()`` itself (single-threaded use; every
    other request advances too). ``cancel()`` ends it now."""

    def __init__(self, core, request):
        self._core, self._req = core, request

    @property
    def request_id(self) -> str:
        return self._req.request_id

    @property
    def status(self) -> str:
        return self._req.status

    @property
    def finish_reason(self) -> str | None:
        return self._req.finish_reason

    @property
    def output(self) -> list:
        return self._req.output

    @property
    def num_prompt_tokens(self) -> int:
        return self._req.num_prompt_tokens

    @property
    def request(self):
        """The core's ``Request`` (read only): its times (``arrival_time``, ``scheduled_time``,
        ``first_token_time``, ``last_token_time``, ``finished_time``) and round counters."""
        return self._req

    def __iter__(self):
        pos = 0
        while True:
            if pos < len(self._req.output):
                pos += 1
                yield self._req.output[pos - 1]
            elif self._req.status == "finished":
                return
            else:
                self._core.step()

    def cancel(self) -> None:
        self._core.cancel(self)

    def __repr__(self) -> str:
        return f"RequestHandle({self.request_id!r}, status={self.status!r}, tokens={len(self.output)})"
