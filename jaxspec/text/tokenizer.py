"""Tokenizers from a checkpoint directory or a GGUF file, on the ``tokenizers`` library (no torch).

``Tokenizer.from_dir(path)`` reads a Hugging Face directory: ``tokenizer.json`` (vocabulary, merges,
normalizer, pre-tokenizer, post-processor, decoder, added tokens), ``tokenizer_config.json`` (special
tokens, ``chat_template``), ``special_tokens_map.json``, ``chat_template.jinja`` (preferred over the
config's template, as in transformers) and the stop tokens of ``generation_config.json`` (else
``config.json``) ``eos_token_id``.

``Tokenizer.from_gguf(path)`` rebuilds the tokenizer a GGUF describes from its ``tokenizer.ggml.*``
metadata. Supported: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: ``tokens``, ``merges``,
``token_type``); the pre-tokenizer is the one llama.cpp applies for ``tokenizer.ggml.pre`` (the split the
vocabulary's merges were learned on; an unknown name is refused, naming the known ones). Tokens of type
CONTROL (3) become special added tokens and USER_DEFINED (4) plain added tokens, matched whole in text.
``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``, ``add_bos_token`` / ``add_eos_token`` and
``tokenizer.chat_template`` carry over; the stop token is ``eos_token_id``.

Note on ``tokenizer.ggml.pre == "smollm"`` (SmolLM/SmolLM2, also ``starcoder``, ``refact``,
``command-r``, ``codeshell``, ``exaone``, ``minerva``): digits are split off one by one before the GPT-2
split, as llama.cpp and the models' own ``tokenizer.json`` (``Digits(individual_digits=True)`` then
``ByteLevel``) do. transformers' GGUF converter (5.x) has no entry for these names and falls back to the
plain GPT-2 split, which tokenizes a whitespace run before a digit differently (``"a\\n\\n12"``: ``ĊĊ``
``1`` ``2`` here and in the model's training tokenizer, ``Ċ`` ``Ċ`` ``1`` ``2`` there).
"""

import json
import os
from typing import Iterable, Sequence

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from jaxspec.text import chat as _chat
from jaxspec._gguf import read_gguf_metadata

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")

# --------------------------------------------------------------------------- GGUF pre-tokenizers
# The GPT-2 split (``ByteLevel(use_regex=True)`` applies it itself).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_NAMES = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion")
_DIGITS_THEN_GPT2_NAMES = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_LLAMA3_NAMES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
                 "smaug-bpe")
_QWEN2_NAMES = ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2")
KNOWN_GGUF_PRE = _GPT2_NAMES + _DIGITS_THEN_GPT2_NAMES + _LLAMA3_NAMES + _QWEN2_NAMES


def gguf_pre_tokenizer(name: str):
    """The ``tokenizers`` pre-tokenizer llama.cpp applies for ``tokenizer.ggml.pre == name``."""
    if name in _GPT2_NAMES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in _DIGITS_THEN_GPT2_NAMES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = _LLAMA3_SPLIT if name in _LLAMA3_NAMES else _QWEN2_SPLIT if name in _QWEN2_NAMES else None
    if split is None:
        raise ValueError(f"tokenizer.ggml.pre: unknown pre-tokenizer {name!r}; known: {sorted(KNOWN_GGUF_PRE)}")
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE spells every token with these)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _post_processor(bos: str | None, bos_id, eos: str | None, eos_id, add_bos: bool, add_eos: bool):
    single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
    pair = single + ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else [])
    special = dict(([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos else []))
    return processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                         special_tokens=list(special.items()))


def _token_str(v) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    raise ValueError(f"expected a special token string or {{'content': ...}}, got {v!r}")


