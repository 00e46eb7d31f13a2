"""Packaging: the built wheel (not the editable install) holds the whole package, its kernels and interop
subpackages and every shipped asset, and nothing at top level but ``jaxspec``; the heads load from it."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(ROOT)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # setuptools warns when data folders are not declared packages ("Package would be ignored")
    assert "would be ignored" not in r.stdout + r.stderr
    (whl,) = out.glob("jaxspec-*.whl")
    return whl


def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_wheel_contains_mapped_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("jaxspec/__init__.py", "jaxspec/kernels/__init__.py", "jaxspec/kernels/_backend.py",
                 "jaxspec/interop/__init__.py", "jaxspec/ops/__init__.py"):
        assert must in names, must
    # Nothing but the package at top level (a generic kernels/ or interop/ would collide with other packages).
    assert {n.split("/")[0] for n in names if not n.startswith("jaxspec-")} == {"jaxspec"}


def test_wheel_contains_every_tracked_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = _tracked("jaxspec")
    assets = [f for f in tracked if f.startswith("jaxspec/assets/")]
    assert any(f.endswith("eagle3/model.safetensors") for f in assets) and any(f.endswith("mtp.safetensors")
                                                                                  for f in assets)
    assert not [f for f in tracked if f not in names]


def test_heads_and_pairs_load_from_the_built_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import os, json, jaxspec;"
        f"assert jaxspec.__file__.startswith({str(site)!r}), jaxspec.__file__;"
        "from safetensors.numpy import load_file;"
        "from jaxspec.models import load_pair;"
        "from jaxspec.models.eagle3 import load_eagle3;"
        "heads = os.path.join(os.path.dirname(jaxspec.__file__), 'assets', 'heads');"
        "e3 = load_eagle3(os.path.join(heads, 'smollm2-135m-instruct-eagle3'));"
        "mtp = load_file(os.path.join(heads, 'smollm2-135m-instruct-mtp', 'mtp.safetensors'));"
        "cfg = json.load(open(os.path.join(heads, 'smollm2-135m-instruct-mtp', 'config.json')));"
        "assert cfg['num_nextn_predict_layers'] >= 1 and mtp;"
        "pair = load_pair();"
        "print(type(e3).__name__, e3.cfg.draft_vocab_size, type(pair).__name__, len(mtp))"
    )
    env = dict(os.environ, PYTHONPATH=str(site), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("EAGLE3Model ")


def test_import_from_built_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import jaxspec, jaxspec.kernels, jaxspec.interop, sys;"
        f"assert jaxspec.__file__.startswith({str(site)!r}), jaxspec.__file__;"
        f"assert jaxspec.kernels.__file__.startswith({str(site)!r}), jaxspec.kernels.__file__;"
        f"assert jaxspec.interop.__file__.startswith({str(site)!r}), jaxspec.interop.__file__;"
        "print('ok')"
    )
    env = dict(os.environ, PYTHONPATH=str(site), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
