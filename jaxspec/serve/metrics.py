"""The server's ``/metrics``: Prometheus text through ``prometheus-client`` (the ``serve`` extra).

Counters and gauges of the core and the driver, read at scrape time (``jaxspec_generated_tokens_total``,
``jaxspec_decode_rounds_total``, ``jaxspec_requests_finished_total{finish_reason}``,
``jaxspec_mean_accept_length``, ``jaxspec_generation_tokens_per_second``, ``jaxspec_requests_running`` /
``_waiting``, ``jaxspec_kv_pages_in_use`` / ``_total``), and the latency histograms vLLM's and SGLang's
operators scrape, observed by the driver after each step from the core's request times
(``Request.arrival_time`` at submit, ``scheduled_time`` at admission, the step's read time for its tokens):

* ``jaxspec_time_to_first_token_seconds``: submit to the read that returned a request's first token;
* ``jaxspec_inter_token_latency_seconds``: per token after the first output, the time since the request's
  previous output divided by the tokens this one carries (one observation per token: a speculative step
  that returns three tokens observes a third of its interval three times);
* ``jaxspec_e2e_request_latency_seconds``: submit to finish (any reason, abort included);
* ``jaxspec_request_queue_time_seconds``: submit to admission into a slot (observed at the first output);
* ``jaxspec_spec_accept_length``: tokens a decode round committed (per request and step, the step's mean
  over its rounds, observed once per round; plain decoding: 1).
"""

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
                 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


class _Stats:
    """The scrape-time counters and gauges, from ``stats()`` = ``(ServingStats, busy seconds, finished)``."""

    def __init__(self, stats):
        self._stats = stats

    def collect(self):
        st, busy, finished = self._stats()
        gauges = [
            ("jaxspec_mean_accept_length", "tokens committed per decode round (cumulative mean)",
             st.mean_accept_length),
            ("jaxspec_generation_tokens_per_second", "generated tokens per second of engine step time",
             st.generated_tokens / busy if busy > 0 else 0.0),
            ("jaxspec_requests_running", "requests in a batch slot", st.running),
            ("jaxspec_requests_waiting", "requests queued for a slot or pages", st.waiting),
            ("jaxspec_kv_pages_in_use", "KV pages held by requests", st.pages_in_use),
            ("jaxspec_kv_pages_total", "KV pages of the pool", st.pages_total),
        ]
        for name, help_, value in gauges:
            yield GaugeMetricFamily(name, help_, value=float(value))
        yield CounterMetricFamily("jaxspec_generated_tokens", "tokens generated", value=st.generated_tokens)
        yield CounterMetricFamily("jaxspec_decode_rounds", "decode rounds run", value=st.rounds)
        reasons = CounterMetricFamily("jaxspec_requests_finished", "requests ended, by finish reason",
                                      labels=["finish_reason"])
        for reason, n in sorted(finished.items()):
            reasons.add_metric([reason], n)
        yield reasons


class ServerMetrics:
    """One server's registry (module docstring): ``stats()`` gives the counters at scrape time, ``observe``
    takes a step's outputs, ``render()`` is the exposition text."""

    def __init__(self, stats):
        self.registry = CollectorRegistry()
        kw = dict(registry=self.registry)
        self.ttft = Histogram("jaxspec_time_to_first_token_seconds", "time to first token (submit to its read)",
                              buckets=LATENCY_BUCKETS, **kw)
        self.itl = Histogram("jaxspec_inter_token_latency_seconds", "time per output token after the first",
                             buckets=TOKEN_BUCKETS, **kw)
        self.e2e = Histogram("jaxspec_e2e_request_latency_seconds", "request latency (submit to finish)",
                             buckets=LATENCY_BUCKETS, **kw)
        self.queue = Histogram("jaxspec_request_queue_time_seconds", "time waiting for a slot (submit to admission)",
                               buckets=LATENCY_BUCKETS, **kw)
        self.accept = Histogram("jaxspec_spec_accept_length", "tokens committed per decode round",
                                buckets=ACCEPT_BUCKETS, **kw)
        self.registry.register(_Stats(stats))

    def observe(self, req, new_tokens: int, finished: bool, seen: dict) -> None:
        """One step's output of ``req`` (a ``serving.Request``: its times and counters) carrying ``new_tokens``;
        ``seen`` is the driver's record of the request (``last``: the previous output's time, ``rounds`` /
        ``accepted``: the counters then), updated here."""
        now = req.last_token_time
        if new_tokens and now is not None:
            last = seen.get("last")
            if last is None:
                self.ttft.observe(now - req.arrival_time)
                if req.scheduled_time is not None:
                    self.queue.observe(req.scheduled_time - req.arrival_time)
            else:
                per = (now - last) / new_tokens
                for _ in range(new_tokens):
                    self.itl.observe(per)
            seen["last"] = now
        rounds, accepted = req.rounds - seen.get("rounds", 0), req.accepted - seen.get("accepted", 0)
        if rounds > 0:
            mean = accepted / rounds
            for _ in range(rounds):
                self.accept.observe(mean)
        seen["rounds"], seen["accepted"] = req.rounds, req.accepted
        if finished and req.finished_time is not None:
            self.e2e.observe(req.finished_time - req.arrival_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
