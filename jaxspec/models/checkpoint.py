"""Hugging Face checkpoint directories (``config.json`` + ``*.safetensors``) <-> ``Decoder`` / ``MTPModel``.

Tensor names are the Hugging Face Llama/Qwen2/Mistral ones (``model.embed_tokens.weight``,
``model.layers.{i}.self_attn.q_proj.weight`` ``[out, in]``, ``model.norm.weight``, ``lm_head.weight``; no
``lm_head`` when ``tie_word_embeddings``); the model's fused ``qkv_proj`` / ``gate_up_proj`` (SGLang's) are
stacked from / split into ``q_proj, k_proj, v_proj`` / ``gate_proj, up_proj`` along the output axis. MTP
layer ``s`` follows DeepSeek-V3: it is stored as decoder layer ``L + s`` (``model.layers.{L+s}.enorm / hnorm /
eh_proj / self_attn.* / mlp.* / input_layernorm / post_attention_layernorm``) and ``config.json`` carries
``num_nextn_predict_layers``; its embedding, final norm and head are the target's (DeepSeek-V3's per-layer
``embed_tokens`` / ``shared_head`` copies, if present, are not read). Sharded checkpoints go through
``model.safetensors.index.json``. Nothing is downloaded.

Loading (``load_model`` / ``load_weights``) reads only the directory's own regular files (see ``_member``),
validates every header with ``safetensors.safe_open`` and checks names, dtypes (float only), shapes and the
layer count before any tensor data is read; tensors are then read a chunk of rows at a time straight into a
host buffer of the parameter dtype, put on the device and the buffer dropped (no torch; bf16 kept), so peak
host memory stays near the checkpoint's size plus one parameter.
"""

import dataclasses
import json
import mmap
import os
import re
import stat
import warnings

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
    """``DecoderConfig`` from ``path/config.json`` (``ValueError`` naming the field for anything unsupported)."""
    root = _root(path)
    return DecoderConfig.from_hf(_read_json(root, "config.json", "config.json"))


# ----------------------------------------------------------------------------------------------------
# the checkpoint's files: every path checked to stay inside the directory and to be a regular file, every
# header read (names, dtypes, shapes) before any tensor data


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors dtype names that are float weights
_CHUNK_BYTES = 1 << 24  # a tensor is read 16 MiB of rows at a time
_MAX_JSON_BYTES = 64 << 20
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One tensor of the checkpoint: its file (resolved path and the name the directory gives it), dtype, shape
    and the absolute byte offset of its data (row-major, little-endian)."""

    file: str
    label: str
    dtype: str
    shape: tuple[int, ...]
    start: int


def _root(path) -> str:
    root = os.path.realpath(os.fspath(path))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{path}: not a directory (expected a Hugging Face checkpoint directory with "
                                "config.json and *.safetensors, or a .gguf file)")
    return root


def _within(real: str, root: str) -> bool:
    """``real`` lies inside ``root``, or in the ``blobs`` folder of the Hugging Face hub cache when ``root`` is
    one of its ``snapshots/<revision>`` folders (whose files are symlinks to ``../../blobs/<hash>``)."""
    if os.path.commonpath([real, root]) == root:
        return True
    repo, snapshots = os.path.dirname(os.path.dirname(root)), os.path.basename(os.path.dirname(root))
    blobs = os.path.join(repo, "blobs")
    return snapshots == "snapshots" and os.path.dirname(real) == blobs


def _member(root: str, name, what: str) -> str:
    """The resolved path of file ``name`` of checkpoint directory ``root``: a relative name without ``..``, that
    resolves (symlinks followed) inside ``root``, to a regular file; ``ValueError`` naming it otherwise (a FIFO,
    socket or device is never opened)."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or os.path.isabs(name) or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{root}: {what} {name!r}: expected a relative file name inside the checkpoint directory")
    real = os.path.realpath(os.path.join(root, name))
    if not _within(real, root):
        raise ValueError(f"{root}: {what} {name!r} resolves to {real}, outside the checkpoint directory")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{root}: {what} {name!r} does not exist") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{root}: {what} {name!r} is not a regular file (not read)")
    return real


