"""The batch-invariant mode: its ops (``ordered_sum``, ``invariant_matmul``, ``invariant_attention``; the Pallas
kernels interpreted on CPU) against their references and the default ops, row invariance bit for bit, the
engine's refusals, and, in a process of its own with the XLA:CPU flag the mode needs
(``batch_invariant_checks.py``): greedy speculative (chain, tree, adaptive) == plain token for token in bf16,
a request alone == the same request in a batch of 32, the serving core under random arrivals == plain, and
decode == extend bit for bit at SmolLM2-135M's widths.

Tolerances against the default ops are float32 rounding of sums taken in another order: ``1e-5`` relative
(``K <= 256`` products of unit-scale values) for float32 results, one bf16 ulp (``2**-8`` relative) where the
output itself is bf16.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import pipeline
from jaxspec.engine import Engine
from jaxspec.kernels import (CPU_INVARIANT_FLAG, batch_invariance_blocker, invariant_attention, invariant_matmul,
                             ordered_sum, paged_attention_reference)
from jaxspec.kernels.invariant_matmul import _OP as _MATMUL_OP, split_programs
from jaxspec.models import load_pair
from jaxspec.protocols import AttentionMetadata, make_req_to_token, page_table_from_req_to_token

IMPLS = [("reference", False), ("triton", True)]


# ------------------------------------------------------------------------------------------------ ordered_sum


@pytest.mark.parametrize("n", [1, 3, 64, 128, 200, 576])
def test_ordered_sum_rows_do_not_depend_on_the_batch(n):
    x = jnp.asarray(np.random.default_rng(n).standard_normal((5, 7, n)), jnp.float32)
    full = np.asarray(jax.jit(ordered_sum)(x))
    for i, j in ((0, 0), (4, 6), (2, 3)):
        alone = np.asarray(jax.jit(ordered_sum)(x[i:i + 1, j:j + 1]))
        assert alone[0, 0] == full[i, j]
    np.testing.assert_allclose(full, np.asarray(x, np.float64).sum(-1), rtol=1e-5, atol=1e-5 * n**0.5)


def test_ordered_sum_trailing_zeros_change_nothing():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 300)), jnp.float32)
    padded = jnp.pad(x, ((0, 0), (0, 212)))  # 300 -> 512: whole blocks of zeros after a partial one
    assert (np.asarray(ordered_sum(x)) == np.asarray(ordered_sum(padded))).all()


# ------------------------------------------------------------------------------------------------ invariant_matmul


@pytest.mark.parametrize("impl,interpret", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("transpose_w", [False, True])
def test_invariant_matmul_value_and_row_invariance(impl, interpret, dtype, transpose_w):
    rng = np.random.default_rng([7, transpose_w, dtype == jnp.float32])
    k, n, m = 96, 80, 70  # m spans two row tiles, the second partial
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)), dtype)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)

    def mm(a):
        return np.asarray(invariant_matmul(a, w, transpose_w=transpose_w, implementation=impl, interpret=interpret))

    y = mm(x)
    w64 = np.asarray(w.astype(jnp.float32), np.float64)
    want = np.asarray(x.astype(dtype).astype(jnp.float32), np.float64) @ (w64.T if transpose_w else w64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * k**0.5)
    for i in (0, 37, 69):  # alone, and among other neighbours at another place in the tile
        assert (mm(x[i:i + 1])[0] == y[i]).all()
        others = jnp.asarray(rng.standard_normal((9, k)), jnp.float32).at[4].set(x[i])
        assert (mm(others)[4] == y[i]).all()


def test_invariant_matmul_refuses_bad_input():
    w = jnp.zeros((8, 4), jnp.bfloat16)
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        invariant_matmul(jnp.zeros((8,)), w)
    with pytest.raises(ValueError, match="w: expected \\[K, N\\] with K=6"):
        invariant_matmul(jnp.zeros((2, 6)), w)
    with pytest.raises(ValueError, match="x: expected bfloat16, float16 or float32"):
        invariant_matmul(jnp.zeros((2, 8), jnp.int32), w)
    with pytest.raises(ValueError, match="x: expected at least one row"):
        invariant_matmul(jnp.zeros((0, 8)), w)
    with pytest.raises(ValueError, match="implementation='mosaic'"):
        invariant_matmul(jnp.zeros((2, 8)), w, implementation="mosaic", interpret=True)


# ------------------------------------------------------------------------------------------------ invariant_attention

B, W, G, HQ, HKV, E = 3, 160, 4, 6, 2, 32
P, N = 77, 6  # a prefix over several key blocks, then N fresh tokens


LONG = (400, 300)  # (W, P): a prefix over two of the Triton kernel's KEY_SPLIT ranges


def _pools(rng, dtype, r2t, w=W, p=P):
    """Two-layer pools, NaN in every slot no request's prefix uses (written slots included: the call writes
    them first), so a read outside a query's keys would show."""
    x = B * w + G
    k = rng.standard_normal((2, x, HKV, E))
    v = rng.standard_normal((2, x, HKV, E))
    used = np.zeros(x, bool)
    used[np.asarray(r2t)[:, :p].reshape(-1)] = True
    k[:, ~used], v[:, ~used] = np.nan, np.nan
    return jnp.asarray(k, dtype), jnp.asarray(v, dtype)


