"""The one thread that owns a ``ServingEngine`` (it is not thread-safe).

``EngineDriver(se)`` runs a loop on a background thread: it takes submissions and cancels from a thread-safe
queue (blocking on it while nothing is unfinished, so a request arriving at an idle server is taken at once),
calls ``se.step()`` while any request is unfinished, and hands each step's outputs to the event loop of the
requests in one ``loop.call_soon_threadsafe`` per loop and step (not one per request or token), then lets go of
the GIL for ``HANDOFF_S`` so that they are written before the next step's dispatch.

A ``Submission`` is a request's mailbox, written on its event loop only: ``await sub.wait()`` returns every
event that came since the last call (a slow reader gets several steps' tokens at once). Events, in order:
``("accepted", None)``, ``("error", exception)`` (the core's ``submit`` refused it, whatever the exception's
type: that request alone is answered, the core goes on) or ``("busy", message)`` (``max_queued_requests``
requests already wait beyond the free batch slots); nothing follows a refusal. Then
``("tokens", new_token_ids, finished, finish_reason)`` per step that produced tokens or ended it.
``("failed", message)`` when a step raised: the driver then refuses everything (``failed`` holds the message)
and ``/health`` reports it. The caller ends each accepted request with ``end(sub, reason)`` (the finish reason
its reply gave, or ``"abort"``): that counts it in ``finished`` and, for a request the core has not finished,
cancels it there; ``drop(sub)`` when the caller left before the driver's answer (cancelled and counted as an
abort if it was accepted).
"""

import asyncio
import collections
import dataclasses
import queue
import threading
import time

from jaxspec.serve.metrics import ServerMetrics
from jaxspec.serving import RequestHandle, RequestParams, ServingEngine


# After posting a step's tokens the driver sleeps this long, so that the event loop's thread takes the GIL and
# writes them before the next step's host-side dispatch (Python, GIL held for ~2.5 ms a step on an H200 host)
# delays them; without it a chunk waited for that dispatch. Costs ~0.1 ms of a step (~1-2%).
HANDOFF_S = 1e-4
DEFAULT_MAX_QUEUED_REQUESTS = 256  # requests that may wait beyond the free batch slots


@dataclasses.dataclass(eq=False)
class Submission:
    """One request on its way to the driver: what to submit, and its mailbox on ``loop``."""

    prompt_ids: list
    params: RequestParams
    loop: asyncio.AbstractEventLoop
    request_id: str | None = None  # set by the driver once submitted
    handle: RequestHandle | None = None  # the core's handle (its request's times and counters) while it runs
    seen: dict = dataclasses.field(default_factory=dict)  # what the metrics have observed of it (ServerMetrics)
    _events: list = dataclasses.field(default_factory=list)
    _waiter: asyncio.Future | None = None

    def _put(self, event) -> None:  # on the loop's thread
        self._events.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> list:
        """Every event since the last call (at least one; waits for it)."""
        while not self._events:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        events, self._events = self._events, []
        return events


def _deliver(batch) -> None:
    for sub, event in batch:
        sub._put(event)


