"""Chat templates: Jinja2 templates rendered the way Hugging Face ``transformers`` renders them.

The environment matches ``transformers.utils.chat_template_utils``: a sandboxed, immutable Jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson``
filter that does not escape HTML (``ensure_ascii=False``, with ``indent`` / ``separators`` /
``sort_keys``), and the globals ``raise_exception(message)``, ``strftime_now(format)``, a restricted
``dict`` and a ``namespace`` that refuses underscore names. A template sees ``messages``, ``tools``,
``documents``, ``add_generation_prompt``, the tokenizer's named special tokens (``bos_token``,
``eos_token``, ``unk_token``, ``pad_token``) and any extra keyword arguments. ``{% generation %}`` blocks
(assistant masks in transformers) render their body unchanged.
"""

import functools
import json
from datetime import datetime
from typing import Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """A chat template failed to render (its own ``raise_exception``, or a Jinja2 error)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: rendered as its body (transformers tracks assistant spans)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """``dict(...)`` in a template, without access to the ``dict`` type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` refusing underscore-prefixed attributes (no way to CPython internals)."""

    def __init__(*args, **kwargs):  # noqa: N805 -- Jinja's own signature trick (``namespace(self=...)`` works)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes: {name!r}")


@functools.lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    """The compiled template (cached per source string)."""
    if not isinstance(source, str):
        raise ValueError(f"chat_template: expected a Jinja2 template string, got {type(source).__name__}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat_template: not a valid Jinja2 template (line {e.lineno}: {e.message})") from e


def _plain(value):
    """Rebuild ``value`` from plain JSON-like types (what a sandboxed template may see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def check_messages(messages, name: str = "messages") -> list[dict]:
    """``messages`` as a list of dicts (keys whose value is None dropped, as transformers does), or a
    ``ValueError`` naming the bad message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"{name}: expected a list of message dicts ({{'role': ..., 'content': ...}}), "
                         f"got {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError(f"{name}: expected at least one message, got an empty conversation")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"{name}[{i}]: expected a dict with 'role' and 'content', got {type(m).__name__}")
        if "role" not in m:
            raise ValueError(f"{name}[{i}]: a message needs a 'role' key, got keys {sorted(m)}")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def render_chat_template(source: str, messages, *, add_generation_prompt: bool = False, tools=None,
                         documents=None, special_tokens: Mapping[str, str] | None = None, **kwargs) -> str:
    """Render one conversation with the chat template ``source``.

    ``special_tokens``: the named special tokens the template may read (``bos_token`` etc.); ``kwargs``
    override them (as in transformers). ``tools``: JSON schemas (dicts) or None."""
    msgs = check_messages(messages)
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("tools: expected a list of JSON-schema dicts or None")
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise ValueError("documents: expected a list of dicts (with 'title' and 'text') or None")
    variables = {**dict(special_tokens or {}), **kwargs}
    template = compile_chat_template(source)
    try:
        return template.render(messages=_plain(msgs), tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=bool(add_generation_prompt), **_plain(variables))
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template: {e}") from e


def end_of_turn_token(source: str, special_tokens: Mapping[str, str], candidates: Sequence[str]) -> str | None:
    """The special token the template writes right after an assistant message's content (ChatML's
    ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``), or None when it writes none.

    Found by rendering a two-turn conversation whose assistant content is a marker and reading which of
    ``candidates`` (the tokenizer's special tokens) starts the text after it (whitespace skipped)."""
    marker = "\x00jaxspec-end-of-turn-probe\x00"
    try:
        text = render_chat_template(source, [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": marker}],
                                    special_tokens=special_tokens)
    except ChatTemplateError:
        return None
    at = text.find(marker)
    if at < 0:
        return None
    rest = text[at + len(marker):].lstrip()
    best = None
    for tok in candidates:
        if tok and rest.startswith(tok) and (best is None or len(tok) > len(best)):
            best = tok
    return best
