"""bench/real_model.py's ``hf`` part on CPU: transformers' ``generate`` on a tiny random llama checkpoint, one row
per path and batch size, every path from the model as loaded, a failing path a row of its own."""

import copy
import json
import os
import subprocess
import sys

import pytest
from bench_scripts import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 9, 17, 33, 65, 9, 17, 33], [7, 11, 13, 5, 9], [3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 2-layer llama (hidden 32, vocab 128) saved with ``save_pretrained``."""
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def _run_part(checkpoint, paths, batches="1,2", tokens=4):
    rm = load("real_model")
    args = rm._parse(["--model", checkpoint, "--questions", "unused.jsonl", "--hf", paths, "--batches", batches,
                      "--fixed-tokens", str(tokens), "--device", "cpu"])
    run = rm.Run(None, None, {})
    rows = rm.part_hf(run, PROMPTS, [int(b) for b in batches.split(",")], args, ours={})
    assert rows == run.doc["rows"]
    return rows


def test_paths_run_in_a_fixed_order_and_unknown_ones_are_refused():
    rm = load("real_model")
    assert rm.hf_paths("compile,pld,eager") == ["eager", "pld", "compile"]
    assert rm.hf_paths("compile,,eager") == ["eager", "compile"]
    with pytest.raises(SystemExit, match="unknown"):
        rm.hf_paths("eager,turbo")


def test_reset_removes_what_a_path_left_on_the_model(checkpoint):
    rm = load("real_model")
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    loaded = copy.deepcopy(model.generation_config)
    model.generation_config.cache_implementation = "static"  # what the hand-made recipe does to the model
    model.forward = torch.compile(model.forward)
    model._compiled_call, model._previous_max_cache_length = model.__call__, 99
    rm.reset_hf_model(model, loaded)
    assert "forward" not in model.__dict__ and not hasattr(model, "_compiled_call")
    assert not hasattr(model, "_previous_max_cache_length")
    assert model.generation_config.cache_implementation is None and model.generation_config is not loaded


def test_a_failing_path_is_an_error_row_and_the_others_still_run(checkpoint, monkeypatch, capsys):
    real = transformers.LlamaForCausalLM.generate

    def generate(self, *a, **kw):
        if kw.get("prompt_lookup_num_tokens"):
            raise RuntimeError("pld exploded")
        return real(self, *a, **kw)

    monkeypatch.setattr(transformers.LlamaForCausalLM, "generate", generate)
    rows = _run_part(checkpoint, "pld,eager")
    assert [(r["path"], r["batch"]) for r in rows] == [("eager", 1), ("eager", 2), ("pld", 1)]
    assert all(r["tokens"] == r["prompts"] * 4 and r["tok_s"] > 0 and "error" not in r for r in rows[:2])
    assert rows[2]["error"] == "RuntimeError: pld exploded" and "tokens" not in rows[2]
    assert "pld     b=1   failed: RuntimeError: pld exploded" in capsys.readouterr().out


# the part in a process of its own: the test session turns torch.compile off (TORCHDYNAMO_DISABLE)
_PART_ALONE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from bench_scripts import load
rm = load("real_model")
args = rm._parse(["--model", sys.argv[2], "--questions", "unused.jsonl", "--hf", "compile,eager,pld",
                  "--batches", "1,2", "--fixed-tokens", "4", "--device", "cpu"])
rows = rm.part_hf(rm.Run(None, None, {}), json.loads(sys.argv[3]), [1, 2], args, ours={})
graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
print("ROWS " + json.dumps(dict(rows=rows, graphs=graphs)))
"""


@pytest.mark.slow
def test_every_path_gives_rows_with_tokens(checkpoint):
    """eager, pld and compile (generate's automatic torch.compile, on CPU through transformers' own switch)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHDYNAMO_DISABLE"}
    done = subprocess.run([sys.executable, "-c", _PART_ALONE, os.path.dirname(os.path.abspath(__file__)), checkpoint,
                           json.dumps(PROMPTS)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("ROWS "))[5:])
    rows = out["rows"]
    assert [(r["path"], r["batch"]) for r in rows] == [("eager", 1), ("eager", 2), ("pld", 1), ("compile", 1),
                                                      ("compile", 2)]
    for r in rows:
        assert "error" not in r, r
        assert r["part"] == "hf" and r["engine"] == "transformers"
        assert r["tokens"] == r["prompts"] * 4 > 0 and r["seconds"] > 0 and r["tok_s"] > 0
    assert [r["prompts"] for r in rows] == [2, 2, 2, 2, 2]
    assert all(r["compiled"] for r in rows if r["path"] == "compile")
    assert out["graphs"] > 0  # torch.compile did trace the forward
