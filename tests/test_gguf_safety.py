"""GGUF files that lie about their structure are refused with an error naming the tensor or field, before gguf's
reader or the loader allocate or read anything from the lie: truncated files (at every cut point), a tensor
whose bytes would lie past the end, an unknown type id, absurd dimensions or counts, metadata strings where
numbers belong, a block count the tensors do not hold; ``strict`` decides about tensors with no place."""

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxspec.models import gguf as jgguf
from jaxspec.models import load_model, read_gguf_info
from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder

gguf = pytest.importorskip("gguf")  # not installed where jaxspec is installed without its dependencies

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False)


def _tensors(cfg=CFG, seed=0) -> dict[str, np.ndarray]:
    """GGUF name -> f32 array (numpy order) for every tensor a llama decoder of ``cfg`` reads."""
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    out = {}
    for key, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        for name, shape, _ in jgguf.gguf_tensors(key, cfg)[0]:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def write(path, cfg=CFG, *, meta=None, drop_meta=(), extra_tensors=None) -> str:
    """A small llama GGUF (F32 tensors) written with gguf's writer; ``meta``: key -> value overriding or adding
    metadata (str -> string, float -> float32, int -> uint32); ``drop_meta``: keys left out."""
    std = {"llama.block_count": cfg.num_hidden_layers, "llama.context_length": 128,
           "llama.embedding_length": cfg.hidden_size, "llama.feed_forward_length": cfg.intermediate_size,
           "llama.attention.head_count": cfg.num_attention_heads,
           "llama.attention.head_count_kv": cfg.num_key_value_heads,
           "llama.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "llama.rope.freq_base": 10000.0,
           "llama.rope.dimension_count": cfg.head_dim}
    std.update(meta or {})
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    for k, v in std.items():
        if k in drop_meta:
            continue
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_uint32(k, v)
    for name, arr in {**_tensors(cfg), **(extra_tensors or {})}.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(path)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write(tmp_path_factory.mktemp("gguf") / "good.gguf")


def _patched(tmp_path, src, fn, name="bad.gguf") -> str:
    data = bytearray(Path(src).read_bytes())
    fn(data)
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return os.fspath(out)


