"""EAGLE-3: the aux-layer convention, SpecForge's draft vocabulary, the checkpoint layout (round trip, a
hand-written checkpoint against a NumPy transcription of SGLang's forward), SpecForge's TTT attention, and
``EAGLE3Drafter`` in the engine (lossless with a random head, chain and tree)."""

import collections
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import Decoder, DecoderConfig
from jaxspec.models.eagle3 import (EAGLE3Model, Eagle3Config, aux_layers_from_ids, default_aux_layer_ids,
                                   draft_vocab_from_counts, eagle3_tensors, ids_from_aux_layers, load_eagle3,
                                   save_eagle3)
from jaxspec.models.eagle3_drafter import EAGLE3Drafter
from jaxspec.protocols import AttentionMetadata
from jaxspec.pipeline import causal_qmask

V, H, F, HQ, HKV, E, VD = 80, 32, 64, 4, 2, 8, 40
TARGET = DecoderConfig(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=3, num_attention_heads=HQ,
                       num_key_value_heads=HKV, head_dim=E, rms_norm_eps=1e-5, rope_theta=10000.0)
IDS = (0, 1, 2)

# f32 everywhere; the widest reduction is a 2H = 64-term dot product of O(1) values, so jnp (HIGHEST) and
# NumPy (float64 below, rounded once) differ by a few f32 ulps per op over ~12 chained ops: 1e-4 relative /
# absolute on O(1-10) logits is ~100x that and far below any real disagreement (a wrong norm, rope or
# residual changes logits by O(1)).
TOL = dict(rtol=1e-4, atol=1e-4)


def test_aux_layer_ids_follow_sglang():
    assert default_aux_layer_ids(30) == (1, 14, 26)  # SmolLM2-135M: captures the inputs of layers 2, 15, 27
    assert aux_layers_from_ids((1, 14, 26), 30) == (2, 15, 27)
    assert default_aux_layer_ids(32) == (1, 15, 28)  # Llama-3.1-8B's shipped EAGLE-3 heads use [1, 15, 28]
    assert ids_from_aux_layers((2, 15, 27)) == (1, 14, 26)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        aux_layers_from_ids((1, 1, 2), 30)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        aux_layers_from_ids((1, 14, 30), 30)
    with pytest.raises(ValueError, match="explicitly"):
        default_aux_layer_ids(4)


def _specforge_mapping(counts, vd):
    """SpecForge's process_token_dict_to_mappings transcribed with a Counter (token dict in id order)."""
    token_dict = collections.Counter({i: int(c) for i, c in enumerate(counts) if c > 0})
    if len(token_dict) < vd:
        for token in sorted(set(range(vd)) - set(token_dict)):
            token_dict[token] = 0
            if len(token_dict) >= vd:
                break
    used = sorted(k for k, _ in token_dict.most_common(vd))
    return np.asarray([u - i for i, u in enumerate(used)]), np.asarray([i in used for i in range(len(counts))])


@pytest.mark.parametrize("seen", [200, 30])
def test_draft_vocab_is_specforges_most_frequent_tokens(seen):
    rng = np.random.default_rng(seen)
    counts = np.zeros(300, np.int64)
    counts[rng.choice(300, seen, replace=False)] = rng.permutation(np.arange(1, seen + 1))  # distinct counts
    d2t, t2d = draft_vocab_from_counts(counts, 50)
    want_d2t, want_t2d = _specforge_mapping(counts, 50)
    np.testing.assert_array_equal(d2t, want_d2t)
    np.testing.assert_array_equal(t2d, want_t2d)
    assert d2t.dtype == np.int64 and t2d.dtype == bool and t2d.sum() == 50
    ids = np.arange(50) + d2t
    assert (np.diff(ids) > 0).all() and t2d[ids].all()
    # ties go to the lower id
    d2t, _ = draft_vocab_from_counts(np.asarray([1, 5, 5, 5, 0]), 2)
    np.testing.assert_array_equal(np.arange(2) + d2t, [1, 2])
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab_from_counts(counts, 301)