def _ids(v, name: str) -> tuple[int, ...]:
    if v is None:
        return ()
    vals = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if not isinstance(vals, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise ValueError(f"{name}: expected an int or a list of ints, got {v!r}")
    return tuple(int(x) for x in vals)


class Tokenizer:
    """Text <-> token ids, special tokens, the chat template and the stop tokens of one checkpoint.

    Args:
      backend: a ``tokenizers.Tokenizer``.
      special_tokens: ``{"bos_token": "<s>", ...}`` (names in ``SPECIAL_TOKEN_NAMES``; None = absent).
      chat_template: a Jinja2 template string, or None.
      eos_token_ids: the checkpoint's stop token ids (``generation_config.json`` / the GGUF's
        ``eos_token_id``); default: the id of ``eos_token``.
      add_bos_token / add_eos_token: what ``tokenizer_config.json`` records (``save`` writes them; encoding
        follows the backend's post-processor, which ``from_gguf`` builds from them).
    """

    def __init__(self, backend: _Backend, *, special_tokens: dict | None = None, chat_template: str | None = None,
                 eos_token_ids: Sequence[int] | None = None, add_bos_token: bool = False,
                 add_eos_token: bool = False):
        if not isinstance(backend, _Backend):
            raise ValueError(f"backend: expected a tokenizers.Tokenizer, got {type(backend).__name__}")
        self.backend = backend
        special_tokens = dict(special_tokens or {})
        for k, v in special_tokens.items():
            if k not in SPECIAL_TOKEN_NAMES:
                raise ValueError(f"special_tokens: unknown name {k!r}; expected one of {SPECIAL_TOKEN_NAMES}")
            if v is not None and backend.token_to_id(v) is None:
                raise ValueError(f"special_tokens[{k!r}]: {v!r} is not in the vocabulary")
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        if chat_template is not None and not isinstance(chat_template, str):
            raise ValueError(f"chat_template: expected a string or None, got {type(chat_template).__name__}")
        self.chat_template = chat_template
        self.add_bos_token, self.add_eos_token = bool(add_bos_token), bool(add_eos_token)
        if eos_token_ids is None:
            eos_token_ids = () if self.eos_token_id is None else (self.eos_token_id,)
        eos = _ids(list(eos_token_ids), "eos_token_ids")
        for i in eos:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"eos_token_ids: {i} is not a token id in [0, {self.vocab_size})")
        self.eos_token_ids = tuple(dict.fromkeys(eos))

    # ------------------------------------------------------------------ special tokens
    def _id(self, name):
        tok = self.special_tokens.get(name)
        return None if tok is None else self.backend.token_to_id(tok)

    bos_token = property(lambda self: self.special_tokens.get("bos_token"))
    eos_token = property(lambda self: self.special_tokens.get("eos_token"))
    unk_token = property(lambda self: self.special_tokens.get("unk_token"))
    pad_token = property(lambda self: self.special_tokens.get("pad_token"))
    bos_token_id = property(lambda self: self._id("bos_token"))
    eos_token_id = property(lambda self: self._id("eos_token"))
    unk_token_id = property(lambda self: self._id("unk_token"))
    pad_token_id = property(lambda self: self._id("pad_token"))

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def added_special_tokens(self) -> tuple[str, ...]:
        """The added tokens marked special (skipped by ``decode(skip_special_tokens=True)``)."""
        return tuple(t.content for _, t in sorted(self.backend.get_added_tokens_decoder().items()) if t.special)

    @property
    def end_of_turn_token_id(self) -> int | None:
        """The special token the chat template closes an assistant turn with (e.g. ``<|im_end|>``), or None."""
        if self.chat_template is None:
            return None
        tok = _chat.end_of_turn_token(self.chat_template, self.special_tokens, self.added_special_tokens)
        return None if tok is None else self.backend.token_to_id(tok)

    @property
    def chat_stop_token_ids(self) -> tuple[int, ...]:
        """Where a chat reply stops: the checkpoint's stop tokens plus the template's end-of-turn token."""
        eot = self.end_of_turn_token_id
        return tuple(dict.fromkeys(self.eos_token_ids + (() if eot is None else (eot,))))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(int(i))

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the post-processor (e.g. a leading BOS)."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts: expected a list of str")
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (bytes that do not form complete UTF-8 come out as U+FFFD)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: {bad[0]} is not a token id in [0, {self.vocab_size})")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def detokenizer(self, skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        """A streaming decoder (``IncrementalDetokenizer``) for one sequence."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat
    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True, chat_template: str | None = None,
                            tools=None, documents=None, **kwargs) -> str:
        """The prompt text of one conversation (a list of ``{"role", "content"}`` dicts), rendered as
        transformers' ``apply_chat_template(..., tokenize=False)`` renders it. ``kwargs`` reach the template."""
        source = chat_template if chat_template is not None else self.chat_template
        if source is None:
            raise ValueError("chat_template: this tokenizer has no chat template (the checkpoint carries none); "
                             "pass chat_template=")
        return _chat.render_chat_template(source, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                          documents=documents, special_tokens=self.special_tokens, **kwargs)

    def encode_chat(self, messages, *, add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Token ids of ``apply_chat_template(...)`` (encoded without the post-processor's special tokens:
        the template writes its own, as in transformers)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs),
                           add_special_tokens=False)

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_dir(cls, path: str) -> "Tokenizer":
        """A Hugging Face checkpoint directory (see the module docstring for the files read)."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(f"{path}: no tokenizer.json (a Hugging Face fast-tokenizer file is needed)")
        backend = _Backend.from_file(tj)

        def load(name):
            p = os.path.join(path, name)
            if not os.path.isfile(p):
                return {}
            with open(p, encoding="utf-8") as f:
                return json.load(f)

        config, tmap = load("tokenizer_config.json"), load("special_tokens_map.json")
        special = {}
        for name in SPECIAL_TOKEN_NAMES:
            v = config.get(name, tmap.get(name))
            try:
                special[name] = _token_str(v)
            except ValueError as e:
                raise ValueError(f"{path}: tokenizer_config.json {name}: {e}") from None
        template = config.get("chat_template")
        jinja = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        elif isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            if "default" not in named:
                raise ValueError(f"{path}: tokenizer_config.json has named chat templates {sorted(named)} but no "
                                 f"'default'")
            template = named["default"]
        eos = None
        for source in ("generation_config.json", "config.json"):
            v = load(source).get("eos_token_id")
            if v is not None:
                eos = _ids(v, f"{path}/{source} eos_token_id")
                break
        return cls(backend, special_tokens=special, chat_template=template, eos_token_ids=eos,
                   add_bos_token=bool(config.get("add_bos_token", False)),
                   add_eos_token=bool(config.get("add_eos_token", False)))

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        """The tokenizer a GGUF file's ``tokenizer.ggml.*`` metadata describes (see the module docstring)."""
        meta = read_gguf_metadata(path, ("tokenizer.",))
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{path}: tokenizer.ggml.model is {kind!r}; only 'gpt2' (byte-level BPE) is supported")
        for key in ("tokens", "merges"):
            if f"tokenizer.ggml.{key}" not in meta:
                raise ValueError(f"{path}: byte-level BPE needs tokenizer.ggml.{key}, which the file lacks")
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if len(types) != len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        # A token outside the byte alphabet is stored as text: spell its UTF-8 bytes (as transformers does).
        spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
        vocab = {t: i for i, t in enumerate(spelled)}  # a repeated token keeps its last id (as transformers)
        merges = []
        for j, m in enumerate(meta["tokenizer.ggml.merges"]):
            parts = m.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{path}: tokenizer.ggml.merges[{j}] = {m!r} is not two tokens separated by a space")
            merges.append((parts[0], parts[1]))
        backend = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        backend.pre_tokenizer = gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        control = [AddedToken(t, normalized=False, special=True)
                   for t, ty in zip(tokens, types) if ty == 3 and set(t) <= alphabet]
        user = [AddedToken(t, normalized=False, special=False)
                for t, s, ty in zip(tokens, spelled, types) if ty == 4 and t == s]
        backend.add_special_tokens(control)
        backend.add_tokens(user)

        def tok(key):
            i = meta.get(f"tokenizer.ggml.{key}")
            if i is None:
                return None
            if not 0 <= i < len(tokens):
                raise ValueError(f"{path}: tokenizer.ggml.{key} = {i} is outside the {len(tokens)} tokens")
            return spelled[i]

        special = {"bos_token": tok("bos_token_id"), "eos_token": tok("eos_token_id"),
                   "unk_token": tok("unknown_token_id"), "pad_token": tok("padding_token_id")}
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        for flag, name in ((add_bos, "bos_token"), (add_eos, "eos_token")):
            if flag and special[name] is None:
                raise ValueError(f"{path}: tokenizer.ggml.add_{name} is set but the file has no {name} id")
        if add_bos or add_eos:
            backend.post_processor = _post_processor(special["bos_token"], vocab.get(special["bos_token"]),
                                                     special["eos_token"], vocab.get(special["eos_token"]),
                                                     add_bos, add_eos)
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(backend, special_tokens=special, chat_template=meta.get("tokenizer.chat_template"),
                   eos_token_ids=() if eos is None else (eos,), add_bos_token=add_bos, add_eos_token=add_eos)

    @classmethod
    def from_file(cls, path: str) -> "Tokenizer":
        """``from_gguf`` for a ``.gguf`` file, ``from_dir`` for a directory."""
        if os.path.isdir(path):
            return cls.from_dir(path)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                if f.read(4) == b"GGUF":
                    return cls.from_gguf(path)
        raise ValueError(f"path: expected a checkpoint directory or a .gguf file, got {path!r}")

    def save(self, path: str) -> None:
        """Write ``tokenizer.json``, ``tokenizer_config.json`` (special tokens, ``chat_template``, added-token
        table), ``special_tokens_map.json``, ``chat_template.jinja`` and, with stop tokens,
        ``generation_config.json`` into the directory ``path`` (created). ``from_dir`` reads it back to an
        equal tokenizer, and transformers' ``AutoTokenizer.from_pretrained(path)`` loads it."""
        os.makedirs(path, exist_ok=True)
        self.backend.save(os.path.join(path, "tokenizer.json"))
        added = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                          "single_word": t.single_word, "special": t.special}
                 for i, t in sorted(self.backend.get_added_tokens_decoder().items())}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": self.add_bos_token,
                  "add_eos_token": self.add_eos_token, "clean_up_tokenization_spaces": False,
                  "added_tokens_decoder": added, **self.special_tokens}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
            with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(self.chat_template)
        files = {"tokenizer_config.json": config, "special_tokens_map.json": dict(self.special_tokens)}
        if self.eos_token_ids:
            eos = list(self.eos_token_ids)
            gen = {"eos_token_id": eos[0] if len(eos) == 1 else eos}
            if self.bos_token_id is not None:
                gen["bos_token_id"] = self.bos_token_id
            gp = os.path.join(path, "generation_config.json")
            if os.path.isfile(gp):  # keep what a model writer put there; the stop tokens are ours
                with open(gp, encoding="utf-8") as f:
                    gen = {**json.load(f), **gen}
            files["generation_config.json"] = gen
        for name, obj in files.items():
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=2, ensure_ascii=False)
                f.write("\n")


class IncrementalDetokenizer:
    """Streaming text for one growing sequence of ids: ``push(ids)`` returns the new text that is final.

    The "decode a window and diff" method: the text of ``ids[prefix:]`` minus the text of
    ``ids[prefix:read]`` is new once it does not end in U+FFFD (a byte-level token may end inside a
    multi-byte UTF-8 character; the character is emitted when its last byte arrives). Decoding from
    ``prefix`` rather than from a single token keeps decoders that drop a leading space (SentencePiece's
    ``Metaspace``) exact. ``finish()`` returns what is left (incomplete bytes as U+FFFD), after which the
    pieces concatenate to ``decode(all ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids up to here have been emitted as text

    def _text(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: Iterable[int]) -> str:
        """Append ``ids`` to the sequence.

        Args:
          ids: the next token ids.

        Returns:
          the text that became final with them ("" while a character is still incomplete).
        """
        new = [int(i) for i in ids]
        if not new:
            return ""
        self.ids.extend(new)
        before = self._text(self.ids[self._prefix: self._read])
        after = self._text(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before):]
        return ""

    def finish(self) -> str:
        """The text not yet returned (the sequence is complete)."""
        before = self._text(self.ids[self._prefix: self._read])
        after = self._text(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return after[len(before):]
