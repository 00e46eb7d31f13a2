"""One speculative "bookkeeping" step, jaxspec (one jit) vs the original SGLang 0.5.23 torch/Triton pipeline.

What one step is (model forwards left out), given per-request draft score/token/parent lists (produced
once up front, as ``select_top_k_tokens`` would), ``seq_lens``, ``req_to_token``, the verify
``out_cache_loc`` window, ``target_predict`` and the KV pool:

    organize draft results -> build tree (QLEN_ONLY) -> greedy verify -> bonus tokens
    -> accept (K > 1 only, as upstream: fill_accept_out_cache_loc src, fill_front_out_cache_loc tgt
       (0.5.23: the verify window front), KV move of all layers)
    -> next-step cache locations (new_seq_lens = seq_lens + accept_lens; next verify window
       req_to_token[req, new_seq_lens + 0..N-1]; next draft slots req_to_token[req, new_seq_lens + 0..K*S-1]).

jaxspec side: ONE jitted function per step, KV pool donated (``jaxspec.ops.{draft,tree,verify,accept}``
and ``jaxspec.kernels.{cache_locs,kv_move}``). Timed as wall per call from a Python loop (one
``block_until_ready`` at the end), as GPU kernel time per call (CUPTI, when jax's Mosaic GPU profiler
extension is present) and as R steps inside one jit (``lax.fori_loop``) divided by R.

Original side (SGLang 0.5.23 as its CUDA worker runs it, ``eagle_worker_common.run_eagle_verify``):
torch ops for organize (cat/topk/sort/gather) and the tree wrapper's buffers, the Triton tree builder
(``sgl_build_tree_kernel_triton``; K == 1: ``build_chain_tree``), ``verify_tree_greedy_triton``,
``prepare_verify_commit_outputs`` (bonus + new_seq_lens: the fused CUDA-path commit),
``move_accept_tokens_to_target_kvcache`` (fill_front / fill_accept kernels and the pool's
``copy_all_layer_kv_cache_tiled`` move with MHATokenToKVPool's tiling heuristic, chunked at its
``num_locs_upper``), ``assign_extend_cache_locs_uniform`` and ``assign_draft_cache_locs_contiguous``.
Files come from ``jaxspec.interop.originals`` (``python -m jaxspec.interop.fetch``). Timed eagerly
(wall per step in a Python loop; GPU time with ``triton.testing.do_bench``) and captured once in a
``torch.cuda.CUDAGraph`` (``do_bench`` of ``replay``).

Both run on the same inputs in the same process and every output is compared exactly (tree arrays,
predict, accept_index, accept_lens, bonus, new_seq_lens, move src/tgt, the whole KV pool bit-exact,
next cache locations) before anything is timed; a mismatch raises.

Physical floor: the step's bytes (KV move ``2 * bs*(S+1) * layers * 2 * row_bytes`` plus the small
index arrays) over the device-to-device copy bandwidth measured in the same run (jnp and torch).

CLI: ``python bench/step.py [--device cuda|cpu] [--batch-sizes 1,16,64,256] [--configs tree,chain]
[--json PATH] [--png PATH] [--quick] [--debug] [--check-only] [--breakdown] [--move accept|pairs]
[--no-pack] [--command-buffers]``. ``--device cpu`` runs tiny pools under the Triton interpreter and
Pallas interpret mode (the smoke-test path; timings there are meaningless). ``--debug`` prints the number
of pool-sized copy ops and while loops in the compiled HLO and the top kernels (CUPTI).
The step's inputs go in as two packed buffers (``PackedStep``; ``--no-pack`` passes the ~25 arrays).
"""

import argparse
import dataclasses
import inspect
import json
import math
import os
import pathlib
import re
import sys
import time

import numpy as np

CONFIGS = {"tree": (5, 4, 8), "chain": (3, 1, 4)}  # (S, K, N): SGLang's Llama / DeepSeek defaults
VOCAB = 128256
QLEN_ONLY = 1  # TreeMaskMode.QLEN_ONLY

# Filled by _init_backends() (heavy imports happen after the CLI has set the environment).
jax = jnp = torch = triton = None


# --------------------------------------------------------------------------------------------------
# configuration


@dataclasses.dataclass(frozen=True)
class PoolShape:
    """KV pool: ``layers`` x (K, V) x ``slots`` rows of ``kv_heads * head_dim`` elements (bf16)."""

    layers: int
    kv_heads: int
    head_dim: int
    slots: int

    @property
    def row_elems(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def row_bytes(self) -> int:
        return 2 * self.row_elems

    @property
    def nbytes(self) -> int:
        return self.layers * 2 * self.slots * self.row_bytes


GPU_POOL = PoolShape(layers=32, kv_heads=8, head_dim=128, slots=2**17)  # 17.2 GB per copy
CPU_POOL = PoolShape(layers=2, kv_heads=2, head_dim=64, slots=2**11)


@dataclasses.dataclass(frozen=True)
class Reps:
    wall_calls: int  # Python-loop calls timed for wall per step
    loop_steps: int  # R: steps inside one jit (fori_loop)
    bench_ms: int  # do_bench rep budget (ms)


FULL_REPS = Reps(wall_calls=200, loop_steps=200, bench_ms=100)
QUICK_REPS = Reps(wall_calls=50, loop_steps=50, bench_ms=30)
CPU_REPS = Reps(wall_calls=2, loop_steps=2, bench_ms=0)


def _bootstrap_repo_imports() -> None:
    """Make ``jaxspec`` (+ ``jaxspec.kernels`` -> ``kernels/``, ``jaxspec.interop`` -> ``interop/``) importable
    from a bare checkout (e.g. the GPU box, no ``pip install -e .``), mirroring pyproject's package-dir."""
    import importlib.util

    repo = pathlib.Path(__file__).resolve().parents[1]
    try:
        import jaxspec.kernels  # noqa: F401
        import jaxspec.interop  # noqa: F401
        return
    except ImportError:
        pass
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    import jaxspec

    for sub in ("kernels", "interop"):
        name = f"jaxspec.{sub}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(
            name, repo / sub / "__init__.py", submodule_search_locations=[str(repo / sub)]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        setattr(jaxspec, sub, mod)


# XLA GPU command buffers (CUDA graphs) for the whole step, while loops included: XLA otherwise launches
# each of the step's ~60 kernels from the host (tens of us of dispatch at bs 1). Opt-in: --command-buffers.
COMMAND_BUFFER_FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1"


def _init_backends(device: str, command_buffers: bool = False) -> None:
    """Set the environment for ``device`` and import jax / torch / triton."""
    global jax, jnp, torch, triton
    if command_buffers:
        if "jax" in sys.modules:
            raise RuntimeError("--command-buffers must be set before jax is imported")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + COMMAND_BUFFER_FLAGS).strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _bootstrap_repo_imports()
    import jax as _jax
    import jax.numpy as _jnp
    import torch as _torch
    import triton as _triton

    jax, jnp, torch, triton = _jax, _jnp, _torch, _triton
    if device == "cuda" and jax.default_backend() != "gpu":
        raise RuntimeError(f"--device cuda: jax sees no GPU (default backend {jax.default_backend()!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device")


