"""Named arrays saved in files of at most ``MAX_PIECE_BYTES`` (16 MiB): what a training state needs to stop on one
machine and continue on another whose file transfers are capped (the GPU machine returns files of at most
16 MiB).

``save_arrays(folder, arrays)`` writes the arrays' bytes back to back into ``piece-NNNNN.bin`` files of at most
``MAX_PIECE_BYTES`` each (an array may span files) and ``index.json`` (per array: dtype, shape, byte offset; per
file: size and sha256), the index last. ``load_arrays(folder)`` checks every file against the index and returns
the arrays, bit for bit (any dtype NumPy or ``ml_dtypes`` names, bfloat16 included).
"""

import hashlib
import json
import os

import numpy as np

MAX_PIECE_BYTES = 16 * 2**20
INDEX = "index.json"


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 (jax's own dependency)

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def write_json(path: str, obj) -> None:
    """``obj`` as JSON at ``path``, atomically (a temporary file beside it, then renamed over it)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def save_arrays(folder: str, arrays: dict) -> dict:
    """Write ``arrays`` (``{name: array}``) into ``folder`` (module docstring); returns the index."""
    os.makedirs(folder, exist_ok=True)
    entries, files = [], []
    buf, offset = bytearray(), 0

    def flush():
        nonlocal buf
        name = f"piece-{len(files):05d}.bin"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(buf)
        files.append(dict(file=name, bytes=len(buf), sha256=hashlib.sha256(buf).hexdigest()))
        buf = bytearray()

    for name, a in arrays.items():
        a = np.asarray(a)
        raw = a.tobytes(order="C")
        entries.append(dict(name=str(name), dtype=str(a.dtype), shape=list(a.shape), offset=offset, nbytes=len(raw)))
        offset += len(raw)
        view = memoryview(raw)
        while view:
            room = MAX_PIECE_BYTES - len(buf)
            buf += view[:room]
            view = view[room:]
            if len(buf) == MAX_PIECE_BYTES:
                flush()
    if buf or not files:
        flush()
    index = dict(arrays=entries, files=files, bytes=offset)
    write_json(os.path.join(folder, INDEX), index)
    return index


def load_arrays(folder: str) -> dict:
    """``{name: np.ndarray}`` of ``save_arrays``' ``folder``; ``ValueError`` naming a missing or changed file."""
    path = os.path.join(folder, INDEX)
    if not os.path.exists(path):
        raise ValueError(f"{folder}: no {INDEX} (not a folder of save_arrays, or its write did not finish)")
    with open(path) as f:
        index = json.load(f)
    blob = bytearray()
    for entry in index["files"]:
        fp = os.path.join(folder, entry["file"])
        if not os.path.exists(fp):
            raise ValueError(f"{fp}: listed in {INDEX} but missing")
        with open(fp, "rb") as f:
            data = f.read()
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"{fp}: size or sha256 differs from {INDEX}")
        blob += data
    out = {}
    for e in index["arrays"]:
        raw = bytes(blob[e["offset"]:e["offset"] + e["nbytes"]])
        out[e["name"]] = np.frombuffer(raw, dtype=_dtype(e["dtype"])).reshape(tuple(e["shape"])).copy()
    return out
