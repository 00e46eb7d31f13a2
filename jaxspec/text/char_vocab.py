"""A ``Tokenizer`` for the character vocabulary of ``jaxspec.models.MockVocab`` (the shipped tiny pairs' ids).

``char_tokenizer()`` builds it on the ``tokenizers`` library: a ``WordLevel`` model over MockVocab's characters
(id = position in ``MockVocab.chars``), a pre-tokenizer that isolates every character, and a ``Fuse`` decoder
(the pieces concatenated, nothing inserted between them), so ``encode(text)`` equals ``MockVocab.encode(text)``
for every text of those characters and ``decode`` gives the text back. A character outside the vocabulary is
an encoding error, as in ``MockVocab``. Ids past the characters (up to ``vocab_size``, the model's vocabulary)
are placeholder tokens ``<unused{id}>``, so every id a model of that vocabulary emits decodes.

Special tokens: ``eos_token`` ``"\\n"`` (id 1, the pairs' end of line and stop token), ``pad_token`` ``"\\x00"``
(id 0). The chat template (``CHAT_TEMPLATE``) writes each message as ``role: content`` and the EOS, and the
assistant prompt ``assistant: ``: only characters of the vocabulary, so a rendered conversation encodes.

The files next to the tiny pair (``jaxspec/assets/tiny_pair``: ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``chat_template.jinja``, ``generation_config.json``) are ``Tokenizer.save`` of
it, regenerated with::

    python -m jaxspec.text.char_vocab jaxspec/assets/tiny_pair
"""

import argparse

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _Backend

from jaxspec.models.vocab import MockVocab
from jaxspec.text.tokenizer import Tokenizer

CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


def char_tokenizer(vocab: MockVocab | None = None) -> Tokenizer:
    """The ``Tokenizer`` of ``vocab`` (default ``MockVocab()``: the tiny pairs' 64 ids); module docstring."""
    vocab = MockVocab() if vocab is None else vocab
    if not isinstance(vocab, MockVocab):
        raise ValueError(f"vocab: expected a jaxspec.models.MockVocab, got {type(vocab).__name__}")
    ids = {c: i for i, c in enumerate(vocab.chars)}
    ids.update({f"<unused{i}>": i for i in range(len(vocab.chars), vocab.vocab_size)})
    backend = _Backend(models.WordLevel(vocab=ids, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    special = {"eos_token": vocab.chars[vocab.eos_id], "pad_token": vocab.chars[vocab.pad_id]}
    return Tokenizer(backend, special_tokens=special, chat_template=CHAT_TEMPLATE, eos_token_ids=(vocab.eos_id,))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxspec.text.char_vocab",
                                description="Write the MockVocab character tokenizer (Tokenizer.save) into a "
                                            "checkpoint directory, e.g. jaxspec/assets/tiny_pair.")
    p.add_argument("out", help="the directory to write tokenizer.json, tokenizer_config.json, ... into")
    args = p.parse_args(argv)
    char_tokenizer().save(args.out)
    print(f"wrote the MockVocab tokenizer into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
