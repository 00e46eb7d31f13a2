"""Continuous batching over an ``Engine``: requests join a running batch, decode, and leave, nothing recompiled.

``ServingEngine`` holds a fixed number of batch slots (``B`` = the engine's ``max_batch`` rounded up to a power
of two), one ``DecodeState`` of that shape over the engine's KV pool (target and drafter), and a host
``Scheduler``. One ``step()``:

1. **retire / admit** (host): the scheduler admits waiting requests first come, first served into free slots
   while the page budget allows (below);
2. **pages** (one jitted call, ``pages.refresh_tables``): every admitted request gets the pages its prompt and
   the step's rounds can reach (``prompt + R * N`` tokens, ``N`` the verify width), every running request the
   pages its next ``R`` rounds can reach (``seq_len + R * N``), written into the page table with TokenSpeed's
   ``update_req_to_page`` and turned into the token table with ``compute_out_cache_loc_uniform``;
3. **prefill** of each admitted request into its slot (``insert``: the engine's ``prefill`` on a one-row view
   of the state, written back into the slot; JetStream's ``prefill`` + ``insert``), the other slots untouched;
4. **decode**: up to ``R`` rounds (``rounds_per_step``) of the engine's own ``engine.step.decode_loop`` (one
   device ``while_loop``; ``plain_step``, ``spec_step`` or the adaptive segments over all slots; empty and
   finished slots are done rows, frozen, their table rows on the dummy page as the engine's padding rows), left
   as soon as a running request finishes (its slot can then be given to a waiting one);
5. **one host read** (``jax.device_get`` of ``done``, ``num_generated``, ``seq_lens`` and ``out_tokens``): the
   step's new tokens of every request, and those that finished (EOS / ``max_new_tokens``) are retired: slot
   and pages freed at once (their table row goes back to the dummy page in the next refresh).

That read is the only host sync of a step (with ``JAXSPEC_CHECKS`` on, the check flags are read as well);
``cancel`` dispatches one table refresh and syncs nothing.

Shapes are fixed at construction (``B`` slots, ``W = max_context`` per slot, the pool, an output buffer of
``next_pow2(W)`` tokens), so requests joining and leaving never recompile: the decode loop and the table
refresh are one executable each, the prefill one per prompt bucket (powers of two, as ``Engine``'s).

Page policy (SGLang's scheduler without retraction): pages are assigned as sequences grow, but a request is
admitted only when the pages not yet handed out, less those promised to running requests, cover its worst
case (``ceil(min(W, prompt + max_new_tokens + R * N) / G)`` pages); otherwise it WAITS at the head of the
queue (FCFS: later requests do not overtake it). So a running request never runs out of pages and nothing is
preempted. A request whose worst case exceeds the whole pool is refused by ``submit`` (``ValueError``).

Plain, speculative (chain or tree, any ``Drafter``: MTP, EAGLE-3) or adaptive decoding (the engine's
``decode_loop``: an adaptive engine's policy is one for the batch, its round costs measured by
``Engine.calibrate`` at the slot count plus the step's own overhead per round, ``costs.StepCosts``, and it keeps
learning from step to step), greedy by default;
``sampling=True`` runs the engine's sampling executable, every request with its own temperature / top-k /
top-p / seed (its coins depend on its seed and its own round counter only, so it draws what it would draw
alone; temperature-0 requests stay greedy). The stop token is the engine's ``eos_id`` (one for every
request). Simulated acceptance is refused at construction.
"""

import collections
import dataclasses
import functools
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
from jaxspec.engine.step import decode_loop, draft_spec_max_accept, prefill
from jaxspec.kernels._dispatch import next_pow2
from jaxspec.protocols import PagedKVCache
from jaxspec.serving.costs import StepCosts
from jaxspec.serving.pages import PagePool, pack_rows, refresh_fn
from jaxspec.serving.request import RequestHandle, RequestOutput, RequestParams, ServingStats


