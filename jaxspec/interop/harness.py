"""Side-by-side harness: the original torch/Triton (or CUDA) kernel vs the jaxspec op on identical inputs.

``compare(op, **inputs) -> Report`` runs the original (allocating SGLang's / TokenSpeed's out-params
itself, in their dtypes: int64 tree arrays and cache locations, int32 predict/accept arrays, ...)
and the jaxspec op on the same inputs, exchanged through the DLPack shim (numpy -> torch tensors in
the upstream dtypes -> ``to_jax`` for jaxspec; jaxspec outputs come back with ``to_torch``), and
returns per-output mismatch counts and max abs differences. Everything is compared exactly: integer
outputs, masks, moved KV bits, and the float outputs of ``select_top_k_tokens`` (single fp32
multiplies, order-free; its documented ties / subnormals classes aside). jaxspec's int32 outputs are compared by value with upstream's int64 ones.

``make_inputs(op, rng, config)`` draws random inputs for one of ``OPS[op].configs`` (a small fixed
shape set: several upstream kernels take sizes as ``tl.constexpr`` and the Triton interpreter costs
~50-60 us per program instance, so CPU sizes stay at batch <= 16, N <= 16).

The ops are defined in ``ops_spec`` / ``ops_kernels``, which register them in ``registry.OPS``; this module
reads that table. Ops with an ``implementation`` keyword run both ``"pallas"`` (``interpret=True`` on
CPU) and ``"reference"``. A case that differs on an input of one of the op's documented
``known_differences`` classes (e.g. exact score ties for ``select_top_k_tokens``) is counted under that
class, not as a mismatch (``run_cases``); an original that cannot run here (``OriginalsMissing``: not fetched;
``PinMismatch``: modified) raises out of ``run_cases`` rather than counting as one.
"""

import dataclasses
import importlib
import math
from collections.abc import Sequence

import numpy as np
import torch

from jaxspec.interop import dlpack, originals, pins
from jaxspec.interop import ops_attention, ops_kernels, ops_spec  # noqa: F401 - they register their ops in registry.OPS
from jaxspec.interop.registry import OPS, OpDef

__all__ = ["OPS", "OpDef", "OutputDiff", "Report", "Row", "compare", "implementations", "jaxspec_fn", "make_inputs",
           "ops_for", "run_cases"]

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


def _diff(name: str, orig, jaxv, atol: float | None = None) -> OutputDiff:
    a, b = _np(orig), _np(jaxv)
    if a.shape != b.shape:
        return OutputDiff(name, a.shape, b.shape, max(a.size, b.size, 1), math.nan)
    if a.size == 0:
        return OutputDiff(name, a.shape, b.shape, 0, 0.0)
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        af, bf = a.astype(np.float64), b.astype(np.float64)
        neq = ~((af == bf) | (np.isnan(af) & np.isnan(bf)))
        if atol is not None:
            with np.errstate(invalid="ignore"):
                neq &= ~(np.abs(af - bf) <= atol)
        with np.errstate(invalid="ignore"):
            d = np.abs(af - bf)
        return OutputDiff(name, a.shape, b.shape, int(neq.sum()), float(np.nanmax(d)) if neq.any() else 0.0)
    ai, bi = a.astype(np.int64), b.astype(np.int64)
    neq = ai != bi
    return OutputDiff(name, a.shape, b.shape, int(neq.sum()), float(np.abs(ai - bi).max()))


# ----------------------------------------------------------------------------------------------------
# running the registered ops


def jaxspec_fn(op: str):
    """The jaxspec function of ``op`` (imported from its ``module:attr``)."""
    mod, attr = OPS[op].jaxspec.split(":")
    return getattr(importlib.import_module(mod), attr)


def implementations(op: str, device: str) -> list[tuple[str, dict]]:
    """``[(label, kwargs)]`` to run the jaxspec op with: pallas (interpret on CPU) and reference."""
    if OPS[op].implementations is not None:
        return list(OPS[op].implementations(device))
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
    return Report(op, label, tuple(_diff(k, orig_out[k], jax_out[k], d.atol) for k in orig_out))


def ops_for(device: str, names: Sequence[str] | None = None) -> list[str]:
    """Registered ops that run on ``device`` (optionally restricted to ``names``)."""
    out = [k for k, d in OPS.items() if device in d.devices]
    if names:
        unknown = set(names) - set(OPS)
        if unknown:
            raise ValueError(f"unknown ops {sorted(unknown)}; known: {sorted(OPS)}")
        out = [k for k in out if k in names]
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    """One (op, config, implementation) row of ``run_cases``.

    ``mismatches``: cases with a differing output (or an error) outside the known-difference classes;
    ``known``: cases in a known-difference class (``known_class``, documented in ``OPS[op].known_differences``),
    of which ``known_differing`` differed."""

    config: dict
    implementation: str
    cases: int
    mismatches: int
    first_failure: str
    known_class: str | None = None
    known: int = 0
    known_differing: int = 0


def run_cases(op: str, *, seed: int, cases: int, device: str = "cpu", max_configs: int | None = None,
              progress=None) -> list[Row]:
    """All configs x implementations x ``cases`` random cases of ``op``; ``progress()`` is called once per case."""
    d = OPS[op]
    rows = []
    op_index = sorted(OPS).index(op)
    for ci, config in enumerate(d.configs[:max_configs]):
        for label, _ in implementations(op, device):
            bad, first, known, known_bad, known_class = 0, "", 0, 0, None
            for case in range(cases):
                rng = np.random.default_rng([seed, op_index, ci, case])
                inputs = make_inputs(op, rng, config)
                klass = d.known_class(inputs)
                try:
                    rep = compare(op, implementation=label, device=device, **inputs)
                    ok, text, raised = rep.ok, str(rep), False
                except (originals.OriginalsMissing, pins.PinMismatch):
                    raise  # the original cannot run here (not fetched, or modified): a set-up error, not a mismatch
                except Exception as e:  # reported, counted as a mismatch (never a known difference)
                    ok, text, raised = False, f"{type(e).__name__}: {e}", True
                if klass is not None and not raised:
                    known, known_class = known + 1, klass
                    known_bad += not ok
                elif not ok:
                    bad += 1
                    first = first or text
                if progress is not None:
                    progress()
            rows.append(Row(config, label, cases, bad, first, known_class, known, known_bad))
    return rows
