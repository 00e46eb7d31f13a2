"""Refusals of a checkpoint config that would otherwise load with a guessed value, and of one array passed as both
KV pools of the move."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.kernels import move_kv_cache
from jaxspec.models.config import DecoderConfig

HF = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=2048)


def test_a_valid_config_loads():
    cfg = DecoderConfig.from_hf(HF)
    assert cfg.rms_norm_eps == 1e-5 and cfg.head_dim == 8
    assert DecoderConfig.from_hf({k: v for k, v in HF.items() if k != "rms_norm_eps"}).rms_norm_eps == 1e-6


@pytest.mark.parametrize("key,value,match", [
    ("rms_norm_eps", None, "rms_norm_eps: expected a positive number, got null"),
    ("max_position_embeddings", -1, "max_position_embeddings: expected a positive integer, got -1"),
    ("max_position_embeddings", 0, "max_position_embeddings"),
    ("max_position_embeddings", "4096", "max_position_embeddings: expected an integer"),
])
def test_config_fields_are_refused_not_guessed(key, value, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig.from_hf(dict(HF, **{key: value}))


def test_move_refuses_the_same_buffer_as_both_pools():
    k = jnp.zeros((2, 16, 4), jnp.float32)
    with pytest.raises(ValueError, match="k_buffer/v_buffer: the same array passed twice"):
        move_kv_cache(k, k, np.array([1], np.int32), np.array([2], np.int32))
    out = move_kv_cache(k, jnp.ones((2, 16, 4), jnp.float32), np.array([1], np.int32), np.array([2], np.int32))
    assert out[0].shape == out[1].shape == (2, 16, 4) and float(out[1][0, 1, 0]) == 1.0
