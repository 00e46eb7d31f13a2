"""Host-boundary checks of the engine's arguments: what ``Engine`` and ``Engine.prepare`` are given is
checked here, before anything is allocated or traced, and a bad value raises ``ValueError`` naming the
argument (and the request index for per-request values) and what was expected."""

import typing

import jax
import numpy as np

from jaxspec.config import SpecConfig
from jaxspec.engine.policy import AdaptivePolicy
from jaxspec.engine.simulate import SimulatedAccept
from jaxspec.kernels import Implementation, batch_invariance_blocker
from jaxspec.protocols import Drafter, check_implements


def is_int(v) -> bool:
    """A Python or numpy integer that is not a bool (``True`` is an ``int`` to Python, never a count here)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_int(name: str, v, *, lo: int | None = None, hi: int | None = None, what: str | None = None) -> int:
    """``int(v)`` when ``v`` is an integer in ``[lo, hi)`` (either bound may be open); else ``ValueError`` naming
    ``name``. Floats, bools and strings are refused, never converted."""
    ok = is_int(v) and (lo is None or v >= lo) and (hi is None or v < hi)
    if not ok:
        if what is None:
            what = "an int" + ("" if lo is None else f" >= {lo}") + ("" if hi is None else f" and < {hi}")
        raise ValueError(f"{name}: expected {what}, got {v!r}")
    return int(v)


IMPLEMENTATIONS = typing.get_args(Implementation)  # what the kernels take


def check_engine_args(*, vocab_size: int, max_context, page_size, max_batch, num_pages, eos_id, implementation,
                      interpret, seed, memory_limit_bytes) -> dict:
    """The scalar arguments of ``Engine`` as Python values (``None`` kept where it means a default)."""
    out = dict(
        max_context=check_int("max_context", max_context, lo=1),
        page_size=check_int("page_size", page_size, lo=1),
        max_batch=check_int("max_batch", max_batch, lo=1),
        num_pages=None if num_pages is None else check_int("num_pages", num_pages, lo=1),
        eos_id=None if eos_id is None else check_int(
            "eos_id", eos_id, lo=0, hi=vocab_size, what=f"None or a token id, an int in [0, {vocab_size})"),
        seed=check_int("seed", seed, lo=0, hi=2**63, what="an int in [0, 2**63) (the page shuffle's seed)"),
        memory_limit_bytes=None if memory_limit_bytes is None else check_int(
            "memory_limit_bytes", memory_limit_bytes, lo=0, what="None or an int >= 0 (bytes)"),
    )
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: expected one of {IMPLEMENTATIONS}, got {implementation!r}")
    if not isinstance(interpret, bool):
        raise ValueError(f"interpret: expected a bool, got {interpret!r}")
    return out


def check_batch_invariant(batch_invariant, target) -> None:
    """``Engine(batch_invariant=...)``: a bool; ``True`` needs a target that declares ``supports_batch_invariant``
    and a backend that can honour the mode (``jaxspec.kernels.batch_invariance_blocker``)."""
    if not isinstance(batch_invariant, bool):
        raise ValueError(f"batch_invariant: expected a bool, got {batch_invariant!r}")
    if not batch_invariant:
        return
    if not getattr(target, "supports_batch_invariant", False):
        raise ValueError(f"batch_invariant=True: the target ({type(target).__name__}) does not declare "
                         "supports_batch_invariant = True (jaxspec.models.Decoder does)")
    if (why := batch_invariance_blocker()) is not None:
        raise ValueError(f"batch_invariant=True: {why}")


def check_speculation(spec, drafter, adaptive, simulate_accept) -> tuple[tuple[SpecConfig, ...], AdaptivePolicy | None]:
    """``(specs, adaptive)``: the draft shapes the loop runs (``()`` for plain decoding, one shape, or the
    adaptive engine's shapes) and the adaptive policy (``None``: every round speculates with ``specs[0]``)."""
    if adaptive is True:
        adaptive = AdaptivePolicy()
    if adaptive is not None and adaptive is not False and not isinstance(adaptive, AdaptivePolicy):
        raise ValueError(f"adaptive: expected None, True or an AdaptivePolicy, got {adaptive!r}")
    adaptive = adaptive or None
    if adaptive is not None:
        specs = (spec,) if isinstance(spec, SpecConfig) else tuple(spec or ())
        if not specs or not all(isinstance(x, SpecConfig) for x in specs) or len(set(specs)) != len(specs):
            raise ValueError(f"spec: adaptive speculation needs one or more distinct SpecConfigs (the draft "
                             f"shapes to choose from besides plain decoding), got {spec!r}")
    elif spec is not None and not isinstance(spec, SpecConfig):
        raise ValueError(f"spec: expected a SpecConfig or None (a sequence of them needs adaptive=True), "
                         f"got {type(spec).__name__}")
    else:
        specs = () if spec is None else (spec,)
    if simulate_accept is not None and not isinstance(simulate_accept, SimulatedAccept):
        raise ValueError(f"simulate_accept: expected None or a SimulatedAccept, got {simulate_accept!r}")
    if simulate_accept is not None and drafter is None:
        raise ValueError("simulate_accept: needs speculative decoding (a drafter and spec); plain decoding "
                         "accepts nothing to simulate")
    if (not specs) != (drafter is None):
        raise ValueError(
            "drafter: speculative decoding (spec) needs a drafter and plain decoding (spec=None) takes none; "
            f"got spec={spec}, drafter={type(drafter).__name__}"
        )
    if drafter is not None:
        check_implements(drafter, Drafter, "drafter")
    return specs, adaptive


def check_verify(verify, threshold_single, threshold_acc, spec, drafter) -> tuple[float, float]:
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


def _per_request(name: str, x, b: int) -> np.ndarray:
    """A scalar or one value per request -> ``np.ndarray (b,)`` of objects (the values as given)."""
    a = np.asarray(x, dtype=object)
    if a.ndim == 0:
        a = np.full((b,), a.item(), dtype=object)
    if a.ndim != 1 or a.shape[0] != b:
        raise ValueError(f"{name}: expected a scalar or one value per request ({b}), got shape {np.shape(x)}")
    return a.astype(object)


def check_sampling(b: int, vocab: int, temperature, top_k, top_p, seed) -> tuple[np.ndarray, ...]:
    """Host-boundary checks of the sampling parameters; errors name the request index and the parameter."""

    def each(name, x, ok, want):
        vals = _per_request(name, x, b)
        for i, v in enumerate(vals):
            if not ok(v):
                raise ValueError(f"{name}[{i}] (request {i}): expected {want}, got {v!r}")
        return vals

    def real(v):
        return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))

    t = each("temperature", temperature, lambda v: real(v) and np.isfinite(v) and v >= 0,
             "a finite float >= 0 (0 = greedy)")
    k = each("top_k", -1 if top_k is None else top_k,
             lambda v: v is None or (is_int(v) and (v == -1 or 1 <= v <= vocab)),
             f"an int in [1, {vocab}] (the vocabulary size), or -1 / None = off")
    p = each("top_p", top_p, lambda v: real(v) and 0 < v <= 1, "a float in (0, 1]")
    s = each("seed", seed, lambda v: is_int(v) and 0 <= v < 2**31, "an int in [0, 2**31)")
    k = np.array([vocab if v is None or v == -1 else int(v) for v in k], np.int32)
    return t.astype(np.float32), k, p.astype(np.float32), s.astype(np.int32)


