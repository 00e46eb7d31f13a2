"""How jaxspec's command lines print ``--help``: plain text, each option's default printed once.

``HelpFormatter`` wraps the description and appends ``(default: ...)`` to an option's help unless the help already says its default (the
word "default") or the default is ``None`` (an option left out), ``False`` (a flag) or ``[]`` (a repeatable option); ``plain(text)`` drops the
reStructuredText double backticks of a docstring used as a description or epilog.
"""

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Per-option defaults, printed once."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text + " (default: %(default)s)"
        return text


class DocHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``HelpFormatter`` with the description's paragraphs kept as written (a module docstring)."""


def plain(text: str) -> str:
    """``text`` without reStructuredText double backticks (``x`` -> x).

    Args:
        text: a docstring or a paragraph of one.

    Returns:
        The text as a terminal shows it.
    """
    return text.replace("``", "")


def parser(module: str, description: str, *, formatter=HelpFormatter, **kwargs) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``: its usage line names the command, the description is plain text.

    Args:
        module: the module run with ``python -m`` (e.g. ``"jaxspec.demo"``).
        description: the text under the usage line (double backticks dropped).
        formatter: the help formatter (``HelpFormatter``; ``DocHelpFormatter`` keeps paragraphs as written).
        **kwargs: more ``argparse.ArgumentParser`` arguments (``epilog``, ...).

    Returns:
        An ``argparse.ArgumentParser``.
    """
    return argparse.ArgumentParser(prog=f"python -m {module}", description=plain(description),
                                   formatter_class=formatter, **kwargs)

