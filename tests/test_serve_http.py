"""The OpenAI-compatible server (``jaxspec.serve``) over loopback with the official ``openai`` client, on the
shipped tiny pair (CPU).

One plain server for the module (8 slots, context 128, pages of 16, a sampling core as the CLI builds) and one
speculative server (the pair's MTP drafter, chain S3 K1 N4). Checks: streaming and non-streaming chat and
completions give the same text, and greedy output equals ``Engine.generate`` on the same prompt ids cut at the
first stop token (plain and speculative); 32 concurrent streaming clients each get exactly their own solo
output; bad input is HTTP 400 with OpenAI's error body naming the field; unknown routes 404; a client that
disconnects mid-stream has its request aborted and its pages freed; ``/v1/models``, ``/health`` and
``/metrics`` (Prometheus text) answer; the extensions ``return_token_ids`` and ``stop_token_ids``.
"""

import json
import re
import socket
import threading
import time
from urllib.parse import urlparse

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from http_helpers import http_request as _http  # noqa: E402
from jaxspec.config import SpecConfig  # noqa: E402
from jaxspec.engine import Engine  # noqa: E402
from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_pair  # noqa: E402
from jaxspec.serve import ServerThread, build_app  # noqa: E402
from jaxspec.serving import ServingEngine  # noqa: E402
from jaxspec.text import Tokenizer  # noqa: E402

MODEL = "tiny-pair"
W, PAGE, BATCH, ROUNDS = 128, 16, 8, 4
TOK = Tokenizer.from_dir(DEFAULT_WEIGHTS)
STOP = set(TOK.eos_token_ids)
_CACHE: dict = {}


def _pair():
    if "pair" not in _CACHE:
        _CACHE["pair"] = load_pair(DEFAULT_WEIGHTS)
    return _CACHE["pair"]


def _solo(ids, max_new: int, stop: bool = True) -> list:
    """``Engine.generate`` of ``ids`` alone (plain, greedy), cut after the first stop token when ``stop``."""
    key = (tuple(ids), max_new)
    if key not in _CACHE:
        if "solo" not in _CACHE:
            _CACHE["solo"] = Engine(_pair(), None, max_context=W, max_batch=1)
        out = _CACHE["solo"].generate([np.array(ids, np.int32)], max_new).tokens[0].tolist()
        assert len(out) == max_new
        _CACHE[key] = out
    out = _CACHE[key]
    if stop:
        cut = next((k for k, t in enumerate(out) if t in STOP), None)
        out = out if cut is None else out[: cut + 1]
    return out


def _text(ids, stop: bool = True) -> str:
    """What the server answers for ``ids``: their text, stop tokens left out when they stop the request."""
    return TOK.decode([i for i in ids if not (stop and i in STOP)], skip_special_tokens=True)


def _serve(drafter: bool):
    m = _pair()
    eng = Engine(m, MTPDrafter(m) if drafter else None, spec=SpecConfig(3, 1, 4) if drafter else None,
                 max_context=W, page_size=PAGE, max_batch=BATCH)
    se = ServingEngine(eng, rounds_per_step=ROUNDS, sampling=True)
    return ServerThread(build_app(se, TOK, MODEL)), se


@pytest.fixture(scope="module")
def server():
    srv, se = _serve(drafter=False)
    yield srv, se
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _metrics(url: str) -> dict:
    """``/metrics`` parsed with prometheus-client's own parser: ``{sample or sample{labels}: value}`` (a counter
    ``x`` is the sample ``x_total``, a histogram ``h`` the samples ``h_bucket{le=...}``, ``h_sum``, ``h_count``);
    every family is a typed gauge, counter or histogram."""
    status, headers, body = _http(url, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.type in ("gauge", "counter", "histogram"), (family.name, family.type)
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def _histogram(metrics: dict, name: str) -> tuple[list, float, float]:
    """``([(le, cumulative count)] in order of le, sum, count)`` of histogram ``name``."""
    buckets = sorted((float(k.split('le="')[1].rstrip('"}')), v) for k, v in metrics.items()
                     if k.startswith(name + "_bucket{"))
    return buckets, metrics[name + "_sum"], metrics[name + "_count"]


def _complete(client, prompt, max_tokens, stream, **kw):
    """``(text, finish_reason, completion_tokens)`` of one ``/v1/completions``."""
    if not stream:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    pieces, reason, usage = [], None, None
    for ch in client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stream=True, stream_options={"include_usage": True}, **kw):
        if ch.choices:
            assert reason is None  # nothing after the finish reason but the usage
            pieces.append(ch.choices[0].text)
            reason = ch.choices[0].finish_reason
        else:
            usage = ch.usage
    return "".join(pieces), reason, usage.completion_tokens


