"""The serving core meets the engine and the kernels through their public names only: every import of
``jaxspec.engine`` or ``jaxspec.kernels`` in ``jaxspec/serving/*.py`` is ``from jaxspec.engine import X`` /
``from jaxspec.kernels import X`` with ``X`` a name the package's ``__init__`` exports (no submodule such as
``jaxspec.engine.step``, no underscore name), checked on the source (AST)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jaxspec.engine", "jaxspec.kernels")


def exported(package: str) -> set[str]:
    """The names ``package/__init__.py`` re-exports (``from M import X as X``), not starting with ``_``."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return {n for n in names if not n.startswith("_")}


def violations(source: str, public: dict[str, set[str]]) -> list[str]:
    """``line: what`` for each import of an engine or kernel module or name that is not public."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if any(a.name == p or a.name.startswith(p + ".") for p in PACKAGES):
                    bad.append(f"{node.lineno}: import {a.name} (import the package's public names)")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            mod = node.module
            inside = next((p for p in PACKAGES if mod == p or mod.startswith(p + ".")), None)
            if inside is None:
                continue
            if mod != inside:
                bad.append(f"{node.lineno}: from {mod} (a submodule of {inside})")
                continue
            bad += [f"{node.lineno}: {mod}.{a.name} is not exported by {inside}" for a in node.names
                    if a.name not in public[inside]]
    return bad


def test_serving_imports_only_public_engine_and_kernel_names():
    public = {p: exported(p) for p in PACKAGES}
    files = sorted((ROOT / "jaxspec" / "serving").glob("*.py"))
    assert len(files) >= 5
    bad = [f"{f.relative_to(ROOT)}:{v}" for f in files for v in violations(f.read_text(), public)]
    assert not bad, "\n".join(bad)


def test_the_check_catches_private_and_submodule_imports():
    public = {p: exported(p) for p in PACKAGES}
    assert {"Engine", "SlotChunks", "prefill_slots", "decode_slots"} <= public["jaxspec.engine"]
    assert "next_pow2" in public["jaxspec.kernels"]
    assert violations("from jaxspec.engine import Engine, SlotChunks\nfrom jaxspec.kernels import next_pow2\n",
                      public) == []
    for line in ["from jaxspec.engine.step import prefill", "from jaxspec.kernels._dispatch import next_pow2",
                 "from jaxspec.engine import _helper", "import jaxspec.engine.memory",
                 "def f():\n    from jaxspec.engine.compiled import functionalize_checks",
                 "from jaxspec.kernels import not_exported"]:
        assert violations(line + "\n", public), line