@dataclasses.dataclass(eq=False)  # identity: a request is itself, whatever its fields
class Request:
    """One request: its prompt, limit, and what it has generated so far (host side).

    status: ``"waiting"`` (queued), ``"running"`` (in slot ``slot``), ``"finished"``. finish_reason (when
    finished): ``"stop"`` (EOS or one of its stop ids, kept as the last token), ``"length"`` (``max_new_tokens``) or ``"abort"``.
    pages: the KV pages it holds (empty unless running)."""

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
    rounds: int = 0  # verify rounds it was active in, and the tokens they accepted (the device's last counts)
    accepted: int = 0


class Scheduler:
    """FCFS admission under a page budget (host only; no device state).

    ``can_admit(req)``: a slot is free and ``pool.num_free - promised >= req.worst_pages``, with ``promised``
    the pages running requests may still ask for (their worst case less what they hold)."""

    def __init__(self, num_slots: int, pool: PagePool):
        self.waiting: collections.deque[Request] = collections.deque()
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.running: dict[int, Request] = {}  # slot -> request
        self.pool = pool

    def promised(self) -> int:
        return sum(r.worst_pages - len(r.pages) for r in self.running.values())

    def can_admit(self, req: Request) -> bool:
        return bool(self.free_slots) and self.pool.num_free - self.promised() >= req.worst_pages

    def admit(self) -> list[Request]:
        """Pop waiting requests in order while the head fits; each gets a slot (pages: by the caller)."""
        out = []
        while self.waiting and self.can_admit(self.waiting[0]):
            req = self.waiting.popleft()
            req.slot, req.status = self.free_slots.pop(), "running"
            self.running[req.slot] = req
            out.append(req)
        return out

    def release(self, req: Request) -> None:
        """Give ``req``'s slot and pages back at once."""
        self.pool.free(req.pages)
        req.pages = []
        del self.running[req.slot]
        self.free_slots.append(req.slot)


def _rows_view(state: DecodeState, slot):
    """A one-row view of ``state`` (row ``slot`` of every per-row leaf and of each cache's table; the KV pools
    whole; no adaptive policy: it belongs to the batch, and prefill never reads it)."""
    state = dataclasses.replace(state, policy=None)
    row = lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, 0)  # noqa: E731

    def one(x):
        if isinstance(x, PagedKVCache):
            return PagedKVCache(x.k, x.v, row(x.req_to_token))
        return row(x) if x.ndim else x

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, PagedKVCache))


def _write_row(state: DecodeState, sub: DecodeState, slot):
    """``state`` with row ``slot`` taken from the one-row ``sub`` (a ``_rows_view``) and the KV pools from
    ``sub``; the batch's adaptive policy kept."""
    policy, state = state.policy, dataclasses.replace(state, policy=None)

    def one(x, y):
        if isinstance(x, PagedKVCache):
            return PagedKVCache(y.k, y.v, x.req_to_token)
        return jax.lax.dynamic_update_slice_in_dim(x, y, slot, 0) if x.ndim else x

    out = jax.tree.map(one, state, sub, is_leaf=lambda x: isinstance(x, PagedKVCache))
    return dataclasses.replace(out, policy=policy)


@functools.lru_cache(maxsize=64)
def _insert_fn(graphdef, treedef, opts: EngineOptions, checks: bool):
    """Jitted ``insert(params, state, prompt (1, P), length (1,), slot, max_new, sampling)``: the engine's
    ``prefill`` of one request (sampling parameters ``(temperature, top_k, top_p, seed)``, each of shape ``(1,)``)
    into batch slot ``slot`` (state donated); shared by every serving core with equal keys."""

    def insert(params, state, prompt, length, slot, max_new, sampling):
        target, drafter = nnx.merge(graphdef, jax.tree.unflatten(treedef, params))
        sub = _rows_view(state, slot)
        zero = jnp.zeros((1,), jnp.int32)
        sub = dataclasses.replace(
            sub, seq_lens=zero, num_generated=zero, done=jnp.zeros((1,), bool), max_new_tokens=max_new[None],
            num_rounds=zero, num_accepted=zero, out_tokens=jnp.zeros_like(sub.out_tokens),
            sampling=SamplingParams(*sampling))
        return _write_row(state, prefill(target, drafter, opts, sub, prompt, length), slot)

    return jax.jit(functionalize_checks(insert, checks), donate_argnums=(1,))


