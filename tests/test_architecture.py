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
# The one private import allowed in kernels/: the Mosaic GPU interpreter's parameters have no public export in
# jax 0.10 / 0.11 (jax.experimental.pallas.tpu re-exports the TPU twin only). Guarded there by ImportError.
PRIVATE_ALLOWED = {("_mosaic_gpu.py", "jax._src.pallas.mosaic_gpu.interpret.params")}


def test_backend_imports_live_in_backend_modules():
    """Each Pallas lowering (triton / mosaic_gpu) is imported by its own backend module only."""
    lowerings = tuple(BACKEND_MODULES.values())
    bad = []
    for f in sorted((ROOT / "kernels").glob("*.py")):
        text = f.read_text()
        for line, mod in _imports(f):
            if (mod.startswith("jax._src") and (f.name, mod) not in PRIVATE_ALLOWED) or (mod.startswith(lowerings) and not mod.startswith(BACKEND_MODULES.get(f.name, "-"))):
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
                if mod.startswith("jax._src") and (f.name, mod) not in PRIVATE_ALLOWED:
                    bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def _interop_graph() -> dict[str, set[str]]:
    """interop module -> the interop modules it imports (anywhere in the file, lazy imports included)."""
    mods = {f.stem: f for f in sorted((ROOT / "interop").glob("*.py")) if f.stem != "__init__"}
    graph = {}
    for name, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "jaxspec.interop":
                    deps |= {a.name for a in node.names if a.name in mods}
                elif node.module.startswith("jaxspec.interop."):
                    deps.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("jaxspec.interop.")}
        graph[name] = deps - {name}
    return graph


def test_interop_has_no_import_circle():
    """E.g. harness -> ops_spec -> harness: op definitions import the registry, the harness reads it."""
    graph, cycles = _interop_graph(), []

    def visit(node, path):
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in done:
                visit(dep, path + [dep])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, "\n".join(sorted(set(cycles)))
    assert "registry" in graph["ops_spec"] and "harness" not in graph["ops_spec"] | graph["ops_kernels"]


def test_interop_imports_are_at_the_top_and_public():
    """No bottom-of-file imports, and no private (underscore) name imported from another jaxspec module."""
    bad = []
    for f in sorted((ROOT / "interop").glob("*.py")):
        tree = ast.parse(f.read_text())
        seen_code = False
        for node in tree.body:
            is_import = isinstance(node, (ast.Import, ast.ImportFrom))
            is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if is_import and seen_code:
                bad.append(f"{f.name}:{node.lineno} module-level import after code")
            seen_code = seen_code or not (is_import or is_doc)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxspec"):
                bad += [f"{f.name}:{node.lineno} imports private {node.module}.{a.name}"
                        for a in node.names if a.name.startswith("_")]
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in {"originals", "harness", "registry",
                                                                               "pins", "fetch", "ops_spec",
                                                                               "ops_kernels", "dlpack"}):
                bad.append(f"{f.name}:{node.lineno} uses private {node.value.id}.{node.attr}")
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
