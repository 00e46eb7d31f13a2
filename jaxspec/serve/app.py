"""The aiohttp application: OpenAI's chat and text completions over an ``EngineDriver``.

``build_app(serving_engine, tokenizer, model_name)``: ``/v1/chat/completions`` (the checkpoint's chat template,
stopping at ``tokenizer.chat_stop_token_ids``), ``/v1/completions`` (raw text or token ids, stopping at
``tokenizer.eos_token_ids``), ``/v1/models``, ``/health``, ``/metrics`` (Prometheus text: counters, gauges and
latency histograms, ``serve.metrics``). ``stream: true``
answers with server-sent events in OpenAI's chunk shapes. A client that disconnects cancels its request.
Each reply's text, ``token_ids``, usage and finish reason come from one ``jaxspec.text.Reply`` fed the core's
tokens step by step (streamed or not): it ends the reply at a stop string, where the core ends it at a stop
token or ``max_new_tokens`` (a reply a stop string ended is cancelled in the core).

Every refusal is OpenAI's JSON error body (``{"error": {"message", "type", "param", "code"}}``): bad input 400
(``protocol.RequestError``, naming the field), unknown routes 404, a wrong method 405, a body not read whole
within ``body_timeout_s`` 408, a body over ``max_body_bytes`` 413, a full queue (``max_queued_requests``
requests already waiting beyond the free batch slots) 429, an internal error 500, a failed engine 503.
Bodies are parsed and prompts tokenized off the event loop (a prompt too long for the context is refused
before it is tokenized). ``ServerThread(app)`` runs an app on a thread of its own and gives its ``url``.
"""

import asyncio
import json
import logging
import threading
import time
import uuid

from aiohttp import web

from jaxspec.serve import protocol
from jaxspec.serve.driver import DEFAULT_MAX_QUEUED_REQUESTS, EngineDriver, Submission
from jaxspec.serve.metrics import CONTENT_TYPE
from jaxspec.serving import ServingEngine
from jaxspec.text import Reply, Tokenizer

DRIVER = web.AppKey("driver", EngineDriver)
BODY_TIMEOUT = web.AppKey("body_timeout_s", float)
MAX_BODY = web.AppKey("max_body_bytes", int)
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB, aiohttp's own default
DEFAULT_BODY_TIMEOUT_S = 30.0
_log = logging.getLogger("jaxspec.serve")


def _error(status: int, message: str, param=None, kind: str = "invalid_request_error", code=None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}},
                             status=status)


