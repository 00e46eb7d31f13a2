"""bench/train_profile.py at a tiny size on the CPU: every stage timed, the JSON written, a full-vocabulary head."""

import json

from bench_scripts import load


def test_train_profile_writes_every_stage(tmp_path):
    tp = load("train_profile")
    out = tmp_path / "p.json"
    result = tp.main(["--out", str(out), "--batch", "2", "--seq", "16", "--layers", "3", "--ttt-length", "2",
                      "--draft-vocabs", "32,49152", "--reps", "1", "--device", "cpu"])
    assert json.loads(out.read_text()) == result
    assert result["backend"] == "cpu" and [r["draft_vocab"] for r in result["rows"]] == [32, 49152]
    for row in result["rows"]:
        assert all(row[k] > 0 for k in ("teacher_ms", "student_ms", "update_ms", "step_ms", "loss_step0"))
        assert abs(row["tokens_per_s"] - 2 * 16 / (row["step_ms"] / 1e3)) < 1e-6 * row["tokens_per_s"]
    small, full = result["rows"]
    assert full["head_params"] - small["head_params"] == 576 * (49152 - 32)  # the LM head's rows, nothing else


def test_train_profile_teacher_attention_rows(tmp_path):
    """One row per draft vocabulary and teacher attention; the fused XLA attention trains the same step (the same
    weights: step-0 losses within f32 rounding of the reference's)."""
    result = load("train_profile").main(["--out", str(tmp_path / "p.json"), "--batch", "2", "--seq", "16", "--layers",
                                         "2", "--ttt-length", "2", "--draft-vocabs", "32", "--teacher-attention",
                                         "reference,xla", "--reps", "1", "--device", "cpu"])
    ref, xla = result["rows"]
    assert (ref["teacher_attention"], xla["teacher_attention"]) == ("reference", "xla")
    assert abs(ref["loss_step0"] - xla["loss_step0"]) <= 1e-5 * abs(ref["loss_step0"])
    import pytest

    with pytest.raises(ValueError, match="--teacher-attention"):
        load("train_profile").main(["--out", str(tmp_path / "q.json"), "--teacher-attention", "flash",
                                    "--device", "cpu"])
