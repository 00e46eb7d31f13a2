"""Continuous batching over an ``Engine``: requests join a running batch, decode, and leave, nothing recompiled.

``ServingEngine(engine, rounds_per_step=R)``: ``submit`` queues a request, ``step`` schedules prefill chunks under
a token and a page budget, refreshes the page tables, prefills the chunks into their slots, decodes up to ``R``
rounds over the occupied slot bucket and reads the new tokens back once; ``cancel`` frees a request's slot and
pages at once. How each part works (scheduling, page policy, chunk boundaries, buckets, sampling, stopping):
``docs/serving.md``, "How the core works".
"""

import collections
import dataclasses
import functools
import heapq
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec._validate import checks_enabled
from jaxspec.engine import Engine
from jaxspec.engine.checks import check_prompts, check_sampling
from jaxspec.engine.compiled import functionalize_checks
from jaxspec.engine.memory import allocate_state, prompt_bucket
from jaxspec.engine.policy import init_policy_state
from jaxspec.engine.state import DecodeState, EngineOptions, SamplingParams
from jaxspec.engine.step import decode_loop, draft_spec_max_accept, prefill, prefill_chunk, prefill_lookahead
from jaxspec.kernels import next_pow2
from jaxspec.protocols import PagedKVCache
from jaxspec.serving.costs import StepCosts
from jaxspec.serving.pages import PagePool, pack_rows, refresh_fn
from jaxspec.serving.request import RequestHandle, RequestOutput, RequestParams, ServingStats

DEFAULT_MAX_PREFILL_TOKENS = 256  # prompt tokens prefilled per step (ServingEngine(max_prefill_tokens=))


@dataclasses.dataclass(eq=False)  # identity: a request is itself, whatever its fields
class Request:
    """One request: its prompt, limit, and what it has generated so far (host side).

    status: ``"waiting"`` (queued), ``"running"`` (in slot ``slot``: being prefilled, then decoding),
    ``"finished"``. finish_reason (when finished): ``"stop"`` (EOS or one of its stop ids, kept as the last
    token), ``"length"`` (``max_new_tokens``) or ``"abort"``. prefilled: the prompt tokens whose K/V is written
    (the prompt's length once it decodes). pages: the KV pages it holds (empty unless running)."""

    request_id: str
    prompt: np.ndarray
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

    @property
    def decoding(self) -> bool:
        """Running with its whole prompt prefilled."""
        return self.status == "running" and self.prefilled == self.prompt.size


class Chunk:
    """One scheduled prefill chunk: ``length`` prompt tokens of ``req`` from position ``start``; ``final`` when
    it ends the prompt."""

    __slots__ = ("req", "start", "length")

    def __init__(self, req: Request, start: int, length: int):
        self.req, self.start, self.length = req, start, length

    @property
    def final(self) -> bool:
        return self.start + self.length == self.req.prompt.size

    def __repr__(self) -> str:
        return f"Chunk({self.req.request_id!r}, start={self.start}, length={self.length})"


def chunk_length(remaining: int, budget: int, lookahead: int) -> int:
    """Prompt tokens a step gives a request with ``remaining`` tokens left when ``budget`` tokens of the step's
    prefill budget are left: all of them if they fit, else the budget, but never leaving fewer than
    ``lookahead`` tokens to the last chunk (0: none this step)."""
    if remaining <= budget:
        return remaining
    return max(0, min(budget, remaining - lookahead))


