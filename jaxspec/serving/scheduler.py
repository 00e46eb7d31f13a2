"""The serving core's scheduler, data in and data out (host only: no JAX, no device state).

vLLM's ``schedule() -> SchedulerOutput`` then ``update_from_output``: ``Scheduler.schedule(now)`` returns the
step's ``StepPlan`` (the prefill chunks under the token budget, the page-table rows to write, the slot rows to
decode), the runner (``ServingEngine.step``) executes it on the device and hands the step's one host read back
as a ``StepResult`` to ``Scheduler.update(plan, result, now)``, which appends each request's new tokens,
matches its stop ids and retires the finished ones (slot and pages freed at once). It holds the waiting,
running and finished requests, the slots (lowest free first), the KV page free list (``PagePool``) and the
page reservation; ``docs/serving.md`` ("How the core works") has the policy in words.

Plans may run ahead of their updates (SGLang's overlap scheduler: the runner plans and dispatches step
``k + 1`` before it reads step ``k``): every decoding request is given the pages of all the steps planned and
not yet updated (``in_flight``) ahead of its last read length, and ``update`` takes a plan's outputs only for
the requests that plan decoded and that still hold their slot (a request retired or cancelled since, and a
new request admitted into its slot, are not confused with that row's old outputs).
"""

import collections
import dataclasses
import heapq
import math

from jaxspec.serving.request import RequestOutput


