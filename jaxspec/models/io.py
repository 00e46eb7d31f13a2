"""The shipped pairs: safetensors checkpoint directories of ``MTPModel`` trained on ``jaxspec.corpus``.

- ``DEFAULT_WEIGHTS`` (``jaxspec/assets/tiny_pair``, ``TINY_PAIR_CONFIG``): a 2-layer target, the pair the
  tests and examples load (``load_pair()``), small enough that every compile of it is quick.
- ``DEMO_WEIGHTS`` (``jaxspec/assets/demo_pair``, ``DEMO_PAIR_CONFIG``): a 24-layer, 32-wide target with the
  same 3 MTP layers, the pair ``python -m jaxspec.demo`` runs: its target is deep enough that a speculative
  round's fixed costs (3 draft layers, the round's bookkeeping) are small next to one target forward, and
  narrow enough that a 4-row verify forward costs little more than a 1-row decode step on a CPU (where the
  per-op overhead of its ~40 small ops per layer dominates, not the arithmetic), so speculation beats plain
  decoding there.

``load_pair`` / ``save_pair`` read and write them through ``jaxspec.models.checkpoint`` (the same code
that loads a user's Hugging Face checkpoint); ``jaxspec.train_tiny --config tiny|demo`` trains either.
"""

import json
import os

import jax.numpy as jnp

from jaxspec.models.checkpoint import load_model, save_model
from jaxspec.models.config import DecoderConfig
from jaxspec.models.mtp import MTPModel

_ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
DEFAULT_WEIGHTS = os.path.join(_ASSETS, "tiny_pair")
DEMO_WEIGHTS = os.path.join(_ASSETS, "demo_pair")

# A 2-layer Llama target (D=96, 4 query / 2 KV heads of 24) with 3 DeepSeek-V3 MTP layers, vocabulary 64.
TINY_PAIR_CONFIG = DecoderConfig(
    vocab_size=64, hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, rope_theta=10000.0, num_nextn_predict_layers=3,
    model_type="llama",
)

# A 24-layer Llama target (D=32, 2 query / 1 KV head of 16) with 3 MTP layers of the same shape, vocabulary 64.
DEMO_PAIR_CONFIG = DecoderConfig(
    vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=24, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, num_nextn_predict_layers=3,
    model_type="llama",
)

PAIR_CONFIGS = {"tiny": TINY_PAIR_CONFIG, "demo": DEMO_PAIR_CONFIG}


def save_pair(model: MTPModel, path: str, *, dtype=jnp.float32, **meta) -> None:
    """Write ``model`` as checkpoint directory ``path`` (``save_model``); ``meta`` (JSON-serialisable:
    training steps, accuracies) goes into the safetensors header under ``jaxspec``."""
    save_model(model, path, dtype=dtype, metadata={"jaxspec": json.dumps(meta)})


def load_pair(path: str = DEFAULT_WEIGHTS) -> MTPModel:
    """The target + MTP pair stored in checkpoint directory ``path`` (default: the shipped tiny pair; the
    demo's is ``DEMO_WEIGHTS``) as an ``MTPModel`` with float32 weights and KV:
    ``Engine(model, MTPDrafter(model), spec=...)``."""
    return load_model(path, mtp=True, kv_dtype=jnp.float32)


def load_meta(path: str = DEFAULT_WEIGHTS) -> dict:
    """The ``meta`` that ``save_pair`` stored (training steps, accuracies)."""
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), framework="flax") as f:
        return json.loads((f.metadata() or {}).get("jaxspec", "{}"))
