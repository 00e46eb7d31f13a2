"""Host boundary of the decode loops: protocol checks, memory estimate, validation, allocation, and the
compiled entry points.

``Engine.generate`` runs prefill and the whole decode loop in ONE jitted call (``lax.while_loop`` over
``spec_step`` / ``plain_step`` with per-request stopping; no host sync until the result is read).
``Engine.generate_host_driven`` runs one jitted call per round and polls ``done`` on the host (for the
benchmark). All checks that could otherwise corrupt the cache (context overflow, page exhaustion, empty
or out-of-vocabulary prompts) raise ``ValueError`` here, before anything is traced; the KV pools are
sized at construction and refused up front when they would not fit in memory.

Compile-cache buckets: the batch is padded to the next power of two (padding rows are done from the
start and use the dummy page), the output buffer to the next power of two of the largest
``max_new_tokens`` (the per-request limit is an array), prompts to a multiple of ``PROMPT_BUCKET``; the
pool size is fixed per engine. So one executable serves every batch size and limit within a bucket.
"""

import dataclasses
import functools
import os
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import checkify

from jaxspec._validate import checks_enabled
from jaxspec.config import SpecConfig
from jaxspec.engine.policy import AdaptivePolicy, PolicyState, init_policy_state
from jaxspec.engine.simulate import SimulatedAccept
from jaxspec.engine.state import DecodeState, EngineOptions, SamplingParams
from jaxspec.engine.step import decode_loop, decode_step, draft_spec_max_accept, prefill
from jaxspec.kernels._dispatch import next_pow2
from jaxspec.protocols import Drafter, TargetModel, check_implements, make_req_to_token, num_pages_needed

PROMPT_BUCKET = 8  # prompts are right-padded to a multiple of this (fewer recompiles across batches)
MIN_OUTPUT_BUCKET = 8  # smallest output-buffer width T
MEMORY_FRACTION = 0.7  # default share of free memory the KV pools may take (the rest: weights, activations)


class GenerateResult(NamedTuple):
    """Host-side result: per-request generated ids, plus acceptance statistics."""

    tokens: list  # list[np.ndarray int32], generated tokens of each request (prefill token included)
    num_rounds: np.ndarray  # i32[B] decode rounds (verify steps) while the request was active
    num_accepted: np.ndarray  # i32[B] tokens committed by those rounds (sum of accept_lens)
    mode_rounds: np.ndarray | None = None  # adaptive engines: i32[M] batch rounds per mode (0 = plain)

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify round over the batch (plain decoding: 1.0)."""
        return float(self.num_accepted.sum()) / max(1, int(self.num_rounds.sum()))


class _Compiled(NamedTuple):
    prefill: object
    step: object
    generate: object
    decode: object


def _checked(fn, checks: bool):
    """With checks on, functionalise the ``checkify.check``s traced into the kernels (``JAXSPEC_CHECKS``):
    the jitted function then returns ``(error, out)`` and the caller raises before reading ``out``."""
    return checkify.checkify(fn, errors=checkify.user_checks) if checks else fn


@functools.lru_cache(maxsize=64)
def _compiled(graphdef, treedef, opts: EngineOptions, checks: bool) -> _Compiled:
    """Jitted entry points for one ((target, drafter) structure, options, checks) key, shared by every
    Engine with equal keys (trained and random weights, any EOS share one executable per input shape).

    ``graphdef`` is closed over instead of being a static argument, and each Engine looks its entry points up
    here once per checks setting (``Engine._entry_points``): hashing an NNX GraphDef costs ~3 ms (the demo
    pair's 24 layers on CPU: 4.3 ms of a 1-round decode call's 5 ms went to this cache key). Params
    travel as a flat list of leaves (``treedef`` closed over too): flattening an NNX State costs ~0.5 ms.
    """

    def _models(leaves):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

    def _prefill(params, state, prompts, lens):
        target, drafter = _models(params)
        return prefill(target, drafter, opts, state, prompts, lens)

    def _step(params, state):
        return decode_step(*_models(params), opts, state)

    def _generate(params, state, prompts, lens):
        target, drafter = _models(params)
        state = prefill(target, drafter, opts, state, prompts, lens)
        return decode_loop(target, drafter, opts, state)

    def _decode(params, state, force_mode, max_rounds):
        return decode_loop(*_models(params), opts, state, force_mode, max_rounds)

    return _Compiled(
        prefill=jax.jit(_checked(_prefill, checks), donate_argnums=(1,)),
        step=jax.jit(_checked(_step, checks), donate_argnums=(1,)),
        generate=jax.jit(_checked(_generate, checks), donate_argnums=(1,)),
        decode=jax.jit(_checked(_decode, checks), donate_argnums=(1,)),
    )


def _pad(x: np.ndarray, b: int, fill) -> np.ndarray:
    out = np.full((b,), fill, x.dtype)
    out[: x.size] = x
    return out


def _free_memory_bytes() -> tuple[int, str]:
    """Free memory of the default device (GPU: allocator limit minus use; CPU: ``MemAvailable``)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), f"{jax.devices()[0]} free memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "host MemAvailable"
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host physical memory"