def _read_json(root: str, name: str, what: str):
    if not os.path.lexists(os.path.join(root, name)):
        raise FileNotFoundError(f"{root}: no {name} (expected a Hugging Face checkpoint directory)")
    real = _member(root, name, what)
    if os.path.getsize(real) > _MAX_JSON_BYTES:
        raise ValueError(f"{root}: {name} is larger than {_MAX_JSON_BYTES} bytes")
    try:
        with open(real, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{root}: {name} is not valid JSON ({e})") from None


def _header(real: str, label: str, root: str) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Tensor name -> (safetensors dtype name, shape, data offset) of one file, from its header only.
    ``safe_open`` validates the header first (every tensor's byte range inside the file, consistent with its
    dtype and shape, none overlapping); the data offsets are then read from that header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(real, framework="numpy") as f:
            info = {k: (f.get_slice(k).get_dtype(), tuple(int(d) for d in f.get_slice(k).get_shape()))
                    for k in f.keys()}
    except SafetensorError as e:
        raise ValueError(f"{root}: {label} is not a valid safetensors file ({e})") from None
    with open(real, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        offsets = json.loads(f.read(n))
    return {k: (dtype, shape, 8 + n + int(offsets[k]["data_offsets"][0])) for k, (dtype, shape) in info.items()}


def _tensor_index(root: str) -> dict[str, _Entry]:
    """Tensor name -> ``_Entry``: through ``model.safetensors.index.json`` when there is one (every shard it
    names checked before any is opened; each tensor must be in the shard it is mapped to), else every
    ``*.safetensors`` in the directory (a tensor in two of them is an error: nothing says which to read)."""
    if os.path.lexists(os.path.join(root, _INDEX)):
        index = _read_json(root, _INDEX, "shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{root}: {_INDEX}: expected {{\"weight_map\": {{tensor name: shard file name}}}}")
        shards = {fn: _member(root, fn, f"{_INDEX} shard") for fn in sorted(set(weight_map.values()))}
        headers = {fn: _header(real, fn, root) for fn, real in shards.items()}
        out = {}
        for name, fn in weight_map.items():
            if name not in headers[fn]:
                raise ValueError(f"{root}: {_INDEX} maps tensor {name} to {fn}, which holds no such tensor")
            out[name] = _Entry(shards[fn], fn, *headers[fn][name])
        return out
    names = sorted(n for n in os.listdir(root) if n.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"{root}: no *.safetensors files and no {_INDEX}")
    files = {fn: _member(root, fn, "safetensors file") for fn in names}
    out = {}
    for fn, real in files.items():
        for name, (dtype, shape, start) in _header(real, fn, root).items():
            if name in out:
                raise ValueError(f"{root}: tensor {name} is in both {out[name].label} and {fn}, and there is no "
                                 f"{_INDEX} to say which one to read")
            out[name] = _Entry(real, fn, dtype, shape, start)
    return out


def _host_array(shape, dtype) -> np.ndarray:
    """An uninitialised host array in pages of its own (an anonymous mapping, returned to the system when the
    array is dropped): a checkpoint's many large, short-lived buffers then never fragment the allocator's heap
    between the long-lived parameters."""
    nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)[:nbytes].view(dtype)[:int(np.prod(shape))].reshape(shape)


class _Reader:
    """Reads rows of a tensor with plain ``readinto`` calls into one reusable scratch buffer (no memory map, so
    the file's pages never count against the process)."""

    def __init__(self):
        self.scratch = _host_array((_CHUNK_BYTES,), np.uint8)

    def rows(self, f, entry: _Entry, lo: int, hi: int) -> np.ndarray:
        dtype = np.dtype(_NP_DTYPES[entry.dtype]).newbyteorder("<")
        row = int(np.prod(entry.shape[1:], dtype=np.int64)) if entry.shape else 1
        nbytes = (hi - lo) * row * dtype.itemsize
        if nbytes > self.scratch.size:
            self.scratch = _host_array((nbytes,), np.uint8)
        f.seek(entry.start + lo * row * dtype.itemsize)
        if f.readinto(memoryview(self.scratch)[:nbytes]) != nbytes:
            raise ValueError(f"{entry.file}: ended inside the data of a tensor (the file changed while loading)")
        return self.scratch[:nbytes].view(dtype).reshape((hi - lo, *entry.shape[1:]))


_NP_DTYPES = {"F16": np.float16, "BF16": jnp.bfloat16, "F32": np.float32, "F64": np.float64}


def _chunks(entry: _Entry):
    """``(lo, hi)`` row ranges of at most ``_CHUNK_BYTES`` each (or one row) covering ``entry``'s first axis."""
    n = entry.shape[0] if entry.shape else 1
    row_bytes = int(np.prod(entry.shape[1:], dtype=np.int64)) * np.dtype(_NP_DTYPES[entry.dtype]).itemsize
    step = max(1, _CHUNK_BYTES // max(row_bytes, 1))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _same_tensor(a: _Entry, b: _Entry) -> bool:
    if a.shape != b.shape or a.dtype not in _NP_DTYPES or b.dtype not in _NP_DTYPES:
        return False
    ra, rb = _Reader(), _Reader()
    with open(a.file, "rb") as fa, open(b.file, "rb") as fb:
        return all(np.array_equal(ra.rows(fa, a, lo, hi), rb.rows(fb, b, lo, hi)) for lo, hi in _chunks(a))


def _layer_ranges(layers) -> str:
    layers, out, i = sorted(layers), [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(f"{layers[i]}" if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def _check_layers(root: str, cfg: DecoderConfig, tensors: dict[str, _Entry], with_mtp: bool, strict: bool) -> None:
    """The decoder layers the checkpoint holds against ``num_hidden_layers`` (+ its MTP layers), before a model of
    that depth is built."""
    held = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    need = cfg.num_hidden_layers + (cfg.num_nextn_predict_layers if with_mtp else 0)
    declared = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    if need > len(held) or not all(i in held for i in range(need)) or (strict and held and max(held) >= declared):
        raise ValueError(f"{root}: config.json num_hidden_layers = {cfg.num_hidden_layers} (num_nextn_predict_layers "
                         f"= {cfg.num_nextn_predict_layers}) but the checkpoint holds model.layers "
                         f"{_layer_ranges(held)}")


def _ignored(name: str, cfg: DecoderConfig) -> bool:
    """Checkpoint tensors with no parameter that are skipped even when strict: rotary ``inv_freq`` buffers (older
    Llama checkpoints) and the tensors of MTP layers the model does not load (all of them for a target-only
    load; DeepSeek-V3's per-layer ``embed_tokens`` / ``shared_head`` copies)."""
    if name.endswith(".rotary_emb.inv_freq"):
        return True
    m = _LAYER.match(name)
    return bool(m) and cfg.num_hidden_layers <= int(m.group(1)) < cfg.num_hidden_layers + cfg.num_nextn_predict_layers


def _some(names, n: int = 8) -> str:
    names = sorted(names)
    return str(names[:n])[:-1] + (f", ... ({len(names)} in all)]" if len(names) > n else "]")


def load_weights(model: Decoder, path: str, *, strict: bool = True) -> Decoder:
    """Fill ``model``'s parameters from the safetensors of checkpoint directory ``path``; returns ``model``.

    Checked before any tensor data is read, each error naming the tensor: every parameter's tensors are there,
    with the expected shape and a float dtype (F16 / BF16 / F32 / F64: integer or packed quantized tensors are
    never loaded as floats); ``strict`` (default): every tensor of the checkpoint has a place in ``model``
    (except the ones ``_ignored`` lists), ``strict=False`` skips the others. A tied ``model`` refuses a
    checkpoint ``lm_head.weight`` that differs from its embeddings. Tensors are read a chunk of rows at a
    time, cast into a host buffer of ``model.param_dtype``, put on the device and the buffer dropped, so the
    host holds one parameter beyond what is on the device.
    """
    if not isinstance(strict, bool):
        raise ValueError(f"strict: expected a bool, got {strict!r}")
    root = _root(path)
    tensors = _tensor_index(root)
    return _fill(model, root, tensors, strict)


def _fill(model: Decoder, root: str, tensors: dict[str, _Entry], strict: bool) -> Decoder:
    cfg = model.cfg
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    plan = []  # (var, transpose, [(name, expected checkpoint shape)])
    for key, var in flat:
        parts, transpose = hf_tensors(key, cfg)
        shape = tuple(var.get_value().shape)
        hf_shape = shape[::-1] if transpose else shape  # [out, ...]
        plan.append((var, transpose, [(name, hf_shape if rows is None else (rows, *hf_shape[1:]))
                                      for name, rows in parts]))
    wanted = {name: want for _, _, parts in plan for name, want in parts}
    missing = [name for name in wanted if name not in tensors]
    if missing:
        raise ValueError(f"{root}: missing tensors {missing}")
    for name, want in wanted.items():
        e = tensors[name]
        if e.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{root}: tensor {name} ({e.label}) has dtype {e.dtype}: only float weights "
                             f"({', '.join(_FLOAT_DTYPES)}) are loaded (a quantized or integer checkpoint is not "
                             "supported)")
        if e.shape != want:
            raise ValueError(f"{root}: tensor {name}: expected shape {want}, found {e.shape}")
    extra = set(tensors) - set(wanted)
    if cfg.tie_word_embeddings and "lm_head.weight" in extra:
        emb = "model.embed_tokens.weight"
        if not _same_tensor(tensors["lm_head.weight"], tensors[emb]):
            raise ValueError(f"{root}: the model ties its head to the embeddings but the checkpoint's lm_head.weight "
                             f"differs from {emb}: build the model with tie_word_embeddings=False (load_model does)")
        extra.discard("lm_head.weight")
    extra = {name for name in extra if not _ignored(name, cfg)}
    if extra and strict:
        raise ValueError(f"{root}: tensors {_some(extra)} have no place in a {cfg.model_type} decoder of this "
                         "config (strict=False skips them)")
    dtype = np.dtype(model.param_dtype)
    reader = _Reader()
    for var, transpose, parts in plan:
        host = _assemble(tuple(var.get_value().shape), transpose, parts, tensors, dtype, reader)
        var.set_value(jnp.asarray(host))
        del host
    return model


def _assemble(shape, transpose, parts, tensors, dtype, reader: _Reader) -> np.ndarray:
    """One parameter in ``dtype``: its checkpoint tensors stacked along the output axis (a fused projection),
    transposed to NNX ``[in, out]`` when ``transpose``; read a chunk of rows at a time and cast into the buffer."""
    out = _host_array(shape, dtype)
    off = 0
    with np.errstate(over="ignore", invalid="ignore"):  # an inf/NaN or an f64 beyond the dtype's range stays so
        for name, want in parts:
            e = tensors[name]
            with open(e.file, "rb") as f:
                for lo, hi in _chunks(e):
                    rows = reader.rows(f, e, lo, hi)
                    if transpose:
                        out[:, off + lo:off + hi] = rows.T
                    else:
                        out[off + lo:off + hi] = rows
            off += want[0]
    return out


def load_model(path: str, *, param_dtype=jnp.float32, kv_dtype=None, mtp: bool | None = None,
               aux_layers: tuple[int, ...] | None = None, num_draft_steps: int | None = None,
               strict: bool = True) -> Decoder:
    """Load a checkpoint directory as a ``Decoder``, or as an ``MTPModel`` when it has MTP layers; or a llama
    ``.gguf`` file as a ``Decoder`` (``jaxspec.models.gguf``: dequantized to ``param_dtype``; no MTP layers).

    ``mtp``: ``None`` -> an ``MTPModel`` iff ``config.json`` has ``num_nextn_predict_layers > 0``; ``True``
    requires them; ``False`` loads the target only. ``aux_layers`` (EAGLE-3 features) needs ``mtp`` falsy.
    ``num_draft_steps``: an ``MTPModel``'s draft steps (default: its MTP layers; more reuse the last layer).
    ``strict``: tensors with no place in the model are an error (``False``: skipped; see ``load_weights``).

    A directory is read only through its own files: ``config.json``, ``model.safetensors.index.json`` and the
    shards must be regular files that resolve inside it (symlinks into the Hugging Face hub cache's ``blobs``
    folder excepted); the layers the tensors hold are checked against ``num_hidden_layers`` before the model
    is built. ``tie_word_embeddings: true`` with an ``lm_head.weight`` that differs from the embeddings loads
    both, untied (a warning says so), as transformers does.
    """
    if not isinstance(strict, bool):
        raise ValueError(f"strict: expected a bool, got {strict!r}")
    if is_gguf(path):
        if mtp:
            raise ValueError(f"{path}: mtp=True but a GGUF file holds no MTP layers")
        if num_draft_steps is not None:
            raise ValueError("num_draft_steps: applies to an MTPModel only (a GGUF file loads as a Decoder)")
        return load_gguf(path, param_dtype=param_dtype, kv_dtype=kv_dtype, aux_layers=aux_layers, strict=strict)
    if os.path.isfile(path) and str(path).endswith(".gguf"):
        raise ValueError(f"{path}: not a GGUF file (it does not start with the GGUF magic)")
    root = _root(path)
    cfg = read_config(root)
    tensors = _tensor_index(root)
    if mtp is None:
        mtp = cfg.num_nextn_predict_layers > 0 and aux_layers is None
    if mtp:
        if cfg.num_nextn_predict_layers < 1:
            raise ValueError(f"{path}: mtp=True but config.json has no num_nextn_predict_layers")
        if aux_layers is not None:
            raise ValueError("aux_layers: an MTPModel's hidden is the last pre-norm hidden; pass mtp=False")
    elif num_draft_steps is not None:
        raise ValueError("num_draft_steps: applies to an MTPModel only (a checkpoint with MTP layers, mtp not False)")
    _check_layers(root, cfg, tensors, mtp, strict)
    emb = "model.embed_tokens.weight"
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors and emb in tensors and not _same_tensor(
            tensors["lm_head.weight"], tensors[emb]):
        warnings.warn(f"{path}: config.json has tie_word_embeddings: true but the checkpoint's lm_head.weight "
                      f"differs from {emb}: both are loaded, untied (as transformers does)", stacklevel=2)
        cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
    if mtp:
        make = lambda: MTPModel(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype,  # noqa: E731
                                num_draft_steps=num_draft_steps)
    else:
        make = lambda: Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype,  # noqa: E731
                               aux_layers=aux_layers)
    # Shapes only (no random initialisation): every parameter is then set from the checkpoint.
    return _fill(nnx.eval_shape(make), root, tensors, strict)


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
