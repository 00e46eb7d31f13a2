"""A serving load generator: requests arrive over time at ``jaxspec.serving.ServingEngine`` (in process) or at
the OpenAI-compatible server ``python -m jaxspec.serve`` (HTTP); latency and throughput per arrival rate.

``python bench/serving.py --model SmolLM2-135M-Instruct.Q4_1.gguf --questions question.jsonl --eagle3 DIR
[--modes plain,spec,adaptive,static,http] [--rates 1,4,16,inf] [--num-requests 64] [--json PATH] [--png PATH]``
``python bench/serving.py --tiny --device cpu``: the shipped tiny pair (MTP drafter in place of EAGLE-3) on
synthetic prompts, for a CPU check in seconds.

Workload: MT-Bench's first turns (``--questions``) rendered through the checkpoint's chat template and tokenized
once (``--tiny``: ``--num-prompts`` random prompts of 4..24 tokens); request ``i`` takes prompt ``i mod P``; its
output limit is drawn uniformly from the integers in ``[--min-new, --max-new]`` (numpy ``default_rng(--seed)``);
it stops at the chat template's end-of-turn token (``--tiny``: no stop token, every request runs to its limit).
Arrivals: a Poisson process at each of ``--rates`` requests/s (exponential gaps from ``default_rng(--seed + 1)``);
``inf``: every request arrives at t=0 (saturation). ``--num-requests`` per rate; the same limits at every rate.
Concurrency: the engine's ``max_batch`` (``--max-batch``) slots.

Modes (``--modes``):

* ``plain``: plain decoding; ``plain-sync``: the same engine through ``ServingEngine(overlap=False)`` (each step
  reads its own tokens: what the host's work between steps costs); ``spec``: the EAGLE-3 head with ``--spec``
  (chain ``3,1,4``: ``S,K,N``);
  ``adaptive``: EAGLE-3 with ``(3,1,4)`` and ``(7,1,8)`` and ``AdaptivePolicy`` (round costs calibrated at every
  slot bucket: the slot count's when the core is built, the others by its ``warmup``). Each through a ``ServingEngine(engine, rounds_per_step=--rounds)``.
* ``static``: the static-batching baseline at equal concurrency, at saturation only: ``Engine.generate`` (plain)
  on batches of ``max_batch`` requests in arrival order, each batch waiting for its longest request. Its tokens
  arrive with the batch's end (no streaming): TTFT = latency = the batch's end; ITL / TPOT are not reported.
* ``http``: the same load through ``python -m jaxspec.serve --model M --port P`` (a subprocess, plain decoding,
  the plain engine's max batch, context, page size and rounds per step, its greedy core (``--greedy``: the
  executables of the in-process modes), ``--http-args`` appended; ready when
  ``GET /health`` answers 200): streaming ``POST /v1/completions`` with the prompt as token ids, ``max_tokens``,
  ``temperature`` 0, the in-process stop tokens (``ignore_eos`` + ``stop_token_ids``), ``return_token_ids`` and
  ``stream_options.include_usage``; every request a task of one asyncio loop on one ``aiohttp`` session.
  Against ``plain`` it measures the HTTP layer's own cost.

In-process driver: a real-time loop that submits every request whose arrival time has passed, calls ``step()``
and timestamps each ``RequestOutput`` as it returns (it sleeps only when nothing runs and the next arrival is
ahead). Per request: TTFT = time of the first chunk - arrival time; latency = time of the last chunk - arrival;
TPOT = (latency - TTFT) / (n - 1) (n tokens; requests with n > 1). Inter-token latency (ITL): a chunk of ``k``
tokens arriving ``dt`` after the request's previous chunk counts as ``k`` gaps of ``dt / k``; the first chunk's
tokens arrive at TTFT and give no gap. Chunk gaps (``dt`` per chunk after the first) are reported as well. HTTP:
a chunk is a streamed event, its tokens its ``token_ids``, timed as the client reads it; their sum must equal the
usage's ``completion_tokens`` (else the request's ``finish_reason`` is an error).

Rows (one per mode and rate, written to ``--json`` as soon as measured): ``requests``, ``finished``,
``output_tokens``, ``duration_s`` (first arrival to last token), ``request_throughput`` and ``output_tok_s``
over it, ``ttft_mean_s / ttft_p50_s / ttft_p99_s``, ``itl_p50_s / itl_p99_s``, ``tpot_mean_s``,
``chunk_gap_p50_s / chunk_gap_p99_s``, ``mean_accept_length`` (the core's ``stats()`` over the rate's steps),
and per request ``n``, ``ttft_s``, ``latency_s``, ``finish_reason``; in-process serving modes also ``steps``,
``host_ms_per_step`` (split into ``plan_ms_per_step``, ``dispatch_ms_per_step``, ``update_ms_per_step``) and
``device_ms_per_step`` (``ServingEngine.times``: the host's planning, packing and dispatching, its output handling,
and its wait for the step's one read); adaptive rows ``mode_rounds`` (the batch's rounds per mode over the rate:
plain, then each draft shape) and ``round_costs_ms`` (the prices per slot bucket the policy compared). A failing configuration gives a row with
``error``. Warm-up: before a mode's first timed rate, ``--warmup`` requests at saturation (one prompt of every
prompt-length bucket the workload uses, so every prefill executable is compiled), not counted.
``--budget-s``: no new (mode, rate) row starts after this many seconds.
"""

