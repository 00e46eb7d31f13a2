"""Tiny Llama-style target + MTP draft configuration (static, hashable)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static model hyper-parameters of the tiny target (``num_layers``) and its MTP draft (``num_mtp_layers``).

    The MTP layers share the target's embedding, final norm and LM head (DeepSeek-V3 MTP / seed
    ``mtp_worker_v2.py``); each has its own transformer block and its own KV cache.
    """

    vocab_size: int = 64
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 24
    ffn_size: int = 256
    num_mtp_layers: int = 3
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        if self.num_mtp_layers < 0:
            raise ValueError(f"ModelConfig.num_mtp_layers must be >= 0, got {self.num_mtp_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig: num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even (RoPE), got {self.head_dim}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