# --------------------------------------------------------------------------------------------------
# inputs (NumPy, int64 where SGLang is int64)


@dataclasses.dataclass
class StepInputs:
    S: int
    K: int
    N: int
    score_list: list  # f32: (B,1,K), then (B,K,K) per later step
    token_list: list  # i64: (B,K), then (B,K*K)
    parents_list: list  # i64: (B,K+1), then (B,K)
    chain_draft_tokens: np.ndarray  # i64 (B,S): the K == 1 draft buffer (= concat(token_list))
    bonus_tokens: np.ndarray  # i32 (B,)
    seq_lens: np.ndarray  # i64 (B,)
    req_pool_indices: np.ndarray  # i64 (B,)
    req_to_token: np.ndarray  # i32 (R, W)
    out_cache_loc: np.ndarray  # i64 (B*N,): verify window req_to_token[req, seq + 0..N-1]
    target_predict: np.ndarray  # i64 (B, N)
    expected_accept_lens: np.ndarray  # i32 (B,): the path length target_predict was built for

    @property
    def bs(self) -> int:
        return int(self.seq_lens.shape[0])


def _softmax_topk(rng, rows: int, k: int, width: int = 64):
    """(rows, k) descending probabilities from a softmax over ``width`` random logits, distinct tokens."""
    logits = rng.standard_normal((rows, width)).astype(np.float32) * 3.0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    order = np.argsort(-p, axis=1, kind="stable")[:, :k]
    probs = np.take_along_axis(p, order, 1)
    tokens = rng.integers(0, VOCAB, size=(rows, k), dtype=np.int64)
    for r in range(rows):  # a beam's top-k tokens are distinct
        while len(set(tokens[r].tolist())) < k:
            tokens[r] = rng.integers(0, VOCAB, size=k, dtype=np.int64)
    return probs, tokens


def _draft_lists(rng, bs: int, S: int, K: int):
    """Score/token/parent lists exactly as S rounds of ``select_top_k_tokens`` record them (ops-spec §1)."""
    p0, t0 = _softmax_topk(rng, bs, K)
    score_list, token_list = [p0[:, None, :]], [t0]
    parents_list = [np.broadcast_to(np.arange(-1, K, dtype=np.int64), (bs, K + 1)).copy()]
    scores = p0
    for i in range(1, S):
        p, t = _softmax_topk(rng, bs * K, K)
        expand = (scores[:, :, None] * p.reshape(bs, K, K)).astype(np.float32)
        flat = expand.reshape(bs, K * K)
        cs_idx = np.argsort(-flat, axis=1, kind="stable")[:, :K]
        scores = np.take_along_axis(flat, cs_idx, 1)
        score_list.append(expand)
        token_list.append(t.reshape(bs, K * K))
        parents_list.append(cs_idx.astype(np.int64) + (K * K * (i - 1) + K))
    return score_list, token_list, parents_list


def _np_tree(score_list, token_list, parents_list, S, K, N):
    """Organize + parent/link structure (ops-spec §2.2/§3.2-3.3) for building ``target_predict``."""
    bs = score_list[0].shape[0]
    s = np.concatenate([x.reshape(bs, -1) for x in score_list], 1)
    t = np.concatenate(token_list, 1)
    order = np.argsort(-s, axis=1, kind="stable")
    if N - 1 < s.shape[1]:
        kth, nxt = np.take_along_axis(s, order[:, N - 2 : N], 1).T
        if np.any(kth == nxt):
            return None  # a tie at the top-(N-1) boundary: torch.topk's choice is unspecified
    sel = np.sort(order[:, : N - 1], axis=1)
    dt = np.take_along_axis(t, sel, 1)
    pl = np.concatenate(parents_list[:-1], 1) if S > 1 else np.zeros((bs, 0), np.int64)
    children = [[[] for _ in range(N)] for _ in range(bs)]
    for b in range(bs):
        for tt in range(1, N):
            ptb = sel[b, tt - 1] // K
            if ptb == 0:
                p = 0
            else:
                hit = np.nonzero(sel[b] == pl[b, ptb])[0]
                if len(hit) == 0:
                    return None  # malformed tree (parent not selected): regenerate
                p = int(hit[0]) + 1
            children[b][p].append(tt)
    return sel, dt, children


