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


# ----------------------------------------------------------------------------------------------------
# jaxspec.spec.draft.select_top_k_tokens  vs  sglang 0.5.23 spec_utils.select_top_k_tokens (torch)


def _gen_select(rng, c):
    b, k, h, step = c["B"], c["K"], c["H"], c["step"]
    rows = b if step == 0 else b * k
    p = rng.uniform(0.01, 1.0, (rows, k)).astype(np.float32)
    p = -np.sort(-p, axis=1)
    out = {
        "step": step,
        "topk_p": p,
        "topk_index": rng.integers(0, 32000, (rows, k)).astype(np.int64),
        "hidden_states": rng.standard_normal((rows, h)).astype(np.float32),
        "scores": None if step == 0 else rng.uniform(0.01, 1.0, (b, k)).astype(np.float32),
        "topk": k,
    }
    return out


def _orig_select(t, device):
    fn = originals.load("select_top_k_tokens")
    ids, hid, scores, info = fn(t["step"], t["topk_p"], t["topk_index"], t["hidden_states"], t["scores"], t["topk"])
    return {
        "input_ids": ids, "hidden_states": hid, "scores": scores,
        "tree_info.scores": info[0], "tree_info.tokens": info[1], "tree_info.parents": info[2],
    }


def _jax_select(fn, j, impl):
    o = fn(j["step"], j["topk_p"], j["topk_index"], j["hidden_states"], j["scores"], topk=j["topk"])
    return {
        "input_ids": o.input_ids, "hidden_states": o.hidden_states, "scores": o.scores,
        "tree_info.scores": o.tree_info.scores, "tree_info.tokens": o.tree_info.tokens,
        "tree_info.parents": o.tree_info.parents,
    }


