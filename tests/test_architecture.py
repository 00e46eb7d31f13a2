"""The layering of shared/docs/architecture.md, checked on the source (imports of every module)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# layer folder -> import prefixes it must never use
FORBIDDEN = {
    "jaxspec/ops": ("jaxspec.interop", "jaxspec.engine", "jaxspec.models", "torch", "triton"),
    "kernels": ("jaxspec.interop", "jaxspec.engine", "jaxspec.models", "jaxspec.ops", "torch", "triton"),
    "jaxspec/models": ("jaxspec.interop", "jaxspec.engine", "torch", "triton"),
    "jaxspec/engine": ("jaxspec.interop", "torch", "triton"),
}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports(layer):
    files = sorted((ROOT / layer).glob("*.py"))
    assert files, layer
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {mod}"
        for f in files
        for line, mod in _imports(f)
        if any(mod == p or mod.startswith(p + ".") for p in FORBIDDEN[layer])
    ]
    assert not bad, "\n".join(bad)


def test_backend_imports_live_in_backend_module():
    """Backend-specific Pallas imports (triton / mosaic_gpu lowering) only in kernels/_backend.py."""
    bad = []
    for f in sorted((ROOT / "kernels").glob("*.py")):
        if f.name == "_backend.py":
            continue
        for line, mod in _imports(f):
            if mod.startswith(("jax.experimental.pallas.triton", "jax.experimental.pallas.mosaic_gpu", "jax._src")):
                bad.append(f"{f.name}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_no_private_jax_in_library():
    bad = []
    for folder in ("jaxspec", "kernels", "interop"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for line, mod in _imports(f):
                if mod.startswith("jax._src"):
                    bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_engine_and_round_import_no_concrete_model():
    """The engine and the speculative round know the protocols, never a concrete model (architecture.md):
    no import of ``jaxspec.models`` from ``jaxspec/engine`` or ``jaxspec/round.py``."""
    files = sorted((ROOT / "jaxspec/engine").glob("*.py")) + [ROOT / "jaxspec/round.py"]
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {mod}"
        for f in files
        for line, mod in _imports(f)
        if mod == "jaxspec.models" or mod.startswith("jaxspec.models.")
    ]
    assert not bad, "\n".join(bad)


def test_protocols_sit_below_models_and_engine():
    """``jaxspec.protocols`` imports neither models, engine, round nor ops (both sides import it)."""
    banned = ("jaxspec.models", "jaxspec.engine", "jaxspec.round", "jaxspec.ops", "jaxspec.interop", "torch", "triton")
    bad = [f"protocols.py:{line} imports {mod}" for line, mod in _imports(ROOT / "jaxspec/protocols.py")
           if any(mod == p or mod.startswith(p + ".") for p in banned)]
    assert not bad, "\n".join(bad)