class _Refused(Exception):
    """A refusal that is not about a field: an HTTP ``status`` with OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str, code=None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


@web.middleware
async def _errors(request, handler):
    try:
        return await handler(request)
    except protocol.RequestError as e:
        return _error(400, e.message, e.param)
    except _Refused as e:
        return _error(e.status, e.message, None, e.kind, e.code)
    except web.HTTPNotFound:
        return _error(404, f"Invalid URL ({request.method} {request.path})")
    except web.HTTPMethodNotAllowed:
        return _error(405, f"Method not allowed ({request.method} {request.path})")
    except web.HTTPException as e:
        return _error(e.status, e.reason or e.text or "refused", None,
                      "invalid_request_error" if e.status < 500 else "server_error")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 -- logged; the client gets the JSON error, not aiohttp's text page
        _log.exception("error in %s %s", request.method, request.path)
        return _error(500, f"internal server error: {type(e).__name__}", None, "server_error")


class _Chunks:
    """The server-sent events of one streamed reply as bytes, in OpenAI's chunk shapes; the fixed part of a
    content chunk is encoded once (a chunk costs one ``json.dumps`` of its text)."""

    def __init__(self, rid: str, name: str, chat: bool, include_usage: bool, token_ids: bool):
        self.top = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()), "model": name}
        self.chat, self.include_usage, self.token_ids = chat, include_usage, token_ids
        head = json.dumps(self.top)[:-1] + ', "choices": [{"index": 0, '
        self._head = b"data: " + (head + ('"delta": {"content": ' if chat else '"text": ')).encode()
        self._mid = (b"}" if chat else b"") + b', "logprobs": null, "finish_reason": '
        self._tail = b"}]" + (b', "usage": null' if include_usage else b"") + b"}\n\n"

    def event(self, choice=None, usage=None) -> bytes:
        """Any chunk: ``choice`` (None: no choices, the usage chunk)."""
        body = dict(self.top, choices=[] if choice is None else [choice])
        if self.include_usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    def role(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        if self.token_ids:
            choice["token_ids"] = []
        return self.event(choice)

    def content(self, piece: str, ids: list, reason: str | None = None) -> bytes:
        """A chunk of new text (and, asked for, its token ids); ``reason`` on the last one."""
        if reason is not None and not piece:  # OpenAI's closing chunk: an empty delta
            choice = ({"index": 0, "delta": {}} if self.chat else {"index": 0, "text": ""})
            choice.update(logprobs=None, finish_reason=reason)
            if self.token_ids:
                choice["token_ids"] = ids
            return self.event(choice)
        out = self._head + json.dumps(piece).encode() + self._mid
        out += b"null" if reason is None else json.dumps(reason).encode()
        if self.token_ids:
            out += b', "token_ids": ' + json.dumps(ids).encode()
        return out + self._tail


def _server_error(message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "server_error", "param": None, "code": None}},
                             status=500)


async def _run(request, req: protocol.Parsed, chat: bool):
    driver, served = request.app[DRIVER], request.app[SERVED]
    sub = Submission(req.prompt_ids, req.params, asyncio.get_running_loop())
    driver.submit(sub)
    reply = Reply(served.tokenizer, stop_token_ids=req.params.stop_token_ids, stop=req.stop,
                  include_stop_str_in_output=req.include_stop_str, skip_special_tokens=req.skip_special_tokens,
                  min_tokens=req.params.min_tokens)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    try:
        events = await sub.wait()
    except asyncio.CancelledError:  # the client left before the driver answered
        driver.drop(sub)
        raise
    kind, arg = events.pop(0)[:2]
    if kind == "error":
        if isinstance(arg, (ValueError, TypeError, OverflowError)):
            raise protocol.core_error(arg, req)
        _log.error("the serving core refused a request: %s: %s", type(arg).__name__, arg)
        return _server_error(f"the request was refused: {type(arg).__name__}: {arg}")
    if kind == "busy":
        raise _Refused(429, arg, "rate_limit_error", "queue_full")
    if kind == "failed":
        return _error(503, arg, None, "server_error")
    done, reason = False, None
    try:  # from here on a disconnect (the handler cancelled) or an error ends the request
        if req.stream:
            chunks = _Chunks(rid, served.name, chat, req.include_usage, req.return_token_ids)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            if chat:
                await resp.write(chunks.role())
        while reason is None:
            events = events or await sub.wait()  # every step's tokens since the last chunk: one chunk
            ids, finished, why = [], False, None
            for ev in events:
                if ev[0] == "failed":
                    raise RuntimeError(ev[1])
                ids += ev[1]
                finished, why = finished or ev[2], ev[3] or why
            events = []
            delta = reply.push(ids, why if finished else None)  # the reply may end before the core's tokens do
            done, reason = finished, delta.finish_reason
            if not req.stream or not (delta.text or reason or req.return_token_ids and delta.token_ids):
                continue
            out = chunks.content(delta.text, delta.token_ids, reason)
            if reason is not None:  # the last chunk, the usage and [DONE] in one write
                if req.include_usage:
                    out += chunks.event(None, _usage(req, reply))
                out += b"data: [DONE]\n\n"
            await resp.write(out)
        if req.stream:
            await resp.write_eof()
            return resp
        choice = ({"index": 0, "message": {"role": "assistant", "content": reply.text}, "logprobs": None,
                   "finish_reason": reason} if chat
                  else {"index": 0, "text": reply.text, "logprobs": None, "finish_reason": reason})
        if req.return_token_ids:
            choice["token_ids"] = reply.token_ids
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(time.time()), "model": served.name, "choices": [choice],
                                  "usage": _usage(req, reply)})
    finally:  # counted under the reply's reason (a disconnect or a failure: abort); unfinished: cancelled
        driver.end(sub, reason or "abort", cancel=not done)


def _usage(req: protocol.Parsed, reply: Reply) -> dict:
    n, p = len(reply.token_ids), len(req.prompt_ids)
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def _json(raw: bytes):
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise protocol.RequestError(f"the request body is not valid JSON: {e}", None) from None
    except RecursionError:
        raise protocol.RequestError("the request body is not valid JSON: nested too deeply", None) from None


async def _parsed(request, parse):
    """The body read (within the body timeout, at most the size limit), parsed and its prompt tokenized in a
    worker thread: the event loop never waits on a large body, template or tokenizer."""
    timeout = request.app[BODY_TIMEOUT]
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise _Refused(408, f"the request body was not received within {timeout:g} s", "invalid_request_error",
                       "body_timeout") from None
    except web.HTTPRequestEntityTooLarge:
        raise _Refused(413, f"the request body exceeds {request.app[MAX_BODY]} bytes (this server's limit)",
                       "invalid_request_error", "body_too_large") from None
    served = request.app[SERVED]
    return await asyncio.get_running_loop().run_in_executor(None, lambda: parse(_json(raw), served))


async def chat_completions(request):
    return await _run(request, await _parsed(request, protocol.parse_chat), chat=True)


async def completions(request):
    return await _run(request, await _parsed(request, protocol.parse_completion), chat=False)


async def models(request):
    return web.json_response({"object": "list", "data": [
        {"id": request.app[SERVED].name, "object": "model", "created": 0, "owned_by": "jaxspec"}]})


async def health(request):
    failed = request.app[DRIVER].failed
    return web.json_response({"status": "ok"} if failed is None else {"status": "failed", "message": failed},
                             status=200 if failed is None else 503)


async def metrics(request):
    return web.Response(body=request.app[DRIVER].metrics.render(),
                        headers={"Content-Type": CONTENT_TYPE, "X-Content-Type-Options": "nosniff"})


SERVED = web.AppKey("served", protocol.Served)


def build_app(serving_engine: ServingEngine, tokenizer: Tokenizer, model_name: str, *,
              max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> web.Application:
    """The server's ``aiohttp.web.Application`` (module docstring); its ``EngineDriver`` thread starts with
    the app and stops at its cleanup. Limits: ``max_queued_requests`` (requests waiting beyond the free batch
    slots; one more is 429), ``max_body_bytes`` (413 above it), ``body_timeout_s`` (408 for a body not read
    whole in that time)."""
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(f"tokenizer: expected a jaxspec.text.Tokenizer, got {type(tokenizer).__name__}")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name: expected a non-empty str, got {model_name!r}")
    if not isinstance(max_body_bytes, int) or isinstance(max_body_bytes, bool) or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: expected an int >= 1, got {max_body_bytes!r}")
    if (not isinstance(body_timeout_s, (int, float)) or isinstance(body_timeout_s, bool)
            or not 0 < body_timeout_s < float("inf")):
        raise ValueError(f"body_timeout_s: expected a finite number of seconds > 0, got {body_timeout_s!r}")
    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app[DRIVER] = EngineDriver(serving_engine, max_queued_requests)
    app[BODY_TIMEOUT], app[MAX_BODY] = float(body_timeout_s), max_body_bytes
    app[SERVED] = protocol.Served.of(tokenizer, model_name, serving_engine)

    async def start(app):
        app[DRIVER].start()

    async def stop(app):
        await asyncio.get_running_loop().run_in_executor(None, app[DRIVER].stop)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.add_routes([web.post("/v1/chat/completions", chat_completions), web.post("/v1/completions", completions),
                    web.get("/v1/models", models), web.get("/health", health), web.get("/metrics", metrics)])
    return app


class ServerThread:
    """Runs ``app`` on ``host:port`` (0: a free port) on a thread with its own event loop; ``url`` is
    ``http://host:port``; ``stop()`` shuts it down (the app's cleanup included)."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0):
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, handler_cancellation=True)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(host, port, ready), daemon=True,
                                        name="jaxspec-serve-http")
        self._error = None
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error

    def _serve(self, host, port, ready):
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host, port)
            self._loop.run_until_complete(site.start())
            h, p = self._runner.addresses[0][:2]
            self.url = f"http://{h}:{p}"
        except Exception as e:  # noqa: BLE001 -- raised in the caller's thread
            self._error = e
            ready.set()
            return
        ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(60)