def _fresh(rng, dtype, nq):
    return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in ((B, nq, HQ, E), (B, nq, HKV, E), (B, nq, HKV, E)))


def _attend(impl, interpret, q, k, v, kp, vp, meta):
    return invariant_attention(q, k, v, kp, vp, meta.page_table, meta.prefix_lens, meta.positions, meta.qmask,
                               meta.write_locs, page_size=G, sm_scale=0.2, layer=1, implementation=impl,
                               interpret=interpret)


@pytest.mark.parametrize("impl,interpret", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("w,p", [(W, P), LONG])
def test_invariant_attention_matches_paged_attention(impl, interpret, dtype, w, p):
    rng = np.random.default_rng([3, dtype == jnp.float32, p])
    r2t = jnp.asarray(make_req_to_token(B, w, G, seed=1))
    kp, vp = _pools(rng, dtype, r2t, w, p)
    q, k, v = _fresh(rng, dtype, N)
    meta = pipeline.prefill_metadata(jnp.full((B,), N, jnp.int32), r2t, N, page_size=G,
                                     prefix_lens=jnp.full((B,), p, jnp.int32))
    out, kp2, vp2 = _attend(impl, interpret, q, k, v, kp, vp, meta)
    want = paged_attention_reference(q, k, v, kp[1], vp[1], meta.page_table, meta.prefix_lens, meta.qmask,
                                     page_size=G, sm_scale=0.2)
    tol = 1e-5 if dtype == jnp.float32 else 2**-8
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
    locs = np.asarray(meta.write_locs).reshape(-1)
    assert (np.asarray(kp2[1])[locs] == np.asarray(k).reshape(-1, HKV, E)).all()  # the fresh K/V written
    keep = np.ones(kp.shape[1], bool)
    keep[locs] = False
    np.testing.assert_array_equal(np.asarray(kp2[1])[keep], np.asarray(kp[1])[keep])  # nothing else (NaN == NaN)
    np.testing.assert_array_equal(np.asarray(kp2[0]), np.asarray(kp[0]))  # the other layer untouched


@pytest.mark.parametrize("w,p", [(W, P), LONG])
def test_invariant_attention_kernel_decode_equals_extend_and_tree_equals_paths(w, p):
    """The Triton kernel (interpreted): N tokens decoded one call each == the same tokens in one causal call,
    and each node of a tree verify == the causal call over its path, bit for bit (``LONG``: over two key splits,
    and a decode call whose page table is wider than the extend's: more, empty, splits change nothing)."""
    rng = np.random.default_rng([5, p])
    r2t = jnp.asarray(make_req_to_token(B, w, G, seed=2))
    kp, vp = _pools(rng, jnp.bfloat16, r2t, w, p)
    q, k, v = _fresh(rng, jnp.bfloat16, N)
    run = jax.jit(lambda *a: _attend("triton", True, *a))
    ext = run(q, k, v, kp, vp, pipeline.prefill_metadata(jnp.full((B,), N, jnp.int32), r2t, N, page_size=G,
                                                         prefix_lens=jnp.full((B,), p, jnp.int32)))[0]
    kpj, vpj, rows = kp, vp, []
    wide = r2t if w == W else jnp.concatenate([r2t, r2t[:, :300]], axis=1)  # more (empty) splits when decoding
    for j in range(N):
        meta = pipeline.decode_metadata(jnp.full((B,), p + j, jnp.int32), wide, page_size=G)
        o, kpj, vpj = run(q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1], kpj, vpj, meta)
        rows.append(o[:, 0])
    assert (np.asarray(jnp.stack(rows, 1)) == np.asarray(ext)).all()
    parent = [-1, 0, 0, 1, 1, 2]  # a tree of N nodes: node i's path is its ancestors and itself
    paths = [[i] if parent[i] < 0 else None for i in range(N)]
    for i in range(1, N):
        paths[i] = paths[parent[i]] + [i]
    depth = np.array([len(path_i) - 1 for path_i in paths], np.int32)
    mask = np.zeros((N, N), bool)
    for i, path_i in enumerate(paths):
        mask[i, path_i] = True
    tree_meta = AttentionMetadata(
        positions=jnp.asarray(np.broadcast_to(p + depth, (B, N)), jnp.int32),
        qmask=jnp.asarray(np.broadcast_to(mask, (B, N, N))), prefix_lens=jnp.full((B,), p, jnp.int32),
        page_table=page_table_from_req_to_token(r2t, G), write_locs=r2t[:, p:p + N], page_size=G)
    tree = np.asarray(run(q, k, v, kp, vp, tree_meta)[0])
    for i, path_i in enumerate(paths):
        n = len(path_i)
        meta = pipeline.prefill_metadata(jnp.full((B,), n, jnp.int32), r2t, n, page_size=G,
                                         prefix_lens=jnp.full((B,), p, jnp.int32))
        path = np.asarray(run(q[:, path_i], k[:, path_i], v[:, path_i], kp, vp, meta)[0])
        assert (path[:, -1] == tree[:, i]).all(), f"node {i}"


