"""Supply chain of the original kernels: pinned wheels, pinned files, safe extraction.

Nothing is downloaded: fake wheels are built in tmp_path. No torch/triton needed.
"""

import hashlib
import json
import pathlib
import shutil
import zipfile

import pytest

from jaxspec.interop import cuda_originals, fetch, originals, pins

TS = pins.TOKENSPEED
TS_FILE = "tokenspeed/runtime/execution/cache_loc_kernel.py"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(path: pathlib.Path, entries: dict[str, bytes]) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def _only(monkeypatch, dv, paths):
    monkeypatch.setattr(fetch, "required_files", lambda cuda=False: {dv: set(paths)})


# ---------------------------------------------------------------------------------------------------- pins


def test_every_required_file_is_pinned_and_no_pin_is_stale():
    for cuda in (False, True):
        for (dist, version), paths in fetch.required_files(cuda).items():
            for p in paths:
                assert len(pins.file_pin(dist, version, p)) == 64
    cpu = {dv: set(ps) for dv, ps in fetch.required_files(False).items()}
    assert cpu == {dv: set(f) for dv, f in pins.FILES.items()}
    for dv in (*pins.FILES, *pins.CUDA_FILES, pins.TVM_FFI):
        assert pins.WHEELS[dv], dv
    # the GPU machine runs Python 3.12: both sglang releases have a pinned cp312 wheel
    for dv in (pins.SGLANG, pins.SGLANG_MTP):
        assert any("-cp312-" in n for n in pins.WHEELS[dv]) and any("-cp311-" in n for n in pins.WHEELS[dv])


def test_pip_requirement_line_carries_every_pinned_hash():
    line = pins.requirement_line(*pins.SGLANG)
    assert line.startswith("sglang==0.5.23 ")
    assert line.count("--hash=sha256:") == len(pins.WHEELS[pins.SGLANG])


# ----------------------------------------------------------------------------------------------------- tampered wheels


def test_tampered_wheel_is_refused_before_extraction(tmp_path, monkeypatch):
    name = next(iter(pins.WHEELS[TS]))
    fake = _wheel(tmp_path / "links" / name, {TS_FILE: b"print('pwned')\n"})
    _only(monkeypatch, TS, [TS_FILE])
    dest = tmp_path / "dest"
    with pytest.raises(pins.PinMismatch) as e:
        fetch.fetch(dest, tmp_path / "cache", [tmp_path / "links"])
    msg = str(e.value)
    assert name in msg and _sha(fake.read_bytes()) in msg and pins.WHEELS[TS][name] in msg
    assert not (dest / "-".join(TS)).exists()  # nothing extracted
    assert fetch.main(["--dest", str(dest), "--cache", str(tmp_path / "cache"),
                       "--find-links", str(tmp_path / "links")]) == 1


def test_wheel_with_pinned_hash_but_modified_entry_is_refused(tmp_path, monkeypatch):
    """Belt and braces: even a wheel that passes its pin must hold the pinned bytes for each file."""
    name = next(iter(pins.WHEELS[TS]))
    evil = b"evil = 1\n"
    fake = _wheel(tmp_path / "links" / name, {TS_FILE: evil})
    monkeypatch.setitem(pins.WHEELS, TS, {name: _sha(fake.read_bytes())})
    _only(monkeypatch, TS, [TS_FILE])
    with pytest.raises(pins.PinMismatch, match=rf"{name}:{TS_FILE}: sha256 {_sha(evil)}"):
        fetch.fetch(tmp_path / "dest", tmp_path / "cache", [tmp_path / "links"])
    assert not (tmp_path / "dest" / "-".join(TS) / TS_FILE).exists()


# ---------------------------------------------------------------------------------------------- unsafe archive entries


@pytest.mark.parametrize("entry", ["../../../X.h", "/tmp/X.h", "a/../../X.h", "a/./b.h", "C:/X.h", "a\\..\\X.h", ""])
def test_unsafe_entry_names_are_refused(tmp_path, entry):
    with pytest.raises(fetch.UnsafeEntry):
        fetch.safe_target(tmp_path / "root", entry)


