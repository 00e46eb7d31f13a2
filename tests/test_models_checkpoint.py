"""Llama-family Decoder / MTPModel: paged == dense attention, safetensors checkpoints (load, save, sharded,
refusals), the shipped tiny pair. CPU, f32, seconds."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.models import make_req_to_token
from jaxspec.models.checkpoint import load_model, read_config, save_model
from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder
from jaxspec.models.io import DEFAULT_WEIGHTS, TINY_PAIR_CONFIG, load_meta, load_pair
from jaxspec.models.mtp import MTPModel, add_mtp_layers
from jaxspec.protocols import AttentionMetadata, TargetModel, page_table_from_req_to_token
from jaxspec.pipeline import causal_qmask

CFG = DecoderConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_nextn_predict_layers=2)
QWEN = DecoderConfig(**{**CFG.__dict__, "model_type": "qwen2", "attention_bias": True, "tie_word_embeddings": True,
                        "num_nextn_predict_layers": 0})


def _causal_meta(b, t, page_size=1, page_table=None, prefix_lens=None, write_locs=None, positions=None):
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t)) if positions is None else positions
    return AttentionMetadata(
        positions=pos, qmask=causal_qmask(b, t),
        prefix_lens=jnp.zeros((b,), jnp.int32) if prefix_lens is None else prefix_lens,
        page_table=jnp.zeros((b, 0), jnp.int32) if page_table is None else page_table,
        write_locs=write_locs, page_size=page_size)


@nnx.jit
def _fwd(model, tokens, meta, cache):
    return model.forward(tokens, meta, cache)


def _randomize_biases(model, seed=0):
    """Biases start at zero; make them non-zero so a dropped bias cannot pass."""
    for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if k[-1] == "bias":
            v.set_value(jax.random.normal(jax.random.key(hash(k) % 1000 + seed), v.get_value().shape) * 0.5)


def test_protocol_and_sizes():
    m = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.bfloat16)
    assert isinstance(m, TargetModel) and m.feature_size == 64 and m.num_mtp_layers == 2
    assert m.kv_bytes_per_slot() == 2 * 2 * 2 * 16 * 2
    cache = m.make_draft_cache(np.zeros((2, 8), np.int32), 32)
    assert cache.k.shape == (2, 32, 2, 16) and cache.k.dtype == jnp.bfloat16
    aux = Decoder(CFG, rngs=nnx.Rngs(0), aux_layers=(0, 1, 2))
    assert aux.feature_size == 3 * 64
    _, h, _ = _fwd(aux, jnp.ones((1, 3), jnp.int32), _causal_meta(1, 3), None)
    assert h.shape == (1, 3, 192)
    with pytest.raises(ValueError, match="aux_layers"):
        Decoder(CFG, rngs=nnx.Rngs(0), aux_layers=(3,))


@pytest.mark.parametrize("page_size", [1, 4])
def test_paged_extend_matches_dense(page_size):
    """Prefill into the paged pool (page table from req_to_token), extend with the prefix read back: logits
    equal the dense causal forward. f32: 1e-4 covers reassociation across the two softmax layouts."""
    model = Decoder(QWEN, rngs=nnx.Rngs(1), kv_dtype=jnp.float32)
    _randomize_biases(model)
    b, t, w = 3, 12, 16
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, QWEN.vocab_size, jnp.int32)
    ref, _, _ = _fwd(model, tokens, _causal_meta(b, t), None)
    r2t = make_req_to_token(b, w, page_size, seed=3)
    cache = model.make_cache(r2t, int(r2t.max()) + 1 + page_size)
    table = page_table_from_req_to_token(cache.req_to_token, page_size)
    plen = jnp.array([5, 3, 8], jnp.int32)
    j = jnp.arange(t, dtype=jnp.int32)[None]
    locs = jnp.where(j < plen[:, None], cache.req_to_token[:, :t], 0)
    _, _, cache = _fwd(model, tokens, _causal_meta(b, t, page_size, table, write_locs=locs), cache)
    q = t - 3
    ext_pos = plen[:, None] + jnp.arange(q, dtype=jnp.int32)[None]
    ext_tok = jnp.take_along_axis(tokens, jnp.minimum(ext_pos, t - 1), axis=1)
    ext_locs = jnp.take_along_axis(cache.req_to_token, ext_pos, axis=1)
    logits, _, _ = _fwd(model, ext_tok, _causal_meta(b, q, page_size, table, plen, ext_locs, ext_pos), cache)
    for r in range(b):
        n = t - int(plen[r])
        np.testing.assert_allclose(logits[r, :n], ref[r, int(plen[r]):], rtol=1e-4, atol=1e-4)


def test_bf16_weights_and_kv_close_to_f32():
    """bf16 weights + bf16 KV vs the same weights in f32: bf16 rounding (2^-8 relative) of weights and
    activations at the matmul inputs, f32 accumulation -> logits within 5% of their scale, argmax mostly equal."""
    m32 = Decoder(CFG, rngs=nnx.Rngs(2), kv_dtype=jnp.float32)
    m16 = Decoder(CFG, rngs=nnx.Rngs(2), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    assert m16.embed_tokens[...].dtype == jnp.bfloat16
    tok = jax.random.randint(jax.random.key(0), (2, 8), 0, CFG.vocab_size, jnp.int32)
    a, _, _ = _fwd(m32, tok, _causal_meta(2, 8), None)
    b, _, _ = _fwd(m16, tok, _causal_meta(2, 8), None)
    assert b.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(a - b))) < 0.05 * float(jnp.max(jnp.abs(a)))


def test_mtp_writes_its_own_layer():
    m = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32)
    r2t = make_req_to_token(1, 8, 1)
    cache = m.make_draft_cache(r2t, 16)
    locs = cache.req_to_token[:, :3]
    meta = _causal_meta(1, 3, 1, cache.req_to_token, write_locs=locs)
    _, h, _ = _fwd(m, jnp.array([[1, 2, 3]], jnp.int32), meta, None)
    logits, h2, cache = nnx.jit(lambda m, h, t, meta, c: m.mtp_forward(1, h, t, meta, c))(
        m, h, jnp.array([[2, 3, 4]], jnp.int32), meta, cache)
    assert logits.shape == (1, 3, 128) and h2.shape == (1, 3, 64)
    assert float(jnp.abs(cache.k[1][np.asarray(locs[0])]).min()) > 0 and not jnp.any(cache.k[0])
    with pytest.raises(ValueError, match="step"):
        m.mtp_forward(2, h, jnp.array([[2, 3, 4]], jnp.int32), meta, None)


@pytest.mark.parametrize("cfg", [CFG, QWEN], ids=["llama_mtp", "qwen2_tied_bias"])
def test_save_load_roundtrip(tmp_path, cfg):
    model = (MTPModel if cfg.num_nextn_predict_layers else Decoder)(cfg, rngs=nnx.Rngs(5), kv_dtype=jnp.float32)
    _randomize_biases(model)
    save_model(model, str(tmp_path))
    names = json.loads((tmp_path / "config.json").read_text())
    assert names["model_type"] == cfg.model_type
    other = load_model(str(tmp_path), kv_dtype=jnp.float32)
    assert type(other) is type(model) and other.cfg == cfg
    tok = jnp.array([[1, 2, 3, 4]], jnp.int32)
    meta = _causal_meta(1, 4)
    np.testing.assert_array_equal(_fwd(model, tok, meta, None)[0], _fwd(other, tok, meta, None)[0])


def test_fused_projections_stack_hf_tensors(tmp_path):
    """qkv_proj = [q_proj | k_proj | v_proj] and gate_up_proj = [gate_proj | up_proj] along the output axis."""
    from safetensors.numpy import load_file

    model = Decoder(QWEN, rngs=nnx.Rngs(2), kv_dtype=jnp.float32)
    _randomize_biases(model)
    save_model(model, str(tmp_path))
    t = load_file(tmp_path / "model.safetensors")
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in t)
    attn, mlp = model.layers[1].self_attn, model.layers[1].mlp
    e, hq, hkv, f = QWEN.head_dim, QWEN.num_attention_heads, QWEN.num_key_value_heads, QWEN.intermediate_size
    qkv, bias = np.asarray(attn.qkv_proj.kernel[...]), np.asarray(attn.qkv_proj.bias[...])
    for name, lo, hi in (("q", 0, hq * e), ("k", hq * e, (hq + hkv) * e), ("v", (hq + hkv) * e, (hq + 2 * hkv) * e)):
        np.testing.assert_array_equal(t[f"model.layers.1.self_attn.{name}_proj.weight"], qkv[:, lo:hi].T)
        np.testing.assert_array_equal(t[f"model.layers.1.self_attn.{name}_proj.bias"], bias[lo:hi])
    gu = np.asarray(mlp.gate_up_proj.kernel[...])
    np.testing.assert_array_equal(t["model.layers.1.mlp.gate_proj.weight"], gu[:, :f].T)
    np.testing.assert_array_equal(t["model.layers.1.mlp.up_proj.weight"], gu[:, f:].T)


def _rewrite(path, fn):
    from safetensors.numpy import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    tensors = load_file(f)
    fn(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_wrong_shape_refused(tmp_path):
    """A wrong-shaped weight is refused, naming the tensor and both shapes."""
    save_model(Decoder(CFG, rngs=nnx.Rngs(0)), str(tmp_path))
    _rewrite(tmp_path, lambda t: t.__setitem__("model.embed_tokens.weight", np.zeros((128, 1), np.float32)))
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weight: expected shape \(128, 64\), found \(128, 1\)"):
        load_model(str(tmp_path))


def test_missing_tensor_refused(tmp_path):
    save_model(Decoder(CFG, rngs=nnx.Rngs(0)), str(tmp_path))
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensors \['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        load_model(str(tmp_path))


def test_sharded_checkpoint(tmp_path):
    from safetensors.numpy import load_file, save_file

    model = Decoder(CFG, rngs=nnx.Rngs(3), kv_dtype=jnp.float32)
    save_model(model, str(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    os.remove(tmp_path / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fn, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / fn, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: fn for fn, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    other = load_model(str(tmp_path), kv_dtype=jnp.float32)
    tok = jnp.array([[5, 6, 7]], jnp.int32)
    meta = _causal_meta(1, 3)
    np.testing.assert_array_equal(_fwd(model, tok, meta, None)[0], _fwd(other, tok, meta, None)[0])


@pytest.mark.parametrize("change, match", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
])
def test_unsupported_config_refused(tmp_path, change, match):
    cfg = {**CFG.to_hf(), **change}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        read_config(str(tmp_path))


def test_llama3_rope_scaling_and_sliding_window():
    hf = {**CFG.to_hf(), "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
          "sliding_window": 16, "model_type": "mistral"}
    cfg = DecoderConfig.from_hf(hf)
    assert dict(cfg.rope_scaling)["factor"] == 8.0 and cfg.sliding_window == 16
    m = Decoder(cfg, rngs=nnx.Rngs(0))
    m.make_cache(np.zeros((1, 16), np.int32), 32)
    with pytest.raises(ValueError, match="sliding_window"):
        m.make_cache(np.zeros((1, 17), np.int32), 32)


def test_shipped_pair():
    """The shipped checkpoint is an ``MTPModel`` of ``TINY_PAIR_CONFIG`` (3 MTP layers, f32), small, with its
    training record; its target and MTP layers predict the corpus (trained weights, not random ones)."""
    from jaxspec.corpus import make_stream
    from jaxspec.models import MockVocab

    model = load_pair(DEFAULT_WEIGHTS)
    assert os.path.getsize(os.path.join(DEFAULT_WEIGHTS, "model.safetensors")) < 20 * 2**20
    assert isinstance(model, MTPModel) and model.cfg == TINY_PAIR_CONFIG and model.num_mtp_layers == 3
    assert model.param_dtype == jnp.float32 and model.kv_dtype == jnp.float32
    meta = load_meta()
    assert meta["steps"] == 3000 and min(meta["accuracy"]) > 0.85
    data = MockVocab(vocab_size=model.vocab_size).encode(make_stream(num_lines=40, seed=5))[:66]
    logits, _, _ = _fwd(model, jnp.asarray(data[None, :64]), _causal_meta(1, 64), None)
    assert float(np.mean(np.argmax(logits[0], -1) == data[1:65])) > 0.8


def test_add_mtp_layers_keeps_target():
    target = Decoder(CFG, rngs=nnx.Rngs(7), kv_dtype=jnp.float32)
    model = add_mtp_layers(target, 3, rngs=nnx.Rngs(8))
    assert model.num_mtp_layers == 3
    tok = jnp.array([[1, 2, 3]], jnp.int32)
    meta = _causal_meta(1, 3)
    np.testing.assert_array_equal(_fwd(model, tok, meta, None)[0], _fwd(target, tok, meta, None)[0])