def _split_models(target, drafter):
    """One NNX split of ``(target, drafter)`` (shared weights, e.g. an MTP head inside the target, travel
    once); every leaf must be an array."""
    graphdef, state = nnx.split((target, drafter))
    leaves, treedef = jax.tree.flatten(state)
    for leaf in leaves:
        if not isinstance(leaf, jax.Array):
            raise ValueError(
                f"target / drafter: expected pytrees of jax arrays or NNX modules, found a leaf of type "
                f"{type(leaf).__name__} (mark configuration fields static)"
            )
    return graphdef, treedef, leaves


def _check_verify(verify, threshold_single, threshold_acc, spec, drafter) -> tuple[float, float]:
    if verify not in ("target_only", "draft_probs"):
        raise ValueError(f"verify: expected 'target_only' or 'draft_probs', got {verify!r}")
    out = []
    for name, x in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= float(x) <= 1.0:
            raise ValueError(f"{name}: expected a float in [0, 1] (1.0 = lossless), got {x!r}")
        out.append(float(x))
    if verify == "draft_probs":
        if spec is None or spec.topk != 1:
            raise ValueError(
                f"verify='draft_probs': implemented for chains (spec.topk == 1) only, got spec={spec}. For trees the "
                "rule is exact only if siblings are drawn without replacement from the draft distribution and "
                "each rejection recurses on the residual norm(max(p - q, 0)) (SpecInfer-style); jaxspec's "
                "MTP trees take siblings top-k, for which it is not exact. Use verify='target_only' for trees."
            )
        if not getattr(drafter, "sample_drafts", False):
            raise ValueError(
                f"drafter: verify='draft_probs' needs a drafter that samples its chain and returns the draft "
                f"probabilities (attribute sample_drafts=True, e.g. MTPDrafter(model, sample_drafts=True)); "
                f"{type(drafter).__name__} does not"
            )
        if out != [1.0, 1.0]:
            raise ValueError(f"threshold_single / threshold_acc: apply to verify='target_only' only, got {out}")
    return out[0], out[1]


def _per_request(name: str, x, b: int, dtype) -> np.ndarray:
    """A scalar or one value per request -> ``np.ndarray (b,)`` (``None`` entries kept as NaN for floats)."""
    a = np.asarray(x, dtype=object if dtype is None else None)
    if a.ndim == 0:
        a = np.full((b,), a.item(), dtype=object)
    if a.ndim != 1 or a.shape[0] != b:
        raise ValueError(f"{name}: expected a scalar or one value per request ({b}), got shape {np.shape(x)}")
    return a.astype(object)


