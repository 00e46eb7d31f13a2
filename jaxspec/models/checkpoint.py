"""Hugging Face checkpoint directories (``config.json`` + ``*.safetensors``) <-> ``Decoder`` / ``MTPModel``.

Tensor names are the Hugging Face Llama/Qwen2/Mistral ones (``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight`` ``[out, in]``, ``model.norm.weight``, ``lm_head.weight``; no
``lm_head`` when ``tie_word_embeddings``); the model's fused ``qkv_proj`` / ``gate_up_proj`` (SGLang's) are
stacked from / split into ``q_proj, k_proj, v_proj`` / ``gate_proj, up_proj`` along the output axis. MTP
layer ``s`` follows DeepSeek-V3: it is stored as decoder layer ``L + s`` (``model.layers.{L+s}.enorm / hnorm /
eh_proj / self_attn.* / mlp.* / input_layernorm / post_attention_layernorm``) and ``config.json`` carries
``num_nextn_predict_layers``; its embedding, final norm and head are the target's (DeepSeek-V3's per-layer
``embed_tokens`` / ``shared_head`` copies, if present, are not read). Files are read with ``safetensors`` (``framework="flax"``: no torch, bf16 kept);
sharded checkpoints go through ``model.safetensors.index.json``. Nothing is downloaded.
"""

import dataclasses
import glob
import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder
from jaxspec.models.gguf import is_gguf, load_gguf
from jaxspec.models.mtp import MTPModel

_INDEX = "model.safetensors.index.json"


def hf_name(path: tuple, num_layers: int) -> tuple[str, bool]:
    """The checkpoint name of the NNX parameter at ``path`` and whether it is stored transposed."""
    parts = [str(p) for p in path]
    transpose = parts[-1] == "kernel"
    if transpose:
        parts[-1] = "weight"
    if parts[0] == "embed_tokens":
        return "model.embed_tokens.weight", False
    if parts[0] == "lm_head":
        return "lm_head.weight", transpose
    if parts[0] == "layers":
        return "model." + ".".join(parts), transpose
    if parts[0] == "norm":
        return "model.norm.weight", False
    if parts[0] == "mtp_layers":
        rest = parts[3:] if parts[2] == "block" else parts[2:]
        return f"model.layers.{num_layers + int(parts[1])}." + ".".join(rest), transpose
    raise ValueError(f"no checkpoint name for parameter {'/'.join(parts)}")


# SGLang's fused projections and the Hugging Face tensors they stack along the output axis, in order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _fused_sizes(fused: str, cfg: DecoderConfig) -> tuple[int, ...]:
    if fused == "qkv_proj":
        e = cfg.head_dim
        return cfg.num_attention_heads * e, cfg.num_key_value_heads * e, cfg.num_key_value_heads * e
    return cfg.intermediate_size, cfg.intermediate_size


def hf_tensors(path: tuple, cfg: DecoderConfig) -> tuple[list[tuple[str, int | None]], bool]:
    """The checkpoint tensors of the NNX parameter at ``path``: ``[(name, rows)]`` (``rows``: the tensor's share of
    a fused projection's output axis, stacked in this order; ``None`` for a 1:1 parameter) and whether they
    are stored transposed (Hugging Face ``[out, in]`` against NNX ``[in, out]``)."""
    name, transpose = hf_name(path, cfg.num_hidden_layers)
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        names = [".".join(parts[:-2] + [p, parts[-1]]) for p in FUSED[parts[-2]]]
        return list(zip(names, _fused_sizes(parts[-2], cfg))), transpose
    return [(name, None)], transpose


def read_config(path: str) -> DecoderConfig:
    """``DecoderConfig`` from ``path/config.json`` (``ValueError`` for anything unsupported)."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face checkpoint directory)")
    with open(cfg_file) as f:
        return DecoderConfig.from_hf(json.load(f))


def _tensor_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file, through the shard index when there is one."""
    index = os.path.join(path, _INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, fn) for name, fn in weight_map.items()}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files and no {_INDEX}")
    from safetensors import safe_open

    out = {}
    for fn in files:
        with safe_open(fn, framework="flax") as f:
            out.update({k: fn for k in f.keys()})
    return out