def _chat(client, content, max_tokens, stream):
    msgs = [{"role": "user", "content": content}]
    if not stream:
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens, temperature=0)
        assert r.choices[0].message.role == "assistant"
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens
    pieces, reason, usage, roles = [], None, None, []
    for ch in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True}):
        if ch.choices:
            d = ch.choices[0].delta
            roles += [d.role] if d.role else []
            pieces.append(d.content or "")
            reason = ch.choices[0].finish_reason or reason
        else:
            usage = ch.usage
    assert roles == ["assistant"]
    return "".join(pieces), reason, usage.completion_tokens


def _want(ids, max_tokens, stop=True):
    out = _solo(ids, max_tokens, stop)
    return _text(out, stop), "stop" if out[-1] in STOP and stop else "length", len(out)


CASES = [("count: 1 2 3", 20), ("count: 5 6 7", 6), ("the cat sat", 30)]


def _check_server(client):
    for prompt, n in CASES:
        want = _want(TOK.encode(prompt), n)
        for stream in (False, True):
            assert _complete(client, prompt, n, stream) == want, (prompt, stream)
        ids = TOK.encode_chat([{"role": "user", "content": prompt}])
        want = _want(ids, n)
        for stream in (False, True):
            assert _chat(client, prompt, n, stream) == want, (prompt, stream)


def test_stream_and_plain_equal_engine_generate(client):
    """Chat and completions, streamed and not: the same text, usage and finish reason, equal to the plain
    engine's greedy output on the same prompt ids (cut at the first stop token)."""
    _check_server(client)
    assert _want(TOK.encode("count: 1 2 3"), 20)[1] == "stop"  # the cases stop on the stop token and on length
    assert _want(TOK.encode("count: 5 6 7"), 6)[1] == "length"


def test_token_id_prompt_stop_string_and_ignore_eos(client):
    """A prompt of token ids, a stop string (streamed text held back until it cannot start a stop), and
    ``ignore_eos`` (decoding past the stop token)."""
    ids = TOK.encode("count: 1 2 3")
    assert _complete(client, ids, 20, False) == _want(ids, 20)
    full = _want(ids, 20)[0]
    assert " 7" in full
    for stream in (False, True):
        text, reason, _ = _complete(client, "count: 1 2 3", 20, stream, stop=[" 7", "zz"])
        assert (text, reason) == (full[: full.index(" 7")], "stop")
        assert _complete(client, ids, 40, stream, extra_body={"ignore_eos": True}) == _want(ids, 40, stop=False)
    assert any(t in STOP for t in _solo(ids, 40, stop=False)[:-1])  # it did decode past a stop token


def test_token_ids_and_stop_token_ids(server, client):
    """``return_token_ids``: the reply's token ids (streamed: each chunk's, in order; the stop token included),
    their count the usage's; ``stop_token_ids`` with ``ignore_eos`` ends the reply at the first of those ids."""
    ids = TOK.encode("count: 1 2 3")
    full = _solo(ids, 40, stop=False)
    stop_at = full[5]
    want = full[: full.index(stop_at) + 1]
    kw = {"return_token_ids": True, "ignore_eos": True, "stop_token_ids": [stop_at]}
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=40, temperature=0, extra_body=kw)
    assert (r.choices[0].token_ids, r.choices[0].finish_reason, r.usage.completion_tokens) == (want, "stop", len(want))
    assert r.choices[0].text == _text(want[:-1], stop=False)
    got, usage = [], None
    for ch in client.completions.create(model=MODEL, prompt=ids, max_tokens=40, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body=kw):
        if ch.choices:
            got.append(ch.choices[0].token_ids)
        else:
            usage = ch.usage
    assert sum(got, []) == want and usage.completion_tokens == len(want)
    assert len([g for g in got if g]) > 1  # more than one chunk carried tokens (one per step, not one in all)
    status, _, raw = _http(server[0].url, "POST", "/v1/completions", json.dumps(
        {"model": MODEL, "prompt": "ab", "stop_token_ids": [-1]}).encode())
    assert status == 400 and json.loads(raw)["error"]["param"] == "stop_token_ids"