def make_inputs(S: int, K: int, N: int, bs: int, pool: PoolShape, max_bs: int, seed: int) -> StepInputs:
    rng = np.random.default_rng(seed)
    for _ in range(100):
        score_list, token_list, parents_list = _draft_lists(rng, bs, S, K)
        tree = _np_tree(score_list, token_list, parents_list, S, K, N)
        if tree is not None:
            break
    else:  # pragma: no cover
        raise RuntimeError("could not draw a tie-free draft tree")
    sel, dt, children = tree
    cand = np.concatenate([np.zeros((bs, 1), np.int64), dt], 1)

    # target_predict: copy the draft tokens along a random root-ward path, stop at a random depth with a
    # token that matches no child there, so accept lengths spread over 1..S+1.
    target = rng.integers(0, VOCAB, size=(bs, N), dtype=np.int64)
    accept = np.ones(bs, np.int32)
    for b in range(bs):
        stop, node = int(rng.integers(0, S + 1)), 0
        for _ in range(stop):
            if not children[b][node]:
                break
            child = children[b][node][int(rng.integers(0, len(children[b][node])))]
            target[b, node] = cand[b, child]
            node = child
            accept[b] += 1
        kids = {int(cand[b, c]) for c in children[b][node]}
        while int(target[b, node]) in kids:
            target[b, node] = int(rng.integers(0, VOCAB))
    # req_to_token: a random permutation of slots 1..X-1 (slot 0 is the dummy), R = max_bs + 1 rows.
    rows = max_bs + 1
    width = (pool.slots - 1) // rows
    margin = S + 1 + max(N, K * S) + 1
    if width < margin + 8:
        raise ValueError(f"pool of {pool.slots} slots too small for {rows} request rows")
    perm = rng.permutation(np.arange(1, pool.slots, dtype=np.int32))[: rows * width]
    req_to_token = perm.reshape(rows, width)
    req_pool_indices = rng.choice(np.arange(1, rows), size=bs, replace=False).astype(np.int64)
    seq_lens = rng.integers(4, width - margin, size=bs).astype(np.int64)
    window = req_to_token[req_pool_indices[:, None], seq_lens[:, None] + np.arange(N)[None, :]]
    bonus = rng.integers(0, VOCAB, size=bs).astype(np.int32)
    return StepInputs(
        S=S, K=K, N=N,
        score_list=score_list, token_list=token_list, parents_list=parents_list,
        chain_draft_tokens=np.concatenate(token_list, 1).astype(np.int64),
        bonus_tokens=bonus, seq_lens=seq_lens, req_pool_indices=req_pool_indices,
        req_to_token=req_to_token, out_cache_loc=window.reshape(-1).astype(np.int64),
        target_predict=target, expected_accept_lens=accept,
    )


def step_bytes(inp: StepInputs, pool: PoolShape) -> dict:
    """Bytes one step must read + write: the KV move plus every small input/output array once."""
    bs, S, K, N = inp.bs, inp.S, inp.K, inp.N
    moved = bs * (S + 1) if K > 1 else 0  # the move runs over bs*(S+1) (tgt, src) pairs, as upstream
    kv = 2 * moved * pool.layers * 2 * pool.row_bytes
    small_in = sum(x.size * 4 for x in inp.score_list + inp.token_list + inp.parents_list)
    small_in += 4 * (3 * bs + 2 * bs * N)  # bonus, seq_lens, req idx, window, target_predict
    small_in += 4 * bs * (N + K * S)  # req_to_token entries read
    small_out = 4 * bs * (N * N / 4 + 7 * N + 3 * (S + 1) + 4 + N + K * S)  # tree (mask as bytes), verify, locs
    return {"moved_locations": moved, "kv_bytes": kv, "total_bytes": int(kv + small_in + small_out)}


# --------------------------------------------------------------------------------------------------
# the original pipeline (SGLang 0.5.23 kernels, torch)


def _kv_copy_config(row_bytes: int) -> dict:
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


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class Original:
    """SGLang 0.5.23's verify/accept bookkeeping, launched the way its CUDA v2 worker launches it."""

    def __init__(self, pool: PoolShape, dev):
        from jaxspec.interop import originals as o

        sg = o.SGLANG
        spec = "sglang/kernels/ops/speculative"
        self.spec_tree = o.load_file(*sg, f"{spec}/spec_tree.py")
        self.eagle = o.load_file(*sg, f"{spec}/eagle.py")
        self.cache_locs = o.load_file(*sg, f"{spec}/cache_locs.py")
        self.cache_move = o.load_file(*sg, "sglang/kernels/ops/kvcache/cache_move.py")
        self.dev = dev
        self.pool_shape = pool
        # One allocation, K/V buffers as contiguous per-layer views [slots, heads, head_dim] (SGLang
        # allocates them one by one; the copy kernel only sees pointers + the row stride).
        self.kv = torch.empty((2, pool.layers, pool.slots, pool.kv_heads, pool.head_dim), dtype=torch.bfloat16, device=dev)
        bufs = [self.kv[0, l] for l in range(pool.layers)] + [self.kv[1, l] for l in range(pool.layers)]
        self.data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64, device=dev)
        self.data_strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], device=dev)
        self.kv_cfg = _kv_copy_config(pool.row_bytes)

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
                _next_pow2(end - start), BYTES_PER_TILE=self.kv_cfg["bytes_per_tile"],
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
                rows, window, starts, num_front, tgt, window.shape[1], _next_pow2(bs)
            )
            # fill_accept_out_cache_loc_func(accept_index, out_cache_loc, src, size)
            self.eagle.fill_accept_out_cache_loc[(size,)](accept_index, t["out_cache_loc"], src, _next_pow2(size))
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


def torch_inputs(inp: StepInputs, dev) -> dict:
    T = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dev)  # noqa: E731
    return dict(
        score_list=[T(x) for x in inp.score_list], token_list=[T(x) for x in inp.token_list],
        parents_list=[T(x) for x in inp.parents_list], chain_draft_tokens=T(inp.chain_draft_tokens),
        bonus_tokens=T(inp.bonus_tokens), seq_lens=T(inp.seq_lens), req_pool_indices=T(inp.req_pool_indices),
        req_to_token=T(inp.req_to_token), out_cache_loc=T(inp.out_cache_loc), target_predict=T(inp.target_predict),
    )