def test_traversal_entry_is_refused_at_extraction(tmp_path, monkeypatch):
    """A wheel that passes its pin and names ``../../../X.h`` (as an ``#include "../../.."`` would reach) writes
    nothing outside the destination."""
    evil = "../../../X.h"
    name = next(iter(pins.WHEELS[TS]))
    fake = _wheel(tmp_path / "links" / name, {evil: b"#pragma once\n"})
    monkeypatch.setitem(pins.WHEELS, TS, {name: _sha(fake.read_bytes())})
    monkeypatch.setitem(pins.FILES, TS, {evil: _sha(b"#pragma once\n")})
    _only(monkeypatch, TS, [evil])
    dest = tmp_path / "a" / "b" / "dest"
    with pytest.raises(fetch.UnsafeEntry, match=r"\.\./\.\./\.\./X\.h"):
        fetch.fetch(dest, tmp_path / "cache", [tmp_path / "links"])
    assert not list(tmp_path.rglob("X.h"))


def test_symlinked_subdirectory_cannot_redirect_extraction(tmp_path):
    root = tmp_path / "root"
    (root / "pkg").parent.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "pkg").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(fetch.UnsafeEntry, match="outside"):
        fetch.safe_target(root, "pkg/X.h")


# -------------------------------------------------------------------------------------------------- modified originals


@pytest.fixture
def originals_copy(tmp_path, monkeypatch):
    """A private copy of the extracted CPU originals (JAXSPEC_ORIGINALS points at it)."""
    src = originals.originals_root()
    dst = tmp_path / "orig"
    for (dist, version), paths in fetch.required_files().items():
        for p in paths:
            f = dst / f"{dist}-{version}" / p
            f.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(originals.require(dist, version, p), f)
    shutil.copyfile(src / fetch.MANIFEST, dst / fetch.MANIFEST)
    monkeypatch.setenv("JAXSPEC_ORIGINALS", str(dst))
    return dst


def _tamper(root: pathlib.Path, dv, path: str, edit_manifest: bool) -> tuple[str, str]:
    f = root / f"{dv[0]}-{dv[1]}" / path
    data = f.read_bytes() + b"\nimport os  # injected\n"
    f.write_bytes(data)
    if edit_manifest:  # an attacker who also rewrites the record gains nothing: the pins are the anchor
        m = json.loads((root / fetch.MANIFEST).read_text())
        m[f"{dv[0]}-{dv[1]}"]["files"][path] = _sha(data)
        (root / fetch.MANIFEST).write_text(json.dumps(m))
    return _sha(data), pins.file_pin(*dv, path)


@pytest.mark.parametrize("edit_manifest", [False, True])
def test_tampered_extracted_file_is_refused_at_load(originals_copy, edit_manifest):
    eagle = "sglang/kernels/ops/speculative/eagle.py"
    got, want = _tamper(originals_copy, pins.SGLANG, eagle, edit_manifest)
    for load in (lambda: originals.load("fill_bonus_tokens"), lambda: originals.load_file(*pins.SGLANG, eagle),
                 lambda: originals.require(*pins.SGLANG, eagle)):
        with pytest.raises(pins.PinMismatch) as e:
            load()
        assert eagle in str(e.value) and got in str(e.value) and want in str(e.value)


def test_tampered_torch_source_original_is_refused(originals_copy):
    spec_utils = originals.ORIGINALS["select_top_k_tokens"].path
    _tamper(originals_copy, pins.SGLANG, spec_utils, edit_manifest=True)
    with pytest.raises(pins.PinMismatch, match="spec_utils.py"):
        originals.load("select_top_k_tokens")