_register(OpDef(
    "select_top_k_tokens", "jaxspec.spec.draft:select_top_k_tokens", "select_top_k_tokens",
    (_cfg(B=3, K=2, H=8, step=0), _cfg(B=3, K=2, H=8, step=1), _cfg(B=2, K=4, H=8, step=2),
     _cfg(B=4, K=1, H=8, step=1)),
    _gen_select, _orig_select, _jax_select,
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.spec.tree.build_tree  vs  sglang 0.5.23 spec_tree.sgl_build_tree_kernel_triton (+ CUDA on GPU)

_MAX_SEQ = 20  # seq_lens drawn in [1, _MAX_SEQ]; FULL_MASK buffers sized with B * _MAX_SEQ (one jit shape)


def _gen_tree(rng, c):
    from jaxspec.config import SpecConfig

    b, s, k, n = c["B"], c["S"], c["K"], c["N"]
    plist, sel, dtok = random_draft(rng, b, s, k, n)
    return {
        "bonus_tokens": rng.integers(0, 32000, b).astype(np.int32),
        "parent_list": plist,
        "top_scores_index": sel,
        "draft_tokens": dtok,
        "seq_lens": rng.integers(1, _MAX_SEQ + 1, b).astype(np.int64),
        "config": SpecConfig(num_steps=s, topk=k, num_draft_tokens=n),
        "mask_mode": int(c["mode"]),
    }


def _sglang_tree_buffers(t, device):
    """The allocations of eagle_utils.build_tree_kernel_efficient (0.5.23), fill_prefix_mask=True."""
    cfg, mode = t["config"], t["mask_mode"]
    n, b = cfg.num_draft_tokens, t["seq_lens"].numel()
    if mode == 0:
        mask = torch.full((int(t["seq_lens"].sum()) * n + n * n * b,), True, dtype=torch.bool, device=device)
    elif mode == 1:
        mask = torch.full((n * b * n,), True, dtype=torch.bool, device=device)
    else:
        dt = [torch.uint8, torch.uint16, torch.uint32][int(math.ceil(math.log2((n + 7) // 8)))]
        mask = torch.zeros((n * b,), dtype=dt, device=device)
    retrieve = torch.full((3, b, n), -1, dtype=torch.long, device=device)
    positions = torch.empty((b * n,), dtype=torch.long, device=device)
    return mask, positions, retrieve


def _tree_outputs(t, mask, positions, retrieve):
    draft = torch.cat((t["bonus_tokens"].unsqueeze(1), t["draft_tokens"]), dim=1).flatten()
    return {
        "tree_mask": mask, "positions": positions, "retrieve_index": retrieve[0],
        "retrieve_next_token": retrieve[1], "retrieve_next_sibling": retrieve[2], "draft_tokens": draft,
    }


def _orig_tree(t, device):
    cfg = t["config"]
    mask, positions, retrieve = _sglang_tree_buffers(t, device)
    originals.load("build_tree")(
        t["parent_list"], t["top_scores_index"], t["seq_lens"], mask, positions, retrieve[0], retrieve[1],
        retrieve[2], cfg.topk, cfg.num_steps, cfg.num_draft_tokens, t["mask_mode"],
    )
    return _tree_outputs(t, mask, positions, retrieve)


def _orig_tree_cuda(t, device):
    from jaxspec.interop import cuda_originals

    cfg = t["config"]
    mask, positions, retrieve = _sglang_tree_buffers(t, device)
    cuda_originals.build_tree_kernel_efficient(
        t["parent_list"], t["top_scores_index"], t["seq_lens"], mask, positions, retrieve[0], retrieve[1],
        retrieve[2], cfg.topk, cfg.num_steps, cfg.num_draft_tokens, t["mask_mode"],
    )
    torch.cuda.synchronize()
    return _tree_outputs(t, mask, positions, retrieve)


def _jax_tree(fn, j, impl):
    from jaxspec.spec.tree import TreeMaskMode

    b = j["seq_lens"].shape[0]
    o = fn(j["bonus_tokens"], j["parent_list"], j["top_scores_index"], j["draft_tokens"], j["seq_lens"],
           config=j["config"], mask_mode=TreeMaskMode(j["mask_mode"]),
           max_seq_lens_sum=b * _MAX_SEQ if j["mask_mode"] == 0 else None)
    mask = o.tree_mask[: int(o.tree_mask_len)] if j["mask_mode"] == 0 else o.tree_mask
    return {
        "tree_mask": mask, "positions": o.positions, "retrieve_index": o.retrieve_index,
        "retrieve_next_token": o.retrieve_next_token, "retrieve_next_sibling": o.retrieve_next_sibling,
        "draft_tokens": o.draft_tokens,
    }


_TREE_CONFIGS = (
    _cfg(B=3, S=3, K=2, N=6, mode=0), _cfg(B=3, S=3, K=2, N=6, mode=1), _cfg(B=2, S=1, K=4, N=4, mode=0),
    _cfg(B=4, S=4, K=1, N=5, mode=1), _cfg(B=2, S=4, K=4, N=8, mode=0),
)
_register(OpDef("build_tree", "jaxspec.spec.tree:build_tree", "build_tree", _TREE_CONFIGS, _gen_tree, _orig_tree,
                _jax_tree))
_register(OpDef(
    "build_tree@cuda", "jaxspec.spec.tree:build_tree", "build_tree@cuda",
    _TREE_CONFIGS + (_cfg(B=3, S=3, K=2, N=6, mode=2), _cfg(B=16, S=5, K=4, N=8, mode=2),
                     _cfg(B=16, S=5, K=4, N=8, mode=0), _cfg(B=4, S=3, K=4, N=12, mode=2)),
    _gen_tree, _orig_tree_cuda, _jax_tree, devices=("cuda",),
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.spec.verify.verify_tree_greedy  vs  spec_tree.verify_tree_greedy_triton (+ CUDA on GPU)


def _gen_verify(rng, c):
    b, s, k, n, vocab = c["B"], c["S"], c["K"], c["N"], 8
    plist, sel, dtok = random_draft(rng, b, s, k, n, vocab=vocab)
    ri, nt, ns = tree_links(plist, sel, k, n)
    cand = np.concatenate([rng.integers(0, vocab, (b, 1)), dtok], 1).astype(np.int64)
    target = rng.integers(0, vocab, (b, n)).astype(np.int64)
    for r in range(b):  # steer most nodes' target towards one of their children, so paths get accepted
        for j in range(n):
            kids, ch = [], nt[r, j]
            while ch != -1:
                kids.append(ch)
                ch = ns[r, ch]
            if kids and rng.random() < 0.75:
                target[r, j] = cand[r, kids[rng.integers(len(kids))]]
    return {
        "candidates": cand, "retrieve_index": ri, "retrieve_next_token": nt, "retrieve_next_sibling": ns,
        "target_predict": target, "num_steps": s,
    }


def _verify_buffers(t, device):
    b, n = t["candidates"].shape
    predict = torch.zeros((b * n,), dtype=torch.int32, device=device)  # eagle_sample: zeros
    accept_index = torch.full((b, t["num_steps"] + 1), -1, dtype=torch.int32, device=device)
    num = torch.empty((b,), dtype=torch.int32, device=device)
    return predict, accept_index, num


def _orig_verify(t, device):
    predict, accept_index, num = _verify_buffers(t, device)
    originals.load("verify_tree_greedy")(
        predict, accept_index, num, t["candidates"], t["retrieve_index"], t["retrieve_next_token"],
        t["retrieve_next_sibling"], t["target_predict"],
    )
    return {"predict": predict, "accept_index": accept_index, "num_correct_drafts": num}


def _orig_verify_cuda(t, device):
    from jaxspec.interop import cuda_originals

    predict, accept_index, num = _verify_buffers(t, device)
    cuda_originals.verify_tree_greedy(
        predict, accept_index, num, t["candidates"], t["retrieve_index"], t["retrieve_next_token"],
        t["retrieve_next_sibling"], t["target_predict"],
    )
    torch.cuda.synchronize()
    return {"predict": predict, "accept_index": accept_index, "num_correct_drafts": num}


def _jax_verify(fn, j, impl):
    o = fn(j["candidates"], j["retrieve_index"], j["retrieve_next_token"], j["retrieve_next_sibling"],
           j["target_predict"], num_steps=j["num_steps"])
    return {"predict": o.predict, "accept_index": o.accept_index, "num_correct_drafts": o.num_correct_drafts}


_VERIFY_CONFIGS = (_cfg(B=3, S=3, K=2, N=6), _cfg(B=4, S=4, K=1, N=5), _cfg(B=2, S=1, K=4, N=4),
                   _cfg(B=2, S=4, K=4, N=8))
_register(OpDef("verify_tree_greedy", "jaxspec.spec.verify:verify_tree_greedy", "verify_tree_greedy",
                _VERIFY_CONFIGS, _gen_verify, _orig_verify, _jax_verify))
_register(OpDef("verify_tree_greedy@cuda", "jaxspec.spec.verify:verify_tree_greedy", "verify_tree_greedy@cuda",
                _VERIFY_CONFIGS + (_cfg(B=16, S=5, K=4, N=8),), _gen_verify, _orig_verify_cuda, _jax_verify,
                devices=("cuda",)))


# ----------------------------------------------------------------------------------------------------
# tree_speculative_sampling_target_only (GPU only: the original is CUDA)

_DYADIC = 2**20  # probabilities are multiples of 2^-20: every fp32 partial sum is exact in any order


def _gen_sampling(rng, c):
    g = _gen_verify(rng, c)
    b, n = g["candidates"].shape
    v = c["V"]
    w = rng.integers(0, 8, (b, n, v)).astype(np.int64)
    # put mass on the candidate tokens so walks go deep; zero some entries (p == 0 guard)
    w[..., : min(v, 8)] += rng.integers(0, 64, (b, n, min(v, 8)))
    w[..., 0] += 1
    # normalise to exactly _DYADIC per row: fix the remainder on the largest entry
    tot = w.sum(-1, keepdims=True)
    w = (w * _DYADIC) // tot
    w[np.arange(b)[:, None], np.arange(n)[None, :], w.argmax(-1)] += _DYADIC - w.sum(-1)
    probs = (w / _DYADIC).astype(np.float32)
    coins = (rng.integers(0, _DYADIC, (b, n)) / _DYADIC).astype(np.float32)
    final = (rng.integers(0, _DYADIC, (b,)) / _DYADIC).astype(np.float32)
    return {
        "candidates": g["candidates"], "retrieve_index": g["retrieve_index"],
        "retrieve_next_token": g["retrieve_next_token"], "retrieve_next_sibling": g["retrieve_next_sibling"],
        "uniform_samples": coins, "uniform_samples_for_final_sampling": final, "target_probs": probs,
        "num_steps": g["num_steps"], "threshold_single": c.get("thr_single", 1.0),
        "threshold_acc": c.get("thr_acc", 1.0),
    }


def _orig_sampling_cuda(t, device):
    from jaxspec.interop import cuda_originals

    predict, accept_index, num = _verify_buffers(t, device)
    draft_probs = torch.zeros_like(t["target_probs"])
    cuda_originals.tree_speculative_sampling_target_only(
        predict, accept_index, num, t["candidates"], t["retrieve_index"], t["retrieve_next_token"],
        t["retrieve_next_sibling"], t["uniform_samples"], t["uniform_samples_for_final_sampling"],
        t["target_probs"], draft_probs, t["threshold_single"], t["threshold_acc"], True,
    )
    torch.cuda.synchronize()
    return {"predict": predict, "accept_index": accept_index, "num_correct_drafts": num}


def _jax_sampling(fn, j, impl):
    o = fn(j["candidates"], j["retrieve_index"], j["retrieve_next_token"], j["retrieve_next_sibling"],
           j["uniform_samples"], j["uniform_samples_for_final_sampling"], j["target_probs"], None,
           num_steps=j["num_steps"], threshold_single=j["threshold_single"], threshold_acc=j["threshold_acc"])
    return {"predict": o.predict, "accept_index": o.accept_index, "num_correct_drafts": o.num_correct_drafts}


_register(OpDef(
    "tree_speculative_sampling_target_only@cuda", "jaxspec.spec.verify:tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only@cuda",
    (_cfg(B=3, S=3, K=2, N=6, V=64), _cfg(B=4, S=4, K=1, N=5, V=30), _cfg(B=16, S=5, K=4, N=8, V=4099),
     _cfg(B=4, S=3, K=2, N=6, V=64, thr_single=0.5, thr_acc=0.5)),
    _gen_sampling, _orig_sampling_cuda, _jax_sampling, devices=("cuda",),
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.spec.accept.fill_bonus_tokens  vs  eagle.py fill_bonus_tokens (Triton, 0.5.23 stride S+1)


def _gen_accept_path(rng, b, a, n):
    """accept_index (B, A) int32 (root first, strictly increasing nodes, -1 pad) and accept_lens (B,)."""
    lens = rng.integers(1, a + 1, b).astype(np.int32)
    idx = np.full((b, a), -1, np.int32)
    for r in range(b):
        nodes = np.sort(rng.choice(np.arange(1, n), size=min(lens[r] - 1, n - 1), replace=False))
        path = np.concatenate([[0], nodes])
        lens[r] = len(path)
        idx[r, : len(path)] = r * n + path
    return idx, lens


def _gen_bonus(rng, c):
    b, a, n = c["B"], c["A"], c["N"]
    idx, lens = _gen_accept_path(rng, b, a, n)
    return {"predict": rng.integers(0, 32000, b * n).astype(np.int32), "accept_index": idx, "accept_lens": lens}


def _orig_bonus(t, device):
    b, a = t["accept_index"].shape
    accept_tokens = t["predict"][t["accept_index"].long()]  # as run_eagle_verify builds it (-1 wraps, unread)
    out = torch.empty((b,), dtype=torch.int32, device=device)
    originals.load("fill_bonus_tokens")[(b,)](accept_tokens, t["accept_lens"], out, a)
    return {"bonus_tokens": out}


def _jax_bonus(fn, j, impl):
    return {"bonus_tokens": fn(j["predict"], j["accept_index"], j["accept_lens"])}


_register(OpDef("fill_bonus_tokens", "jaxspec.spec.accept:fill_bonus_tokens", "fill_bonus_tokens",
                (_cfg(B=4, A=4, N=6), _cfg(B=1, A=2, N=2), _cfg(B=8, A=5, N=8)), _gen_bonus, _orig_bonus, _jax_bonus))


# ----------------------------------------------------------------------------------------------------
# jaxspec.kernels.cache_locs  vs  cache_locs.py assign_extend_cache_locs / eagle.py fill_accept_out_cache_loc


def _gen_extend(rng, c):
    b, rows, w, n = c["B"], c["R"], c["W"], c["N"]
    table = rng.permutation(np.arange(1, rows * w + 1)).reshape(rows, w).astype(np.int32)
    start = rng.integers(0, w - n + 1, b).astype(np.int64)
    end = start + rng.integers(0, n + 1, b)
    return {
        "req_pool_indices": rng.choice(rows, size=b, replace=False).astype(np.int64),
        "req_to_token": table, "start_offset": start, "end_offset": end.astype(np.int64), "out_size": b * n,
    }


def _orig_extend(t, device):
    b = t["req_pool_indices"].numel()
    out = torch.zeros((t["out_size"],), dtype=torch.int64, device=device)  # callers: zeros (dummy slot 0)
    np2 = originals._sglang_utils_source()["next_power_of_2"]
    originals.load("assign_extend_cache_locs")[(b,)](
        t["req_pool_indices"], t["req_to_token"], t["start_offset"], t["end_offset"], out,
        t["req_to_token"].shape[1], np2(b),
    )
    return {"out_cache_loc": out}


def _jax_extend(fn, j, impl):
    return {"out_cache_loc": fn(j["req_pool_indices"], j["req_to_token"], j["start_offset"], j["end_offset"],
                                out_size=j["out_size"], **impl)}


_register(OpDef("assign_extend_cache_locs", "jaxspec.kernels.cache_locs:assign_extend_cache_locs",
                "assign_extend_cache_locs",
                (_cfg(B=4, R=6, W=24, N=6), _cfg(B=1, R=2, W=8, N=8), _cfg(B=7, R=9, W=40, N=5)),
                _gen_extend, _orig_extend, _jax_extend, has_implementation=True))


def _gen_accept_loc(rng, c):
    b, a, n = c["B"], c["A"], c["N"]
    idx, _ = _gen_accept_path(rng, b, a, n)
    return {"accept_index": idx, "out_cache_loc": rng.integers(1, 10**6, b * n).astype(np.int64)}


def _orig_accept_loc(t, device):
    size = t["accept_index"].numel()  # 0.5.23: bs * accept_index.shape[1]
    out = torch.zeros((size,), dtype=torch.int64, device=device)
    np2 = originals._sglang_utils_source()["next_power_of_2"]
    originals.load("fill_accept_out_cache_loc")[(size,)](t["accept_index"], t["out_cache_loc"], out, np2(size))
    return {"accept_out_cache_loc": out}


def _jax_accept_loc(fn, j, impl):
    return {"accept_out_cache_loc": fn(j["accept_index"], j["out_cache_loc"], **impl)}


_register(OpDef("fill_accept_out_cache_loc", "jaxspec.kernels.cache_locs:fill_accept_out_cache_loc",
                "fill_accept_out_cache_loc", (_cfg(B=4, A=4, N=6), _cfg(B=2, A=2, N=2), _cfg(B=3, A=5, N=8)),
                _gen_accept_loc, _orig_accept_loc, _jax_accept_loc, has_implementation=True))


# ----------------------------------------------------------------------------------------------------
# jaxspec.kernels.kv_move.move_kv_cache  vs  cache_move.py copy_all_layer_kv_cache_tiled


def _gen_kv_move(rng, c):
    layers, x, h, e, b, n, a = c["L"], c["X"], c["H"], c["E"], c["B"], c["N"], c["A"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[c["dtype"]]
    count = layers * x * h * e
    bits = (np.arange(count, dtype=np.int64) * 7919 % 65521).astype(np.uint16)  # distinct, exact bit patterns
    bits &= np.uint16(0x7BFF)  # keep exponents finite (no inf/nan patterns) in both fp16 and bf16
    k = torch.from_numpy(bits.view(np.int16).reshape(layers, x, h, e).copy()).view(dtype)
    v = torch.from_numpy(bits[::-1].copy().view(np.int16).reshape(layers, x, h, e)).view(dtype)
    idx, lens = _gen_accept_path(rng, b, a, n)
    windows = rng.choice(np.arange(1, x), size=(b, n), replace=False)  # slot 0 is the dummy slot
    tgt, src = [], []
    for r in range(b):  # spec-accept move: accepted node a_k -> window slot k (ops-spec §10)
        nodes = idx[r, : lens[r]] - r * n
        tgt += list(windows[r, : lens[r]])
        src += list(windows[r, nodes])
    pad = b * a - len(tgt)
    return {"k_buffer": k, "v_buffer": v, "tgt_loc": _np_i64(tgt + [0] * pad), "src_loc": _np_i64(src + [0] * pad)}


def _orig_kv_move(t, device):
    k, v = t["k_buffer"], t["v_buffer"]
    bufs = [*k.unbind(0), *v.unbind(0)]  # SGLang's per-layer k_buffer / v_buffer lists
    data_ptrs = torch.tensor([x.data_ptr() for x in bufs], dtype=torch.uint64, device=device)
    strides = torch.tensor([x.stride(0) * x.dtype.itemsize for x in bufs], device=device)
    stride = int(strides[0])
    # memory_pool._init_kv_copy_and_warmup's tiling heuristics
    bpt = 512 if stride >= 8192 else (256 if stride >= 4096 else 128)
    num = t["tgt_loc"].numel()
    np2 = originals._sglang_utils_source()["next_power_of_2"]
    originals.load("move_kv_cache")[(len(bufs), (stride + bpt - 1) // bpt)](
        data_ptrs, strides, t["tgt_loc"], t["src_loc"], num, np2(num), BYTES_PER_TILE=bpt,
        num_warps=4 if bpt <= 256 else 8, num_stages=2,
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return {"k_buffer": k, "v_buffer": v}


def _jax_kv_move(fn, j, impl):
    out = fn(j["k_buffer"], j["v_buffer"], j["tgt_loc"], j["src_loc"], **impl)
    k, v = (out.k_buffer, out.v_buffer) if hasattr(out, "k_buffer") else out
    return {"k_buffer": k, "v_buffer": v}


_register(OpDef("move_kv_cache", "jaxspec.kernels.kv_move:move_kv_cache", "move_kv_cache",
                (_cfg(L=2, X=48, H=2, E=8, dtype="bf16", B=3, N=6, A=4),
                 _cfg(L=1, X=40, H=4, E=64, dtype="fp16", B=2, N=8, A=5),
                 _cfg(L=3, X=24, H=1, E=16, dtype="bf16", B=4, N=5, A=5)),
                _gen_kv_move, _orig_kv_move, _jax_kv_move, has_implementation=True))


# ----------------------------------------------------------------------------------------------------
# jaxspec.kernels.paged_cache_locs  vs  TokenSpeed 0.1.0 cache_loc_kernel.py


def _gen_page_table(rng, rows, pages, dtype=np.int32):
    return rng.integers(1, 200, (rows, pages)).astype(dtype)


def _gen_update_r2p(rng, c):
    rows, m, b = c["R"], c["M"], c["B"]
    num = rng.integers(0, 4, b).astype(np.int32)
    num[rng.integers(b)] = max(1, num.max())  # at least one page (upstream returns early on an empty refresh)
    starts = np.array([rng.integers(0, m - q + 1) for q in num], np.int32)
    return {
        "req_to_page": _gen_page_table(rng, rows, m), "req_pool_indices": rng.choice(rows, b, replace=False).astype(np.int64),
        # a fixed-size packed buffer (entries past sum(num) are ignored by both sides): one jit shape per config
        "new_occupied_pages": rng.integers(1, 500, 3 * b).astype(np.int32), "new_occupied_pages_num": num,
        "pages_copy_starts": starts,
    }


def _orig_update_r2p(t, device):
    table = t["req_to_page"]
    originals.load("update_req_to_page")(table, t["req_pool_indices"], t["new_occupied_pages"],
                                         t["new_occupied_pages_num"], t["pages_copy_starts"])
    return {"req_to_page": table}


def _jax_update_r2p(fn, j, impl):
    return {"req_to_page": fn(j["req_to_page"], j["req_pool_indices"], j["new_occupied_pages"],
                              j["new_occupied_pages_num"], j["pages_copy_starts"], **impl)}


_register(OpDef("update_req_to_page", "jaxspec.kernels.paged_cache_locs:update_req_to_page", "update_req_to_page",
                (_cfg(R=6, M=8, B=4), _cfg(R=3, M=4, B=1), _cfg(R=17, M=16, B=16)),
                _gen_update_r2p, _orig_update_r2p, _jax_update_r2p, has_implementation=True))


def _gen_out_loc(rng, c):
    rows, m, b, p = c["R"], c["M"], c["B"], c["P"]
    lmax = c.get("Lmax", 5)
    lens = rng.integers(0, lmax + 1, b).astype(np.int32)
    return {
        "cache_start": rng.integers(0, m * p + 2, b).astype(np.int32),  # includes page overflow -> slot 0
        "input_lengths": lens, "req_pool_indices": rng.choice(rows, b, replace=False).astype(np.int32),
        "req_to_pages": _gen_page_table(rng, rows, m), "page_size": p,
        "out_size": b * lmax,  # a static bucket >= sum(input_lengths); the tail stays 0 on both sides
    }


def _orig_out_loc(t, device):
    out = torch.zeros((t["out_size"],), dtype=torch.int32, device=device)
    originals.load("compute_out_cache_loc")(out, t["req_pool_indices"], t["input_lengths"], t["cache_start"],
                                            t["req_to_pages"], t["page_size"])
    return {"out_cache_loc": out}


def _jax_out_loc(fn, j, impl):
    return {"out_cache_loc": fn(j["cache_start"], j["input_lengths"], j["req_pool_indices"], j["req_to_pages"],
                                page_size=j["page_size"], out_size=j["out_size"], **impl)}


_register(OpDef("compute_out_cache_loc", "jaxspec.kernels.paged_cache_locs:compute_out_cache_loc",
                "compute_out_cache_loc",
                (_cfg(R=6, M=8, B=4, P=4), _cfg(R=5, M=6, B=3, P=1), _cfg(R=16, M=4, B=16, P=16, Lmax=9)),
                _gen_out_loc, _orig_out_loc, _jax_out_loc, has_implementation=True))


def _gen_out_loc_uniform(rng, c):
    rows, m, b, p = c["R"], c["M"], c["B"], c["P"]
    return {
        "cache_start": rng.integers(0, m * p + 2, b).astype(np.int32), "req_pool_indices":
        rng.choice(rows, b, replace=False).astype(np.int32), "req_to_pages": _gen_page_table(rng, rows, m),
        "page_size": p, "uniform_input_length": c["U"],
    }


def _orig_out_loc_uniform(t, device):
    b = t["req_pool_indices"].numel()
    out = torch.zeros((b * t["uniform_input_length"],), dtype=torch.int32, device=device)
    originals.load("compute_out_cache_loc_uniform")(out, t["req_pool_indices"], t["uniform_input_length"],
                                                    t["cache_start"], t["req_to_pages"], t["page_size"])
    return {"out_cache_loc": out}


def _jax_out_loc_uniform(fn, j, impl):
    return {"out_cache_loc": fn(j["cache_start"], j["req_pool_indices"], j["req_to_pages"], page_size=j["page_size"],
                                uniform_input_length=j["uniform_input_length"], **impl)}


_register(OpDef("compute_out_cache_loc_uniform", "jaxspec.kernels.paged_cache_locs:compute_out_cache_loc_uniform",
                "compute_out_cache_loc_uniform",
                (_cfg(R=6, M=8, B=4, P=4, U=3), _cfg(R=5, M=6, B=3, P=1, U=1), _cfg(R=16, M=4, B=16, P=16, U=5)),
                _gen_out_loc_uniform, _orig_out_loc_uniform, _jax_out_loc_uniform, has_implementation=True))


def _gen_fused(rng, c):
    rows, m, b, p = c["R"], c["M"], c["B"], c["P"]
    return {
        "valid_cache_lengths": rng.integers(0, m * p + 2, rows).astype(np.int32),
        "req_pool_indices": rng.choice(rows, b, replace=False).astype(np.int32),
        "req_to_pages": _gen_page_table(rng, rows, m), "page_size": p, "uniform_input_length": c["U"],
    }


def _orig_fused(t, device):
    b, u = t["req_pool_indices"].numel(), t["uniform_input_length"]
    locs = torch.zeros((b * u,), dtype=torch.int32, device=device)
    pos = torch.zeros((b * u,), dtype=torch.int32, device=device)
    seq = torch.zeros((b,), dtype=torch.int32, device=device)
    originals.load("fused_decode_input_prep")(locs, pos, seq, t["req_pool_indices"], t["valid_cache_lengths"], u,
                                              t["req_to_pages"], t["page_size"])
    return {"seq_lens": seq, "positions": pos, "out_cache_loc": locs}


def _jax_fused(fn, j, impl):
    o = fn(j["valid_cache_lengths"], j["req_pool_indices"], j["req_to_pages"], page_size=j["page_size"],
           uniform_input_length=j["uniform_input_length"], **impl)
    return {"seq_lens": o.seq_lens, "positions": o.positions, "out_cache_loc": o.out_cache_loc}


_register(OpDef("fused_decode_input_prep", "jaxspec.kernels.paged_cache_locs:fused_decode_input_prep",
                "fused_decode_input_prep",
                (_cfg(R=6, M=8, B=4, P=4, U=3), _cfg(R=5, M=6, B=3, P=1, U=1), _cfg(R=16, M=4, B=16, P=16, U=5)),
                _gen_fused, _orig_fused, _jax_fused, has_implementation=True))


# ----------------------------------------------------------------------------------------------------
# jaxspec.kernels.multi_layer_eagle  vs  sglang 0.5.12 multi_layer_eagle_utils.py (and 0.5.23 rotate)


def _segments(rng, b, lo, hi):
    lens = rng.integers(lo, hi + 1, b).astype(np.int32)
    starts = (np.cumsum(lens) - lens).astype(np.int32)
    return lens, starts


def _gen_rotate(rng, c):
    b = c["B"]
    lens, starts = _segments(rng, b, 0, c["Lmax"])
    total = b * c["Lmax"]  # fixed length (one jit shape per config); the tail past the segments is untouched
    sel = None
    if c["select"]:
        sel = (starts + np.where(lens > 0, rng.integers(0, 1 << 30, b) % np.maximum(lens, 1), 0)).astype(np.int64)
    return {
        "input_ids": rng.integers(0, 32000, total).astype(np.int64), "extend_start_loc": starts,
        "extend_seq_lens": lens, "topk_index": rng.integers(0, 32000, (b, 1)).astype(np.int64), "select_index": sel,
    }


def _orig_rotate(key):
    def run(t, device):
        ids = t["input_ids"]
        originals.load(key)(ids, t["extend_start_loc"], t["extend_seq_lens"], t["topk_index"], t["select_index"])
        return {"input_ids": ids}
    return run


def _jax_rotate(fn, j, impl):
    return {"input_ids": fn(j["input_ids"], j["extend_start_loc"], j["extend_seq_lens"], j["topk_index"],
                            j["select_index"], **impl)}


_ROTATE_CONFIGS = (_cfg(B=4, Lmax=6, select=False), _cfg(B=4, Lmax=6, select=True), _cfg(B=16, Lmax=12, select=True))
_register(OpDef("rotate_input_ids", "jaxspec.kernels.multi_layer_eagle:rotate_input_ids", "rotate_input_ids",
                _ROTATE_CONFIGS, _gen_rotate, _orig_rotate("rotate_input_ids"), _jax_rotate, has_implementation=True))
_register(OpDef("rotate_input_ids@sglang-0.5.23", "jaxspec.kernels.multi_layer_eagle:rotate_input_ids",
                "rotate_input_ids@sglang-0.5.23", _ROTATE_CONFIGS[1:2], _gen_rotate,
                _orig_rotate("rotate_input_ids@sglang-0.5.23"), _jax_rotate, has_implementation=True))


def _gen_hidden_pool(rng, c):
    b, s, h, rows = c["B"], c["S"], c["H"], c["R"]
    lens, starts = _segments(rng, b, s - 1, s + 3)  # >= S-1 rows per segment (shorter ones read the previous one)
    total = b * (s + 3)  # fixed row count (one jit shape per config); rows past the segments are never read
    return {
        "hidden_states": rng.standard_normal((total, h)).astype(np.float32),
        "req_pool_indices": rng.choice(rows, b, replace=False).astype(np.int64),
        "req_to_hidden_states_pool": rng.standard_normal((rows, s - 1, h)).astype(np.float32),
        "extend_seq_lens": lens, "extend_start_loc": starts,
    }


def _orig_hidden_pool(t, device):
    pool = t["req_to_hidden_states_pool"]
    b = t["req_pool_indices"].numel()
    originals.load("assign_hidden_states_pool")(t["hidden_states"], t["req_pool_indices"], pool, pool.shape[1], b,
                                                t["extend_seq_lens"], t["extend_start_loc"])
    return {"req_to_hidden_states_pool": pool}


def _jax_hidden_pool(fn, j, impl):
    return {"req_to_hidden_states_pool": fn(j["hidden_states"], j["req_pool_indices"], j["req_to_hidden_states_pool"],
                                            j["extend_seq_lens"], j["extend_start_loc"], **impl)}


_register(OpDef("assign_hidden_states_pool", "jaxspec.kernels.multi_layer_eagle:assign_hidden_states_pool",
                "assign_hidden_states_pool",
                (_cfg(B=3, S=3, H=16, R=5), _cfg(B=2, S=4, H=80, R=4), _cfg(B=8, S=2, H=64, R=9)),
                _gen_hidden_pool, _orig_hidden_pool, _jax_hidden_pool, has_implementation=True))


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

