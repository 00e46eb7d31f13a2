"""The serving scheduler on its own, without JAX (``jaxspec.serving.scheduler``: data in, data out).

Each test runs in a fresh interpreter that imports the scheduler module with the ``jaxspec`` and
``jaxspec.serving`` package ``__init__``s bypassed (they import JAX), drives it with plain lists standing in for
the device's read, and checks that no ``jax`` module was imported along the way."""

import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]

PRELUDE = textwrap.dedent(
    """
    import json, sys, types
    for name, path in [("jaxspec", "jaxspec"), ("jaxspec.serving", "jaxspec/serving")]:
        mod = types.ModuleType(name)
        mod.__path__ = [str(ROOT / path)]
        sys.modules[name] = mod
    from jaxspec.serving.scheduler import PagePool, Request, Scheduler, StepResult

    def result(rows, out, done, rounds=None, accepted=None, seq=None):
        # the device's read of a step: per slot, its generated ids, counters and done flags
        n = [len(o) for o in out]
        return StepResult(done=done, num_generated=n, seq_lens=seq or [0] * rows, out_tokens=out,
                          num_rounds=rounds or [1] * rows, num_accepted=accepted or [1] * rows)
    """
)


def _run(body: str) -> dict:
    code = f"import pathlib\nROOT = pathlib.Path({str(ROOT)!r})\n" + PRELUDE + textwrap.dedent(body) + textwrap.dedent(
        """
        print(json.dumps({"out": OUT, "jax": sorted(m for m in sys.modules if m == "jax" or m.startswith("jax."))}))
        """
    )
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["jax"] == [], got["jax"]
    return got["out"]


def test_plan_pages_and_outputs_without_jax():
    """Two requests admitted in one plan (both whole prompts: last chunks, lowest slots first), pages reserved for
    the prompt and the step's rounds ahead, written as page-table rows; the step's read gives each its tokens,
    and the one that reached ``max_new_tokens`` is retired with its pages and slot freed, its row reset."""
    out = _run(
        """
        pool = PagePool(9)
        s = Scheduler(2, pool, max_context=16, page_size=4, rounds_per_step=2, verify_width=2,
                      max_prefill_tokens=16)
        a, b = Request("a", [1, 2, 3, 4, 5], 2), Request("b", [6, 7], 6)
        s.add(a); s.add(b)
        plan = s.schedule(now=1.0)
        chunks = [(c.req.request_id, c.start, c.length, c.final) for c in plan.chunks]
        tables = {k: [v[0], v[1]] for k, v in sorted(plan.tables.items())}
        free_after_plan = pool.num_free
        outs = s.update(plan, result(2, [[9, 10], [11]], [True, False], seq=[6, 2]), now=2.0)
        OUT = dict(chunks=chunks, rows=plan.decode_rows, tables=tables, worst=[a.worst_pages, b.worst_pages],
                   free=[free_after_plan, pool.num_free], outs=[list(o) for o in outs],
                   a=[a.status, a.finish_reason, a.output, a.first_token_time, a.finished_time],
                   b=[b.status, b.slot, b.seq_len], reset={k: v for k, v in s.take_tables().items()},
                   stats=[s.generated, s.rounds, s.accepted])
        """
    )
    assert out["chunks"] == [["a", 0, 5, True], ["b", 0, 2, True]]
    assert out["rows"] == 2
    # a: 5 prompt tokens + 2 rounds x 2 ahead = 9 positions -> 3 pages of 4; b: 2 + 4 = 6 -> 2 pages
    assert out["worst"] == [3, 3]  # min(16, 5 + 2 + 4) = 11 -> 3; min(16, 2 + 6 + 4) = 12 -> 3
    assert out["tables"] == {"0": [0, [1, 2, 3, 0]], "1": [0, [4, 5, 0, 0]]}
    assert out["free"] == [3, 6]  # 8 pages: 5 handed out, then a's 3 back
    assert out["outs"] == [["a", [9, 10], True, "length"], ["b", [11], False, None]]
    assert out["a"] == ["finished", "length", [9, 10], 2.0, 2.0]
    assert out["b"] == ["running", 1, 2]
    assert out["reset"] == {"0": [0, [0, 0, 0, 0]]}  # a's row back to the dummy page at the next refresh
    assert out["stats"] == [3, 2, 2]


