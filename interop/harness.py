"""Side-by-side harness: the original torch/Triton (or CUDA) kernel vs the jaxspec op on identical inputs.

``compare(op, **inputs) -> Report`` runs the original (allocating SGLang's / TokenSpeed's out-params
itself, in their dtypes: int64 tree arrays and cache locations, int32 predict/accept arrays, ...)
and the jaxspec op on the same inputs, exchanged through the DLPack shim (numpy -> torch tensors in
the upstream dtypes -> ``to_jax`` for jaxspec; jaxspec outputs come back with ``to_torch``), and
returns per-output mismatch counts and max abs differences. Everything is compared exactly: integer
outputs, masks, moved KV bits, and the float outputs of ``select_top_k_tokens`` (single fp32
multiplies, order-free). jaxspec's int32 outputs are compared by value with upstream's int64 ones.

``make_inputs(op, rng, config)`` draws random inputs for one of ``OPS[op].configs`` (a small fixed
shape set: several upstream kernels take sizes as ``tl.constexpr`` and the Triton interpreter costs
~50-60 us per program instance, so CPU sizes stay at batch <= 16, N <= 16).

Ops whose jaxspec module is not importable are reported as unavailable (``available(op)``); ops with
an ``implementation`` keyword run both ``"pallas"`` (``interpret=True`` on CPU) and ``"reference"``.
"""

import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
import numpy as np
import torch

from jaxspec.interop import dlpack, originals

__all__ = ["OPS", "OpDef", "OutputDiff", "Report", "available", "compare", "implementations", "make_inputs"]

RESERVED = ("implementation", "device", "interpret")


# ----------------------------------------------------------------------------------------------------
# reports


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    name: str
    shape_original: tuple
    shape_jaxspec: tuple
    mismatches: int  # elements that differ (all elements when the shapes differ)
    max_abs_diff: float  # over comparable elements (nan when shapes differ)

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.shape_original == self.shape_jaxspec


