"""SGLang 0.5.23's speculative bookkeeping step, run the way its CUDA v2 worker runs it, for whole-step side by side.

``OriginalStep`` launches the original kernels (``jaxspec.interop.originals``; ``python -m
jaxspec.interop.fetch``) with torch glue, as ``eagle_worker_common.run_eagle_verify`` does: torch ops for
organize (cat/topk/sort/gather) and the tree wrapper's buffers, the Triton tree builder
(``sgl_build_tree_kernel_triton``; K == 1: ``build_chain_tree``), ``verify_tree_greedy_triton``,
``prepare_verify_commit_outputs`` (bonus + new_seq_lens: the fused CUDA-path commit),
``move_accept_tokens_to_target_kvcache`` (fill_front / fill_accept kernels and the pool's
``copy_all_layer_kv_cache_tiled`` move with MHATokenToKVPool's tiling heuristic, chunked at its
``num_locs_upper``), ``assign_extend_cache_locs_uniform`` and ``assign_draft_cache_locs_contiguous``.
It also owns the original side's timing tools (CUDA sync, ``do_bench``, CUDA graph capture).

``compare_outputs`` / ``compare_pools`` check a jaxspec step against it exactly (the KV pool bit-exact);
``jax_pool_from_torch`` hands the torch pool's bits to JAX. ``bench/step.py`` composes and times both sides.
"""

import numpy as np
import torch
import triton
from jax import dlpack as jax_dlpack
from jax import numpy as jnp
from triton.testing import do_bench

from jaxspec.interop import originals
from jaxspec.testing import PoolShape, StepInputs

__all__ = ["OriginalStep", "compare_outputs", "compare_pools", "jax_pool_from_torch", "kv_copy_config", "to_numpy"]

QLEN_ONLY = 1  # TreeMaskMode.QLEN_ONLY


def kv_copy_config(row_bytes: int) -> dict:
    """MHATokenToKVPool._init_kv_copy_and_warmup's tiling heuristic (sglang 0.5.23 memory_pool.py):
    tile 512 B from 8 KiB rows, 256 B from 4 KiB, else 128 B; 8 warps for 512 B tiles, else 4;
    ``num_locs_upper`` (the move's chunk) 128 for 512 B tiles, else 256."""
    tile = 512 if row_bytes >= 8192 else (256 if row_bytes >= 4096 else 128)
    return {
        "bytes_per_tile": tile,
        "byte_tiles": (row_bytes + tile - 1) // tile,
        "num_warps": 4 if tile <= 256 else 8,
        "num_locs_upper": 128 if tile >= 512 else 256,
    }


