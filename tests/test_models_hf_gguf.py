"""GGUF files against transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``), through
``jaxspec.interop.check_model``: tiny llama GGUFs written in the tests (f32: prompt logits within ``rtol =
1e-4`` of the logit scale, see check_model's docstring; greedy tokens identical), prompts of several lengths in
one batch, the bf16 report and its failure on a systematic error, "cannot compare" (exit 3) against "differs"
(exit 1); the real SmolLM2-135M-Instruct GGUF and its converted directory on 8 MT-Bench chat prompts (slow: the
98 MB model and the MT-Bench questions are downloaded once). Skipped without transformers / torch."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from test_models_gguf import CFG, random_hf, write_llama_gguf  # noqa: E402

from jaxspec.interop.check_model import (  # noqa: E402
    EXIT_CANNOT_COMPARE, CannotCompare, check_model, format_report, main, mtbench_questions, read_prompts_file)
from jaxspec.models import gguf as jgguf  # noqa: E402
from jaxspec.models.config import DecoderConfig  # noqa: E402

# Unit-scale weights (as tests/test_models_hf.py uses) so the argmax is well separated: random_hf's Decoder
# init is already fan-in scaled; a vocabulary of 128 and 2 layers keep transformers' load fast.
TIED = DecoderConfig(**{**CFG.__dict__, "tie_word_embeddings": True})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hfgguf")
    out = {}
    for qtype, cfg in (("F32", CFG), ("Q4_1", TIED)):
        _, hf = random_hf(cfg, tmp, seed=7)
        path = tmp / f"tiny-{qtype}.gguf"
        write_llama_gguf(path, cfg, hf, qtype=qtype, types={"token_embd.weight": "Q8_0"} if qtype != "F32" else None)
        out[qtype] = str(path)
    return out


@pytest.mark.parametrize("qtype", ["F32", "Q4_1"])
def test_tiny_gguf_matches_transformers(tiny, qtype):
    res = check_model(tiny[qtype], batch=2, prompt_len=12, new_tokens=16)
    print(format_report(res))
    assert res.logits_ok, (res.max_abs_diff, res.logit_scale)
    assert res.greedy_ok and res.ok and all(p.first_diff is None for p in res.prompts)


def test_prompts_of_different_lengths_in_one_batch(tiny):
    """Right-padded rows prefilled together give each row's own (batch-1, unpadded) transformers result."""
    rng = np.random.default_rng()
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (3, 11, 1, 7)]
    res = check_model(tiny["F32"], prompts=prompts, new_tokens=12)
    assert [p.prompt_len for p in res.prompts] == [3, 11, 1, 7]
    assert res.ok, format_report(res)


def test_permutation_left_in_is_caught(tiny, monkeypatch):
    """The check can fail: a loader that forgot to undo llama.cpp's q/k permutation is a logit mismatch."""
    monkeypatch.setattr(jgguf, "unpermute_rope_rows", lambda w, n_head: w)
    res = check_model(tiny["F32"], batch=2, prompt_len=12, new_tokens=4)
    assert not res.logits_ok and not res.ok


def test_bf16_report(tiny):
    """bf16 jaxspec against bf16 transformers: each side's prompt-logit error against the f32 reference is
    measured (jaxspec's no worse than twice transformers'), each divergence reported with both sides' top-2 gaps,
    margins over the other's choice and the f32 reference's margin at the first differing position."""
    res = check_model(tiny["F32"], batch=4, prompt_len=12, new_tokens=24, dtype="bfloat16")
    text = format_report(res)
    print(text)
    assert res.dtype == res.hf_dtype == "bfloat16" and not res.exact
    assert 0 < res.err_jax < 5e-2 and 0 < res.err_hf < 5e-2  # bf16 really ran, on both sides
    assert res.tie_tol == max(res.abs_err_jax, res.abs_err_hf)
    assert res.err_ok and res.ok, text
    assert "prompt logits against transformers float32: jaxspec bfloat16" in text
    for p in res.prompts:
        if p.first_diff is not None:
            assert p.gap_jax >= 0 and p.gap_hf >= 0 and p.jax_token != p.hf_token and p.ref_margin is not None
            assert p.margin_jax is None or p.margin_jax >= p.gap_jax
            assert p.margin_hf is None or p.margin_hf >= p.gap_hf
            assert f"first difference at token {p.first_diff}" in text


