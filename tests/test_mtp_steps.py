"""An MTP head with fewer weight layers than draft steps (``MTPModel(num_mtp_layers=1, num_draft_steps=S)``,
SGLang's behaviour for one-``nextn``-layer checkpoints): step ``s`` runs layer ``min(s, L-1)``'s weights with
its own KV layer. It equals an explicit S-layer head holding copies of those weights; it survives a
checkpoint round trip; the engine decodes losslessly with it. CPU, f32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel, load_model, load_pair, make_req_to_token, save_model
from jaxspec.protocols import AttentionMetadata, MTPHead, page_table_from_req_to_token
from jaxspec.pipeline import causal_qmask

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, num_nextn_predict_layers=1)


def _copy_layers(one: MTPModel, steps: int) -> MTPModel:
    """An explicit ``steps``-layer head whose target and every MTP layer are copies of ``one``'s weights."""
    full = MTPModel(one.cfg, rngs=nnx.Rngs(9), kv_dtype=one.kv_dtype, num_mtp_layers=steps)
    src = dict(nnx.to_flat_state(nnx.state(one, nnx.Param)))
    for key, var in nnx.to_flat_state(nnx.state(full, nnx.Param)):
        k = tuple(key)
        if k[0] == "mtp_layers":
            k = (k[0], one.mtp_layer_of_step(int(k[1]))) + k[2:]
        var.set_value(src[k].get_value())
    return full


def _chain_steps(head, steps, r2t, page_size):
    """Run draft steps 0..steps-1 chained over a 5-token window (writing the paged draft cache)."""
    b, q = 2, 5
    cache = head.make_draft_cache(r2t, int(r2t.max()) + 1 + page_size)
    meta = AttentionMetadata(
        positions=jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q)), qmask=causal_qmask(b, q),
        prefix_lens=jnp.zeros((b,), jnp.int32), page_table=page_table_from_req_to_token(cache.req_to_token, page_size),
        write_locs=cache.req_to_token[:, :q], page_size=page_size)
    tok = jax.random.randint(jax.random.key(0), (b, q), 0, CFG.vocab_size, jnp.int32)
    _, h, _ = head.forward(tok, meta, None)
    out = []
    for s in range(steps):
        logits, h, cache = head.mtp_forward(s, h, jnp.roll(tok, -s - 1, axis=1), meta, cache)
        out.append(logits)
    return out, cache


def test_reused_layer_equals_explicit_copies():
    one = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_draft_steps=3)
    assert one.num_mtp_layers == 1 and one.num_draft_steps == 3 and isinstance(one, MTPHead)
    assert [one.mtp_layer_of_step(s) for s in range(3)] == [0, 0, 0]
    full = _copy_layers(one, 3)
    r2t = make_req_to_token(2, 8, 4, seed=1)
    a, ca = _chain_steps(one, 3, r2t, 4)
    b, cb = _chain_steps(full, 3, r2t, 4)
    assert ca.k.shape == cb.k.shape == (3, ca.k.shape[1], 2, 8)  # one KV layer per step, not per weight layer
    for s in range(3):
        np.testing.assert_array_equal(a[s], b[s], err_msg=f"step {s}")
    np.testing.assert_array_equal(ca.k, cb.k)
    np.testing.assert_array_equal(ca.v, cb.v)
    for s in range(3):  # each step wrote its own KV layer, with different content (its inputs differ)
        assert jnp.any(ca.k[s] != 0)
    assert jnp.any(ca.k[1] != ca.k[2])


