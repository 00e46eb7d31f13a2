"""``python -m jaxspec.demo``: the draft head is found (the shipped EAGLE-3 head first, then the MTP one, a clear
error naming both when neither exists), its layout recognised, the XLA:CPU options chosen per model without
overriding the user's, bad arguments refused, acceptance per draft position counted from the rounds' accept
lengths; the demo's decode and breakdown helpers on a tiny random EAGLE-3 pair (round-by-round decoding gives the
timed loop's tokens, lossless against plain decoding); the whole demo on the tiny shipped pair and on SmolLM2 with
its shipped head (slow)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import demo
from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import DEFAULT_WEIGHTS, Decoder, DecoderConfig, EAGLE3Drafter, EAGLE3Model, Eagle3Config
from jaxspec.models import aux_layers_from_ids, head_kind


def _eagle3_dir(path):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}, f)
    return str(path)


def _mtp_dir(path):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "num_nextn_predict_layers": 1}, f)
    open(os.path.join(path, "mtp.safetensors"), "wb").close()
    return str(path)


def test_find_head_prefers_the_shipped_eagle3_head(tmp_path):
    e, m = str(tmp_path / "e"), str(tmp_path / "m")
    shipped = {"eagle3": e, "mtp": m}
    with pytest.raises(FileNotFoundError) as err:
        demo.find_head(None, shipped)
    assert e in str(err.value) and m in str(err.value) and "train_draft" in str(err.value)
    _mtp_dir(m)
    assert demo.find_head(None, shipped) == (m, "mtp")
    _eagle3_dir(e)
    assert demo.find_head(None, shipped) == (e, "eagle3")
    assert demo.find_head(m, shipped) == (m, "mtp")  # an explicit head wins
    with pytest.raises(FileNotFoundError, match="no such directory"):
        demo.find_head(str(tmp_path / "none"), shipped)


def test_head_kind_refuses_other_directories(tmp_path):
    with pytest.raises(ValueError, match="--head .*: no config.json"):
        head_kind(str(tmp_path), arg="--head")
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"]}, f)
    with pytest.raises(ValueError, match="neither an EAGLE-3"):
        head_kind(str(tmp_path))
    shipped = {"eagle3": _mtp_dir(tmp_path / "wrong"), "mtp": str(tmp_path / "m")}
    with pytest.raises(ValueError, match="expected an eagle3 head"):
        demo.find_head(None, shipped)


def test_shipped_head_paths():
    assert demo.SHIPPED_HEADS == {
        "eagle3": os.path.join(demo.HEADS_DIR, "smollm2-135m-instruct-eagle3"),
        "mtp": os.path.join(demo.HEADS_DIR, "smollm2-135m-instruct-mtp")}
    assert os.path.samefile(os.path.dirname(demo.HEADS_DIR), os.path.dirname(DEFAULT_WEIGHTS))


def test_cpu_xla_flags_per_model():
    """The options of the chosen model kind join the user's XLA_FLAGS, never override an option the user set, and
    are added only for the jaxlib versions they were measured with; SmolLM2 runs under XLA's defaults (YNNPACK on)."""
    pair = demo.CPU_XLA_FLAGS["pair"]
    want = [f"{k}={v}" for k, v in pair.items()]
    assert demo.cpu_xla_flags("", "0.10.2", pair).split() == want
    assert demo.cpu_xla_flags(" --xla_cpu_enable_fast_math=false ", "0.10.2", pair).split() == [
        "--xla_cpu_enable_fast_math=false", *want]
    mine = "--xla_cpu_multi_thread_eigen=true"
    assert demo.cpu_xla_flags(mine, "0.10.2", pair).split() == [mine, "--xla_cpu_experimental_ynn_fusion_type="]
    assert demo.cpu_xla_flags(mine, "9.0.0", pair) == mine and demo.cpu_xla_flags("", "9.0.0", pair) == ""
    assert "--xla_cpu_experimental_ynn_fusion_type" not in demo.CPU_XLA_FLAGS["model"]
    assert demo.cpu_xla_flags(mine, "0.10.2", demo.CPU_XLA_FLAGS["model"]).split()[0] == mine


