"""``jaxspec.pieces``: named arrays in files of at most 16 MiB, back bit for bit."""

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxspec import pieces


def _arrays(rng):
    return {"w": rng.standard_normal((300, 7)).astype(np.float32),
            "b16": rng.standard_normal((33, 5)).astype(ml_dtypes.bfloat16),
            "count": np.asarray(7, np.int32), "empty": np.zeros((0, 3), np.float32),
            "ids": rng.integers(0, 2**40, (11,)).astype(np.int64), "flag": np.asarray([True, False])}


@pytest.mark.parametrize("limit", [4096 * 1024, 1000, 97])
def test_arrays_come_back_bit_for_bit_in_files_under_the_limit(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(pieces, "MAX_PIECE_BYTES", limit)
    arrays = _arrays(np.random.default_rng(limit))
    index = pieces.save_arrays(str(tmp_path), arrays)
    assert all(f["bytes"] <= limit for f in index["files"])
    assert len(index["files"]) == max(1, -(-index["bytes"] // limit))
    got = pieces.load_arrays(str(tmp_path))
    assert list(got) == list(arrays)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        assert got[k].tobytes() == a.tobytes()
    assert jnp.asarray(got["b16"]).dtype == jnp.bfloat16


def test_a_changed_or_missing_piece_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(pieces, "MAX_PIECE_BYTES", 2000)
    index = pieces.save_arrays(str(tmp_path), _arrays(np.random.default_rng(0)))
    f = tmp_path / index["files"][1]["file"]
    data = bytearray(f.read_bytes())
    data[3] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256 differs"):
        pieces.load_arrays(str(tmp_path))
    f.unlink()
    with pytest.raises(ValueError, match="missing"):
        pieces.load_arrays(str(tmp_path))
    os.remove(tmp_path / pieces.INDEX)
    with pytest.raises(ValueError, match="no index.json"):
        pieces.load_arrays(str(tmp_path))


def test_the_index_is_plain_json(tmp_path):
    pieces.save_arrays(str(tmp_path), {"x": np.arange(4, dtype=np.int16)})
    index = json.loads((tmp_path / pieces.INDEX).read_text())
    assert index["arrays"] == [dict(name="x", dtype="int16", shape=[4], offset=0, nbytes=8)]
