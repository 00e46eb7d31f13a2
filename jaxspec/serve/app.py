"""The aiohttp application: OpenAI's chat and text completions over an ``EngineDriver``.

``build_app(serving_engine, tokenizer, model_name)``: ``/v1/chat/completions`` (the checkpoint's chat template,
stopping at ``tokenizer.chat_stop_token_ids``), ``/v1/completions`` (raw text or token ids, stopping at
``tokenizer.eos_token_ids``), ``/v1/models``, ``/health``, ``/metrics`` (Prometheus text). ``stream: true``
answers with server-sent events in OpenAI's chunk shapes. Bad input: HTTP 400 with OpenAI's error body
(``protocol.RequestError``); unknown routes 404. A client that disconnects cancels its request.
``ServerThread(app)`` runs an app on a thread of its own and gives its ``url``.
"""

import asyncio
import json
import threading
import time
import uuid

from aiohttp import web

from jaxspec.serve import protocol
from jaxspec.serve.driver import EngineDriver, Submission
from jaxspec.serving import ServingEngine
from jaxspec.text import Tokenizer

DRIVER = web.AppKey("driver", EngineDriver)


def _error(status: int, message: str, param=None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                        "code": None}}, status=status)


@web.middleware
async def _errors(request, handler):
    try:
        return await handler(request)
    except protocol.RequestError as e:
        return _error(400, e.message, e.param)
    except web.HTTPNotFound:
        return _error(404, f"Invalid URL ({request.method} {request.path})")
    except web.HTTPMethodNotAllowed:
        return _error(405, f"Method not allowed ({request.method} {request.path})")


class _Stream:
    """Text of one request as it decodes: the detokenizer, the stop ids and stop strings (cut on the host)."""

    def __init__(self, tokenizer: Tokenizer, stop_ids, stop_strings):
        self.detok = tokenizer.detokenizer(skip_special_tokens=True)
        self.stop_ids, self.stops = set(stop_ids), list(stop_strings)
        self.text, self.sent, self.num_tokens, self.cut, self.ids = "", 0, 0, False, []

    def push(self, ids, finished: bool) -> str:
        """The text newly final after ``ids``; ``self.cut`` once a stop string ended it."""
        self.num_tokens += len(ids)
        self.ids += ids
        ids = [i for i in ids if i not in self.stop_ids]
        self.text += self.detok.push(ids)
        if finished:
            self.text += self.detok.finish()
        hold = 0
        for s in self.stops:
            at = self.text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0:
                self.text, self.cut = self.text[:at], True
        if not (finished or self.cut) and self.stops:
            hold = max(len(s) for s in self.stops) - 1
        end = max(self.sent, len(self.text) - hold)
        piece, self.sent = self.text[self.sent:end], end
        return piece


