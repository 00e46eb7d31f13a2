"""Continuous batching over an ``Engine``: requests join a running batch, decode, and leave, nothing recompiled.

``ServingEngine(engine, rounds_per_step=R)`` is the runner: ``submit`` queues a request, ``step`` takes the
scheduler's plan (``serving.scheduler``: chunks under a token and a page budget), refreshes the page tables,
prefills the step's chunks into their slots in one call per kind (the engine's slot API: the last chunks of
prompts in one ``Engine.prefill_slots``, the step's one non-final chunk, if any, in another), decodes up to
``R`` rounds over the occupied slot bucket (``Engine.decode_slots``), reads the new tokens back once and hands
them to the scheduler; ``cancel`` frees a request's slot and pages at once. With ``overlap`` (the default) a
step reads the previous step's tokens after it has dispatched its own calls, so the host's planning, packing
and dispatch run while the device works through the previous step (JAX's asynchronous dispatch; SGLang's
overlap scheduler). How each part works (scheduling, page policy, chunk boundaries, buckets, sampling,
stopping): ``docs/serving.md``, "How the core works".
"""

import collections
import concurrent.futures
import dataclasses
import functools
import os
import time

import jax
import numpy as np

from jaxspec._validate import checks_enabled
from jaxspec.engine import Engine, SamplingParams, SlotChunks, check_prompts, check_sampling, prompt_bucket
from jaxspec.kernels import next_pow2
from jaxspec.serving.costs import StepCosts
from jaxspec.serving.pages import pack_rows, refresh_fn
from jaxspec.serving.request import RequestHandle, RequestOutput, RequestParams, ServingStats
from jaxspec.serving.scheduler import PagePool, Request, Scheduler, StepResult

DEFAULT_MAX_PREFILL_TOKENS = 256  # prompt tokens prefilled per step (ServingEngine(max_prefill_tokens=))
# an adaptive core re-prices its policy (a new device array of round costs) only when a price moves by more than
# this fraction of what the state holds, or the slot bucket changes (ServingEngine._decode_state)
REPRICE_TOLERANCE = 0.05
MAX_WARMUP_THREADS = 8  # warmup()'s default compile threads on an accelerator: min(this, os.cpu_count())


def prompt_buckets(max_width: int, max_context: int) -> list[int]:
    """The padded widths ``prompt_bucket`` gives chunks of ``1 .. max_width`` tokens."""
    out, n = [], 1
    while True:
        out.append(prompt_bucket(min(n, max_width), max_context))
        if n >= max_width:
            return sorted(set(out))
        n *= 2