class Scheduler:
    """FCFS admission under a page budget and a prefill token budget (host only; no device state).

    ``can_admit(req)``: a slot is free and ``pool.num_free - promised >= req.worst_pages``, with ``promised``
    the pages running requests may still ask for (their worst case less what they hold). Slots are handed
    out lowest first (``bucket()``: the slot bucket the decode runs on)."""

    def __init__(self, num_slots: int, pool: PagePool):
        self.waiting: collections.deque[Request] = collections.deque()
        self.free_slots = list(range(num_slots))  # a heap: the lowest free slot first
        self.running: dict[int, Request] = {}  # slot -> request
        self.prefilling: list[Request] = []  # running requests part-way through their prompt, admission order
        self.pool = pool

    def promised(self) -> int:
        return sum(r.worst_pages - len(r.pages) for r in self.running.values())

    def can_admit(self, req: Request) -> bool:
        return bool(self.free_slots) and self.pool.num_free - self.promised() >= req.worst_pages

    def schedule(self, budget: int, lookahead: int) -> list[Chunk]:
        """The step's prefill chunks, at most ``budget`` prompt tokens in all (``chunk_length``): the
        part-prefilled requests first, then waiting requests in order while the head fits (each admitted: a
        slot, status ``"running"``; pages by the caller). Every chunk's ``req.prefilled`` is advanced."""
        out = []
        for req in list(self.prefilling):
            n = chunk_length(req.prompt.size - req.prefilled, budget, lookahead)
            if n == 0:
                return out
            out.append(Chunk(req, req.prefilled, n))
            budget -= n
        while self.waiting and self.can_admit(self.waiting[0]):
            n = chunk_length(self.waiting[0].prompt.size, budget, lookahead)
            if n == 0:
                break
            req = self.waiting.popleft()
            req.slot, req.status, req.prefilled = heapq.heappop(self.free_slots), "running", 0
            self.running[req.slot] = req
            self.prefilling.append(req)
            out.append(Chunk(req, 0, n))
            budget -= n
        for c in out:
            c.req.prefilled += c.length
            if c.final:
                self.prefilling.remove(c.req)
        return out

    def bucket(self) -> int:
        """``next_pow2(highest occupied slot + 1)`` (0 when no slot is occupied)."""
        return next_pow2(max(self.running) + 1) if self.running else 0

    def release(self, req: Request) -> None:
        """Give ``req``'s slot and pages back at once."""
        self.pool.free(req.pages)
        req.pages = []
        del self.running[req.slot]
        if req in self.prefilling:
            self.prefilling.remove(req)
        heapq.heappush(self.free_slots, req.slot)


def _rows_view(state: DecodeState, start, size: int):
    """A view of rows ``[start, start + size)`` of ``state`` (of every per-row leaf and of each cache's token
    table; ``start`` traced or static; the KV pools whole; no adaptive policy: it belongs to the batch)."""
    state = dataclasses.replace(state, policy=None)
    rows = lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, 0)  # noqa: E731

    def one(x):
        if isinstance(x, PagedKVCache):
            return PagedKVCache(x.k, x.v, rows(x.req_to_token))
        return rows(x) if x.ndim else x

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, PagedKVCache))


def _write_rows(state: DecodeState, sub: DecodeState, start, policy):
    """``state`` with the rows from ``start`` taken from ``sub`` (a ``_rows_view``), the KV pools from ``sub``
    and the adaptive policy ``policy``."""
    state = dataclasses.replace(state, policy=None)
    sub = dataclasses.replace(sub, policy=None)

    def one(x, y):
        if isinstance(x, PagedKVCache):
            return PagedKVCache(y.k, y.v, x.req_to_token)
        return jax.lax.dynamic_update_slice_in_dim(x, y, start, 0) if x.ndim else x

    out = jax.tree.map(one, state, sub, is_leaf=lambda x: isinstance(x, PagedKVCache))
    return dataclasses.replace(out, policy=policy)


@functools.lru_cache(maxsize=64)
def _chunk_fn(graphdef, treedef, opts: EngineOptions, checks: bool, final: bool):
    """Jitted ``chunk(params, state, tokens (1, P), length (1,), prefix (1,), following (1, X), slot, max_new,
    sampling)``: one prefill chunk of one request into batch slot ``slot`` (state donated), its committed
    prefix ``prefix`` tokens: ``final``, the engine's ``prefill`` (its first token sampled with
    ``sampling = (temperature, top_k, top_p, seed)``, each of shape ``(1,)``; ``following`` unused), else
    ``prefill_chunk`` (``following``: the prompt tokens after the chunk; the row stays done). Shared by every
    serving core with equal keys."""

    def chunk(params, state, tokens, length, prefix, following, slot, max_new, sampling):
        target, drafter = nnx.merge(graphdef, jax.tree.unflatten(treedef, params))
        sub = _rows_view(state, slot, 1)
        zero = jnp.zeros((1,), jnp.int32)
        sub = dataclasses.replace(
            sub, seq_lens=prefix, num_generated=zero, done=jnp.full((1,), not final), max_new_tokens=max_new[None],
            num_rounds=zero, num_accepted=zero, out_tokens=jnp.zeros_like(sub.out_tokens),
            sampling=SamplingParams(*sampling))
        if final:
            sub = prefill(target, drafter, opts, sub, tokens, length)
        else:
            sub = prefill_chunk(target, drafter, opts, sub, tokens, length, following)
        return _write_rows(state, sub, slot, state.policy)

    return jax.jit(functionalize_checks(chunk, checks), donate_argnums=(1,))


