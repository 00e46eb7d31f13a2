"""Tokenizer.from_gguf on small GGUF files written here with gguf's writer: a byte-level BPE trained with the
tokenizers library (its own tokenizer is the reference, as a model's tokenizer.json is), stored the way
llama.cpp's converter stores one (tokens, merges, token types, special ids, pre-tokenizer name, template).
Also the metadata reader against gguf.GGUFReader, and the refusals."""

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from jaxspec.text import Tokenizer
from jaxspec._gguf import GGUFFormatError, read_gguf_metadata
from jaxspec.text.tokenizer import _LLAMA3_SPLIT, KNOWN_GGUF_PRE

gguf = pytest.importorskip("gguf")

CORPUS = [
    "The quick brown fox jumps over the lazy dog 12 times in 2024.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "Ünïcödé text: café, naïve, 日本語, 中文, 🤗 emojis 🚀 and numbers 3.14159 2718.",
    "    indented    with   spaces\n\n\n\tand tabs, it's they're we've.",
] * 20
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER = ["<think>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXTS = CORPUS[:4] + ["", " ", "x  1 y", "a\n\n12", "<think>step 1</think> done<|im_end|>", "ß🇫🇷‍👩 12345 !!"]


def _pre(name):
    if name == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if name == "llama-bpe":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def _train(pre_name, add_bos):
    tok = Backend(models.BPE())
    tok.pre_tokenizer = _pre(pre_name)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=CONTROL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in USER])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B",
            special_tokens=[("<|im_start|>", tok.token_to_id("<|im_start|>"))])
    return tok


def _write_gguf(path, ref: Backend, pre_name, add_bos, *, model="gpt2", extra=None):
    import json  # noqa: PLC0415

    j = json.loads(ref.to_str())
    vocab = {**j["model"]["vocab"], **{t["content"]: t["id"] for t in j["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    types = [3 if t in CONTROL else 4 if t in USER else 1 for t in tokens]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre_name is not None:
        w.add_tokenizer_pre(pre_name)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_unk_token_id(vocab["<|endoftext|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(TEMPLATE)
    w.add_float32("tokenizer.test.scale", 0.5)
    w.add_array("tokenizer.test.ints", [1, -2, 3])
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def _random_texts(rng, n):
    pool = list("abcT019 \n\t.,'!é日🤗") + CONTROL + USER + ["  ", "\n\n", "'s", "\u200d"]
    return ["".join(rng.choice(pool, size=int(rng.integers(0, 30)))) for _ in range(n)]


@pytest.mark.parametrize("pre_name", ["smollm", "llama-bpe", "gpt2", None])
@pytest.mark.parametrize("add_bos", [False, True])
def test_from_gguf_encodes_as_the_trained_tokenizer(tmp_path, pre_name, add_bos):
    ref = _train(pre_name or "gpt2", add_bos)
    path = tmp_path / "t.gguf"
    _write_gguf(path, ref, pre_name, add_bos)
    ours = Tokenizer.from_gguf(str(path))
    assert ours.vocab_size == ref.get_vocab_size()
    seed = int(np.random.SeedSequence().entropy % 2**31)
    for t in TEXTS + _random_texts(np.random.default_rng(seed), 100):
        for special in (True, False):
            assert ours.encode(t, add_special_tokens=special) == ref.encode(t, add_special_tokens=special).ids, \
                (seed, t)
        ids = ours.encode(t, add_special_tokens=False)
        assert ours.decode(ids) == t
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    # control tokens are special (whole, skipped on request); the user-defined one is whole and kept
    ids = ours.encode("<think>x</think><|im_end|>", add_special_tokens=False)
    assert ids[0] == ours.token_to_id("<think>") and ids[-1] == ours.token_to_id("<|im_end|>")
    assert ours.decode(ids, skip_special_tokens=True) == "<think>x</think>"
    assert ours.bos_token == "<|im_start|>" and ours.eos_token == "<|im_end|>" and ours.pad_token == "<|endoftext|>"
    assert ours.eos_token_ids == (ours.token_to_id("<|im_end|>"),)
    assert ours.add_bos_token == add_bos
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_from_gguf_equals_transformers_for_a_pre_tokenizer_it_knows(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ref = _train("llama-bpe", False)
    _write_gguf(tmp_path / "t.gguf", ref, "llama-bpe", False)
    ours = Tokenizer.from_gguf(str(tmp_path / "t.gguf"))
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for t in TEXTS + _random_texts(np.random.default_rng(), 50):
        assert ours.encode(t) == hf.encode(t), t
    assert ours.special_tokens == hf.special_tokens_map


def test_metadata_reader_equals_gguf_reader(tmp_path):
    ref = _train("smollm", False)
    _write_gguf(tmp_path / "t.gguf", ref, "smollm", False, extra={"general.name": "tiny ✓"})
    ours = read_gguf_metadata(str(tmp_path / "t.gguf"))
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, float):
            assert ours[k] == pytest.approx(v, rel=0), k  # the same float32, widened
        else:
            assert ours[k] == v, k
    only = read_gguf_metadata(str(tmp_path / "t.gguf"), ("general.",))
    assert set(only) == {k for k in want if k.startswith("general.")}


def test_refusals(tmp_path):
    ref = _train("gpt2", False)
    _write_gguf(tmp_path / "unknown.gguf", ref, "no-such-split", False)
    with pytest.raises(ValueError, match=r"tokenizer.ggml.pre: unknown pre-tokenizer 'no-such-split'"):
        Tokenizer.from_gguf(str(tmp_path / "unknown.gguf"))
    _write_gguf(tmp_path / "spm.gguf", ref, None, False, model="llama")
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model is 'llama'; only 'gpt2'"):
        Tokenizer.from_gguf(str(tmp_path / "spm.gguf"))
    data = (tmp_path / "unknown.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:2000])
    with pytest.raises(GGUFFormatError, match="truncated"):
        Tokenizer.from_gguf(str(tmp_path / "cut.gguf"))
    (tmp_path / "not.gguf").write_bytes(b"GGML" + data[4:100])
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_gguf_metadata(str(tmp_path / "not.gguf"))
    with pytest.raises(ValueError, match="expected a checkpoint directory or a .gguf file"):
        Tokenizer.from_file(str(tmp_path / "not.gguf"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_dir(str(tmp_path))
    assert "smollm" in KNOWN_GGUF_PRE
