"""GGUF loading (jaxspec.models.gguf): tiny 2-layer llama GGUFs written here with the ``gguf`` package's own
writer and quantizer, one per supported type, load to the weights of their dequantized source; the q/k rope
permutation of llama.cpp's converter is undone; refusals name the tensor. CPU, f32, seconds."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from jaxspec.models import load_model, save_model
from jaxspec.models import gguf as jgguf
from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder
from jaxspec.protocols import AttentionMetadata
from jaxspec.pipeline import causal_qmask

gguf = pytest.importorskip("gguf")  # not installed where jaxspec is installed without its dependencies

# Every row length (ne0: hidden 64, intermediate 96) is a multiple of the 32-element quant block.
CFG = DecoderConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=50000.0,
                    tie_word_embeddings=False)
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

_GGUF_NAME = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def hf_to_gguf_name(name: str) -> str:
    """A Hugging Face llama tensor name -> llama.cpp's (written here independently of the loader's table)."""
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, i, *rest = name.split(".")
    return f"blk.{i}.{_GGUF_NAME['.'.join(rest[:-1])]}.{rest[-1]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transformers_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' ``LlamaTensorProcessor._reverse_permute_weights`` (the reference inverse)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def random_hf(cfg: DecoderConfig, tmp_path, seed: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    """A random HF-layout llama checkpoint directory (jaxspec's writer) and its tensors (f32, [out, in])."""
    model = Decoder(cfg, rngs=nnx.Rngs(seed), param_dtype=jnp.float32)
    rng = np.random.default_rng(seed)
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if key[-1] == "weight":  # norms start at one: make them differ so a swapped norm cannot pass
            var.set_value(jnp.asarray(rng.uniform(0.5, 1.5, var.get_value().shape), jnp.float32))
    path = os.path.join(tmp_path, f"hf{seed}")
    save_model(model, path)
    return path, load_file(os.path.join(path, "model.safetensors"))


def write_llama_gguf(path, cfg: DecoderConfig, hf: dict[str, np.ndarray], *, qtype: str = "F32",
                     arch: str = "llama", permute: bool = True, drop=(), replace=None, norm_type: str = "F32",
                     types=None, meta=None, vocab_size_key: bool = True) -> dict[str, np.ndarray]:
    """Write ``hf`` (HF names and layout) as a llama GGUF the way llama.cpp's converter does (q/k rows
    permuted when ``permute``), 2-D weights as ``qtype``, norms as ``norm_type``; returns the HF-layout f32
    tensors a correct loader must produce (each written tensor dequantized by ``gguf.quants`` and
    un-permuted by transformers' formula). ``drop``: GGUF names left out; ``replace``: name -> array;
    ``types``: GGUF name -> type, overriding ``qtype`` / ``norm_type``; ``vocab_size_key=False`` leaves
    ``llama.vocab_size`` out."""
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(256)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    if vocab_size_key and "llama.vocab_size" not in (meta or {}):
        w.add_vocab_size(cfg.vocab_size)  # optional for jaxspec; transformers needs it (or a token list)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for k, v in (meta or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_uint32(k, v)
    expected = {}
    for name, arr in sorted(hf.items()):
        gname = hf_to_gguf_name(name)
        if gname in drop:
            continue
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(gname.split(".")[2]) \
            if gname.startswith("blk.") else None
        a = np.asarray(arr, np.float32)
        if heads is not None and permute:
            a = llama_cpp_permute(a, heads)
        a = (replace or {}).get(gname, a)
        t = gguf.GGMLQuantizationType[(types or {}).get(gname, qtype if a.ndim == 2 else norm_type)]
        if t == gguf.GGMLQuantizationType.F32:
            data = a
            w.add_tensor(gname, data)
        elif t == gguf.GGMLQuantizationType.F16:
            data = a.astype(np.float16)
            w.add_tensor(gname, data)
        else:
            data = gguf.quants.quantize(a, t)
            w.add_tensor(gname, data, raw_dtype=t)
        ref = gguf.quants.dequantize(data, t).astype(np.float32).reshape(a.shape)
        expected[name] = transformers_unpermute(ref, heads) if heads is not None and permute else ref
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _hf_tensors_of(model, tmp_path) -> dict[str, np.ndarray]:
    out = os.path.join(tmp_path, "resaved")
    save_model(model, out, dtype=jnp.float32)
    return load_file(os.path.join(out, "model.safetensors"))


@nnx.jit
def _fwd(model, tokens, meta):
    return model.forward(tokens, meta, None)[0]


def _logits(model, tokens):
    b, t = tokens.shape
    meta = AttentionMetadata(positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t)),
                             qmask=causal_qmask(b, t), prefix_lens=jnp.zeros((b,), jnp.int32),
                             page_table=jnp.zeros((b, 0), jnp.int32), write_locs=None, page_size=1)
    return np.asarray(_fwd(model, jnp.asarray(tokens, jnp.int32), meta))