@pytest.mark.parametrize("w,p", [(W, P), LONG])
def test_invariant_attention_kernel_blocks_of_queries_equal_single_queries(w, p):
    """The Triton kernel (interpreted) tiles up to 16 queries a program: a 40-token causal extend (three query
    blocks, the last one part padding) == the same tokens as chunks of 17 and 23 (other block boundaries) ==
    the last 3 decoded one call each, and a right-padded prompt's real rows == the unpadded prompt's, bit for
    bit; a tree whose branches share query blocks with a causal chain == each node's path."""
    n = 40
    rng = np.random.default_rng([7, p])
    r2t = jnp.asarray(make_req_to_token(B, w, G, seed=5))
    kp, vp = _pools(rng, jnp.bfloat16, r2t, w, p)
    q, k, v = _fresh(rng, jnp.bfloat16, n)
    run = jax.jit(lambda *a: _attend("triton", True, *a))

    def extend(lo, hi, kpool, vpool, length=None):
        meta = pipeline.prefill_metadata(jnp.full((B,), hi - lo if length is None else length, jnp.int32), r2t,
                                         hi - lo, page_size=G, prefix_lens=jnp.full((B,), p + lo, jnp.int32))
        return run(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], kpool, vpool, meta)

    whole = np.asarray(extend(0, n, kp, vp)[0])
    first, kp1, vp1 = extend(0, 17, kp, vp)
    second, kp2, vp2 = extend(17, n, kp1, vp1)
    assert (np.concatenate([np.asarray(first), np.asarray(second)], 1) == whole).all()
    kpj, vpj = extend(0, n - 3, kp, vp)[1:]
    for j in range(n - 3, n):
        meta = pipeline.decode_metadata(jnp.full((B,), p + j, jnp.int32), r2t, page_size=G)
        o, kpj, vpj = run(q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1], kpj, vpj, meta)
        assert (np.asarray(o)[:, 0] == whole[:, j]).all(), f"decode of token {j}"
    padded = np.asarray(extend(0, 20, kp, vp, length=13)[0])  # 7 padding rows write to the dummy page
    assert (padded[:, :13] == whole[:, :13]).all()
    # 24 fresh tokens: a chain of 12, then two branches of 6 from its end (query blocks 0-15 and 16-23 mix them)
    parent = list(range(-1, 11)) + [11, 12, 13, 14, 15, 16] + [11, 18, 19, 20, 21, 22]
    depth = np.zeros(24, np.int32)
    mask = np.zeros((24, 24), bool)
    for i in range(24):
        a = i
        while a >= 0:
            mask[i, a] = True
            depth[i] += a != i
            a = parent[a]
    slots = np.asarray(r2t)[:, p:p + 24]
    tree_meta = AttentionMetadata(
        positions=jnp.asarray(np.broadcast_to(p + depth, (B, 24)), jnp.int32),
        qmask=jnp.asarray(np.broadcast_to(mask, (B, 24, 24))), prefix_lens=jnp.full((B,), p, jnp.int32),
        page_table=page_table_from_req_to_token(r2t, G), write_locs=jnp.asarray(slots), page_size=G)
    tree = np.asarray(run(q[:, :24], k[:, :24], v[:, :24], kp, vp, tree_meta)[0])
    for i in (5, 11, 17, 23):
        path = np.flatnonzero(mask[i])
        meta = pipeline.prefill_metadata(jnp.full((B,), len(path), jnp.int32), r2t, len(path), page_size=G,
                                         prefix_lens=jnp.full((B,), p, jnp.int32))
        out = np.asarray(run(q[:, path], k[:, path], v[:, path], kp, vp, meta)[0])
        assert (out[:, -1] == tree[:, i]).all(), f"node {i}"