# --------------------------------------------------------------------------------------------------
# the jaxspec step: one jit, pool donated


def jax_inputs(inp: StepInputs) -> dict:
    i32 = lambda x: jnp.asarray(np.asarray(x).astype(np.int32))  # noqa: E731 - values fit (checked ranges)
    return dict(
        score_list=[jnp.asarray(x) for x in inp.score_list], token_list=[i32(x) for x in inp.token_list],
        parents_list=[i32(x) for x in inp.parents_list], chain_draft_tokens=i32(inp.chain_draft_tokens),
        bonus_tokens=i32(inp.bonus_tokens), seq_lens=i32(inp.seq_lens), req_pool_indices=i32(inp.req_pool_indices),
        req_to_token=i32(inp.req_to_token), out_cache_loc=i32(inp.out_cache_loc), target_predict=i32(inp.target_predict),
    )


STAGES = ("tree", "verify", "move", "locs")  # prefixes of the step, for --breakdown


def make_jax_step(S: int, K: int, N: int, interpret: bool, move: str = "accept", upto: str = "locs"):
    """``step(k_pool, v_pool, inputs) -> (k_pool, v_pool, outputs)``: the whole bookkeeping step,
    traceable, no host syncs. ``move``: ``"accept"`` = ``move_accept_tokens_to_target_kvcache`` (the same
    pairs laid out request-aligned, fully parallel); ``"pairs"`` = 0.5.23's packed pairs from
    ``fill_front_out_cache_loc`` / ``fill_accept_out_cache_loc`` into ``move_kv_cache`` (one span)."""
    from jaxspec.config import SpecConfig
    from jaxspec.kernels import cache_locs as kcl
    from jaxspec.kernels import kv_move as kkv
    from jaxspec.ops import accept, draft, tree, verify

    cfg = SpecConfig(num_steps=S, topk=K, num_draft_tokens=N)
    kern = dict(interpret=True) if interpret else {}
    # build_tree's nodes have at most K children: verify can then scan siblings in K unrolled steps
    # (straight-line code) instead of an early-exit while_loop (a device->host round trip per iteration).
    verify_kw = dict(topk=K) if "topk" in inspect.signature(verify.verify_tree_greedy).parameters else {}

    def step(k_pool, v_pool, x):
        bs = x["seq_lens"].shape[0]
        if K > 1:
            dr = draft.organize_draft_results(x["score_list"], x["token_list"], x["parents_list"], num_draft_tokens=N)
            tr = tree.build_tree(
                x["bonus_tokens"], dr.parent_list, dr.top_scores_index, dr.draft_tokens, x["seq_lens"],
                config=cfg, mask_mode=tree.TreeMaskMode.QLEN_ONLY,
            )
        else:
            tr = tree.build_chain_tree(x["bonus_tokens"], x["chain_draft_tokens"], x["seq_lens"], config=cfg)
        vr = verify.verify_tree_greedy(
            tr.draft_tokens.reshape(bs, N), tr.retrieve_index, tr.retrieve_next_token, tr.retrieve_next_sibling,
            x["target_predict"], num_steps=S, **verify_kw,
        )
        accept_lens = vr.num_correct_drafts + 1
        bonus = accept.fill_bonus_tokens(vr.predict, vr.accept_index, accept_lens)
        new_seq_lens = x["seq_lens"] + accept_lens
        out = dict(
            tree_mask=tr.tree_mask, positions=tr.positions, retrieve_index=tr.retrieve_index,
            retrieve_next_token=tr.retrieve_next_token, retrieve_next_sibling=tr.retrieve_next_sibling,
            draft_tokens=tr.draft_tokens, predict=vr.predict, accept_index=vr.accept_index,
            accept_lens=accept_lens, bonus_tokens=bonus, new_seq_lens=new_seq_lens,
        )
        if upto == "tree":
            return k_pool, v_pool, {k: out[k] for k in ("tree_mask", "positions", "retrieve_index",
                                                        "retrieve_next_token", "retrieve_next_sibling", "draft_tokens")}
        if upto == "verify":
            return k_pool, v_pool, out
        if K > 1:  # upstream skips the move for K == 1 (the accepted chain already is the window front)
            if move == "accept":
                k_pool, v_pool = kkv.move_accept_tokens_to_target_kvcache(
                    k_pool, v_pool, vr.accept_index, accept_lens, x["out_cache_loc"], **kern
                )
            else:
                tgt = kcl.fill_front_out_cache_loc(accept_lens, x["out_cache_loc"], width=S + 1, **kern)
                src = kcl.fill_accept_out_cache_loc(vr.accept_index, x["out_cache_loc"], **kern)
                k_pool, v_pool = kkv.move_kv_cache(k_pool, v_pool, tgt, src, **kern)
                out.update(move_tgt=tgt, move_src=src)
        if upto == "move":
            return k_pool, v_pool, out
        out["next_out_cache_loc"] = kcl.assign_extend_cache_locs_uniform(
            x["req_pool_indices"], x["req_to_token"], new_seq_lens, width=N, **kern
        ).out_cache_loc
        out["next_draft_cache_loc"] = kcl.assign_draft_cache_locs(
            x["req_pool_indices"], x["req_to_token"], new_seq_lens, topk=K, num_steps=S, **kern
        ).out_cache_loc
        return k_pool, v_pool, out

    return step


