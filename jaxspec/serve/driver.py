"""The one thread that owns a ``ServingEngine`` (it is not thread-safe).

``EngineDriver(se)`` runs a loop on a background thread: it takes submissions and cancels from a thread-safe
queue, calls ``se.step()`` while any request is unfinished, and hands each ``RequestOutput`` to the request's
``asyncio.Queue`` with ``loop.call_soon_threadsafe``; with nothing unfinished it sleeps on the queue.

Events a request's queue receives, in order: ``("accepted", None)`` or ``("error", ValueError)`` (the core
refused it: nothing follows); then ``("tokens", new_token_ids, finished, finish_reason)`` per step that
produced tokens or ended it. ``("failed", message)`` when a step raised: the driver then refuses everything
(``failed`` holds the message) and ``/health`` reports it.
"""

import asyncio
import collections
import dataclasses
import queue
import threading
import time

from jaxspec.serving import RequestParams, ServingEngine


@dataclasses.dataclass(eq=False)
class Submission:
    """One request on its way to the driver: what to submit and where its events go."""

    prompt_ids: list
    params: RequestParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    request_id: str | None = None  # set by the driver once submitted

    def post(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class EngineDriver:
    """Owns ``serving_engine`` on one thread (module docstring). ``start()``, ``stop()``, ``submit`` /
    ``cancel`` from any thread; ``stats()``: the last ``ServingEngine.stats()`` snapshot, ``busy_seconds``
    (time spent in ``step``) and ``finished`` (finish reason -> count)."""

    def __init__(self, serving_engine: ServingEngine):
        if not isinstance(serving_engine, ServingEngine):
            raise ValueError(f"serving_engine: expected a jaxspec.serving.ServingEngine, got "
                             f"{type(serving_engine).__name__}")
        self.se = serving_engine
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="jaxspec-serve-engine", daemon=True)
        self._active: dict[str, Submission] = {}
        self._lock = threading.Lock()
        self._stats = serving_engine.stats()
        self.busy_seconds = 0.0
        self.finished: collections.Counter = collections.Counter()
        self.failed: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout)

    def submit(self, sub: Submission) -> None:
        self._inbox.put(("submit", sub))

    def cancel(self, sub: Submission) -> None:
        self._inbox.put(("cancel", sub))

    def stats(self):
        with self._lock:
            return self._stats, self.busy_seconds, dict(self.finished)

    # ---------------------------------------------------------------- the driver thread
    def _handle(self, kind, sub) -> bool:
        se = self.se
        if kind == "stop":
            return False
        if kind == "submit":
            if self.failed is not None:
                sub.post(("failed", self.failed))
                return True
            try:
                h = se.submit(sub.prompt_ids, sub.params)
            except ValueError as e:
                sub.post(("error", e))
                return True
            sub.request_id = h.request_id
            self._active[h.request_id] = sub
            sub.post(("accepted", None))
        elif kind == "cancel" and sub.request_id in self._active:
            del self._active[sub.request_id]
            se.cancel(sub.request_id)
            with self._lock:
                self.finished["abort"] += 1
        return True

    def _publish(self) -> None:
        with self._lock:
            self._stats = self.se.stats()

    def _run(self) -> None:
        se = self.se
        while True:
            try:
                item = self._inbox.get(block=not se.has_unfinished() or self.failed is not None)
            except queue.Empty:
                item = None
            items = [] if item is None else [item]
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if not all(self._handle(*it) for it in items):
                return
            if self.failed is None and se.has_unfinished():
                t0 = time.perf_counter()
                try:
                    outs = se.step()
                except Exception as e:  # noqa: BLE001 -- every waiting client is told, then the driver refuses
                    self.failed = f"the serving engine failed: {type(e).__name__}: {e}"
                    for sub in self._active.values():
                        sub.post(("failed", self.failed))
                    self._active.clear()
                    continue
                with self._lock:
                    self.busy_seconds += time.perf_counter() - t0
                for o in outs:
                    sub = self._active.get(o.request_id)
                    if sub is None:
                        continue
                    sub.post(("tokens", list(o.new_token_ids), o.finished, o.finish_reason))
                    if o.finished:
                        del self._active[o.request_id]
                        with self._lock:
                            self.finished[o.finish_reason] += 1
            self._publish()