class EngineDriver:
    """Owns ``serving_engine`` on one thread (module docstring). ``start()``, ``stop()``, ``submit`` / ``end``
    from any thread; ``stats()``: the last ``ServingEngine.stats()`` snapshot, ``busy_seconds`` (time spent in
    ``step``) and ``finished`` (finish reason -> count); ``metrics``: the ``ServerMetrics`` it observes each
    step's outputs into (``/metrics``). ``max_queued_requests``: how many requests may wait beyond the free
    batch slots; one more is refused (``"busy"``)."""

    def __init__(self, serving_engine: ServingEngine, max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS):
        if not isinstance(serving_engine, ServingEngine):
            raise ValueError(f"serving_engine: expected a jaxspec.serving.ServingEngine, got "
                             f"{type(serving_engine).__name__}")
        q = max_queued_requests
        if not isinstance(q, int) or isinstance(q, bool) or q < 0:
            raise ValueError(f"max_queued_requests: expected an int >= 0, got {q!r}")
        self.max_queued_requests = q
        self.se = serving_engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="jaxspec-serve-engine", daemon=True)
        self._active: dict[str, Submission] = {}
        self._lock = threading.Lock()
        self._stats = serving_engine.stats()
        self.busy_seconds = 0.0
        self.finished: collections.Counter = collections.Counter()
        self.failed: str | None = None
        self.metrics = ServerMetrics(self.stats)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout)

    def submit(self, sub: Submission) -> None:
        self._inbox.put(("submit", sub))

    def end(self, sub: Submission, reason: str, cancel: bool) -> None:
        """An accepted request is over: count it under ``reason``; ``cancel``: the core has not finished it
        (a stop string, a disconnect, a failure), so it is cancelled there."""
        with self._lock:
            self.finished[reason] += 1
        if cancel:
            self._inbox.put(("cancel", sub))

    def drop(self, sub: Submission) -> None:
        """The caller left before its answer: cancel the request if it was accepted (counted as an abort)."""
        self._inbox.put(("drop", sub))

    def stats(self):
        with self._lock:
            return self._stats, self.busy_seconds, dict(self.finished)

    # ---------------------------------------------------------------- the driver thread
    @staticmethod
    def _post(posts) -> None:
        """Hand ``[(sub, event)]`` to their loops: one callback per loop."""
        by_loop = collections.defaultdict(list)
        for sub, event in posts:
            by_loop[sub.loop].append((sub, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def _handle(self, kind, sub, posts) -> bool:
        se = self.se
        if kind == "stop":
            return False
        if kind == "submit":
            if self.failed is not None:
                posts.append((sub, ("failed", self.failed)))
                return True
            st = se.stats()
            if st.waiting >= self.max_queued_requests + st.num_slots - st.running:
                posts.append((sub, ("busy", f"the server is busy: {st.waiting} requests wait for a batch slot "
                                            f"(max_queued_requests={self.max_queued_requests}); retry later")))
                return True
            try:
                h = se.submit(sub.prompt_ids, sub.params)
            except Exception as e:  # noqa: BLE001 -- a refusal of this request alone, whatever its type
                posts.append((sub, ("error", e)))
                return True
            sub.request_id, sub.handle = h.request_id, h
            self._active[h.request_id] = sub
            posts.append((sub, ("accepted", None)))
        elif kind in ("cancel", "drop") and sub.request_id in self._active:
            del self._active[sub.request_id]
            se.cancel(sub.request_id)
            self.metrics.observe(sub.handle.request, 0, True, sub.seen)
            sub.handle = None  # the core keeps nothing of a request it has served; nor does the driver
            if kind == "drop":
                with self._lock:
                    self.finished["abort"] += 1
        return True

    def _fail(self, e: Exception) -> list:
        """Refuse from now on; every running request is told."""
        self.failed = f"the serving engine failed: {type(e).__name__}: {e}"
        posts = [(sub, ("failed", self.failed)) for sub in self._active.values()]
        for sub in self._active.values():
            sub.handle = None
        self._active.clear()
        return posts

    def _step(self) -> list:
        se, posts = self.se, []
        t0 = time.perf_counter()
        try:
            outs = se.step()
        except Exception as e:  # noqa: BLE001 -- every waiting client is told, then the driver refuses
            return self._fail(e)
        dt = time.perf_counter() - t0
        for o in outs:
            sub = self._active.get(o.request_id)
            if sub is None:
                continue
            posts.append((sub, ("tokens", o.new_token_ids, o.finished, o.finish_reason)))
            self.metrics.observe(sub.handle.request, len(o.new_token_ids), o.finished, sub.seen)
            if o.finished:
                del self._active[o.request_id]
                sub.handle = None
        stats = se.stats()
        with self._lock:
            self.busy_seconds += dt
            self._stats = stats
        return posts

    def _run(self) -> None:
        se = self.se
        while True:
            items = []
            if self.failed is not None or not se.has_unfinished():
                items.append(self._inbox.get())  # idle: sleep until something arrives
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            posts = []
            try:
                running = all(self._handle(*it, posts) for it in items)
            except Exception as e:  # noqa: BLE001 -- a cancel that raised: the core's state is unknown
                posts += self._fail(e)
                running = True
            self._post(posts)  # acceptances go out before the step runs
            if not running:
                return
            if items:
                with self._lock:
                    self._stats = se.stats()
            if self.failed is None and se.has_unfinished():
                posts = self._step()
                self._post(posts)
                if posts:  # hand the GIL over: the loop writes these tokens before the next step's dispatch holds it
                    time.sleep(HANDOFF_S)
