"""The console scripts pyproject.toml declares exist in the installed metadata and answer --help."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

SCRIPTS = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]


def test_user_facing_clis_have_scripts():
    assert {"jaxspec-demo", "jaxspec-check", "jaxspec-check-model", "jaxspec-fetch"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help(name, capsys):
    eps = {e.name: e for e in importlib.metadata.entry_points(group="console_scripts")}
    assert name in eps, f"{name} is not installed (pip install -e . re-registers the scripts)"
    assert eps[name].value == SCRIPTS[name]
    with pytest.raises(SystemExit) as exc:
        eps[name].load()(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and len(out) > 200, out