def _check_sampling(b: int, vocab: int, temperature, top_k, top_p, seed) -> tuple[np.ndarray, ...]:
    """Host-boundary checks of the sampling parameters; errors name the request index and the parameter."""

    def each(name, x, ok, want):
        vals = _per_request(name, x, b, None)
        for i, v in enumerate(vals):
            if not ok(v):
                raise ValueError(f"{name}[{i}] (request {i}): expected {want}, got {v!r}")
        return vals

    def real(v):
        return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))

    def integer(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    t = each("temperature", temperature, lambda v: real(v) and np.isfinite(v) and v >= 0,
             "a finite float >= 0 (0 = greedy)")
    k = each("top_k", -1 if top_k is None else top_k,
             lambda v: v is None or (integer(v) and (v == -1 or 1 <= v <= vocab)),
             f"an int in [1, {vocab}] (the vocabulary size), or -1 / None = off")
    p = each("top_p", top_p, lambda v: real(v) and 0 < v <= 1, "a float in (0, 1]")
    s = each("seed", seed, lambda v: integer(v) and 0 <= v < 2**31, "an int in [0, 2**31)")
    k = np.array([vocab if v is None or v == -1 else int(v) for v in k], np.int32)
    return t.astype(np.float32), k, p.astype(np.float32), s.astype(np.int32)


def _check_distinct_buffers(**trees) -> None:
    """The decode state is donated: two leaves sharing one device buffer would be donated twice (XLA then
    fails mid-generate with "Attempt to donate the same buffer twice"). Refuse it here, naming both."""
    seen: dict[int, str] = {}
    for name, tree in trees.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not isinstance(leaf, jax.Array):
                continue
            where = name + jax.tree_util.keystr(path)
            if id(leaf) in seen:
                raise ValueError(
                    f"{where} and {seen[id(leaf)]} are the same array: the engine donates its state, so "
                    f"make_cache / init_state must return a separate buffer for each (e.g. k and v)"
                )
            seen[id(leaf)] = where


class Engine:
    """Greedy or sampled decoding of any ``TargetModel`` with a ``Drafter`` (``spec``) or plain (``spec=None``).

    Args:
      target: a ``jaxspec.protocols.TargetModel`` (pytree of arrays or NNX module).
      drafter: a ``jaxspec.protocols.Drafter`` (e.g. ``jaxspec.models.MTPDrafter(model)``); required with
        ``spec``, ``None`` for plain decoding.
      spec: ``SpecConfig(S, K, N)``; chain ``K == 1`` (``N == S + 1``) or tree ``K > 1``.
      max_context: ``W``, tokens reserved per request (``prompt + max_new_tokens + N <= W``).
      page_size: KV page size ``G`` (pages of a request are shuffled, page 0 is the dummy page).
      max_batch: the most requests one ``generate`` takes (sizes the default pool).
      num_pages: KV pool size in pages (default: ``max_batch`` full requests + the dummy page); too few
        for a batch raises ``ValueError`` at ``prepare``.
      eos_id: stop token, or None.
      implementation / interpret: forwarded to the kernels of the round (see ``EngineOptions``).
      memory_limit_bytes: what the pools may take (default ``MEMORY_FRACTION`` of the free memory);
        a pool that needs more is refused here, with the bytes it would need.
      verify: how batches with sampling verify (greedy batches always verify greedily):
        ``"target_only"`` (default): SGLang's target-only tree rejection sampling, drafts taken top-k
        (``eagle_sample(greedy=False)``); exact (lossless in distribution) with thresholds 1.0 / 1.0.
        ``"draft_probs"``: the classic rule ``min(1, p/q)`` with the drafter's SAMPLED chain and its
        probabilities (``ops.verify.chain_speculative_sampling``); chains only (``K == 1``) and a drafter
        that samples (``MTPDrafter(model, sample_drafts=True)``); exact for any ``q``.
      threshold_single / threshold_acc: SGLang's acceptance thresholds for ``"target_only"`` in ``[0, 1]``
        (static; 1.0 = lossless, lower = more accepted drafts and a biased distribution).
      adaptive: ``None`` (default: every round speculates with ``spec``), or ``True`` / an
        ``AdaptivePolicy``: each round chooses between plain decoding and the draft shapes in ``spec`` (a
        ``SpecConfig`` or a sequence of them) by measured round cost at the batch bucket and running
        acceptance (``jaxspec.engine.policy``; lossless in every mode). Costs are measured on the device the
        first time a batch bucket is generated (``calibrate``; ``round_costs`` holds them). What the policy
        learned about acceptance carries from one decode call to the next (``policy_memory``, per batch
        bucket; ``AdaptivePolicy(warm_start=False)`` or ``policy_memory.clear()`` to start afresh).
      simulate_accept: BENCHMARKING ONLY, never lossless: a ``SimulatedAccept`` that forces the accept
        length of every speculative round (SGLang's ``SIMULATE_ACC_LEN``; ``jaxspec.engine.simulate``).

    Sampling: ``generate(..., temperature=, top_k=, top_p=, seed=)`` per request (see ``prepare``). A batch
    whose temperatures are all 0 runs the greedy executable (bit-identical to the greedy loop); any other
    batch runs the sampling executable (one per engine and shape bucket; the values are arrays, so new
    values never recompile), in which temperature-0 requests still decode greedily.
    """

    def __init__(
        self,
        target,
        drafter=None,
        *,
        spec: SpecConfig | None = None,
        max_context: int = 256,
        page_size: int = 1,
        max_batch: int = 8,
        num_pages: int | None = None,
        eos_id: int | None = None,
        implementation: str = "auto",
        interpret: bool = False,
        seed: int = 0,
        memory_limit_bytes: int | None = None,
        verify: str = "target_only",
        threshold_single: float = 1.0,
        threshold_acc: float = 1.0,
        adaptive: "AdaptivePolicy | bool | None" = None,
        simulate_accept: SimulatedAccept | None = None,
    ):
        check_implements(target, TargetModel, "target")
        if adaptive is True:
            adaptive = AdaptivePolicy()
        if adaptive is not None and adaptive is not False and not isinstance(adaptive, AdaptivePolicy):
            raise ValueError(f"adaptive: expected None, True or an AdaptivePolicy, got {adaptive!r}")
        adaptive = adaptive or None
        specs = ()
        if adaptive is not None:
            specs = (spec,) if isinstance(spec, SpecConfig) else tuple(spec or ())
            if not specs or not all(isinstance(x, SpecConfig) for x in specs) or len(set(specs)) != len(specs):
                raise ValueError(f"spec: adaptive speculation needs one or more distinct SpecConfigs (the draft "
                                 f"shapes to choose from besides plain decoding), got {spec!r}")
            spec = None
        elif spec is not None and not isinstance(spec, SpecConfig):
            raise ValueError(f"spec: expected a SpecConfig or None (a sequence of them needs adaptive=True), "
                             f"got {type(spec).__name__}")
        if simulate_accept is not None and not isinstance(simulate_accept, SimulatedAccept):
            raise ValueError(f"simulate_accept: expected None or a SimulatedAccept, got {simulate_accept!r}")
        if simulate_accept is not None and drafter is None:
            raise ValueError("simulate_accept: needs speculative decoding (a drafter and spec); plain decoding "
                             "accepts nothing to simulate")
        if (spec is None and not specs) != (drafter is None):
            raise ValueError(
                "drafter: speculative decoding (spec) needs a drafter and plain decoding (spec=None) takes none; "
                f"got spec={spec}, drafter={type(drafter).__name__}"
            )
        if drafter is not None:
            check_implements(drafter, Drafter, "drafter")
        self.vocab_size = int(target.vocab_size)
        for name, v, lo in (("max_context", max_context, 1), ("page_size", page_size, 1), ("max_batch", max_batch, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
        if eos_id is not None and not 0 <= eos_id < self.vocab_size:
            raise ValueError(f"eos_id: expected a token id in [0, {self.vocab_size}), got {eos_id}")
        for x in specs or (spec,):
            thresholds = _check_verify(verify, threshold_single, threshold_acc, x, drafter)
        self.opts = EngineOptions(
            spec=spec, page_size=page_size, implementation=implementation, interpret=interpret, verify=verify,
            threshold_single=thresholds[0], threshold_acc=thresholds[1], specs=specs, adaptive=adaptive,
        )
        self.simulate_accept = simulate_accept
        self.round_costs: dict[int, np.ndarray] = {}  # adaptive: batch bucket -> seconds per round of each mode
        self.policy_memory: dict[int, PolicyState] = {}  # adaptive: batch bucket -> the last call's policy state
        self.eos_id = -1 if eos_id is None else int(eos_id)
        self.max_context = max_context
        self.page_size = page_size
        self.max_batch = max_batch
        self.num_pages = num_pages_needed(max_batch, max_context, page_size) if num_pages is None else int(num_pages)
        self.seed = seed
        self.target, self.drafter = target, drafter
        self.pool_bytes = self._check_memory(memory_limit_bytes)  # drafter.kv_bytes_per_slot also checks spec
        self.graphdef, self._treedef, self.params = _split_models(target, drafter)
        self._entries: dict[bool, _Compiled] = {}  # checks -> jitted entry points (_entry_points)

    # ---------------------------------------------------------------- memory estimate
    def _check_memory(self, limit) -> int:
        slots = self.num_pages * self.page_size
        per_slot = int(self.target.kv_bytes_per_slot())
        for spec in self.opts.draft_specs:
            per_slot += int(self.drafter.kv_bytes_per_slot(spec))
        rows = next_pow2(self.max_batch)
        table = rows * self.max_context * 4  # req_to_token, int32
        need = slots * per_slot + table
        if limit is None:
            free, what = _free_memory_bytes()
            limit = int(free * MEMORY_FRACTION)
            what = f"{MEMORY_FRACTION:.0%} of the {free} bytes of {what}"
        else:
            what = "memory_limit_bytes"
        if need > limit:
            raise ValueError(
                f"max_context={self.max_context}: the KV pools need {need} bytes ({slots} slots x {per_slot} "
                f"bytes per slot (target + drafter) + {table} bytes of req_to_token), more than {limit} bytes "
                f"({what}); lower max_context, max_batch or num_pages"
            )
        return need

    # ---------------------------------------------------------------- host-side preparation
    def _check_prompts(self, prompts, max_new_tokens):
        if len(prompts) == 0:
            raise ValueError("prompts: expected at least one prompt, got an empty batch")
        if len(prompts) > self.max_batch:
            raise ValueError(f"prompts: {len(prompts)} requests exceed max_batch={self.max_batch}")
        arrs = []
        for i, p in enumerate(prompts):
            a = np.asarray(p)
            if a.ndim != 1 or a.size == 0:
                raise ValueError(f"prompts[{i}]: expected a non-empty 1-D sequence of token ids, got shape {a.shape}")
            if not np.issubdtype(a.dtype, np.integer):
                raise ValueError(f"prompts[{i}]: expected integer token ids, got dtype {a.dtype}")
            if a.min() < 0 or a.max() >= self.vocab_size:
                raise ValueError(f"prompts[{i}]: token ids must be in [0, {self.vocab_size}), got {a.min()}..{a.max()}")
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

    def prepare(self, prompts: Sequence, max_new_tokens, *, temperature=0.0, top_k=None, top_p=1.0, seed=0) -> tuple:
        """Validate, pad to the buckets and allocate: returns device ``(state, prompts (B, P), prompt_lens (B,))``
        with ``B`` the batch bucket (rows past ``len(prompts)`` are padding, done from the start).

        Sampling parameters, each a scalar (every request) or a sequence with one value per request:
        ``temperature`` finite ``>= 0`` (0 = greedy); ``top_k`` an int in ``[1, V]``, or ``-1`` / ``None`` =
        off; ``top_p`` in ``(0, 1]`` (1 = off); ``seed`` an int in ``[0, 2**31)`` (the request's coins
        depend on it and on its own round counter only). A bad value raises ``ValueError`` naming the
        parameter and the request index. All temperatures 0 -> the greedy executable (``all_greedy``).
        """
        arrs, mnt = self._check_prompts(prompts, max_new_tokens)
        temps, top_ks, top_ps, seeds = _check_sampling(len(arrs), self.vocab_size, temperature, top_k, top_p, seed)
        n, b = len(arrs), next_pow2(len(arrs))
        lens = np.ones((b,), np.int32)  # padding rows: one token (id 0) on the dummy page
        lens[:n] = [a.size for a in arrs]
        p = min(-(-int(lens.max()) // PROMPT_BUCKET) * PROMPT_BUCKET, self.max_context)
        padded = np.zeros((b, p), np.int32)
        for i, a in enumerate(arrs):
            padded[i, : a.size] = a
        r2t = np.zeros((b, self.max_context), np.int32)  # padding rows: every slot on the dummy page 0
        r2t[:n] = make_req_to_token(n, self.max_context, self.page_size, num_pages=self.num_pages, seed=self.seed)
        num_slots = self.num_pages * self.page_size
        tcache = self.target.make_cache(r2t, num_slots)
        draft = None
        if self.drafter is not None:
            draft = tuple(self.drafter.init_state(spec, r2t, num_slots) for spec in self.opts.draft_specs)
            draft = draft if self.opts.adaptive is not None else draft[0]
        _check_distinct_buffers(target_cache=tcache, draft=draft)
        policy = None
        if self.opts.adaptive is not None:  # uncalibrated (calibrate itself): equal costs, never read there
            cost = self.round_costs.get(b, np.ones((1 + len(self.opts.specs),), np.float32))
            learned = self.policy_memory.get(b) if self.opts.adaptive.warm_start else None
            policy = init_policy_state(cost, draft_spec_max_accept(self.opts.specs), learned)
        simulate = None
        if self.simulate_accept is not None:
            simulate = jnp.asarray(self.simulate_accept.table(max(x.num_steps + 1 for x in self.opts.draft_specs)))
        limits = np.zeros((b,), np.int32)
        limits[:n] = mnt
        t = max(MIN_OUTPUT_BUCKET, next_pow2(int(mnt.max())))
        def zeros():  # a fresh buffer per field: the state is donated, so no two leaves may share one
            return jnp.zeros((b,), jnp.int32)

        state = DecodeState(
            target_cache=tcache,
            draft=draft,
            seq_lens=zeros(),
            bonus=zeros(),
            out_tokens=jnp.zeros((b, t), jnp.int32),
            num_generated=zeros(),
            max_new_tokens=jnp.asarray(limits),
            done=jnp.asarray(np.arange(b) >= n),
            eos_id=jnp.int32(self.eos_id),
            num_rounds=zeros(),
            num_accepted=zeros(),
            sampling=SamplingParams(
                temperature=jnp.asarray(_pad(temps, b, 0.0)),
                top_k=jnp.asarray(_pad(top_ks, b, self.vocab_size)),
                top_p=jnp.asarray(_pad(top_ps, b, 1.0)),
                seed=jnp.asarray(_pad(seeds, b, 0)),
            ),
            policy=policy,
            simulate=simulate,
            all_greedy=bool(np.all(temps == 0)),
        )
        return state, jnp.asarray(padded), jnp.asarray(lens)

    # ---------------------------------------------------------------- compiled entry points
    def _entry_points(self, checks: bool) -> _Compiled:
        """This engine's jitted entry points (``_compiled``, looked up once per checks setting: its key hashes
        the GraphDef, milliseconds per lookup)."""
        if checks not in self._entries:
            self._entries[checks] = _compiled(self.graphdef, self._treedef, self.opts, checks)
        return self._entries[checks]

    def _call(self, name, *args):
        checks = checks_enabled()
        fn = getattr(self._entry_points(checks), name)
        if not checks:
            return fn(self.params, *args)
        err, out = fn(self.params, *args)
        msg = err.get()
        if msg is not None:
            raise ValueError(f"JAXSPEC_CHECKS: a check failed in Engine.{name}: {msg}")
        return out

    def run(self, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array) -> DecodeState:
        """Jitted: prefill + the whole decode ``while_loop``; ``state`` is donated. No host sync (with
        checks on, the error flag is read after the call)."""
        return self._remember(self._call("generate", state, prompts, prompt_lens))

    def run_decode(self, state: DecodeState, *, max_rounds: int | None = None, mode: int | None = None) -> DecodeState:
        """Jitted decode ``while_loop`` from a prefilled state (``run_prefill``; ``state`` donated): until every
        request is done, or ``max_rounds`` rounds. ``mode`` (adaptive engines): force every round to mode
        ``mode`` (0 = plain, ``i`` = ``spec[i - 1]``) instead of the policy's choice. Both are values (no
        recompile)."""
        m = 1 + len(self.opts.specs)
        if mode is not None and (self.opts.adaptive is None or not isinstance(mode, int) or not 0 <= mode < m):
            raise ValueError(f"mode: expected None, or an int in [0, {m}) for an adaptive engine "
                             f"(adaptive={self.opts.adaptive is not None}), got {mode!r}")
        if max_rounds is not None and (not isinstance(max_rounds, int) or not 1 <= max_rounds < 2**31):
            raise ValueError(f"max_rounds: expected None or an int in [1, 2**31), got {max_rounds!r}")
        # explicit transfers (allowed under jax.transfer_guard("disallow")), no jnp op dispatched per call
        rounds = jax.device_put(np.int32(2**31 - 1 if max_rounds is None else max_rounds))
        out = self._call("decode", state, jax.device_put(np.int32(-1 if mode is None else mode)), rounds)
        return out if mode is not None else self._remember(out)  # forced rounds (calibrate) teach nothing

    def _remember(self, state: DecodeState) -> DecodeState:
        """Adaptive engines: keep a copy of ``state``'s policy as its batch bucket's learned policy (warm start of
        the next ``prepare``; device copies, no host sync; the state itself may be donated later)."""
        if state.policy is not None:
            self.policy_memory[int(state.done.shape[0])] = jax.tree.map(jnp.copy, state.policy)
        return state

    def calibrate(self, batch_size: int, *, context: int | None = None, rounds: int | None = None) -> np.ndarray:
        """Adaptive engines: measure the seconds per round of each mode (plain, then each draft shape) at the
        batch bucket of ``batch_size`` on the device, store them in ``round_costs[bucket]`` (read by the
        policy of every later ``prepare`` at that bucket) and return them.

        Runs a throw-away batch of one-token prompts whose committed length is moved to ``context``
        (default: half of ``max_context``; the K/V there are zeros, which costs the same). Per mode: one untimed
        round (the first call of a bucket compiles the decode loop), then a 1-round and a ``1 + rounds``-round
        call of the loop, three times each, whose fastest calls' difference over ``rounds`` is the cost (the call's
        fixed cost cancels). ``rounds`` default: the most, up to 4, whose calibration fits in ``max_context``.
        """
        if self.opts.adaptive is None:
            raise ValueError("calibrate: only adaptive engines (adaptive=True) choose modes by cost")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= self.max_batch:
            raise ValueError(f"batch_size: expected an int in [1, max_batch={self.max_batch}], got {batch_size!r}")
        if rounds is None:  # the most (up to 4) whose calibration rounds fit in max_context
            fits = [r for r in (4, 3, 2, 1)
                    if 1 + self.opts.verify_width + self._calibration_tokens(r) <= self.max_context]
            rounds = fits[0] if fits else 1
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds: expected None or an int >= 1, got {rounds!r}")
        m, width = 1 + len(self.opts.specs), self.opts.verify_width
        max_new = self._calibration_tokens(rounds)
        room = self.max_context - 1 - width - max_new
        if room < 0:
            raise ValueError(f"calibrate: max_context={self.max_context} leaves no room for the calibration rounds "
                             f"(rounds={rounds}: needs > {1 + width + max_new}); lower rounds")
        ctx = min(room, self.max_context // 2 if context is None else int(context))
        if ctx < 0:
            raise ValueError(f"context: expected an int >= 0, got {context!r}")
        b = next_pow2(batch_size)
        costs = np.zeros((m,), np.float32)
        for mode in range(m):  # a fresh batch per mode (the previous one's pools are freed first)
            state = None
            state, prompts, lens = self.prepare([np.zeros((1,), np.int32)] * batch_size, max_new)
            state = self.run_prefill(state, prompts, lens)
            active = ~state.done
            state = dataclasses.replace(state, seq_lens=jnp.where(active, state.seq_lens + ctx, state.seq_lens))
            state = self.run_decode(state, max_rounds=1, mode=mode)  # untimed (the bucket's first call compiles)
            elapsed = {1: [], 1 + rounds: []}
            for _ in range(3):
                for trips in elapsed:  # the difference cancels the call's fixed cost (dispatch, loop entry)
                    state = jax.block_until_ready(state)
                    t0 = time.perf_counter()
                    state = jax.block_until_ready(self.run_decode(state, max_rounds=trips, mode=mode))
                    elapsed[trips].append(time.perf_counter() - t0)
            # the fastest call of each length: a call's fixed cost varies (measured on the H200 with the loop in
            # one CUDA graph: single pairs gave plain decoding 0 s per round), and noise only adds time
            costs[mode] = max(min(elapsed[1 + rounds]) - min(elapsed[1]), 1e-9 * rounds) / rounds
        self.round_costs[b] = costs
        return costs

    def run_prefill(self, state, prompts, prompt_lens) -> DecodeState:
        """Jitted prefill (+ draft extend); ``state`` is donated."""
        return self._call("prefill", state, prompts, prompt_lens)

    def run_step(self, state: DecodeState) -> DecodeState:
        """Jitted single round (``spec_step`` or ``plain_step``); ``state`` is donated."""
        return self._call("step", state)

    @staticmethod
    def result(state: DecodeState, num_requests: int | None = None) -> GenerateResult:
        """Read a finished state back to the host (the first ``num_requests`` rows; default: every row
        that was not batch padding, i.e. that generated a token)."""
        out = np.asarray(state.out_tokens)
        num = np.asarray(state.num_generated)
        # Real rows come first and generate >= 1 token (prefill's); padding rows generate none.
        r = int(np.count_nonzero(num)) if num_requests is None else num_requests
        return GenerateResult(
            tokens=[out[i, : num[i]] for i in range(r)],
            num_rounds=np.asarray(state.num_rounds)[:r],
            num_accepted=np.asarray(state.num_accepted)[:r],
            mode_rounds=None if state.policy is None else np.asarray(state.policy.mode_rounds),
        )

    def generate(
        self, prompts: Sequence, max_new_tokens, *, temperature=0.0, top_k=None, top_p=1.0, seed=0
    ) -> GenerateResult:
        """Generation, whole loop on device (one XLA ``while_loop``); greedy by default, sampling with the
        per-request ``temperature`` / ``top_k`` / ``top_p`` / ``seed`` (scalars or sequences, see ``prepare``)."""
        kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        self._ensure_calibrated(len(prompts))
        return self.result(self.run(*self.prepare(prompts, max_new_tokens, **kw)), len(prompts))

    def _calibration_tokens(self, rounds: int) -> int:
        """Tokens one mode's calibration rounds may commit (untimed + 3 timed pairs, each round <= S + 1)."""
        return (7 + 3 * rounds) * int(max(draft_spec_max_accept(self.opts.specs))) + 1

    def _ensure_calibrated(self, batch_size: int) -> None:
        if self.opts.adaptive is not None and 0 < batch_size <= self.max_batch:
            if next_pow2(batch_size) not in self.round_costs:
                self.calibrate(batch_size)

    def generate_host_driven(
        self, prompts: Sequence, max_new_tokens, *, temperature=0.0, top_k=None, top_p=1.0, seed=0
    ) -> GenerateResult:
        """``generate`` with one jitted call per round and a host ``done`` poll per round."""
        kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        self._ensure_calibrated(len(prompts))
        state = self.run_prefill(*self.prepare(prompts, max_new_tokens, **kw))
        while not bool(jnp.all(state.done)):
            state = self.run_step(state)
        return self.result(self._remember(state), len(prompts))
