"""Text in, text out over ``jaxspec.engine.Engine``.

    from jaxspec.text import load_chat_model
    chat = load_chat_model("smollm2-135m-instruct")  # fetched once into the user cache, hash-checked
    print(chat.chat([{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=64))

``TextGenerator(model, tokenizer, drafter=None, spec=None, ...)`` wraps an ``Engine`` (plain decoding, or
speculative with a drafter and ``spec``) and a ``Tokenizer``:

* ``generate(prompt or prompts)``: completion of raw text, stopping at the checkpoint's stop tokens
  (``tokenizer.eos_token_ids``);
* ``chat(messages or conversations)``: the chat template (with the assistant-turn prompt), stopping at
  ``tokenizer.chat_stop_token_ids`` (the stop tokens plus the template's end-of-turn token, e.g. ChatML's
  ``<|im_end|>``): no id to name;
* ``stream(prompt)`` / ``stream_chat(messages)``: the same for one request, yielding text pieces as they
  become final (whole UTF-8 characters);
* ``run(prompt_ids, stop_token_ids=...)``: token ids in, ``TextOutput`` (text, ids, finish reason) out.

Sampling: ``temperature``, ``top_k``, ``top_p``, ``seed`` as in ``Engine.generate`` (scalars or one per
request; greedy by default). The reply text leaves out the stop token and, by default, special tokens.

Stopping: the engine stops a request in its decode loop at ONE token id, the engine's ``eos_id``; here
that is the tokenizer's end-of-turn token when its template has one, else its first stop token. Further
stop ids (``generation_config.json`` may list several) end the text on the host, where a
``jaxspec.text.Reply`` turns each request's ids into its text and finish reason: the request keeps decoding
in the loop until its ``max_new_tokens`` or the engine's id, and what follows the first stop id is dropped.
The engine checks the prompt and ``max_new_tokens`` against its context. Streaming runs the engine's
public ``run_prefill`` then ``run_decode(max_rounds=...)`` in chunks of rounds, reading the new tokens after
each chunk (a host sync per chunk; the rounds themselves are the same executable as ``generate``'s) into the
same ``Reply``, and stops calling it once the reply has ended.
"""

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from jaxspec.engine import Engine
from jaxspec.text.chat import check_messages
from jaxspec.text.reply import Reply
from jaxspec.text.tokenizer import Tokenizer

DEFAULT_MAX_NEW_TOKENS = 256
STREAM_ROUNDS = 8  # decode rounds per engine call while streaming


class TextOutput(NamedTuple):
    """One request's result: the reply ``text``, its ``token_ids`` (the stop token excluded) and
    ``finish_reason``: ``"stop"`` (a stop token came) or ``"length"`` (``max_new_tokens`` reached)."""

    text: str
    token_ids: list
    finish_reason: str


def _is_conversation(x) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, str) and len(x) > 0 and isinstance(x[0], Mapping)


