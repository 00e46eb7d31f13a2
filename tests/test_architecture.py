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


# backend module -> the one Pallas lowering it may import (kernels/_backend.py resolves among them)
BACKEND_MODULES = {"_triton.py": "jax.experimental.pallas.triton", "_mosaic_gpu.py": "jax.experimental.pallas.mosaic_gpu"}


def test_backend_imports_live_in_backend_modules():
    """Each Pallas lowering (triton / mosaic_gpu) is imported by its own backend module only."""
    lowerings = tuple(BACKEND_MODULES.values())
    bad = []
    for f in sorted((ROOT / "kernels").glob("*.py")):
        text = f.read_text()
        for line, mod in _imports(f):
            if mod.startswith("jax._src") or (mod.startswith(lowerings) and not mod.startswith(BACKEND_MODULES.get(f.name, "-"))):
                bad.append(f"{f.name}:{line} imports {mod}")
        for low in lowerings:  # importlib strings count too
            if f'"{low}"' in text and BACKEND_MODULES.get(f.name) != low:
                bad.append(f"{f.name} names {low}")
    assert not bad, "\n".join(bad)


def test_no_private_jax_in_library():
    bad = []
    for folder in ("jaxspec", "kernels", "interop"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            for line, mod in _imports(f):
                if mod.startswith("jax._src"):
                    bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)
