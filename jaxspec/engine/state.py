"""Engine state pytrees and the static engine options.

``DecodeState`` is what the compiled loops carry: the target's paged cache (donated), the drafter's state,
committed lengths, the bonus/last token, the output buffer, per-request stop state and sampling parameters.
"""

import dataclasses
import jax

from jaxspec.config import SpecConfig
from jaxspec.engine.policy import AdaptivePolicy, PolicyState
from jaxspec.kernels import Implementation
from jaxspec.protocols import PagedKVCache


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Static (hashable) options of the compiled loops.

    specs: the draft shapes the loop runs: ``()`` for plain decoding, one ``SpecConfig`` (every round
      speculates with it), or the adaptive engine's shapes (modes ``1..``, mode 0 = plain).
    page_size: ``G`` of the KV pages (static in every ``AttentionMetadata``).
    implementation / interpret: forwarded to the ``jaxspec.kernels`` ops of the round ("auto" = jnp
      reference on CPU, Pallas on GPU; "pallas" + ``interpret=True`` runs the Pallas kernels interpreted).
    verify: how sampling batches verify: ``"target_only"`` (SGLang's tree rejection sampling, drafts taken
      top-k) or ``"draft_probs"`` (the classic rule with the drafter's sampled chain and its probabilities;
      chains only). Greedy batches always verify greedily.
    threshold_single / threshold_acc: SGLang's acceptance thresholds of ``"target_only"`` (1.0 / 1.0 =
      lossless; smaller values accept more drafts and bias the output distribution).
    adaptive: adaptive speculation (``jaxspec.engine.policy``): the policy that chooses per round between
      plain decoding and the draft shapes ``specs``; ``None``: every round speculates with ``specs[0]``.
    batch_invariant: the target's forwards run batch-invariant (``AttentionMetadata.batch_invariant``).
    """

    specs: tuple[SpecConfig, ...] = ()
    page_size: int = 1
    implementation: Implementation = "auto"
    interpret: bool = False
    verify: str = "target_only"
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    adaptive: AdaptivePolicy | None = None
    batch_invariant: bool = False

    @property
    def verify_width(self) -> int:
        """Tokens a round writes past ``seq_lens`` (the largest ``N``; 1 for plain decoding)."""
        return max([1] + [s.num_draft_tokens for s in self.specs])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, arrays of the compiled loop (changing them never recompiles).

    temperature: f32[B], 0 = greedy. top_k: i32[B] in [1, V] (V = off). top_p: f32[B] in (0, 1].
    seed: i32[B] >= 0. Coins of request ``b`` come from ``fold_in(key(seed[b]), r)`` with ``r = 0`` for the
    prefill's token and ``r = 1 + num_rounds[b]`` for its rounds: never from the batch position, so a
    request draws the same tokens whatever batch it runs in.
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
    draft: the drafter's states (``Drafter.init_state``; their KV shares the target's slot ids), one per
      draft shape of ``EngineOptions.specs`` (``()`` for plain decoding).
    seq_lens: i32[B] committed target-KV length (the bonus token is not yet committed: it is the next
      round's root, written by that round's verify forward).
    bonus: i32[B] the last generated token (root of the next verify tree / next plain input).
    out_tokens: i32[B, T] generated tokens (prefill's first token included), zero padded; ``T`` is a
      power-of-two bucket of the largest ``max_new_tokens`` (one executable for many limits).
    num_generated: i32[B]; max_new_tokens: i32[B]; done: bool[B] (rows padding the batch to its bucket
      are done from the start).
    eos_id: i32[] stop token, -1 for none (a value, so changing it does not recompile).
    num_rounds: i32[B] rounds in which the request was active; num_accepted: i32[B] sum of accept_lens.
    sampling: per-request ``SamplingParams``.
    policy: the adaptive policy's ``PolicyState`` (adaptive engines), else ``None``.
    simulate: ``f32[A]`` accept-length distribution of simulated acceptance (``engine.simulate``;
      benchmarking only, not lossless), else ``None``.
    all_greedy: static; ``True`` when every request has temperature 0: the loops then take the greedy
      executable (SGLang's ``is_all_greedy``), else the sampling-capable one (temperature-0 rows in it are
      still greedy). It is part of the jit key, never a per-value recompile.
    """

    target_cache: PagedKVCache
    draft: tuple
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
    policy: PolicyState | None = None
    simulate: jax.Array | None = None
    all_greedy: bool = dataclasses.field(default=True, metadata=dict(static=True))