def test_speculative_server_equals_plain_engine():
    """The same through a server over the MTP chain engine: lossless (plain greedy output), and it speculates
    (more than one token per round)."""
    srv, _ = _serve(drafter=True)
    try:
        _check_server(openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120))
        assert _metrics(srv.url)["jaxspec_mean_accept_length"] > 1.0
    finally:
        srv.stop()


def test_32_concurrent_streams_get_their_own_tokens(server, client):
    """32 streaming clients at once (4 times the slots: requests wait for a slot): each one's text, usage and
    finish reason equal its prompt's solo greedy output; afterwards every page is free."""
    url, se = server[0].url, server[1]
    before = _metrics(url)
    n = 32
    jobs = [(f"count: {i} {i + 1} {i + 2}", 8 + i % 13, i % 3 == 0) for i in range(1, n + 1)]
    got = [None] * n
    barrier = threading.Barrier(n)

    def one(k):
        prompt, max_tokens, ignore = jobs[k]
        barrier.wait()
        try:
            got[k] = _complete(client, prompt, max_tokens, True, extra_body={"ignore_eos": ignore})
        except Exception as e:  # noqa: BLE001 -- reported by the main thread
            got[k] = e

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k, (prompt, max_tokens, ignore) in enumerate(jobs):
        assert got[k] == _want(TOK.encode(prompt), max_tokens, stop=not ignore), (k, prompt, got[k])
    after = _metrics(url)
    assert after["jaxspec_kv_pages_in_use"] == 0 and after["jaxspec_requests_running"] == 0
    assert after["jaxspec_kv_pages_total"] == se.pool.capacity
    done = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("jaxspec_requests_finished_total"))
    assert done == n
    tokens = sum(g[2] for g in got)
    assert after["jaxspec_generated_tokens_total"] - before["jaxspec_generated_tokens_total"] >= tokens


