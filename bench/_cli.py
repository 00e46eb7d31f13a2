"""The bench scripts' one argument-parser convention: the module docstring as the description, per-flag defaults."""

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Per-flag defaults, and the description's paragraphs kept as written."""


def parser(script: str, doc: str) -> argparse.ArgumentParser:
    """``python bench/<script>`` parser whose description is ``doc`` (double backticks dropped for the terminal)."""
    return argparse.ArgumentParser(prog=f"python bench/{script}", description=doc.replace("``", ""),
                                   formatter_class=HelpFormatter)
