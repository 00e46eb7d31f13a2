"""bench/invariance.py at CPU size: the matmul part in this process; the checks, the timing and the prefill part
(which run the batch-invariant mode, so need the XLA:CPU flag before jax starts) in a process of their own."""

import json
import os
import subprocess
import sys

import pytest
from bench_scripts import load

from jaxspec.kernels import CPU_INVARIANT_FLAG

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


def test_matmul_part_times_every_shape(tmp_path):
    inv = load("invariance")
    out = inv.main(["--device", "cpu", "--tiny", "--matmul", "--json", str(tmp_path / "m.json")])
    rows = out["matmul"]
    assert json.loads((tmp_path / "m.json").read_text())["matmul"] == rows
    assert {r["weight"] for r in rows} == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert all(r["m"] in (1, 4, 32, 128, 512) and r["default_us"] >= 0 and r["invariant_us"] >= 0 for r in rows)


def test_checks_and_timing_in_the_invariant_mode(tmp_path):
    path = tmp_path / "inv.json"
    env = dict(os.environ, XLA_FLAGS=CPU_INVARIANT_FLAG, JAX_PLATFORMS="cpu")
    args = ["--device", "cpu", "--tiny", "--checks", "--layers", "1", "--timing", "--prefill", "--batches", "2",
            "--configs", "plain,chain", "--context", "24", "--prompt", "20", "--max-new", "4", "--repeats", "1",
            "--json", str(path)]
    done = subprocess.run([sys.executable, "invariance.py", *args], cwd=BENCH, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(path.read_text())
    for name, got in out["checks"]["invariant"].items():
        assert got["bitwise"] == got["rows"] > 0, name
    assert [(r["config"], r["batch"]) for r in out["timing"]] == [("plain", 2), ("chain", 2)]
    assert all(r["default_tok_s"] > 0 and r["invariant_tok_s"] > 0 for r in out["timing"])
    parts = [r["part"] for r in out["prefill"]]
    assert parts == ["engine", "matmul", "matmul", "matmul", "attention"]
    engine = out["prefill"][0]
    assert engine["batch"] == 2 and engine["prompt_tokens"] >= 20
    assert all(engine[f"{m}_prefill_ms"] > 0 and engine[f"{m}_decode_ms_per_step"] > 0
               for m in ("default", "invariant"))


def test_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        load("invariance")._parse(["--timing", "--repeats", "0"])
    assert "--repeats: expected an int >= 1, got 0" in capsys.readouterr().err
