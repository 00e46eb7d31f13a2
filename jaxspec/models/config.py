"""Static, hashable configuration of the Llama-family decoders (``DecoderConfig``, read from ``config.json``)."""

import dataclasses


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
        if not isinstance(self.num_nextn_predict_layers, int) or self.num_nextn_predict_layers < 0:
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
        """Validate a Hugging Face ``config.json`` dict; anything this decoder cannot run raises ``ValueError``."""
        mt = hf.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config.json model_type: expected one of {SUPPORTED_MODEL_TYPES}, got {mt!r}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json hidden_act: only 'silu' (SwiGLU) is supported, got {act!r}")
        if hf.get("mlp_bias"):
            raise ValueError("config.json mlp_bias: true is not supported (no MLP bias in Llama/Qwen2/Mistral)")
        scaling = _rope_scaling(hf)
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        window = hf.get("sliding_window")
        if mt == "qwen2" and not hf.get("use_sliding_window", False):
            window = None
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(_rope_theta(hf)),
            rope_scaling=scaling, attention_bias=bool(hf.get("attention_bias", mt == "qwen2")),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), sliding_window=window,
            num_nextn_predict_layers=int(hf.get("num_nextn_predict_layers", 0)), model_type=mt,
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


def _rope_theta(hf: dict) -> float:
    params = hf.get("rope_parameters") or {}  # transformers >= 5 nests rope settings here
    return hf.get("rope_theta") or params.get("rope_theta") or 10000.0


def _rope_scaling(hf: dict):
    rs = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not rs:
        return None
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
    vals = [(k, int(rs[k]) if k == "original_max_position_embeddings" else float(rs[k])) for k in keys]
    return tuple(sorted([("rope_type", "llama3")] + vals))
