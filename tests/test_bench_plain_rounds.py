"""bench/plain_rounds.py on CPU with the shipped tiny pair: three rows (plain, the adaptive engine forced to plain,
the adaptive engine's policy), each with its rounds and ms per round, the tokens of every row equal to plain
decoding's (exit status 0), the forced row all plain rounds and as many as plain decoding's, the JSON written."""

import json

from bench_scripts import load


def test_plain_rounds_rows(tmp_path):
    pr = load("plain_rounds")
    out = tmp_path / "rows.json"
    assert pr.main(["--batch", "2", "--prompt", "5", "--max-new", "12", "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == ["plain", "adaptive, every round plain", "adaptive, its policy"]
    assert all(r["same_as_plain"] and r["ms_per_round"] > 0 for r in rows)
    assert rows[0]["ratio"] == 1.0 and rows[0]["mode_rounds"] is None
    assert rows[1]["rounds"] == rows[0]["rounds"] == 11  # prefill's token, then a round per token
    assert rows[1]["mode_rounds"] == [11, 0]
    assert sum(rows[2]["mode_rounds"]) == rows[2]["rounds"] <= 11