def test_waits_for_pages_fcfs_and_stops_at_host_stop_ids():
    """A request whose worst case does not fit what is left of the pool waits at the head (a later small one does
    not overtake it); a host stop id ends a request there (the tokens after it dropped, reason "stop"), which
    frees the pages the head was waiting for; an abort of a waiting request takes it out of the queue."""
    out = _run(
        """
        pool = PagePool(5)  # 4 pages of 4 tokens
        s = Scheduler(4, pool, max_context=16, page_size=4, max_prefill_tokens=32)
        a = Request("a", [1, 2, 3], 8, stop_token_ids=frozenset({7}))  # worst ceil(12 / 4) = 3
        big, small, gone = Request("big", [1] * 6, 4), Request("small", [2], 1), Request("gone", [3], 1)
        for r in (a, big, small, gone):
            s.add(r)
        s.abort(gone)
        p1 = s.schedule()
        first = [c.req.request_id for c in p1.chunks]
        outs = s.update(p1, result(1, [[5, 7, 8]], [False]))
        p2 = s.schedule()
        OUT = dict(first=first, waiting=[r.request_id for r in s.waiting], outs=[list(o) for o in outs],
                   second=[c.req.request_id for c in p2.chunks], gone=[gone.status, gone.finish_reason])
        """
    )
    assert out["first"] == ["a"]  # big needs 3 pages, 1 left: it waits, and small behind it
    assert out["outs"] == [["a", [5, 7], True, "stop"]]
    assert out["second"] == ["big", "small"]  # a's pages back: the head goes, and small behind it
    assert out["gone"] == ["finished", "abort"]


def test_chunks_share_the_budget_and_refusals_name_the_argument():
    """A long prompt is chunked over steps (the last chunk keeping the lookahead), admissions behind it share the
    step's budget; bad arguments are refused naming them, and a request larger than the whole pool at ``add``."""
    out = _run(
        """
        s = Scheduler(4, PagePool(64), max_context=32, max_prefill_tokens=8, lookahead=3)
        reqs = [Request("a", list(range(12)), 2), Request("b", [1, 2], 2)]
        for r in reqs:
            s.add(r)
        steps = []
        while s.waiting or s.prefilling:
            plan = s.schedule()
            steps.append([[c.req.request_id, c.start, c.length, c.final] for c in plan.chunks] + [plan.decode_rows])
        errors = []
        for kw in [dict(max_context=0), dict(max_context=8, max_prefill_tokens=2, lookahead=3),
                   dict(max_context=8, page_size=True)]:
            try:
                Scheduler(1, PagePool(4), **kw)
            except ValueError as e:
                errors.append(str(e).split(":")[0])
        try:
            Scheduler(1, PagePool(3), max_context=64).add(Request("x", [1] * 10, 4))
        except ValueError as e:
            errors.append(str(e).split(":")[0])
        try:
            PagePool(1)
        except ValueError as e:
            errors.append(str(e).split(":")[0])
        OUT = dict(steps=steps, errors=errors)
        """
    )
    # a: 12 tokens, budget 8 -> 8 (leaves 4 >= 3), then 4 with b's 2 (0 decoding rows until a's last chunk)
    assert out["steps"] == [[["a", 0, 8, False], 0], [["a", 8, 4, True], ["b", 0, 2, True], 2]]
    assert out["errors"] == ["max_context", "max_prefill_tokens", "page_size", "prompt_ids", "num_pages"]


def test_a_non_final_chunk_ends_the_steps_chunks():
    """With lookahead 3 and a budget of 8, a 10-token prompt's first chunk is 7 tokens (leaving 3): the 1 token
    of budget left goes to no one (a 5-token prompt behind it would get a 1-token non-final chunk, a second
    one in the step); it waits for the next step, which finishes the first prompt and admits it whole."""
    out = _run(
        """
        s = Scheduler(4, PagePool(64), max_context=32, max_prefill_tokens=8, lookahead=3)
        for r in [Request("a", list(range(10)), 2), Request("b", list(range(5)), 2)]:
            s.add(r)
        steps = []
        while s.waiting or s.prefilling:
            steps.append([[c.req.request_id, c.start, c.length, c.final] for c in s.schedule().chunks])
        OUT = steps
        """
    )
    assert out == [[["a", 0, 7, False]], [["a", 7, 3, True], ["b", 0, 5, True]]]


