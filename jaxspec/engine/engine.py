"""Host boundary of the decode loops: validation, cache allocation, and the compiled entry points.

``Engine.generate`` runs prefill and the whole decode loop in ONE jitted call (``lax.while_loop`` over
``spec_step`` / ``plain_step`` with per-request stopping; no host sync until the result is read).
``Engine.generate_host_driven`` runs one jitted call per round and polls ``done`` on the host (for the
benchmark). All checks that could otherwise corrupt the cache (context overflow, page exhaustion, empty
or out-of-vocabulary prompts) raise ``ValueError`` here, before anything is traced.
"""

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine.state import DecodeState, EngineOptions
from jaxspec.engine.step import plain_step, prefill, spec_step
from jaxspec.models.cache import init_cache, make_req_to_token
from jaxspec.models.llama import TinyPair

PROMPT_BUCKET = 8  # prompts are right-padded to a multiple of this (fewer recompiles across batches)


class GenerateResult(NamedTuple):
    """Host-side result: per-request generated ids, plus acceptance statistics."""

    tokens: list  # list[np.ndarray int32], generated tokens of each request (prefill token included)
    num_rounds: np.ndarray  # i32[B] decode rounds (verify steps) while the request was active
    num_accepted: np.ndarray  # i32[B] tokens committed by those rounds (sum of accept_lens)

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify round over the batch (plain decoding: 1.0)."""
        return float(self.num_accepted.sum()) / max(1, int(self.num_rounds.sum()))


class _Compiled(NamedTuple):
    prefill: object
    step: object
    generate: object


@functools.lru_cache(maxsize=64)
def _compiled(graphdef, treedef, opts: EngineOptions) -> _Compiled:
    """Jitted entry points for one (model structure, options) pair, shared by every Engine with equal keys
    (trained and random weights, page sizes 1 and 16, any EOS share one executable per input shape).

    ``graphdef`` is closed over instead of being a static argument: hashing an NNX GraphDef costs ~3 ms
    per call, which dominated the host-driven loop (measured on CPU: 5.4 -> ~2 ms per round). Params
    travel as a flat list of leaves (``treedef`` closed over too): flattening an NNX State costs ~0.5 ms.
    """
    step_fn = plain_step if opts.spec is None else spec_step

    def _model(leaves):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

    def _prefill(params, state, prompts, lens):
        return prefill(_model(params), opts, state, prompts, lens)

    def _step(params, state):
        return step_fn(_model(params), opts, state)

    def _generate(params, state, prompts, lens):
        model = _model(params)
        state = prefill(model, opts, state, prompts, lens)
        return jax.lax.while_loop(lambda st: ~jnp.all(st.done), lambda st: step_fn(model, opts, st), state)

    return _Compiled(
        prefill=jax.jit(_prefill, donate_argnums=(1,)),
        step=jax.jit(_step, donate_argnums=(1,)),
        generate=jax.jit(_generate, donate_argnums=(1,)),
    )


class Engine:
    """Greedy decoding of a ``TinyPair`` with MTP speculation (``spec``) or plain (``spec=None``).

    Args:
      model: the target + MTP pair (``spec.num_steps <= model.cfg.num_mtp_layers``).
      spec: ``SpecConfig(S, K, N)``; chain ``K == 1`` (``N == S + 1``) or tree ``K > 1``.
      max_context: ``W``, tokens reserved per request (``prompt + max_new_tokens + N <= W``).
      page_size: KV page size ``G`` (pages of a request are shuffled, page 0 is the dummy page).
      num_pages: KV pool size in pages (default: exactly enough); too few raises ``ValueError``.
      eos_id: stop token, or None.
      implementation / interpret: forwarded to the kernels (see ``EngineOptions``).
    """

    def __init__(
        self,
        model: TinyPair,
        *,
        spec: SpecConfig | None,
        max_context: int = 256,
        page_size: int = 1,
        num_pages: int | None = None,
        eos_id: int | None = None,
        implementation: str = "auto",
        interpret: bool = False,
        seed: int = 0,
    ):
        cfg = model.cfg
        if spec is not None:
            if not isinstance(spec, SpecConfig):
                raise ValueError(f"spec: expected a SpecConfig or None, got {type(spec).__name__}")
            if spec.num_steps > cfg.num_mtp_layers:
                raise ValueError(
                    f"spec.num_steps={spec.num_steps} needs that many MTP layers; the model has {cfg.num_mtp_layers}"
                )
        if eos_id is not None and not 0 <= eos_id < cfg.vocab_size:
            raise ValueError(f"eos_id: expected a token id in [0, {cfg.vocab_size}), got {eos_id}")
        self.cfg = cfg
        self.opts = EngineOptions(spec=spec, implementation=implementation, interpret=interpret)
        self.eos_id = -1 if eos_id is None else int(eos_id)
        self.max_context = int(max_context)
        self.page_size = int(page_size)
        self.num_pages = num_pages
        self.seed = seed
        self.graphdef, state = nnx.split(model)
        self.params, treedef = jax.tree.flatten(state)  # list of parameter arrays
        self._fns = _compiled(self.graphdef, treedef, self.opts)

    # ---------------------------------------------------------------- host-side preparation
    def _check_prompts(self, prompts, max_new_tokens):
        if len(prompts) == 0:
            raise ValueError("prompts: expected at least one prompt, got an empty batch")
        arrs = []
        for i, p in enumerate(prompts):
            a = np.asarray(p)
            if a.ndim != 1 or a.size == 0:
                raise ValueError(f"prompts[{i}]: expected a non-empty 1-D sequence of token ids, got shape {a.shape}")
            if not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"prompts[{i}]: expected integer token ids, got dtype {a.dtype}")
            if a.min() < 0 or a.max() >= self.cfg.vocab_size:
                raise ValueError(f"prompts[{i}]: token ids must be in [0, {self.cfg.vocab_size}), got {a.min()}..{a.max()}")
            arrs.append(a.astype(np.int32))
        b = len(arrs)
        mnt = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (b,)).astype(np.int64)
        if mnt.min() < 1:
            raise ValueError(f"max_new_tokens: expected >= 1 per request, got {mnt.min()}")
        width = self.opts.verify_width
        for i, a in enumerate(arrs):
            need = a.size + int(mnt[i]) + width
            if need > self.max_context:
                raise ValueError(
                    f"prompts[{i}]: context overflow: prompt length {a.size} + max_new_tokens {int(mnt[i])} + "
                    f"verify width {width} = {need} > max_context={self.max_context} (req_to_token width W)"
                )
        return arrs, mnt.astype(np.int32)

    def prepare(self, prompts: Sequence, max_new_tokens) -> tuple:
        """Validate, pad and allocate: returns device ``(state, prompts (B, P), prompt_lens (B,))``."""
        arrs, mnt = self._check_prompts(prompts, max_new_tokens)
        b = len(arrs)
        lens = np.asarray([a.size for a in arrs], np.int32)
        p = min(-(-int(lens.max()) // PROMPT_BUCKET) * PROMPT_BUCKET, self.max_context)
        padded = np.zeros((b, p), np.int32)
        for i, a in enumerate(arrs):
            padded[i, : a.size] = a
        r2t = make_req_to_token(b, self.max_context, self.page_size, num_pages=self.num_pages, seed=self.seed)
        cfg, spec = self.cfg, self.opts.spec
        tcache = init_cache(cfg.num_layers, cfg, r2t, page_size=self.page_size, num_pages=self.num_pages)
        if spec is None:
            dcache = init_cache(1, cfg, np.zeros((b, 1), np.int32), page_size=1, num_pages=1)  # unused placeholder
            x = 1
        else:
            dcache = init_cache(spec.num_steps, cfg, r2t, page_size=self.page_size, num_pages=self.num_pages)
            x = spec.num_steps if spec.topk == 1 else spec.topk
        t = int(mnt.max())
        state = DecodeState(
            target_cache=tcache,
            draft_cache=dcache,
            seq_lens=jnp.zeros((b,), jnp.int32),
            bonus=jnp.zeros((b,), jnp.int32),
            topk_p=jnp.zeros((b, x), jnp.float32),
            topk_index=jnp.zeros((b, x), jnp.int32),
            hidden=jnp.zeros((b, cfg.hidden_size), jnp.float32),
            out_tokens=jnp.zeros((b, t), jnp.int32),
            num_generated=jnp.zeros((b,), jnp.int32),
            max_new_tokens=jnp.asarray(mnt),
            done=jnp.zeros((b,), bool),
            eos_id=jnp.int32(self.eos_id),
            num_rounds=jnp.zeros((b,), jnp.int32),
            num_accepted=jnp.zeros((b,), jnp.int32),
        )
        return state, jnp.asarray(padded), jnp.asarray(lens)

    # ---------------------------------------------------------------- compiled entry points
    def run(self, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array) -> DecodeState:
        """Jitted: prefill + the whole decode ``while_loop``; ``state`` is donated. No host sync."""
        return self._fns.generate(self.params, state, prompts, prompt_lens)

    def run_prefill(self, state, prompts, prompt_lens) -> DecodeState:
        """Jitted prefill (+ draft extend); ``state`` is donated."""
        return self._fns.prefill(self.params, state, prompts, prompt_lens)

    def run_step(self, state: DecodeState) -> DecodeState:
        """Jitted single round (``spec_step`` or ``plain_step``); ``state`` is donated."""
        return self._fns.step(self.params, state)

    @staticmethod
    def result(state: DecodeState) -> GenerateResult:
        """Read a finished state back to the host."""
        out = np.asarray(state.out_tokens)
        num = np.asarray(state.num_generated)
        return GenerateResult(
            tokens=[out[i, : num[i]] for i in range(out.shape[0])],
            num_rounds=np.asarray(state.num_rounds),
            num_accepted=np.asarray(state.num_accepted),
        )

    def generate(self, prompts: Sequence, max_new_tokens) -> GenerateResult:
        """Greedy generation, whole loop on device (one XLA ``while_loop``)."""
        return self.result(self.run(*self.prepare(prompts, max_new_tokens)))

    def generate_host_driven(self, prompts: Sequence, max_new_tokens) -> GenerateResult:
        """Greedy generation with one jitted call per round and a host ``done`` poll per round."""
        state = self.run_prefill(*self.prepare(prompts, max_new_tokens))
        while not bool(jnp.all(state.done)):
            state = self.run_step(state)
        return self.result(state)
