"""OpenAI request bodies -> what the serving core takes (``Parsed``), or a ``RequestError`` naming the field.

Fields read: ``model`` (must be the served name), ``messages`` (chat: a non-empty list of ``{"role",
"content"}``, content a string or a list of ``{"type": "text", "text"}`` parts) or ``prompt`` (completions: a
string or a list of token ids, or a list holding one of them), ``max_completion_tokens`` / ``max_tokens``
(default: chat, what the context leaves; completions, 16 as OpenAI), ``temperature`` (a finite float32 >= 0;
default 1 as OpenAI), ``top_p`` (in (0, 1]), ``top_k`` (an extension: -1 / null = off, else in [1, V]), ``seed`` (an int
in [0, 2**31); default: a fresh one), ``stop`` (a string or a list of strings, cut on the host), ``n`` (1
only), ``stream``, ``stream_options.include_usage``; extensions (as vLLM and SGLang name them): ``ignore_eos``
(no stop token of the model's), ``stop_token_ids`` (more token ids that end the reply, the token counted),
``return_token_ids`` (each choice, and each streamed chunk, carries the ``token_ids`` it covers),
``min_tokens`` (stop tokens and stop strings end the reply only from that many tokens on; the stop tokens are
not masked, they stay in the ids), ``include_stop_str_in_output`` (the stop string, or the stop token's text,
ends the text), ``skip_special_tokens`` (default true). A reply cut at a stop string ends, text, ``token_ids``
and usage alike, at the token that completed it. Options that would change the output and are not implemented
(``NEUTRAL``: penalties, ``min_p``, logprobs, tools, ``response_format``, guided decoding, ...) are refused
when set to anything but their neutral value; other fields are ignored.

A prompt that cannot fit the context is refused before it is tokenized when its length in characters exceeds
``max_context`` times the longest vocabulary entry (``Served.max_prompt_chars``); a token id prompt too long for
the context is refused before its ids are checked. ``jaxspec.text.limits.reply_budget`` is the one check of a
prompt's length and ``max_tokens`` against the context.
"""

import dataclasses
import math
import re
import secrets

from jaxspec.serving import RequestParams
from jaxspec.text.limits import LimitError, reply_budget

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
FLOAT32_MAX = 3.4028234663852886e38
# field -> its neutral values (a field absent or null is neutral too); anything else is refused, naming it
NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
           "length_penalty": (1, 1.0), "min_p": (0, 0.0), "logprobs": (False, 0), "top_logprobs": (0,),
           "prompt_logprobs": (0,), "logit_bias": ({},), "tools": ([],), "functions": ([],),
           "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "best_of": (1,), "echo": (False,),
           "suffix": ("",), "response_format": ({"type": "text"},), "guided_json": (), "guided_regex": (),
           "guided_choice": (), "guided_grammar": (), "guided_decoding_backend": (), "guided_whitespace_pattern": (),
           "regex": (), "json_schema": (), "grammar": (), "ebnf": (), "structured_outputs": (), "bad_words": ([],),
           "allowed_token_ids": (), "logits_processors": (), "use_beam_search": (False,),
           "truncate_prompt_tokens": (), "spaces_between_special_tokens": (True,), "add_generation_prompt": (True,),
           "continue_final_message": (False,), "chat_template": (), "chat_template_kwargs": ({},),
           "prediction": ()}


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
    include_stop_str: bool = False
    skip_special_tokens: bool = True