# (fields over a good body, the param named); a body that is not a JSON object names no field
BAD_FIELDS = [
    ({"model": "gpt-4"}, "model"), ({"model": None}, "model"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": W}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k"), ({"n": 2}, "n"), ({"seed": -1}, "seed"),
    ({"stream": "yes"}, "stream"), ({"stop": [""]}, "stop"), ({"logprobs": 3}, "logprobs"),
]
NOT_OBJECTS = [b'{"model": "tiny-pair", "prompt": "ab"', b"[1, 2]", b"\xff"]
BAD_PROMPTS = {  # what overflows the context or is no prompt
    "/v1/completions": [({"prompt": [3] * 200}, "prompt"), ({"prompt": [3] * (W - 1)}, "prompt"),
                        ({"prompt": [99999]}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": None}, "prompt")],
    "/v1/chat/completions": [({"messages": [{"role": "user", "content": "a" * W}]}, "messages"),
                             ({"messages": []}, "messages"), ({"messages": [{"content": "ab"}]}, "messages")],
}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_requests_are_400_naming_the_field(server, client, path):
    """Each bad body: HTTP 400, OpenAI's error object (message, type, param, code) with ``param`` the field
    (None for a body that is not a JSON object). Then a good request still works; unknown routes are 404 and a
    wrong method 405, with the same error shape."""
    url = server[0].url
    good = ({"model": MODEL, "prompt": "ab"} if path == "/v1/completions" else
            {"model": MODEL, "messages": [{"role": "user", "content": "ab"}]})
    cases = [(b, None) for b in NOT_OBJECTS]
    cases += [(json.dumps({**good, **f}).encode(), p) for f, p in BAD_FIELDS + BAD_PROMPTS[path]]
    assert b"NaN" in cases[len(NOT_OBJECTS) + 6][0]  # JSON's NaN literal, which Python's json reads
    for body, param in cases:
        status, headers, raw = _http(url, "POST", path, body)
        assert status == 400, (body, raw)
        assert headers["Content-Type"].startswith("application/json")
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["param"] == param and err["message"], (body, err)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="gpt-4", prompt="ab", max_tokens=2)
    assert e.value.status_code == 400 and e.value.param == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ab"}], top_p=0)
    assert e.value.param == "top_p"
    assert _complete(client, "count: 1 2 3", 20, False) == _want(TOK.encode("count: 1 2 3"), 20)
    for method, route, code in [("GET", "/v1/nothing", 404), ("POST", "/v2/completions", 404),
                                ("GET", "/v1/completions", 405)]:
        status, _, raw = _http(url, method, route)
        assert status == code and set(json.loads(raw)["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL, input="ab")


def test_disconnect_mid_stream_frees_pages(server):
    """A client that closes its connection after the first streamed tokens: its request is aborted (the
    abort counter grows) and every page is free again within a bounded wait; the server still answers."""
    url = server[0].url
    u = urlparse(url)
    aborts = _metrics(url).get('jaxspec_requests_finished_total{finish_reason="abort"}', 0)
    body = json.dumps({"model": MODEL, "prompt": "abc", "max_tokens": W - 8, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    seen = b""
    while b'"text": "' not in seen:
        chunk = s.recv(4096)
        assert chunk, seen
        seen += chunk
    assert seen.startswith(b"HTTP/1.1 200")
    s.close()
    deadline = time.monotonic() + 60
    while True:
        m = _metrics(url)
        if m["jaxspec_kv_pages_in_use"] == 0 and m["jaxspec_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert m.get('jaxspec_requests_finished_total{finish_reason="abort"}', 0) == aborts + 1
    status, _, raw = _http(url, "GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}


def test_models_health_metrics(server, client):
    """``/v1/models`` lists the served name; ``/health`` is ok; ``/metrics`` is Prometheus text with the
    engine's counters."""
    url, se = server
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].object == "model"
    status, _, raw = _http(url.url, "GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}
    m = _metrics(url.url)
    for name in ("jaxspec_mean_accept_length", "jaxspec_generated_tokens_total", "jaxspec_decode_rounds_total",
                 "jaxspec_generation_tokens_per_second", "jaxspec_requests_running", "jaxspec_requests_waiting",
                 "jaxspec_kv_pages_in_use", "jaxspec_kv_pages_total"):
        assert name in m, name
    assert m["jaxspec_kv_pages_total"] == se.pool.capacity > 0
    assert m["jaxspec_requests_waiting"] == 0


HISTOGRAMS = ("jaxspec_time_to_first_token_seconds", "jaxspec_inter_token_latency_seconds",
              "jaxspec_e2e_request_latency_seconds", "jaxspec_request_queue_time_seconds", "jaxspec_spec_accept_length")


def test_latency_histograms(server, client):
    """``/metrics`` carries the latency histograms (cumulative buckets up to ``+Inf`` = the count): after four
    completions, time to first token, end-to-end latency and queue time gained one observation per request,
    inter-token latency one per token after each request's first output (so fewer than the tokens less one per
    request, and some), the accept length one per decode round (plain decoding: every round accepts 1, so its
    sum equals its count), and the latencies are positive and ordered (a request's first token comes before its
    end)."""
    url = server[0].url
    before = _metrics(url)
    tokens = sum(_complete(client, f"count: {i}", 12 + i, i % 2 == 0, extra_body={"ignore_eos": True})[2]
                 for i in range(4))
    after = _metrics(url)
    delta = {}
    for name in HISTOGRAMS:
        buckets, total, count = _histogram(after, name)
        assert buckets[-1][0] == float("inf") and buckets[-1][1] == count, name
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), (name, buckets)  # cumulative
        old = _histogram(before, name) if name + "_count" in before else ([], 0.0, 0.0)
        delta[name] = (count - old[2], total - old[1])
    for name in ("jaxspec_time_to_first_token_seconds", "jaxspec_e2e_request_latency_seconds",
                 "jaxspec_request_queue_time_seconds"):
        assert delta[name][0] == 4, (name, delta[name])
    assert 0 < delta["jaxspec_inter_token_latency_seconds"][0] <= tokens - 4
    assert 0 < delta["jaxspec_time_to_first_token_seconds"][1] < delta["jaxspec_e2e_request_latency_seconds"][1]
    assert delta["jaxspec_request_queue_time_seconds"][1] >= 0
    rounds = after["jaxspec_decode_rounds_total"] - before["jaxspec_decode_rounds_total"]
    assert delta["jaxspec_spec_accept_length"] == (rounds, rounds) and rounds > 0
