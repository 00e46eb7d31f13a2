"""Training data in pieces: a folder of ``shard-NNNNN.npz`` files of at most ``MAX_PIECE_BYTES`` each and a
``manifest.json`` that lists them, so a data stage stops after any shard and continues on another machine (the
GPU machine returns files of at most 16 MiB).

A shard holds ``tokens`` (right-padded with 0; ``uint16`` when every id fits, else ``int32``), ``lens``,
``resp_start`` (the loss covers tokens ``resp_start <= j < lens``) and ``kind`` (``int8``: the row's prompt kind,
``-1`` unknown). ``manifest.json`` holds the recipe's own fields plus ``shards`` (file, rows, bytes, sha256 each);
it is replaced atomically after every shard, and a shard not in it is ignored (a cut-short write).
"""

import json
import os

import numpy as np

from jaxspec._fetch import sha256_file
from jaxspec.pieces import MAX_PIECE_BYTES, write_json

MANIFEST = "manifest.json"


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest, or None when it has none yet."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_manifest(folder: str, manifest: dict) -> None:
    """Replace the folder's manifest atomically (the folder is made when missing)."""
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, MANIFEST), manifest)


def pack_rows(seqs, starts, kinds) -> dict:
    """``{tokens, lens, resp_start, kind}`` of a list of token sequences (see the module docstring)."""
    if not seqs:
        raise ValueError("seqs: expected at least one sequence")
    width = max(len(s) for s in seqs)
    top = max(int(np.max(s)) for s in seqs)
    tokens = np.zeros((len(seqs), width), np.uint16 if top < 2**16 else np.int32)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
    return dict(tokens=tokens, lens=np.asarray([len(s) for s in seqs], np.int32),
                resp_start=np.asarray(starts, np.int32), kind=np.asarray(kinds, np.int8))


def add_shard(folder: str, manifest: dict, rows: dict) -> dict:
    """Write ``rows`` (``pack_rows``) as the next shard(s), each at most ``MAX_PIECE_BYTES`` (a shard that would be
    bigger is split by rows), then the manifest with them listed; returns the new manifest."""
    os.makedirs(folder, exist_ok=True)
    n = len(rows["lens"])
    per_row = sum(a.itemsize * (a.shape[1] if a.ndim == 2 else 1) for a in rows.values())
    step = max(1, min(n, (MAX_PIECE_BYTES - 4096) // per_row))
    shards = list(manifest.get("shards", []))
    for lo in range(0, n, step):
        part = {k: v[lo:lo + step] for k, v in rows.items()}
        name = f"shard-{len(shards):05d}.npz"
        path = os.path.join(folder, name)
        tmp = path + ".tmp.npz"
        np.savez(tmp, **part)
        size = os.path.getsize(tmp)
        if size > MAX_PIECE_BYTES:
            os.remove(tmp)
            raise ValueError(f"shard {name}: {size} bytes, over the {MAX_PIECE_BYTES}-byte piece limit (one row "
                             f"takes {per_row} bytes)")
        os.replace(tmp, path)
        shards.append(dict(file=name, rows=int(len(part["lens"])), bytes=size, sha256=sha256_file(path)))
    manifest = dict(manifest, shards=shards, rows=sum(s["rows"] for s in shards))
    write_manifest(folder, manifest)
    return manifest


def read_shards(folder: str, *, verify: bool = True) -> dict:
    """The manifest's shards concatenated: ``{tokens i32[N, T], lens, resp_start, kind}`` (``verify``: each file's
    sha256 against the manifest first; ``ValueError`` naming the file that differs or is missing)."""
    manifest = read_manifest(folder)
    if manifest is None or not manifest.get("shards"):
        raise ValueError(f"{folder}: no {MANIFEST} with shards (not a data folder, or nothing generated yet)")
    parts = []
    for s in manifest["shards"]:
        path = os.path.join(folder, s["file"])
        if not os.path.exists(path):
            raise ValueError(f"{path}: listed in {MANIFEST} but missing")
        if verify and sha256_file(path) != s["sha256"]:
            raise ValueError(f"{path}: sha256 differs from {MANIFEST}'s {s['sha256']}")
        with np.load(path) as d:
            parts.append({k: d[k] for k in ("tokens", "lens", "resp_start", "kind")})
    width = max(p["tokens"].shape[1] for p in parts)
    tokens = np.concatenate([np.pad(p["tokens"].astype(np.int32), ((0, 0), (0, width - p["tokens"].shape[1])))
                             for p in parts])
    return dict(tokens=tokens, **{k: np.concatenate([p[k] for p in parts]) for k in ("lens", "resp_start", "kind")})
