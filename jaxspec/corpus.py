"""A tiny deterministic corpus of templated English-like lines (made by the repo, nothing downloaded).

Lines are predictable enough for a ~0.3M-parameter char-level model to reach high accuracy, so the MTP
draft really gets accepted: counting runs, spelled-out number words, and templated sentences whose
only freedom is a few word choices per line. ``make_corpus(seed)`` is deterministic.
"""

import numpy as np

_NAMES = ["anna", "bob", "carla", "dan", "eve", "fred", "gina", "hugo"]
_ANIMALS = ["cat", "dog", "fox", "owl", "bear", "frog", "duck", "goat"]
_PLACES = ["park", "river", "garden", "market", "forest", "station"]
_COLORS = ["red", "blue", "green", "yellow", "black", "white"]
_THINGS = ["apples", "books", "stones", "letters", "shells", "coins"]
_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _line(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 6))
    pick = lambda xs: xs[int(rng.integers(0, len(xs)))]  # noqa: E731
    if kind == 0:
        a = int(rng.integers(0, 90))
        return "count: " + " ".join(str(a + i) for i in range(8)) + "."
    if kind == 1:
        a = int(rng.integers(0, 5))
        return "spell: " + " ".join(_WORDS[a + i] for i in range(6)) + "."
    if kind == 2:
        return f"the {pick(_COLORS)} {pick(_ANIMALS)} runs to the {pick(_PLACES)} and sleeps there."
    if kind == 3:
        n, t = int(rng.integers(2, 10)), pick(_THINGS)
        return f"{pick(_NAMES)} has {n} {t} and gives the {t} to {pick(_NAMES)}."
    if kind == 4:
        return "the quick brown fox jumps over the lazy dog."
    return f"in the {pick(_PLACES)} the {pick(_ANIMALS)} says hello to the {pick(_ANIMALS)}."


def make_corpus(num_lines: int = 6000, seed: int = 0) -> list[str]:
    """``num_lines`` lines (no trailing newline) drawn from the templates with a fixed seed."""
    rng = np.random.default_rng(seed)
    return [_line(rng) for _ in range(num_lines)]


def make_stream(num_lines: int = 6000, seed: int = 0) -> str:
    """The corpus as one newline-joined text stream (the training data)."""
    return "\n".join(make_corpus(num_lines, seed)) + "\n"


def make_prompts(batch: int, seed: int = 1, min_len: int = 3, max_len: int = 24) -> list[str]:
    """``batch`` prompts of different lengths: prefixes of held-out corpus lines."""
    rng = np.random.default_rng(seed)
    lines = make_corpus(batch, seed=seed + 1000)
    out = []
    for i, line in enumerate(lines):
        n = min_len + (i * 7 + int(rng.integers(0, 5))) % (max_len - min_len + 1)
        out.append(line[: max(1, min(n, len(line)))])
    return out
