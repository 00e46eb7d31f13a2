"""The package's layering, checked on the source: the imports of every module of the package (every ``.py`` file
under the folders pyproject.toml's package finder includes: ``jaxspec/``, with ``jaxspec/kernels/`` and
``jaxspec/interop/``), lazy function-level imports included.

Layers, bottom up: the kernels (``jaxspec.kernels``, needing nothing else of the package), the core (every other
``jaxspec`` module: ops, models, engine, ...), the interop layer on top (the only one that may import torch,
triton or transformers). No module imports a module of a higher layer, and no modules import each other in a
circle. Each rule is a function of the sources, run on the real tree and on a copy with a planted violation
(each rule must catch its violation).

Above the library sit the apps (``APPS``: the demo, the trainers, the CLIs): no module of the package imports
one, and neither does a script under ``bench/``; the folders of the package (its subpackages and top-level
modules) import each other one way only, and ``jaxspec.text`` (tokenizer, chat templates, text generation) sits
above ``jaxspec.models``: the models deal in token ids and never import it.
"""

import ast
import fnmatch
import functools
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS, INTEROP = "jaxspec.kernels", "jaxspec.interop"
INTEROP_ONLY = ("torch", "triton", "transformers")  # third-party packages only the interop layer may import
SERVE, SERVE_ONLY = "jaxspec.serve", ("aiohttp",)  # the HTTP stack: only the server package imports it