@dataclasses.dataclass(frozen=True)
class Report:
    op: str
    implementation: str
    outputs: tuple[OutputDiff, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def mismatches(self) -> int:
        return sum(o.mismatches for o in self.outputs)

    def __str__(self) -> str:
        rows = [f"{self.op} [{self.implementation}]: {'OK' if self.ok else 'MISMATCH'}"]
        for o in self.outputs:
            rows.append(
                f"  {o.name:24s} orig{o.shape_original} jax{o.shape_jaxspec} mismatches={o.mismatches} "
                f"max_abs_diff={o.max_abs_diff:g}"
            )
        return "\n".join(rows)


def _np(x) -> np.ndarray:
    """torch tensor / jax array / numpy -> numpy; bf16 and unsigned torch dtypes through their bits."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        bits = {torch.bfloat16: np.uint16, torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}
        if t.dtype in bits:
            return t.view(torch.uint8).numpy().view(bits[t.dtype]).reshape(t.shape)
        return t.numpy()
    if hasattr(x, "dtype") and str(getattr(x, "dtype", "")) == "bfloat16":
        return np.asarray(x).view(np.uint16)
    return np.asarray(x)


def _diff(name: str, orig, jaxv) -> OutputDiff:
    a, b = _np(orig), _np(jaxv)
    if a.shape != b.shape:
        return OutputDiff(name, a.shape, b.shape, max(a.size, b.size, 1), math.nan)
    if a.size == 0:
        return OutputDiff(name, a.shape, b.shape, 0, 0.0)
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        af, bf = a.astype(np.float64), b.astype(np.float64)
        neq = ~((af == bf) | (np.isnan(af) & np.isnan(bf)))
        with np.errstate(invalid="ignore"):
            d = np.abs(af - bf)
        return OutputDiff(name, a.shape, b.shape, int(neq.sum()), float(np.nanmax(d)) if neq.any() else 0.0)
    ai, bi = a.astype(np.int64), b.astype(np.int64)
    neq = ai != bi
    return OutputDiff(name, a.shape, b.shape, int(neq.sum()), float(np.abs(ai - bi).max()))


# ----------------------------------------------------------------------------------------------------
# op registry


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One side-by-side pair. ``configs`` is the small fixed shape set the generators draw from."""

    name: str
    jaxspec: str  # "module:attr"
    original: str  # key in originals.ORIGINALS
    configs: tuple[dict, ...]
    gen: Callable[[np.random.Generator, dict], dict]
    run_original: Callable[[dict, str], dict]  # (torch inputs, device) -> {output name: tensor}
    run_jaxspec: Callable[..., dict]  # (fn, jax inputs, implementation kwargs) -> {output name: array}
    has_implementation: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")

    def label(self, config: dict) -> str:
        return " ".join(f"{k}={getattr(v, 'name', v)}" for k, v in config.items())


OPS: dict[str, OpDef] = {}


def _register(op: OpDef) -> OpDef:
    OPS[op.name] = op
    return op


def jaxspec_fn(op: str):
    mod, attr = OPS[op].jaxspec.split(":")
    return getattr(importlib.import_module(mod), attr)


def available(op: str) -> tuple[bool, str]:
    """Whether the jaxspec side of ``op`` can be imported (ops are written in parallel), and why not."""
    try:
        jaxspec_fn(op)
    except (ImportError, AttributeError) as e:
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def implementations(op: str, device: str) -> list[tuple[str, dict]]:
    """``[(label, kwargs)]`` to run the jaxspec op with: pallas (interpret on CPU) and reference."""
    if not OPS[op].has_implementation:
        return [("jnp", {})]
    pallas = {"implementation": "pallas", "interpret": device == "cpu"}
    return [("pallas" + ("-interpret" if device == "cpu" else ""), pallas), ("reference", {"implementation": "reference"})]


def make_inputs(op: str, rng: np.random.Generator, config: dict) -> dict:
    """Random inputs for ``op`` under ``config`` (one of ``OPS[op].configs``): numpy arrays in the upstream
    dtypes (or host torch tensors for bf16/fp16) keyed by jaxspec argument names, plus static arguments."""
    return OPS[op].gen(rng, dict(config))


def _torch_inputs(inputs: dict, device: str) -> dict:
    out = {}
    for k, v in inputs.items():
        if isinstance(v, np.ndarray) and v.size == 0:
            # a fresh empty tensor, strides as torch.empty gives them (SGLang's `torch.empty((bs, 0))`); the CUDA
            # launcher's TensorMatcher rejects numpy's zero strides
            out[k] = torch.empty(v.shape, dtype=torch.from_numpy(np.zeros(1, v.dtype)).dtype, device=device)
        elif isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(np.ascontiguousarray(v)).to(device)
        elif isinstance(v, torch.Tensor):
            out[k] = v.to(device)
        else:
            out[k] = v
    return out


def compare(op: str, *, implementation: str | None = None, device: str = "cpu", **inputs) -> Report:
    """Run the original and the jaxspec op on ``inputs`` (from ``make_inputs``) and diff every output.

    ``implementation``: a label from ``implementations(op, device)`` (default: the first, i.e. Pallas);
    ``device``: "cpu" (Triton interpreter, Pallas interpret) or "cuda".
    """
    d = OPS[op]
    impls = dict(implementations(op, device))
    label = implementation or next(iter(impls))
    if label not in impls:
        raise ValueError(f"implementation: {label!r} not one of {sorted(impls)} for {op}")
    t_in = _torch_inputs(inputs, device)
    # jaxspec sees the very same tensors, exchanged through the shim (copies: the original mutates its
    # out-params, never these inputs, but aliasing would be undefined anyway)
    j_in = {k: (dlpack.to_jax(v, name=k) if isinstance(v, torch.Tensor) else v) for k, v in t_in.items()}
    orig_out = d.run_original({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t_in.items()}, device)
    jax_out = d.run_jaxspec(jaxspec_fn(op), j_in, impls[label])
    jax_out = {k: (dlpack.to_torch(v) if v is not None and not isinstance(v, np.ndarray) else v) for k, v in jax_out.items()}
    missing = set(orig_out) ^ set(jax_out)
    if missing:
        raise RuntimeError(f"{op}: harness output names differ: {sorted(missing)}")
    return Report(op, label, tuple(_diff(k, orig_out[k], jax_out[k]) for k in orig_out))


# ----------------------------------------------------------------------------------------------------
# shared generators (written from the semantics in ops-spec §1-§4, not from upstream code)


def _np_i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def random_draft(rng, b: int, s: int, k: int, n: int, vocab: int = 32000):
    """A valid draft tree as EAGLE's draft loop + organize_draft_results would produce it (float32 scores,
    probabilities in (0.05, 0.95) so every child scores strictly below its parent and the top-(N-1)
    selection is always parent-closed). Returns int64 ``parent_list (B, Q)``, ``top_scores_index (B, N-1)``,
    ``draft_tokens (B, N-1)``."""
    def probs(shape):
        return -np.sort(-rng.uniform(0.05, 0.95, size=shape).astype(np.float32), axis=-1)

    scores = probs((b, k))
    score_list, token_list, parents_list = [scores[:, None, :]], [rng.integers(0, vocab, (b, k))], []
    parents_list.append(np.broadcast_to(np.arange(-1, k), (b, k + 1)))
    for i in range(1, s):
        expand = (scores[:, :, None] * probs((b, k, k))).astype(np.float32)
        flat = expand.reshape(b, k * k)
        idx = np.argsort(-flat, axis=1, kind="stable")[:, :k]
        scores = np.take_along_axis(flat, idx, 1)
        score_list.append(expand)
        token_list.append(rng.integers(0, vocab, (b, k * k)))
        parents_list.append(idx + (k * k * (i - 1) + k))
    allscores = np.concatenate([x.reshape(b, -1) for x in score_list], 1)
    alltokens = np.concatenate(token_list, 1)
    sel = np.sort(np.argsort(-allscores, axis=1, kind="stable")[:, : n - 1], axis=1)
    parent_list = np.concatenate(parents_list[:-1], 1) if len(parents_list) > 1 else np.zeros((b, 0), np.int64)
    return _np_i64(parent_list), _np_i64(sel), _np_i64(np.take_along_axis(alltokens, sel, 1))


def tree_links(parent_list, sel, k: int, n: int):
    """retrieve_index / next_token / next_sibling (int64) of a draft tree (ops-spec §3.2-§3.3)."""
    b = sel.shape[0]
    ri = (np.arange(b)[:, None] * n + np.arange(n)[None, :]).astype(np.int64)
    nt = np.full((b, n), -1, np.int64)
    ns = np.full((b, n), -1, np.int64)
    for r in range(b):
        for t in range(n - 1, 0, -1):
            ptb = sel[r, t - 1] // k
            if ptb == 0:
                p = 0
            else:
                hits = np.nonzero(sel[r, : n - 1] == parent_list[r, ptb])[0]
                if hits.size == 0:
                    continue
                p = int(hits[0]) + 1
            if nt[r, p] != -1:
                ns[r, t] = nt[r, p]
            nt[r, p] = t
    return ri, nt, ns


def _cfg(**kw) -> dict:
    return kw


def ops_for(device: str, names: Sequence[str] | None = None) -> list[str]:
    """Registered ops that run on ``device`` (optionally restricted to ``names``)."""
    out = [k for k, d in OPS.items() if device in d.devices]
    if names:
        unknown = set(names) - set(OPS)
        if unknown:
            raise ValueError(f"unknown ops {sorted(unknown)}; known: {sorted(OPS)}")
        out = [k for k in out if k in names]
    return out


def run_cases(
    op: str, *, seed: int, cases: int, device: str = "cpu", max_configs: int | None = None
) -> list[tuple[dict, str, int, int, str]]:
    """All configs x implementations x ``cases`` random cases of ``op``.

    Returns rows ``(config, implementation, cases, mismatching cases, first failure text)``.
    """
    d = OPS[op]
    rows = []
    op_index = sorted(OPS).index(op)
    for ci, config in enumerate(d.configs[:max_configs]):
        for label, _ in implementations(op, device):
            bad, first = 0, ""
            for case in range(cases):
                rng = np.random.default_rng([seed, op_index, ci, case])
                inputs = make_inputs(op, rng, config)
                try:
                    rep = compare(op, implementation=label, device=device, **inputs)
                    ok, text = rep.ok, str(rep)
                except Exception as e:  # reported, counted as a mismatch
                    ok, text = False, f"{type(e).__name__}: {e}"
                if not ok:
                    bad += 1
                    first = first or text
            rows.append((config, label, cases, bad, first))
    return rows




# Op definitions register themselves with the harness (imported last: they use the names above).
from jaxspec.interop import ops_spec as ops_spec  # noqa: E402
from jaxspec.interop import ops_kernels as ops_kernels  # noqa: E402
