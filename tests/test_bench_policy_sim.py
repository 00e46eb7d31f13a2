"""``bench/policy_sim.py``: the adaptive policy replayed against the fixed modes on drawn acceptance (CPU)."""

import json

import numpy as np
import pytest

from bench_scripts import load


def test_chain_alpha_inverts_the_mean():
    sim = load("policy_sim")
    for mean in (1.0, 1.7, 2.5, 3.9):
        a = sim.chain_alpha(mean)
        assert abs(sum(a**k for k in range(4)) - mean) < 1e-9


@pytest.mark.parametrize("means,best_mode", [([3.6, 3.7], 2), ([1.05, 1.1], 0)])
def test_policy_sim_rows(tmp_path, means, best_mode):
    """Where a long chain clearly pays (mean 3.6-3.7 on a chain of 3: a ~0.95 per draft) the policy spends its
    rounds on it; where no draft pays (mean ~1.1) on plain decoding; either way within 10% of the best fixed mode."""
    src = tmp_path / "real_model.json"
    src.write_text(json.dumps(dict(rows=[dict(config="eagle3-chain3", temperature=0.0, accept_per_request=means)])))
    out = tmp_path / "sim.json"
    assert load("policy_sim").main(["--real-model", str(src), "--batches", "1,8", "--calls", "2", "--seeds", "1",
                                     "--costs", "1:1.0,1.2,1.3;8:1.0,1.4,1.7", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 8]
    for r in rows:
        assert 0.9 <= r["mean_ratio"] <= 1.0 + 1e-9 and r["worst_ratio"] <= r["mean_ratio"]
        assert int(np.argmax(r["mode_rounds"])) == best_mode, r
        assert r["best_fixed_mode"] == best_mode and 0.9 <= r["workload_ratio"] <= 1.1, r


def test_policy_sim_same_requests_and_policy(tmp_path):
    """``--same-requests``: every call decodes the same prompts (prompt 0 at batch 1: a chain that pays there is the
    best fixed mode although the other prompt's would not be); ``--policy`` reaches the policy, bad settings refused."""
    src = tmp_path / "real_model.json"
    src.write_text(json.dumps(dict(rows=[dict(config="eagle3-chain3", temperature=0.0, accept_per_request=[3.7, 1.0])])))
    out = tmp_path / "sim.json"
    args = ["--real-model", str(src), "--batches", "1", "--calls", "3", "--seeds", "2", "--costs", "1:1.0,1.2,1.3"]
    assert load("policy_sim").main(args + ["--same-requests", "--policy", "probe_interval=8", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["policy"] == {"probe_interval": 8}
    (row,) = got["rows"]
    assert row["best_fixed_mode"] == 2 and int(np.argmax(row["mode_rounds"])) == 2, row
    for bad, match in (("probe_interval=x", "a number"), ("foo=1", "KEY one of"), ("probe_rounds=0", "probe_rounds")):
        with pytest.raises(SystemExit, match=match):
            load("policy_sim").main(args + ["--policy", bad])


def test_policy_sim_refuses_a_missing_row(tmp_path):
    src = tmp_path / "real_model.json"
    src.write_text(json.dumps(dict(rows=[dict(config="eagle3-tree", temperature=0.0, accept_per_request=[2.0])])))
    with pytest.raises(SystemExit, match="eagle3-chain3"):
        load("policy_sim").main(["--real-model", str(src)])


def test_policy_sim_modes_from_two_rows(tmp_path):
    """Modes drawn from two configs' rows (the chain's and the tree's per-request means, request by request): where
    the tree accepts far more at a small extra cost the policy spends its rounds on it, within 10% of the best fixed
    mode; rows of different request counts and a malformed --modes are refused."""
    rows = [dict(config="eagle3-chain3", temperature=0.0, accept_per_request=[1.6, 1.8, 1.7]),
            dict(config="eagle3-tree", temperature=0.0, accept_per_request=[4.5, 4.8, 4.6])]
    src = tmp_path / "real_model.json"
    src.write_text(json.dumps(dict(rows=rows)))
    out = tmp_path / "sim.json"
    args = ["--real-model", str(src), "--modes", "eagle3-chain3:3,eagle3-tree:5", "--batches", "4", "--calls", "2",
            "--seeds", "1", "--costs", "4:1.0,1.3,1.5"]
    assert load("policy_sim").main(args + ["--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert 0.9 <= row["mean_ratio"] <= 1.0 + 1e-9 and int(np.argmax(row["mode_rounds"])) == 2, row
    rows[1]["accept_per_request"] = [4.5, 4.8]
    src.write_text(json.dumps(dict(rows=rows)))
    with pytest.raises(SystemExit, match="different request counts"):
        load("policy_sim").main(args)
    with pytest.raises(SystemExit, match="--modes"):
        load("policy_sim").main(["--real-model", str(src), "--modes", "eagle3-tree"])


def test_ramp_keeps_each_reply_mean_and_rises():
    """``--ramp F:T``: the factor starts at ``F / r`` and rises to ``1 / r`` at token ``T``, its mean over each
    request's own output is 1 (the reply's mean per-draft acceptance is kept), ``F = 1`` changes nothing; the
    option reaches the rows and bad values are refused."""
    sim = load("policy_sim")
    lengths = np.array([10, 100, 300])
    for n in lengths:
        f = sim.ramp_factor(np.full(n, n), (0.5, 64))(np.arange(n))
        assert abs(f.mean() - 1.0) < 1e-12 and np.all(np.diff(f) >= 0) and f[0] < f[-1]
        assert np.all(np.abs(sim.ramp_factor(np.full(n, n), (1.0, 64))(np.arange(n)) - 1.0) < 1e-12)
    assert np.all(sim.ramp_factor(lengths, None)(np.array([0, 5, 7])) == 1.0)


def test_policy_sim_ramp_option(tmp_path):
    src = tmp_path / "real_model.json"
    src.write_text(json.dumps(dict(rows=[dict(config="eagle3-chain3", temperature=0.0, accept_per_request=[3.6, 3.7])])))
    out = tmp_path / "sim.json"
    args = ["--real-model", str(src), "--batches", "1", "--calls", "2", "--seeds", "1", "--costs", "1:1.0,1.2,1.3"]
    assert load("policy_sim").main(args + ["--ramp", "0.6:128", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    rounds = got["rows"][0]["mode_rounds"]
    assert got["ramp"] == "0.6:128" and rounds[0] < sum(rounds[1:]), rounds  # drafts that pay: speculation
    for bad in ("0.6", "0:10", "1.5:10", "0.5:0", "a:b"):
        with pytest.raises(SystemExit, match="--ramp"):
            load("policy_sim").main(args + ["--ramp", bad])
