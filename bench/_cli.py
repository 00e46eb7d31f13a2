"""The bench scripts' one argument-parser convention: the module docstring as the description, per-flag defaults."""

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Per-flag defaults, and the description's paragraphs kept as written."""


def parser(script: str, doc: str) -> argparse.ArgumentParser:
    """``python bench/<script>`` parser whose description is ``doc`` (double backticks dropped for the terminal)."""
    return argparse.ArgumentParser(prog=f"python bench/{script}", description=doc.replace("``", ""),
                                   formatter_class=HelpFormatter)


def parse_on_device(parse, argv):
    """``parse(argv)`` (``sys.argv[1:]`` when ``argv`` is None); ``--device cpu`` pins JAX to the CPU unless
    ``JAX_PLATFORMS`` says otherwise (before JAX starts a backend)."""
    import os
    import sys

    args = parse(sys.argv[1:] if argv is None else argv)
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return args


def save_figure(fig, path: str, title: str) -> None:
    """``fig`` titled ``title``, laid out and written to ``path`` (110 dpi)."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
