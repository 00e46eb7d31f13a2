"""``Engine``: the host boundary of the decode loops.

``Engine.generate`` dispatches the prefill and then the whole decode loop (``lax.while_loop`` over
``spec_step`` / ``plain_step`` with per-request stopping), two executables and no host sync until the
result is read; the decode loop's executable serves prompts of every length.
``Engine.generate_host_driven`` runs one jitted call per round and polls ``done`` on the host (for the
benchmark). What it is given is checked before anything is traced (``engine.checks``: context overflow,
page exhaustion, empty or out-of-vocabulary prompts raise ``ValueError``); the KV pools are sized at
construction and refused up front when they would not fit in memory (``engine.memory``, which also holds
the compile-cache buckets); the jitted entry points live in ``engine.compiled``, the calibration of
adaptive engines in ``engine.calibrate``. The slot API (``fresh_slots``, ``prefill_slots``, ``decode_slots``;
``engine.slots``) is what the serving core runs requests with: ``run_prefill`` / ``run_decode`` are its
whole-batch case; ``lower_prefill_slots`` / ``lower_decode_slots`` lower their executables without running them
(the serving core's warm-up compiles them in parallel).
"""

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec._validate import checks_enabled
from jaxspec.config import SpecConfig
from jaxspec.engine import calibrate as _calibrate
from jaxspec.engine.checks import (check_batch_invariant, check_distinct_buffers, check_engine_args, check_prompts,
                                   check_sampling, check_speculation, check_verify, is_int)