class TextGenerator:
    """Strings or chat messages in, text out (see the module docstring).

    Args:
      model: a ``TargetModel`` (e.g. ``jaxspec.models.load_model(path)``).
      tokenizer: the checkpoint's ``Tokenizer``.
      drafter / spec: speculative decoding as in ``Engine`` (both None: plain decoding).
      engine: an ``Engine`` to use instead of building one (then ``drafter``, ``spec`` and
        ``engine_kwargs`` must be left out); its ``eos_id`` is what stops requests in the loop.
      max_context / max_batch / engine_kwargs: forwarded to ``Engine`` (prompt + reply + verify width
        must fit in ``max_context``; more than ``max_batch`` prompts run in several batches).
      skip_special_tokens: leave special tokens out of the reply text (default True).
    """

    def __init__(self, model, tokenizer: Tokenizer, *, drafter=None, spec=None, engine: Engine | None = None,
                 max_context: int = 2048, max_batch: int = 8, skip_special_tokens: bool = True, **engine_kwargs):
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"tokenizer: expected a jaxspec.text.Tokenizer, got {type(tokenizer).__name__}")
        vocab = int(model.vocab_size)
        if tokenizer.vocab_size > vocab:
            raise ValueError(f"tokenizer: {tokenizer.vocab_size} token ids but the model has vocab_size={vocab}; "
                             f"they do not belong together")
        self.model, self.tokenizer = model, tokenizer
        self.skip_special_tokens = bool(skip_special_tokens)
        self.stop_token_ids = tuple(tokenizer.eos_token_ids)
        self.chat_stop_token_ids = tuple(tokenizer.chat_stop_token_ids)
        eot = tokenizer.end_of_turn_token_id
        loop_eos = eot if eot is not None else (self.stop_token_ids[0] if self.stop_token_ids else None)
        if engine is not None:
            if drafter is not None or spec is not None or engine_kwargs:
                raise ValueError("engine: given an Engine, leave drafter, spec and engine options out")
            if engine.target is not model:
                raise ValueError("engine: its target is not `model`")
            self.engine = engine
        else:
            if "eos_id" in engine_kwargs:
                raise ValueError("eos_id: the stop tokens come from the tokenizer (tokenizer.eos_token_ids / "
                                 "chat_stop_token_ids); pass engine= for an Engine of your own")
            self.engine = Engine(model, drafter, spec=spec, max_context=max_context, max_batch=max_batch,
                                 eos_id=loop_eos, **engine_kwargs)

    # ------------------------------------------------------------------ token ids
    def run(self, prompt_ids: Sequence[Sequence[int]], *, stop_token_ids: Sequence[int] = (),
            max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature=0.0, top_k=None, top_p=1.0,
            seed=0) -> list[TextOutput]:
        """Generate from token-id prompts; each reply ends before the first id in ``stop_token_ids``."""
        if isinstance(prompt_ids, np.ndarray) and prompt_ids.ndim == 1 or (
                len(prompt_ids) and isinstance(prompt_ids[0], (int, np.integer))):
            raise ValueError("prompt_ids: expected a list of prompts (each a list of token ids), got one flat list")
        n, cap = len(prompt_ids), self.engine.max_batch
        per = [_per_request(v, n, name) for v, name in ((temperature, "temperature"), (top_k, "top_k"),
                                                          (top_p, "top_p"), (seed, "seed"))]
        outs = []
        for lo in range(0, max(n, 1), cap):
            hi = min(n, lo + cap)
            kw = {name: (v if not isinstance(v, list) else v[lo:hi])
                  for v, name in zip(per, ("temperature", "top_k", "top_p", "seed"))}
            res = self.engine.generate(list(prompt_ids[lo:hi]), max_new_tokens, **kw)
            for toks in res.tokens:
                reply = self._reply(stop_token_ids)
                reply.push(np.asarray(toks).tolist(), "length")
                outs.append(_output(reply))
        return outs

    def _reply(self, stop_token_ids) -> Reply:
        """The ``Reply`` of one request: it ends at ``stop_token_ids`` and at the engine's own stop id."""
        stops = tuple(int(s) for s in stop_token_ids) + (() if self.engine.eos_id < 0 else (self.engine.eos_id,))
        return Reply(self.tokenizer, stop_token_ids=stops, skip_special_tokens=self.skip_special_tokens)

    # ------------------------------------------------------------------ text
    def encode_prompt(self, prompt: str) -> list[int]:
        """A raw-text prompt's ids (with the tokenizer's own special tokens, e.g. a BOS)."""
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def generate(self, prompts: str | Sequence[str], *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 **sampling) -> str | list[str]:
        """Completion of ``prompts`` (one string -> one string; a list -> a list)."""
        one = isinstance(prompts, str)
        texts = [prompts] if one else list(prompts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("prompts: expected a string or a non-empty list of strings")
        outs = self.run([self.encode_prompt(t) for t in texts], stop_token_ids=self.stop_token_ids,
                        max_new_tokens=max_new_tokens, **sampling)
        return outs[0].text if one else [o.text for o in outs]

    def chat_prompt_ids(self, messages, **template_kwargs) -> list[int]:
        """The ids of one conversation rendered with the chat template and the assistant-turn prompt."""
        return self.tokenizer.encode_chat(check_messages(messages), add_generation_prompt=True, **template_kwargs)

    def chat(self, messages, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, template_kwargs=None,
             **sampling) -> str | list[str]:
        """The assistant's reply to one conversation (a list of ``{"role", "content"}`` dicts) -> a string,
        or to a list of conversations -> a list of strings; each stops at the model's own stop token."""
        one = _is_conversation(messages)
        convs = [messages] if one else list(messages)
        if not convs:
            raise ValueError("messages: expected a conversation (list of message dicts) or a list of them")
        ids = [self.chat_prompt_ids(c, **(template_kwargs or {})) for c in convs]
        outs = self.run(ids, stop_token_ids=self.chat_stop_token_ids, max_new_tokens=max_new_tokens, **sampling)
        return outs[0].text if one else [o.text for o in outs]

    # ------------------------------------------------------------------ streaming
    def stream_ids(self, prompt_ids: Sequence[int], *, stop_token_ids: Sequence[int] = (),
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, rounds_per_chunk: int = STREAM_ROUNDS,
                   temperature=0.0, top_k=None, top_p=1.0, seed=0) -> Iterator[str]:
        """One request from token ids, yielding its reply text in pieces (see the module docstring)."""
        if not isinstance(rounds_per_chunk, int) or rounds_per_chunk < 1:
            raise ValueError(f"rounds_per_chunk: expected an int >= 1, got {rounds_per_chunk!r}")
        eng = self.engine
        reply = self._reply(stop_token_ids)
        if eng.opts.adaptive is not None and 1 not in eng.round_costs:  # as Engine.generate does first
            eng.calibrate(1)
        state = eng.run_prefill(*eng.prepare([list(prompt_ids)], max_new_tokens, temperature=temperature,
                                             top_k=top_k, top_p=top_p, seed=seed))
        seen = 0
        while reply.finish_reason is None:
            num = int(np.asarray(state.num_generated)[0])
            new = np.asarray(state.out_tokens)[0, seen:num].tolist()
            seen = num
            piece = reply.push(new, "length" if bool(np.asarray(state.done)[0]) else None).text
            if piece:
                yield piece
            if reply.finish_reason is None:
                state = eng.run_decode(state, max_rounds=rounds_per_chunk)

    def stream(self, prompt: str, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, **kw) -> Iterator[str]:
        """``generate`` for one prompt, as a stream of text pieces."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
        return self.stream_ids(self.encode_prompt(prompt), stop_token_ids=self.stop_token_ids,
                               max_new_tokens=max_new_tokens, **kw)

    def stream_chat(self, messages, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, template_kwargs=None,
                    **kw) -> Iterator[str]:
        """``chat`` for one conversation, as a stream of text pieces."""
        return self.stream_ids(self.chat_prompt_ids(messages, **(template_kwargs or {})),
                               stop_token_ids=self.chat_stop_token_ids, max_new_tokens=max_new_tokens, **kw)


def _output(reply: Reply) -> TextOutput:
    """The ``TextOutput`` of an ended reply: its ids without the stop token that ended it."""
    ids = reply.token_ids[:-1] if isinstance(reply.stop_reason, int) else reply.token_ids
    return TextOutput(reply.text, ids, reply.finish_reason)


def _per_request(v, n: int, name: str):
    """A sampling value as a scalar, or a list of ``n`` values."""
    if isinstance(v, (list, tuple, np.ndarray)):
        v = list(np.asarray(v).tolist())
        if len(v) != n:
            raise ValueError(f"{name}: expected a scalar or one value per request ({n}), got {len(v)} values")
    return v


def load_chat_model(name_or_path: str, *, param_dtype=None, kv_dtype=None, drafter=None, spec=None,
                    **generator_kwargs) -> TextGenerator:
    """A ``TextGenerator`` for a named model (``jaxspec.models.fetch.MODELS``, fetched into the user cache and
    hash-checked on first use), a ``.gguf`` file or a Hugging Face checkpoint directory: the weights through
    ``jaxspec.models.load_model``, the tokenizer, chat template and stop tokens from the same checkpoint.
    ``param_dtype`` default float32. ``generator_kwargs`` go to ``TextGenerator`` (``max_context``, ...)."""
    import jax.numpy as jnp  # noqa: PLC0415

    from jaxspec.models import load_model  # noqa: PLC0415
    from jaxspec.models import fetch  # noqa: PLC0415

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ValueError(f"name_or_path: expected a model name or a path, got {type(name_or_path).__name__}")
    path = str(name_or_path)
    if path in fetch.MODELS:
        path = str(fetch.fetch_model(path, quiet=True))
    elif not os.path.exists(path):
        raise ValueError(f"name_or_path: {path!r} is neither a named model ({sorted(fetch.MODELS)}) nor an "
                         f"existing .gguf file or checkpoint directory")
    model = load_model(path, param_dtype=jnp.float32 if param_dtype is None else param_dtype, kv_dtype=kv_dtype)
    return TextGenerator(model, Tokenizer.from_file(path), drafter=drafter, spec=spec, **generator_kwargs)


