"""The shipped demo pair (``DEMO_WEIGHTS``, a test fixture of ``python -m jaxspec.demo --weights``): the checkpoint is
the trained 24-layer, 32-wide ``DEMO_PAIR_CONFIG`` model whose target and MTP layers predict the corpus, the shipped
weights stay small, and the demo on it decodes speculatively with outputs identical to plain decoding and the table
scripts read."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import demo
from jaxspec.corpus import make_stream
from jaxspec.models import DEFAULT_WEIGHTS, DEMO_PAIR_CONFIG, DEMO_WEIGHTS, MockVocab, MTPModel, load_pair
from jaxspec.models.io import load_meta
from jaxspec.train_tiny import accuracies
from test_demo import demo_table


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


@pytest.mark.slow  # compiles plain and chain decoding of the 24-layer pair and its breakdown (~1 min on a shared CPU)
def test_demo_runs_lossless(capsys, monkeypatch):
    """The demo end to end (chain only, to keep the compiles few; the tree path is the engine's, tested on the
    tiny pair): outputs identical, the table's rows readable, the trained drafts mostly accepted."""
    for name in ("JAX_PLATFORMS", "XLA_FLAGS"):  # the demo sets both: restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    assert demo.main(["--weights", DEMO_WEIGHTS, "--config", "chain", "--prompts", "2", "--max-new", "12",
                      "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "outputs identical" in out and "DIFFER" not in out
    rows = demo_table(out)
    assert list(rows) == ["plain", "chain"]
    assert rows["plain"][0] == 1.0 and rows["chain"][0] > 2.5  # trained drafts: most of each draft accepted
    assert all(r[1] > 0 and 0 < r[2] <= r[4] for r in rows.values())  # run s: the fastest run, <= the median
    assert "chain: " in out and "plain decode steps" in out and "why: " in out and "where the time goes" in out