def make_move_pairs(S: int, interpret: bool):
    """jaxspec's 0.5.23 move pairs (tgt, src), checked against the original's (not part of the timed step
    with ``--move accept``, whose kernel builds the same pairs request-aligned)."""
    from jaxspec.kernels import cache_locs as kcl

    kern = dict(interpret=True) if interpret else {}

    def pairs(accept_index, accept_lens, out_cache_loc):
        tgt = kcl.fill_front_out_cache_loc(accept_lens, out_cache_loc, width=S + 1, **kern)
        src = kcl.fill_accept_out_cache_loc(accept_index, out_cache_loc, **kern)
        return dict(move_tgt=tgt, move_src=src)

    return jax.jit(pairs)


def jax_pool_from_torch(kv_torch):
    """Fresh JAX pools ``k, v`` of shape [L, X, H, E] with the torch pool's bits (copies)."""
    out = []
    for i in range(2):
        t = kv_torch[i].clone()  # JAX must not alias torch memory it will donate
        arr = jax.dlpack.from_dlpack(t)
        out.append(jnp.array(arr, copy=True))
        out[-1].block_until_ready()
        del arr, t
    return tuple(out)


def _perturb(x: dict, token):
    """Make the step's inputs depend on the previous iteration (``token`` is always True at run time)
    so XLA cannot hoist loop-invariant work out of the in-jit timing loop."""
    y = dict(x)
    y["seq_lens"] = jnp.where(token, x["seq_lens"], jnp.zeros_like(x["seq_lens"]))
    y["score_list"] = [jnp.where(token, s, jnp.zeros_like(s)) for s in x["score_list"]]
    y["chain_draft_tokens"] = jnp.where(token, x["chain_draft_tokens"], jnp.zeros_like(x["chain_draft_tokens"]))
    y["target_predict"] = jnp.where(token, x["target_predict"], jnp.zeros_like(x["target_predict"]))
    return y


class PackedStep:
    """The step with its ~25 small input arrays packed into one int32 and one float32 buffer (static slices
    inside the jit, free for XLA). jit's per-call dispatch cost grows with the number of argument buffers
    (a few us each), which at small batch is much of the wall time of a ~15-60-kernel step. Outputs stay a
    dict: packing them too (concatenate, or dynamic_update_slice into one buffer) made XLA's CPU compile of
    the tree step take minutes (jax 0.10.2), a risk not worth taking untested on the GPU compiler."""

    def __init__(self, step, x_example: dict):
        leaves, self.in_tree = jax.tree_util.tree_flatten(x_example)
        self.in_layout = []  # (kind, offset, shape)
        off = {"i": 0, "f": 0}
        for leaf in leaves:
            kind = "f" if jnp.issubdtype(leaf.dtype, jnp.floating) else "i"
            self.in_layout.append((kind, off[kind], leaf.shape))
            off[kind] += leaf.size
        self.step = step

        def packed(k_pool, v_pool, ints, floats):
            leaves = []
            for kind, o, shape in self.in_layout:
                buf = floats if kind == "f" else ints
                leaves.append(jax.lax.slice(buf, (o,), (o + math.prod(shape),)).reshape(shape))
            return step(k_pool, v_pool, jax.tree_util.tree_unflatten(self.in_tree, leaves))

        self.jit = jax.jit(packed, donate_argnums=(0, 1))

    def pack(self, x: dict):
        leaves = jax.tree_util.tree_leaves(x)
        ints = [np.asarray(l).reshape(-1) for l, (k, _, _) in zip(leaves, self.in_layout) if k == "i"]
        floats = [np.asarray(l).reshape(-1) for l, (k, _, _) in zip(leaves, self.in_layout) if k == "f"]
        return (jnp.asarray(np.concatenate(ints).astype(np.int32)),
                jnp.asarray(np.concatenate(floats).astype(np.float32) if floats else np.zeros((0,), np.float32)))

    @staticmethod
    def unpack(out) -> dict:
        return {name: np.asarray(v) for name, v in out.items()}


def make_jax_loop(step, steps: int):
    """R steps in one jit: carry (pool, outputs); each step's inputs depend on the previous outputs."""

    def loop(k_pool, v_pool, x, out0):
        def body(_, carry):
            k_pool, v_pool, out = carry
            token = (out["accept_lens"][0] > 0) if "accept_lens" in out else (out["positions"][0] >= 0)
            return step(k_pool, v_pool, _perturb(x, token))

        return jax.lax.fori_loop(0, steps, body, (k_pool, v_pool, out0))

    return jax.jit(loop, donate_argnums=(0, 1))


# --------------------------------------------------------------------------------------------------
# comparison


