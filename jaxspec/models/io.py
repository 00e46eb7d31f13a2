"""The shipped tiny pair: a safetensors checkpoint directory of ``MTPModel`` (``jaxspec/assets/tiny_pair``).

``load_pair`` / ``save_pair`` read and write it through ``jaxspec.models.checkpoint`` (the same code that
loads a user's Hugging Face checkpoint). ``TinyPairView`` presents an ``MTPModel`` with the ``TinyPair``
interface (``cfg``, ``target``, ``draft`` over ``ForwardInputs``) that the engine still uses;
``from_tiny_pair`` converts a trained ``TinyPair`` into an ``MTPModel`` computing the same function.
"""

import json
import os

import jax.numpy as jnp
from flax import nnx

from jaxspec.models.checkpoint import load_model, save_model
from jaxspec.models.config import DecoderConfig, ModelConfig
from jaxspec.models.llama import ForwardInputs, TinyPair
from jaxspec.models.mtp import MTPModel
from jaxspec.protocols import AttentionMetadata, PagedKVCache

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tiny_pair")

# TinyPair parameter path -> MTPModel parameter path (per block; ``layers/i`` and ``mtp/s/block`` prefixes).
_BLOCK = {
    ("attn_norm", "scale"): ("input_layernorm", "weight"),
    ("attn", "wq"): ("self_attn", "q_proj", "kernel"),
    ("attn", "wk"): ("self_attn", "k_proj", "kernel"),
    ("attn", "wv"): ("self_attn", "v_proj", "kernel"),
    ("attn", "wo"): ("self_attn", "o_proj", "kernel"),
    ("mlp_norm", "scale"): ("post_attention_layernorm", "weight"),
    ("mlp", "w_gate"): ("mlp", "gate_proj", "kernel"),
    ("mlp", "w_up"): ("mlp", "up_proj", "kernel"),
    ("mlp", "w_down"): ("mlp", "down_proj", "kernel"),
}


def _tiny_to_model_path(path: tuple) -> tuple:
    head = path[0]
    if head == "embed":
        return ("embed_tokens",)
    if head == "final_norm":
        return ("norm", "weight")
    if head == "lm_head":
        return ("lm_head", "kernel")
    if head == "layers":
        return ("layers", path[1]) + _BLOCK[tuple(path[2:])]
    if head == "mtp":
        if path[2] == "block":
            return ("mtp_layers", path[1], "block") + _BLOCK[tuple(path[3:])]
        return ("mtp_layers", path[1], path[2], "kernel" if path[2] == "eh_proj" else "weight")
    raise ValueError(f"unknown TinyPair parameter {'/'.join(map(str, path))}")


def decoder_config(cfg: ModelConfig) -> DecoderConfig:
    """The ``DecoderConfig`` of a ``TinyPair``'s ``ModelConfig`` (a Llama layout with MTP layers)."""
    return DecoderConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
        num_nextn_predict_layers=cfg.num_mtp_layers, model_type="llama",
    )


def from_tiny_pair(pair: TinyPair, *, kv_dtype=jnp.float32) -> MTPModel:
    """An ``MTPModel`` holding exactly ``pair``'s weights (same function: same layout, same arithmetic)."""
    model = MTPModel(decoder_config(pair.cfg), rngs=nnx.Rngs(0), kv_dtype=kv_dtype)
    dest = {tuple(k): v for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    src = nnx.to_flat_state(nnx.state(pair, nnx.Param))
    if len(src) != len(dest):
        raise ValueError(f"TinyPair has {len(src)} parameters, MTPModel {len(dest)}")
    for k, v in src:
        d = dest[_tiny_to_model_path(tuple(k))]
        if d.get_value().shape != v.get_value().shape:
            raise ValueError(f"{'/'.join(map(str, k))}: shape {v.get_value().shape} != {d.get_value().shape}")
        d.set_value(v.get_value())
    return model


def _meta(inp: ForwardInputs, cache: PagedKVCache | None, b: int) -> AttentionMetadata:
    # TinyPair semantics: batch row b reads its prefix through req_to_token[b] (a page table of page size 1).
    if inp.prefix_lens is None or cache is None:
        table, plen = jnp.zeros((b, 0), jnp.int32), jnp.zeros((b,), jnp.int32)
    else:
        table, plen = cache.req_to_token[:b], inp.prefix_lens
    return AttentionMetadata(positions=inp.positions, qmask=inp.qmask, prefix_lens=plen, page_table=table,
                             write_locs=inp.write_locs, page_size=1)


class TinyPairView(nnx.Module):
    """The ``TinyPair`` interface (``cfg``, ``target``, ``draft`` over ``ForwardInputs``) of an ``MTPModel``."""

    def __init__(self, model: MTPModel):
        c = model.cfg
        self.model = model
        self.cfg = ModelConfig(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
            ffn_size=c.intermediate_size, num_mtp_layers=model.num_mtp_layers, rope_theta=c.rope_theta,
            norm_eps=c.rms_norm_eps,
        )

    def target(self, tokens, inp: ForwardInputs, cache: PagedKVCache | None):
        return self.model.forward(tokens, _meta(inp, cache, tokens.shape[0]), cache)

    def draft(self, step: int, h_prev, tokens, inp: ForwardInputs, cache: PagedKVCache | None):
        return self.model.mtp_forward(step, h_prev, tokens, _meta(inp, cache, tokens.shape[0]), cache)


def save_pair(model: TinyPair | MTPModel, path: str, *, dtype=jnp.float32, **meta) -> None:
    """Write ``model`` (a trained ``TinyPair`` is converted first) as checkpoint directory ``path``; ``meta``
    (JSON-serialisable) goes into the safetensors header under ``jaxspec``."""
    if isinstance(model, TinyPair):
        model = from_tiny_pair(model)
    save_model(model, path, dtype=dtype, metadata={"jaxspec": json.dumps(meta)})


def load_pair(path: str = DEFAULT_WEIGHTS) -> TinyPairView:
    """The target + MTP pair stored in checkpoint directory ``path`` (default: the shipped tiny pair), with
    float32 weights and KV, behind the ``TinyPair`` interface."""
    return TinyPairView(load_model(path, mtp=True, kv_dtype=jnp.float32))


def load_meta(path: str = DEFAULT_WEIGHTS) -> dict:
    """The ``meta`` that ``save_pair`` stored (training steps, accuracies)."""
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), framework="flax") as f:
        return json.loads((f.metadata() or {}).get("jaxspec", "{}"))