def _tensor_info(data: bytes, name: str) -> int:
    """Offset of the ``n_dims`` field of tensor ``name``'s info record (right after its name)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = bytes(data).rindex(key)
    return at + len(key)


def test_the_fixture_loads(good):
    m = load_model(good)
    assert m.cfg.num_hidden_layers == 2 and m.cfg.vocab_size == 64


def test_every_truncation_is_refused_clearly(tmp_path, good):
    data = Path(good).read_bytes()
    header_end = _tensor_info(data, "output_norm.weight")
    cuts = sorted({*range(0, header_end + 40, 7), *np.linspace(header_end, len(data) - 1, 25).astype(int).tolist()})
    for cut in cuts:
        p = tmp_path / "cut.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"truncated GGUF file|past the end of the file|not a GGUF file") as e:
            load_model(os.fspath(p)) if cut >= 4 else jgguf.check_layout(p)
        assert str(p) in str(e.value), (cut, str(e.value))
    # a cut inside the tensor data names the tensor whose bytes are missing
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:-8])
    with pytest.raises(ValueError, match=r"tensor \S+: F32 of ne \[.*\] declares \d+ bytes .* past the end"):
        read_gguf_info(p)


def test_tensor_larger_than_the_file_is_refused(tmp_path, good):
    def grow(data):
        at = _tensor_info(data, "blk.1.ffn_down.weight")
        assert struct.unpack_from("<I", data, at)[0] == 2
        struct.pack_into("<QQ", data, at + 4, 64, 1 << 20)  # ne [64, 1048576]: 256 MiB of f32

    bad = _patched(tmp_path, good, grow)
    with pytest.raises(ValueError, match=r"tensor blk\.1\.ffn_down\.weight: F32 of ne \[64, 1048576\] declares "
                                         r"268435456 bytes .* past the end of the file"):
        load_model(bad)


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 40], [1 << 63, 4], [(1 << 64) - 1, (1 << 64) - 1]])
def test_absurd_dimensions_are_refused_without_allocating(tmp_path, good, dims):
    def absurd(data):
        at = _tensor_info(data, "token_embd.weight")
        struct.pack_into("<QQ", data, at + 4, *dims)

    bad = _patched(tmp_path, good, absurd)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"tensor token_embd\.weight: .*past the end of the file"):
        load_model(bad)
    assert time.monotonic() - t0 < 5


def test_too_many_dimensions_is_refused(tmp_path, good):
    def five(data):
        at = _tensor_info(data, "output_norm.weight")
        struct.pack_into("<I", data, at, 5)

    with pytest.raises(ValueError, match=r"tensor output_norm\.weight: 5 dimensions"):
        read_gguf_info(_patched(tmp_path, good, five))


@pytest.mark.parametrize("type_id", [4, 5, 9999])  # ids 4 and 5 (Q4_2, Q4_3) were removed from ggml
def test_unknown_type_id_is_refused_naming_the_tensor(tmp_path, good, type_id):
    def retype(data):
        at = _tensor_info(data, "blk.0.attn_q.weight")
        n = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at + 4 + 8 * n, type_id)

    with pytest.raises(ValueError, match=rf"tensor blk\.0\.attn_q\.weight: unknown GGUF type id {type_id}"):
        load_model(_patched(tmp_path, good, retype))


def test_known_but_unsupported_type_is_refused_by_name(tmp_path, good):
    def q5(data):
        at = _tensor_info(data, "output_norm.weight")
        struct.pack_into("<I", data, at + 4 + 8, int(gguf.GGMLQuantizationType.Q5_K))
        struct.pack_into("<Q", data, at + 4, 256)  # one Q5_K block of 256 fits in the f32 bytes

    with pytest.raises(ValueError, match=r"output_norm\.weight.*(Q5_K|expected shape)"):
        load_model(_patched(tmp_path, good, q5))


@pytest.mark.parametrize("key, value, match", [
    ("llama.block_count", "2", r"llama\.block_count: expected an integer, got '2'"),
    ("llama.embedding_length", 32.0, r"llama\.embedding_length: expected an integer, got 32\.0"),
    ("llama.attention.head_count", "two", r"llama\.attention\.head_count: expected an integer, got 'two'"),
    ("llama.attention.layer_norm_rms_epsilon", "1e-5", r"layer_norm_rms_epsilon: expected a number, got '1e-5'"),
    ("llama.rope.freq_base", "10000", r"llama\.rope\.freq_base: expected a number"),
    ("llama.context_length", "128", r"llama\.context_length: expected an integer"),
    ("llama.vocab_size", "64", r"llama\.vocab_size: expected an integer"),
    ("llama.expert_count", "8", r"llama\.expert_count: expected an integer"),
])
def test_metadata_string_where_a_number_belongs(tmp_path, key, value, match):
    p = write(tmp_path / "m.gguf", meta={key: value})
    with pytest.raises(ValueError, match=match):
        read_gguf_info(p)


def test_missing_metadata_is_named(tmp_path):
    p = write(tmp_path / "m.gguf", drop_meta=("llama.feed_forward_length",))
    with pytest.raises(ValueError, match=r"GGUF metadata llama\.feed_forward_length is missing"):
        read_gguf_info(p)


def test_block_count_checked_against_the_tensors(tmp_path):
    p = write(tmp_path / "m.gguf", meta={"llama.block_count": 1_000_000})
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"llama\.block_count = 1000000 but the file holds tensors of blocks \[0, 1\]"):
        load_model(p)
    assert time.monotonic() - t0 < 5


def test_huge_metadata_counts_fail_fast(tmp_path):
    """A string or array length far beyond the file (gguf's reader would loop or read short) is refused at once."""
    src = write(tmp_path / "m.gguf", meta={"tokenizer.ggml.scores": [0.5] * 64, "general.name": "tiny"})

    def long_array(data):
        key = b"tokenizer.ggml.scores"
        at = bytes(data).index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
        assert struct.unpack_from("<II", data, at) == (int(gguf.GGUFValueType.ARRAY), int(gguf.GGUFValueType.FLOAT32))
        struct.pack_into("<Q", data, at + 8, 1 << 60)

    def long_string(data):
        key = b"general.name"
        at = bytes(data).index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
        struct.pack_into("<Q", data, at + 4, 1 << 62)

    def many_tensors(data):
        struct.pack_into("<Q", data, 8, 1 << 50)

    for fn, match in ((long_array, r"metadata tokenizer\.ggml\.scores \(1152921504606846976 elements\)"),
                      (long_string, r"metadata general\.name needs 4611686018427387904 bytes"),
                      (many_tensors, r"\d+ metadata entries and 1125899906842624 tensors declared")):
        bad = _patched(tmp_path, src, fn)
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"truncated GGUF file: " + match):
            read_gguf_info(bad)
        assert time.monotonic() - t0 < 5


def test_big_endian_and_unknown_versions_are_refused(tmp_path, good):
    be = _patched(tmp_path, good, lambda d: struct.pack_into(">I", d, 4, 3), "be.gguf")
    with pytest.raises(ValueError, match="big-endian"):
        read_gguf_info(be)
    v9 = _patched(tmp_path, good, lambda d: struct.pack_into("<I", d, 4, 9), "v9.gguf")
    with pytest.raises(ValueError, match="GGUF version 9 is not supported"):
        read_gguf_info(v9)


def test_strict_decides_about_tensors_with_no_place(tmp_path):
    p = write(tmp_path / "m.gguf", extra_tensors={"mm.vision.weight": np.ones((4, 4), np.float32)})
    with pytest.raises(ValueError, match=r"tensors \['mm\.vision\.weight'\] have no place.*strict=False"):
        load_model(p)
    m = load_model(p, strict=False)
    assert m.cfg.num_hidden_layers == 2
