"""GGUF files (llama.cpp's format) -> ``Decoder``: read with the ``gguf`` package (numpy, memory-mapped), no torch.

``load_model(path)`` dispatches here for a ``.gguf`` file. What is read:

* **Metadata** ``general.architecture`` must be ``llama`` (Llama 1/2/3, Mistral, SmolLM and the other models
  llama.cpp converts as ``llama``); ``llama.block_count``, ``embedding_length``, ``feed_forward_length``,
  ``attention.head_count``, ``attention.head_count_kv`` (default: ``head_count``),
  ``attention.layer_norm_rms_epsilon``, ``rope.freq_base`` (default 10000), ``rope.dimension_count`` /
  ``attention.key_length`` (head size; default ``embedding_length / head_count``) map to ``DecoderConfig``;
  the vocabulary size is ``token_embd.weight``'s row count (``llama.vocab_size`` and the tokenizer's token
  list must agree with it when present); the embeddings are tied when the file has no ``output.weight``.
  RoPE scaling (``llama.rope.scaling.type`` other than ``none``, or a ``rope_freqs.weight`` tensor),
  experts (``llama.expert_count > 0``) and partial rotary dimensions are refused by name.
* **Tensors** ``token_embd``, ``blk.N.attn_norm``, ``blk.N.attn_q / attn_k / attn_v / attn_output`` (and
  ``attn_q/k/v.bias`` when present), ``blk.N.ffn_norm``, ``blk.N.ffn_gate / ffn_up / ffn_down``,
  ``output_norm``, ``output`` (all ``.weight``). A missing tensor, a wrong shape, a tensor the decoder has no
  place for, or an unsupported type raises ``ValueError`` naming the tensor (and both shapes), before any
  tensor data is read.
* **Types** dequantized here, in numpy: ``F32``, ``F16``, ``BF16``, ``Q8_0`` (blocks of 32: f16 scale ``d``,
  32 int8 ``q``; ``q * d``), ``Q4_0`` (f16 ``d``, 16 bytes of nibbles: low nibbles are elements 0-15, high
  nibbles 16-31; ``(q - 8) * d``), ``Q4_1`` (f16 ``d``, f16 ``m``, 16 bytes as ``Q4_0``; ``q * d + m``).
  Every other type (the K-quants, I-quants, ``Q5_0``, ``Q5_1``, ``Q8_1``, ...) is refused by name.
  Products are formed in float32 (exact: an 11-bit f16 scale times a <= 8-bit integer), then rounded once
  to the requested ``param_dtype``. Tensors are dequantized one at a time, in row chunks, straight into
  the target dtype: a bf16 load never holds an f32 copy of more than one chunk (4M elements).
* **Layout** GGUF's shapes are ggml's ``ne`` (innermost first), so ``ne = [in, out]`` is numpy
  ``[out, in]``, the Hugging Face layout. llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k``
  (weights and biases) from Hugging Face's rotate-half RoPE layout to interleaved pairs,
  ``w.reshape(n_head, 2, head_dim // 2, ...).swapaxes(1, 2)`` (``n_head``: query heads for q, KV heads for
  k); the loader undoes it (``reshape(n_head, head_dim // 2, 2, ...).swapaxes(1, 2)``), as transformers'
  GGUF loader does.
"""

import dataclasses
import math
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec._gguf import MAGIC as _MAGIC
from jaxspec._gguf import Bounded, read_header, read_value
from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# type name -> (elements per block, bytes per block)
_BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20)}
_CHUNK_ELEMENTS = 1 << 22  # rows dequantized at once: at most ~4M elements of float32 scratch
_REQUIRED = object()  # a metadata key without a default