def test_bf16_systematic_error_is_caught(tiny, monkeypatch):
    """The bf16 check can fail: a coarser rounding inside every norm on the jaxspec side only (as a lost f32
    upcast would be) makes its error against f32 several times transformers'."""
    import jax.numpy as jnp

    from jaxspec.models import decoder

    orig = decoder.RMSNorm.__call__

    def coarse(self, x):  # the normed activations rounded to 4 significant bits (bf16 keeps 8)
        m, e = jnp.frexp(orig(self, x))
        return jnp.ldexp(jnp.round(m * 16) / 16, e)

    monkeypatch.setattr(decoder.RMSNorm, "__call__", coarse)
    res = check_model(tiny["F32"], batch=2, prompt_len=12, new_tokens=4, dtype="bfloat16")
    assert not res.err_ok and not res.ok, format_report(res)
    assert "MISMATCH" in format_report(res)


def test_reference_refusing_the_checkpoint_cannot_compare(tmp_path, capsys):
    """A GGUF without llama.vocab_size (and no token list) loads in jaxspec (the embedding's row count) but
    transformers sizes the model for 32000 tokens and refuses it: exit 3 with transformers' error, not exit 1."""
    _, hf = random_hf(CFG, tmp_path, seed=3)
    path = tmp_path / "novocab.gguf"
    write_llama_gguf(path, CFG, hf, vocab_size_key=False)
    assert jgguf.read_gguf_config(str(path)).vocab_size == CFG.vocab_size
    with pytest.raises(CannotCompare, match="cannot load"):
        check_model(str(path), batch=1, prompt_len=4, new_tokens=2)
    assert main([str(path), "--batch", "1", "--prompt-len", "4", "--new-tokens", "2"]) == EXIT_CANNOT_COMPARE == 3
    err = capsys.readouterr().err
    assert "check_model: cannot compare: transformers " in err and "novocab.gguf: RuntimeError" in err


def test_jaxspec_refusing_the_checkpoint_is_exit_2(tmp_path, capsys):
    _, hf = random_hf(CFG, tmp_path, seed=3)
    path = tmp_path / "gpt2.gguf"
    write_llama_gguf(path, CFG, hf, arch="gpt2")
    assert main([str(path), "--new-tokens", "2"]) == 2
    assert "gpt2" in capsys.readouterr().err


def test_mtbench_question_order():
    qs = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
          for i, c in enumerate(["a", "a", "a", "b", "b", "c"])]
    assert [q["question_id"] for q in mtbench_questions(6, qs)] == [0, 3, 5, 1, 4, 2]
    assert [q["question_id"] for q in mtbench_questions(3, qs)] == [0, 3, 5]
    with pytest.raises(ValueError, match="mtbench: expected 1 <= n <= 6, got 7"):
        mtbench_questions(7, qs)


