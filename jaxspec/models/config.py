"""Static, hashable configuration of the Llama-family decoders (``DecoderConfig``, read from ``config.json``)."""

import dataclasses
import math


# --- Hugging Face Llama-family decoders (Llama 2/3, Qwen2/2.5, Mistral) -------------------------------------

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Static hyper-parameters of a Llama-family decoder (names follow the Hugging Face ``config.json``).

    ``attention_bias``: q/k/v projections carry a bias (Qwen2 always; Llama when ``attention_bias``).
    ``rope_scaling``: ``None`` or the Llama-3 scaling as a sorted tuple of ``(key, value)`` pairs (hashable).
    ``sliding_window``: Mistral/Qwen2 window, or ``None``; windowed attention is not implemented, so a cache
    wider than the window is refused by ``Decoder.make_cache`` (below the window it is full attention).
    ``num_nextn_predict_layers``: MTP layers stored with the checkpoint (DeepSeek-V3 name; 0: none).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    num_nextn_predict_layers: int = 0
    model_type: str = "llama"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"DecoderConfig.{name} must be a positive int, got {v!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"DecoderConfig.{name} must be a finite number > 0, got {v!r}")
        for name in ("attention_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DecoderConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                                or isinstance(self.sliding_window, bool) or self.sliding_window < 1):
            raise ValueError(f"DecoderConfig.sliding_window must be None or a positive int, "
                             f"got {self.sliding_window!r}")
        if (not isinstance(self.num_nextn_predict_layers, int) or isinstance(self.num_nextn_predict_layers, bool)
                or self.num_nextn_predict_layers < 0):
            raise ValueError("DecoderConfig.num_nextn_predict_layers must be an int >= 0, "
                             f"got {self.num_nextn_predict_layers!r}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"DecoderConfig.model_type: expected one of {SUPPORTED_MODEL_TYPES}, "
                             f"got {self.model_type!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"DecoderConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig.head_dim must be even (RoPE), got {self.head_dim}")
        if self.model_type == "qwen2" and not self.attention_bias:
            raise ValueError("DecoderConfig: model_type 'qwen2' always has q/k/v biases (attention_bias=True)")
        if self.rope_scaling is not None:
            d = dict(self.rope_scaling)
            missing = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} - set(d)
            if d.get("rope_type") != "llama3" or missing:
                raise ValueError(f"DecoderConfig.rope_scaling: only Llama-3 scaling (rope_type 'llama3' with factor, "
                                 f"low_freq_factor, high_freq_factor, original_max_position_embeddings) is supported, "
                                 f"got {d!r}")

    @classmethod
    def from_hf(cls, hf: dict) -> "DecoderConfig":
        """Validate a Hugging Face ``config.json`` dict; anything this decoder cannot run raises ``ValueError``
        naming the field (a missing required field, a value of the wrong type or range, a quantized checkpoint)."""
        if not isinstance(hf, dict):
            raise ValueError(f"config.json: expected a JSON object, got {type(hf).__name__}")
        mt = hf.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config.json model_type: expected one of {SUPPORTED_MODEL_TYPES}, got {mt!r}")
        if hf.get("quantization_config") is not None:
            q = hf["quantization_config"]
            method = q.get("quant_method", q.get("load_in_8bit") and "bitsandbytes") if isinstance(q, dict) else q
            raise ValueError(f"config.json quantization_config: quantized checkpoints ({method!r}) are not supported "
                             "(their integer tensors and scales are not float weights)")
        act = _field(hf, "hidden_act", "silu", str)
        if act != "silu":
            raise ValueError(f"config.json hidden_act: only 'silu' (SwiGLU) is supported, got {act!r}")
        if _field(hf, "mlp_bias", False, bool):
            raise ValueError("config.json mlp_bias: true is not supported (no MLP bias in Llama/Qwen2/Mistral)")
        scaling = _rope_scaling(hf)
        sizes = {k: _field(hf, k, _REQUIRED, int) for k in
                 ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")}
        if "rms_norm_eps" in hf and hf["rms_norm_eps"] is None:  # null is no epsilon: not a reason to pick one
            raise ValueError("config.json rms_norm_eps: expected a positive number, got null")
        max_pos = _field(hf, "max_position_embeddings", None, int)  # not used (RoPE positions are not capped)
        if max_pos is not None and max_pos < 1:
            raise ValueError(f"config.json max_position_embeddings: expected a positive integer, got {max_pos}")
        heads = sizes["num_attention_heads"]
        head_dim = _field(hf, "head_dim", None, int)
        if head_dim is None:
            if heads < 1 or sizes["hidden_size"] % heads:
                raise ValueError(f"config.json head_dim: absent, and hidden_size ({sizes['hidden_size']}) is not a "
                                 f"multiple of num_attention_heads ({heads})")
            head_dim = sizes["hidden_size"] // heads
        kv_heads = _field(hf, "num_key_value_heads", None, int)
        window = _field(hf, "sliding_window", None, int)
        if mt == "qwen2" and not _field(hf, "use_sliding_window", False, bool):
            window = None
        return cls(
            **sizes, num_key_value_heads=heads if kv_heads is None else kv_heads, head_dim=head_dim,
            rms_norm_eps=_field(hf, "rms_norm_eps", 1e-6, float), rope_theta=_rope_theta(hf),
            rope_scaling=scaling, attention_bias=_field(hf, "attention_bias", mt == "qwen2", bool),
            tie_word_embeddings=_field(hf, "tie_word_embeddings", False, bool), sliding_window=window,
            num_nextn_predict_layers=_field(hf, "num_nextn_predict_layers", 0, int), model_type=mt,
        )

    def to_hf(self) -> dict:
        """The ``config.json`` dict ``from_hf`` reads back (and transformers' ``AutoConfig`` understands)."""
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "mistral": "MistralForCausalLM"}[self.model_type]
        d = {
            "architectures": [arch], "model_type": self.model_type, "hidden_act": "silu",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else dict(self.rope_scaling),
            "attention_bias": self.attention_bias, "tie_word_embeddings": self.tie_word_embeddings,
            "sliding_window": self.sliding_window, "num_nextn_predict_layers": self.num_nextn_predict_layers,
        }
        return d


_REQUIRED = object()


def _field(hf: dict, key: str, default, kind: type, where: str = ""):
    """``hf[key]`` checked to be a ``kind`` (``int``: not a bool; ``float``: any finite real, not a bool) or
    ``default`` when absent or null; ``ValueError`` naming the field otherwise (``_REQUIRED``: must be there)."""
    v = hf.get(key)
    if v is None:
        if default is _REQUIRED:
            raise ValueError(f"config.json: required field {where + key!r} is missing")
        return default
    if kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        want = "a finite number"
    elif kind is int:
        ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
    else:
        ok, want = isinstance(v, kind), {bool: "true or false", str: "a string", dict: "an object"}[kind]
    if not ok:
        raise ValueError(f"config.json {where}{key}: expected {want}, got {v!r}")
    return float(v) if kind is float else v


def _rope_theta(hf: dict) -> float:
    params = hf.get("rope_parameters")  # transformers >= 5 nests rope settings here
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"config.json rope_parameters: expected an object, got {params!r}")
    if hf.get("rope_theta") is None and params and params.get("rope_theta") is not None:
        return _field(params, "rope_theta", 10000.0, float, "rope_parameters.")
    return _field(hf, "rope_theta", 10000.0, float)


def _rope_scaling(hf: dict):
    rs = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not rs:
        return None
    if not isinstance(rs, dict):
        raise ValueError(f"config.json rope_scaling: expected an object, got {rs!r}")
    rs = {k: v for k, v in rs.items() if k != "rope_theta"}
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default") and set(rs) <= {"rope_type", "type"}:
        return None
    if kind != "llama3":
        raise ValueError(f"config.json rope_scaling: only Llama-3 scaling ('llama3') is supported, got {rs!r}")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in rs]
    if missing:
        raise ValueError(f"config.json rope_scaling: Llama-3 scaling needs {missing}, got {rs!r}")
    vals = [(k, _field(rs, k, _REQUIRED, int if k == "original_max_position_embeddings" else float, "rope_scaling."))
            for k in keys]
    return tuple(sorted([("rope_type", "llama3")] + vals))
