"""Side-by-side op definitions: the kernels (SGLang cache locations and KV move, TokenSpeed paged
cache locations, the MTP helpers of SGLang 0.5.12).

Each op registers an ``OpDef`` (input generator, original runner, jaxspec runner, configs) with the harness."""

import numpy as np
import torch

from jaxspec.interop import originals
from jaxspec.interop.registry import OpDef, config, register
from jaxspec.testing import random_accept_index

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
    np2 = originals.next_power_of_2
    originals.load("assign_extend_cache_locs")[(b,)](
        t["req_pool_indices"], t["req_to_token"], t["start_offset"], t["end_offset"], out,
        t["req_to_token"].shape[1], np2(b),
    )
    return {"out_cache_loc": out}


def _jax_extend(fn, j, impl):
    return {"out_cache_loc": fn(j["req_pool_indices"], j["req_to_token"], j["start_offset"], j["end_offset"],
                                out_size=j["out_size"], **impl)}


register(OpDef("assign_extend_cache_locs", "jaxspec.kernels.cache_locs:assign_extend_cache_locs",
                "assign_extend_cache_locs",
                (config(B=4, R=6, W=24, N=6), config(B=1, R=2, W=8, N=8), config(B=7, R=9, W=40, N=5)),
                _gen_extend, _orig_extend, _jax_extend, has_implementation=True))


def _gen_accept_loc(rng, c):
    b, a, n = c["B"], c["A"], c["N"]
    idx, _ = random_accept_index(rng, b, a, n)
    return {"accept_index": idx, "out_cache_loc": rng.integers(1, 10**6, b * n).astype(np.int64)}


def _orig_accept_loc(t, device):
    size = t["accept_index"].numel()  # 0.5.23: bs * accept_index.shape[1]
    out = torch.zeros((size,), dtype=torch.int64, device=device)
    np2 = originals.next_power_of_2
    originals.load("fill_accept_out_cache_loc")[(size,)](t["accept_index"], t["out_cache_loc"], out, np2(size))
    return {"accept_out_cache_loc": out}


def _jax_accept_loc(fn, j, impl):
    return {"accept_out_cache_loc": fn(j["accept_index"], j["out_cache_loc"], **impl)}


register(OpDef("fill_accept_out_cache_loc", "jaxspec.kernels.cache_locs:fill_accept_out_cache_loc",
                "fill_accept_out_cache_loc", (config(B=4, A=4, N=6), config(B=2, A=2, N=2), config(B=3, A=5, N=8)),
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
    idx, lens = random_accept_index(rng, b, a, n)
    windows = rng.choice(np.arange(1, x), size=(b, n), replace=False)  # slot 0 is the dummy slot
    tgt, src = [], []
    for r in range(b):  # spec-accept move: accepted node a_k -> window slot k (docs/ops.md, "move_accept_tokens_to_target_kvcache")
        nodes = idx[r, : lens[r]] - r * n
        tgt += list(windows[r, : lens[r]])
        src += list(windows[r, nodes])
    pad = b * a - len(tgt)
    return {"k_buffer": k, "v_buffer": v, "tgt_loc": np.asarray(tgt + [0] * pad, np.int64), "src_loc": np.asarray(src + [0] * pad, np.int64)}


def _orig_kv_move(t, device):
    k, v = t["k_buffer"], t["v_buffer"]
    bufs = [*k.unbind(0), *v.unbind(0)]  # SGLang's per-layer k_buffer / v_buffer lists
    data_ptrs = torch.tensor([x.data_ptr() for x in bufs], dtype=torch.uint64, device=device)
    strides = torch.tensor([x.stride(0) * x.dtype.itemsize for x in bufs], device=device)
    stride = int(strides[0])
    # memory_pool._init_kv_copy_and_warmup's tiling heuristics
    bpt = 512 if stride >= 8192 else (256 if stride >= 4096 else 128)
    num = t["tgt_loc"].numel()
    np2 = originals.next_power_of_2
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


register(OpDef("move_kv_cache", "jaxspec.kernels.kv_move:move_kv_cache", "move_kv_cache",
                (config(L=2, X=48, H=2, E=8, dtype="bf16", B=3, N=6, A=4),
                 config(L=1, X=40, H=4, E=64, dtype="fp16", B=2, N=8, A=5),
                 config(L=3, X=24, H=1, E=16, dtype="bf16", B=4, N=5, A=5)),
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


register(OpDef("update_req_to_page", "jaxspec.kernels.paged_cache_locs:update_req_to_page", "update_req_to_page",
                (config(R=6, M=8, B=4), config(R=3, M=4, B=1), config(R=17, M=16, B=16)),
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


register(OpDef("compute_out_cache_loc", "jaxspec.kernels.paged_cache_locs:compute_out_cache_loc",
                "compute_out_cache_loc",
                (config(R=6, M=8, B=4, P=4), config(R=5, M=6, B=3, P=1), config(R=16, M=4, B=16, P=16, Lmax=9)),
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


register(OpDef("compute_out_cache_loc_uniform", "jaxspec.kernels.paged_cache_locs:compute_out_cache_loc_uniform",
                "compute_out_cache_loc_uniform",
                (config(R=6, M=8, B=4, P=4, U=3), config(R=5, M=6, B=3, P=1, U=1), config(R=16, M=4, B=16, P=16, U=5)),
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


register(OpDef("fused_decode_input_prep", "jaxspec.kernels.paged_cache_locs:fused_decode_input_prep",
                "fused_decode_input_prep",
                (config(R=6, M=8, B=4, P=4, U=3), config(R=5, M=6, B=3, P=1, U=1), config(R=16, M=4, B=16, P=16, U=5)),
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


_ROTATE_CONFIGS = (config(B=4, Lmax=6, select=False), config(B=4, Lmax=6, select=True), config(B=16, Lmax=12, select=True))
register(OpDef("rotate_input_ids", "jaxspec.kernels.multi_layer_eagle:rotate_input_ids", "rotate_input_ids",
                _ROTATE_CONFIGS, _gen_rotate, _orig_rotate("rotate_input_ids"), _jax_rotate, has_implementation=True))
register(OpDef("rotate_input_ids@sglang-0.5.23", "jaxspec.kernels.multi_layer_eagle:rotate_input_ids",
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


register(OpDef("assign_hidden_states_pool", "jaxspec.kernels.multi_layer_eagle:assign_hidden_states_pool",
                "assign_hidden_states_pool",
                (config(B=3, S=3, H=16, R=5), config(B=2, S=4, H=80, R=4), config(B=8, S=2, H=64, R=9)),
                _gen_hidden_pool, _orig_hidden_pool, _jax_hidden_pool, has_implementation=True))