@functools.lru_cache(maxsize=64)
def _decode_fn(graphdef, treedef, opts: EngineOptions, checks: bool, bucket: int):
    """Jitted ``decode(params, state, rounds, cost)``: the engine's ``decode_loop`` (fixed shape, or adaptive: one
    segment per mode) over rows ``[0, bucket)`` of the state for at most ``rounds`` rounds (traced ``i32[]``: one
    executable for every ``R``), left as soon as a request that was running at the start has finished, or
    every row is done (state donated). ``cost`` (adaptive engines, ``f32[M]``): the policy's round prices at
    this bucket for the call (the learned acceptance is the batch's, kept across buckets); else ``None``."""

    def decode(params, state, rounds, cost):
        target, drafter = nnx.merge(graphdef, jax.tree.unflatten(treedef, params))
        whole = bucket == state.done.shape[0]
        sub = state if whole else _rows_view(state, 0, bucket)
        if state.policy is not None:
            sub = dataclasses.replace(sub, policy=dataclasses.replace(state.policy, round_cost=cost))
        running = ~sub.done
        out = decode_loop(target, drafter, opts, sub, max_rounds=rounds, until=lambda st: jnp.any(running & st.done))
        return out if whole else _write_rows(state, out, 0, out.policy)

    return jax.jit(functionalize_checks(decode, checks), donate_argnums=(1,))


def prompt_buckets(max_width: int, max_context: int) -> list[int]:
    """The padded widths ``prompt_bucket`` gives chunks of ``1 .. max_width`` tokens."""
    out, n = [], 1
    while True:
        out.append(prompt_bucket(min(n, max_width), max_context))
        if n >= max_width:
            return sorted(set(out))
        n *= 2