@functools.lru_cache(maxsize=64)
def _decode_fn(graphdef, treedef, opts: EngineOptions, checks: bool):
    """Jitted ``decode(params, state, rounds)``: the engine's ``decode_loop`` (fixed shape, or adaptive: one
    segment per mode) for at most ``rounds`` rounds (traced ``i32[]``: one executable for every ``R``), left
    as soon as a request that was running at the start has finished, or every row is done (state donated)."""

    def decode(params, state, rounds):
        target, drafter = nnx.merge(graphdef, jax.tree.unflatten(treedef, params))
        running = ~state.done
        return decode_loop(target, drafter, opts, state, max_rounds=rounds,
                           until=lambda st: jnp.any(running & st.done))

    return jax.jit(functionalize_checks(decode, checks), donate_argnums=(1,))


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

    ``submit(prompt_ids, RequestParams(...))`` queues a request and returns its ``RequestHandle`` (iterate it for
    its tokens); ``step()`` runs one iteration and returns a ``RequestOutput`` per request that produced tokens
    or ended; ``cancel(handle)`` ends a request at once (queued or running: its slot and pages are free when it
    returns); ``generate(prompts, params)`` is the blocking form for a list; ``has_unfinished()``; ``stats()``;
    ``requests[request_id]`` holds each request (``output`` grows as it decodes). One thread owns a core.
    """

    def __init__(self, engine: Engine, *, rounds_per_step: int = 1, sampling: bool = False):
        if not isinstance(engine, Engine):
            raise ValueError(f"engine: expected a jaxspec.engine.Engine, got {type(engine).__name__}")
        if engine.simulate_accept is not None:
            raise ValueError("engine: simulated acceptance is not served (it is a benchmark of the engine alone)")
        if not isinstance(rounds_per_step, int) or isinstance(rounds_per_step, bool) or rounds_per_step < 1:
            raise ValueError(f"rounds_per_step: expected an int >= 1, got {rounds_per_step!r}")
        if not isinstance(sampling, bool):
            raise ValueError(f"sampling: expected a bool, got {sampling!r}")
        self.sampling = sampling
        self.engine = engine
        self.rounds_per_step = rounds_per_step
        self.num_slots = b = next_pow2(engine.max_batch)
        self.max_context = w = engine.max_context
        self.page_size = g = engine.page_size
        self.max_pages = math.ceil(w / g)
        self.verify_width = engine.opts.verify_width
        self.pool = PagePool(engine.num_pages)
        self.scheduler = Scheduler(b, self.pool)
        self.requests: dict[str, Request] = {}
        self._next_id = 0
        self._dirty: dict[int, tuple[int, list[int]]] = {}  # slot -> (first column, pages): the next refresh
        self.step_costs: StepCosts | None = None  # adaptive engines: the policy's round prices (costs.py)
        self._state, self._r2p = self._fresh_state()
        self._mode_rounds = None if self.step_costs is None else np.zeros_like(self.step_costs.base, np.int64)
        self._seq_lens = np.zeros((self.num_slots,), np.int32)  # the last read of the committed lengths
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
            cost = eng.round_costs[b] if b in eng.round_costs else eng.calibrate(b)
            self.step_costs = StepCosts(cost)
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

    # ---------------------------------------------------------------- API
    def submit(self, prompt_ids, params: RequestParams | None = None, *, request_id: str | None = None
               ) -> RequestHandle:
        """Queue a request (``params``: ``RequestParams()`` when None); returns its ``RequestHandle``. Sampling
        other than greedy only in a ``sampling=True`` core. ``ValueError`` naming the field for a bad prompt or
        parameter, a request that overflows ``max_context`` or could never fit the page pool, or a duplicate
        ``request_id``."""
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
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if not isinstance(request_id, str) or request_id in self.requests:
            raise ValueError(f"request_id: expected a new str, got {request_id!r}")
        prompt, mnt = arrs[0], int(mnt[0])
        worst = math.ceil(min(self.max_context, prompt.size + mnt + self.rounds_per_step * self.verify_width)
                          / self.page_size)
        if worst > self.pool.capacity:
            raise ValueError(f"prompt_ids: the request may need {worst} KV pages of {self.page_size} tokens, the pool "
                             f"holds {self.pool.capacity} (num_pages={self.pool.num_pages}, page 0 reserved)")
        req = Request(request_id, prompt, mnt, worst_pages=worst, sampling=sampling,
                      stop_token_ids=frozenset(params.stop_token_ids))
        self.requests[request_id] = req
        self.scheduler.waiting.append(req)
        return RequestHandle(self, req)

    def cancel(self, request) -> None:
        """End a queued or running request now (its ``RequestHandle`` or id): its slot and pages are free when
        this returns (the row is marked done and its table row moved to the dummy page before any later round
        runs). Cancelling a finished request does nothing."""
        request_id = request.request_id if isinstance(request, RequestHandle) else request
        req = self.requests.get(request_id) if isinstance(request_id, str) else None
        if req is None:
            raise ValueError(f"request: no request {request!r}")
        if req.status == "finished":
            return
        if req.status == "waiting":
            self.scheduler.waiting.remove(req)
        else:
            slot = req.slot
            self._finish(req, "abort")
            stop = np.zeros((self.num_slots,), bool)
            stop[slot] = True
            self._refresh(stop)
            return
        req.status, req.finish_reason = "finished", "abort"

    def _finish(self, req: Request, reason: str) -> None:
        self.scheduler.release(req)
        self._dirty[req.slot] = (0, [0] * self.max_pages)  # the whole row back to the dummy page
        req.status, req.finish_reason, req.slot = "finished", reason, None

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> list[RequestOutput]:
        """One iteration (module docstring): admit, assign pages, prefill the admitted, run ``R`` rounds, read
        back once, retire. Returns the outputs of the requests that produced tokens or ended."""
        t_start = time.perf_counter()
        r, n = self.rounds_per_step, self.verify_width
        admitted = self.scheduler.admit()
        for req in admitted:
            self._dirty.pop(req.slot, None)  # a retired row's reset is superseded by the new row
            self._grow(req, req.prompt.size + r * n)
            self._dirty[req.slot] = (0, req.pages + [0] * (self.max_pages - len(req.pages)))
        for req in self.scheduler.running.values():
            if req not in admitted:
                self._grow(req, self._seq_lens[req.slot] + r * n)
        self._refresh()
        entry = _insert_fn(self.engine.graphdef, self.engine.treedef, self.engine.opts, checks_enabled())
        for req in admitted:
            p = prompt_bucket(req.prompt.size, self.max_context)
            prompt = np.zeros((1, p), np.int32)
            prompt[0, : req.prompt.size] = req.prompt
            args = (jax.device_put(prompt), jax.device_put(np.array([req.prompt.size], np.int32)),
                    jax.device_put(np.int32(req.slot)), jax.device_put(np.int32(req.max_new_tokens)),
                    tuple(jax.device_put(x) for x in req.sampling))
            self._state = self._call(entry, self.engine.params, self._state, *args)
        if not self.scheduler.running:
            return []
        decode = _decode_fn(self.engine.graphdef, self.engine.treedef, self.engine.opts, checks_enabled())
        self._state = self._call(decode, self.engine.params, self._state, jax.device_put(np.int32(r)))
        st = self._state
        modes = None if st.policy is None else st.policy.mode_rounds
        done, num, seq, out, rounds, acc, modes = jax.device_get((st.done, st.num_generated, st.seq_lens,
                                                                  st.out_tokens, st.num_rounds, st.num_accepted, modes))
        self._seq_lens = seq
        if self.step_costs is not None:  # the step's wall time prices the policy's next rounds
            self.step_costs.observe(time.perf_counter() - t_start, modes - self._mode_rounds)
            self._mode_rounds = modes.astype(np.int64)
            self._state = dataclasses.replace(st, policy=dataclasses.replace(
                st.policy, round_cost=jax.device_put(self.step_costs.round_cost())))
        outputs = []
        for slot, req in list(self.scheduler.running.items()):
            new = out[slot, len(req.output): num[slot]].tolist()
            self._rounds += int(rounds[slot]) - req.rounds
            self._accepted += int(acc[slot]) - req.accepted
            req.rounds, req.accepted = int(rounds[slot]), int(acc[slot])
            stop = next((k for k, t in enumerate(new) if t in req.stop_token_ids), None)
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