# ----------------------------------------------------------------------------------------------------
# dequantization against gguf.quants (an independent implementation), on arbitrary bytes


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_matches_gguf_reference_on_random_bytes(qtype, monkeypatch):
    """Random raw bytes cover every nibble, sign and scale (inf/NaN scales included: NaNs compare equal)."""
    monkeypatch.setattr(jgguf, "_CHUNK_ELEMENTS", 96)  # several row chunks per tensor, and a ragged last one
    t = gguf.GGMLQuantizationType[qtype]
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[t]
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    rows, cols = 7, 64
    raw = rng.integers(0, 256, (rows, cols // per_block * block_bytes), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = gguf.quants.dequantize(raw, t).astype(np.float32).reshape(rows, cols)
        ref16 = ref.astype(jnp.bfloat16).astype(np.float32)
    got = jgguf.dequantize(raw, qtype, (rows, cols), np.float32, name="x")
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    np.testing.assert_array_equal(got, ref)  # exact (assert_array_equal treats NaN == NaN)
    got16 = jgguf.dequantize(raw, qtype, (rows, cols), jnp.bfloat16, name="x")  # one rounding, to bf16
    assert got16.dtype == np.dtype(jnp.bfloat16)
    np.testing.assert_array_equal(got16.astype(np.float32), ref16)


def test_dequantize_block_layout_by_hand():
    """Q4_0 / Q4_1 / Q8_0 blocks built byte by byte: low nibbles are elements 0-15, high nibbles 16-31."""
    d = np.float16(0.5).tobytes()
    m = np.float16(-1.0).tobytes()
    nib = bytes(range(16))  # byte j: low nibble j, high nibble 0
    q40 = np.frombuffer(d + nib, np.uint8)
    expect_lo = (np.arange(16) - 8) * 0.5
    np.testing.assert_array_equal(jgguf.dequantize(q40, "Q4_0", (32,)),
                                  np.concatenate([expect_lo, np.full(16, -4.0)]).astype(np.float32))
    q41 = np.frombuffer(d + m + bytes((15 - j) << 4 for j in range(16)), np.uint8)  # high nibble 15-j, low 0
    np.testing.assert_array_equal(jgguf.dequantize(q41, "Q4_1", (32,)),
                                  np.concatenate([np.full(16, -1.0), (15 - np.arange(16)) * 0.5 - 1.0])
                                  .astype(np.float32))
    q80 = np.frombuffer(d + np.arange(-16, 16, dtype=np.int8).tobytes(), np.uint8)
    np.testing.assert_array_equal(jgguf.dequantize(q80, "Q8_0", (32,)), (np.arange(-16, 16) * 0.5).astype(np.float32))


def test_dequantize_refusals():
    with pytest.raises(ValueError, match="tensor w: GGUF type Q5_K is not supported \\(supported: F32, F16, BF16"):
        jgguf.dequantize(np.zeros(176, np.uint8), "Q5_K", (256,), name="w")
    with pytest.raises(ValueError, match="tensor w: Q4_0 rows hold whole blocks of 32 elements, but the row length "
                                         "is 48"):
        jgguf.dequantize(np.zeros(27, np.uint8), "Q4_0", (48,), name="w")
    with pytest.raises(ValueError, match="tensor w: Q8_0 of shape \\(2, 32\\) needs 68 bytes, found 34"):
        jgguf.dequantize(np.zeros(34, np.uint8), "Q8_0", (2, 32), name="w")


def test_rope_permutation_inverse():
    rng = np.random.default_rng()
    w = rng.standard_normal((3 * 16, 5)).astype(np.float32)
    assert np.array_equal(jgguf.unpermute_rope_rows(llama_cpp_permute(w, 3), 3), w)
    assert np.array_equal(jgguf.unpermute_rope_rows(w, 3), transformers_unpermute(w, 3))
    assert np.array_equal(jgguf.permute_rope_rows(w, 3), llama_cpp_permute(w, 3))
    assert not np.array_equal(jgguf.unpermute_rope_rows(w, 3), w)


# ----------------------------------------------------------------------------------------------------
# whole files


@pytest.mark.parametrize("qtype", TYPES)
def test_load_equals_dequantized_source(qtype, tmp_path):
    """Every 2-D weight in ``qtype`` (norms F32, as llama.cpp writes them): the loaded Decoder's tensors (re-saved
    in HF layout by save_model) equal gguf.quants' dequantization, un-permuted by transformers' formula."""
    _, hf = random_hf(CFG, tmp_path)
    path = tmp_path / f"tiny-{qtype}.gguf"
    expected = write_llama_gguf(path, CFG, hf, qtype=qtype)
    model = load_model(str(path))
    assert isinstance(model, Decoder) and model.cfg == CFG
    got = _hf_tensors_of(model, tmp_path)
    assert set(got) == set(expected) == set(hf)
    for name in sorted(hf):
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        if qtype in ("F32",):
            np.testing.assert_array_equal(got[name], hf[name], err_msg=name)
    if qtype in ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1"):  # the quantization really happened
        assert not np.array_equal(got["model.layers.0.mlp.up_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"])


def test_mixed_types_like_llama_cpp(tmp_path):
    """One file, several types (llama.cpp's Q4_1 recipe: Q8_0 embedding, Q4_1 matrices, F32 norms; here also
    a BF16 head and an F16 projection)."""
    _, hf = random_hf(CFG, tmp_path)
    path = tmp_path / "mixed.gguf"
    expected = write_llama_gguf(path, CFG, hf, qtype="Q4_1", types={
        "token_embd.weight": "Q8_0", "output.weight": "BF16", "blk.1.attn_v.weight": "F16",
        "blk.0.ffn_down.weight": "Q4_0"})
    got = _hf_tensors_of(load_model(str(path)), tmp_path)
    for name in sorted(hf):
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.parametrize("qtype", ["F16", "Q4_1"])
def test_bf16_load_rounds_once(qtype, tmp_path):
    """param_dtype=bf16: each tensor is the f32 dequantization rounded once to bf16 (F16 norms too)."""
    _, hf = random_hf(CFG, tmp_path)
    path = tmp_path / "tiny.gguf"
    expected = write_llama_gguf(path, CFG, hf, qtype=qtype, norm_type="F16")
    model = load_model(str(path), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    assert all(v.get_value().dtype == jnp.bfloat16 for _, v in flat)
    got = _hf_tensors_of(model, tmp_path)
    for name in sorted(hf):
        np.testing.assert_array_equal(got[name], expected[name].astype(jnp.bfloat16).astype(np.float32), err_msg=name)


def test_permutation_undone_same_logits_as_hf_dir(tmp_path):
    """A GGUF written from an HF-layout model with llama.cpp's q/k permutation gives the HF directory's logits
    bit for bit (same f32 weights, same graph); written without the permutation it does not (the check can fail)."""
    d, hf = random_hf(CFG, tmp_path, seed=3)
    write_llama_gguf(tmp_path / "p.gguf", CFG, hf)
    write_llama_gguf(tmp_path / "np.gguf", CFG, hf, permute=False)
    tokens = np.random.default_rng().integers(0, CFG.vocab_size, (2, 9))
    ref = _logits(load_model(d, mtp=False), tokens)
    np.testing.assert_array_equal(_logits(load_model(str(tmp_path / "p.gguf")), tokens), ref)
    wrong = _logits(load_model(str(tmp_path / "np.gguf")), tokens)
    assert np.max(np.abs(wrong - ref)) > 1e-3 * np.max(np.abs(ref))
    assert np.array_equal(wrong[:, 0], ref[:, 0])  # position 0: RoPE is the identity, the layouts agree


def test_tied_embeddings_when_no_output_weight(tmp_path):
    cfg = DecoderConfig(**{**CFG.__dict__, "tie_word_embeddings": True})
    d, hf = random_hf(cfg, tmp_path)
    assert "lm_head.weight" not in hf
    write_llama_gguf(tmp_path / "t.gguf", cfg, hf, qtype="Q8_0")
    model = load_model(str(tmp_path / "t.gguf"))
    assert model.cfg.tie_word_embeddings and model.lm_head is None
    info = jgguf.read_gguf_info(str(tmp_path / "t.gguf"))
    assert (info.context_length, info.bos_token_id, info.eos_token_id, info.pad_token_id) == (256, 1, 2, None)
    assert info.general["architecture"] == "llama"


def test_metadata_maps_to_config(tmp_path):
    _, hf = random_hf(CFG, tmp_path)
    write_llama_gguf(tmp_path / "m.gguf", CFG, hf)
    cfg = jgguf.read_gguf_config(str(tmp_path / "m.gguf"))
    assert cfg == CFG  # rms eps 1e-5 is stored as f32: DecoderConfig compares the float read back
    assert jgguf.is_gguf(tmp_path / "m.gguf") and not jgguf.is_gguf(tmp_path)


def _refused(tmp_path, match, **kw):
    _, hf = random_hf(CFG, tmp_path)
    write_llama_gguf(tmp_path / "bad.gguf", CFG, hf, **kw)
    with pytest.raises(ValueError, match=match):
        load_model(str(tmp_path / "bad.gguf"))


def test_wrong_architecture_refused(tmp_path):
    _refused(tmp_path, "general.architecture: expected 'llama', got 'qwen2'", arch="qwen2")


def test_missing_tensor_refused(tmp_path):
    _refused(tmp_path, r"missing tensors \['blk.1.ffn_up.weight'\]", drop=("blk.1.ffn_up.weight",))


def test_wrong_shape_refused(tmp_path):
    _refused(tmp_path, r"tensor blk.0.attn_v.weight: expected shape \(32, 64\), found \(64, 64\)",
             replace={"blk.0.attn_v.weight": np.zeros((64, 64), np.float32)})


def test_unsupported_type_refused_by_name(tmp_path):
    _refused(tmp_path, r"tensor blk.0.attn_k.weight: GGUF type Q5_0 is not supported \(supported: F32, F16, BF16, "
                       r"Q8_0, Q4_0, Q4_1\)", types={"blk.0.attn_k.weight": "Q5_0"})


def test_unsupported_metadata_refused(tmp_path):
    _refused(tmp_path, "llama.expert_count = 4", meta={"llama.expert_count": 4})
    _refused(tmp_path, "llama.rope.scaling.type = 'linear'", meta={"llama.rope.scaling.type": "linear"})
    _refused(tmp_path, "llama.vocab_size says 100 tokens, token_embd.weight has 128 rows",
             meta={"llama.vocab_size": 100})


def test_load_model_gguf_arguments(tmp_path):
    _, hf = random_hf(CFG, tmp_path)
    path = str(tmp_path / "a.gguf")
    write_llama_gguf(path, CFG, hf)
    with pytest.raises(ValueError, match="mtp=True but a GGUF file holds no MTP layers"):
        load_model(path, mtp=True)
    with pytest.raises(ValueError, match="num_draft_steps"):
        load_model(path, num_draft_steps=2)
    aux = load_model(path, aux_layers=(0, 1, 2))
    assert aux.feature_size == 3 * CFG.hidden_size
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(str(fake))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_convert_to_hf_directory(tmp_path, dtype, capsys):
    """convert writes config.json + model.safetensors + generation_config.json; the directory loads to the GGUF's
    Decoder bit for bit (f32: the same logits; bf16: the same bf16 tensors)."""
    from jaxspec import convert

    _, hf = random_hf(CFG, tmp_path)
    src = tmp_path / "c.gguf"
    write_llama_gguf(src, CFG, hf, qtype="Q4_0", types={"token_embd.weight": "Q8_0"})
    out = tmp_path / "out"
    assert convert.main([str(src), str(out), "--dtype", dtype]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["max_position_embeddings"], cfg["bos_token_id"], cfg["eos_token_id"], cfg["torch_dtype"]) == (
        256, 1, 2, dtype)
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}
    pd = getattr(jnp, dtype)
    a, b = load_model(str(src), param_dtype=pd), load_model(str(out), param_dtype=pd)
    assert a.cfg == b.cfg
    flat_b = nnx.to_flat_state(nnx.state(b, nnx.Param))
    for (ka, va), (kb, vb) in zip(nnx.to_flat_state(nnx.state(a, nnx.Param)), flat_b):
        assert ka == kb and va.get_value().dtype == vb.get_value().dtype == pd
        np.testing.assert_array_equal(np.asarray(va.get_value()), np.asarray(vb.get_value()), err_msg=str(ka))
    assert convert.main([str(tmp_path / "nope.gguf"), str(tmp_path / "o2")]) == 2