# ------------------------------------------------------------------------------------------------ the engine


def test_engine_refuses_what_it_cannot_honour(monkeypatch):
    model = load_pair()
    with pytest.raises(ValueError, match="batch_invariant: expected a bool"):
        Engine(model, None, batch_invariant=1)

    class Wrapped:  # a target meeting the protocol without declaring the mode
        def __init__(self, m):
            self._m = m

        def __getattr__(self, name):
            if name == "supports_batch_invariant":
                raise AttributeError(name)
            return getattr(self._m, name)

    with pytest.raises(ValueError, match="does not declare supports_batch_invariant"):
        Engine(Wrapped(model), None, batch_invariant=True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
    with pytest.raises(ValueError, match="xla_cpu_experimental_ynn_fusion_type="):
        Engine(model, None, batch_invariant=True)
    monkeypatch.setenv("XLA_FLAGS", CPU_INVARIANT_FLAG)
    assert batch_invariance_blocker() is None


def _checks(*extra):
    env = dict(os.environ, XLA_FLAGS=CPU_INVARIANT_FLAG, JAX_PLATFORMS="cpu")
    script = os.path.join(os.path.dirname(__file__), "batch_invariant_checks.py")
    done = subprocess.run([sys.executable, "-P", script, *extra], env=env, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checks():
    return _checks()


@pytest.mark.parametrize("name", ["chain", "tree", "adaptive"])
def test_bf16_speculative_equals_plain(checks, name):
    got = checks[name]
    assert all(got["same"]), got
    assert got["accept"] > 1.5  # drafts were accepted: the verify rows carried drafted tokens
    if name == "adaptive":
        assert sum(got["mode_rounds"][1:]) > 0  # it speculated


@pytest.mark.parametrize("name", ["batch32_plain", "batch32_chain"])
def test_bf16_alone_equals_in_a_batch_of_32(checks, name):
    assert all(checks[name]["same"])


def test_bf16_decode_equals_extend_at_smollm2_widths(checks):
    assert checks["smollm2_widths"]["same"] == [True, True]  # the interpreted Pallas kernels, the references


def test_bf16_serving_core_equals_plain(checks):
    assert all(checks["serving"]["same"]), checks["serving"]


@pytest.mark.slow
def test_bf16_speculative_equals_plain_on_the_pallas_kernels():
    got = _checks("--pallas")
    for name in ("chain", "tree", "adaptive"):
        assert all(got[name]["same"]), (name, got[name])


def test_serve_cli_passes_the_mode_to_the_engine():
    """``python -m jaxspec.serve --batch-invariant`` reaches ``Engine(batch_invariant=True)``: on XLA:CPU without
    the flag the engine's refusal comes back (the option is not accepted and ignored)."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("prometheus_client")
    from jaxspec.models import DEFAULT_WEIGHTS
    from jaxspec.serve import cli

    args = cli.parser().parse_args(["--model", DEFAULT_WEIGHTS, "--batch-invariant", "--max-context", "64"])
    assert args.batch_invariant
    with pytest.raises(ValueError, match="batch_invariant=True: XLA:CPU"):
        cli.build(args)


@pytest.mark.parametrize("impl,interpret", IMPLS)
def test_invariant_matmul_fused_rms_norm(impl, interpret):
    """``norm_weight`` / ``norm_eps``: RMSNorm fused into the product equals RMSNorm, then the product
    (float32 weights: the weighted rows are not rounded, so the float32 tolerance holds); each row alone
    equals the row among others."""
    rng = np.random.default_rng(11)
    k, n = 160, 48
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    nw = jnp.asarray(1 + 0.1 * rng.standard_normal(k), jnp.float32)
    x = jnp.asarray(3 * rng.standard_normal((20, k)), jnp.float32)
    y = np.asarray(invariant_matmul(x, w, norm_weight=nw, norm_eps=1e-5, implementation=impl, interpret=interpret))
    x64 = np.asarray(x, np.float64)
    normed = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5) * np.asarray(nw, np.float64)
    np.testing.assert_allclose(y, normed @ np.asarray(w, np.float64), rtol=1e-5, atol=1e-5 * k**0.5)
    one = invariant_matmul(x[7:8], w, norm_weight=nw, norm_eps=1e-5, implementation=impl, interpret=interpret)
    assert (np.asarray(one)[0] == y[7]).all()
    with pytest.raises(ValueError, match="norm_weight: expected shape \\(160,\\)"):
        invariant_matmul(x, w, norm_weight=nw[:5], norm_eps=1e-5)
    with pytest.raises(ValueError, match="norm_eps: expected a positive float"):
        invariant_matmul(x, w, norm_weight=nw)
    with pytest.raises(ValueError, match="norm_eps: given without norm_weight"):
        invariant_matmul(x, w, norm_eps=1e-5)


@pytest.mark.parametrize("transpose_w,norm", [(False, True), (True, False)])
def test_invariant_matmul_split_layouts_agree_bit_for_bit(transpose_w, norm):
    """K over several splits (the last one short, its last step partial): a split per program plus the merge
    kernel == the splits walked in one program, bit for bit, for one row and for 70; rows alone == among others;
    values within float32 rounding of float64 (float32 weights). ``split_programs`` picks by the tile count."""
    rng = np.random.default_rng([5, transpose_w, norm])
    k, n, m = 450, 72, 70  # 8 K steps: splits of 3, 3, 2
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    nw = jnp.asarray(1 + 0.1 * rng.standard_normal(k), jnp.float32) if norm else None
    eps = 1e-5 if norm else None

    def mm(a, split):
        return np.asarray(_MATMUL_OP(a, w, nw, transpose_w=transpose_w, norm_eps=eps, split=split,
                                     implementation="pallas", interpret=True))

    whole, parts = mm(x, False), mm(x, True)
    assert (whole == parts).all()
    for i in (0, 69):
        assert (mm(x[i:i + 1], True)[0] == whole[i]).all() and (mm(x[i:i + 1], False)[0] == whole[i]).all()
    x64 = np.asarray(x, np.float64)
    if norm:
        x64 = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5) * np.asarray(nw, np.float64)
    w64 = np.asarray(w, np.float64)
    np.testing.assert_allclose(whole, x64 @ (w64.T if transpose_w else w64), rtol=1e-5, atol=1e-5 * k**0.5)
    assert split_programs(1, 576, 960) and split_programs(1, 1536, 576)  # a decode step's products
    assert not split_programs(1, 576, 49152)  # the tied head: 768 tiles fill the GPU already
    assert not split_programs(4096, 576, 960) and not split_programs(1, 128, 960)  # many tiles; one split


@pytest.mark.gpu
def test_gpu_kernels_are_invariant_and_match_the_references():
    """On the GPU, compiled: the matmul's rows alone == among 127 others, and the attention kernel's decode ==
    extend == tree paths (the interpreted test above, compiled), both within tolerance of their references."""
    rng = np.random.default_rng(21)
    w = jnp.asarray(rng.standard_normal((576, 960)) * 576**-0.5, jnp.bfloat16)
    nw = jnp.asarray(1 + 0.1 * rng.standard_normal(576), jnp.float32)
    x = jnp.asarray(rng.standard_normal((128, 576)), jnp.float32)
    kw = dict(norm_weight=nw, norm_eps=1e-5)
    y = np.asarray(invariant_matmul(x, w, **kw))
    for i in (0, 77):
        assert (np.asarray(invariant_matmul(x[i:i + 1], w, **kw))[0] == y[i]).all()
    # the two layouts, compiled: a program per K split + merge (128 rows: 30 tiles) == one program walking the
    # splits (forced, and as 640 rows pick it), bit for bit
    big = jnp.concatenate([x, jnp.asarray(rng.standard_normal((512, 576)), jnp.float32)])
    assert split_programs(128, 576, 960) and not split_programs(big.shape[0], 576, 960)
    whole = _MATMUL_OP(x, w, nw, transpose_w=False, norm_eps=1e-5, split=False, implementation="auto", interpret=False)
    assert (np.asarray(whole) == y).all()
    assert (np.asarray(invariant_matmul(big, w, **kw))[:128] == y).all()
    ref = np.asarray(invariant_matmul(x, w, implementation="reference", **kw))
    np.testing.assert_allclose(y, ref, rtol=2**-7, atol=2**-7)  # one bf16 ulp of a normed input, summed
    r2t = jnp.asarray(make_req_to_token(B, W, G, seed=3))
    kp, vp = _pools(rng, jnp.bfloat16, r2t)
    q, k, v = _fresh(rng, jnp.bfloat16, N)
    run = jax.jit(lambda *a: _attend("auto", False, *a))
    meta = pipeline.prefill_metadata(jnp.full((B,), N, jnp.int32), r2t, N, page_size=G,
                                     prefix_lens=jnp.full((B,), P, jnp.int32))
    ext = run(q, k, v, kp, vp, meta)[0]
    want = _attend("reference", False, q, k, v, kp, vp, meta)[0]
    np.testing.assert_allclose(np.asarray(ext, np.float32), np.asarray(want, np.float32), rtol=2**-7, atol=2**-7)
    kpj, vpj, rows = kp, vp, []
    for j in range(N):
        o, kpj, vpj = run(q[:, j:j + 1], k[:, j:j + 1], v[:, j:j + 1], kpj, vpj,
                          pipeline.decode_metadata(jnp.full((B,), P + j, jnp.int32), r2t, page_size=G))
        rows.append(o[:, 0])
    assert (np.asarray(jnp.stack(rows, 1)) == np.asarray(ext)).all()


@pytest.mark.parametrize("impl,interpret", IMPLS)
def test_a_fresh_slot_outside_the_pool_is_neither_written_nor_read(impl, interpret):
    """Query 3 of each request writes to a slot past the pool (a padding token's): the pools are unchanged there,
    and the queries after it, which would see it, give what they give when its key is absent from their path
    (the read is masked, never a load past the pool)."""
    rng = np.random.default_rng(9)
    r2t = jnp.asarray(make_req_to_token(B, W, G, seed=4))
    kp, vp = _pools(rng, jnp.float32, r2t)
    q, k, v = _fresh(rng, jnp.float32, N)
    meta = pipeline.prefill_metadata(jnp.full((B,), N, jnp.int32), r2t, N, page_size=G,
                                     prefix_lens=jnp.full((B,), P, jnp.int32))
    bad = meta.write_locs.at[:, 3].set(kp.shape[1] + 5)
    out, kp2, _ = _attend(impl, interpret, q, k, v, kp, vp, dataclasses.replace(meta, write_locs=bad))
    assert np.isfinite(np.asarray(out)).all()
    good = np.asarray(meta.write_locs)[:, [0, 1, 2, 4, 5]].reshape(-1)
    keep = np.ones(kp.shape[1], bool)
    keep[good] = False
    np.testing.assert_array_equal(np.asarray(kp2[1])[keep], np.asarray(kp[1])[keep])  # nothing else written
    # query 4 without token 3 on its path: the same as the query whose mask leaves token 3 out
    qmask = meta.qmask.at[:, 4, 3].set(False)
    want, _, _ = _attend(impl, interpret, q, k, v, kp, vp, dataclasses.replace(meta, qmask=qmask))
    np.testing.assert_allclose(np.asarray(out)[:, 4], np.asarray(want)[:, 4], rtol=1e-6, atol=1e-6)
