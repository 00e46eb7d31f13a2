"""The tiny pair's shipped tokenizer (``jaxspec.text.char_vocab``): it encodes as ``MockVocab.encode``, decodes
back, and the files next to the pair are what ``python -m jaxspec.text.char_vocab`` writes."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec.models import DEFAULT_WEIGHTS, MockVocab
from jaxspec.text import Tokenizer
from jaxspec.text.char_vocab import char_tokenizer, main

VOCAB = MockVocab()
SHIPPED = Tokenizer.from_dir(DEFAULT_WEIGHTS)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=VOCAB.chars, max_size=40))
def test_encode_equals_mockvocab_and_decode_inverts(text):
    ids = SHIPPED.encode(text)
    assert ids == VOCAB.encode(text).tolist()
    assert SHIPPED.decode(ids) == text


def test_stop_tokens_template_and_vocabulary():
    assert SHIPPED.vocab_size == VOCAB.vocab_size
    assert SHIPPED.eos_token_ids == (VOCAB.eos_id,) and SHIPPED.chat_stop_token_ids == (VOCAB.eos_id,)
    conv = [{"role": "user", "content": "count: 1 2 3"}]
    text = SHIPPED.apply_chat_template(conv)
    assert text == "user: count: 1 2 3\nassistant: "
    assert SHIPPED.encode_chat(conv) == VOCAB.encode(text).tolist()
    # ids past the characters decode to their placeholder (a model of 64 ids emits any of them)
    assert SHIPPED.decode([len(VOCAB.chars)]) == f"<unused{len(VOCAB.chars)}>"


def test_a_character_outside_the_vocabulary_is_an_error():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        VOCAB.encode("Hi")
    with pytest.raises(Exception, match="UNK"):
        SHIPPED.encode("Hi")


def test_shipped_files_are_what_the_command_writes(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["chat_template.jinja", "generation_config.json", "special_tokens_map.json",
                       "tokenizer.json", "tokenizer_config.json"]
    for name in written:
        assert (tmp_path / name).read_bytes() == (Path(DEFAULT_WEIGHTS) / name).read_bytes(), name
    assert char_tokenizer().encode("ab c") == SHIPPED.encode("ab c")