import collections
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import _cli
from _rows import Run

MODES = ("plain", "plain-sync", "spec", "adaptive", "static", "http")


def _parse(argv):
    ap = _cli.parser("serving.py", __doc__)
    ap.add_argument("--model", default=None, help="a .gguf file or checkpoint directory ('tiny': as --tiny)")
    ap.add_argument("--tiny", action="store_true", help="the shipped tiny pair on synthetic prompts (CPU check)")
    ap.add_argument("--questions", default=None, help="MT-Bench question.jsonl (first turns are the prompts)")
    ap.add_argument("--eagle3", default=None, help="EAGLE-3 head directory (jaxspec.models.load_eagle3)")
    ap.add_argument("--modes", default="plain,spec,adaptive,static,http", help=f"comma list of {list(MODES)}")
    ap.add_argument("--rates", default="1,4,16,inf", help="comma list of arrival rates in requests/s; inf: all at 0")
    ap.add_argument("--http-rates", default="1,inf", help="the rates of the http mode")
    ap.add_argument("--spec", default="3,1,4", help="the spec mode's S,K,N")
    for flag, default, what in (  # the integer settings of a run
            ("--num-requests", 64, "requests per rate"),
            ("--min-new", 32, "smallest output limit"),
            ("--max-new", 256, "largest output limit"),
            ("--max-batch", 16, "the engine's max_batch: the concurrency"),
            ("--rounds", 4, "ServingEngine rounds_per_step"),
            ("--warmup", 4, "warm-up requests per mode (at least one per bucket)"),
            ("--num-prompts", 16, "how many synthetic prompts (with --tiny)"),
            ("--seed", 0, "output limits (seed) and arrival gaps (seed + 1)"),
            ("--page-size", 16, "KV page size")):
        ap.add_argument(flag, type=int, default=default, help=what)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weights and KV")
    ap.add_argument("--port", type=int, default=0, help="http mode: the server's port (0: a free one)")
    ap.add_argument("--http-args", default="", help="http mode: extra arguments of python -m jaxspec.serve")
    ap.add_argument("--http-start-s", type=float, default=300.0, help="http mode: seconds to wait for /health")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new row after this many seconds")
    ap.add_argument("--json", default=None, help="write the rows here (after every row)")
    ap.add_argument("--png", default=None, help="plot: ITL p50 and output tok/s against rate, per mode")
    args = ap.parse_args(argv)
    if args.model == "tiny":
        args.tiny = True
    if not args.tiny and (args.model is None or args.questions is None):
        ap.error("--model and --questions are required (or --tiny)")
    bad = [m for m in args.modes.split(",") if m and m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}, expected some of {list(MODES)}")
    if not 1 <= args.min_new <= args.max_new:
        ap.error(f"--min-new / --max-new: expected 1 <= min <= max, got {args.min_new}, {args.max_new}")
    return args


def parse_rates(text: str) -> list[float]:
    """``"1,4,inf"`` -> ``[1.0, 4.0, inf]``; ``ValueError`` naming ``--rates`` for a rate that is not > 0."""
    rates = [float(x) for x in text.split(",") if x]
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"--rates: expected positive rates or inf, got {text!r}")
    return rates


