"""Engine state pytrees and the static engine options.

``DecodeState`` is what the compiled loops carry: the paged caches (donated), committed lengths, the
bonus/last token, the draft proposal of the next round, the output buffer and per-request stop state.
"""

import dataclasses

import jax

from jaxspec.config import SpecConfig
from jaxspec.models.cache import PagedKVCache


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Static (hashable) options of the compiled loops.

    spec: the speculative config, or ``None`` for plain greedy decoding.
    implementation / interpret: forwarded to the ``jaxspec.kernels`` ops ("auto" = jnp reference on CPU,
      Pallas on GPU; "pallas" + ``interpret=True`` runs the Pallas kernels in the interpreter).
    """

    spec: SpecConfig | None = None
    implementation: str = "auto"
    interpret: bool = False

    @property
    def verify_width(self) -> int:
        """Tokens a round writes past ``seq_lens`` (``N``; 1 for plain decoding)."""
        return 1 if self.spec is None else self.spec.num_draft_tokens


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """State of a decode batch (row ``b`` of every array is request row ``b`` of ``req_to_token``).

    target_cache / draft_cache: paged KV of the target (L layers) and of the MTP layers (S layers; an
      empty 1-slot pool for plain decoding). They share slot ids (one ``req_to_token``).
    seq_lens: i32[B] committed target-KV length (ops-spec §0.3: the bonus token is not yet committed).
    bonus: i32[B] the last generated token (root of the next verify tree / next plain input).
    topk_p: f32[B, X] / topk_index: i32[B, X] the next draft proposal: chain (K == 1) ``X = S``, the
      per-layer argmax tokens; tree (K > 1) ``X = K``, MTP layer 0's top-K. Plain: ``X = 1`` unused.
    hidden: f32[B, D] MTP layer 0's hidden at the selected row (parent state of tree beams).
    out_tokens: i32[B, T] generated tokens (prefill's first token included), zero padded.
    num_generated: i32[B]; max_new_tokens: i32[B]; done: bool[B].
    eos_id: i32[] stop token, -1 for none (a value, so changing it does not recompile).
    num_rounds: i32[B] rounds in which the request was active; num_accepted: i32[B] sum of accept_lens.
    """

    target_cache: PagedKVCache
    draft_cache: PagedKVCache
    seq_lens: jax.Array
    bonus: jax.Array
    topk_p: jax.Array
    topk_index: jax.Array
    hidden: jax.Array
    out_tokens: jax.Array
    num_generated: jax.Array
    max_new_tokens: jax.Array
    done: jax.Array
    eos_id: jax.Array
    num_rounds: jax.Array
    num_accepted: jax.Array