def load_weights(model: Decoder, path: str, *, strict: bool = True) -> Decoder:
    """Fill ``model``'s parameters from the safetensors of checkpoint directory ``path``; returns ``model``.

    A missing tensor or a wrong shape raises ``ValueError`` naming the tensor, the expected and the found
    shape (checked before any data is read). Tensors are cast to ``model.param_dtype``.
    """
    from safetensors import safe_open

    files = _tensor_files(path)
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    plan = []  # (var, transpose, [(name, expected checkpoint shape)])
    for key, var in flat:
        parts, transpose = hf_tensors(key, model.cfg)
        shape = tuple(var.get_value().shape)
        hf_shape = shape[::-1] if transpose else shape  # [out, ...]
        plan.append((var, transpose, [(name, hf_shape if rows is None else (rows, *hf_shape[1:]))
                                      for name, rows in parts]))
    wanted = [(name, want) for _, _, parts in plan for name, want in parts]
    missing = [name for name, _ in wanted if name not in files]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing}")
    tensors = {}  # read, not yet set: a fused projection's parts may lie in different shards
    for fn in sorted({files[name] for name, _ in wanted}):
        with safe_open(fn, framework="flax") as f:
            for name, want in wanted:
                if files[name] != fn:
                    continue
                found = tuple(f.get_slice(name).get_shape())
                if found != want:
                    raise ValueError(f"{path}: tensor {name}: expected shape {want}, found {found}")
                tensors[name] = np.asarray(f.get_tensor(name))  # bf16 arrives as an ml_dtypes array
        for var, transpose, parts in plan:  # host-side stack (fused projections), transpose and cast
            if all(name in tensors for name, _ in parts):
                arr = np.concatenate([tensors.pop(name) for name, _ in parts], axis=0)
                var.set_value(jnp.asarray((arr.T if transpose else arr).astype(model.param_dtype)))
    return model


def load_model(path: str, *, param_dtype=jnp.float32, kv_dtype=None, mtp: bool | None = None,
               aux_layers: tuple[int, ...] | None = None, num_draft_steps: int | None = None) -> Decoder:
    """Load a checkpoint directory as a ``Decoder``, or as an ``MTPModel`` when it has MTP layers; or a llama
    ``.gguf`` file as a ``Decoder`` (``jaxspec.models.gguf``: dequantized to ``param_dtype``; no MTP layers).

    ``mtp``: ``None`` -> an ``MTPModel`` iff ``config.json`` has ``num_nextn_predict_layers > 0``; ``True``
    requires them; ``False`` loads the target only. ``aux_layers`` (EAGLE-3 features) needs ``mtp`` falsy.
    ``num_draft_steps``: an ``MTPModel``'s draft steps (default: its MTP layers; more reuse the last layer).
    """
    if is_gguf(path):
        if mtp:
            raise ValueError(f"{path}: mtp=True but a GGUF file holds no MTP layers")
        if num_draft_steps is not None:
            raise ValueError("num_draft_steps: applies to an MTPModel only (a GGUF file loads as a Decoder)")
        return load_gguf(path, param_dtype=param_dtype, kv_dtype=kv_dtype, aux_layers=aux_layers)
    if os.path.isfile(path) and str(path).endswith(".gguf"):
        raise ValueError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    cfg = read_config(path)
    if mtp is None:
        mtp = cfg.num_nextn_predict_layers > 0 and aux_layers is None
    if mtp:
        if cfg.num_nextn_predict_layers < 1:
            raise ValueError(f"{path}: mtp=True but config.json has no num_nextn_predict_layers")
        if aux_layers is not None:
            raise ValueError("aux_layers: an MTPModel's hidden is the last pre-norm hidden; pass mtp=False")
        make = lambda: MTPModel(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype,  # noqa: E731
                                num_draft_steps=num_draft_steps)
    else:
        if num_draft_steps is not None:
            raise ValueError("num_draft_steps: applies to an MTPModel only (a checkpoint with MTP layers, mtp not False)")
        make = lambda: Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype,  # noqa: E731
                               aux_layers=aux_layers)
    # Shapes only (no random initialisation): every parameter is then set from the checkpoint.
    return load_weights(nnx.eval_shape(make), path)


def save_model(model: Decoder, path: str, *, dtype=None, metadata: dict | None = None) -> None:
    """Write ``model`` as ``path/config.json`` + ``path/model.safetensors`` (one file; ``dtype`` default: the
    model's). ``metadata`` (str -> str) goes into the safetensors header."""
    from safetensors.flax import save_file

    os.makedirs(path, exist_ok=True)
    # config.json says how many MTP layers the file really holds (none for a plain Decoder).
    n_mtp = model.num_mtp_layers if isinstance(model, MTPModel) else 0
    cfg = dataclasses.replace(model.cfg, num_nextn_predict_layers=n_mtp)
    tensors = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        parts, transpose = hf_tensors(key, cfg)
        arr = var.get_value()
        arr = arr.T if transpose else arr
        arr = arr if dtype is None else arr.astype(dtype)
        ends = np.cumsum([rows or arr.shape[0] for _, rows in parts])
        for (name, _), lo, hi in zip(parts, [0, *ends[:-1]], ends):
            tensors[name] = jnp.asarray(arr[lo:hi])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf(), f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt", **(metadata or {})})
