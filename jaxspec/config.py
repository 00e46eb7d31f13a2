"""Static speculative-decoding configuration (hashable, usable as a jit static argument).

Dimension letters: ``S`` draft steps, ``K`` top-k per step, ``N`` draft tokens per request including the
root (the verify width), ``A = S + 1`` the accepted-path width, ``C`` scored candidates, ``J`` the parent-list
width (the rest of the letters: docs/ops.md, "Symbols").
"""

import dataclasses

MAX_NUM_DRAFT_TOKENS = 1024  # build-tree launcher limit in SGLang 0.5.23 (tree.cuh)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """``(num_steps S, topk K, num_draft_tokens N)`` with SGLang 0.5.23's invariants enforced.

    * ``S > 0``, ``K > 0``, ``0 < N <= 1024``;
    * ``K == 1`` implies ``N == S + 1`` (``speculative_hook.py`` adjusts it upstream; we refuse);
    * ``N - 1 <= K + (S - 1) * K * K`` (enough scored candidates), which for ``S == 1`` is ``N - 1 <= K``.
    """

    num_steps: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self):
        s, k, n = self.num_steps, self.topk, self.num_draft_tokens
        for name, v in (("num_steps", s), ("topk", k), ("num_draft_tokens", n)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"SpecConfig.{name} must be a Python int, got {v!r}")
        if s < 1:
            raise ValueError(f"SpecConfig.num_steps must be >= 1, got {s}")
        if k < 1:
            raise ValueError(f"SpecConfig.topk must be >= 1, got {k}")
        if not 0 < n <= MAX_NUM_DRAFT_TOKENS:
            raise ValueError(f"SpecConfig.num_draft_tokens must be in [1, {MAX_NUM_DRAFT_TOKENS}], got {n}")
        if k == 1 and n != s + 1:
            raise ValueError(
                f"SpecConfig: topk == 1 requires num_draft_tokens == num_steps + 1 (= {s + 1}), got {n}"
            )
        if n - 1 > self.num_candidates:
            raise ValueError(
                f"SpecConfig.num_draft_tokens - 1 must be <= topk + (num_steps - 1) * topk**2 "
                f"(= {self.num_candidates}), got num_draft_tokens={n}"
            )

    @property
    def accept_width(self) -> int:
        """``A = S + 1``: width of ``accept_index``."""
        return self.num_steps + 1

    @property
    def num_candidates(self) -> int:
        """``C = K + (S - 1) * K**2``: scored candidates per request."""
        return self.topk + (self.num_steps - 1) * self.topk**2

    @property
    def parent_list_width(self) -> int:
        """``J = K * (S - 1) + 1``, or 0 when ``S == 1``."""
        return 0 if self.num_steps == 1 else self.topk * (self.num_steps - 1) + 1


def check_config(config) -> SpecConfig:
    """``config`` itself when it is a ``SpecConfig``; else ``ValueError`` (ops take it as a static argument)."""
    if not isinstance(config, SpecConfig):
        raise ValueError(f"config: expected a jaxspec.config.SpecConfig, got {type(config).__name__}")
    return config
