"""The GGUF container's head: magic, version, counts and the key/value metadata, read with every length checked
against the bytes the file has left (no tensor data; numpy only, no ``gguf`` package).

The layout (GGUF v2/v3, little-endian): magic ``GGUF``, ``u32`` version, ``u64`` tensor count, ``u64`` key
count, then per key a string (``u64`` length + UTF-8 bytes), a ``u32`` value type and the value; an array is
``u32`` element type + ``u64`` count + the elements. ``Bounded`` never reads past the end of the file nor
allocates from a length it has not checked; ``read_value`` parses a value or skips it. Two readers stand on it:
``read_gguf_metadata`` (the tokenizer's keys, without ``gguf.GGUFReader``'s seconds-long parse of a 49k-token
vocabulary) and ``jaxspec.models.gguf.check_layout`` (the whole file's structure before ``gguf`` reads it).
"""

import os

import numpy as np

MAGIC = b"GGUF"
# GGUF value types (gguf.GGUFValueType): numpy dtypes of the fixed-size ones.
SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
           12: "<f8"}
STRING, ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader understands (bad magic, version, byte order, or truncated)."""


class Bounded:
    """Little-endian reads from a file that never go past its end (``GGUFFormatError`` naming what was read)."""

    def __init__(self, f, size: int, path: str):
        self.f, self.size, self.path = f, size, path

    @property
    def left(self) -> int:
        return self.size - self.f.tell()

    def _room(self, n: int, what: str) -> None:
        if n > self.left:
            raise GGUFFormatError(f"{self.path}: truncated GGUF file: {what} needs {n} bytes at offset "
                                  f"{self.f.tell()}, the file has {self.left} left")

    def take(self, n: int, what: str) -> bytes:
        self._room(n, what)
        return self.f.read(n)

    def skip(self, n: int, what: str) -> None:
        self._room(n, what)
        self.f.seek(n, os.SEEK_CUR)

    def uint(self, n: int, what: str) -> int:
        return int.from_bytes(self.take(n, what), "little")

    def string(self, what: str) -> bytes:
        return self.take(self.uint(8, f"{what} length"), what)


def read_header(r: Bounded) -> tuple[int, int]:
    """Check the magic and version at the file's start; returns ``(tensor count, metadata count)``, both checked
    against the bytes left (each entry takes at least 13 / 24 bytes)."""
    if r.take(4, "magic") != MAGIC:
        raise GGUFFormatError(f"{r.path}: not a GGUF file (no GGUF magic)")
    version = r.uint(4, "version")
    if version & 0xFFFF == 0:
        raise GGUFFormatError(f"{r.path}: a big-endian GGUF file is not supported (only little-endian)")
    if version not in (2, 3):
        raise GGUFFormatError(f"{r.path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = r.uint(8, "tensor count"), r.uint(8, "metadata count")
    if n_kv * 13 > r.left or n_tensors * 24 > r.left:
        raise GGUFFormatError(f"{r.path}: truncated GGUF file: {n_kv} metadata entries and {n_tensors} tensors "
                              f"declared, more than the {r.left} bytes left can hold")
    return n_tensors, n_kv


def read_value(r: Bounded, vtype: int, key: str, keep: bool):
    """The value of type ``vtype`` at the file position as a Python value (arrays as lists; strings decoded
    UTF-8 with ``surrogateescape``), or skipped (``None``) when not ``keep``."""
    what = f"metadata {key}"
    if vtype in SCALARS:
        dt = np.dtype(SCALARS[vtype])
        if not keep:
            return r.skip(dt.itemsize, what)
        return np.frombuffer(r.take(dt.itemsize, what), dt)[0].item()
    if vtype == STRING:
        s = r.string(what)
        return s.decode("utf-8", errors="surrogateescape") if keep else None
    if vtype != ARRAY:
        raise GGUFFormatError(f"{r.path}: GGUF metadata {key}: unknown value type id {vtype}")
    etype, n = r.uint(4, f"{what} element type"), r.uint(8, f"{what} length")
    if etype in SCALARS:
        dt = np.dtype(SCALARS[etype])
        if not keep:
            return r.skip(n * dt.itemsize, f"{what} ({n} elements)")
        return np.frombuffer(r.take(n * dt.itemsize, f"{what} ({n} elements)"), dt).tolist()
    if etype not in (STRING, ARRAY):
        raise GGUFFormatError(f"{r.path}: GGUF metadata {key}: unknown array element type id {etype}")
    if n * (8 if etype == STRING else 12) > r.left:
        raise GGUFFormatError(f"{r.path}: truncated GGUF file: {what} declares {n} elements, more than the {r.left} "
                              f"bytes left can hold")
    out = [read_value(r, etype, key, keep) for _ in range(n)]
    return out if keep else None


def read_gguf_metadata(path, prefixes: tuple[str, ...] | None = None) -> dict:
    """The key/value metadata of the GGUF at ``path`` as Python values (arrays as lists); only the keys that
    start with one of ``prefixes`` when given (the others are skipped). ``GGUFFormatError`` (a ``ValueError``)
    for a file this reader does not understand."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        r = Bounded(f, os.path.getsize(path), path)
        _, n_kv = read_header(r)
        out = {}
        for _ in range(n_kv):
            key = r.string("metadata key").decode("utf-8", errors="surrogateescape")
            keep = prefixes is None or key.startswith(prefixes)
            value = read_value(r, r.uint(4, f"metadata {key} type"), key, keep)
            if keep:
                out[key] = value
        return out


__all__ = ["GGUFFormatError", "Bounded", "read_header", "read_value", "read_gguf_metadata"]
