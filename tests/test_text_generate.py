"""TextGenerator over the Engine with a small random Decoder and a small trained byte-level BPE tokenizer (CPU, f32):
replies cut at the stop tokens (the engine's loop id and further host-side ids), finish reasons, chat prompts
through the template, streaming pieces equal to the whole reply, batches over max_batch, the loader for a
checkpoint directory; and the real SmolLM2 reply (slow; needs the cached GGUF)."""

import dataclasses
import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxspec.models import Decoder, DecoderConfig, save_model
from jaxspec.text import TextGenerator, TextOutput, Tokenizer, load_chat_model

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["the cat sat on the mat. ", "héllo wörld 🤗 日本語 ", "def f(x): return x + 1\n", "12 34 56 78 "] * 30


@pytest.fixture(scope="module")
def backend():
    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _tok(backend, eos_ids=(), template=None):
    return Tokenizer(backend, special_tokens={"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"},
                     chat_template=template, eos_token_ids=eos_ids)


@pytest.fixture(scope="module")
def model(backend):
    cfg = DecoderConfig(vocab_size=backend.get_vocab_size(), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.float32, kv_dtype=jnp.float32)


PROMPTS = ["the cat", "héllo 🤗", "def f(x):", "12"]
MAX = 24


@pytest.fixture(scope="module")
def free_run(model, backend):
    """Replies with no stop token at all: the reference sequences."""
    gen = TextGenerator(model, _tok(backend), max_context=64, max_batch=4)
    assert gen.engine.eos_id == -1
    outs = gen.run([gen.encode_prompt(p) for p in PROMPTS], max_new_tokens=MAX)
    for o in outs:
        assert len(o.token_ids) == MAX and o.finish_reason == "length"
    return outs


def test_reply_stops_at_the_checkpoints_stop_token(model, backend, free_run):
    ids0 = free_run[0].token_ids
    k = 3
    stop = ids0[k]
    first = ids0.index(stop)
    gen = TextGenerator(model, _tok(backend, eos_ids=(stop,)), max_context=64, max_batch=4)
    assert gen.engine.eos_id == stop  # stopped in the decode loop
    out = gen.run([gen.encode_prompt(PROMPTS[0])], stop_token_ids=gen.stop_token_ids, max_new_tokens=MAX)[0]
    assert out == TextOutput(backend.decode(ids0[:first], skip_special_tokens=True), ids0[:first], "stop")
    res = gen.engine.generate([gen.encode_prompt(PROMPTS[0])], MAX)
    assert res.tokens[0].tolist() == ids0[:first + 1]  # the loop ended there, the stop token kept by the engine
    assert gen.generate(PROMPTS[0], max_new_tokens=MAX) == out.text


def test_further_stop_ids_cut_on_the_host(model, backend, free_run):
    """Two stop ids: the engine loops on the first; the second (generated earlier) ends the text on the host."""
    ids1 = free_run[1].token_ids
    never = next(i for i in range(backend.get_vocab_size()) if all(i not in o.token_ids for o in free_run))
    stop = ids1[5]
    gen = TextGenerator(model, _tok(backend, eos_ids=(never, stop)), max_context=64, max_batch=4)
    assert gen.engine.eos_id == never
    outs = gen.run([gen.encode_prompt(p) for p in PROMPTS], stop_token_ids=gen.stop_token_ids, max_new_tokens=MAX)
    for o, ref in zip(outs, free_run):
        cut = ref.token_ids.index(stop) if stop in ref.token_ids else MAX
        assert o.token_ids == ref.token_ids[:cut]
        assert o.finish_reason == ("stop" if cut < MAX else "length")
    assert gen.generate(PROMPTS, max_new_tokens=MAX) == [o.text for o in outs]


def test_batches_past_max_batch_and_per_request_sampling(model, backend, free_run):
    gen = TextGenerator(model, _tok(backend), max_context=64, max_batch=2)
    outs = gen.run([gen.encode_prompt(p) for p in PROMPTS], max_new_tokens=MAX)
    assert [o.token_ids for o in outs] == [o.token_ids for o in free_run]
    sampled = gen.run([gen.encode_prompt(p) for p in PROMPTS], max_new_tokens=MAX,
                      temperature=[0.0, 1.0, 0.0, 1.0], seed=[0, 1, 2, 3])
    assert sampled[0].token_ids == free_run[0].token_ids and sampled[2].token_ids == free_run[2].token_ids
    with pytest.raises(ValueError, match=r"temperature: expected a scalar or one value per request \(4\)"):
        gen.run([gen.encode_prompt(p) for p in PROMPTS], temperature=[0.0, 1.0])
    with pytest.raises(ValueError, match="prompt_ids: expected a list of prompts"):
        gen.run([1, 2, 3])