from jaxspec.engine.compiled import EntryPoints, entry_points, split_models
from jaxspec.engine.memory import allocate_state, check_pool_bytes, padded_prompts
from jaxspec.engine.policy import AdaptivePolicy, PolicyState, init_policy_state
from jaxspec.engine.simulate import SimulatedAccept
from jaxspec.engine.slots import SlotChunks
from jaxspec.engine.state import DecodeState, EngineOptions
from jaxspec.engine.step import draft_spec_max_accept, prefill_lookahead
from jaxspec.kernels import Implementation, next_pow2
from jaxspec.protocols import PagedKVCache, TargetModel, check_implements, make_req_to_token, num_pages_needed


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
      batch_invariant: run the target's forwards batch-invariant (``AttentionMetadata.batch_invariant``): each
        token's logits are computed with a reduction order that does not depend on the rows sharing the
        forward, so greedy speculative output equals plain greedy output token for token in bf16 as in f32,
        and a request's output does not depend on its batch, its row or how its prompt was chunked (for the
        same weights, dtype, device kind and jax version; docs/serving.md, "Batch-invariant mode"). Needs a
        target with ``supports_batch_invariant = True`` (``jaxspec.models.Decoder``). The target's invariant
        kernels follow ``implementation``: ``"reference"`` runs their jnp references, any other value their
        Pallas kernels where they run (``interpret`` as for the others); the drafter keeps the default kernels.
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
        implementation: Implementation = "auto",
        interpret: bool = False,
        seed: int = 0,
        memory_limit_bytes: int | None = None,
        verify: str = "target_only",
        threshold_single: float = 1.0,
        threshold_acc: float = 1.0,
        adaptive: "AdaptivePolicy | bool | None" = None,
        simulate_accept: SimulatedAccept | None = None,
        batch_invariant: bool = False,
    ):
        check_implements(target, TargetModel, "target")
        check_batch_invariant(batch_invariant, target)
        specs, adaptive = check_speculation(spec, drafter, adaptive, simulate_accept)
        self.vocab_size = int(target.vocab_size)
        args = check_engine_args(
            vocab_size=self.vocab_size, max_context=max_context, page_size=page_size, max_batch=max_batch,
            num_pages=num_pages, eos_id=eos_id, implementation=implementation, interpret=interpret, seed=seed,
            memory_limit_bytes=memory_limit_bytes)
        max_context, page_size, max_batch = args["max_context"], args["page_size"], args["max_batch"]
        for x in specs or (None,):
            thresholds = check_verify(verify, threshold_single, threshold_acc, x, drafter)
        self.opts = EngineOptions(
            specs=specs, page_size=page_size, implementation=implementation, interpret=interpret, verify=verify,
            threshold_single=thresholds[0], threshold_acc=thresholds[1], adaptive=adaptive,
            batch_invariant=batch_invariant,
        )
        self.simulate_accept = simulate_accept
        self.round_costs: dict[int, np.ndarray] = {}  # adaptive: batch bucket -> seconds per round of each mode
        self.policy_memory: dict[int, PolicyState] = {}  # adaptive: batch bucket -> the last call's policy state
        self.eos_id = -1 if args["eos_id"] is None else args["eos_id"]
        self.max_context = max_context
        self.page_size = page_size
        self.max_batch = max_batch
        self.num_pages = args["num_pages"] or num_pages_needed(max_batch, max_context, page_size)
        self.seed = args["seed"]
        self.target, self.drafter = target, drafter
        self.pool_bytes = check_pool_bytes(  # drafter.kv_bytes_per_slot also checks spec
            target, drafter, self.opts.specs, num_pages=self.num_pages, page_size=page_size,
            max_batch=max_batch, max_context=max_context, limit=args["memory_limit_bytes"])
        self.graphdef, self.treedef, self.params = split_models(target, drafter)
        self._entries: dict[bool, EntryPoints] = {}  # checks -> jitted entry points (_entry_points)
        self._decode_consts: dict[bool, tuple] = {}  # decode_slots' first_finish -> (mode, finish) on the device

    # ---------------------------------------------------------------- host-side preparation
    def prepare(self, prompts: Sequence, max_new_tokens, *, temperature=0.0, top_k=None, top_p=1.0, seed=0) -> tuple:
        """Validate, pad to the buckets and allocate: returns device ``(state, prompts (B, P), prompt_lens (B,))``
        with ``B`` the batch bucket (rows past ``len(prompts)`` are padding, done from the start).

        Sampling parameters, each a scalar (every request) or a sequence with one value per request:
        ``temperature`` finite ``>= 0`` (0 = greedy); ``top_k`` an int in ``[1, V]``, or ``-1`` / ``None`` =
        off; ``top_p`` in ``(0, 1]`` (1 = off); ``seed`` an int in ``[0, 2**31)`` (the request's coins
        depend on it and on its own round counter only). A bad value raises ``ValueError`` naming the
        parameter and the request index. All temperatures 0 -> the greedy executable (``all_greedy``).
        """
        arrs, mnt = check_prompts(prompts, max_new_tokens, max_batch=self.max_batch, vocab_size=self.vocab_size,
                                  max_context=self.max_context, verify_width=self.opts.verify_width)
        sampling = check_sampling(len(arrs), self.vocab_size, temperature, top_k, top_p, seed)
        n = len(arrs)
        padded, lens = padded_prompts(arrs, self.max_context)
        b = lens.shape[0]
        r2t = np.zeros((b, self.max_context), np.int32)  # padding rows: every slot on the dummy page 0
        r2t[:n] = make_req_to_token(n, self.max_context, self.page_size, num_pages=self.num_pages, seed=self.seed)
        num_slots = self.num_pages * self.page_size
        tcache = self.target.make_cache(r2t, num_slots)
        draft = tuple(self.drafter.init_state(spec, r2t, num_slots) for spec in self.opts.specs)
        check_distinct_buffers(target_cache=tcache, draft=draft)
        policy = None
        if self.opts.adaptive is not None:  # uncalibrated (calibrate itself): equal costs, never read there
            cost = self.round_costs.get(b, np.ones((1 + len(self.opts.specs),), np.float32))
            learned = self.policy_memory.get(b) if self.opts.adaptive.warm_start else None
            policy = init_policy_state(cost, draft_spec_max_accept(self.opts.specs), learned)
        simulate = None
        if self.simulate_accept is not None:
            simulate = jnp.asarray(self.simulate_accept.table(max(x.num_steps + 1 for x in self.opts.specs)))
        state = allocate_state(tcache, draft, num_requests=n, max_new_tokens=mnt, eos_id=self.eos_id,
                               sampling=sampling, vocab_size=self.vocab_size, policy=policy, simulate=simulate)
        return state, jnp.asarray(padded), jnp.asarray(lens)

    # ---------------------------------------------------------------- compiled entry points
    def _entry_points(self, checks: bool) -> EntryPoints:
        """This engine's jitted entry points (``compiled.entry_points``, looked up once per checks setting: its
        key hashes the GraphDef, milliseconds per lookup)."""
        if checks not in self._entries:
            self._entries[checks] = entry_points(self.graphdef, self.treedef, self.opts, checks)
        return self._entries[checks]

    def _lower(self, name, *args, **static) -> jax.stages.Lowered:
        """``_call``'s executable traced and lowered for these arguments, not compiled, not run (nothing donated)."""
        return getattr(self._entry_points(checks_enabled()), name).lower(self.params, *args, **static)

    def _call(self, name, *args, **static):
        checks = checks_enabled()
        fn = getattr(self._entry_points(checks), name)
        if not checks:
            return fn(self.params, *args, **static)
        err, out = fn(self.params, *args, **static)
        msg = err.get()
        if msg is not None:
            raise ValueError(f"JAXSPEC_CHECKS: a check failed in Engine.{name}: {msg}")
        return out

    def run(self, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array) -> DecodeState:
        """Jitted prefill, then the whole decode ``while_loop`` (``run_prefill`` + ``run_decode``); ``state`` is
        donated. No host sync (with checks on, the error flag is read after each call)."""
        return self.run_decode(self.run_prefill(state, prompts, prompt_lens))

    def run_host_driven(self, state: DecodeState, prompts: jax.Array, prompt_lens: jax.Array) -> DecodeState:
        """Jitted prefill, then one jitted round per call (``run_step``) until the host reads every request
        done; ``state`` is donated."""
        state = self.run_prefill(state, prompts, prompt_lens)
        while not bool(jnp.all(state.done)):
            state = self.run_step(state)
        return self._remember(state)

    def run_decode(self, state: DecodeState, *, max_rounds: int | None = None, mode: int | None = None) -> DecodeState:
        """Jitted decode ``while_loop`` from a prefilled state (``run_prefill``; ``state`` donated): until every
        request is done, or ``max_rounds`` rounds. ``mode`` (adaptive engines): force every round to mode
        ``mode`` (0 = plain, ``i`` = ``spec[i - 1]``) instead of the policy's choice. Both are values (no
        recompile)."""
        m = 1 + len(self.opts.specs)
        if mode is not None and (self.opts.adaptive is None or not is_int(mode) or not 0 <= mode < m):
            raise ValueError(f"mode: expected None, or an int in [0, {m}) for an adaptive engine "
                             f"(adaptive={self.opts.adaptive is not None}), got {mode!r}")
        if max_rounds is not None and (not is_int(max_rounds) or not 1 <= max_rounds < 2**31):
            raise ValueError(f"max_rounds: expected None or an int in [1, 2**31), got {max_rounds!r}")
        # explicit transfers (allowed under jax.transfer_guard("disallow")), no jnp op dispatched per call
        args = jax.device_put((np.int32(-1 if mode is None else int(mode)),
                               np.int32(2**31 - 1 if max_rounds is None else int(max_rounds)), np.bool_(False)))
        out = self._call("decode", state, *args, bucket=int(state.done.shape[0]))
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
        fixed cost cancels). Where some mode's difference is not positive (rounds cheaper than the timing noise: a
        tiny model), every mode is priced at its longer call's time per round instead (fixed cost included), never
        at ~0. ``rounds`` default: the most, up to 4, whose calibration fits in ``max_context``.
        """
        return _calibrate.calibrate(self, batch_size, context=context, rounds=rounds)

    def lower_calibration(self, batch_size: int, *, context: int | None = None, rounds: int | None = None
                          ) -> list[jax.stages.Lowered]:
        """The executables ``calibrate(batch_size, context=, rounds=)`` runs (its throw-away batch's prefill and
        decode loop), lowered for that batch but neither compiled nor run, as ``lower_prefill_slots``:
        ``.compile()`` each (from any thread) and a later ``calibrate`` of the same batch bucket finds them
        compiled. Same checks as ``calibrate``."""
        return _calibrate.lower_calibration(self, batch_size, context=context, rounds=rounds)

    def run_prefill(self, state, prompts, prompt_lens) -> DecodeState:
        """Jitted prefill (+ draft extend) of a prepared batch, prompt ``i`` into row ``i`` (``prefill_slots``);
        ``state`` is donated."""
        return self._call("prefill", state, SlotChunks(prompts, prompt_lens))

    # ---------------------------------------------------------------- the slot API (engine.slots)
    @property
    def prefill_lookahead(self) -> int:
        """Prompt tokens past a non-final chunk that its prefill reads (``SlotChunks.following``'s least width:
        1, or a drafter's own, e.g. MTP's ``S``)."""
        return prefill_lookahead(self.drafter, self.opts)

    @property
    def num_slots(self) -> int:
        """Rows of ``fresh_slots``: ``max_batch`` rounded up to a power of two."""
        return next_pow2(self.max_batch)

    def fresh_slots(self, *, all_greedy: bool = True) -> DecodeState:
        """A slot state of ``num_slots`` rows, every row done with its token table on the dummy page (page 0),
        an output buffer of ``next_pow2(max_context)`` tokens per row; ``all_greedy=False``: the sampling
        executables (per-row parameters come with each request's chunks). Adaptive engines: one policy for
        the batch, priced at ``round_costs[num_slots]`` (calibrated here when missing)."""
        if not isinstance(all_greedy, bool):
            raise ValueError(f"all_greedy: expected a bool, got {all_greedy!r}")
        b, w = self.num_slots, self.max_context
        r2t = np.zeros((b, w), np.int32)  # every slot on the dummy page
        num_slots = self.num_pages * self.page_size
        tcache = self.target.make_cache(r2t, num_slots)
        draft = tuple(self.drafter.init_state(spec, r2t, num_slots) for spec in self.opts.specs)
        check_distinct_buffers(target_cache=tcache, draft=draft)
        policy = None
        if self.opts.adaptive is not None:  # one policy for the batch, learning across calls (a warm start)
            if b not in self.round_costs:
                self.calibrate(min(b, self.max_batch))
            policy = init_policy_state(self.round_costs[b], draft_spec_max_accept(self.opts.specs))
        sampling = check_sampling(b, self.vocab_size, 0.0, None, 1.0, 0)
        state = allocate_state(tcache, draft, num_requests=b, max_new_tokens=np.full((b,), next_pow2(w), np.int32),
                               eos_id=self.eos_id, sampling=sampling, vocab_size=self.vocab_size, policy=policy,
                               simulate=None)
        state = dataclasses.replace(state, done=jnp.ones((b,), bool), max_new_tokens=jnp.zeros((b,), jnp.int32),
                                    all_greedy=all_greedy)
        for path, leaf in jax.tree_util.tree_flatten_with_path(  # the policy belongs to the batch
                dataclasses.replace(state, policy=None), is_leaf=lambda x: isinstance(x, PagedKVCache))[0]:
            if not isinstance(leaf, PagedKVCache) and leaf.ndim and leaf.shape[0] != b:
                raise ValueError(f"target / drafter: the decode state's leaf {jax.tree_util.keystr(path)} has shape "
                                 f"{leaf.shape}; a slot-indexed leaf (leading dimension {b}) was expected")
        return state

    def prefill_slots(self, state: DecodeState, chunks: SlotChunks, *, final: bool) -> DecodeState:
        """One jitted call prefilling ``chunks`` into their slots (``engine.slots.prefill_slots``): ``final``,
        every chunk ends its prompt (its first token sampled), else none does; ``state`` is donated."""
        return self._call("prefill" if final else "prefill_chunk", state, chunks)

    def decode_slots(self, state: DecodeState, *, bucket: int, rounds: jax.Array, first_finish: bool = True
                     ) -> DecodeState:
        """One jitted call of up to ``rounds`` (a device ``i32[]``: any value shares the executable) decode
        rounds over the slot bucket ``[0, bucket)`` (``engine.slots.decode_slots``; ``bucket`` a power of two
        up to the state's rows), left at the first finish of a row decoding at the start when
        ``first_finish``; ``state`` is donated. Adaptive engines use the state's policy as it is (its
        ``round_cost`` the caller's)."""
        return self._call("decode", state, *self._decode_args(state, bucket, rounds, first_finish),
                          bucket=int(bucket))

    def _decode_args(self, state: DecodeState, bucket, rounds, first_finish) -> tuple:
        """``decode_slots``'s checked ``bucket`` and its traced arguments after the state."""
        if not is_int(bucket) or bucket < 1 or bucket > state.done.shape[0] or bucket & (bucket - 1):
            raise ValueError(f"bucket: expected a power of two in [1, {state.done.shape[0]}], got {bucket!r}")
        if not isinstance(first_finish, (bool, np.bool_)):
            raise ValueError(f"first_finish: expected a bool, got {first_finish!r}")
        key = bool(first_finish)
        if key not in self._decode_consts:  # device scalars made once: no transfer per serving step
            self._decode_consts[key] = jax.device_put((np.int32(-1), np.bool_(key)))
        mode, finish = self._decode_consts[key]
        return mode, rounds, finish

    def lower_prefill_slots(self, state: DecodeState, chunks: SlotChunks, *, final: bool) -> jax.stages.Lowered:
        """The executable ``prefill_slots(state, chunks, final=final)`` would run, traced and lowered for these
        arguments but neither compiled nor run (``state`` is not donated, nothing is read): ``.compile()`` it,
        from any thread (XLA's compile releases the GIL, so several compile at once), and a later
        ``prefill_slots`` call on arrays of the same shapes, dtypes and devices runs that executable without
        compiling. Lower under the ``JAXSPEC_CHECKS`` setting the call will run under (checked executables
        differ). Run the lowering itself on one thread (tracing is Python)."""
        if not isinstance(chunks, SlotChunks):
            raise ValueError(f"chunks: expected a jaxspec.engine.SlotChunks, got {type(chunks).__name__}")
        if not isinstance(final, bool):
            raise ValueError(f"final: expected a bool, got {final!r}")
        return self._lower("prefill" if final else "prefill_chunk", state, chunks)

    def lower_decode_slots(self, state: DecodeState, *, bucket: int, rounds: jax.Array, first_finish: bool = True
                           ) -> jax.stages.Lowered:
        """The executable ``decode_slots(state, bucket=bucket, rounds=rounds, first_finish=first_finish)`` would
        run, lowered but neither compiled nor run, as ``lower_prefill_slots`` (``bucket`` checked as there;
        ``rounds`` a device ``i32[]``, whose value does not matter)."""
        args = self._decode_args(state, bucket, rounds, first_finish)
        return self._lower("decode", state, *args, bucket=int(bucket))

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
        return self.result(self.run_host_driven(*self.prepare(prompts, max_new_tokens, **kw)), len(prompts))
