"""bench/serving.py on the shipped tiny pair, on CPU: the in-process modes (plain, spec, adaptive) at one finite
rate and at saturation and the static baseline, a handful of requests each. Every row: the fields present, every
request finished within its limit, the output tokens summed over requests equal to the row's total, TTFT <= latency
per request; the http mode (through ``python -m jaxspec.serve``) the same, each request's tokens counted from its
streamed ``token_ids`` and equal to its usage."""

import importlib
import json
import math

import pytest

from bench_scripts import load

FIELDS = ("requests", "finished", "output_tokens", "duration_s", "request_throughput", "output_tok_s",
          "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tpot_mean_s", "chunk_gap_p50_s",
          "chunk_gap_p99_s", "mean_accept_length", "per_request", "limits")
ARGS = ["--tiny", "--device", "cpu", "--dtype", "float32", "--rates", "50,inf", "--http-rates", "inf",
        "--num-requests", "6", "--min-new", "3", "--max-new", "12", "--max-batch", "4", "--warmup", "2"]


def _run(tmp_path, modes):
    serving = load("serving")
    out = tmp_path / "serving.json"
    assert serving.main(ARGS + ["--modes", modes, "--json", str(out)]) == 0
    return json.loads(out.read_text())["rows"]


def _check(row):
    assert "error" not in row, row.get("error")
    for f in FIELDS:
        assert f in row, f
    per = row["per_request"]
    assert row["requests"] == row["finished"] == len(per) == 6
    assert sum(r["n"] for r in per) == row["output_tokens"]
    for r, limit in zip(per, row["limits"]):
        assert 1 <= r["n"] <= limit and r["finish_reason"] in ("stop", "length")
        assert r["ttft_s"] <= r["latency_s"]


def test_in_process_modes(tmp_path):
    rows = _run(tmp_path, "plain,spec,adaptive,static")
    assert [(r["mode"], r["rate"]) for r in rows] == [
        (m, x) for m in ("plain", "spec", "adaptive") for x in (50.0, math.inf)] + [("static", math.inf)]
    for row in rows:
        _check(row)
    # no stop token on the tiny pair: every request generates exactly its limit
    for row in rows:
        assert [r["n"] for r in row["per_request"]] == row["limits"]
    for row in rows[:-1]:  # the serving modes: where their steps' time went
        assert row["steps"] > 0 and row["host_ms_per_step"] > 0 and row["device_ms_per_step"] >= 0
        parts = sum(row[f"{p}_ms_per_step"] for p in ("plan", "dispatch", "update"))
        assert abs(parts - row["host_ms_per_step"]) <= 1e-6 * row["host_ms_per_step"] + 1e-9
    for row in rows:  # the adaptive rows: the policy's rounds per mode over the rate, its prices per slot bucket
        adaptive = row["mode"] == "adaptive"
        assert ("mode_rounds" in row) == adaptive and ("round_costs_ms" in row) == adaptive
        if adaptive:
            assert len(row["mode_rounds"]) == 3 and sum(row["mode_rounds"]) > 0
            assert all(len(c) == 3 and min(c) > 0 for c in row["round_costs_ms"].values())


def _server_importable() -> bool:
    try:
        importlib.import_module("jaxspec.serve")
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _server_importable(), reason="jaxspec.serve does not import in this tree")
def test_http_mode(tmp_path):
    rows = _run(tmp_path, "http")
    assert [r["mode"] for r in rows] == ["http"]
    _check(rows[0])
    # the in-process workload: the model's own stop tokens ignored, every request runs to its limit
    assert [r["n"] for r in rows[0]["per_request"]] == rows[0]["limits"]
