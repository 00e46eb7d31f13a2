"""No folder or script of this repository can stand in for an installed package.

transformers imports Hugging Face's ``kernels`` package when a model loads; a ``kernels`` module of this repository
found first on ``sys.path`` (a top-level ``kernels/`` folder from the repository root, or ``bench/kernels.py``
after a test put ``bench/`` on the path) broke every later test that loaded a transformers model.
"""

import importlib.machinery
import importlib.metadata
import pathlib
import sys

import bench_scripts

REPO = pathlib.Path(__file__).resolve().parents[1]
# the names a repository folder could take over: the folders' own names, and names that installed packages use
GUARDED = ("kernels", "interop", "bench", "tools", "tests", "docs", "transformers", "torch", "triton", "gguf")


def shadowing(names=GUARDED, repo: pathlib.Path = REPO) -> list[str]:
    """Each name that, imported now, would load a regular module or package from ``repo`` (outside its
    ``jaxspec`` package; an environment inside ``repo``, as ``.venv/``, is installed code). A namespace portion (a folder without ``__init__.py``, as ``bench/`` is from the
    repository root) never takes precedence over an installed package, so it is not counted."""
    bad = []
    for name in names:
        spec = importlib.machinery.PathFinder.find_spec(name)  # sys.path as it is, ignoring sys.modules
        if spec is None or spec.origin is None or spec.loader is None:
            continue
        origin = pathlib.Path(spec.origin).resolve()
        installed = any(origin.is_relative_to(pathlib.Path(p).resolve()) for p in (sys.prefix, sys.base_prefix))
        if origin.is_relative_to(repo) and not installed and not origin.is_relative_to(repo / "jaxspec"):
            bad.append(f"import {name} would load {origin.relative_to(repo)}")
    return bad


def test_no_repository_module_shadows_a_package_after_bench_scripts_load():
    for name in ("kernel_ops", "plot_step"):  # what the bench tests load (their siblings come along)
        bench_scripts.load(name)
    assert str(bench_scripts.BENCH) not in sys.path
    assert not shadowing()


def test_the_check_catches_bench_on_the_path_with_a_kernels_py(monkeypatch, tmp_path):
    """A repository whose ``bench/`` holds ``kernels.py``, put on the path as the bench tests once did: named."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "kernels.py").write_text("")
    (tmp_path / "jaxspec" / "kernels").mkdir(parents=True)
    (tmp_path / "jaxspec" / "kernels" / "__init__.py").write_text("")
    assert shadowing(("kernels",), repo=tmp_path) == []
    monkeypatch.syspath_prepend(str(tmp_path / "bench"))
    assert shadowing(("kernels",), repo=tmp_path) == ["import kernels would load bench/kernels.py"]


def test_the_check_catches_a_top_level_package_from_the_repository_root(monkeypatch, tmp_path):
    """The old layout: a ``kernels/`` package at the root, the root on the path (``python -m`` from there)."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert shadowing(("kernels",), repo=tmp_path) == ["import kernels would load kernels/__init__.py"]


def test_bench_script_names_are_not_taken():
    """No bench script or top-level folder is named like an installed distribution's module or the stdlib's."""
    taken = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    taken.discard("jaxspec")
    mine = {f.stem for f in (REPO / "bench").glob("*.py")} | {d.name for d in REPO.iterdir() if d.is_dir()}
    assert not sorted(mine & taken)