def test_random_workloads_prefill_every_prompt_with_one_non_final_chunk_a_step():
    """Random workloads (seeded: arrivals, prompt lengths up to 3x the budget, limits, lookaheads 1-4, budgets,
    page sizes, aborts, the device's tokens per step): no step has two non-final chunks, a step's chunks fit
    its budget, a non-final chunk leaves at least the lookahead, and every prompt that is not aborted is
    prefilled exactly once, in order, its chunks ending in one last chunk; in the end no page is held."""
    out = _run(
        """
        import random

        def drive(seed):
            rng = random.Random(seed)
            la, budget, g = rng.randint(1, 4), rng.randint(4, 24), rng.choice([1, 4, 16])
            budget = max(budget, la)
            w, slots = 96, rng.choice([1, 2, 4, 8])
            s = Scheduler(slots, PagePool(1 + slots * w // g + rng.randint(0, 8)), max_context=w, page_size=g,
                          rounds_per_step=rng.randint(1, 3), verify_width=rng.randint(1, 4), max_prefill_tokens=budget,
                          lookahead=la)
            arrivals = sorted((rng.randint(0, 30), k) for k in range(rng.randint(5, 25)))
            reqs, seen, aborted, steps, worst = [], {}, set(), 0, 0
            while arrivals or s.has_unfinished():
                while arrivals and arrivals[0][0] <= steps:
                    k = arrivals.pop(0)[1]
                    n = rng.randint(1, min(3 * budget, w - 20))
                    r = Request(f"r{k}", [rng.randint(0, 99) for _ in range(n)], rng.randint(1, 12))
                    s.add(r)
                    reqs.append(r)
                    seen[r.request_id] = []
                if reqs and rng.random() < 0.05:  # an abort, waiting or running (maybe mid-prefill)
                    r = rng.choice(reqs)
                    if r.status != "finished":
                        s.abort(r)
                        aborted.add(r.request_id)
                plan = s.schedule()
                partial = [c for c in plan.chunks if not c.final]
                worst = max(worst, len(partial))
                assert len(partial) <= 1, plan.chunks
                assert sum(c.length for c in plan.chunks) <= budget, plan.chunks
                for c in plan.chunks:
                    assert c.length >= 1 and (c.final or c.req.num_prompt_tokens - c.start - c.length >= la), c
                    seen[c.req.request_id].append((c.start, c.length))
                rows = s.num_slots
                out, done = [[] for _ in range(rows)], [False] * rows
                for slot, r in s.running.items():
                    if r.decoding:
                        n = min(r.max_new_tokens, len(r.output) + rng.randint(1, 4))
                        out[slot] = list(r.output) + [7] * (n - len(r.output))
                        done[slot] = n == r.max_new_tokens
                s.update(plan, result(rows, out, done))
                steps += 1
                assert steps < 2000
            for r in reqs:
                spans = seen[r.request_id]
                if r.request_id in aborted and r.finish_reason == "abort":
                    continue
                assert [a for a, _ in spans] == [sum(n for _, n in spans[:i]) for i in range(len(spans))], spans
                assert sum(n for _, n in spans) == r.num_prompt_tokens, (r.request_id, spans)
                assert len(r.output) == r.max_new_tokens
            assert s.pool.num_free == s.pool.capacity and not s.running and not s.prefilling
            return worst

        OUT = [drive(seed) for seed in range(7100, 7160)]
        """
    )
    assert len(out) == 60 and max(out) == 1  # non-final chunks happened, never two in a step


def test_plans_ahead_of_their_updates():
    """The runner's overlap: step 2 is planned before step 1's read. The plan in flight counts in the pages
    (the request is given those of both steps' rounds past its last read length, never past its whole life's
    worst case); an update takes only the requests its plan decoded that still hold their slot, so a request
    admitted into a retired request's slot is not given that row's old tokens; a request ended at a host stop id
    is marked to stop in the next plan."""
    out = _run(
        """
        pool = PagePool(33)
        s = Scheduler(2, pool, max_context=64, page_size=2, rounds_per_step=2, verify_width=2, max_prefill_tokens=64)
        a = Request("a", [1, 2], 3)
        b = Request("b", [3, 4], 20, stop_token_ids=frozenset({9}))
        s.add(a); s.add(b)
        p1 = s.schedule()                    # a, b prefilled (2 tokens + 4 ahead = 3 pages each)
        held1 = [len(a.pages), len(b.pages)]
        p2 = s.schedule()                    # p1 in flight: 2 + 4 + 4 = 10 tokens = 5 pages; a capped at its worst
        held2 = [len(a.pages), len(b.pages)]
        worst = [a.worst_pages, b.worst_pages]
        o1 = s.update(p1, result(2, [[5, 6, 7], [8]], [True, False], seq=[5, 3]))   # a done on the device
        c = Request("c", [7, 7, 7], 4)
        s.add(c)
        p3 = s.schedule()                    # c admitted into a's slot 0
        o2 = s.update(p2, result(2, [[5, 6, 7], [8, 9, 10]], [True, False], seq=[5, 6]))  # b hits its stop id 9
        p4 = s.schedule()
        o3 = s.update(p3, result(2, [[11], [8, 9, 10, 12]], [False, False], seq=[4, 7]))
        OUT = dict(held=[held1, held2], worst=worst, flight=[p1.decode_rows, p2.decode_rows],
                   decoding=[sorted(p2.decoding), sorted(r.request_id for r in p3.decoding.values())],
                   o=[[list(x) for x in o] for o in (o1, o2, o3)], stop=[p3.stop, p4.stop],
                   c=[c.slot, c.output], in_flight=s.in_flight)
        """
    )
    assert out["worst"] == [5, 13]  # ceil(min(64, 2 + 3 + 4) / 2), ceil(min(64, 2 + 20 + 4) / 2)
    assert out["held"] == [[3, 3], [5, 5]]  # a: 5 pages is its worst case already
    assert out["decoding"] == [[0, 1], ["b", "c"]]
    assert out["o"][0] == [["a", [5, 6, 7], True, "length"], ["b", [8], False, None]]
    # step 2's row 0 is a's frozen row: c (admitted into slot 0 after step 2 was planned) takes nothing from it
    assert out["o"][1] == [["b", [9], True, "stop"]]
    assert out["o"][2] == [["c", [11], False, None]]  # b retired: its row in step 3 is not read
    assert out["stop"] == [[], [1]]  # b's row runs on the device until the plan after its stop marks it done
    assert out["c"] == [0, [11]] and out["in_flight"] == 1
