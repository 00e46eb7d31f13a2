"""Packaging: the built wheel maps kernels/ and interop/ to jaxspec.kernels / jaxspec.interop."""

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
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("jaxspec-*.whl")
    return whl


def test_wheel_contains_mapped_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("jaxspec/__init__.py", "jaxspec/kernels/__init__.py", "jaxspec/kernels/_backend.py",
                 "jaxspec/interop/__init__.py", "jaxspec/ops/__init__.py"):
        assert must in names, must
    # The generic names must not be installed at top level (they would collide with other packages).
    assert not any(n.startswith(("kernels/", "interop/")) for n in names)


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