def _np(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def compare_outputs(ours: dict, orig: dict, where: str) -> None:
    for name in orig:
        if name not in ours:
            raise AssertionError(f"{where}: jaxspec step lacks output {name!r}")
        a, b = _np(ours[name]), _np(orig[name])
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


# --------------------------------------------------------------------------------------------------
# timing helpers


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


WALL_BLOCKS = 4  # wall per call = the best of this many blocks of calls (the host is noisy: +-2x seen)


def time_torch_wall(fn, calls: int) -> float:
    fn()
    _sync()
    per = max(1, calls // WALL_BLOCKS)
    best = math.inf
    for _ in range(WALL_BLOCKS if calls >= WALL_BLOCKS else 1):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        _sync()
        best = min(best, (time.perf_counter() - t0) / per)
    return best * 1e6


def time_torch_gpu(fn, rep_ms: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median")) * 1e3


def capture_graph(fn):
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


def cupti_kernel_us(call, iterations: int = 10):
    """Sum of kernel durations per call (CUPTI through jax's Mosaic GPU extension); None if unavailable."""
    try:
        from jax._src.lib import mosaic_gpu as mgpu  # noqa: PLC0415 - optional, GPU-only
    except Exception:  # noqa: BLE001
        return None
    ext = getattr(mgpu, "_mosaic_gpu_ext", None)
    if ext is None or not hasattr(ext, "_cupti_init"):
        return None
    try:
        _sync()
        ext._cupti_init()
        try:
            for _ in range(iterations):
                call()
            _sync()
        finally:
            timings = ext._cupti_get_timings(True)
    except Exception as e:  # noqa: BLE001
        print(f"  (CUPTI timing unavailable: {e})", file=sys.stderr)
        return None
    if not timings:
        return None
    per_kernel = {}
    for name, t in timings:
        per_kernel[name] = per_kernel.get(name, 0.0) + t * 1e3 / iterations
    cupti_kernel_us.last_top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]
    cupti_kernel_us.last_count = len(timings) / iterations
    return sum(t for _, t in timings) / iterations * 1e3  # ms -> us


def copy_bandwidth(device: str) -> dict:
    """Device-to-device copy bandwidth (read + write bytes per second), jnp and torch."""
    nbytes = (2 << 30) if device == "cuda" else (16 << 20)
    n = nbytes // 2
    res = {}
    reps = 20 if device == "cuda" else 3
    # an elementwise pass (one read + one write per element), R times inside one jit so that neither
    # dispatch nor allocation is timed; the buffer ping-pongs through the loop carry.
    f = jax.jit(lambda a: jax.lax.fori_loop(0, reps, lambda _, y: y + jnp.bfloat16(1), a), donate_argnums=0)
    x = f(jnp.zeros((n,), jnp.bfloat16))
    x.block_until_ready()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        x = f(x)
        x.block_until_ready()
        best = min(best, time.perf_counter() - t0)
    res["jax_gbps"] = 2 * nbytes * reps / best / 1e9
    del x
    src = torch.ones(n, dtype=torch.bfloat16, device="cuda" if device == "cuda" else "cpu")
    dst = torch.empty_like(src)
    if device == "cuda":
        us = time_torch_gpu(lambda: dst.copy_(src), 200)
    else:
        us = time_torch_wall(lambda: dst.copy_(src), reps)
    res["torch_gbps"] = 2 * nbytes / (us * 1e-6) / 1e9
    del src, dst
    return res


def while_loop_report(compiled_text: str) -> str:
    """How many HLO while loops the compiled step has and how many have a known trip count (XLA GPU
    evaluates the predicate of the others on the host: a device->host round trip per iteration)."""
    total = known = 0
    for line in compiled_text.splitlines():
        if re.search(r"\swhile\(", line):
            total += 1
            known += "known_trip_count" in line
    return f"{total} while loops ({known} with a known trip count)"


def count_pool_copies(compiled_text: str, pool: PoolShape) -> int:
    """Copy ops in the compiled HLO whose result has the pool's element count."""
    n_elems = pool.layers * pool.slots * pool.row_elems
    count = 0
    for line in compiled_text.splitlines():
        s = line.strip()
        if "=" not in s:
            continue
        lhs, rhs = s.split("=", 1)
        op = rhs.strip()
        # "%copy.3 = bf16[32,131072,8,128]{...} copy(%p)" / copy-start / fusion kinds named copy
        m = re.match(r"(bf16|s16|u16|f16)\[([0-9,]*)\]\S*\s+(copy|copy-start)\(", op)
        if m:
            dims = [int(d) for d in m.group(2).split(",") if d]
            if dims and int(np.prod(dims)) == n_elems:
                count += 1
    return count


# --------------------------------------------------------------------------------------------------
# one (config, batch size)


def run_case(name, S, K, N, bs, args, pool: PoolShape, orig: "Original", reps: Reps, max_bs: int) -> dict:
    dev = orig.dev
    on_gpu = args.device == "cuda"
    inp = make_inputs(S, K, N, bs, pool, max_bs=max_bs, seed=1000 * bs + S * 10 + K)
    ti = torch_inputs(inp, dev)
    xi = jax_inputs(inp)
    where = f"{name} bs={bs}"

    # ---- correctness: same inputs, same pool bits, one step each
    orig.fill_pool(seed=bs)
    k_pool, v_pool = jax_pool_from_torch(orig.kv)
    step = make_jax_step(S, K, N, interpret=not on_gpu, move=args.move)
    if args.pack:
        ps = PackedStep(step, xi)
        jstep, xargs = ps.jit, ps.pack(xi)
    else:
        ps, jstep, xargs = None, jax.jit(step, donate_argnums=(0, 1)), (xi,)
    t0 = time.perf_counter()
    compiled = jstep.lower(k_pool, v_pool, *xargs).compile()
    compile_s = time.perf_counter() - t0
    k_pool, v_pool, out_j = jstep(k_pool, v_pool, *xargs)  # the jit fast path (same executable, cached)
    if ps is not None:
        out_j = ps.unpack(out_j)
    out_t = orig.step(ti, S, K, N)
    _sync()
    if K > 1 and "move_tgt" not in out_j:
        out_j = dict(out_j)
        out_j.update(make_move_pairs(S, interpret=not on_gpu)(out_j["accept_index"], out_j["accept_lens"], xi["out_cache_loc"]))
    compare_outputs(out_j, out_t, where)
    compare_pools(k_pool, v_pool, orig.kv, where)
    accept_lens = _np(out_t["accept_lens"])
    print(f"  {where}: outputs equal (tree, verify, bonus, move pairs, KV pool bit-exact, next cache locs); "
          f"mean accept_len {accept_lens.mean():.2f}; jax compile {compile_s:.1f}s", flush=True)
    if args.debug:
        txt = compiled.as_text()
        print(f"  [debug] {where}: pool-sized copy ops in the compiled step HLO: "
              f"{count_pool_copies(txt, pool)}; {while_loop_report(txt)}", flush=True)

    row = dict(config=name, S=S, K=K, N=N, bs=bs, mean_accept_len=float(accept_lens.mean()), checked=True)
    row.update(step_bytes(inp, pool))
    # rows that really change (tgt != src: not the root self-copy, not the 0 <- 0 padding)
    eff = int((_np(out_t["move_tgt"]) != _np(out_t["move_src"])).sum()) if K > 1 else 0
    row["moved_rows_effective"] = eff
    row["total_bytes_effective"] = row["total_bytes"] - row["kv_bytes"] + 2 * eff * pool.layers * 2 * pool.row_bytes
    if args.check_only:
        del k_pool, v_pool
        return row

    # ---- ours: wall per call (Python loop, one block at the end)
    # (calls go through jit's C++ dispatch path; calling the AOT ``Compiled`` object flattens pytrees in
    # Python and costs ~100 us more per call)
    k_pool, v_pool, out_p = jstep(k_pool, v_pool, *xargs)
    jax.block_until_ready(out_p)
    per = max(1, reps.wall_calls // WALL_BLOCKS)
    best = math.inf
    for _ in range(WALL_BLOCKS if reps.wall_calls >= WALL_BLOCKS else 1):
        t0 = time.perf_counter()
        for _ in range(per):
            k_pool, v_pool, out_p = jstep(k_pool, v_pool, *xargs)
        jax.block_until_ready((k_pool, v_pool, out_p))
        best = min(best, (time.perf_counter() - t0) / per)
    row["ours_wall_us"] = best * 1e6

    # ---- ours: GPU kernel time per call (CUPTI)
    row["ours_gpu_us"] = None
    if on_gpu:
        box = [k_pool, v_pool]

        def call():
            box[0], box[1], _o = jstep(box[0], box[1], *xargs)

        row["ours_gpu_us"] = cupti_kernel_us(call)
        if args.debug and row["ours_gpu_us"] is not None:
            top = ", ".join(f"{n[:48]} {t:.1f}" for n, t in cupti_kernel_us.last_top)
            print(f"  [debug] {where}: {cupti_kernel_us.last_count:.0f} kernels/step; top (us): {top}", flush=True)
        k_pool, v_pool = box
        del box

    # ---- ours: R steps in one jit
    loop = make_jax_loop(step, reps.loop_steps)
    _, _, shapes = jax.eval_shape(step, k_pool, v_pool, xi)
    out_j = {k: jnp.ones(sd.shape, sd.dtype) for k, sd in shapes.items()}  # loop carry seed (accept_lens > 0)
    lc = loop.lower(k_pool, v_pool, xi, out_j).compile()
    if args.debug:
        print(f"  [debug] {where}: pool-sized copy ops in the compiled loop HLO: "
              f"{count_pool_copies(lc.as_text(), pool)}", flush=True)
    k_pool, v_pool, out_l = lc(k_pool, v_pool, xi, out_j)
    jax.block_until_ready(out_l)
    best = math.inf
    for _ in range(3 if on_gpu else 1):
        t0 = time.perf_counter()
        k_pool, v_pool, out_l = lc(k_pool, v_pool, xi, out_l)
        jax.block_until_ready((k_pool, v_pool, out_l))
        best = min(best, time.perf_counter() - t0)
    row["ours_loop_us"] = best / reps.loop_steps * 1e6
    out_t.pop("move_tgt", None), out_t.pop("move_src", None)
    compare_outputs(out_l, out_t, where + " (in-jit loop outputs)")  # same inputs -> same outputs
    del out_l
    if args.breakdown:
        prev, parts = 0.0, {}
        for stage in STAGES[:-1]:
            sub = make_jax_step(S, K, N, interpret=not on_gpu, move=args.move, upto=stage)
            _, _, o0 = jax.jit(sub)(k_pool, v_pool, xi)
            sl = make_jax_loop(sub, reps.loop_steps).lower(k_pool, v_pool, xi, o0).compile()
            k_pool, v_pool, o = sl(k_pool, v_pool, xi, o0)
            jax.block_until_ready(o)
            t0 = time.perf_counter()
            k_pool, v_pool, o = sl(k_pool, v_pool, xi, o)
            jax.block_until_ready((k_pool, v_pool, o))
            t = (time.perf_counter() - t0) / reps.loop_steps * 1e6
            parts[stage], prev = t - prev, t
        parts["locs"] = row["ours_loop_us"] - prev
        row["breakdown_loop_us"] = parts
        print(f"  [breakdown] {where}: in-jit loop us/step by stage: "
              + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), flush=True)
    del k_pool, v_pool, out_j, out_p

    # ---- original: eager wall, eager GPU, CUDA graph GPU
    fn = lambda: orig.step(ti, S, K, N)  # noqa: E731
    row["orig_eager_wall_us"] = time_torch_wall(fn, reps.wall_calls)
    row["orig_eager_gpu_us"] = time_torch_gpu(fn, reps.bench_ms) if on_gpu else None
    row["orig_graph_gpu_us"] = None
    if on_gpu:
        g = capture_graph(fn)
        row["orig_graph_gpu_us"] = time_torch_gpu(g.replay, reps.bench_ms)
        del g
    return row


def finish_rows(rows: list, bw: dict) -> None:
    gbps = max(bw.get("jax_gbps", 0.0), bw.get("torch_gbps", 0.0))
    for r in rows:
        r["floor_us"] = r["total_bytes"] / (gbps * 1e9) * 1e6 if gbps else None
        r["floor_effective_us"] = r["total_bytes_effective"] / (gbps * 1e9) * 1e6 if gbps else None
        ours_gpu = r["ours_gpu_us"] if r["ours_gpu_us"] is not None else r["ours_loop_us"]
        r["ratio_wall_vs_eager"] = r["ours_wall_us"] / r["orig_eager_wall_us"]
        r["ratio_gpu_vs_graph"] = ours_gpu / r["orig_graph_gpu_us"] if r["orig_graph_gpu_us"] else None
        r["ratio_loop_vs_graph"] = r["ours_loop_us"] / r["orig_graph_gpu_us"] if r["orig_graph_gpu_us"] else None
        r["ratio_vs_floor"] = ours_gpu / r["floor_us"] if r["floor_us"] else None


def _f(v, nd=1):
    if v is None:
        return "-"
    return f"{v:.{nd}f}"


COLUMNS = (  # (header, row key, decimals)
    ("bs", "bs", None),
    ("ours wall", "ours_wall_us", 1),
    ("ours GPU", "ours_gpu_us", 1),
    ("ours loop", "ours_loop_us", 1),
    ("orig eager wall", "orig_eager_wall_us", 1),
    ("orig eager GPU", "orig_eager_gpu_us", 1),
    ("orig graph GPU", "orig_graph_gpu_us", 1),
    ("wall/eager", "ratio_wall_vs_eager", 3),
    ("GPU/graph", "ratio_gpu_vs_graph", 3),
    ("loop/graph", "ratio_loop_vs_graph", 3),
    ("floor", "floor_us", 2),
    ("GPU/floor", "ratio_vs_floor", 2),
    ("floor eff", "floor_effective_us", 2),
    ("acc len", "mean_accept_len", 2),
)


def print_table(rows: list, bw: dict) -> None:
    print(f"\ndevice-to-device copy bandwidth (read+write): jnp {bw['jax_gbps']:.0f} GB/s, "
          f"torch {bw['torch_gbps']:.0f} GB/s (floor uses the larger)")
    widths = [max(8, len(h)) for h, _, _ in COLUMNS]
    for cfg in dict.fromkeys(r["config"] for r in rows):
        sub = [r for r in rows if r["config"] == cfg]
        r0 = sub[0]
        print(f"\n{cfg}: S={r0['S']} K={r0['K']} N={r0['N']}  -- us per step. ours GPU = kernel time per call "
              f"(CUPTI); ours loop = R steps in one jit / R; orig GPU = do_bench (eager) / do_bench of the graph "
              f"replay; floor = bytes (move over bs*(S+1) pairs) / copy BW; floor eff = only rows with tgt != src")
        print("  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths)))
        for r in sub:
            cells = [str(r[k]) if nd is None else _f(r.get(k), nd) for _, k, nd in COLUMNS]
            print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


# --------------------------------------------------------------------------------------------------
# driver


def run(device: str = "cuda", batch_sizes=(1, 16, 64, 256), configs=("tree", "chain"), quick: bool = False,
        debug: bool = False, pool: PoolShape | None = None, move: str = "accept", check_only: bool = False,
        breakdown: bool = False, command_buffers: bool = False, pack: bool | None = None) -> dict:
    """Run the benchmark; returns the JSON-able result. ``check_only``: the correctness path only (every
    (config, batch size) compiled once and compared exactly, nothing timed). On CPU timings are tokens."""
    _init_backends(device, command_buffers=command_buffers)
    if pack is None:
        pack = True
    args = argparse.Namespace(device=device, debug=debug, move=move, check_only=check_only, breakdown=breakdown,
                              pack=pack)
    pool = pool or (GPU_POOL if device == "cuda" else CPU_POOL)
    reps = CPU_REPS if device == "cpu" else (QUICK_REPS if quick else FULL_REPS)
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    t_start = time.perf_counter()
    orig = Original(pool, dev)
    max_bs = max(batch_sizes)
    rows = []
    for name in configs:
        S, K, N = CONFIGS[name]
        for bs in batch_sizes:
            rows.append(run_case(name, S, K, N, bs, args, pool, orig, reps, max_bs))
    if check_only:
        return dict(meta=dict(device=device, check_only=True, total_s=time.perf_counter() - t_start), rows=rows)
    bw = copy_bandwidth(device)
    finish_rows(rows, bw)
    print_table(rows, bw)
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.1f}s")
    meta = dict(device=device, move=move, packed=pack, command_buffers=command_buffers, xla_flags=os.environ.get("XLA_FLAGS", ""), pool=dataclasses.asdict(pool), reps=dataclasses.asdict(reps),
                jax=jax.__version__, torch=torch.__version__, triton=triton.__version__,
                gpu=torch.cuda.get_device_name() if device == "cuda" else None, total_s=total)
    return dict(meta=meta, bandwidth=bw, rows=rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,16,64,256 on cuda, 1,4 on cpu)")
    p.add_argument("--configs", default="tree,chain")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--check-only", action="store_true", help="correctness only (compare every output), no timing")
    p.add_argument("--no-pack", action="store_true",
                   help="pass the step's ~25 inputs as separate arrays (default: two packed buffers)")
    p.add_argument("--command-buffers", action="store_true",
                   help="run the jaxspec step as XLA command buffers (CUDA graphs), while loops included")
    p.add_argument("--breakdown", action="store_true", help="also time step prefixes (tree, +verify, +move) in-jit")
    p.add_argument("--debug", action="store_true", help="print pool-sized copy counts of the compiled HLO")
    p.add_argument("--move", choices=("accept", "pairs"), default="accept",
                   help="jaxspec KV move: move_accept_tokens_to_target_kvcache (default) or fill_front/fill_accept + move_kv_cache")
    a = p.parse_args(argv)
    bss = a.batch_sizes or ("1,16,64,256" if a.device == "cuda" else "1,4")
    batch_sizes = tuple(int(x) for x in bss.split(",") if x)
    configs = tuple(c for c in a.configs.split(",") if c)
    for c in configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown config {c!r} (choose from {', '.join(CONFIGS)})")
    res = run(a.device, batch_sizes, configs, quick=a.quick, debug=a.debug, move=a.move, check_only=a.check_only,
              breakdown=a.breakdown, command_buffers=a.command_buffers,
              pack=False if a.no_pack else None)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.json}")
    if a.png and not a.check_only:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        try:
            import plot_step

            plot_step.plot(res, a.png)
            print(f"wrote {a.png}")
        except ImportError as e:  # matplotlib absent: the JSON still holds everything
            print(f"--png skipped: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
