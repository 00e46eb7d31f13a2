"""OpenAI request bodies -> what the serving core takes (``Parsed``), or a ``RequestError`` naming the field.

Fields read: ``model`` (must be the served name), ``messages`` (chat: a non-empty list of ``{"role",
"content"}``, content a string or a list of ``{"type": "text", "text"}`` parts) or ``prompt`` (completions: a
string or a list of token ids, or a list holding one of them), ``max_completion_tokens`` / ``max_tokens``
(default: chat, what the context leaves; completions, 16 as OpenAI), ``temperature`` (finite, >= 0; default 1
as OpenAI), ``top_p`` (in (0, 1]), ``top_k`` (an extension: -1 / null = off, else in [1, V]), ``seed`` (an int
in [0, 2**31); default: a fresh one), ``stop`` (a string or a list of strings, cut on the host), ``n`` (1
only), ``stream``, ``stream_options.include_usage``; extensions (as vLLM and SGLang name them): ``ignore_eos``
(no stop token of the model's), ``stop_token_ids`` (more token ids that end the reply, the token counted),
``return_token_ids`` (each choice, and each streamed chunk, carries the ``token_ids`` it covers). Options
that would change the output and are not implemented (penalties, logprobs, tools, ...) are refused when set to
anything but their neutral value; other fields are ignored.
"""

import dataclasses
import math
import re
import secrets

from jaxspec.serving import RequestParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False, 0),
           "top_logprobs": (0,), "logit_bias": ({},), "tools": ([],), "functions": ([],), "best_of": (1,),
           "echo": (False,), "suffix": ("",)}


class RequestError(ValueError):
    """A bad request: ``message`` and the offending top-level field ``param`` (None: the body itself)."""

    def __init__(self, message: str, param):
        super().__init__(message)
        self.message, self.param = message, param


@dataclasses.dataclass
class Parsed:
    prompt_ids: list
    params: RequestParams
    stop: tuple
    stream: bool
    include_usage: bool
    prompt_field: str
    max_tokens_field: str
    return_token_ids: bool = False


@dataclasses.dataclass(frozen=True)
class Served:
    """What requests are checked against, read once: the tokenizer, the served name, the core's context,
    verify width and vocabulary, and the stop tokens of completions and chats."""

    tokenizer: object
    name: str
    max_context: int
    verify_width: int
    vocab_size: int
    eos_ids: tuple
    chat_stop_ids: tuple

    @classmethod
    def of(cls, tokenizer, name: str, se) -> "Served":
        eng = se.engine
        return cls(tokenizer, name, eng.max_context, eng.opts.verify_width, eng.vocab_size,
                   tuple(tokenizer.eos_token_ids), tuple(tokenizer.chat_stop_token_ids))


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _common(body, sv: Served, prompt_ids, prompt_field, default_max, stop_ids) -> Parsed:
    room = sv.max_context - sv.verify_width - len(prompt_ids)
    if room < 1:
        raise RequestError(f"the prompt is {len(prompt_ids)} tokens; this server's context is {sv.max_context} "
                           f"tokens ({sv.verify_width} reserved for verification), which leaves no room for "
                           f"a reply", prompt_field)
    mt_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(mt_field)
    if mt is None:
        mt = room if default_max is None else min(default_max, room)
    elif not _int(mt) or not 1 <= mt <= room:
        raise RequestError(f"{mt_field}: expected an int in [1, {room}] (the context left after the "
                           f"{len(prompt_ids)}-token prompt), got {mt!r}", mt_field)
    t = body.get("temperature", 1.0)
    t = 1.0 if t is None else t
    if not _number(t) or not math.isfinite(t) or t < 0:
        raise RequestError(f"temperature: expected a finite number >= 0, got {t!r}", "temperature")
    p = body.get("top_p", 1.0)
    p = 1.0 if p is None else p
    if not _number(p) or not (0 < p <= 1):
        raise RequestError(f"top_p: expected a number in (0, 1], got {p!r}", "top_p")
    k = body.get("top_k")
    if k is not None and (not _int(k) or not (k == -1 or 1 <= k <= sv.vocab_size)):
        raise RequestError(f"top_k: expected -1 (off) or an int in [1, {sv.vocab_size}], got {k!r}", "top_k")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**31)
    elif not _int(seed) or not 0 <= seed < 2**31:
        raise RequestError(f"seed: expected an int in [0, 2**31), got {seed!r}", "seed")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"stop: expected a non-empty string or a list of them, got {body.get('stop')!r}", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise RequestError(f"stream: expected a boolean, got {stream!r}", "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise RequestError("stream_options: only allowed with stream: true", "stream_options")
        if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
            raise RequestError(f"stream_options: expected {{'include_usage': bool}}, got {opts!r}", "stream_options")
        include_usage = opts.get("include_usage", False)
    ignore = _flag(body, "ignore_eos")
    extra = body.get("stop_token_ids")
    extra = [] if extra is None else extra
    if not isinstance(extra, list) or not all(_int(i) and 0 <= i < sv.vocab_size for i in extra):
        raise RequestError(f"stop_token_ids: expected a list of token ids in [0, {sv.vocab_size}), got {extra!r}",
                           "stop_token_ids")
    stop_ids = tuple(dict.fromkeys((() if ignore else tuple(stop_ids)) + tuple(extra)))
    params = RequestParams(max_new_tokens=int(mt), temperature=float(t), top_k=None if k in (None, -1) else k,
                           top_p=float(p), seed=int(seed), stop_token_ids=stop_ids)
    return Parsed(list(prompt_ids), params, tuple(stop), bool(stream), include_usage, prompt_field, mt_field,
                  _flag(body, "return_token_ids"))


def _flag(body, name) -> bool:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise RequestError(f"{name}: expected a boolean, got {v!r}", name)
    return bool(v)


def _check_body(body, model_name):
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}", None)
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(f"model: expected the model name {model_name!r}, got {model!r}", "model")
    if model != model_name:
        raise RequestError(f"model: this server serves {model_name!r}, not {model!r}", "model")
    n = body.get("n", 1)
    if n is not None and n != 1 or isinstance(n, bool):
        raise RequestError(f"n: only n=1 is supported, got {n!r}", "n")
    for name, neutral in NEUTRAL.items():
        v = body.get(name)
        if v is not None and not any(type(v) is type(x) and v == x for x in neutral):
            raise RequestError(f"{name}: not supported by this server (got {v!r})", name)