class OriginalStep:
    """SGLang 0.5.23's verify/accept bookkeeping, launched the way its CUDA v2 worker launches it."""

    def __init__(self, pool: PoolShape, device: str):
        sg = originals.SGLANG
        spec = "sglang/kernels/ops/speculative"
        self.spec_tree = originals.load_file(*sg, f"{spec}/spec_tree.py")
        self.eagle = originals.load_file(*sg, f"{spec}/eagle.py")
        self.cache_locs = originals.load_file(*sg, f"{spec}/cache_locs.py")
        self.cache_move = originals.load_file(*sg, "sglang/kernels/ops/kvcache/cache_move.py")
        dev = self.dev = torch.device("cuda" if device == "cuda" else "cpu")
        self.pool_shape = pool
        # One allocation, K/V buffers as contiguous per-layer views [slots, heads, head_dim] (SGLang
        # allocates them one by one; the copy kernel only sees pointers + the row stride).
        self.kv = torch.empty((2, pool.layers, pool.slots, pool.kv_heads, pool.head_dim), dtype=torch.bfloat16, device=dev)
        bufs = [self.kv[0, l] for l in range(pool.layers)] + [self.kv[1, l] for l in range(pool.layers)]
        self.data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64, device=dev)
        self.data_strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], device=dev)
        self.kv_cfg = kv_copy_config(pool.row_bytes)

    def fill_pool(self, seed: int) -> None:
        """Random bf16 bit patterns, 14 random bits per element, always finite and normal: bit 14 (exponent
        MSB) cleared, bit 7 (exponent LSB) set. NaN payloads and subnormals are avoided because XLA's CPU
        gather/scatter quiets signalling NaNs (seen: a pure move changed ~1/256 of the words) and FTZ
        could flush subnormals; KV never holds those. Compared as int16 bits."""
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed)
        bits = self.kv.view(torch.int16)
        for i in range(2):
            for l in range(self.pool_shape.layers):  # per buffer, to bound the temporary
                b = bits[i, l]
                b.random_(-(2**15), 2**15 - 1, generator=g)
                b.bitwise_and_(~(1 << 14)).bitwise_or_(1 << 7)

    # ---- the pool's move_kv_cache (MHATokenToKVPool._move_kv_cache_impl)
    def move_kv_cache(self, tgt, src) -> None:
        n = tgt.numel()
        cap = self.kv_cfg["num_locs_upper"]
        kern = self.cache_move.copy_all_layer_kv_cache_tiled
        grid = (self.data_ptrs.numel(), self.kv_cfg["byte_tiles"])
        for start in range(0, n, cap):
            end = min(start + cap, n)
            kern[grid](
                self.data_ptrs, self.data_strides, tgt[start:end], src[start:end], end - start,
                originals.next_power_of_2(end - start), BYTES_PER_TILE=self.kv_cfg["bytes_per_tile"],
                num_warps=self.kv_cfg["num_warps"], num_stages=2,
            )

    # ---- one step
    def step(self, t: dict, S: int, K: int, N: int) -> dict:
        bs = t["seq_lens"].shape[0]
        dev = self.dev
        seq_lens = t["seq_lens"]
        if K > 1:
            # organize_draft_results (eagle_utils.py)
            scores = torch.cat(t["score_list"], dim=1).flatten(1)
            tokens = torch.cat(t["token_list"], dim=1)
            sel = torch.topk(scores, N - 1, dim=-1).indices
            sel = torch.sort(sel).values
            draft = torch.gather(tokens, index=sel, dim=1)
            parent_list = torch.cat(t["parents_list"][:-1], dim=1)
            # build_tree_kernel_efficient (QLEN_ONLY; the wrapper's buffers, then the Triton builder)
            draft_tokens = torch.cat((t["bonus_tokens"].unsqueeze(1), draft), dim=1).flatten()
            tree_mask = torch.full((N * bs * N,), True, dtype=torch.bool, device=dev)
            retrieve = torch.full((3, bs, N), -1, device=dev, dtype=torch.long)
            positions = torch.empty((bs * N,), device=dev, dtype=torch.long)
            self.spec_tree.sgl_build_tree_kernel_triton(
                parent_list, sel, seq_lens, tree_mask, positions, retrieve[0], retrieve[1], retrieve[2],
                K, S, N, QLEN_ONLY,
            )
            ri, rnt, rns = retrieve
        else:
            # K == 1 (0.5.23): the draft loop wrote (bs, S) tokens; build_chain_tree, QLEN_ONLY.
            tree_mask, positions, ri, rnt, rns, draft_tokens, _, _ = self.eagle.build_chain_tree(
                t["bonus_tokens"], t["chain_draft_tokens"], seq_lens
            )
        # eagle_sample, greedy path
        candidates = draft_tokens.reshape(bs, N)
        predict = torch.zeros((bs * N,), dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, S + 1), -1, dtype=torch.int32, device=dev)
        num_correct = torch.empty((bs,), dtype=torch.int32, device=dev)
        self.spec_tree.verify_tree_greedy_triton(
            predict, accept_index, num_correct, candidates, ri, rnt, rns, t["target_predict"]
        )
        accept_lens = num_correct + 1
        # run_eagle_verify on CUDA: fused commit outputs (K == 1 also prepares draft-extend inputs)
        if K == 1:
            new_seq_lens, bonus, _, _ = self.eagle.prepare_verify_commit_outputs(
                predict, accept_index, accept_lens, seq_lens, num_draft_tokens=N
            )
        else:
            new_seq_lens, bonus = self.eagle.prepare_verify_commit_outputs(predict, accept_index, accept_lens, seq_lens)
        out = dict(
            tree_mask=tree_mask, positions=positions, retrieve_index=ri, retrieve_next_token=rnt,
            retrieve_next_sibling=rns, draft_tokens=draft_tokens, predict=predict, accept_index=accept_index,
            accept_lens=accept_lens, bonus_tokens=bonus, new_seq_lens=new_seq_lens,
        )
        if K > 1:
            # _finalize_accept_tree_path -> move_accept_tokens_to_target_kvcache(..., accept_lens - 1, ...)
            num_correct_drafts = accept_lens - 1
            size = bs * accept_index.shape[1]
            tgt = torch.zeros(size, dtype=torch.int64, device=dev)
            src = torch.zeros(size, dtype=torch.int64, device=dev)
            # fill_front_out_cache_loc_func(num_correct_drafts + 1, out_cache_loc, tgt)
            num_front = num_correct_drafts + 1
            window = t["out_cache_loc"].view(bs, -1)
            rows = torch.arange(bs, device=dev)
            starts = torch.zeros_like(num_front)
            self.cache_locs.assign_extend_cache_locs[(bs,)](
                rows, window, starts, num_front, tgt, window.shape[1], originals.next_power_of_2(bs)
            )
            # fill_accept_out_cache_loc_func(accept_index, out_cache_loc, src, size)
            self.eagle.fill_accept_out_cache_loc[(size,)](accept_index, t["out_cache_loc"], src, originals.next_power_of_2(size))
            self.move_kv_cache(tgt, src)
            out.update(move_tgt=tgt, move_src=src)
        # next step: verify window (assign_extend_cache_locs_uniform_func) and draft slots
        # (assign_draft_cache_locs_contiguous_func, K*S columns)
        r2t = t["req_to_token"]
        next_window = torch.empty((bs * N,), dtype=torch.int64, device=dev)
        self.cache_locs.assign_extend_cache_locs_uniform[(bs,)](
            t["req_pool_indices"], r2t, new_seq_lens, next_window, r2t.shape[1], N
        )
        draft_locs = torch.empty((bs * K * S,), dtype=torch.int64, device=dev)
        self.cache_locs.assign_draft_cache_locs_contiguous[(bs,)](
            t["req_pool_indices"], r2t, new_seq_lens, draft_locs, r2t.shape[1], K, S, BS=bs
        )
        out.update(next_out_cache_loc=next_window, next_draft_cache_loc=draft_locs)
        return out

    def inputs(self, inp: StepInputs) -> dict:
        """The step's host inputs as tensors on this step's device (int64 where SGLang is int64)."""
        T = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(self.dev)  # noqa: E731
        return dict(
            score_list=[T(x) for x in inp.score_list], token_list=[T(x) for x in inp.token_list],
            parents_list=[T(x) for x in inp.parents_list], chain_draft_tokens=T(inp.chain_draft_tokens),
            bonus_tokens=T(inp.bonus_tokens), seq_lens=T(inp.seq_lens), req_pool_indices=T(inp.req_pool_indices),
            req_to_token=T(inp.req_to_token), out_cache_loc=T(inp.out_cache_loc),
            target_predict=T(inp.target_predict),
        )

    # ---- timing (the original side: CUDA sync, Triton's do_bench, CUDA graphs)
    def sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    @staticmethod
    def gpu_time_us(fn, rep_ms: int) -> float:
        """Median GPU time (us) of ``fn()`` by ``triton.testing.do_bench``."""
        return float(do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median")) * 1e3

    @staticmethod
    def capture_graph(fn):
        """``fn`` captured once in a ``torch.cuda.CUDAGraph`` (after two warm-up calls on a side stream)."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g

    def copy_gbps(self, nbytes: int, calls: int, wall_us) -> float:
        """torch's device-to-device copy bandwidth (bytes read + written per second, GB/s) for ``nbytes``;
        ``wall_us(fn, calls)`` times it off the GPU."""
        src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=self.dev)
        dst = torch.empty_like(src)
        us = self.gpu_time_us(lambda: dst.copy_(src), 200) if self.dev.type == "cuda" else wall_us(
            lambda: dst.copy_(src), calls)
        return 2 * nbytes / (us * 1e-6) / 1e9

    @staticmethod
    def versions() -> dict:
        return dict(torch=torch.__version__, triton=triton.__version__,
                    gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)


def jax_pool_from_torch(kv_torch):
    """Fresh JAX pools ``k, v`` of shape [L, X, H, E] with the torch pool's bits (copies)."""
    out = []
    for i in range(2):
        t = kv_torch[i].clone()  # JAX must not alias torch memory it will donate
        arr = jax_dlpack.from_dlpack(t)
        out.append(jnp.array(arr, copy=True))
        out[-1].block_until_ready()
        del arr, t
    return tuple(out)


def to_numpy(x) -> np.ndarray:
    """A torch tensor, JAX array or NumPy array as NumPy (host copy)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def compare_outputs(ours: dict, orig: dict, where: str) -> None:
    """Every output of the original step equals jaxspec's (integers by value, masks as bool); raises naming it."""
    for name in orig:
        if name not in ours:
            raise AssertionError(f"{where}: jaxspec step lacks output {name!r}")
        a, b = to_numpy(ours[name]), to_numpy(orig[name])
        if a.dtype == np.bool_ or b.dtype == np.bool_:
            a, b = a.astype(np.bool_), b.astype(np.bool_)
        else:
            a, b = a.astype(np.int64), b.astype(np.int64)
        if a.shape != b.shape or not np.array_equal(a, b):
            bad = "shape" if a.shape != b.shape else f"{int(np.sum(a != b))} of {a.size} entries differ"
            raise AssertionError(
                f"{where}: MISMATCH in {name!r} ({bad}); jaxspec {a.shape} {a.reshape(-1)[:16]} "
                f"vs original {b.shape} {b.reshape(-1)[:16]}"
            )


def compare_pools(k_pool, v_pool, kv_torch, where: str) -> None:
    """Bit-exact pool comparison (int16 views), per layer, without keeping a torch alias of the JAX pool
    (each layer slice is a fresh JAX array, exported and dropped)."""
    for i, (name, pool) in enumerate((("K", k_pool), ("V", v_pool))):
        for l in range(kv_torch.shape[1]):
            a = torch.from_dlpack(pool[l]).view(torch.int16).reshape(-1)
            b = kv_torch[i, l].view(torch.int16).reshape(-1)
            if not torch.equal(a, b):
                n = int((a != b).sum())
                raise AssertionError(f"{where}: MISMATCH in the KV pool ({name}, layer {l}): {n} int16 words differ")
            del a