class ServingEngine:
    """Continuous batching over ``engine`` (module docstring: the step, the page policy, the one host read).

    Args:
      engine: an ``Engine`` (plain, or speculative with one draft shape). Its ``max_batch`` (rounded up to a
        power of two) is the number of slots, its ``max_context`` the tokens per slot, its ``num_pages`` /
        ``page_size`` the pool; its round (``decode_step``) and ``prefill`` are the ones this core runs.
      rounds_per_step: ``R``, the most decode rounds per ``step`` (a value of the decode loop: any ``R`` shares
        one executable); the loop leaves as soon as a running request finishes.
      sampling: ``False`` (default): greedy requests only, the greedy executables. ``True``: the sampling
        executables; each request brings its own sampling parameters (``RequestParams``).
      max_prefill_tokens: ``T``, the most prompt tokens one step prefills, over all its requests (default
        ``DEFAULT_MAX_PREFILL_TOKENS`` = 256); a longer prompt is prefilled in chunks over several steps. Smaller
        keeps the running requests' inter-token latency even when requests arrive in bursts or with long
        prompts, larger gives a new request its first token in fewer steps. At least the drafter's
        ``prefill_lookahead`` (1 for plain decoding).

    ``submit(prompt_ids, RequestParams(...))`` queues a request and returns its ``RequestHandle`` (iterate it for
    its tokens); ``step()`` runs one iteration and returns a ``RequestOutput`` per request that produced tokens
    or ended; ``cancel(handle)`` ends a request at once (queued or running: its slot and pages are free when it
    returns); ``generate(prompts, params)`` is the blocking form for a list; ``has_unfinished()``; ``stats()``;
    ``warmup()`` compiles every executable a step can run; ``requests[request_id]`` holds each unfinished request
    (``output`` grows as it decodes): a request leaves it when it finishes (the ``step`` that returns its last
    output, or ``cancel``), so the core keeps nothing of the requests it has served; its ``RequestHandle`` still
    reads it. One thread owns a core.
    """

    def __init__(self, engine: Engine, *, rounds_per_step: int = 1, sampling: bool = False,
                 max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS):
        if not isinstance(engine, Engine):
            raise ValueError(f"engine: expected a jaxspec.engine.Engine, got {type(engine).__name__}")
        if engine.simulate_accept is not None:
            raise ValueError("engine: simulated acceptance is not served (it is a benchmark of the engine alone)")
        if not isinstance(rounds_per_step, int) or isinstance(rounds_per_step, bool) or rounds_per_step < 1:
            raise ValueError(f"rounds_per_step: expected an int >= 1, got {rounds_per_step!r}")
        if not isinstance(sampling, bool):
            raise ValueError(f"sampling: expected a bool, got {sampling!r}")
        self.lookahead = prefill_lookahead(engine.drafter, engine.opts)
        t = max_prefill_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < self.lookahead:
            raise ValueError(f"max_prefill_tokens: expected an int >= {self.lookahead} (the prompt tokens past a chunk "
                             f"the drafter's extend reads), got {t!r}")
        self.sampling = sampling
        self.engine = engine
        self.rounds_per_step = rounds_per_step
        self.max_prefill_tokens = t
        self.num_slots = b = next_pow2(engine.max_batch)
        self.max_context = w = engine.max_context
        self.page_size = g = engine.page_size
        self.max_pages = math.ceil(w / g)
        self.verify_width = engine.opts.verify_width
        self.slot_buckets = [1 << i for i in range(b.bit_length())]  # 1, 2, 4, .. B
        self.chunk_buckets = prompt_buckets(min(t, w), w)
        self.pool = PagePool(engine.num_pages)
        self.scheduler = Scheduler(b, self.pool)
        self.requests: dict[str, Request] = {}
        self._next_id = 0
        self._dirty: dict[int, tuple[int, list[int]]] = {}  # slot -> (first column, pages): the next refresh
        self.step_costs: StepCosts | None = None  # adaptive engines: the policy's round prices (costs.py)
        self._bucket_costs: dict[int, np.ndarray] = {}  # adaptive: slot bucket -> in-loop seconds per round per mode
        self._state, self._r2p = self._fresh_state()
        self._mode_rounds = None if self.step_costs is None else np.zeros_like(self.step_costs.base, np.int64)
        self._seq_lens = np.zeros((self.num_slots,), np.int32)  # committed lengths: the last read, or the host's
        self._generated = self._rounds = self._accepted = 0  # stats()

    # ---------------------------------------------------------------- device state
    def _fresh_state(self):
        eng, b, w = self.engine, self.num_slots, self.max_context
        r2t = np.zeros((b, w), np.int32)  # every slot on the dummy page
        num_slots = eng.num_pages * self.page_size
        tcache = eng.target.make_cache(r2t, num_slots)
        draft = tuple(eng.drafter.init_state(spec, r2t, num_slots) for spec in eng.opts.specs)
        sampling = check_sampling(b, eng.vocab_size, 0.0, None, 1.0, 0)
        policy = None
        if eng.opts.adaptive is not None:  # one policy for the batch, learning across steps (a warm start)
            cost = eng.round_costs[b] if b in eng.round_costs else eng.calibrate(min(b, eng.max_batch))
            self.step_costs = StepCosts(cost)
            # a smaller slot bucket's rounds at its own calibrated costs where the engine has them, else the
            # slot count's (its mode ratios; Engine.calibrate(bucket) before building the core prices it exactly)
            self._bucket_costs = {k: np.asarray(eng.round_costs.get(k, cost), np.float64) for k in self.slot_buckets}
            policy = init_policy_state(cost, draft_spec_max_accept(eng.opts.specs))
        state = allocate_state(tcache, draft, num_requests=b, max_new_tokens=np.full((b,), next_pow2(w), np.int32),
                               eos_id=eng.eos_id, sampling=sampling, vocab_size=eng.vocab_size, policy=policy,
                               simulate=None)
        state = dataclasses.replace(state, done=jnp.ones((b,), bool), max_new_tokens=jnp.zeros((b,), jnp.int32),
                                    all_greedy=not self.sampling)
        for path, leaf in jax.tree_util.tree_flatten_with_path(  # the policy belongs to the batch
                dataclasses.replace(state, policy=None), is_leaf=lambda x: isinstance(x, PagedKVCache))[0]:
            if not isinstance(leaf, PagedKVCache) and leaf.ndim and leaf.shape[0] != b:
                raise ValueError(f"engine: the decode state's leaf {jax.tree_util.keystr(path)} has shape "
                                 f"{leaf.shape}; a slot-indexed leaf (leading dimension {b}) was expected")
        return state, jnp.zeros((b, self.max_pages), jnp.int32)

    def _call(self, fn, *args):
        if not checks_enabled():
            return fn(*args)
        err, out = fn(*args)
        msg = err.get()
        if msg is not None:
            raise ValueError(f"JAXSPEC_CHECKS: a check failed in ServingEngine: {msg}")
        return out

    def _refresh(self, stop: np.ndarray | None = None) -> None:
        """One jitted table refresh of every pending row change (and ``stop`` rows marked done)."""
        packed = pack_rows(self._dirty, num_slots=self.num_slots, max_pages=self.max_pages)
        self._dirty = {}
        if packed is None and stop is None:
            return
        if packed is None:  # nothing to write: one padding entry (0 pages)
            packed = tuple(np.zeros((n,), np.int32) for n in (self.num_slots, self.num_slots * self.max_pages,
                                                              self.num_slots, self.num_slots))
        stop = np.zeros((self.num_slots,), bool) if stop is None else stop
        eng = self.engine
        fn = refresh_fn(self.page_size, self.max_context, eng.opts.implementation, eng.opts.interpret,
                        checks_enabled())
        self._state, self._r2p = self._call(fn, self._state, self._r2p, *(jax.device_put(x) for x in packed),
                                            jax.device_put(stop))

    def _grow(self, req: Request, tokens: int) -> None:
        """Assign ``req`` the pages covering its first ``tokens`` positions (capped at ``W``)."""
        need = math.ceil(min(self.max_context, tokens) / self.page_size)
        new = need - len(req.pages)
        if new <= 0:
            return
        if need > req.worst_pages:
            raise RuntimeError(f"request {req.request_id}: {need} pages exceed its budget of {req.worst_pages}")
        pages = self.pool.allocate(new)
        start, old = self._dirty.get(req.slot, (len(req.pages), []))
        self._dirty[req.slot] = (start, old + pages)
        req.pages = req.pages + pages

    def _prefill(self, chunk: Chunk) -> None:
        """Dispatch one chunk's prefill into its request's slot (its pages already in the table)."""
        req, start, n = chunk.req, chunk.start, chunk.length
        eng = self.engine
        fn = _chunk_fn(eng.graphdef, eng.treedef, eng.opts, checks_enabled(), chunk.final)
        tokens = np.zeros((1, prompt_bucket(n, self.max_context)), np.int32)
        tokens[0, :n] = req.prompt[start: start + n]
        following = np.zeros((1, self.lookahead), np.int32)
        nxt = req.prompt[start + n: start + n + self.lookahead]  # the whole lookahead unless final
        following[0, : nxt.size] = nxt
        self._state = self._call(fn, eng.params, self._state, *self._chunk_args(
            tokens, n, start, following, req.slot, req.max_new_tokens, req.sampling))

    @staticmethod
    def _chunk_args(tokens, n, start, following, slot, max_new, sampling):
        # explicit transfers (allowed under jax.transfer_guard("disallow"))
        return (jax.device_put(tokens), jax.device_put(np.array([n], np.int32)),
                jax.device_put(np.array([start], np.int32)), jax.device_put(following),
                jax.device_put(np.int32(slot)), jax.device_put(np.int32(max_new)),
                tuple(jax.device_put(x) for x in sampling))

    def _decode(self, bucket: int) -> None:
        """Dispatch up to ``R`` rounds of the decode loop over the slot bucket ``bucket``."""
        eng = self.engine
        fn = _decode_fn(eng.graphdef, eng.treedef, eng.opts, checks_enabled(), bucket)
        cost = None
        if self.step_costs is not None:  # the bucket's in-loop costs plus the step's own overhead per round
            cost = jax.device_put((self._bucket_costs[bucket] + self.step_costs.overhead).astype(np.float32))
        self._state = self._call(fn, eng.params, self._state, jax.device_put(np.int32(self.rounds_per_step)), cost)

    def warmup(self, progress=None) -> None:
        """Compile every executable a step can run (the table refresh, both prefills of every chunk bucket, the
        decode of every slot bucket), so that no later step compiles; only on an idle core (nothing queued or
        running: ``RuntimeError`` else). It runs them on a free slot whose table row is on the dummy page, and the
        decode for zero rounds: nothing observable changes.

        Args:
          progress: ``None``, or ``progress(done, total, what)`` called before each executable (``done`` of
            ``total`` compiled so far, ``what`` names the next one: ``"page tables"``, ``"prefill chunk 64"``,
            ...) and once at the end with ``done == total``: a caller's progress line.
        """
        if self.has_unfinished():
            raise RuntimeError("warmup: the core has requests (warm it up before submitting any)")
        report = progress or (lambda done, total, what: None)
        total = 1 + 2 * len(self.chunk_buckets) + len(self.slot_buckets)
        report(0, total, "page tables")
        self._refresh(np.zeros((self.num_slots,), bool))  # the pending row resets too: every row on the dummy page
        done = 1
        eng = self.engine
        sampling = check_sampling(1, eng.vocab_size, 0.0, None, 1.0, 0)
        following = np.zeros((1, self.lookahead), np.int32)
        for p in self.chunk_buckets:
            for final in (False, True):  # a final chunk of max_new 1 leaves its row done
                report(done, total, f"{'last' if final else 'prefill'} chunk {p}")
                fn = _chunk_fn(eng.graphdef, eng.treedef, eng.opts, checks_enabled(), final)
                self._state = self._call(fn, eng.params, self._state, *self._chunk_args(
                    np.zeros((1, p), np.int32), 1, 0, following, 0, 1, sampling))
                done += 1
        rounds = self.rounds_per_step
        try:
            self.rounds_per_step = 0
            for b in self.slot_buckets:
                report(done, total, f"decode {b} slots")
                self._decode(b)
                done += 1
        finally:
            self.rounds_per_step = rounds
        report(done, total, "done")

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
        prompt, mnt = arrs[0], int(mnt[0])
        worst = math.ceil(min(self.max_context, prompt.size + mnt + self.rounds_per_step * self.verify_width)
                          / self.page_size)
        if worst > self.pool.capacity:
            raise ValueError(f"prompt_ids: the request may need {worst} KV pages of {self.page_size} tokens, the pool "
                             f"holds {self.pool.capacity} (num_pages={self.pool.num_pages}, page 0 reserved)")
        req = Request(request_id, prompt, mnt, worst_pages=worst, sampling=sampling,
                      stop_token_ids=frozenset(params.stop_token_ids), min_tokens=params.min_tokens)
        self.requests[request_id] = req
        self.scheduler.waiting.append(req)
        return RequestHandle(self, req)

    def cancel(self, request) -> None:
        """End a queued or running request now (its ``RequestHandle`` or the id of an unfinished request): its
        slot and pages are free when this returns (the row is marked done and its table row moved to the dummy
        page before any later round runs). Cancelling a finished request's handle does nothing; the id of a
        finished request is no longer known (``ValueError``, as for any unknown id)."""
        if isinstance(request, RequestHandle) and request._core is self:
            req = request._req
        else:
            req = self.requests.get(request) if isinstance(request, str) else None
        if req is None:
            raise ValueError(f"request: no unfinished request {request!r}")
        if req.status == "finished":
            return
        if req.status == "waiting":
            self.scheduler.waiting.remove(req)
            req.status, req.finish_reason = "finished", "abort"
            del self.requests[req.request_id]
            return
        slot = req.slot
        self._finish(req, "abort")
        stop = np.zeros((self.num_slots,), bool)
        stop[slot] = True
        self._refresh(stop)

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.release(req)
        self._dirty[req.slot] = (0, [0] * self.max_pages)  # the whole row back to the dummy page
        req.status, req.finish_reason, req.slot = "finished", reason, None
        del self.requests[req.request_id]  # its handle (and the step's output) carry what is left of it

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> list[RequestOutput]:
        """One iteration (module docstring): schedule the prefill budget, assign pages, prefill the chunks, run
        ``R`` rounds over the slot bucket, read back once, retire. Returns the outputs of the requests that
        produced tokens or ended."""
        t_start = time.perf_counter()
        r, n = self.rounds_per_step, self.verify_width
        chunks = self.scheduler.schedule(self.max_prefill_tokens, self.lookahead)
        for c in chunks:
            req = c.req
            if c.start == 0:
                self._dirty.pop(req.slot, None)  # a retired row's reset is superseded by the new row
            self._grow(req, c.start + c.length + (r * n if c.final else 0))
            if c.start == 0:
                self._dirty[req.slot] = (0, req.pages + [0] * (self.max_pages - len(req.pages)))
            self._seq_lens[req.slot] = c.start + c.length
        scheduled = {id(c.req) for c in chunks}
        for req in self.scheduler.running.values():
            if req.decoding and id(req) not in scheduled:
                self._grow(req, self._seq_lens[req.slot] + r * n)
        self._refresh()
        for c in chunks:
            self._prefill(c)
        if not any(req.decoding for req in self.scheduler.running.values()):
            return []  # only non-final chunks ran: nothing to decode, nothing to read
        bucket = self.scheduler.bucket()
        self._decode(bucket)
        st = self._state
        modes = None if st.policy is None else st.policy.mode_rounds
        done, num, seq, out, rounds, acc, modes = jax.device_get((st.done, st.num_generated, st.seq_lens,
                                                                  st.out_tokens, st.num_rounds, st.num_accepted, modes))
        self._seq_lens = np.array(seq)  # writable: the host advances it for prefill chunks
        if self.step_costs is not None:  # the step's wall time prices the policy's next rounds
            ran = modes - self._mode_rounds
            # StepCosts subtracts the slot count's in-loop costs; this step's rounds cost its bucket's
            extra = float(ran @ (self._bucket_costs[bucket] - self.step_costs.base))
            self.step_costs.observe(time.perf_counter() - t_start - extra, ran)
            self._mode_rounds = modes.astype(np.int64)
            self._state = dataclasses.replace(st, policy=dataclasses.replace(
                st.policy, round_cost=jax.device_put(self.step_costs.round_cost())))
        outputs = []
        for slot, req in list(self.scheduler.running.items()):
            if not req.decoding:
                continue
            new = out[slot, len(req.output): num[slot]].tolist()
            self._rounds += int(rounds[slot]) - req.rounds
            self._accepted += int(acc[slot]) - req.accepted
            req.rounds, req.accepted = int(rounds[slot]), int(acc[slot])
            first = max(0, req.min_tokens - len(req.output))  # stop ids count from output position min_tokens
            stop = next((k for k, t in enumerate(new) if k >= first and t in req.stop_token_ids), None)
            if stop is not None:
                new = new[: stop + 1]
            req.output.extend(new)
            self._generated += len(new)
            finished = bool(done[slot]) or stop is not None
            if finished:
                eos = self.engine.eos_id
                hit = stop is not None or (eos >= 0 and req.output and req.output[-1] == eos)
                self._finish(req, "stop" if hit else "length")
            if new or finished:
                outputs.append(RequestOutput(req.request_id, new, finished, req.finish_reason))
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
        return ServingStats(
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
            pages_in_use=self.pool.capacity - self.pool.num_free, pages_total=self.pool.capacity,
            num_slots=self.num_slots, generated_tokens=self._generated, rounds=self._rounds,
            accepted_tokens=self._accepted, mean_accept_length=self._accepted / self._rounds if self._rounds else 0.0)

    def run_until_done(self, max_steps: int = 1_000_000) -> None:
        """``step`` until no request is waiting or running."""
        for _ in range(max_steps):
            if not self.has_unfinished():
                return
            self.step()
        raise RuntimeError(f"max_steps={max_steps} steps did not finish every request")
