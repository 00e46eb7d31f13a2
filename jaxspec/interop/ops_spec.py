"""Side-by-side op definitions: the pipeline ops (select_top_k_tokens, build_tree, verify, sampling, bonus).

Each op registers an ``OpDef`` (input generator, original runner, jaxspec runner, configs) with the harness."""

import math

import numpy as np
import torch

from jaxspec.interop import originals
from jaxspec.interop.registry import OpDef, config, register
from jaxspec.testing import draft_lists, organize, random_accept_index, tree_links


def _draft_tree(rng, b, s, k, n, vocab=32000):
    """int64 ``(parent_list, top_scores_index, draft_tokens)`` of a valid random draft tree (probabilities in
    (0.05, 0.95): every child scores strictly below its parent, so the selection is parent-closed)."""
    d = draft_lists(rng, b, s, k, vocab=vocab)
    return organize(d.score_list, d.token_list, d.parents_list, n)


# ----------------------------------------------------------------------------------------------------
# jaxspec.ops.draft.select_top_k_tokens  vs  sglang 0.5.23 spec_utils.select_top_k_tokens (torch)


_F32_TINY = np.finfo(np.float32).tiny  # 1.18e-38: the smallest normal float32

# The two classes of input on which jaxspec's select_top_k_tokens is documented to differ from the torch original
# (see its docstring). The "ties" / "subnormals" configs below generate them on purpose.
SELECT_KNOWN_DIFFERENCES = {
    "ties": "exact ties among a row's K*K cumulative scores: torch.topk's order among equal values is "
            "implementation-defined, jaxspec (lax.top_k) takes the lowest flat index, so the chosen beams "
            "(input_ids, parents, hidden_states) may differ; the multiset of selected scores is the same",
    "subnormals": "cumulative scores below 1.18e-38 (float32 subnormals): XLA flushes them to zero, torch keeps "
                  "them, so in jaxspec they compare as 0 (a tie resolved to the lowest index) and the selected "
                  "beams and scores may differ",
}


def _gen_select(rng, c):
    b, k, h, step = c["B"], c["K"], c["H"], c["step"]
    rows = b if step == 0 else b * k
    case = c.get("case", "random")
    if case == "ties":  # few distinct values: exact ties among the K*K products (powers of two: exact products)
        p = -np.sort(-rng.choice(np.float32([0.5, 0.25, 0.125]), (rows, k)), axis=1)
        scores = rng.choice(np.float32([0.5, 0.25]), (b, k))
    elif case == "subnormals":  # scores deep below the normal range (as deep, wide trees can reach)
        p = -np.sort(-rng.uniform(0.01, 1.0, (rows, k)).astype(np.float32), axis=1)
        scores = (rng.uniform(1.0, 64.0, (b, k)) * _F32_TINY / 256).astype(np.float32)
    else:
        p = -np.sort(-rng.uniform(0.01, 1.0, (rows, k)).astype(np.float32), axis=1)
        scores = rng.uniform(0.01, 1.0, (b, k)).astype(np.float32)
    return {
        "step": step,
        "topk_p": p,
        "topk_index": rng.integers(0, 32000, (rows, k)).astype(np.int64),
        "hidden_states": rng.standard_normal((rows, h)).astype(np.float32),
        "scores": None if step == 0 else scores,
        "topk": k,
    }


def _classify_select(t) -> str | None:
    """The known-difference class of a select_top_k_tokens input (step >= 1 only: step 0 selects nothing)."""
    if t["step"] == 0:
        return None
    k, b = t["topk"], t["scores"].shape[0]
    expand = np.asarray(t["scores"], np.float32)[:, :, None] * np.asarray(t["topk_p"], np.float32).reshape(b, k, k)
    flat = expand.reshape(b, k * k)
    if np.any((np.abs(flat) < _F32_TINY) & (flat != 0)) or np.any((np.abs(t["scores"]) < _F32_TINY) & (t["scores"] != 0)):
        return "subnormals"
    if any(len(np.unique(row)) < row.size for row in flat):
        return "ties"
    return None


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