# ------------------------------------------------------------------------------------------------ workload
def workload(prompts, num_requests: int, rate: float, min_new: int, max_new: int, seed: int):
    """``[(arrival_s, prompt, max_new_tokens)]`` in arrival order: prompts cycled, limits uniform in
    ``[min_new, max_new]`` (seed ``seed``), Poisson arrivals at ``rate`` (seed ``seed + 1``; inf: all at 0)."""
    import numpy as np

    limits = np.random.default_rng(seed).integers(min_new, max_new + 1, size=num_requests)
    if rate == float("inf"):
        times = np.zeros(num_requests)
    else:
        gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, size=num_requests)
        times = np.cumsum(gaps) - gaps[0]  # the first request at 0
    return [(float(t), prompts[i % len(prompts)], int(m)) for i, (t, m) in enumerate(zip(times, limits))]


class Trace:
    """One request's timeline: arrival (s, the run's clock) and ``(time, tokens)`` per chunk."""

    def __init__(self, arrival: float, max_new: int):
        self.arrival, self.max_new = arrival, max_new
        self.chunks: list[tuple[float, int]] = []
        self.finish_reason = None
        self.n = 0

    def add(self, t: float, k: int):
        if k:
            self.chunks.append((t, k))
            self.n += k


def _pct(xs, q):
    import numpy as np

    return float(np.percentile(xs, q)) if len(xs) else None


def metrics(traces: list[Trace], t_start: float) -> dict:
    """The row's latency and throughput fields from finished traces (module docstring: TTFT, ITL, TPOT)."""
    ttft, lat, tpot, itl, gaps, per = [], [], [], [], [], []
    for tr in traces:
        if not tr.chunks:
            per.append(dict(n=0, ttft_s=None, latency_s=None, finish_reason=tr.finish_reason))
            continue
        first, last = tr.chunks[0][0] - tr.arrival, tr.chunks[-1][0] - tr.arrival
        ttft.append(first)
        lat.append(last)
        if tr.n > 1:
            tpot.append((last - first) / (tr.n - 1))
        for (t0, _), (t1, k) in zip(tr.chunks, tr.chunks[1:]):
            gaps.append(t1 - t0)
            itl.extend([(t1 - t0) / k] * k)
        per.append(dict(n=tr.n, ttft_s=first, latency_s=last, finish_reason=tr.finish_reason))
    end = max((tr.chunks[-1][0] for tr in traces if tr.chunks), default=t_start)
    dur = max(end - t_start, 1e-9)
    n_out = sum(tr.n for tr in traces)
    return dict(
        requests=len(traces), finished=sum(tr.finish_reason is not None for tr in traces), output_tokens=n_out,
        duration_s=dur, request_throughput=len(traces) / dur, output_tok_s=n_out / dur,
        ttft_mean_s=statistics.fmean(ttft) if ttft else None, ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99),
        latency_mean_s=statistics.fmean(lat) if lat else None,
        itl_p50_s=_pct(itl, 50), itl_p99_s=_pct(itl, 99), tpot_mean_s=statistics.fmean(tpot) if tpot else None,
        chunk_gap_p50_s=_pct(gaps, 50), chunk_gap_p99_s=_pct(gaps, 99), per_request=per)


# ------------------------------------------------------------------------------------------------ in process
def drive(se, work, stop_ids=(), clock=time.perf_counter) -> tuple[list[Trace], float, float | None]:
    """Run ``work`` (``workload``'s list) through ``se`` in real time; returns the traces (in ``work``'s order),
    the run's start time and the mean accept length over its steps (``se.stats()`` before and after)."""
    from jaxspec.serving import RequestParams

    s0 = se.stats()
    t0 = clock()
    traces = [Trace(t0 + t, m) for t, _, m in work]
    pending = collections.deque(range(len(work)))
    by_id = {}
    while pending or se.has_unfinished():
        now = clock()
        while pending and traces[pending[0]].arrival <= now:
            i = pending.popleft()
            params = RequestParams(max_new_tokens=work[i][2], temperature=0.0, stop_token_ids=tuple(stop_ids))
            by_id[se.submit(work[i][1], params).request_id] = traces[i]
        if not se.has_unfinished():
            time.sleep(max(0.0, traces[pending[0]].arrival - clock()))
            continue
        outs = se.step()
        t = clock()
        for o in outs:
            tr = by_id[o.request_id]
            tr.add(t, len(o.new_token_ids))
            if o.finished:
                tr.finish_reason = o.finish_reason
    s1 = se.stats()
    rounds = s1.rounds - s0.rounds
    return traces, t0, (s1.accepted_tokens - s0.accepted_tokens) / rounds if rounds > 0 else None