def _model(seed=0, dtype=jnp.float32):
    cfg = Eagle3Config.for_target(TARGET, draft_vocab_size=VD, aux_layer_ids=IDS)
    d2t = np.sort(np.random.default_rng(seed).choice(V, VD, replace=False)) - np.arange(VD)
    return EAGLE3Model(cfg, rngs=nnx.Rngs(seed), param_dtype=dtype, kv_dtype=jnp.float32, d2t=d2t)


NAMES = {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
         "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
         "midlayer.self_attn.o_proj.weight", "midlayer.post_attention_layernorm.weight", "midlayer.mlp.gate_proj.weight",
         "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}


def test_save_load_round_trip_in_sglangs_layout(tmp_path):
    from safetensors import safe_open

    model = _model(1)
    save_eagle3(model, str(tmp_path / "f32"), dtype=jnp.float32)
    back = load_eagle3(str(tmp_path / "f32"))
    a, b = eagle3_tensors(model), eagle3_tensors(back)
    assert set(a) == NAMES and set(b) == NAMES
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    save_eagle3(model, str(tmp_path / "bf16"))
    with open(tmp_path / "bf16" / "config.json") as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == VD and cfg["vocab_size"] == V and cfg["tie_word_embeddings"] is False
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(IDS)
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="numpy") as f:
        shapes = {k: (f.get_tensor(k).dtype.name, f.get_tensor(k).shape) for k in f.keys()}
    assert set(shapes) == NAMES  # no embedding: the target's is shared
    assert shapes["fc.weight"] == ("bfloat16", (H, 3 * H))
    assert shapes["midlayer.self_attn.q_proj.weight"] == ("bfloat16", (HQ * E, 2 * H))
    assert shapes["midlayer.self_attn.k_proj.weight"] == ("bfloat16", (HKV * E, 2 * H))
    assert shapes["lm_head.weight"] == ("bfloat16", (VD, H))
    assert shapes["d2t"] == ("int64", (VD,)) and shapes["t2d"] == ("bool", (V,))
    bf = load_eagle3(str(tmp_path / "bf16"), param_dtype=jnp.bfloat16)
    for k, v in eagle3_tensors(bf).items():
        np.testing.assert_array_equal(np.asarray(v, np.float32), np.asarray(a[k]).astype(jnp.bfloat16).astype(np.float32))


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # neox style (rotate half), as SGLang's get_rope for Llama
    half = x.shape[-1] // 2
    inv = theta ** (-np.arange(half) / half)
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def sglang_eagle3_forward(w, embeds, hidden, eps, theta):
    """NumPy transcription of SGLang's python/sglang/srt/models/llama_eagle3.py (commit 03d5a77) for one sequence,
    causal prefill: ``LlamaModel.forward`` (``fc`` when the hidden width differs from the embedding's), the
    midlayer's ``LlamaDecoderLayer.forward`` (``residual = hidden``; ``embeds = input_layernorm(embeds)``;
    ``hidden = hidden_norm(hidden)``; ``cat([embeds, hidden])``; ``self_attn``; fused
    ``post_attention_layernorm(hidden, residual)`` = add then norm; ``mlp``), the final fused
    ``norm(hidden, residual)`` returning the normed states for the logits and the pre-norm sum as aux, and
    ``LlamaForCausalLMEagle3``'s draft-vocab ``lm_head`` with ``hot_token_id = d2t + arange``.
    Returns ``(logits [T, Vd], aux [T, H], hot_token_id)``."""
    if hidden.shape[-1] != embeds.shape[-1]:
        hidden = hidden @ w["fc.weight"].T
    residual = hidden
    x = np.concatenate([_rms(embeds, w["midlayer.input_layernorm.weight"], eps),
                        _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    t = x.shape[0]
    pos = np.arange(t)
    q = _rope((x @ w["midlayer.self_attn.q_proj.weight"].T).reshape(t, HQ, E), pos, theta)
    k = _rope((x @ w["midlayer.self_attn.k_proj.weight"].T).reshape(t, HKV, E), pos, theta)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).reshape(t, HKV, E)
    k, v = np.repeat(k, HQ // HKV, 1), np.repeat(v, HQ // HKV, 1)
    s = np.einsum("qhe,khe->hqk", q, k) / np.sqrt(E)
    s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    attn = np.einsum("hqk,khe->qhe", p, v).reshape(t, HQ * E) @ w["midlayer.self_attn.o_proj.weight"].T
    residual = attn + residual
    h = _rms(residual, w["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = h @ w["midlayer.mlp.gate_proj.weight"].T, h @ w["midlayer.mlp.up_proj.weight"].T
    mlp = (gate / (1 + np.exp(-gate)) * up) @ w["midlayer.mlp.down_proj.weight"].T
    aux = mlp + residual
    logits = _rms(aux, w["norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, aux, w["d2t"] + np.arange(w["d2t"].shape[0])


def _dense_meta(t):
    return AttentionMetadata(positions=jnp.arange(t, dtype=jnp.int32)[None], qmask=causal_qmask(1, t),
                             prefix_lens=jnp.zeros((1,), jnp.int32), page_table=jnp.zeros((1, 0), jnp.int32))


def test_hand_written_checkpoint_gives_sglangs_draft_logits(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    shapes = {"fc.weight": (H, 3 * H), "midlayer.self_attn.q_proj.weight": (HQ * E, 2 * H),
              "midlayer.self_attn.k_proj.weight": (HKV * E, 2 * H), "midlayer.self_attn.v_proj.weight": (HKV * E, 2 * H),
              "midlayer.self_attn.o_proj.weight": (H, HQ * E), "midlayer.mlp.gate_proj.weight": (F, H),
              "midlayer.mlp.up_proj.weight": (F, H), "midlayer.mlp.down_proj.weight": (H, F), "lm_head.weight": (VD, H)}
    w = {k: (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for k, s in shapes.items()}
    for n in ("midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
              "midlayer.post_attention_layernorm.weight", "norm.weight"):
        w[n] = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    used = np.sort(rng.choice(V, VD, replace=False))
    w["d2t"] = (used - np.arange(VD)).astype(np.int64)
    w["t2d"] = np.isin(np.arange(V), used)
    path = tmp_path / "head"
    os.makedirs(path)
    save_file({"model." + k if k == "fc.weight" else k: v for k, v in w.items()}, str(path / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
           "intermediate_size": F, "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": E,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": V,
           "draft_vocab_size": VD, "tie_word_embeddings": False,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}}
    (path / "config.json").write_text(json.dumps(cfg))
    model = load_eagle3(str(path))
    t = 9
    embed = rng.standard_normal((V, H)).astype(np.float32)
    ids = rng.integers(0, V, t)
    aux = rng.standard_normal((t, 3 * H)).astype(np.float32) * 2
    want_logits, want_aux, hot = sglang_eagle3_forward({k: v.astype(np.float64) if v.dtype == np.float32 else v
                                                        for k, v in w.items()}, embed[ids].astype(np.float64),
                                                       aux.astype(np.float64), 1e-5, 500000.0)
    out, _ = model.forward(jnp.asarray(embed[ids])[None], model.project(jnp.asarray(aux)[None]), _dense_meta(t), None)
    np.testing.assert_allclose(np.asarray(model.logits(out))[0], want_logits, **TOL)
    np.testing.assert_allclose(np.asarray(out)[0], want_aux, **TOL)
    np.testing.assert_array_equal(np.asarray(model.token_ids[...]), hot)
    # a later draft step: the draft's own pre-norm hidden (H wide: no fc)
    want2, _, _ = sglang_eagle3_forward({k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in w.items()},
                                        embed[ids].astype(np.float64), want_aux, 1e-5, 500000.0)
    out2, _ = model.forward(jnp.asarray(embed[ids])[None], out, _dense_meta(t), None)
    np.testing.assert_allclose(np.asarray(model.logits(out2))[0], want2, **TOL)


def test_load_refuses_bad_checkpoints(tmp_path):
    from safetensors.numpy import load_file, save_file

    save_eagle3(_model(2), str(tmp_path / "ok"), dtype=jnp.float32)
    tensors = load_file(str(tmp_path / "ok" / "model.safetensors"))
    cfg = (tmp_path / "ok" / "config.json").read_text()

    def write(name, t, c=cfg):
        os.makedirs(tmp_path / name)
        save_file(t, str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text(c)
        return str(tmp_path / name)

    with pytest.raises(ValueError, match="missing tensor midlayer.hidden_norm.weight"):
        load_eagle3(write("missing", {k: v for k, v in tensors.items() if k != "midlayer.hidden_norm.weight"}))
    with pytest.raises(ValueError, match=r"fc.weight: expected shape \(32, 96\)"):
        load_eagle3(write("shape", dict(tensors, **{"fc.weight": tensors["fc.weight"][:, :64]})))
    with pytest.raises(ValueError, match="t2d disagrees"):
        load_eagle3(write("t2d", dict(tensors, t2d=~tensors["t2d"])))
    with pytest.raises(ValueError, match="architectures"):
        load_eagle3(write("arch", tensors, cfg.replace("LlamaForCausalLMEagle3", "LlamaForCausalLM")))


def test_load_keeps_the_most_frequent_draft_tokens(tmp_path):
    """``load_eagle3(draft_vocab=N)``: the LM head's rows of the N most frequent draft tokens (ties: lower draft id),
    their target ids, their logits unchanged; the rest of the head as stored."""
    rng = np.random.default_rng()
    model = _model(int(rng.integers(1 << 16)))
    counts = rng.integers(0, 5, VD)  # small counts: ties to break
    save_eagle3(model, str(tmp_path / "h"), dtype=jnp.float32, token_counts=counts)
    n = int(rng.integers(1, VD))
    small = load_eagle3(str(tmp_path / "h"), draft_vocab=n)
    keep = sorted(sorted(range(VD), key=lambda i: (-counts[i], i))[:n])
    assert small.cfg.draft_vocab_size == n
    full_ids = np.asarray(model.token_ids[...])
    np.testing.assert_array_equal(np.asarray(small.token_ids[...]), full_ids[keep])
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(small.t2d[...])), np.sort(full_ids[keep]))
    a, b = eagle3_tensors(model), eagle3_tensors(small)
    np.testing.assert_array_equal(b["lm_head.weight"], np.asarray(a["lm_head.weight"])[keep])
    for k in NAMES - {"lm_head.weight", "d2t", "t2d"}:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    same = load_eagle3(str(tmp_path / "h"), draft_vocab=VD)  # all of them: the head as stored
    for k, v in eagle3_tensors(same).items():
        np.testing.assert_array_equal(v, a[k], err_msg=k)


def test_load_draft_vocab_refusals(tmp_path):
    save_eagle3(_model(3), str(tmp_path / "nocounts"), dtype=jnp.float32)
    with pytest.raises(ValueError, match="draft_vocab=8: .* no draft_token_counts.json"):
        load_eagle3(str(tmp_path / "nocounts"), draft_vocab=8)
    save_eagle3(_model(3), str(tmp_path / "h"), dtype=jnp.float32, token_counts=np.ones(VD, np.int64))
    for bad in (0, VD + 1, 2.0, True):
        with pytest.raises(ValueError, match="draft_vocab: expected None or an int"):
            load_eagle3(str(tmp_path / "h"), draft_vocab=bad)
    save_eagle3(_model(4), str(tmp_path / "h2"), dtype=jnp.float32, token_counts=np.ones(VD, np.int64))
    save_eagle3(_model(5), str(tmp_path / "h2"), dtype=jnp.float32)  # a new head without counts: no stale file
    assert not (tmp_path / "h2" / "draft_token_counts.json").exists()
    with pytest.raises(ValueError, match="token_counts: expected"):
        save_eagle3(_model(3), str(tmp_path / "bad"), token_counts=np.ones(VD - 1, np.int64))
    (tmp_path / "h" / "draft_token_counts.json").write_text(json.dumps({"counts": [1] * (VD - 1)}))
    with pytest.raises(ValueError, match="expected 'counts'"):
        load_eagle3(str(tmp_path / "h"), draft_vocab=8)


def _ttt_reference(q, ks, vs, step):
    """SpecForge's LlamaAttention with cache_hidden, one head, looped: row t attends to step-0 keys r <= t (the
    plain causal mask: SpecForge no longer shifts it per step) and to each later step's key at row t."""
    t = q.shape[0]
    out = np.zeros_like(q)
    for i in range(t):
        s = [q[i] @ ks[0][r] for r in range(t) if r <= i] + [q[i] @ kj[i] for kj in ks[1:]]
        vals = [vs[0][r] for r in range(t) if r <= i] + [vj[i] for vj in vs[1:]]
        s = np.asarray(s) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max())
        out[i] = (p / p.sum()) @ np.asarray(vals)
    return out


def test_ttt_attention_is_specforges():
    model = _model(3)
    attn = model.midlayer.self_attn
    rng = np.random.default_rng(3)
    t = 6
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    xs = [jnp.asarray(rng.standard_normal((1, t, 2 * H)), jnp.float32) for _ in range(3)]
    cache, outs = [], []
    for step, x in enumerate(xs):
        outs.append(attn.ttt(x, pos, step, cache))
    qkv = [attn.qkv(x, pos + step) for step, x in enumerate(xs)]  # step k's RoPE at position t + k
    wo = np.asarray(attn.o_proj.kernel[...])
    for step in range(3):
        heads = []
        for h in range(HQ):
            g = h // (HQ // HKV)
            q = np.asarray(qkv[step][0])[0, :, h]
            ks = [np.asarray(qkv[j][1])[0, :, g] for j in range(step + 1)]
            vs = [np.asarray(qkv[j][2])[0, :, g] for j in range(step + 1)]
            heads.append(_ttt_reference(q, ks, vs, step))
        want = np.concatenate(heads, -1) @ wo
        np.testing.assert_allclose(np.asarray(outs[step])[0], want, **TOL)
    # step 0 is the plain causal forward
    out0, _ = model.midlayer(jnp.zeros((1, t, H)), jnp.ones((1, t, H)), lambda x: attn(x, _dense_meta(t), None, 0))
    ttt0 = model.ttt_forward([jnp.zeros((1, t, H))], jnp.ones((1, t, H)), pos)[0]
    np.testing.assert_allclose(np.asarray(ttt0), np.asarray(out0), **TOL)


@pytest.fixture(scope="module")
def pair():
    target = Decoder(TARGET, rngs=nnx.Rngs(4), aux_layers=aux_layers_from_ids(IDS, 3), kv_dtype=jnp.float32)
    return target, EAGLE3Drafter(_model(5), target)


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), pytest.param(SpecConfig(3, 2, 6), marks=pytest.mark.slow)],
                         ids=["chain", "tree"])
def test_random_head_in_the_engine_is_lossless(pair, spec):
    target, drafter = pair
    prompts = [np.arange(1, 8), np.asarray([5, 9, 2])]
    kw = dict(max_context=64, page_size=8, max_batch=2)
    plain = Engine(target, None, **kw).generate(prompts, 10)
    res = Engine(target, drafter, spec=spec, **kw).generate(prompts, 10)
    for a, b in zip(res.tokens, plain.tokens):
        np.testing.assert_array_equal(a, b)


def test_drafter_refuses_a_target_without_the_heads_taps():
    plain = Decoder(TARGET, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="feature_size"):
        EAGLE3Drafter(_model(0), plain)
    other = Decoder(TARGET, rngs=nnx.Rngs(0), aux_layers=(0, 1, 2))
    with pytest.raises(ValueError, match="aux_layers"):
        EAGLE3Drafter(_model(0), other)