register(OpDef(
    "select_top_k_tokens", "jaxspec.ops.draft:select_top_k_tokens", "select_top_k_tokens",
    (config(B=3, K=2, H=8, step=0), config(B=3, K=2, H=8, step=1), config(B=2, K=4, H=8, step=2),
     config(B=4, K=1, H=8, step=1),
     # the documented differences, generated on purpose (reported in the "known" column, never as mismatches)
     config(B=4, K=3, H=8, step=1, case="ties"), config(B=4, K=3, H=8, step=1, case="subnormals")),
    _gen_select, _orig_select, _jax_select,
    known_differences=SELECT_KNOWN_DIFFERENCES, classify=_classify_select,
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.ops.tree.build_tree  vs  sglang 0.5.23 spec_tree.sgl_build_tree_kernel_triton (+ CUDA on GPU)

_MAX_SEQ = 20  # seq_lens drawn in [1, _MAX_SEQ]; FULL_MASK buffers sized with B * _MAX_SEQ (one jit shape)


def _gen_tree(rng, c):
    from jaxspec.config import SpecConfig

    b, s, k, n = c["B"], c["S"], c["K"], c["N"]
    plist, sel, dtok = _draft_tree(rng, b, s, k, n)
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
    from jaxspec.ops.tree import TreeMaskMode

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
    config(B=3, S=3, K=2, N=6, mode=0), config(B=3, S=3, K=2, N=6, mode=1), config(B=2, S=1, K=4, N=4, mode=0),
    config(B=4, S=4, K=1, N=5, mode=1), config(B=2, S=4, K=4, N=8, mode=0),
)
register(OpDef("build_tree", "jaxspec.ops.tree:build_tree", "build_tree", _TREE_CONFIGS, _gen_tree, _orig_tree,
                _jax_tree))
register(OpDef(
    "build_tree@cuda", "jaxspec.ops.tree:build_tree", "build_tree@cuda",
    _TREE_CONFIGS + (config(B=3, S=3, K=2, N=6, mode=2), config(B=16, S=5, K=4, N=8, mode=2),
                     config(B=16, S=5, K=4, N=8, mode=0), config(B=4, S=3, K=4, N=12, mode=2)),
    _gen_tree, _orig_tree_cuda, _jax_tree, devices=("cuda",),
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.ops.verify.verify_tree_greedy  vs  spec_tree.verify_tree_greedy_triton (+ CUDA on GPU)


def _gen_verify(rng, c):
    b, s, k, n, vocab = c["B"], c["S"], c["K"], c["N"], 8
    plist, sel, dtok = _draft_tree(rng, b, s, k, n, vocab=vocab)
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


_VERIFY_CONFIGS = (config(B=3, S=3, K=2, N=6), config(B=4, S=4, K=1, N=5), config(B=2, S=1, K=4, N=4),
                   config(B=2, S=4, K=4, N=8))
register(OpDef("verify_tree_greedy", "jaxspec.ops.verify:verify_tree_greedy", "verify_tree_greedy",
                _VERIFY_CONFIGS, _gen_verify, _orig_verify, _jax_verify))
register(OpDef("verify_tree_greedy@cuda", "jaxspec.ops.verify:verify_tree_greedy", "verify_tree_greedy@cuda",
                _VERIFY_CONFIGS + (config(B=16, S=5, K=4, N=8),), _gen_verify, _orig_verify_cuda, _jax_verify,
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


register(OpDef(
    "tree_speculative_sampling_target_only@cuda", "jaxspec.ops.verify:tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only@cuda",
    (config(B=3, S=3, K=2, N=6, V=64), config(B=4, S=4, K=1, N=5, V=30), config(B=16, S=5, K=4, N=8, V=4099),
     config(B=4, S=3, K=2, N=6, V=64, thr_single=0.5, thr_acc=0.5)),
    _gen_sampling, _orig_sampling_cuda, _jax_sampling, devices=("cuda",),
))


# ----------------------------------------------------------------------------------------------------
# jaxspec.ops.accept.fill_bonus_tokens  vs  eagle.py fill_bonus_tokens (Triton, 0.5.23 stride S+1)


def _gen_bonus(rng, c):
    b, a, n = c["B"], c["A"], c["N"]
    idx, lens = random_accept_index(rng, b, a, n)
    return {"predict": rng.integers(0, 32000, b * n).astype(np.int32), "accept_index": idx, "accept_lens": lens}


def _orig_bonus(t, device):
    b, a = t["accept_index"].shape
    accept_tokens = t["predict"][t["accept_index"].long()]  # as run_eagle_verify builds it (-1 wraps, unread)
    out = torch.empty((b,), dtype=torch.int32, device=device)
    originals.load("fill_bonus_tokens")[(b,)](accept_tokens, t["accept_lens"], out, a)
    return {"bonus_tokens": out}


def _jax_bonus(fn, j, impl):
    return {"bonus_tokens": fn(j["predict"], j["accept_index"], j["accept_lens"])}


register(OpDef("fill_bonus_tokens", "jaxspec.ops.accept:fill_bonus_tokens", "fill_bonus_tokens",
                (config(B=4, A=4, N=6), config(B=1, A=2, N=2), config(B=8, A=5, N=8)), _gen_bonus, _orig_bonus, _jax_bonus))