def policy_row(se, before, after) -> dict:
    """An adaptive core's choices over a run, from two ``stats()`` snapshots: ``mode_rounds`` (the batch's rounds
    of each mode: plain, then each draft shape) and ``round_costs_ms`` (per slot bucket, the prices its policy
    compared at the end: the bucket's calibrated in-loop costs plus the step overhead); nothing for other cores."""
    import numpy as np

    if after.mode_rounds is None:
        return {}
    over = se.step_costs.overhead
    costs = {b: ((np.asarray(se.engine.round_costs[b]) + over) * 1e3).tolist()
             for b in se.slot_buckets if b in se.engine.round_costs}
    return dict(mode_rounds=[b - a for a, b in zip(before.mode_rounds, after.mode_rounds)], round_costs_ms=costs)


def step_breakdown(before, after) -> dict:
    """Where the run's steps went, from two ``ServingEngine.times`` snapshots: ``steps`` (that read back),
    ``host_ms_per_step`` (planning, packing, dispatching, taking outputs back; split into ``plan_ms_per_step``,
    ``dispatch_ms_per_step`` and ``update_ms_per_step``) and ``device_ms_per_step`` (the wait for the step's one
    read: device work the host did not hide)."""
    n = after.steps - before.steps
    per = (lambda x: x * 1e3 / n) if n else (lambda x: None)  # noqa: E731
    out = dict(steps=n)
    for part in ("host", "plan", "dispatch", "update", "device"):
        out[f"{part}_ms_per_step"] = per(getattr(after, part) - getattr(before, part))
    return out


def warm_work(prompts, count: int, max_new: int, page_ctx: int):
    """Warm-up requests at saturation: one prompt per prompt-length bucket of ``prompts``, then more up to
    ``count``; ``max_new`` tokens each."""
    from jaxspec.engine.memory import prompt_bucket

    seen, first = set(), []
    for p in prompts:
        b = prompt_bucket(len(p), page_ctx)
        if b not in seen:
            seen.add(b)
            first.append(p)
    extra = [prompts[i % len(prompts)] for i in range(max(0, count - len(first)))]
    return [(0.0, p, max_new) for p in first + extra]


def static_run(engine, work, clock=time.perf_counter) -> tuple[list[Trace], float]:
    """``Engine.generate`` on batches of ``engine.max_batch`` requests in ``work``'s order (all arrived at 0);
    every token of a batch is timed at the batch's end."""
    import numpy as np

    b = engine.max_batch
    t0 = clock()
    traces = [Trace(t0 + t, m) for t, _, m in work]
    for i in range(0, len(work), b):
        group = work[i:i + b]
        res = engine.generate([p for _, p, _ in group], [m for _, _, m in group])
        t = clock()
        for j, toks in enumerate(res.tokens):
            tr = traces[i + j]
            toks = np.asarray(toks).tolist()
            tr.add(t, len(toks))
            eos = engine.eos_id
            tr.finish_reason = "stop" if eos >= 0 and toks and toks[-1] == eos else "length"
    return traces, t0