async def _run(request, req: protocol.Parsed, chat: bool):
    driver = request.app[DRIVER]
    loop = asyncio.get_running_loop()
    sub = Submission(req.prompt_ids, req.params, loop, asyncio.Queue())
    driver.submit(sub)
    text = _Stream(request.app[TOKENIZER], req.params.stop_token_ids, req.stop)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    name = request.app[MODEL_NAME]
    done = False
    try:  # from here on a disconnect (the handler cancelled) or an error cancels the request
        first = await sub.events.get()
        if first[0] == "error":
            raise protocol.core_error(first[1], req)
        if first[0] == "failed":
            return web.json_response({"error": {"message": first[1], "type": "server_error", "param": None,
                                                "code": None}}, status=500)
        if req.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)

            async def send(choice, usage=None, choices=True):
                body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": created, "model": name, "choices": [choice] if choices else []}
                if req.include_usage:
                    body["usage"] = usage
                await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")

            if chat:
                await send({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})
        reason = None
        while reason is None:
            ev = await sub.events.get()
            if ev[0] == "failed":
                raise RuntimeError(ev[1])
            _, ids, finished, why = ev
            piece = text.push(ids, finished)
            if text.cut:
                reason = "stop"
            elif finished:
                reason = why
                done = True
            if req.stream and (piece or req.return_token_ids and ids):
                choice = ({"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}
                          if chat else {"index": 0, "text": piece, "logprobs": None, "finish_reason": None})
                if req.return_token_ids:
                    choice["token_ids"] = ids
                await send(choice)
        usage = {"prompt_tokens": len(req.prompt_ids), "completion_tokens": text.num_tokens,
                 "total_tokens": len(req.prompt_ids) + text.num_tokens}
        if req.stream:
            choice = ({"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason} if chat
                      else {"index": 0, "text": "", "logprobs": None, "finish_reason": reason})
            if req.return_token_ids:
                choice["token_ids"] = []
            await send(choice)
            if req.include_usage:
                await send(None, usage, choices=False)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        choice = ({"index": 0, "message": {"role": "assistant", "content": text.text}, "logprobs": None,
                   "finish_reason": reason} if chat
                  else {"index": 0, "text": text.text, "logprobs": None, "finish_reason": reason})
        if req.return_token_ids:
            choice["token_ids"] = text.ids
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": created, "model": name, "choices": [choice], "usage": usage})
    finally:
        if not done:  # a stop string, a disconnect or a failure: the request ends here
            driver.cancel(sub)


async def _body(request):
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise protocol.RequestError(f"the request body is not valid JSON: {e}", None) from None


async def chat_completions(request):
    req = protocol.parse_chat(await _body(request), request.app[TOKENIZER], request.app[MODEL_NAME],
                              request.app[DRIVER].se)
    return await _run(request, req, chat=True)


async def completions(request):
    req = protocol.parse_completion(await _body(request), request.app[TOKENIZER], request.app[MODEL_NAME],
                                    request.app[DRIVER].se)
    return await _run(request, req, chat=False)


async def models(request):
    return web.json_response({"object": "list", "data": [
        {"id": request.app[MODEL_NAME], "object": "model", "created": 0, "owned_by": "jaxspec"}]})


async def health(request):
    failed = request.app[DRIVER].failed
    return web.json_response({"status": "ok"} if failed is None else {"status": "failed", "message": failed},
                             status=200 if failed is None else 503)


async def metrics(request):
    st, busy, finished = request.app[DRIVER].stats()
    rate = st.generated_tokens / busy if busy > 0 else 0.0
    rows = [
        ("jaxspec_mean_accept_length", "gauge", "tokens committed per decode round (cumulative mean)",
         st.mean_accept_length),
        ("jaxspec_generated_tokens_total", "counter", "tokens generated", st.generated_tokens),
        ("jaxspec_decode_rounds_total", "counter", "decode rounds run", st.rounds),
        ("jaxspec_generation_tokens_per_second", "gauge", "generated tokens per second of engine step time",
         rate),
        ("jaxspec_requests_running", "gauge", "requests in a batch slot", st.running),
        ("jaxspec_requests_waiting", "gauge", "requests queued for a slot or pages", st.waiting),
        ("jaxspec_kv_pages_in_use", "gauge", "KV pages held by requests", st.pages_in_use),
        ("jaxspec_kv_pages_total", "gauge", "KV pages of the pool", st.pages_total),
    ]
    lines = []
    for name, kind, help_, value in rows:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {float(value):g}"]
    lines += ["# HELP jaxspec_requests_finished_total requests ended, by finish reason",
              "# TYPE jaxspec_requests_finished_total counter"]
    lines += [f'jaxspec_requests_finished_total{{finish_reason="{k}"}} {v}' for k, v in sorted(finished.items())]
    return web.Response(body=("\n".join(lines) + "\n").encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8",
                                 "X-Content-Type-Options": "nosniff"})


TOKENIZER = web.AppKey("tokenizer", Tokenizer)
MODEL_NAME = web.AppKey("model_name", str)


def build_app(serving_engine: ServingEngine, tokenizer: Tokenizer, model_name: str) -> web.Application:
    """The server's ``aiohttp.web.Application`` (module docstring); its ``EngineDriver`` thread starts with
    the app and stops at its cleanup."""
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(f"tokenizer: expected a jaxspec.text.Tokenizer, got {type(tokenizer).__name__}")
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name: expected a non-empty str, got {model_name!r}")
    app = web.Application(middlewares=[_errors])
    app[DRIVER] = EngineDriver(serving_engine)
    app[TOKENIZER], app[MODEL_NAME] = tokenizer, model_name

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