def test_cli_prompts_file_and_json(tiny, tmp_path, capsys):
    rng = np.random.default_rng()
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps([rng.integers(0, CFG.vocab_size, n).tolist() for n in (5, 9)]))
    out = tmp_path / "r.json"
    assert main([tiny["Q4_1"], "--prompts-file", str(pf), "--new-tokens", "6", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 of 2 identical" in text and text.strip().endswith("match")
    rep = json.loads(out.read_text())
    assert rep["ok"] and [p["prompt_len"] for p in rep["prompts"]] == [5, 9]
    pf.write_text(json.dumps([[1, 2], [CFG.vocab_size]]))
    assert main([tiny["Q4_1"], "--prompts-file", str(pf)]) == 2
    assert "entry 1: token id 128 is outside the vocabulary (size 128)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="entry 0: expected a non-empty list"):
        pf.write_text("[[]]")
        read_prompts_file(str(pf))


def test_converted_directory_matches_transformers(tiny, tmp_path):
    """The directory convert writes is a checkpoint transformers loads on its own (no GGUF involved)."""
    from jaxspec.convert import convert_gguf

    d = convert_gguf(tiny["Q4_1"], tmp_path / "hf")
    res = check_model(str(d), batch=2, prompt_len=10, new_tokens=12)
    assert res.ok, format_report(res)


# ----------------------------------------------------------------------------------------------------
# the real model

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2():
    """The SmolLM2-135M-Instruct GGUF and 8 MT-Bench first turns (one per category) through its chat template
    (both fetched once into the cache, hash-checked)."""
    from jaxspec.interop.check_model import mtbench_prompts
    from jaxspec.models.fetch import fetch_model

    path = str(fetch_model(SMOLLM2, quiet=True))
    return path, mtbench_prompts(path, 8)


@pytest.mark.slow
def test_smollm2_f32_matches_transformers(smollm2):
    """SmolLM2-135M-Instruct (Q4_1 GGUF), f32: 8 MT-Bench prompts x 64 greedy tokens identical, logits within
    1e-4 of their scale."""
    path, prompts = smollm2
    res = check_model(path, prompts=prompts, new_tokens=64)
    print(format_report(res))
    assert len(res.prompts) == 8 and res.logits_ok and res.greedy_ok and res.ok, format_report(res)


@pytest.mark.slow
def test_smollm2_converted_directory_matches_transformers(smollm2, tmp_path):
    """The directory python -m jaxspec.convert writes, read by transformers as a plain checkpoint: the
    same 8 prompts x 64 tokens identical in f32."""
    from jaxspec.convert import convert_gguf

    path, prompts = smollm2
    d = convert_gguf(path, tmp_path / "hf")
    res = check_model(str(d), prompts=prompts, new_tokens=64)
    print(format_report(res))
    assert res.logits_ok and res.greedy_ok and res.ok, format_report(res)


@pytest.mark.slow
def test_smollm2_bf16_divergences_are_near_ties(smollm2):
    """bf16 on both sides: jaxspec's logit error against f32 no worse than twice transformers', and every prompt
    whose greedy path parts does so at a near-tie (each side prefers its token by less than the bf16 error)."""
    path, prompts = smollm2
    res = check_model(path, prompts=prompts, new_tokens=64, dtype="bfloat16")
    print(format_report(res))
    assert res.err_ok and res.near_ties_ok and res.ok, format_report(res)


def test_divergence_margins_from_each_sides_top_k():
    """An exact tie on one side (gap 0, the lower index wins) and several close candidates on the other are
    near-ties; a choice outside the other side's top K never is."""
    from jaxspec.interop.check_model import _reports

    toks_j, toks_h = np.array([[5, 7], [5, 1]]), np.array([[5, 9], [5, 2]])
    ids_j = np.array([[[5, 0, 0], [7, 3, 9]], [[5, 0, 0], [1, 3, 4]]])
    vals_j = np.array([[[9.0, 1, 1], [4.0, 3.98, 3.95]], [[9.0, 1, 1], [4.0, 3.9, 3.8]]], np.float32)
    ids_h = np.array([[[5, 0, 0], [9, 7, 2]], [[5, 0, 0], [2, 1, 3]]])
    vals_h = np.array([[[9.0, 1, 1], [4.0, 4.0, 3.0]], [[9.0, 1, 1], [4.0, 3.0, 2.0]]], np.float32)
    a, b = _reports([3, 3], toks_j, toks_h, vals_j, ids_j, vals_h, ids_h)
    assert (a.first_diff, a.jax_token, a.hf_token, a.runner_up_jax, a.runner_up_hf) == (1, 7, 9, 3, 7)
    assert a.gap_jax == pytest.approx(0.02, abs=1e-6) and a.gap_hf == 0.0
    assert a.margin_jax == pytest.approx(0.05, abs=1e-6) and a.margin_hf == 0.0 and not a.crossed
    assert a.near_tie(0.1) and not a.near_tie(0.01)
    assert b.margin_jax is None and b.margin_hf == pytest.approx(1.0) and not b.near_tie(100.0)


@pytest.mark.slow
def test_smollm2_converted_directory_carries_the_tokenizer(tmp_path):
    """convert writes the GGUF's own tokenizer and chat template: jaxspec and transformers read the directory's
    tokenizer back to the GGUF's encodings and chat prompt, and its stop token."""
    import transformers

    from jaxspec.convert import convert_gguf
    from jaxspec.models.fetch import fetch_model
    from jaxspec.text import Tokenizer

    path = str(fetch_model(SMOLLM2, quiet=True))
    d = convert_gguf(path, tmp_path / "hf", dtype="bfloat16")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (tmp_path / "hf" / name).is_file(), name
    src, back = Tokenizer.from_gguf(path), Tokenizer.from_dir(d)
    hf = transformers.AutoTokenizer.from_pretrained(d)
    msgs = [{"role": "user", "content": "Write a haiku about 12 apples:\n  - in 3 lines, café ☕"}]
    assert back.encode_chat(msgs) == src.encode_chat(msgs)
    assert hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == src.apply_chat_template(msgs)
    text = "def f(x):\n    return x ** 2  # 1234567 ünïcödé  \t\n\n"
    assert back.encode(text) == src.encode(text) == hf(text)["input_ids"]
    assert back.chat_stop_token_ids == src.chat_stop_token_ids
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["eos_token_id"] == 2