def test_chat_uses_the_template_and_its_end_of_turn_token(model, backend):
    tok = _tok(backend, eos_ids=(backend.token_to_id("<|endoftext|>"),), template=CHATML)
    gen = TextGenerator(model, tok, max_context=64, max_batch=4)
    im_end = backend.token_to_id("<|im_end|>")
    assert gen.engine.eos_id == im_end  # the template's end-of-turn token stops the loop
    assert set(gen.chat_stop_token_ids) == {im_end, backend.token_to_id("<|endoftext|>")}
    conv = [{"role": "user", "content": "the cat"}]
    ids = tok.encode("<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert gen.chat_prompt_ids(conv) == ids
    want = gen.run([ids], stop_token_ids=gen.chat_stop_token_ids, max_new_tokens=16)[0].text
    assert gen.chat(conv, max_new_tokens=16) == want
    assert gen.chat([conv, conv], max_new_tokens=16) == [want, want]
    assert "".join(gen.stream_chat(conv, max_new_tokens=16)) == want
    with pytest.raises(ValueError, match=r"messages\[0\]: a message needs a 'role'"):
        gen.chat([{"content": "x"}])


@pytest.mark.parametrize("rounds", [1, 3])
def test_stream_pieces_are_the_reply(model, backend, free_run, rounds):
    for stop_at in (None, 4):
        ref = free_run[1]  # a prompt with multi-byte characters about
        eos = () if stop_at is None else (ref.token_ids[stop_at],)
        gen = TextGenerator(model, _tok(backend, eos_ids=eos), max_context=64, max_batch=4)
        whole = gen.run([gen.encode_prompt(PROMPTS[1])], stop_token_ids=gen.stop_token_ids, max_new_tokens=MAX)[0]
        pieces = list(gen.stream(PROMPTS[1], max_new_tokens=MAX, rounds_per_chunk=rounds))
        assert "".join(pieces) == whole.text
        assert all(pieces)  # no empty pieces (a random model's bytes need not be valid UTF-8: U+FFFD may appear)
        if stop_at is None:
            assert len(pieces) > 1


def test_refusals(model, backend):
    with pytest.raises(ValueError, match="tokenizer: expected a jaxspec.text.Tokenizer"):
        TextGenerator(model, backend)
    with pytest.raises(ValueError, match="eos_id: the stop tokens come from the tokenizer"):
        TextGenerator(model, _tok(backend), eos_id=3)
    small = dataclasses.replace(model.cfg, vocab_size=100) if hasattr(model, "cfg") else None
    if small is not None:
        with pytest.raises(ValueError, match="do not belong together"):
            TextGenerator(Decoder(small, rngs=nnx.Rngs(0)), _tok(backend))
    gen = TextGenerator(model, _tok(backend), max_context=64, max_batch=4)
    with pytest.raises(ValueError, match="prompts: expected a string or a non-empty list"):
        gen.generate([])
    with pytest.raises(ValueError, match="rounds_per_chunk"):
        next(gen.stream("x", rounds_per_chunk=0))
    with pytest.raises(ValueError, match="neither a named model"):
        load_chat_model("/no/such/checkpoint")


def test_load_chat_model_from_a_checkpoint_directory(model, backend, free_run, tmp_path):
    save_model(model, str(tmp_path))
    _tok(backend, template=CHATML).save(str(tmp_path))
    gen = load_chat_model(str(tmp_path), max_context=64, max_batch=4)
    assert gen.tokenizer.chat_template == CHATML
    assert gen.engine.eos_id == backend.token_to_id("<|im_end|>")
    out = gen.run([gen.encode_prompt(PROMPTS[0])], max_new_tokens=MAX)[0]
    cut = free_run[0].token_ids.index(gen.engine.eos_id) if gen.engine.eos_id in free_run[0].token_ids else MAX
    assert out.token_ids == free_run[0].token_ids[:cut]


GGUF = pathlib.Path(os.environ.get("JAXSPEC_CACHE", pathlib.Path.home() / ".cache" / "jaxspec")) / \
    "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} not fetched")
def test_smollm2_chat_reply_stops_at_im_end():
    chat = load_chat_model(str(GGUF), max_context=128, max_batch=1)
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    out = chat.run([chat.chat_prompt_ids(conv)], stop_token_ids=chat.chat_stop_token_ids, max_new_tokens=48)[0]
    assert out.finish_reason == "stop" and "Paris" in out.text and "<|im_end|>" not in out.text
    assert chat.chat(conv, max_new_tokens=48) == out.text
    assert "".join(chat.stream_chat(conv, max_new_tokens=48)) == out.text
    assert np.all(np.asarray(out.token_ids) != 2)