class PagePool:
    """Host free list of the KV pool's pages ``1 .. num_pages - 1`` (page 0 is the dummy page).

    ``allocate(n)`` hands out ``n`` pages (the most recently freed first, so retired requests' pages are
    reused at once) and raises ``RuntimeError`` when fewer are free: the scheduler budgets pages before it
    asks, so running out here is a bookkeeping bug, never a normal condition. ``free(pages)`` returns them and
    refuses a page that is not out (double free, the dummy page, out of range)."""

    def __init__(self, num_pages: int):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 2:
            raise ValueError(f"num_pages: expected an int >= 2 (the dummy page 0 and at least one page), got "
                             f"{num_pages!r}")
        self.num_pages = int(num_pages)
        self._free = list(range(self.num_pages - 1, 0, -1))
        self._out: set[int] = set()

    @property
    def capacity(self) -> int:
        """Pages a request can ever be given (all but the dummy page)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        """The free list (a copy)."""
        return list(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"page pool: {n} pages asked for, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self._out.update(out)
        return out

    def free(self, pages) -> None:
        for p in pages:
            if p not in self._out:
                raise RuntimeError(f"page pool: page {p} freed but not allocated")
            self._out.remove(p)
            self._free.append(p)


@dataclasses.dataclass(eq=False)  # identity: a request is itself, whatever its fields
class Request:
    """One request: its prompt, limit, and what it has generated so far (host side).

    status: ``"waiting"`` (queued), ``"running"`` (in slot ``slot``: being prefilled, then decoding),
    ``"finished"``. finish_reason (when finished): ``"stop"`` (EOS or one of its stop ids, kept as the last
    token), ``"length"`` (``max_new_tokens``) or ``"abort"``. prefilled: the prompt tokens whose K/V is written
    (the prompt's length once it decodes); seq_len: its committed tokens (the last read, or the prefilled
    prompt). pages: the KV pages it holds (empty unless running). The times (seconds of the caller's clock,
    ``None`` until they happen): ``arrival_time`` (submitted), ``scheduled_time`` (its first chunk scheduled),
    ``first_token_time``, ``last_token_time`` (the step that read its latest tokens), ``finished_time``."""

    request_id: str
    prompt: object  # a sequence of token ids (the core's: i32 numpy)
    max_new_tokens: int
    output: list = dataclasses.field(default_factory=list)
    status: str = "waiting"
    finish_reason: str | None = None
    slot: int | None = None
    pages: list = dataclasses.field(default_factory=list)
    worst_pages: int = 0  # pages its whole life can reach (the admission budget)
    sampling: tuple = ()  # (temperature f32[1], top_k i32[1], top_p f32[1], seed i32[1]) of check_sampling
    stop_token_ids: frozenset = frozenset()  # host-matched stop ids (the engine's eos_id stops on the device)
    min_tokens: int = 0  # a host-matched stop id at an output position below this does not end it
    rounds: int = 0  # verify rounds it was active in, and the tokens they accepted (the device's last counts)
    accepted: int = 0
    prefilled: int = 0
    seq_len: int = 0
    arrival_time: float | None = None
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def decoding(self) -> bool:
        """Running with its whole prompt prefilled."""
        return self.status == "running" and self.prefilled == self.num_prompt_tokens


class Chunk:
    """One scheduled prefill chunk: ``length`` prompt tokens of ``req`` from position ``start``; ``final`` when
    it ends the prompt."""

    __slots__ = ("req", "start", "length")

    def __init__(self, req: Request, start: int, length: int):
        self.req, self.start, self.length = req, start, length

    @property
    def final(self) -> bool:
        return self.start + self.length == self.req.num_prompt_tokens

    def __repr__(self) -> str:
        return f"Chunk({self.req.request_id!r}, start={self.start}, length={self.length})"


def chunk_length(remaining: int, budget: int, lookahead: int) -> int:
    """Prompt tokens a step gives a request with ``remaining`` tokens left when ``budget`` tokens of the step's
    prefill budget are left: all of them if they fit, else the budget, but never leaving fewer than
    ``lookahead`` tokens to the last chunk (0: none this step)."""
    if remaining <= budget:
        return remaining
    return max(0, min(budget, remaining - lookahead))


@dataclasses.dataclass
class StepPlan:
    """What one step runs (``Scheduler.schedule``): ``chunks`` (the prefill chunks, in order: a step prefills
    its last chunks in one call and its non-final chunk, at most one, in another), ``tables`` (slot -> (first
    column, page ids): the page-table rows to write before anything runs), ``stop`` (slots whose requests the
    host retired since the last plan, at a stop id: their rows are marked done before anything runs),
    ``decode_rows`` (the rows the decode covers: the highest occupied slot + 1; 0 when no request decodes, and
    then nothing is read back), ``decoding`` (slot -> the request decoding there: the rows whose outputs
    ``update`` takes)."""

    chunks: list
    tables: dict
    decode_rows: int
    stop: list = dataclasses.field(default_factory=list)
    decoding: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepResult:
    """The step's one host read, per slot: ``done``, ``num_generated``, ``seq_lens``, ``out_tokens`` (rows of
    generated ids), ``num_rounds``, ``num_accepted`` (the device's counters of each row)."""

    done: object
    num_generated: object
    seq_lens: object
    out_tokens: object
    num_rounds: object
    num_accepted: object


class Scheduler:
    """FCFS admission under a page budget and a prefill token budget (module docstring).

    Args:
      num_slots: the batch slots ``B``.
      pool: the ``PagePool`` the pages come from.
      max_context / page_size: ``W`` tokens and ``G`` tokens per page of a slot.
      rounds_per_step / verify_width: ``R`` rounds a step, each writing up to ``N`` tokens (the pages a
        decoding request is given ahead).
      max_prefill_tokens / lookahead: ``T`` prompt tokens a step, and the tokens a non-final chunk leaves to
        the last one at least (``chunk_length``).
      eos_id: the token the device stops at (-1: none), for the finish reason.

    ``can_admit(req)``: a slot is free and ``pool.num_free - promised >= req.worst_pages``, with ``promised``
    the pages running requests may still ask for (their worst case less what they hold).
    """

    def __init__(self, num_slots: int, pool: PagePool, *, max_context: int, page_size: int = 1,
                 rounds_per_step: int = 1, verify_width: int = 1, max_prefill_tokens: int = 256, lookahead: int = 1,
                 eos_id: int = -1):
        for name, v in [("num_slots", num_slots), ("max_context", max_context), ("page_size", page_size),
                        ("rounds_per_step", rounds_per_step), ("verify_width", verify_width),
                        ("lookahead", lookahead)]:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        t = max_prefill_tokens
        if isinstance(t, bool) or not isinstance(t, int) or t < lookahead:
            raise ValueError(f"max_prefill_tokens: expected an int >= {lookahead} (the prompt tokens past a chunk "
                             f"the drafter's extend reads), got {t!r}")
        if not isinstance(pool, PagePool):
            raise ValueError(f"pool: expected a PagePool, got {type(pool).__name__}")
        self.num_slots, self.pool = num_slots, pool
        self.max_context, self.page_size = max_context, page_size
        self.max_pages = math.ceil(max_context / page_size)
        self.rounds_per_step, self.verify_width = rounds_per_step, verify_width
        self.max_prefill_tokens, self.lookahead, self.eos_id = t, lookahead, eos_id
        self.waiting: collections.deque[Request] = collections.deque()
        self.free_slots = list(range(num_slots))  # a heap: the lowest free slot first
        self.running: dict[int, Request] = {}  # slot -> request
        self.prefilling: list[Request] = []  # running requests part-way through their prompt, admission order
        self._tables: dict[int, tuple[int, list[int]]] = {}  # slot -> (first column, pages): the next refresh
        self._stop: list[int] = []  # slots retired at a host-matched stop id since the last plan
        self.in_flight = 0  # plans with rows to decode whose update has not come back yet
        self.generated = self.rounds = self.accepted = 0  # over every request served

    # ------------------------------------------------------------------ requests in
    def worst_pages(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """The pages a request's whole life can reach (prompt, outputs, the last step's rounds ahead)."""
        r, n = self.rounds_per_step, self.verify_width
        return math.ceil(min(self.max_context, prompt_tokens + max_new_tokens + r * n) / self.page_size)

    def add(self, req: Request) -> None:
        """Queue ``req`` (its ``worst_pages`` set here); ``ValueError`` when even the whole pool is too small."""
        req.worst_pages = self.worst_pages(req.num_prompt_tokens, req.max_new_tokens)
        if req.worst_pages > self.pool.capacity:
            raise ValueError(f"prompt_ids: the request may need {req.worst_pages} KV pages of {self.page_size} "
                             f"tokens, the pool holds {self.pool.capacity} (num_pages={self.pool.num_pages}, page "
                             f"0 reserved)")
        self.waiting.append(req)

    def abort(self, req: Request, now: float | None = None) -> int | None:
        """End ``req`` now (reason ``"abort"``); returns its slot when it was running (the runner marks that row
        done with the pending ``take_tables()``), else ``None``."""
        if req.status == "waiting":
            self.waiting.remove(req)
            req.status, req.finish_reason, req.finished_time = "finished", "abort", now
            return None
        slot = req.slot
        self._finish(req, "abort", now)
        return slot

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def promised(self) -> int:
        return sum(r.worst_pages - len(r.pages) for r in self.running.values())

    def can_admit(self, req: Request) -> bool:
        return bool(self.free_slots) and self.pool.num_free - self.promised() >= req.worst_pages

    def take_tables(self) -> dict:
        """The page-table rows changed since the last plan (and forget them)."""
        out, self._tables = self._tables, {}
        return out

    # ------------------------------------------------------------------ the plan
    def _chunks(self, now) -> list[Chunk]:
        """The step's prefill chunks, at most ``max_prefill_tokens`` prompt tokens in all (``chunk_length``):
        the part-prefilled requests first, then waiting requests in order while the head fits (each admitted:
        a slot, status ``"running"``), up to and including the first non-final chunk (it takes what is left of
        the budget but up to ``lookahead - 1`` tokens, so a step has at most one: its prefill call is one
        chunk wide). Every chunk's ``req.prefilled`` is advanced."""
        budget, lookahead, out = self.max_prefill_tokens, self.lookahead, []
        stalled = False
        for req in list(self.prefilling):
            remaining = req.num_prompt_tokens - req.prefilled
            n = chunk_length(remaining, budget, lookahead)
            if n == 0:
                stalled = True
                break
            out.append(Chunk(req, req.prefilled, n))
            budget -= n
            if n < remaining:  # a non-final chunk ends the step's chunks
                stalled = True
                break
        while not stalled and self.waiting and self.can_admit(self.waiting[0]):
            remaining = self.waiting[0].num_prompt_tokens
            n = chunk_length(remaining, budget, lookahead)
            if n == 0:
                break
            req = self.waiting.popleft()
            req.slot, req.status, req.prefilled = heapq.heappop(self.free_slots), "running", 0
            req.scheduled_time = now
            self.running[req.slot] = req
            self.prefilling.append(req)
            out.append(Chunk(req, 0, n))
            budget -= n
            if n < remaining:
                break
        for c in out:
            c.req.prefilled += c.length
            if c.final:
                self.prefilling.remove(c.req)
        return out

    def _grow(self, req: Request, tokens: int) -> None:
        """Assign ``req`` the pages covering its first ``tokens`` positions (capped at ``W`` and at its whole
        life's ``worst_pages``: the device writes no position past those, however many steps run ahead)."""
        need = min(math.ceil(min(self.max_context, tokens) / self.page_size), req.worst_pages)
        new = need - len(req.pages)
        if new <= 0:
            return
        pages = self.pool.allocate(new)
        start, old = self._tables.get(req.slot, (len(req.pages), []))
        self._tables[req.slot] = (start, old + pages)
        req.pages = req.pages + pages

    def schedule(self, now: float | None = None) -> StepPlan:
        """The next step's ``StepPlan``: its chunks (admissions included), and the pages every chunk's tokens
        reach (a prompt's last chunk also those of the step's rounds) and every decoding request's next ``R``
        rounds reach, past the rounds of the plans in flight (module docstring), as page-table rows."""
        ahead = self.rounds_per_step * self.verify_width
        behind = ahead * self.in_flight  # what the plans not yet updated may have added to a last read length
        chunks = self._chunks(now)
        for c in chunks:
            req = c.req
            if c.start == 0:
                self._tables.pop(req.slot, None)  # a retired row's reset is superseded by the new row
            self._grow(req, c.start + c.length + (ahead if c.final else 0))
            if c.start == 0:
                self._tables[req.slot] = (0, req.pages + [0] * (self.max_pages - len(req.pages)))
            req.seq_len = c.start + c.length
        scheduled = {id(c.req) for c in chunks}
        decoding = False
        for req in self.running.values():
            if req.decoding:
                decoding = True
                if id(req) not in scheduled:
                    self._grow(req, req.seq_len + behind + ahead)
        rows = max(self.running) + 1 if decoding else 0
        stop, self._stop = self._stop, []
        if rows:
            self.in_flight += 1
        live = {slot: r for slot, r in self.running.items() if r.decoding} if rows else {}
        return StepPlan(chunks, self.take_tables(), rows, stop, live)

    # ------------------------------------------------------------------ outputs back
    def update(self, plan: StepPlan, result: StepResult, now: float | None = None) -> list[RequestOutput]:
        """Take the step's read back (plans are updated in the order they were made): each request the plan
        decoded that still holds its slot gets its new tokens (cut at its first host-matched stop id from output
        position ``min_tokens`` on) and its counters, and those that finished (the device's ``done`` or a stop
        id) are retired. Returns a ``RequestOutput`` per request that produced tokens or ended."""
        if not plan.decode_rows:
            return []  # it decoded nothing (and was never in flight)
        self.in_flight -= 1
        outputs = []
        for slot, req in plan.decoding.items():
            if req.status != "running" or req.slot != slot:
                continue  # retired or cancelled since the plan (its slot may hold a newer request)
            num = int(result.num_generated[slot])
            new = [int(t) for t in result.out_tokens[slot][len(req.output): num]]
            rounds, acc = int(result.num_rounds[slot]), int(result.num_accepted[slot])
            self.rounds += rounds - req.rounds
            self.accepted += acc - req.accepted
            req.rounds, req.accepted = rounds, acc
            req.seq_len = int(result.seq_lens[slot])
            first = max(0, req.min_tokens - len(req.output))  # stop ids count from output position min_tokens
            stop = next((k for k, t in enumerate(new) if k >= first and t in req.stop_token_ids), None)
            if stop is not None:
                new = new[: stop + 1]
            if new:
                if req.first_token_time is None:
                    req.first_token_time = now
                req.last_token_time = now
            req.output.extend(new)
            self.generated += len(new)
            finished = bool(result.done[slot]) or stop is not None
            if finished:
                eos = self.eos_id
                hit = stop is not None or (eos >= 0 and req.output and req.output[-1] == eos)
                if not result.done[slot]:
                    self._stop.append(slot)  # the device row runs on until the next plan marks it done
                self._finish(req, "stop" if hit else "length", now)
            if new or finished:
                outputs.append(RequestOutput(req.request_id, new, finished, req.finish_reason))
        return outputs

    def _finish(self, req: Request, reason: str, now) -> None:
        """Give ``req``'s slot and pages back at once (its table row back to the dummy page in the next refresh)."""
        self.pool.free(req.pages)
        req.pages = []
        del self.running[req.slot]
        if req in self.prefilling:
            self.prefilling.remove(req)
        heapq.heappush(self.free_slots, req.slot)
        self._tables[req.slot] = (0, [0] * self.max_pages)
        req.status, req.finish_reason, req.slot, req.finished_time = "finished", reason, None, now