def chunk_batch_buckets(slot_buckets: list[int], chunk_buckets: list[int], budget: int) -> list[tuple[int, int]]:
    """The ``(chunks, width)`` buckets a step's prefill call can take: ``c`` chunks (a power of two up to the
    slots) whose longest is padded to ``width``, as long as ``c`` chunks of at least one token with the longest
    in that width's bucket fit ``budget`` prompt tokens (the last chunks' call: warmup compiles these and, for a
    step's one non-final chunk, ``(1, width)`` of every width)."""
    out = []
    for k, p in enumerate(chunk_buckets):
        least = 1 if k == 0 else chunk_buckets[k - 1] + 1  # the shortest longest chunk padded to p
        out += [(c, p) for c in slot_buckets if c // 2 + least <= budget]  # c // 2 + 1 chunks need bucket c
    return out


@jax.jit
def _step_outputs(state):
    """Copies of what a step reads back (``StepResult``'s arrays and the adaptive policy's rounds per mode): the
    next step's calls donate the state, so a read that waits for them must not hold the state's own buffers."""
    modes = None if state.policy is None else state.policy.mode_rounds
    return jax.tree.map(lambda x: x.copy(), (state.done, state.num_generated, state.seq_lens, state.out_tokens,
                                             state.num_rounds, state.num_accepted, modes))


@dataclasses.dataclass
class StepTimes:
    """Where a core's steps went (seconds, summed since construction): ``host`` (planning, packing and
    dispatching the step's calls, and taking its outputs back) = ``plan`` (the scheduler's plan) + ``dispatch``
    (packing the page tables and chunks, their transfers, the calls) + ``update`` (after the read: the adaptive
    prices, the scheduler's update, retiring requests); ``device`` (waiting for its one read: the device's work
    not hidden behind the host's), ``steps`` (steps that read)."""

    plan: float = 0.0
    dispatch: float = 0.0
    update: float = 0.0
    device: float = 0.0
    steps: int = 0

    @property
    def host(self) -> float:
        return self.plan + self.dispatch + self.update


class ServingEngine:
    """Continuous batching over ``engine`` (module docstring: the step, the page policy, the one host read).

    Args:
      engine: an ``Engine`` (plain, speculative or adaptive). Its ``num_slots`` (``max_batch`` rounded up to a
        power of two) is the number of slots, its ``max_context`` the tokens per slot, its ``num_pages`` /
        ``page_size`` the pool; its slot API (``fresh_slots``, ``prefill_slots``, ``decode_slots``) is what this
        core runs.
      rounds_per_step: ``R``, the most decode rounds per ``step`` (a value of the decode loop: any ``R`` shares
        one executable); the loop leaves as soon as a running request finishes.
      sampling: ``False`` (default): greedy requests only, the greedy executables. ``True``: the sampling
        executables; each request brings its own sampling parameters (``RequestParams``).
      max_prefill_tokens: ``T``, the most prompt tokens one step prefills, over all its requests (default
        ``DEFAULT_MAX_PREFILL_TOKENS`` = 256); a longer prompt is prefilled in chunks over several steps. Smaller
        keeps the running requests' inter-token latency even when requests arrive in bursts or with long
        prompts, larger gives a new request its first token in fewer steps. At least the drafter's
        ``prefill_lookahead`` (1 for plain decoding).
      overlap: ``True`` (default): ``step`` plans and dispatches its calls, then reads and returns the tokens
        of the step before it (the device is never idle while the host plans; a request's tokens come back as
        soon as the device has made them, and the step that follows its last token retires it). ``False``:
        ``step`` reads and returns its own tokens (the host's work between two steps leaves the device idle).

    ``submit(prompt_ids, RequestParams(...))`` queues a request and returns its ``RequestHandle`` (iterate it for
    its tokens); ``step()`` runs one iteration and returns a ``RequestOutput`` per request that produced tokens
    or ended; ``cancel(handle)`` ends a request at once (queued or running: its slot and pages are free when it
    returns); ``generate(prompts, params)`` is the blocking form for a list; ``has_unfinished()``; ``stats()``;
    ``warmup()`` compiles every executable a step can run; ``requests[request_id]`` holds each unfinished request
    (``output`` grows as it decodes): a request leaves it when it finishes (the ``step`` that returns its last
    output, or ``cancel``), so the core keeps nothing of the requests it has served; its ``RequestHandle`` still
    reads it. ``times`` (``StepTimes``): host and device time of the steps. One thread owns a core.
    """

    def __init__(self, engine: Engine, *, rounds_per_step: int = 1, sampling: bool = False,
                 max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS, overlap: bool = True):
        if not isinstance(engine, Engine):
            raise ValueError(f"engine: expected a jaxspec.engine.Engine, got {type(engine).__name__}")
        if engine.simulate_accept is not None:
            raise ValueError("engine: simulated acceptance is not served (it is a benchmark of the engine alone)")
        if not isinstance(rounds_per_step, int) or isinstance(rounds_per_step, bool) or rounds_per_step < 1:
            raise ValueError(f"rounds_per_step: expected an int >= 1, got {rounds_per_step!r}")
        if not isinstance(sampling, bool):
            raise ValueError(f"sampling: expected a bool, got {sampling!r}")
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap: expected a bool, got {overlap!r}")
        self.overlap = overlap
        self._pending: collections.deque = collections.deque()  # dispatched steps not read yet (step())
        self._last_read = 0.0  # when the last read came back
        self.lookahead = engine.prefill_lookahead
        t = max_prefill_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < self.lookahead:
            raise ValueError(f"max_prefill_tokens: expected an int >= {self.lookahead} (the prompt tokens past a chunk "
                             f"the drafter's extend reads), got {t!r}")
        self.sampling = sampling
        self.engine = engine
        self.rounds_per_step = rounds_per_step
        self.max_prefill_tokens = t
        self.num_slots = b = engine.num_slots
        self.max_context = w = engine.max_context
        self.page_size = engine.page_size
        self.verify_width = engine.opts.verify_width
        self.slot_buckets = [1 << i for i in range(b.bit_length())]  # 1, 2, 4, .. B
        self.chunk_buckets = prompt_buckets(min(t, w), w)
        self.prefill_buckets = chunk_batch_buckets(self.slot_buckets, self.chunk_buckets, t)  # last chunks
        self.prefill_chunk_buckets = [(1, p) for p in self.chunk_buckets]  # a step's one non-final chunk
        self.pool = PagePool(engine.num_pages)
        self.scheduler = Scheduler(b, self.pool, max_context=w, page_size=self.page_size,
                                   rounds_per_step=rounds_per_step, verify_width=self.verify_width,
                                   max_prefill_tokens=t, lookahead=self.lookahead, eos_id=engine.eos_id)
        self.max_pages = self.scheduler.max_pages
        self.requests: dict[str, Request] = {}
        self._next_id = 0
        self.times = StepTimes()
        self._state = engine.fresh_slots(all_greedy=not sampling)
        self._r2p = jax.device_put(np.zeros((b, self.max_pages), np.int32))
        self._rounds = jax.device_put(np.int32(rounds_per_step))  # the decode's round limit, one transfer per core
        self.step_costs: StepCosts | None = None  # adaptive engines: the policy's round prices (costs.py)
        self._bucket_costs: dict[int, np.ndarray] = {}  # adaptive: slot bucket -> in-loop seconds per round per mode
        self._mode_rounds = None
        self._priced: tuple[int, np.ndarray] | None = None  # adaptive: (bucket, prices) the state's policy holds
        if engine.opts.adaptive is not None:  # one policy for the batch, learning across steps (a warm start)
            cost = engine.round_costs[b]  # fresh_slots calibrated it when missing
            self.step_costs = StepCosts(cost)
            # a smaller slot bucket's rounds at its own calibrated costs where the engine has them, else the
            # slot count's (its mode ratios) until warmup() calibrates it
            self._bucket_costs = {k: np.asarray(engine.round_costs.get(k, cost), np.float64) for k in self.slot_buckets}
            self._mode_rounds = np.zeros_like(self.step_costs.base, np.int64)

    # ---------------------------------------------------------------- device calls
    def _refresh_call(self, tables: dict, stop: np.ndarray | None):
        """The jitted table refresh and its arguments after the state and the page table (``_refresh``), or
        ``None`` when there is nothing to write and no row to stop."""
        packed = pack_rows(tables, num_slots=self.num_slots, max_pages=self.max_pages)
        if packed is None and stop is None:
            return None
        if packed is None:  # nothing to write: one padding entry (0 pages)
            packed = tuple(np.zeros((n,), np.int32) for n in (self.num_slots, self.num_slots * self.max_pages,
                                                              self.num_slots, self.num_slots))
        stop = np.zeros((self.num_slots,), bool) if stop is None else stop
        eng = self.engine
        fn = refresh_fn(self.page_size, self.max_context, eng.opts.implementation, eng.opts.interpret,
                        checks_enabled())
        return fn, jax.device_put((*packed, stop))  # one transfer

    def _refresh(self, tables: dict, stop: np.ndarray | None = None) -> None:
        """One jitted table refresh of the rows ``tables`` (slot -> (first column, pages)) and the ``stop`` rows
        marked done; nothing when there is neither."""
        call = self._refresh_call(tables, stop)
        if call is None:
            return
        fn, args = call
        if checks_enabled():
            err, (self._state, self._r2p) = fn(self._state, self._r2p, *args)
            msg = err.get()
            if msg is not None:
                raise ValueError(f"JAXSPEC_CHECKS: a check failed in ServingEngine's page-table refresh: {msg}")
        else:
            self._state, self._r2p = fn(self._state, self._r2p, *args)

    def _chunk_arrays(self, chunks: list, final: bool, count: int | None = None, width: int | None = None):
        """The host arrays of one prefill call of ``chunks`` (a ``SlotChunks`` of numpy arrays), padded to the
        chunk bucket ``next_pow2(len)`` (or ``count``) and the width bucket of the longest (or ``width``):
        padding chunks go to row ``B`` (they write nothing)."""
        eng, b = self.engine, self.num_slots
        c = count or next_pow2(len(chunks))
        p = width or prompt_bucket(max(ch.length for ch in chunks), self.max_context)
        tokens = np.zeros((c, p), np.int32)
        lengths = np.ones((c,), np.int32)
        slots = np.full((c,), b, np.int32)
        prefix = np.zeros((c,), np.int32)
        max_new = np.zeros((c,), np.int32)
        temp, top_p = np.zeros((c,), np.float32), np.ones((c,), np.float32)
        top_k, seed = np.full((c,), eng.vocab_size, np.int32), np.zeros((c,), np.int32)
        following = None if final else np.zeros((c, self.lookahead), np.int32)
        for i, ch in enumerate(chunks):
            req, start, n = ch.req, ch.start, ch.length
            tokens[i, :n] = req.prompt[start: start + n]
            lengths[i], slots[i], prefix[i], max_new[i] = n, req.slot, start, req.max_new_tokens
            temp[i], top_k[i], top_p[i], seed[i] = (x[0] for x in req.sampling)
            if not final:  # the whole lookahead: a non-final chunk leaves at least that many tokens
                following[i] = req.prompt[start + n: start + n + self.lookahead]
        sampling = SamplingParams(temp, top_k, top_p, seed)
        return SlotChunks(tokens, lengths, slots, prefix, following, max_new, sampling)

    def _prefill(self, chunks: list, final: bool, count: int | None = None, width: int | None = None) -> None:
        """Dispatch one prefill call of ``chunks`` into their slots (their pages already in the table): last
        chunks padded to their chunk bucket, a non-final chunk alone (the scheduler gives a step at most one:
        its call is always one chunk wide, ``prefill_chunk_buckets``)."""
        if not final:
            if len(chunks) > 1:
                raise RuntimeError(f"prefill: {len(chunks)} non-final chunks in one step (the scheduler plans one)")
            count = 1
        arrays = self._chunk_arrays(chunks, final, count, width)
        self._state = self.engine.prefill_slots(self._state, jax.device_put(arrays), final=final)  # one transfer

    def _decode(self, bucket: int) -> None:
        """Dispatch up to ``R`` rounds of the decode loop over the slot bucket ``bucket``; an adaptive core's
        policy is priced at the bucket's in-loop costs plus the step's own overhead per round."""
        self._state = self.engine.decode_slots(self._decode_state(bucket), bucket=bucket, rounds=self._rounds)

    def _decode_state(self, bucket: int):
        """The state a decode of ``bucket`` is given: an adaptive core's policy priced for the bucket. The prices
        are written (a new device array) only when the bucket changes or a price moves by more than
        ``REPRICE_TOLERANCE`` of what the state holds; otherwise the state keeps its own buffer, which the
        donated decode hands back in place: an argument buffer that moves between calls makes XLA:GPU update
        the command buffers (CUDA graphs) that read it, and the prices are read in every loop of an adaptive
        decode."""
        st = self._state
        if self.step_costs is None:
            return st
        cost = (self._bucket_costs[bucket] + self.step_costs.overhead).astype(np.float32)
        if self._priced is not None and self._priced[0] == bucket:
            held = self._priced[1]
            if np.all(np.abs(cost - held) <= REPRICE_TOLERANCE * held):
                return st
        self._priced = (bucket, cost)
        return dataclasses.replace(st, policy=dataclasses.replace(st.policy, round_cost=jax.device_put(cost)))

    def warmup(self, progress=None, *, threads: int | None = None, calibrate: bool | None = None) -> None:
        """Compile every executable a step can run (the table refresh, the last chunks' prefill of every
        chunk-count and width bucket a step's budget allows, ``prefill_buckets``, the non-final chunk's of every
        width, ``prefill_chunk_buckets``, the decode of every slot bucket, the copy of a step's outputs), so that
        no later step compiles, and (an adaptive core, ``calibrate``) price every slot bucket at its own costs;
        only on an idle core (nothing queued or running: ``RuntimeError`` else). With ``threads > 1`` every
        executable is first lowered (one after another, on this thread) and compiled ahead of time on a pool of
        ``threads`` threads (XLA's compile releases the GIL, so compiles can overlap), then each is called once,
        which finds it compiled. The prefills run on padding chunks only (they write nothing back), the decode for zero
        rounds: nothing observable changes.

        Args:
          progress: ``None``, or ``progress(done, total, what)``: ``done`` of ``total`` executables compiled so
            far, ``what`` names one (``"page tables"``, ``"last 4 chunks of 64"``, ``"prefill 1 chunks of 64"``,
            ``"decode 8 slots"``, ``"step outputs"``), called once at the end with ``done == total`` and
            ``"done"``: a caller's progress line. ``threads == 1``: called before each executable (``what`` the next one); else as each
            is lowered (``what`` that one) and as each compile ends (``what`` the one that ended).
          threads: the compile threads, an int >= 1 (1: each executable compiled by its call, one after
            another); default ``min(MAX_WARMUP_THREADS, os.cpu_count())`` on an accelerator and 1 on the CPU
            backend (XLA:CPU's compiles compete with each other for the same cores: little to gain).
          calibrate: an adaptive core's slot buckets that the engine has no ``round_costs`` for are calibrated
            (``Engine.calibrate``, its executables compiled ahead with the others) and priced at their own costs
            from then on, instead of at the slot count's: a round's cost grows with the batch differently per
            mode (a verify round costs ~1.2 plain steps alone and ~2 at 32 rows on SmolLM2), so the slot count's
            prices make speculation look dearer than it is at one row. ``None`` (default): on for an adaptive
            core; ``False``: off; ``True`` on a core that is not adaptive: ``ValueError``.
        """
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads: expected None or an int >= 1, got {threads!r}")
        if calibrate is not None and not isinstance(calibrate, bool):
            raise ValueError(f"calibrate: expected None or a bool, got {calibrate!r}")
        if calibrate and self.step_costs is None:
            raise ValueError("calibrate: only an adaptive engine's core prices its rounds (adaptive=True)")
        if self.has_unfinished():
            raise RuntimeError("warmup: the core has requests (warm it up before submitting any)")
        if threads is None:
            cpu = next(iter(self._r2p.devices())).platform == "cpu"
            threads = 1 if cpu else min(MAX_WARMUP_THREADS, os.cpu_count() or 1)
        report = progress or (lambda done, total, what: None)
        eng, zero = self.engine, jax.device_put(np.int32(0))
        tables, stop = self.scheduler.take_tables(), np.zeros((self.num_slots,), bool)

        def lower_refresh():
            fn, args = self._refresh_call(tables, stop)
            return fn.lower(self._state, self._r2p, *args)

        def lower_prefill(final, c, p):
            chunks = jax.device_put(self._chunk_arrays([], final, c, p))
            return eng.lower_prefill_slots(self._state, chunks, final=final)

        def lower_decode(b):
            return eng.lower_decode_slots(self._decode_state(b), bucket=b, rounds=zero)

        def decode(b):
            rounds, self._rounds = self._rounds, zero
            try:
                self._decode(b)
            finally:
                self._rounds = rounds

        # (what, lower, call) of every executable
        calls = [("page tables", lower_refresh, lambda: self._refresh(tables, stop))]
        calls += [(f"{'last' if final else 'prefill'} {c} chunks of {p}", functools.partial(lower_prefill, final, c, p),
                   functools.partial(self._prefill, [], final, c, p))
                  for final, buckets in [(False, self.prefill_chunk_buckets), (True, self.prefill_buckets)]
                  for c, p in buckets]
        calls += [(f"decode {b} slots", functools.partial(lower_decode, b), functools.partial(decode, b))
                  for b in self.slot_buckets]
        calls += [("step outputs", lambda: _step_outputs.lower(self._state), lambda: _step_outputs(self._state))]
        if self.step_costs is not None and calibrate is not False:
            calls += self._calibration_calls()
        total = len(calls)
        if threads > 1:
            self._compile_ahead([(what, lower) for what, lower, _ in calls], threads, report)
        for done, (what, _, call) in enumerate(calls):
            if threads == 1:
                report(done, total, what)
            call()  # threads > 1: compiled above, a cache hit
        report(total, total, "done")

    def _calibration_calls(self) -> list:
        """``warmup``'s ``(what, lower, call)`` for the slot buckets without calibrated costs: per bucket, the
        calibration's prefill (nothing to call: the calibration calls it) and its decode loop, whose call
        calibrates the bucket and prices its rounds at the result."""
        eng, lowered, calls = self.engine, {}, []

        def lower(b, i):  # both executables of a bucket lowered from one throw-away batch
            if b not in lowered:
                lowered[b] = eng.lower_calibration(min(b, eng.max_batch))
            return lowered[b][i]

        def run(b):
            eng.calibrate(min(b, eng.max_batch))  # stored at bucket b (a power of two up to num_slots)
            self._bucket_costs[b] = np.asarray(eng.round_costs[b], np.float64)

        for b in self.slot_buckets:
            if b not in eng.round_costs:
                calls += [(f"calibration prefill {b} slots", functools.partial(lower, b, 0), lambda: None),
                          (f"calibrate {b} slots", functools.partial(lower, b, 1), functools.partial(run, b))]
        return calls

    @staticmethod
    def _compile_ahead(lowerings: list, threads: int, report) -> None:
        """Lower each ``(what, lower)`` on this thread and compile it on a pool of ``threads`` threads as soon as
        it is lowered (the lowering of the next overlaps the compiles), reporting as ``warmup`` says."""
        total, names = len(lowerings), {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="jaxspec-warmup") as pool:
            try:
                for what, lower in lowerings:
                    report(sum(x.done() for x in names), total, what)
                    names[pool.submit(lower().compile)] = what
                for f in concurrent.futures.as_completed(names):
                    f.result()  # a compile's error, raised here
                    report(sum(x.done() for x in names), total, names[f])
            except BaseException:
                for f in names:
                    f.cancel()
                raise

    # ---------------------------------------------------------------- API
    def submit(self, prompt_ids, params: RequestParams | None = None, *, request_id: str | None = None
               ) -> RequestHandle:
        """Queue a request (``params``: ``RequestParams()`` when None); returns its ``RequestHandle``. Sampling
        other than greedy only in a ``sampling=True`` core. ``ValueError`` naming the field for a bad prompt or
        parameter, a request that overflows ``max_context`` or could never fit the page pool, or a
        ``request_id`` of an unfinished request. Without ``request_id`` it gets ``req-N``, the next ``N`` that no
        unfinished request holds."""
        params = RequestParams() if params is None else params
        if not isinstance(params, RequestParams):
            raise ValueError(f"params: expected a jaxspec.serving.RequestParams, got {type(params).__name__}")
        eng = self.engine
        arrs, mnt = check_prompts([prompt_ids], [params.max_new_tokens], max_batch=1, vocab_size=eng.vocab_size,
                                  max_context=self.max_context, verify_width=self.verify_width)
        sampling = check_sampling(1, eng.vocab_size, params.temperature, params.top_k, params.top_p, params.seed)
        if not self.sampling and (sampling[0][0] != 0 or sampling[1][0] != eng.vocab_size or sampling[2][0] != 1):
            raise ValueError("temperature / top_k / top_p: this ServingEngine is greedy (build it with sampling=True)")
        if any(i >= eng.vocab_size for i in params.stop_token_ids):
            raise ValueError(f"stop_token_ids: expected ids < vocab_size={eng.vocab_size}, got {params.stop_token_ids}")
        if params.min_tokens and eng.eos_id >= 0:
            raise ValueError(f"min_tokens: this engine stops at eos_id={eng.eos_id} on the device, which min_tokens "
                             f"cannot hold back (build the Engine without eos_id; stop at stop_token_ids)")
        if request_id is not None and (not isinstance(request_id, str) or request_id in self.requests):
            raise ValueError(f"request_id: expected a str that no unfinished request holds, got {request_id!r}")
        if request_id is None:
            while f"req-{self._next_id}" in self.requests:  # a caller chose it
                self._next_id += 1
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        req = Request(request_id, arrs[0], int(mnt[0]), sampling=sampling,
                      stop_token_ids=frozenset(params.stop_token_ids), min_tokens=params.min_tokens,
                      arrival_time=time.perf_counter())
        self.scheduler.add(req)  # ValueError when its worst case exceeds the pool
        self.requests[request_id] = req
        return RequestHandle(self, req)

    def cancel(self, request) -> None:
        """End a queued or running request now (its ``RequestHandle`` or the id of an unfinished request): its
        slot and pages are free when this returns (the row is marked done and its table row moved to the dummy
        page before any later round runs). Cancelling a finished request's handle does nothing; the id of a
        finished request is no longer known (``ValueError``, as for any unknown id). It reads nothing back, unless
        it leaves the core without requests and a step in flight: then it reads that step (``_drain_if_idle``)."""
        if isinstance(request, RequestHandle) and request._core is self:
            req = request._req
        else:
            req = self.requests.get(request) if isinstance(request, str) else None
        if req is None:
            raise ValueError(f"request: no unfinished request {request!r}")
        if req.status == "finished":
            return
        slot = self.scheduler.abort(req, time.perf_counter())
        del self.requests[req.request_id]
        if slot is not None:
            stop = np.zeros((self.num_slots,), bool)
            stop[slot] = True
            self._refresh(self.scheduler.take_tables(), stop)
        self._drain_if_idle()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One iteration (module docstring): the scheduler's plan, its page tables, the prefill calls, ``R``
        rounds over the slot bucket, then one read back and the scheduler's update: of the step before this one
        (``overlap``, when this one decodes), or of this one. Returns the outputs of the requests that produced
        tokens or ended in the step read."""
        t_start = time.perf_counter()
        plan = self.scheduler.schedule(t_start)
        t_plan = time.perf_counter()
        stop = None
        if plan.stop:
            stop = np.zeros((self.num_slots,), bool)
            stop[plan.stop] = True
        self._refresh(plan.tables, stop)
        for final in (False, True):
            chunks = [c for c in plan.chunks if c.final == final]
            if chunks:
                self._prefill(chunks, final)
        if plan.decode_rows:
            bucket = next_pow2(plan.decode_rows)
            self._decode(bucket)
            self._pending.append((plan, bucket, t_start, _step_outputs(self._state)))
        times = self.times
        times.plan += t_plan - t_start
        times.dispatch += time.perf_counter() - t_plan
        keep = 1 if self.overlap and plan.decode_rows else 0  # this step's own read waits for the next step
        outputs = []
        while len(self._pending) > keep:
            outputs += self._read(*self._pending.popleft())
        self._drain_if_idle()
        return outputs

    def _drain_if_idle(self) -> None:
        """With no request left, read the step still in flight (it holds the plan of requests that have ended:
        the core keeps nothing of a request it has served); a core with requests leaves it to the next step."""
        while self._pending and not self.scheduler.has_unfinished():
            self._read(*self._pending.popleft())

    def _read(self, plan, bucket: int, t_start: float, arrays) -> list[RequestOutput]:
        """The one host read of a dispatched step and the scheduler's update; an adaptive core's prices learn
        from the step's wall time (from its dispatch, or from the read before it when the device was still busy
        with that one)."""
        t_wait = time.perf_counter()
        read = jax.device_get(arrays)
        t_read = time.perf_counter()
        if self.step_costs is not None:  # the step's wall time prices the policy's next rounds
            ran = read[-1] - self._mode_rounds
            # StepCosts subtracts the slot count's in-loop costs; this step's rounds cost its bucket's
            extra = float(ran @ (self._bucket_costs[bucket] - self.step_costs.base))
            self.step_costs.observe(t_read - max(t_start, self._last_read) - extra, ran)
            self._mode_rounds = read[-1].astype(np.int64)
        self._last_read = t_read
        outputs = self.scheduler.update(plan, StepResult(*read[:-1]), t_read)
        for out in outputs:
            if out.finished:
                del self.requests[out.request_id]  # its handle (and the step's output) carry what is left of it
        times = self.times
        times.update += time.perf_counter() - t_read
        times.device += t_read - t_wait
        times.steps += 1
        return outputs

    def generate(self, prompts, params: RequestParams | None = None) -> list[list[int]]:
        """Blocking: submit every prompt with ``params`` (one ``RequestParams`` for all, or one per prompt; any
        number of prompts: they wait for slots and pages), step until all are done, return each one's tokens."""
        many = isinstance(params, (list, tuple))
        if many and len(params) != len(prompts):
            raise ValueError(f"params: expected one RequestParams or one per prompt ({len(prompts)}), got {len(params)}")
        handles = [self.submit(p, params[i] if many else params) for i, p in enumerate(prompts)]
        self.run_until_done()
        return [h.output for h in handles]

    def stats(self) -> ServingStats:
        """The core's counters (``ServingStats``), from the last step's read (no device sync)."""
        sched = self.scheduler
        return ServingStats(
            running=len(sched.running), waiting=len(sched.waiting),
            pages_in_use=self.pool.capacity - self.pool.num_free, pages_total=self.pool.capacity,
            num_slots=self.num_slots, generated_tokens=sched.generated, rounds=sched.rounds,
            accepted_tokens=sched.accepted,
            mean_accept_length=sched.accepted / sched.rounds if sched.rounds else 0.0,
            mode_rounds=None if self._mode_rounds is None else tuple(int(x) for x in self._mode_rounds))

    def run_until_done(self, max_steps: int = 1_000_000) -> None:
        """``step`` until no request is waiting or running."""
        for _ in range(max_steps):
            if not self.has_unfinished():
                return
            self.step()
        raise RuntimeError(f"max_steps={max_steps} steps did not finish every request")
