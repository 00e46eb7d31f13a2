"""Every interop and bench command-line entry point explains itself: ``--help`` exits 0 with useful text.

One subprocess per CLI, all started at once (each imports jax, some torch): a few seconds in all.
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _has_main(path: pathlib.Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def _commands() -> dict[str, tuple[list[str], str]]:
    """name -> (argv, the prog the usage line must name), for every module of jaxspec/interop/ and bench/ with a main."""
    cmds = {}
    for f in sorted((ROOT / "jaxspec" / "interop").glob("*.py")):
        if _has_main(f):
            cmds[f"interop.{f.stem}"] = ([sys.executable, "-m", f"jaxspec.interop.{f.stem}", "--help"],
                                         f"python -m jaxspec.interop.{f.stem}")
    for f in sorted((ROOT / "bench").glob("*.py")):
        if _has_main(f):
            cmds[f"bench.{f.stem}"] = ([sys.executable, str(f), "--help"], f"python bench/{f.name}")
    return cmds


def test_the_known_clis_are_found():
    names = set(_commands())
    assert {"interop.check", "interop.fetch", "interop.cuda_originals", "bench.step", "bench.decode",
            "bench.kernel_ops", "bench.kernels_paged", "bench.plot_step"} <= names, names


def test_every_cli_help_exits_0_with_useful_text():
    env = dict(os.environ, JAX_PLATFORMS="cpu", TRITON_INTERPRET="1")
    procs = {name: (subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=ROOT), prog)
             for name, (argv, prog) in _commands().items()}
    failures = []
    for name, (p, prog) in procs.items():
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            failures.append(f"{name}: exit {p.returncode}\n{err[-2000:]}")
            continue
        desc = out.split("\n\n", 1)[1] if "\n\n" in out else ""
        desc = desc.split("\npositional arguments:")[0].split("\noptions:")[0].strip()
        problems = [
            why for bad, why in (
                (not out.startswith(f"usage: {prog}"), f"usage line does not name {prog!r}"),
                (len(desc) < 80, "description missing or too short"),
                (not desc.endswith((".", ")", ":")), f"description stops mid-sentence: ...{desc[-60:]!r}"),
                ("``" in out, "raw double-backtick markup"),
                ("--help" not in out, "no options listed"),
            ) if bad
        ]
        # a flag's help may wrap to the next line; only a flag line followed by another flag (or nothing) lacks help
        lines = out.split("options:")[-1].splitlines()
        for i, ln in enumerate(lines):
            s = ln.strip()
            if ln.startswith("  --") and len(s.split("  ")) < 2:
                nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
                if not nxt or nxt.startswith("-"):
                    problems.append(f"flag without help: {s}")
        if problems:
            failures.append(f"{name}: " + "; ".join(problems) + f"\n{out[:1500]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("module", ["check", "fetch", "cuda_originals"])
def test_interop_clis_show_defaults(module, capsys):
    import importlib

    mod = importlib.import_module(f"jaxspec.interop.{module}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m jaxspec.interop.{module}")
    if module != "cuda_originals":  # it has no flags besides --help
        assert "(default:" in out
