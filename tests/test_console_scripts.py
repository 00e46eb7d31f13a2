"""The console scripts pyproject.toml declares exist in the installed metadata and answer --help in plain text:
no reStructuredText double backticks, every argument with a help text, each default printed once."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import importlib

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


def help_entries(text: str) -> dict[str, str]:
    """``{signature: help text}`` of every argument ``argparse`` lists in ``text`` (a ``--help`` output): an entry
    starts on a line indented two spaces, its help follows two spaces after the signature or on the lines below
    (indented deeper); ``-h, --help`` included."""
    out, key, in_args = {}, None, False
    for line in text.splitlines():
        if not line.strip():
            key = None
            continue
        if not line.startswith(" "):
            in_args = line.rstrip().endswith(":") and not line.startswith("usage:")
            key = None
            continue
        if not in_args:
            continue
        if re.match(r"  \S", line):
            sig, _, rest = line.strip().partition("  ")
            key = sig.strip()
            out[key] = rest.strip()
        elif key is not None:
            out[key] = (out[key] + " " + line.strip()).strip()
    return out


def check_help(text: str) -> list[str]:
    """What is wrong with a ``--help`` output: double backticks, an argument without help, a default said twice."""
    bad = ["raw double backticks"] if "``" in text else []
    entries = help_entries(text)
    if len(entries) < 2:
        bad.append(f"no arguments found in {text[:200]!r}")
    for sig, helptext in entries.items():
        if not helptext:
            bad.append(f"{sig}: no help text")
        if len(re.findall(r"\bdefault\b", helptext, flags=re.IGNORECASE)) > 1:
            bad.append(f"{sig}: the default is said more than once: {helptext!r}")
    return bad


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help_is_plain_with_each_default_once(name, capsys):
    module, func = SCRIPTS[name].split(":")
    main = getattr(importlib.import_module(module), func)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    bad = check_help(out)
    assert not bad, "\n".join(bad) + "\n" + out


def test_check_help_catches_each_fault():
    good = ("usage: x [-h] [--a A]\n\noptions:\n  -h, --help  show this help message and exit\n"
            "  --a A       the a (default: 3)\n  --long-option-name LONG_OPTION_NAME\n"
            "              wrapped help\n              (default: 1)\n")
    assert check_help(good) == []
    assert help_entries(good)["--long-option-name LONG_OPTION_NAME"] == "wrapped help (default: 1)"
    assert check_help(good.replace("the a", "``the a``")) == ["raw double backticks"]
    assert check_help(good.replace("the a (default: 3)", "")) == ["--a A: no help text"]
    twice = check_help(good.replace("(default: 1)", "default 1 (default: None)"))
    assert len(twice) == 1 and "more than once" in twice[0]
