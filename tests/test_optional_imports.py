"""The suite collects wherever an optional package is missing (the GPU machine has no gguf or openai, say): a test
module that needs one at import time asks ``pytest.importorskip`` for it first, so the module is skipped rather
than a collection error that stops ``pytest -m gpu`` before any test runs."""

import ast
import os
import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent
# optional packages (extras of pyproject.toml, or not installed where jaxspec is installed without dependencies)
OPTIONAL = ("gguf", "openai", "aiohttp", "prometheus_client", "transformers", "torch", "triton", "matplotlib",
            "accelerate")
# package modules that import optional packages when imported
NEEDS = {"jaxspec.serve": ("aiohttp", "prometheus_client")}


def _skipped_name(node) -> str | None:
    """``X`` of a module-level ``pytest.importorskip("X")`` (bare or assigned)."""
    call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip"
            and call.args and isinstance(call.args[0], ast.Constant)):
        return str(call.args[0].value).split(".")[0]
    return None


def unguarded_imports(source: str) -> list[tuple[int, str]]:
    """``(line, package)`` of each module-level import of an optional package (directly, or through a package
    module in ``NEEDS``) that no earlier module-level ``pytest.importorskip`` of that package guards."""
    guarded, bad = set(), []
    for node in ast.parse(source).body:
        if (name := _skipped_name(node)) is not None:
            guarded.add(name)
            continue
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        for mod in mods:
            needs = (mod.split(".")[0],) if mod.split(".")[0] in OPTIONAL else next(
                (p for m, p in NEEDS.items() if mod == m or mod.startswith(m + ".")), ())
            bad += [(node.lineno, need) for need in needs if need not in guarded]
    return bad


def test_every_test_module_guards_its_optional_imports():
    bad = [f"{f.name}:{line} imports {pkg} without pytest.importorskip({pkg!r}) before it"
           for f in sorted(TESTS.glob("*.py")) for line, pkg in unguarded_imports(f.read_text())]
    assert not bad, "\n".join(bad)


def test_the_rule_catches_an_unguarded_import():
    assert unguarded_imports("import gguf\n") == [(1, "gguf")]
    assert unguarded_imports("from jaxspec.serve import build_app\n") == [(1, "aiohttp"), (1, "prometheus_client")]
    assert unguarded_imports("import pytest\npytest.importorskip('aiohttp')\nfrom jaxspec.serve import app\n") == [
        (3, "prometheus_client")]
    assert unguarded_imports("import pytest\nopenai = pytest.importorskip('openai')\nimport openai\n") == []
    assert unguarded_imports("def f():\n    import torch\n") == []  # inside a test: the test's own business


def test_gpu_tests_collect_without_gguf_and_openai(tmp_path):
    """``pytest -m gpu --collect-only`` with gguf, openai, aiohttp and prometheus_client made unimportable."""
    for name in ("gguf", "openai", "aiohttp", "prometheus_client"):
        (tmp_path / name).mkdir()
        # what a missing package raises (pytest.importorskip skips on ModuleNotFoundError only)
        (tmp_path / name / "__init__.py").write_text(f"raise ModuleNotFoundError({'No module named ' + name!r}, "
                                                     f"name={name!r})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                        "no:cacheprovider", str(TESTS)], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode in (0, 5), r.stdout[-3000:] + r.stderr[-2000:]  # 5: nothing selected is fine too
    assert "error" not in r.stdout.lower().split("\n")[-2], r.stdout[-2000:]
