"""The model CLIs explain themselves (``--help``: module-form prog, per-flag help and defaults, no raw
markup), ``train_tiny`` needs an explicit ``--out`` and writes a checkpoint ``load_pair`` reads."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, flags, shown", [  # shown: options whose default the help prints at least
    ("jaxspec.demo", ["--device", "--config", "--max-new", "--page-size", "--weights", "--repeats"], 4),
    ("jaxspec.train_tiny", ["--out", "--config", "--steps", "--batch", "--ctx", "--lr", "--seed"], 4),
    ("jaxspec.interop.check_model", ["--batch", "--prompt-len", "--new-tokens", "--rtol", "--page-size", "--seed",
                                     "--prompts-file", "--mtbench", "--tokenizer", "--dtype", "--hf-dtype",
                                     "--tie-tol", "--max-err-ratio", "--json"], 4),
    ("jaxspec.data.mtbench", ["--cache", "--find-links", "--quiet"], 1),  # no default printed for [] and a flag
])
def test_help(module, flags, shown):
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"usage: python -m {module} "), out[:80]
    assert "``" not in out
    for f in flags:
        line = next(line for line in out.splitlines() if line.strip().startswith(f))
        assert len(line.split(maxsplit=2)) >= 2, f"{f} has no help text"
    assert " ".join(out.split()).count("(default: ") >= shown


def test_train_tiny_requires_out():
    r = subprocess.run([sys.executable, "-m", "jaxspec.train_tiny", "--steps", "1"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--out" in r.stderr


@pytest.mark.slow  # compiles the training step (~20-50 s on a shared CPU)
def test_train_tiny_writes_loadable_checkpoint(tmp_path):
    from jaxspec import train_tiny
    from jaxspec.models import TINY_PAIR_CONFIG, load_pair
    from jaxspec.models.io import load_meta

    import jax

    out = tmp_path / "pair"
    with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix Python floats and int32 step counts
        train_tiny.main(["--out", str(out), "--steps", "2", "--batch", "2", "--ctx", "8"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    pair = load_pair(str(out))
    assert pair.num_mtp_layers == 3 and pair.cfg == TINY_PAIR_CONFIG and load_meta(str(out))["steps"] == 2