def is_gguf(path) -> bool:
    """Whether ``path`` is a GGUF file (a regular file starting with the ``GGUF`` magic)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == _MAGIC


# ----------------------------------------------------------------------------------------------------
# dequantization


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...], dtype=np.float32, *,
               name: str = "tensor") -> np.ndarray:
    """A GGUF tensor's raw bytes (``data``: any array over them, e.g. ``GGUFReader``'s ``tensor.data``) as a
    ``dtype`` array of numpy ``shape`` (ggml's ``ne`` reversed). ``type_name``: one of ``SUPPORTED_TYPES``
    (``ValueError`` naming ``name`` otherwise). Rows are decoded ``_CHUNK_ELEMENTS`` at a time into the
    preallocated output, so the float32 scratch stays one chunk whatever the tensor's size."""
    if type_name not in _BLOCKS:
        raise ValueError(f"tensor {name}: GGUF type {type_name} is not supported (supported: "
                         f"{', '.join(SUPPORTED_TYPES)})")
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError(f"tensor {name}: expected at least one dimension, got shape ()")
    per_block, block_bytes = _BLOCKS[type_name]
    cols = shape[-1]
    if cols % per_block:
        raise ValueError(f"tensor {name}: {type_name} rows hold whole blocks of {per_block} elements, but the "
                         f"row length is {cols}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    row_bytes = cols // per_block * block_bytes
    raw = np.asarray(data).reshape(-1).view(np.uint8)
    if raw.size != rows * row_bytes:
        raise ValueError(f"tensor {name}: {type_name} of shape {shape} needs {rows * row_bytes} bytes, "
                         f"found {raw.size}")
    raw = raw.reshape(rows, row_bytes)
    out = np.empty((rows, cols), dtype)
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    # A NaN/inf in the file stays NaN/inf (numpy would warn on its cast or on inf * 0; nothing is altered).
    with np.errstate(invalid="ignore", over="ignore"):
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            out[lo:hi] = _decode(raw[lo:hi], type_name, cols).astype(dtype, copy=False)
    return out.reshape(shape)


def _decode(raw: np.ndarray, type_name: str, cols: int) -> np.ndarray:
    """``uint8[rows, row_bytes]`` -> ``f32[rows, cols]`` (exact)."""
    rows = raw.shape[0]
    if type_name == "F32":
        return np.ascontiguousarray(raw).view("<f4")
    if type_name == "F16":
        return np.ascontiguousarray(raw).view("<f2").astype(np.float32)
    if type_name == "BF16":  # the upper 16 bits of a float32
        return (np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    _, block_bytes = _BLOCKS[type_name]
    blocks = raw.reshape(rows * (cols // 32), block_bytes)
    d = np.ascontiguousarray(blocks[:, 0:2]).view("<f2").astype(np.float32)  # [n, 1]
    if type_name == "Q8_0":
        q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
        return (q * d).reshape(rows, cols)
    packed = blocks[:, 2:] if type_name == "Q4_0" else blocks[:, 4:]  # [n, 16]
    q = np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=1)  # elements 0-15, then 16-31
    if type_name == "Q4_0":
        return ((q.astype(np.float32) - np.float32(8)) * d).reshape(rows, cols)
    m = np.ascontiguousarray(blocks[:, 2:4]).view("<f2").astype(np.float32)
    return (q.astype(np.float32) * d + m).reshape(rows, cols)


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (``[n_head * head_dim, ...]``, interleaved RoPE pairs) back to the
    Hugging Face rotate-half layout (each head's first ``head_dim / 2`` rows, then its second half)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"q/k rows: {rows} is not a multiple of 2 * {n_head} heads")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (the inverse of ``unpermute_rope_rows``)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------------------------------
# metadata


@dataclasses.dataclass(frozen=True)
class GGUFModelInfo:
    """What a llama GGUF says about its model: the ``DecoderConfig``, ``context_length``
    (``llama.context_length``, or ``None``), the special token ids (``tokenizer.ggml.*_token_id``, ``None``
    when absent) and the ``general.*`` string fields (name, license, ...)."""

    config: DecoderConfig
    context_length: int | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    general: dict


def _reader(path):
    try:
        import gguf
    except ImportError as e:  # a declared dependency; a clear message if it was left out
        raise ImportError("reading a GGUF file needs the 'gguf' package (pip install gguf)") from e
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    check_layout(path)  # gguf's reader trusts every length and offset in the file: check them first
    return gguf.GGUFReader(path, "r")


# GGUF value type ids (gguf.GGUFValueType) -> byte size of a scalar of that type (8: string, 9: array).
_MAX_DIMS = 4  # GGML_MAX_DIMS


def check_layout(path) -> None:
    """Check GGUF file ``path``'s structure against its size before anything else reads it: the magic, a
    little-endian version 2 or 3, every metadata length, every tensor's dimensions (at most 4), type (one
    ``gguf`` knows) and byte range (inside the file). ``ValueError`` naming the field or tensor; nothing is
    allocated from a length before it was checked against the bytes that remain."""
    import gguf

    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = Bounded(f, size, path)
        n_tensors, n_kv = read_header(r)
        alignment, keys = 32, set()
        for _ in range(n_kv):
            key = r.string("metadata key").decode("utf-8", "replace")
            if key in keys:
                raise ValueError(f"{path}: GGUF metadata {key} appears twice")
            keys.add(key)
            vtype = r.uint(4, f"metadata {key} type")
            if key == "general.alignment":
                if vtype != 4:
                    raise ValueError(f"{path}: GGUF metadata general.alignment: expected a uint32, got type id {vtype}")
                alignment = r.uint(4, "general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    raise ValueError(f"{path}: GGUF general.alignment = {alignment}: not a power of two")
                continue
            read_value(r, vtype, key, keep=False)
        infos, names = [], set()
        for _ in range(n_tensors):
            name = r.string("tensor name").decode("utf-8", "replace")
            if name in names:
                raise ValueError(f"{path}: tensor {name} appears twice")
            names.add(name)
            n_dims = r.uint(4, f"tensor {name} dimension count")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ValueError(f"{path}: tensor {name}: {n_dims} dimensions (GGUF allows 1 to {_MAX_DIMS})")
            dims = [r.uint(8, f"tensor {name} dimensions") for _ in range(n_dims)]
            type_id, offset = r.uint(4, f"tensor {name} type"), r.uint(8, f"tensor {name} offset")
            infos.append((name, dims, type_id, offset))
        data_start = -(-f.tell() // alignment) * alignment
    for name, dims, type_id, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ValueError(f"{path}: tensor {name}: unknown GGUF type id {type_id}") from None
        if dims[0] % block:
            raise ValueError(f"{path}: tensor {name}: {qtype.name} rows hold whole blocks of {block} elements, but "
                             f"ne0 is {dims[0]}")
        n_bytes = math.prod(dims) // block * block_bytes
        if data_start + offset + n_bytes > size:
            raise ValueError(f"{path}: tensor {name}: {qtype.name} of ne {dims} declares {n_bytes} bytes at offset "
                             f"{data_start + offset}, past the end of the file ({size} bytes)")


def _value(field):
    """A ``ReaderField``'s value: a scalar, a string or a list of them."""
    import gguf

    types = list(field.types)
    if not types:
        return None
    parts = field.parts

    def one(t, idx):
        if t == gguf.GGUFValueType.STRING:
            return bytes(parts[idx]).decode("utf-8")
        v = parts[idx][0]
        return bool(v) if t == gguf.GGUFValueType.BOOL else v.item()

    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) < 2:
            return []
        return [one(types[-1], i) for i in field.data]
    return one(types[0], field.data[0])


def _fields(reader, *, skip_arrays: bool = True) -> dict:
    import gguf

    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if skip_arrays and field.types and field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) > 64:
            out[key] = _LongArray(len(field.data))
            continue
        out[key] = _value(field)
    return out


@dataclasses.dataclass(frozen=True)
class _LongArray:
    """Stands for a long metadata array (the tokenizer's tokens, merges) that was not decoded; its length."""

    length: int


def _tensor_shapes(reader) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (numpy shape, type name)."""
    return {t.name: (tuple(int(s) for s in reversed(t.shape.tolist())), t.tensor_type.name) for t in reader.tensors}


def _info(path, reader) -> GGUFModelInfo:
    meta = _fields(reader)
    tensors = _tensor_shapes(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF general.architecture: expected 'llama', got {arch!r}")

    def num(key, default=_REQUIRED, kind=int):
        """Metadata ``key`` as a ``kind`` (an int, or for ``float`` any finite number), or ``default``."""
        v = meta.get(key)
        if v is None:
            if default is _REQUIRED:
                raise ValueError(f"{path}: GGUF metadata {key} is missing")
            return default
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (
            isinstance(v, int) if kind is int else math.isfinite(v))
        if not ok:
            raise ValueError(f"{path}: GGUF metadata {key}: expected {'an integer' if kind is int else 'a number'}, "
                             f"got {v!r}")
        return v

    def need(key):
        return num(f"llama.{key}")

    if num("llama.expert_count", 0) > 0:
        raise ValueError(f"{path}: GGUF llama.expert_count = {meta['llama.expert_count']}: mixture-of-experts "
                         "models are not supported")
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: GGUF llama.rope.scaling.type = {scaling!r}: RoPE scaling is not supported")
    if "rope_freqs.weight" in tensors:
        raise ValueError(f"{path}: tensor rope_freqs.weight (per-frequency RoPE scaling factors, Llama 3.1) is "
                         "not supported")
    hidden, heads = need("embedding_length"), need("attention.head_count")
    if heads < 1 or hidden < 1:
        raise ValueError(f"{path}: GGUF llama.embedding_length = {hidden}, llama.attention.head_count = {heads}: "
                         "expected positive sizes")
    kv_heads = num("llama.attention.head_count_kv", heads)
    rope_dim = num("llama.rope.dimension_count", None)
    head_dim = num("llama.attention.key_length", None)
    head_dim = head_dim if head_dim is not None else rope_dim if rope_dim is not None else hidden // heads
    if rope_dim is not None and rope_dim != head_dim:
        raise ValueError(f"{path}: GGUF llama.rope.dimension_count = {rope_dim} differs from the head size "
                         f"{head_dim}: partial rotary embeddings are not supported")
    value_len = num("llama.attention.value_length", None)
    if value_len is not None and value_len != head_dim:
        raise ValueError(f"{path}: GGUF llama.attention.value_length = {value_len} differs from key_length "
                         f"{head_dim}: not supported")
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: tensor token_embd.weight is missing")
    emb_shape = tensors["token_embd.weight"][0]
    if len(emb_shape) != 2 or emb_shape[1] != hidden:
        raise ValueError(f"{path}: tensor token_embd.weight: expected shape (vocab, {hidden}), found {emb_shape}")
    vocab = emb_shape[0]
    tokens = meta.get("tokenizer.ggml.tokens")
    for key, n in (("llama.vocab_size", num("llama.vocab_size", None)),
                   ("tokenizer.ggml.tokens", tokens.length if isinstance(tokens, _LongArray) else
                    None if tokens is None else len(tokens) if isinstance(tokens, list) else "not a list")):
        if n is not None and n != vocab:
            raise ValueError(f"{path}: GGUF {key} says {n} tokens, token_embd.weight has {vocab} rows")
    layers = need("block_count")
    held = {int(n.split(".")[1]) for n in tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if layers < 1 or layers > len(held) or not all(i in held for i in range(layers)):
        raise ValueError(f"{path}: GGUF llama.block_count = {layers} but the file holds tensors of blocks "
                         f"{sorted(held)[:8]}{' ...' if len(held) > 8 else ''} ({len(held)} blocks)")
    cfg = DecoderConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=need("feed_forward_length"),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=_f32(num("llama.attention.layer_norm_rms_epsilon", 1e-5, float)),
        rope_theta=_f32(num("llama.rope.freq_base", 10000.0, float)),
        attention_bias="blk.0.attn_q.bias" in tensors, tie_word_embeddings="output.weight" not in tensors,
        model_type="llama")

    def tok(key):
        return num(f"tokenizer.ggml.{key}_token_id", None)

    ctx = num("llama.context_length", None)
    return GGUFModelInfo(config=cfg, context_length=ctx, bos_token_id=tok("bos"),
                         eos_token_id=tok("eos"), pad_token_id=tok("padding"),
                         general={k[8:]: v for k, v in meta.items() if k.startswith("general.") and isinstance(v, str)})


def _f32(v) -> float:
    """A float32 metadata value as the shortest decimal that rounds back to it (1e-05, not 9.99999974e-06):
    the same float32, readable in a config.json."""
    return float(str(np.float32(v)))


def read_gguf_info(path) -> GGUFModelInfo:
    """The ``GGUFModelInfo`` of GGUF file ``path`` (metadata only; no tensor data is read)."""
    return _info(path, _reader(path))


def read_gguf_config(path) -> DecoderConfig:
    """The ``DecoderConfig`` of GGUF file ``path`` (``ValueError`` for anything unsupported)."""
    return read_gguf_info(path).config


# ----------------------------------------------------------------------------------------------------
# tensors


_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_PROJ = {("self_attn", "qkv_proj"): ("attn_q", "attn_k", "attn_v"), ("self_attn", "o_proj"): ("attn_output",),
         ("mlp", "gate_up_proj"): ("ffn_gate", "ffn_up"), ("mlp", "down_proj"): ("ffn_down",)}


def gguf_tensors(path: tuple, cfg: DecoderConfig) -> tuple[list[tuple[str, tuple[int, ...], int | None]], bool]:
    """The GGUF tensors of the ``Decoder`` parameter at NNX ``path``: ``[(name, numpy shape, rope heads)]``
    stacked along the output axis in this order (``rope heads``: the head count whose q/k row permutation
    to undo, else ``None``), and whether they are stored transposed (``[out, in]`` against NNX ``[in, out]``)."""
    parts = [str(p) for p in path]
    d, e, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    if parts == ["embed_tokens"]:
        return [("token_embd.weight", (cfg.vocab_size, d), None)], False
    if parts == ["norm", "weight"]:
        return [("output_norm.weight", (d,), None)], False
    if parts == ["lm_head", "kernel"]:
        return [("output.weight", (cfg.vocab_size, d), None)], True
    if len(parts) >= 4 and parts[0] == "layers":
        blk = f"blk.{int(parts[1])}"
        if len(parts) == 4 and parts[2] in _LAYER and parts[3] == "weight":
            return [(f"{blk}.{_LAYER[parts[2]]}.weight", (d,), None)], False
        if len(parts) == 5 and (parts[2], parts[3]) in _PROJ and parts[4] in ("kernel", "bias"):
            names = _PROJ[(parts[2], parts[3])]
            fan_in = {"attn_output": hq * e, "ffn_down": f}.get(names[0], d)
            rows = {"attn_q": hq * e, "attn_k": hkv * e, "attn_v": hkv * e, "attn_output": d, "ffn_gate": f,
                    "ffn_up": f, "ffn_down": d}
            heads = {"attn_q": hq, "attn_k": hkv}
            suffix = "weight" if parts[4] == "kernel" else "bias"
            return [(f"{blk}.{n}.{suffix}", (rows[n], fan_in) if suffix == "weight" else (rows[n],), heads.get(n))
                    for n in names], suffix == "weight"
    raise ValueError(f"no GGUF tensor for parameter {'/'.join(parts)}")


def load_gguf(path, *, param_dtype=jnp.float32, kv_dtype=None, aux_layers: tuple[int, ...] | None = None,
              strict: bool = True) -> Decoder:
    """A ``Decoder`` with the weights of llama GGUF file ``path`` (see the module docstring), parameters in
    ``param_dtype``, KV pool in ``kv_dtype`` (the ``Decoder`` default when ``None``); ``aux_layers`` as for
    ``Decoder`` (EAGLE-3 features). Every tensor's name, shape and type is checked before any is read;
    ``strict`` (default): a tensor with no place in the decoder is an error (``False``: it is skipped)."""
    if not isinstance(strict, bool):
        raise ValueError(f"strict: expected a bool, got {strict!r}")
    reader = _reader(path)
    cfg = _info(path, reader).config
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype,
                                           aux_layers=aux_layers))
    by_name = {t.name: t for t in reader.tensors}
    found = _tensor_shapes(reader)
    plan = []  # (var, transpose, [(name, shape, heads)])
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        parts, transpose = gguf_tensors(key, cfg)
        plan.append((var, transpose, parts))
    wanted = [p for _, _, parts in plan for p in parts]
    missing = [name for name, _, _ in wanted if name not in found]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing}")
    for name, shape, _ in wanted:
        got, type_name = found[name]
        if got != shape:
            raise ValueError(f"{path}: tensor {name}: expected shape {shape}, found {got} (numpy order; GGUF ne "
                             f"{list(reversed(got))})")
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(f"{path}: tensor {name}: GGUF type {type_name} is not supported (supported: "
                             f"{', '.join(SUPPORTED_TYPES)})")
    extra = sorted(set(found) - {name for name, _, _ in wanted})
    if extra and strict:
        raise ValueError(f"{path}: tensors {extra} have no place in a llama decoder of this config (not supported; "
                         "strict=False skips them)")
    dtype = np.dtype(param_dtype)
    for var, transpose, parts in plan:
        arrs = []
        for name, shape, heads in parts:
            t = by_name[name]
            a = dequantize(t.data, t.tensor_type.name, shape, dtype, name=name)
            arrs.append(a if heads is None else unpermute_rope_rows(a, heads))
        arr = arrs[0] if len(arrs) == 1 else np.concatenate(arrs, axis=0)
        var.set_value(jnp.asarray(arr.T if transpose else arr))
        del arrs, arr
    return model
