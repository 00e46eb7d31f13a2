"""The demo's shipped pair (``DEMO_WEIGHTS``) and ``python -m jaxspec.demo``: the checkpoint is the trained
24-layer, 32-wide ``DEMO_PAIR_CONFIG`` model whose target and MTP layers predict the corpus, the shipped weights
stay small, the demo's XLA:CPU options are added without overriding the user's, and the demo decodes
speculatively with outputs identical to plain decoding and the table scripts read."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import demo
from jaxspec.corpus import make_stream
from jaxspec.models import DEFAULT_WEIGHTS, DEMO_PAIR_CONFIG, DEMO_WEIGHTS, MockVocab, MTPModel, load_pair
from jaxspec.models.io import load_meta
from jaxspec.train_tiny import accuracies


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def test_shipped_weights_small():
    assert sorted(os.listdir(DEMO_WEIGHTS)) == ["config.json", "model.safetensors"]
    assert _dir_bytes(DEMO_WEIGHTS) + _dir_bytes(DEFAULT_WEIGHTS) <= 20 * 2**20


def test_demo_pair_trained():
    """An f32 ``MTPModel`` of ``DEMO_PAIR_CONFIG`` with its training record; on held-out corpus text its target
    and each MTP layer reach the top-1 accuracy the demo's accept lengths rest on."""
    model = load_pair(DEMO_WEIGHTS)
    assert isinstance(model, MTPModel) and model.cfg == DEMO_PAIR_CONFIG and model.num_mtp_layers == 3
    assert model.param_dtype == jnp.float32 and model.kv_dtype == jnp.float32
    meta = load_meta(DEMO_WEIGHTS)
    assert meta["steps"] > 0 and min(meta["accuracy"]) > 0.85
    ctx, s = 48, model.num_mtp_layers
    data = MockVocab(vocab_size=model.vocab_size).encode(make_stream(num_lines=60, seed=5))
    seqs = jnp.asarray(np.stack([data[i : i + ctx + s + 1] for i in (0, 300, 600, 900)]))
    acc = np.asarray(accuracies(model, seqs, ctx))
    assert acc.shape == (1 + s,) and acc.min() > 0.8, acc


def test_cpu_xla_flags():
    """The demo's CPU options join the user's XLA_FLAGS, never override an option the user set, and are added only
    for the jaxlib versions they were measured with."""
    want = [f"{k}={v}" for k, v in demo.CPU_XLA_FLAGS.items()]
    assert demo.cpu_xla_flags("", "0.10.2").split() == want
    assert demo.cpu_xla_flags(" --xla_cpu_enable_fast_math=false ", "0.10.2").split() == [
        "--xla_cpu_enable_fast_math=false", *want]
    mine = "--xla_cpu_multi_thread_eigen=true"
    assert demo.cpu_xla_flags(mine, "0.10.2").split() == [mine, "--xla_cpu_experimental_ynn_fusion_type="]
    assert demo.cpu_xla_flags(mine, "9.0.0") == mine and demo.cpu_xla_flags("", "9.0.0") == ""


def test_demo_rejects_bad_counts(capsys):
    for flag in ("--batch", "--max-new", "--repeats", "--page-size"):
        with pytest.raises(SystemExit) as e:
            demo.main([flag, "0"])
        assert e.value.code == 2 and flag in capsys.readouterr().err


def _table(out: str) -> dict:
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mode"])
    rows = {}
    for line in lines[head + 1 :]:
        if not line.strip():
            break
        mode, accept, tok_s, run_s, compile_s, median_s = line.split()
        rows[mode] = (float(accept), float(tok_s), float(run_s), float(compile_s), float(median_s))
    return rows


@pytest.mark.slow  # compiles plain and chain decoding of the 24-layer pair (~30 s on a shared CPU)
def test_demo_runs_lossless(capsys, monkeypatch):
    """The demo end to end (chain only, to keep the compiles few; the tree path is the engine's, tested on the
    tiny pair): outputs identical, the table's rows readable, the trained drafts mostly accepted."""
    for name in ("JAX_PLATFORMS", "XLA_FLAGS"):  # the demo sets both: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert demo.main(["--config", "chain", "--batch", "2", "--max-new", "12", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "outputs identical" in out and "DIFFER" not in out
    rows = _table(out)
    assert list(rows) == ["plain", "chain"]
    assert rows["plain"][0] == 1.0 and rows["chain"][0] > 2.5  # trained drafts: most of each draft accepted
    assert all(r[1] > 0 and 0 < r[2] <= r[4] for r in rows.values())  # run s: the fastest run, <= the median
    assert "chain: " in out and "plain decode steps" in out and "why: " in out