def _in(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


# ----------------------------------------------------------------------------------------------------
# the package as installed: module name -> (path relative to the root, source)


def package_sources(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Every module of the packages pyproject.toml's package finder includes (``include`` patterns)."""
    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    tops = sorted({pat.split(".")[0].rstrip("*") for pat in find["include"]})
    out = {}
    for f in sorted(f for top in tops for f in (root / top).rglob("*.py")):
        rel = f.relative_to(root)
        parts = rel.with_suffix("").parts
        pkg = ".".join(parts[:-1])
        if not pkg or not any(fnmatch.fnmatchcase(pkg, pat) for pat in find["include"]):
            continue
        name = pkg if parts[-1] == "__init__" else f"{pkg}.{parts[-1]}"
        out[name] = (str(rel), f.read_text())
    return out


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def imports(name: str, sources) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in module ``name`` (anywhere in the file); relative imports resolved,
    ``from a import b`` counted as ``a.b`` (for the package: when that is a module of it, else as ``a``)."""
    path, text = sources[name]
    is_pkg = path.endswith("__init__.py")
    out = []
    for node in ast.walk(_parse(text)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = name if is_pkg else name.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                mod = f"{base}.{mod}" if mod else base
            for a in node.names:  # a package module, or its package; outside the package the full name
                full = f"{mod}.{a.name}"
                out.append((node.lineno, full if full in sources or not _in(mod, "jaxspec") else mod))
    return out


# ----------------------------------------------------------------------------------------------------
# the rules: each returns its violations (empty: the rule holds)


def layer(mod: str) -> int:
    """0 kernels, 1 core, 2 interop (for modules of the package)."""
    return 0 if _in(mod, KERNELS) else 2 if _in(mod, INTEROP) else 1


def layer_violations(sources) -> list[str]:
    """An import of a higher layer's module (kernels -> core or interop, core -> interop), of torch / triton /
    transformers outside the interop layer, or of aiohttp outside jaxspec.serve."""
    bad = []
    for name, (path, _) in sorted(sources.items()):
        for line, mod in imports(name, sources):
            if _in(mod, "jaxspec") and layer(mod) > layer(name):
                bad.append(f"{path}:{line} ({name}) imports {mod}, a layer above it")
            if layer(name) < 2 and any(_in(mod, p) for p in INTEROP_ONLY):
                bad.append(f"{path}:{line} imports {mod} outside jaxspec.interop")
            if not _in(name, SERVE) and any(_in(mod, p) for p in SERVE_ONLY):
                bad.append(f"{path}:{line} imports {mod} outside jaxspec.serve")
    return bad


def import_graph(sources) -> dict[str, set[str]]:
    return {n: {m for _, m in imports(n, sources) if m in sources and m != n} for n in sources}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_violations(sources) -> list[str]:
    return [" <-> ".join(c) for c in cycles(import_graph(sources))]


# folder -> package prefixes it must never import, on top of the layer rule
FORBIDDEN = {
    "jaxspec.ops": ("jaxspec.engine", "jaxspec.models"),
    "jaxspec.models": ("jaxspec.engine", "jaxspec.text"),  # text is above the models, never below
    "jaxspec.engine": ("jaxspec.models",),  # the engine knows the protocols, never a concrete model
    "jaxspec.pipeline": ("jaxspec.models",),
    "jaxspec.protocols": ("jaxspec.models", "jaxspec.engine", "jaxspec.pipeline", "jaxspec.ops"),
    # a reply's text out of token ids, and the length limits: for the generator and the server alike
    "jaxspec.text.reply": ("jaxspec.engine", "jaxspec.serving", "jaxspec.serve"),
    "jaxspec.text.limits": ("jaxspec.engine", "jaxspec.serving", "jaxspec.serve"),
}


def forbidden_violations(sources) -> list[str]:
    bad = []
    for name, (path, _) in sorted(sources.items()):
        for owner, banned in FORBIDDEN.items():
            if _in(name, owner):
                bad += [f"{path}:{line} imports {mod}" for line, mod in imports(name, sources)
                        if any(_in(mod, p) for p in banned)]
    return bad


# The app modules: programs (a main, argument parsing, printing) on top of the library. Each console script of
# pyproject.toml is one of them or one of LIBRARY_CLIS (a library module with a small CLI of its own).
APPS = ("jaxspec.demo", "jaxspec.train_draft", "jaxspec.train_tiny", "jaxspec.serve.cli", "jaxspec.serve.__main__",
        "jaxspec.interop.check", "jaxspec.interop.check_model", "jaxspec.interop.fetch")
LIBRARY_CLIS = ("jaxspec.models.fetch",)  # fetch_model is the library's; its main fetches by name


def app_violations(sources, importers=None) -> list[str]:
    """An import of an app module by a module of ``importers`` (default: every module of the package). A
    package's ``__main__`` may run its own CLI (``python -m jaxspec.serve`` runs ``jaxspec.serve.cli``)."""
    bad = []
    for name in sorted(sources if importers is None else importers):
        path = sources[name][0]
        for line, mod in imports(name, sources):
            app = next((a for a in APPS if _in(mod, a)), None)
            if app is None or app == name:
                continue
            if name.endswith(".__main__") and app.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]:
                continue
            bad.append(f"{path}:{line} ({name}) imports the app module {app}")
    return bad


def folder(mod: str) -> str:
    """The folder a module belongs to: ``jaxspec.models.heads`` -> ``jaxspec.models``, ``jaxspec.demo`` itself."""
    return ".".join(mod.split(".")[:2])


def folder_violations(sources) -> list[str]:
    """Folders of the package that import each other (directly or round a circle of folders)."""
    graph: dict[str, set[str]] = {}
    for name in sources:
        for _, mod in imports(name, sources):
            if _in(mod, "jaxspec") and folder(mod) != folder(name):
                graph.setdefault(folder(name), set()).add(folder(mod))
    return [" <-> ".join(c) + " (folders)" for c in cycles(graph)]


def bench_sources(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Every script of ``bench/`` as ``bench.<name>`` -> (path relative to the root, source)."""
    return {f"bench.{f.stem}": (str(f.relative_to(root)), f.read_text()) for f in sorted((root / "bench").glob("*.py"))}


# backend module -> the one Pallas lowering it may import (jaxspec/kernels/_backend.py resolves among them)
BACKEND_MODULES = {"jaxspec.kernels._triton": "jax.experimental.pallas.triton",
                   "jaxspec.kernels._mosaic_gpu": "jax.experimental.pallas.mosaic_gpu"}
# The one private import allowed: the Mosaic GPU interpreter's parameters have no public export in jax 0.10 /
# 0.11 (jax.experimental.pallas.tpu re-exports the TPU twin only). Guarded there by ImportError.
PRIVATE_ALLOWED = {("jaxspec.kernels._mosaic_gpu", "jax._src.pallas.mosaic_gpu.interpret.params")}


def backend_violations(sources) -> list[str]:
    """A Pallas lowering imported (or named in an importlib string) outside its own backend module, or a private
    ``jax._src`` import anywhere in the package."""
    lowerings = tuple(BACKEND_MODULES.values())
    bad = []
    for name, (path, text) in sorted(sources.items()):
        for line, mod in imports(name, sources):
            if _in(mod, "jax._src") and not any(name == n and _in(mod, m) for n, m in PRIVATE_ALLOWED):
                bad.append(f"{path}:{line} imports private {mod}")
            elif any(_in(mod, low) for low in lowerings) and not _in(mod, BACKEND_MODULES.get(name, "-")):
                bad.append(f"{path}:{line} imports {mod} outside its backend module")
        for low in lowerings:  # importlib strings count too
            if f'"{low}"' in text and BACKEND_MODULES.get(name) != low:
                bad.append(f"{path} names {low}")
    return bad


def interop_style_violations(sources) -> list[str]:
    """In the interop layer: no module-level import after code, and no private (underscore) name of another
    jaxspec module, imported or read as an attribute of an imported interop module."""
    bad = []
    for name, (path, text) in sorted(sources.items()):
        if not _in(name, INTEROP):
            continue
        tree = _parse(text)
        interop_mods = {m.rsplit(".", 1)[1] for m in sources if _in(m, INTEROP) and m != INTEROP}
        seen_code = False
        for node in tree.body:
            is_import = isinstance(node, (ast.Import, ast.ImportFrom))
            is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if is_import and seen_code:
                bad.append(f"{path}:{node.lineno} module-level import after code")
            seen_code = seen_code or not (is_import or is_doc)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxspec"):
                bad += [f"{path}:{node.lineno} imports private {node.module}.{a.name}"
                        for a in node.names if a.name.startswith("_")]
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in interop_mods):
                bad.append(f"{path}:{node.lineno} uses private {node.value.id}.{node.attr}")
    return bad


def implementation_type_violations(sources) -> list[str]:
    """A public kernel function (or ``__call__``) whose ``implementation`` parameter is not typed
    ``Implementation``, the one ``Literal`` of what a caller may ask for."""
    bad = []
    for name, (path, text) in sorted(sources.items()):
        if not _in(name, KERNELS):
            continue
        for node in ast.walk(_parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__call__"):
                a = node.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs:
                    if arg.arg == "implementation" and not (
                            isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Implementation"):
                        bad.append(f"{path}:{arg.lineno} {node.name}(implementation=...) is not typed Implementation")
    return bad


# the package-wide helpers at the top of jaxspec may re-export a subpackage's private module (one facade each)
PRIVATE_FACADES = {("jaxspec._validate", "jaxspec.kernels._validate")}


def _subpackage(mod: str) -> str:
    """``jaxspec.X`` of a module ``jaxspec.X[.Y...]`` (a top-level module is its own)."""
    return ".".join(mod.split(".")[:2])


def private_violations(sources) -> list[str]:
    """No module imports a private (underscore) module or name of another of jaxspec's subpackages (the kernels'
    ``_dispatch``, an engine module's ``_helper``): subpackages meet through their public names."""
    bad = []
    for name, (path, text) in sorted(sources.items()):
        for node in ast.walk(_parse(text)):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("jaxspec."):
                mods, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                mods, names = [a.name for a in node.names if a.name.startswith("jaxspec.")], []
            else:
                continue
            for mod in mods:
                if _subpackage(mod) == _subpackage(name) or (name, mod) in PRIVATE_FACADES:
                    continue
                private = [p for p in mod.split(".")[2:] if p.startswith("_")]
                private += [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    bad.append(f"{path}:{node.lineno} imports private {mod} ({', '.join(private)}) of another "
                               f"subpackage")
    return bad


RULES = {"implementation_type": implementation_type_violations, "layers": layer_violations, "cycles": cycle_violations,
         "forbidden": forbidden_violations, "backends": backend_violations, "interop_style": interop_style_violations,
         "apps": app_violations, "folders": folder_violations, "private": private_violations}


# ----------------------------------------------------------------------------------------------------
# the real tree


@pytest.fixture(scope="module")
def sources():
    return package_sources()


def test_the_finder_finds_every_layer(sources):
    """The kernels and the interop layer are subpackages of jaxspec, in their own folders."""
    assert sources[KERNELS][0] == "jaxspec/kernels/__init__.py"
    assert sources[INTEROP][0] == "jaxspec/interop/__init__.py"
    assert sources["jaxspec.kernels.paged_attention"][0] == "jaxspec/kernels/paged_attention.py"
    assert sources["jaxspec.interop.harness"][0] == "jaxspec/interop/harness.py"
    assert not [m for m in sources if not _in(m, "jaxspec")]
    assert "jaxspec.engine.engine" in sources and "jaxspec.ops.verify" in sources


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_holds_on_the_tree(rule, sources):
    bad = RULES[rule](sources)
    assert not bad, "\n".join(bad)


def test_every_rule_names_modules_that_exist(sources):
    """A renamed module must not leave a rule that silently matches nothing."""
    named = list(FORBIDDEN) + [p for banned in FORBIDDEN.values() for p in banned] + list(BACKEND_MODULES)
    named += [n for n, _ in PRIVATE_ALLOWED] + list(APPS) + list(LIBRARY_CLIS)
    assert not [n for n in named if not any(_in(m, n) for m in sources)]


def test_every_console_script_is_an_app_or_a_library_cli():
    """A new console script is classified: an app (nothing may import it) or a library module's CLI."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    mods = {v.split(":")[0] for v in scripts.values()}
    assert mods <= set(APPS) | set(LIBRARY_CLIS), sorted(mods - set(APPS) - set(LIBRARY_CLIS))


def _with_bench(sources, bench):
    return {**sources, **bench}


def test_bench_scripts_import_no_app(sources):
    """The benchmarks use the library only (their siblings in bench/ are fine)."""
    bench = bench_sources()
    assert "bench.draft_consistency" in bench and "bench.real_model" in bench
    bad = app_violations(_with_bench(sources, bench), importers=bench)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line", ["from jaxspec.demo import PROMPTS", "def f():\n    from jaxspec import train_draft",
                                  "import jaxspec.serve.cli"])
def test_a_bench_script_importing_an_app_is_caught(line, sources):
    bench = _plant(bench_sources(), "bench.draft_consistency", line)
    bad = app_violations(_with_bench(sources, bench), importers=bench)
    assert any(b.startswith("bench/draft_consistency.py:") and "imports the app module" in b for b in bad), bad


def test_interop_has_no_import_circle_and_the_registry_sits_below_the_harness(sources):
    """Op definitions import the registry, the harness reads it (harness -> ops_spec -> harness was a circle)."""
    graph = import_graph(sources)
    assert f"{INTEROP}.registry" in graph[f"{INTEROP}.ops_spec"]
    assert f"{INTEROP}.harness" not in graph[f"{INTEROP}.ops_spec"] | graph[f"{INTEROP}.ops_kernels"]


# ----------------------------------------------------------------------------------------------------
# each rule catches a planted violation (in a copy of the real sources)


def _plant(sources, name, line, path=None):
    """The sources with ``line`` appended to module ``name`` (a new module when it does not exist)."""
    out = dict(sources)
    old_path, text = out.get(name, (path, '"""planted"""\n'))
    out[name] = (old_path, text + "\n" + line + "\n")
    return out


PLANTED = [  # (rule, module, planted source, what the violation names)
    ("layers", "jaxspec.kernels.cache_locs", "from jaxspec import _validate", "a layer above it"),
    ("layers", "jaxspec.kernels.kv_move", "def f():\n    from jaxspec.ops import verify", "a layer above it"),
    ("layers", "jaxspec.engine.engine", "from jaxspec.interop import harness", "a layer above it"),
    ("layers", "jaxspec.models.decoder", "import torch", "outside jaxspec.interop"),
    ("layers", "jaxspec.kernels._triton", "import triton.language as tl", "outside jaxspec.interop"),
    ("layers", "jaxspec.serving.core", "from aiohttp import web", "outside jaxspec.serve"),
    ("cycles", "jaxspec.kernels._attention_parts", "from jaxspec.kernels import paged_attention",
     "jaxspec.kernels._attention_parts <-> jaxspec.kernels.paged_attention"),
    ("cycles", "jaxspec.kernels._validate", "def f():\n    from . import _dispatch", "jaxspec.kernels._dispatch"),
    ("cycles", "jaxspec.interop.registry", "from jaxspec.interop import harness", "jaxspec.interop.harness"),
    ("forbidden", "jaxspec.engine.engine", "from jaxspec.models import decoder", "jaxspec.models.decoder"),
    ("forbidden", "jaxspec.protocols", "import jaxspec.ops.tree", "jaxspec.ops.tree"),
    ("forbidden", "jaxspec.ops.verify", "from jaxspec.engine import engine", "jaxspec.engine.engine"),
    ("forbidden", "jaxspec.pipeline", "from jaxspec.models import decoder", "jaxspec.models.decoder"),
    ("forbidden", "jaxspec.text.reply", "from jaxspec.serving import core", "jaxspec.serving.core"),
    ("forbidden", "jaxspec.text.limits", "def f():\n    from jaxspec.engine import checks", "jaxspec.engine.checks"),
    ("backends", "jaxspec.kernels.cache_locs", "from jax.experimental.pallas import triton as plt",
     "outside its backend module"),
    ("backends", "jaxspec.kernels.kv_move", 'X = "jax.experimental.pallas.mosaic_gpu"', "names"),
    ("backends", "jaxspec.ops.tree", "from jax._src import core", "imports private jax._src"),
    ("implementation_type", "jaxspec.kernels.cache_locs", "def f(x, *, implementation: str = 'auto'):\n    pass",
     "f(implementation=...) is not typed Implementation"),
    ("implementation_type", "jaxspec.kernels.kv_move", "def g(implementation='auto'):\n    pass", "g(implementation"),
    ("interop_style", "jaxspec.interop.harness", "X = 1\nimport os", "module-level import after code"),
    ("interop_style", "jaxspec.interop.check", "from jaxspec.kernels.kv_move import _move", "imports private"),
    ("interop_style", "jaxspec.interop.check", "Y = registry._OPS", "uses private registry._OPS"),
    ("forbidden", "jaxspec.models.heads", "from jaxspec.text.tokenizer import Tokenizer",
     "jaxspec.text.tokenizer"),
    ("apps", "jaxspec.serve.cli", "def f():\n    from jaxspec.demo import head_kind",
     "imports the app module jaxspec.demo"),
    ("apps", "jaxspec.models.heads", "from jaxspec import train_draft", "imports the app module jaxspec.train_draft"),
    ("apps", "jaxspec.interop.check", "from jaxspec.interop.check_model import main",
     "imports the app module jaxspec.interop.check_model"),
    ("apps", "jaxspec.serve.__main__", "import jaxspec.train_tiny", "imports the app module jaxspec.train_tiny"),
    ("folders", "jaxspec.models.decoder", "from jaxspec.text import tokenizer", "jaxspec.models <-> jaxspec.text"),
    ("private", "jaxspec.serving.core", "from jaxspec.kernels._dispatch import next_pow2", "jaxspec.kernels._dispatch"),
    ("private", "jaxspec.engine.engine", "def f():\n    from jaxspec.models.decoder import _dot16", "(_dot16)"),
    ("private", "jaxspec.models.heads", "import jaxspec.engine._hidden", "jaxspec.engine._hidden"),
    ("folders", "jaxspec.engine.engine", "def f():\n    from jaxspec.serving import core",
     "jaxspec.engine <-> jaxspec.serving"),
]


@pytest.mark.parametrize("rule,name,line,names", PLANTED, ids=[f"{r}-{n}" for r, n, *_ in PLANTED])
def test_rule_catches_a_planted_violation(rule, name, line, names, sources):
    assert name in sources, name
    bad = RULES[rule](_plant(sources, name, line))
    assert bad and any(names in b for b in bad), bad


def test_a_new_module_is_checked_too(sources):
    """A module added to jaxspec/kernels/ is part of the package (and of the rules) as soon as it exists."""
    planted = _plant(sources, "jaxspec.kernels._new", "from jaxspec.models import decoder",
                     path="jaxspec/kernels/_new.py")
    assert any(b.startswith("jaxspec/kernels/_new.py:") for b in layer_violations(planted))


def test_cycles_finds_every_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set(), "g": {"g"}}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