def test_demo_rejects_bad_arguments(capsys):
    for argv, flag in ((["--prompts", "0"], "--prompts"), (["--max-new", "0"], "--max-new"),
                       (["--repeats", "0"], "--repeats"), (["--page-size", "0"], "--page-size"),
                       (["--prompts", str(len(demo.PROMPTS) + 1)], "--prompts"),
                       (["--weights", "x", "--head", "y"], "--head")):
        with pytest.raises(SystemExit) as e:
            demo.main(argv)
        assert e.value.code == 2 and flag in capsys.readouterr().err


def test_demo_without_a_head_says_so(capsys, monkeypatch, tmp_path):
    for name in ("JAX_PLATFORMS", "XLA_FLAGS"):  # the demo sets both: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(demo, "SHIPPED_HEADS", {"eagle3": str(tmp_path / "e"), "mtp": str(tmp_path / "m")})
    assert demo.main([]) == 2
    err = capsys.readouterr().err
    assert "no draft head" in err and str(tmp_path / "e") in err and str(tmp_path / "m") in err


def test_prompts_are_the_demos_own():
    assert len(demo.PROMPTS) >= 3 and len(set(demo.PROMPTS)) == len(demo.PROMPTS)
    assert all(isinstance(p, str) and 10 < len(p) < 200 for p in demo.PROMPTS)


def test_acceptance_per_position():
    assert demo.acceptance_per_position([1, 2, 4, 3], 3) == [0.75, 0.5, 0.25]
    assert demo.acceptance_per_position([], 2) == [0.0, 0.0]


# A tiny random target with EAGLE-3 taps and a random EAGLE-3 head (the demo's helpers, fast).
V, H, VD = 80, 32, 40
TARGET = DecoderConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0)


@pytest.fixture(scope="module")
def eagle3_pair():
    target = Decoder(TARGET, rngs=nnx.Rngs(4), aux_layers=aux_layers_from_ids((0, 1, 2), 3), kv_dtype=jnp.float32)
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=VD, aux_layer_ids=(0, 1, 2))
    d2t = np.arange(0, 2 * VD, 2) - np.arange(VD)
    head = EAGLE3Model(cfg, rngs=nnx.Rngs(5), kv_dtype=jnp.float32, d2t=d2t)
    return target, EAGLE3Drafter(head, target)


def test_decode_helpers_on_an_eagle3_pair(eagle3_pair):
    """Round-by-round decoding (the demo's first run) gives the tokens of the timed loop, its accept lengths add up
    to the committed tokens, the chain is lossless against plain decoding, and the breakdown's parts run."""
    target, drafter = eagle3_pair
    spec = SpecConfig(3, 1, 4)
    kw = dict(max_context=64, page_size=8, max_batch=1)
    plain, chain = Engine(target, None, **kw), Engine(target, drafter, spec=spec, **kw)
    ids = [3, 7, 1, 9, 4]
    out = {}
    for name, eng in (("plain", plain), ("chain", chain)):
        state, secs, lens = demo.decode_rounds(eng, ids, 12)
        res = Engine.result(state)
        assert secs > 0 and sum(lens) == int(res.num_accepted[0]) and len(lens) == int(res.num_rounds[0])
        assert all(1 <= a <= (1 if name == "plain" else spec.num_steps + 1) for a in lens)
        timed, secs, prefill_secs = demo.decode_timed(eng, ids, 12)
        assert 0 < prefill_secs < secs
        np.testing.assert_array_equal(Engine.result(timed).tokens[0], res.tokens[0])
        out[name] = res.tokens[0]
    np.testing.assert_array_equal(out["chain"], out["plain"])
    calls = {"verify": demo.forward_call(target, 4, 20, 8), "draft": demo.draft_call(target, drafter, spec, 20, 8)}
    parts = demo.fastest_interleaved(calls, 2)
    assert set(parts) == {"verify", "draft"} and all(0 < t < 60 for t in parts.values())


