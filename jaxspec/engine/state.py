"""Engine state pytrees and the static engine options.

``DecodeState`` is what the compiled loops carry: the target's paged cache (donated), the drafter's state,
committed lengths, the bonus/last token, the output buffer, per-request stop state and sampling parameters.
"""

import dataclasses
from typing import Any

import jax

from jaxspec.config import SpecConfig
from jaxspec.protocols import PagedKVCache


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Static (hashable) options of the compiled loops.

    spec: the speculative config, or ``None`` for plain greedy decoding.
    page_size: ``G`` of the KV pages (static in every ``AttentionMetadata``).
    implementation / interpret: forwarded to the ``jaxspec.kernels`` ops of the round ("auto" = jnp
      reference on CPU, Pallas on GPU; "pallas" + ``interpret=True`` runs the Pallas kernels interpreted).
    """

    spec: SpecConfig | None = None
    page_size: int = 1
    implementation: str = "auto"
    interpret: bool = False

    @property
    def verify_width(self) -> int:
        """Tokens a round writes past ``seq_lens`` (``N``; 1 for plain decoding)."""
        return 1 if self.spec is None else self.spec.num_draft_tokens


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, arrays of the compiled loop (changing them never recompiles).

    temperature: f32[B], 0 = greedy. top_k: i32[B] (0 = off). top_p: f32[B] in (0, 1]. seed: i32[B].
    The loop is greedy today (``Engine`` fills temperature 0); issue 11 adds the sampling path.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    seed: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """State of a decode batch (row ``b`` of every array is request row ``b`` of ``req_to_token``).

    target_cache: the target's paged KV (``TargetModel.make_cache``).
    draft: the drafter's state (``Drafter.init_state``; its KV shares the target's slot ids), or ``None``
      for plain decoding.
    seq_lens: i32[B] committed target-KV length (ops-spec §0.3: the bonus token is not yet committed).
    bonus: i32[B] the last generated token (root of the next verify tree / next plain input).
    out_tokens: i32[B, T] generated tokens (prefill's first token included), zero padded; ``T`` is a
      power-of-two bucket of the largest ``max_new_tokens`` (one executable for many limits).
    num_generated: i32[B]; max_new_tokens: i32[B]; done: bool[B] (rows padding the batch to its bucket
      are done from the start).
    eos_id: i32[] stop token, -1 for none (a value, so changing it does not recompile).
    num_rounds: i32[B] rounds in which the request was active; num_accepted: i32[B] sum of accept_lens.
    sampling: per-request ``SamplingParams``.
    """

    target_cache: PagedKVCache
    draft: Any
    seq_lens: jax.Array
    bonus: jax.Array
    out_tokens: jax.Array
    num_generated: jax.Array
    max_new_tokens: jax.Array
    done: jax.Array
    eos_id: jax.Array
    num_rounds: jax.Array
    num_accepted: jax.Array
    sampling: SamplingParams