def check_prompts(prompts, max_new_tokens, *, max_batch: int, vocab_size: int, max_context: int,
                  verify_width: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``(prompts as int32 arrays, max_new_tokens i32[len(prompts)])``; refuses an empty or too large batch,
    empty or out-of-vocabulary prompts and a request that would overflow ``max_context``."""
    if len(prompts) == 0:
        raise ValueError("prompts: expected at least one prompt, got an empty batch")
    if len(prompts) > max_batch:
        raise ValueError(f"prompts: {len(prompts)} requests exceed max_batch={max_batch}")
    arrs = []
    for i, p in enumerate(prompts):
        a = np.asarray(p)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"prompts[{i}]: expected a non-empty 1-D sequence of token ids, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"prompts[{i}]: expected integer token ids, got dtype {a.dtype}")
        if a.min() < 0 or a.max() >= vocab_size:
            raise ValueError(f"prompts[{i}]: token ids must be in [0, {vocab_size}), got {a.min()}..{a.max()}")
        arrs.append(a.astype(np.int32))
    b = len(arrs)
    vals = _per_request("max_new_tokens", max_new_tokens, b)
    for i, v in enumerate(vals):
        if not is_int(v) or v < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1 per request, got {v!r} for request {i}")
    mnt = vals.astype(np.int64)
    for i, a in enumerate(arrs):
        need = a.size + int(mnt[i]) + verify_width
        if need > max_context:
            raise ValueError(
                f"prompts[{i}]: context overflow: prompt length {a.size} + max_new_tokens {int(mnt[i])} + "
                f"verify width {verify_width} = {need} > max_context={max_context} (req_to_token width W)"
            )
    return arrs, mnt.astype(np.int32)


def check_distinct_buffers(**trees) -> None:
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