def test_fetch_repairs_a_modified_file_loudly(originals_copy, tmp_path, monkeypatch, capsys):
    """A re-run does not report a modified file as present: it says so and restores the pinned bytes."""
    got, want = _tamper(originals_copy, pins.TOKENSPEED, TS_FILE, edit_manifest=True)
    name = next(iter(pins.WHEELS[TS]))
    # a wheel holding the pinned bytes, accepted through a test pin for the wheel itself
    data = (originals_copy / "-".join(TS) / TS_FILE).read_bytes().removesuffix(b"\nimport os  # injected\n")
    assert _sha(data) == pins.FILES[TS][TS_FILE]
    fake = _wheel(tmp_path / "links" / name, {TS_FILE: data})
    monkeypatch.setitem(pins.WHEELS, TS, {name: _sha(fake.read_bytes())})
    _only(monkeypatch, TS, [TS_FILE])
    fetch.fetch(originals_copy, tmp_path / "cache", [tmp_path / "links"])
    err = capsys.readouterr().err
    assert TS_FILE in err and got in err and want in err
    assert originals.verified_bytes(*TS, TS_FILE) == data


def test_cuda_include_dirs_refuse_modified_and_unpinned_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_ORIGINALS", str(tmp_path))
    inc = "sglang/kernels/jit/include"
    files = {p: h for p, h in pins.CUDA_FILES[pins.SGLANG].items() if p.startswith(inc + "/")}
    first = sorted(files)[0]
    f = tmp_path / "-".join(pins.SGLANG) / first
    f.parent.mkdir(parents=True)
    f.write_bytes(b"// modified\n")
    with pytest.raises(pins.PinMismatch, match=first.rsplit("/", 1)[1]):
        cuda_originals.verify_include_dir(pins.SGLANG, inc)
    f.unlink()
    (f.parent / "cuda_runtime.h").write_bytes(b"// shadows the toolkit's header\n")
    with pytest.raises(pins.PinMismatch, match="cuda_runtime.h.*no pinned sha256"):
        cuda_originals.verify_include_dir(pins.SGLANG, inc)


def _pinned_fake(tmp_path, monkeypatch, data=b"x = 1\n"):
    """A wheel holding ``TS_FILE`` with test pins for the wheel and the file; returns the links folder."""
    name = next(iter(pins.WHEELS[TS]))
    fake = _wheel(tmp_path / "links" / name, {TS_FILE: data})
    monkeypatch.setitem(pins.WHEELS, TS, {name: _sha(fake.read_bytes())})
    monkeypatch.setitem(pins.FILES, TS, {TS_FILE: _sha(data)})
    _only(monkeypatch, TS, [TS_FILE])
    return tmp_path / "links"


def test_symlinked_key_folder_cannot_redirect_extraction(tmp_path, monkeypatch):
    """``<dest>/<dist>-<version>`` planted as a symlink to a folder outside ``dest`` receives nothing."""
    links = _pinned_fake(tmp_path, monkeypatch)
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "-".join(TS)).symlink_to(outside)
    with pytest.raises(fetch.UnsafeEntry, match="outside"):
        fetch.fetch(dest, tmp_path / "cache", [links])
    assert not list(outside.rglob("*"))
    assert fetch.main(["--dest", str(dest), "--cache", str(tmp_path / "cache"), "--find-links", str(links)]) == 1
    assert not list(outside.rglob("*"))


def test_planted_part_file_and_manifest_links_are_not_followed(tmp_path, monkeypatch):
    """A ``.part`` symlink next to a file being extracted, or a ``manifest.json`` symlink, is replaced by a
    fresh file: the file it points at is left untouched."""
    data = b"x = 1\n"
    links = _pinned_fake(tmp_path, monkeypatch, data)
    dest = tmp_path / "dest"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me\n")
    part = dest / "-".join(TS) / (TS_FILE + ".part")
    part.parent.mkdir(parents=True)
    part.symlink_to(victim)
    (dest / fetch.MANIFEST).symlink_to(victim)
    fetch.fetch(dest, tmp_path / "cache", [links])
    assert victim.read_bytes() == b"keep me\n"
    assert (dest / "-".join(TS) / TS_FILE).read_bytes() == data
    assert not (dest / fetch.MANIFEST).is_symlink() and "-".join(TS) in (dest / fetch.MANIFEST).read_text()
