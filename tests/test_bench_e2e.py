"""``bench/e2e.py --tiny`` (the end-to-end bench's CPU path): every config produces rows with the fields the
report needs, simulated rows say so, speculative rows run per draft vocabulary, adaptive rows record their modes and calibrated costs, and the tiny
pair's accept-length histograms are recorded. Slow (CPU compiles of four decode loops and the breakdown
pieces)."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_e2e_tiny_rows(tmp_path):
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), "--tiny", "--draft-vocab", "0,300", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    rows = d["rows"]
    assert {r["config"] for r in rows} == {"plain", "chain", "tree", "adaptive"}
    for cname, s in (("chain", 3), ("tree", 5)):
        pair = d["pairs"][cname]
        assert len(pair["histogram"]) == s + 1 and sum(pair["histogram"]) > 0
        assert abs(sum(pair["probs"]) - 1) < 1e-9 and 1.0 <= pair["mean"] <= s + 1
    for row in rows:
        assert row["tok_s"] > 0 and row["ms_round"] > 0 and row["roofline_ms"] > 0 and row["compile_s"] >= 0
        if row["config"] == "plain":
            assert row["sim"] == "-" and row["efficiency"] == pytest.approx(1.0, rel=1e-9)
        elif row["config"] == "adaptive":  # rounds per mode (plain, chain, tree) and the calibrated costs
            assert "sim" in row["sim"] and len(row["mode_rounds"]) == 3 and sum(row["mode_rounds"]) > 0
            assert len(row["round_costs_ms"]) == 3 and min(row["round_costs_ms"]) > 0
            assert row["tok_s_cold"] > 0 and sum(row["mode_rounds_cold"]) > 0  # the cold-start loops too
        else:
            assert "sim" in row["sim"]  # every simulated row says so
            assert {"draft_ms", "verify_ms", "bookkeeping_ms"} <= set(row)
    # every speculative config ran with the full and with a 300-token draft vocabulary; the reduced draft head
    # reads less, so its roofline is lower
    for cname in ("chain", "tree", "adaptive"):
        assert {r["draft_vocab"] for r in rows if r["config"] == cname} == {0, 300}
    roof = {r["draft_vocab"]: r["roofline_ms"] for r in rows if r["config"] == "chain" and r["sim"].endswith("mean 3.0")}
    assert roof[300] < roof[0]
    sims = {r["sim"] for r in rows if r["config"] == "chain"}
    assert any("mean 2.0" in s for s in sims) and any("mean 3.0" in s for s in sims) and any("pair" in s for s in sims)


@pytest.mark.slow
def test_e2e_tiny_rows_in_the_batch_invariant_mode(tmp_path):
    import os

    from jaxspec.kernels import CPU_INVARIANT_FLAG

    out = tmp_path / "e2e.json"
    env = dict(os.environ, XLA_FLAGS=CPU_INVARIANT_FLAG, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), "--tiny", "--batch-invariant", "--configs",
                        "plain,chain", "--breakdown", "", "--no-pairs", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert "--batch-invariant" in d["argv"]
    assert {r["config"] for r in d["rows"]} == {"plain", "chain"} and all(r["tok_s"] > 0 for r in d["rows"])