# ------------------------------------------------------------------------------------------------ http
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m jaxspec.serve --model M --port P [extra]`` as a subprocess, its output in ``log``."""

    def __init__(self, model: str, port: int, extra: list[str], start_s: float, log: str):
        import http.client

        self.port = port or _free_port()
        self.log = open(log, "w")
        model = os.path.abspath(model) if os.path.exists(model) else model
        cmd = [sys.executable, "-m", "jaxspec.serve", "--model", model, "--port", str(self.port), *extra]
        print("http: " + " ".join(cmd), flush=True)
        # from the temp folder: `python -m` puts its working folder first on sys.path, where a source tree would
        # shadow the installed package
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
        deadline = time.time() + start_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"python -m jaxspec.serve exited with {self.proc.returncode} (log {log})")
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                c.close()
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"python -m jaxspec.serve: no 200 from /health within {start_s} s (log {log})")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


async def _stream_one(session, url: str, prompt, max_new: int, stop_ids, tr: Trace, clock):
    """One streaming ``/v1/completions`` into ``tr``: each event's ``token_ids`` timed at its arrival; the
    usage's ``completion_tokens`` must equal their sum (else ``finish_reason`` records the mismatch)."""
    body = dict(model="jaxspec", prompt=[int(x) for x in prompt], max_tokens=int(max_new), temperature=0.0,
                stream=True, stream_options=dict(include_usage=True), ignore_eos=True,
                stop_token_ids=[int(x) for x in stop_ids], return_token_ids=True)
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            tr.finish_reason = f"http {resp.status}: {(await resp.read())[:200]!r}"
            return
        usage, reason = None, None
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            t = clock()
            ev = json.loads(data)
            usage = ev.get("usage") or usage
            for ch in ev.get("choices") or ():
                tr.add(t, len(ch["token_ids"]))
                reason = ch.get("finish_reason") or reason
    n = None if usage is None else usage.get("completion_tokens")
    tr.finish_reason = reason if n == tr.n else f"error: usage.completion_tokens {n}, token_ids {tr.n}"


def http_drive(port: int, work, stop_ids=(), clock=time.perf_counter) -> tuple[list[Trace], float]:
    """``work`` through the server: every request started at its arrival time, all on one event loop and one
    ``aiohttp`` session (no connection limit; closed at the end)."""
    import asyncio

    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"

    async def run():
        t0 = clock()
        traces = [Trace(t0 + t, m) for t, _, m in work]

        async def one(session, i):
            await asyncio.sleep(max(0.0, traces[i].arrival - clock()))
            try:
                await _stream_one(session, url, work[i][1], work[i][2], stop_ids, traces[i], clock)
            except Exception as e:  # noqa: BLE001 - the request's row records it
                traces[i].finish_reason = f"error: {type(e).__name__}: {e}"

        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
            await asyncio.gather(*(one(session, i) for i in range(len(work))))
        return traces, t0

    return asyncio.run(run())


# ------------------------------------------------------------------------------------------------ setup
class Setup:
    """Prompts, stop tokens and the engines of each mode (built on first use, the targets loaded once)."""

    def __init__(self, args):
        import jax.numpy as jnp

        self.args, self.dtype = args, getattr(jnp, args.dtype)
        self._cache = {}
        if args.tiny:
            import numpy as np

            rng = np.random.default_rng(args.seed + 2)
            vocab = self._tiny().vocab_size
            self.prompts = [rng.integers(1, vocab, size=int(rng.integers(4, 25))).astype(np.int32).tolist()
                            for _ in range(args.num_prompts)]
            self.eos = None
        else:
            import real_model  # a sibling script: bench/ is on sys.path when this runs as a script

            tok, self.prompts = real_model.prompt_ids(args.model, args.questions)
            self.eos = tok.end_of_turn_token_id
        self.stop_ids = () if self.eos is None else (self.eos,)

    def _tiny(self):
        from jaxspec.models import DEFAULT_WEIGHTS, load_pair

        if "tiny" not in self._cache:
            self._cache["tiny"] = load_pair(DEFAULT_WEIGHTS)
        return self._cache["tiny"]

    def _plain_target(self):
        from jaxspec.models import load_model

        if self.args.tiny:
            return self._tiny()
        if "plain" not in self._cache:
            self._cache["plain"] = load_model(self.args.model, param_dtype=self.dtype, kv_dtype=self.dtype)
        return self._cache["plain"]

    def _spec_pair(self):
        """``(target, drafter)``: EAGLE-3 (the target taps its aux layers); ``--tiny``: the tiny pair's MTP."""
        from jaxspec.models import MTPDrafter, load_target_with_head

        if self.args.tiny:
            return self._tiny(), MTPDrafter(self._tiny())
        if self.args.eagle3 is None:
            raise ValueError("--eagle3: the spec and adaptive modes need an EAGLE-3 head directory")
        if "e3" not in self._cache:
            self._cache["e3"] = tuple(load_target_with_head(
                self.args.model, self.args.eagle3, kind="eagle3", param_dtype=self.dtype, kv_dtype=self.dtype,
                head_param_dtype=self.dtype, head_kv_dtype=self.dtype)[:2])
        return self._cache["e3"]

    def context(self, width: int) -> int:
        a, g = self.args, self.args.page_size
        need = max(len(p) for p in self.prompts) + a.max_new + a.rounds * width + 1
        return -(-need // g) * g

    def engine(self, mode: str):
        """The ``Engine`` of ``mode`` (``static``: the plain one)."""
        from jaxspec.config import SpecConfig
        from jaxspec.engine import AdaptivePolicy, Engine

        a = self.args
        key = "plain" if mode in ("plain", "plain-sync", "static") else mode
        if ("engine", key) in self._cache:
            return self._cache[("engine", key)]
        kw = dict(page_size=a.page_size, max_batch=a.max_batch, eos_id=self.eos)
        if key == "plain":
            eng = Engine(self._plain_target(), max_context=self.context(1), **kw)
        elif key == "spec":
            spec = SpecConfig(*(int(x) for x in a.spec.split(",")))
            eng = Engine(*self._spec_pair(), spec=spec, max_context=self.context(spec.num_draft_tokens), **kw)
        else:
            # --tiny: the tiny MTP head drafts at most 3 steps, so its second shape is the tree (3, 2, 6)
            specs = [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6) if a.tiny else SpecConfig(7, 1, 8)]
            eng = Engine(*self._spec_pair(), spec=specs, adaptive=AdaptivePolicy(), max_context=self.context(8),
                         **kw)
        self._cache[("engine", key)] = eng
        return eng

    def serving(self, mode: str):
        from jaxspec.serving import ServingEngine

        if ("serving", mode) not in self._cache:
            se = ServingEngine(self.engine(mode), rounds_per_step=self.args.rounds, overlap=mode != "plain-sync")
            se.warmup()  # every slot / chunk bucket compiled (the server does the same at its start)
            self._cache[("serving", mode)] = se
        return self._cache[("serving", mode)]