def demo_table(out: str) -> dict:
    """The demo's table: mode -> (accept len, tokens/s, run s, compile s, median s)."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mode"])
    rows = {}
    for line in lines[head + 1:]:
        if not line.strip():
            break
        mode, accept, tok_s, run_s, compile_s, median_s = line.split()
        rows[mode] = (float(accept), float(tok_s), float(run_s), float(compile_s), float(median_s))
    return rows


def _check_output(out: str, modes):
    assert "outputs identical" in out and "DIFFER" not in out
    rows = demo_table(out)
    assert list(rows) == ["plain", *modes]
    assert rows["plain"][0] == 1.0
    assert all(r[1] > 0 and 0 < r[2] <= r[4] for r in rows.values())  # run s: the fastest runs, <= the medians
    for m in modes:
        assert f"{m}: " in out and "plain decode steps" in out and f"{m}: drafts accepted per position" in out
    assert "why: " in out and "where the time goes" in out
    return rows


@pytest.mark.slow  # compiles plain and chain decoding and the breakdown's forwards of the tiny pair (~1 min)
def test_demo_runs_on_the_tiny_pair(capsys, monkeypatch):
    for name in ("JAX_PLATFORMS", "XLA_FLAGS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert demo.main(["--weights", DEFAULT_WEIGHTS, "--config", "chain", "--prompts", "2", "--max-new", "10",
                      "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    rows = _check_output(out, ["chain"])
    assert rows["chain"][0] > 1.0
    assert "the rest (bookkeeping, loop) -" not in out  # the breakdown never prints a negative part


def test_breakdown_rest_is_never_negative():
    assert demo._rest_ms(0.010, 0.004, 0.001) == "5.0 ms"
    assert demo._rest_ms(0.010, 0.012).startswith("~0 ms (") and "timing noise" in demo._rest_ms(0.010, 0.012)


@pytest.mark.slow  # SmolLM2 (fetched when missing) with its shipped head: several minutes on a 2-core CPU
def test_demo_runs_on_smollm2_with_the_shipped_head(capsys, monkeypatch):
    if not any(os.path.isdir(p) for p in demo.SHIPPED_HEADS.values()):
        pytest.skip(f"no shipped head in {demo.HEADS_DIR}")
    for name in ("JAX_PLATFORMS", "XLA_FLAGS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert demo.main(["--prompts", "1", "--max-new", "32", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = _check_output(out, ["chain", "tree"])
    assert rows["chain"][0] > 1.2  # a trained head: drafts accepted on real text
    assert "->" in out and "target on this CPU" in out


def test_draft_vocab_choice(tmp_path):
    """``--draft-vocab``: auto keeps the CPU_DRAFT_VOCAB most frequent on the CPU for a larger head that records its
    counts, all of them elsewhere; a number applies to an EAGLE-3 head only; bad values refused."""
    big = _eagle3_dir(tmp_path / "big")
    conf = tmp_path / "big" / "config.json"
    conf.write_text(json.dumps(dict(json.loads(conf.read_text()), draft_vocab_size=demo.CPU_DRAFT_VOCAB * 3)))
    assert demo.draft_vocab_for("auto", big, "eagle3", "cpu") is None  # no counts recorded
    (tmp_path / "big" / "draft_token_counts.json").write_text("{}")
    assert demo.draft_vocab_for("auto", big, "eagle3", "cpu") == demo.CPU_DRAFT_VOCAB
    assert demo.draft_vocab_for("auto", big, "eagle3", "gpu") is None
    assert demo.draft_vocab_for("all", big, "eagle3", "cpu") is None
    assert demo.draft_vocab_for("100", big, "eagle3", "gpu") == 100
    m = _mtp_dir(tmp_path / "m")
    assert demo.draft_vocab_for("auto", m, "mtp", "cpu") is None
    with pytest.raises(ValueError, match="--draft-vocab 100: applies to an EAGLE-3 head"):
        demo.draft_vocab_for("100", m, "mtp", "cpu")
    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            demo._parse(["--draft-vocab", bad])
    with pytest.raises(SystemExit):
        demo._parse(["--draft-vocab", "100", "--weights", DEFAULT_WEIGHTS])
