"""Read the key/value metadata of a GGUF file (no tensor data).

``gguf.GGUFReader`` parses every field and tensor record into numpy views, which takes several seconds
for a 49k-token vocabulary; the tokenizer needs only the key/value section at the head of the file, read
here sequentially. The layout (GGUF v2/v3, little-endian): magic ``GGUF``, ``u32`` version, ``u64``
tensor count, ``u64`` key count, then per key a string (``u64`` length + UTF-8 bytes), a ``u32`` value
type and the value; an array is ``u32`` element type + ``u64`` count + the elements.
"""

import struct

import numpy as np

# GGUF value types (gguf.GGUFValueType): numpy dtypes of the fixed-size ones.
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
            12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader understands (bad magic, version, byte order, or truncated)."""


class _Cursor:
    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise GGUFFormatError(f"{self.path}: truncated GGUF metadata (wanted {n} bytes at offset {self.pos})")
        out = self.data[self.pos: self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int, key: str):
        if vtype in _SCALARS:
            dt = np.dtype(_SCALARS[vtype])
            return np.frombuffer(self.take(dt.itemsize), dt)[0].item()
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype])
                return np.frombuffer(self.take(dt.itemsize * count), dt).tolist()
            return [self.value(etype, key) for _ in range(count)]
        raise GGUFFormatError(f"{self.path}: key {key!r} has unknown GGUF value type {vtype}")


def read_gguf_metadata(path: str, prefixes: tuple[str, ...] | None = None) -> dict:
    """The key/value metadata of the GGUF at ``path`` as Python values (arrays as lists); only the keys that
    start with one of ``prefixes`` when given (the others are still parsed, to reach the next key)."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != b"GGUF":
            raise GGUFFormatError(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
        version = struct.unpack("<I", head[4:8])[0]
        if version not in (2, 3):
            swapped = struct.unpack(">I", head[4:8])[0]
            what = "a big-endian GGUF (unsupported)" if swapped in (2, 3) else f"GGUF version {version}"
            raise GGUFFormatError(f"{path}: {what}; expected a little-endian GGUF of version 2 or 3")
        _, num_kv = struct.unpack("<QQ", head[8:24])
        # The metadata sits at the head; read in growing chunks rather than the whole (weights-sized) file.
        size = 1 << 22
        while True:
            f.seek(0)
            data = f.read(size)
            try:
                cur = _Cursor(data, path)
                cur.pos = 24
                out = {}
                for _ in range(num_kv):
                    key = cur.string()
                    val = cur.value(cur.u32(), key)
                    if prefixes is None or key.startswith(prefixes):
                        out[key] = val
                return out
            except GGUFFormatError:
                if len(data) < size:  # the whole file was read: truly truncated
                    raise
                size *= 4