# ------------------------------------------------------------------------------------------------ run
def _fmt(x, scale=1e3):
    return "-" if x is None else f"{x * scale:.1f}"


def _report(row):
    print(f"{row['mode']:<8s} rate={row['rate']:<5g} {row['finished']}/{row['requests']} done  "
          f"{row['output_tok_s']:8.1f} tok/s  {row['request_throughput']:6.2f} req/s  "
          f"TTFT mean/p99 {_fmt(row['ttft_mean_s'])}/{_fmt(row['ttft_p99_s'])} ms  "
          f"ITL p50/p99 {_fmt(row['itl_p50_s'])}/{_fmt(row['itl_p99_s'])} ms  "
          f"accept {row.get('mean_accept_length') or '-'}  "
          f"host/device {_fmt(row.get('host_ms_per_step'), 1)}/{_fmt(row.get('device_ms_per_step'), 1)} ms/step "
          f"(plan/dispatch/update {_fmt(row.get('plan_ms_per_step'), 1)}/{_fmt(row.get('dispatch_ms_per_step'), 1)}/"
          f"{_fmt(row.get('update_ms_per_step'), 1)})  "
          + (f"rounds per mode {row['mode_rounds']}  " if row.get("mode_rounds") else "")
          + f"({row['duration_s']:.1f} s)", flush=True)


