"""``bench/draft_replay.py``: the shipped SmolLM2 heads' replayed accept length by chain depth, on a few greedy
conversations of the seeded recipe (CPU; fetches the GGUF)."""

import json

import pytest

from bench_scripts import load


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_replay_by_depth_of_the_shipped_heads(tmp_path, kind):
    from jaxspec import train_draft as td
    from jaxspec.models.fetch import fetch_model
    from jaxspec.models.heads import shipped_head

    gguf = str(fetch_model("smollm2-135m-instruct", quiet=True))
    data = tmp_path / "dev"
    td.main(["--target", gguf, "--arch", "eagle3", "--out", str(data), "--stage", "data", "--recipe", "seeded",
             "--num-prompts", "3", "--gen-batch", "4", "--prompt-len", "24", "--response-len", "24",
             "--greedy-fraction", "1", "--seed", "1", "--device", "cpu"])
    out = load("draft_replay").main(["--model", gguf, "--head", shipped_head("smollm2-135m-instruct", kind),
                                     "--data", str(data / "data"), "--depths", "1,2,3", "--rows", "3", "--batch", "2",
                                     "--device", "cpu", "--json", str(tmp_path / "r.json")])
    acc = out["accept_by_depth"]
    assert sorted(acc) == [1, 2, 3] and out["kind"] == kind and out["rows"] == 3
    assert all(1.0 <= acc[d] <= d + 1 for d in acc)
    assert acc[1] <= min(acc[2], acc[3])  # a chain of one is never ahead of a longer one after any round
    assert json.loads((tmp_path / "r.json").read_text())["accept_by_depth"] == {str(k): v for k, v in acc.items()}