def test_logits_of_selected_rows():
    """``rows``: the logits of the chosen flattened rows only, equal to those rows of the full logits."""
    m = MTPModel(CFG, rngs=nnx.Rngs(4), kv_dtype=jnp.float32, num_draft_steps=2)
    b, q = 2, 5
    meta = AttentionMetadata(
        positions=jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q)), qmask=causal_qmask(b, q),
        prefix_lens=jnp.zeros((b,), jnp.int32), page_table=jnp.zeros((b, 0), jnp.int32))
    tok = jax.random.randint(jax.random.key(2), (b, q), 0, CFG.vocab_size, jnp.int32)
    _, h, _ = m.forward(tok, meta, None)
    full, hf, _ = m.mtp_forward(1, h, tok, meta, None)
    rows = jnp.array([4, 7], jnp.int32)
    part, hp, _ = m.mtp_forward(1, h, tok, meta, None, rows=rows)
    assert part.shape == (2, CFG.vocab_size)
    np.testing.assert_allclose(part, full.reshape(b * q, -1)[np.asarray(rows)], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(hp, hf)
    with pytest.raises(ValueError, match="rows"):
        m.mtp_forward(1, h, tok, meta, None, rows=rows[None])


def test_two_weight_layers_reuse_the_last():
    m = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_mtp_layers=2, num_draft_steps=5)
    assert [m.mtp_layer_of_step(s) for s in range(5)] == [0, 1, 1, 1, 1]
    assert m.make_draft_cache(np.zeros((1, 4), np.int32), 8).k.shape[0] == 5
    assert m.draft_kv_bytes_per_slot() == 2 * 5 * 2 * 8 * 4
    with pytest.raises(ValueError, match="step"):
        m.mtp_forward(5, jnp.zeros((1, 1, 32)), jnp.zeros((1, 1), jnp.int32), None, None)


def test_bad_num_draft_steps_and_too_many_spec_steps():
    with pytest.raises(ValueError, match="num_draft_steps"):
        MTPModel(CFG, rngs=nnx.Rngs(0), num_mtp_layers=2, num_draft_steps=1)
    with pytest.raises(ValueError, match="num_draft_steps"):
        MTPModel(CFG, rngs=nnx.Rngs(0), num_draft_steps=True)
    m = MTPModel(CFG, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_draft_steps=2)
    with pytest.raises(ValueError, match="num_draft_steps"):
        Engine(m, MTPDrafter(m), spec=SpecConfig(3, 1, 4), max_context=32, max_batch=1)


def test_checkpoint_stores_weight_layers_only(tmp_path):
    m = MTPModel(CFG, rngs=nnx.Rngs(3), kv_dtype=jnp.float32, num_draft_steps=4)
    save_model(m, str(tmp_path))
    back = load_model(str(tmp_path), kv_dtype=jnp.float32, num_draft_steps=4)
    assert back.num_mtp_layers == 1 and back.num_draft_steps == 4 and back.cfg.num_nextn_predict_layers == 1
    assert load_model(str(tmp_path), kv_dtype=jnp.float32).num_draft_steps == 1
    r2t = make_req_to_token(2, 8, 4, seed=1)
    for x, y in zip(_chain_steps(m, 4, r2t, 4)[0], _chain_steps(back, 4, r2t, 4)[0]):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="num_draft_steps"):
        load_model(str(tmp_path), mtp=False, num_draft_steps=4)


@pytest.fixture(scope="module")
def one_layer_pair():
    """The shipped pair cut to its first MTP layer (trained for step 0), run for 3 steps."""
    pair = load_pair()
    one = MTPModel(pair.cfg, rngs=nnx.Rngs(0), kv_dtype=jnp.float32, num_mtp_layers=1, num_draft_steps=3)
    src = dict(nnx.to_flat_state(nnx.state(pair, nnx.Param)))
    for key, var in nnx.to_flat_state(nnx.state(one, nnx.Param)):
        var.set_value(src[tuple(key)].get_value())
    return one


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
def test_engine_lossless_with_one_layer_head(one_layer_pair, spec):
    prompts = [np.array([5, 6, 7, 8, 9], np.int32), np.array([10, 11, 12], np.int32)]
    kw = dict(max_context=48, page_size=16, max_batch=2)
    plain = Engine(one_layer_pair, None, **kw).generate(prompts, 16)
    res = Engine(one_layer_pair, MTPDrafter(one_layer_pair), spec=spec, **kw).generate(prompts, 16)
    for a, b in zip(res.tokens, plain.tokens):
        np.testing.assert_array_equal(a, b)
    assert 1.0 <= res.mean_accept_length <= spec.num_steps + 1