def run_mode(run, setup, mode, rates, args, http_server=None):
    """Every rate of one mode: warm-up, then one row per rate (a failure gives an ``error`` row)."""
    a = args
    warmed = False
    for rate in rates:
        if not run.time_left():
            return
        base = dict(mode=mode, rate=rate, max_batch=a.max_batch, rounds_per_step=a.rounds,
                    min_new=a.min_new, max_new=a.max_new)
        breakdown = {}
        try:
            work = workload(setup.prompts, a.num_requests, rate, a.min_new, a.max_new, a.seed)
            t_build = time.perf_counter()
            if mode == "static":
                eng = setup.engine(mode)
                if not warmed:  # the same batches once untimed: every (prompt bucket, length) compiled
                    static_run(eng, work)
                warmed = True
                warm_s = time.perf_counter() - t_build
                traces, t0 = static_run(eng, work)
                mean_acc = 1.0
            elif mode == "http":
                if not warmed:
                    ww = warm_work(setup.prompts, a.warmup, 8, setup.engine("plain").max_context)
                    http_drive(http_server.port, ww, setup.stop_ids)
                warmed = True
                warm_s = time.perf_counter() - t_build
                traces, t0 = http_drive(http_server.port, work, setup.stop_ids)
                mean_acc = None
            else:
                se = setup.serving(mode)
                if not warmed:
                    drive(se, warm_work(setup.prompts, a.warmup, 8, se.max_context), setup.stop_ids)
                warmed = True
                warm_s = time.perf_counter() - t_build
                times, s0 = dataclasses.replace(se.times), se.stats()
                traces, t0, mean_acc = drive(se, work, setup.stop_ids)
                breakdown = step_breakdown(times, se.times)
                breakdown.update(policy_row(se, s0, se.stats()))
                if mode in ("plain", "plain-sync"):
                    mean_acc = 1.0
            row = dict(base, **metrics(traces, t0), **breakdown, mean_accept_length=mean_acc, warmup_s=warm_s,
                       limits=[m for _, _, m in work],
                       itl_definition="a chunk of k tokens dt after the previous chunk: k gaps of dt/k")
            _report(run.add(row))
        except Exception as e:  # noqa: BLE001 - one failing configuration must not end the run
            traceback.print_exc()
            run.add(dict(base, error=f"{type(e).__name__}: {e}"))
            print(f"{mode} rate={rate}: FAILED ({type(e).__name__}: {e})", flush=True)


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if "error" not in r]
    finite = sorted({r["rate"] for r in rows if r["rate"] != float("inf")})
    x_inf = (max(finite) * 4 if finite else 1.0)

    def xs(r):
        return x_inf if r["rate"] == float("inf") else r["rate"]

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = sorted((r for r in rows if r["mode"] == mode), key=xs)
        pts = [(xs(r), r["itl_p50_s"] * 1e3) for r in rs if r.get("itl_p50_s") is not None]
        if pts:
            ax[0].plot(*zip(*pts), "o-", label=mode)
        ax[1].plot([xs(r) for r in rs], [r["output_tok_s"] for r in rs], "o-", label=mode)
    for a_, y in zip(ax, ("ITL p50 (ms)", "output tokens/s")):
        a_.set_xscale("log")
        a_.set_xlabel(f"arrival rate (req/s; inf plotted at {x_inf:g})")
        a_.set_ylabel(y)
        a_.legend(fontsize=8)
    _cli.save_figure(fig, path, f"{doc['model']} on {doc['gpu']}: max_batch {doc['args']['max_batch']}")


def main(argv=None) -> int:
    args = _cli.parse_on_device(_parse, argv)
    import jax

    rates, http_rates = parse_rates(args.rates), parse_rates(args.http_rates)
    modes = [m for m in args.modes.split(",") if m]
    run = Run(args.json, args.budget_s, dict(model="tiny" if args.tiny else os.path.basename(args.model),
                                             gpu=str(jax.devices()[0].device_kind), jax=jax.__version__,
                                             args=vars(args)))
    setup = Setup(args)
    print(f"{len(setup.prompts)} prompts, {min(map(len, setup.prompts))}-{max(map(len, setup.prompts))} tokens; "
          f"stop {setup.stop_ids}; modes {modes}; rates {rates}", flush=True)
    for mode in modes:
        if not run.time_left():
            break
        print(f"--- {mode}", flush=True)
        if mode == "static":
            run_mode(run, setup, mode, [r for r in rates if r == float("inf")] or [float("inf")], args)
        elif mode == "http":
            server = None
            try:
                from jaxspec.models import DEFAULT_WEIGHTS

                model = DEFAULT_WEIGHTS if args.tiny else args.model
                log = (args.json or "serving.json") + ".server.log"
                same = ["--served-model-name", "jaxspec", "--max-batch", str(args.max_batch), "--max-context", str(setup.engine("plain").max_context),
                        "--page-size", str(args.page_size), "--rounds-per-step", str(args.rounds), "--greedy",
                        "--dtype", "bf16" if args.dtype == "bfloat16" else "f32"]
                server = Server(model, args.port, same + args.http_args.split(), args.http_start_s, log)
                run_mode(run, setup, mode, http_rates, args, http_server=server)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                run.add(dict(mode="http", rate=None, error=f"{type(e).__name__}: {e}"))
                print(f"http: FAILED ({type(e).__name__}: {e})", flush=True)
            finally:
                if server is not None:
                    server.close()
        else:
            run_mode(run, setup, mode, rates, args)
    if args.png:
        try:
            plot(run.doc, args.png)
        except Exception:  # noqa: BLE001 - the JSON is already written
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