@dataclasses.dataclass(frozen=True)
class Served:
    """What requests are checked against, read once: the tokenizer, the served name, the core's context,
    verify width and vocabulary, the stop tokens of completions and chats, and the longest prompt in
    characters that could fit the context (``max_context`` tokens of the longest vocabulary entry)."""

    tokenizer: object
    name: str
    max_context: int
    verify_width: int
    vocab_size: int
    eos_ids: tuple
    chat_stop_ids: tuple
    max_prompt_chars: int

    @classmethod
    def of(cls, tokenizer, name: str, se) -> "Served":
        eng = se.engine
        longest = max(map(len, tokenizer.backend.get_vocab(with_added_tokens=True)), default=1)
        return cls(tokenizer, name, eng.max_context, eng.opts.verify_width, eng.vocab_size,
                   tuple(tokenizer.eos_token_ids), tuple(tokenizer.chat_stop_token_ids),
                   eng.max_context * max(1, longest))


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _common(body, sv: Served, prompt_ids, prompt_field, default_max, stop_ids) -> Parsed:
    mt_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    try:
        mt = reply_budget(len(prompt_ids), body.get(mt_field), max_context=sv.max_context, reserved=sv.verify_width,
                          default=default_max, prompt_name=prompt_field, max_new_tokens_name=mt_field)
    except LimitError as e:
        raise RequestError(e.message, e.param) from None
    t = body.get("temperature", 1.0)
    t = 1.0 if t is None else t
    if not _number(t) or not math.isfinite(t) or not 0 <= t <= FLOAT32_MAX:
        raise RequestError(f"temperature: expected a finite number in [0, {FLOAT32_MAX:.8g}] (float32), got {t!r}",
                           "temperature")
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
    mn = body.get("min_tokens")
    skip = body.get("skip_special_tokens")
    skip = True if skip is None else skip
    if not isinstance(skip, bool):
        raise RequestError(f"skip_special_tokens: expected a boolean, got {skip!r}", "skip_special_tokens")
    try:  # RequestParams checks min_tokens against max_new_tokens
        params = RequestParams(max_new_tokens=mt, temperature=float(t), top_k=None if k in (None, -1) else k,
                               top_p=float(p), seed=int(seed), stop_token_ids=stop_ids,
                               min_tokens=0 if mn is None else mn)
    except ValueError as e:
        raise _field_error(e, prompt_field, mt_field) from None
    return Parsed(list(prompt_ids), params, tuple(stop), bool(stream), include_usage, prompt_field, mt_field,
                  _flag(body, "return_token_ids"), _flag(body, "include_stop_str_in_output"), skip)


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
            shown = repr(v) if len(repr(v)) <= 80 else repr(v)[:77] + "..."
            raise RequestError(f"{name}: not supported by this server (got {shown}; supported: "
                               f"{' or '.join(map(repr, neutral)) or 'null'})", name)


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
    chars = sum(len(m["content"]) for m in msgs if isinstance(m.get("content"), str))
    if chars > sv.max_prompt_chars:
        raise RequestError(f"messages: {chars} characters of content cannot fit this server's context of "
                           f"{sv.max_context} tokens (at most {sv.max_prompt_chars} characters)", "messages")
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
    if isinstance(prompt, str) and len(prompt) > sv.max_prompt_chars:
        raise RequestError(f"prompt: {len(prompt)} characters cannot fit this server's context of {sv.max_context} "
                           f"tokens (at most {sv.max_prompt_chars} characters)", "prompt")
    if isinstance(prompt, str) and prompt:
        try:
            ids = sv.tokenizer.encode(prompt, add_special_tokens=True)
        except Exception as e:  # noqa: BLE001 -- characters the tokenizer cannot encode
            raise RequestError(f"prompt: {e}", "prompt") from None
        if not ids:
            raise RequestError("prompt: encodes to no tokens", "prompt")
    elif isinstance(prompt, list) and prompt:
        ids = prompt  # its length is checked against the context (in _common) before its ids are
    else:
        raise _bad_prompt(sv)
    parsed = _common(body, sv, ids, "prompt", COMPLETIONS_DEFAULT_MAX_TOKENS, sv.eos_ids)
    if ids is prompt and not all(_int(i) and 0 <= i < sv.vocab_size for i in prompt):
        raise _bad_prompt(sv)
    return parsed


def _bad_prompt(sv: Served) -> RequestError:
    return RequestError("prompt: expected a non-empty string or one list of token ids "
                        f"in [0, {sv.vocab_size}) (one prompt per request)", "prompt")


def core_error(e: Exception, req: Parsed) -> RequestError:
    """The serving core's refusal (its message starts with the field) as a ``RequestError``."""
    return _field_error(e, req.prompt_field, req.max_tokens_field)


def _field_error(e: Exception, prompt_field: str, max_tokens_field: str) -> RequestError:
    """A refusal of the serving core's (its message starts with the field) as a ``RequestError`` naming the
    request's field."""
    m = re.match(r"\s*([A-Za-z_]+)", str(e))
    field = m.group(1) if m else None
    param = {"max_new_tokens": max_tokens_field, "prompt": prompt_field, "prompts": prompt_field,
             "prompt_ids": prompt_field}.get(field, field)
    return RequestError(str(e), param)
