"""The shipped tiny pair: a safetensors checkpoint directory of ``MTPModel`` (``jaxspec/assets/tiny_pair``).

``load_pair`` / ``save_pair`` read and write it through ``jaxspec.models.checkpoint`` (the same code that
loads a user's Hugging Face checkpoint); ``TINY_PAIR_CONFIG`` is its configuration (``jaxspec.train_tiny``
trains a model of it).
"""

import json
import os

import jax.numpy as jnp

from jaxspec.models.checkpoint import load_model, save_model
from jaxspec.models.config import DecoderConfig
from jaxspec.models.mtp import MTPModel

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tiny_pair")

# A 2-layer Llama target (D=96, 4 query / 2 KV heads of 24) with 3 DeepSeek-V3 MTP layers, vocabulary 64.
TINY_PAIR_CONFIG = DecoderConfig(
    vocab_size=64, hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, rope_theta=10000.0, num_nextn_predict_layers=3,
    model_type="llama",
)


def save_pair(model: MTPModel, path: str, *, dtype=jnp.float32, **meta) -> None:
    """Write ``model`` as checkpoint directory ``path`` (``save_model``); ``meta`` (JSON-serialisable:
    training steps, accuracies) goes into the safetensors header under ``jaxspec``."""
    save_model(model, path, dtype=dtype, metadata={"jaxspec": json.dumps(meta)})


def load_pair(path: str = DEFAULT_WEIGHTS) -> MTPModel:
    """The target + MTP pair stored in checkpoint directory ``path`` (default: the shipped tiny pair) as an
    ``MTPModel`` with float32 weights and KV: ``Engine(model, MTPDrafter(model), spec=...)``."""
    return load_model(path, mtp=True, kv_dtype=jnp.float32)


def load_meta(path: str = DEFAULT_WEIGHTS) -> dict:
    """The ``meta`` that ``save_pair`` stored (training steps, accuracies)."""
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), framework="flax") as f:
        return json.loads((f.metadata() or {}).get("jaxspec", "{}"))