def _content(m, i):
    c = m.get("content")
    if c is None or isinstance(c, str):
        return m
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return {**m, "content": "".join(p["text"] for p in c)}
    raise RequestError(f"messages[{i}].content: expected a string or a list of text parts", "messages")


def parse_chat(body, sv: Served) -> Parsed:
    """A ``/v1/chat/completions`` body (module docstring)."""
    _check_body(body, sv.name)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError(f"messages: expected a non-empty list of messages, got {msgs!r}", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}]: expected an object with a string 'role'", "messages")
    msgs = [_content(m, i) for i, m in enumerate(msgs)]
    try:
        ids = sv.tokenizer.encode_chat(msgs, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 -- template errors, and characters the tokenizer cannot encode
        raise RequestError(f"messages: {e}", "messages") from None
    return _common(body, sv, ids, "messages", None, sv.chat_stop_ids)


def parse_completion(body, sv: Served) -> Parsed:
    """A ``/v1/completions`` body (module docstring)."""
    _check_body(body, sv.name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        try:
            ids = sv.tokenizer.encode(prompt, add_special_tokens=True)
        except Exception as e:  # noqa: BLE001 -- characters the tokenizer cannot encode
            raise RequestError(f"prompt: {e}", "prompt") from None
    elif isinstance(prompt, list) and prompt and all(_int(i) and 0 <= i < sv.vocab_size for i in prompt):
        ids = prompt
    else:
        raise RequestError("prompt: expected a non-empty string or one list of token ids "
                           f"in [0, {sv.vocab_size}) (one prompt per request)", "prompt")
    if not ids:
        raise RequestError("prompt: encodes to no tokens", "prompt")
    return _common(body, sv, ids, "prompt", COMPLETIONS_DEFAULT_MAX_TOKENS, sv.eos_ids)


def core_error(e: ValueError, req: Parsed) -> RequestError:
    """The serving core's refusal (its message starts with the field) as a ``RequestError``."""
    m = re.match(r"\s*([A-Za-z_]+)", str(e))
    field = m.group(1) if m else None
    param = {"max_new_tokens": req.max_tokens_field, "prompt": req.prompt_field, "prompts": req.prompt_field,
             "prompt_ids": req.prompt_field}.get(field, field)
    return RequestError(str(e), param)
