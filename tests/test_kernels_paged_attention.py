"""paged_attention: reference vs a NumPy dense oracle, the Pallas kernels (interpret mode on CPU, compiled
on a GPU) vs the reference, the bit-packed mask, edge cases and argument errors.

Tolerance: inputs are rounded to the test dtype first and the oracle runs in float64 on those rounded
values, so the only differences are float32 accumulation order (reference / kernels, ~1e-6 relative)
plus, for kernels, the rounding of the softmax weights to the input dtype before the P@V product (as
every flash kernel does: <= 2^-8 relative per weight for bf16, 2^-11 for fp16) and the final rounding of
the output to the input dtype (half an ulp: 2^-9 bf16, 2^-12 fp16). Outputs are convex combinations of V
rows with |V| <= ~3, so an absolute bound of 2^-6 (bf16) / 2^-9 (fp16) / 1e-5 (f32) holds with margin,
while a wrong mask or a wrong page moves outputs by O(0.1-1) (checked below: the mask must matter).
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxspec.kernels.paged_attention import (
    paged_attention,
    paged_attention_reference,
    qmask_from_bits,
    resolve_attention_implementation,
)
from jaxspec.kernels import _attention_parts as AP
from jaxspec.kernels import _backend as B
from jaxspec.testing import random_tree_qmask

TOL = {jnp.float32: 1e-5, jnp.float16: 2.0**-9, jnp.bfloat16: 2.0**-6}


def _case(seed, *, b=3, nq=4, hq=8, hkv=2, e=64, g=16, pages=24, p_width=6, dtype=jnp.float32, mask="tree",
          lens=None):
    rng = np.random.default_rng(seed)
    x = pages * g
    def r(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
    q, kn, vn = r(b, nq, hq, e), r(b, nq, hkv, e), r(b, nq, hkv, e)
    kp, vp = r(x, hkv, e), r(x, hkv, e)
    # every row owns distinct random pages (page 0 never handed out); unused entries are garbage
    pt = np.full((b, p_width), -7, np.int32)
    perm = rng.permutation(np.arange(1, pages))
    for i in range(b):
        pt[i] = perm[i * p_width:(i + 1) * p_width] if (i + 1) * p_width < pages else rng.integers(1, pages, p_width)
    if lens is None:
        lens = rng.integers(0, p_width * g + 1, b)
        lens[0] = 0  # an empty prefix
    lens = np.asarray(lens, np.int32)
    for i in range(b):  # entries past the prefix are garbage (out-of-range page ids)
        used = -(-int(lens[i]) // g)
        pt[i, used:] = rng.integers(-5, 3 * pages, p_width - used)
    if mask == "causal":
        qm = np.tril(np.ones((nq, nq), bool))[None].repeat(b, 0)
    elif mask == "tree":  # random tree: each node's parent is an earlier node
        qm = random_tree_qmask(rng, b, nq)
    else:
        qm = np.ones((b, nq, nq), bool)
    return dict(q=q, k_new=kn, v_new=vn, k_pool=kp, v_pool=vp, page_table=jnp.asarray(pt),
                prefix_lens=jnp.asarray(lens), qmask=jnp.asarray(qm)), g


def _oracle(a, g, scale):
    q, kn, vn, kp, vp = (np.asarray(a[k].astype(jnp.float32), np.float64) for k in ("q", "k_new", "v_new", "k_pool", "v_pool"))
    pt, lens, qm = np.asarray(a["page_table"]), np.asarray(a["prefix_lens"]), np.asarray(a["qmask"])
    b, nq, hq, e = q.shape
    hkv = kn.shape[2]
    out = np.zeros_like(q)
    for i in range(b):
        slots = [pt[i, p // g] * g + p % g for p in range(lens[i])]
        for t in range(nq):
            fresh = [j for j in range(nq) if qm[i, t, j]]
            for h in range(hq):
                kh = h // (hq // hkv)
                keys = np.concatenate([kp[slots, kh], kn[i, fresh, kh]]) if slots else kn[i, fresh, kh]
                vals = np.concatenate([vp[slots, kh], vn[i, fresh, kh]]) if slots else vn[i, fresh, kh]
                s = keys @ q[i, t, h] * scale
                p = np.exp(s - s.max())
                out[i, t, h] = p @ vals / p.sum()
    return out


def _run(a, g, impl, **kw):
    return paged_attention(**a, page_size=g, sm_scale=a["q"].shape[-1] ** -0.5, implementation=impl, **kw)


@pytest.mark.parametrize("mask", ["tree", "causal", "ones"])
def test_reference_matches_oracle_and_mask_matters(mask):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    a, g = _case(seed, mask=mask, nq=1 if mask == "ones" else 5)
    scale = a["q"].shape[-1] ** -0.5
    want = _oracle(a, g, scale)
    got = paged_attention_reference(**a, page_size=g, sm_scale=scale)
    np.testing.assert_allclose(np.asarray(got), want, atol=TOL[jnp.float32], err_msg=f"seed {seed}")
    if mask != "ones":  # flipping the mask (all visible) must change the answer
        wrong = dict(a, qmask=jnp.ones_like(a["qmask"]))
        assert np.abs(_oracle(wrong, g, scale) - want).max() > 1e-2


def test_bitpacked_mask_equals_bool_mask():
    a, g = _case(1, nq=6, mask="tree")
    qm = np.asarray(a["qmask"])
    bits = (qm * (1 << np.arange(6))[None, None, :]).sum(-1).astype(np.uint8).reshape(-1)
    np.testing.assert_array_equal(np.asarray(qmask_from_bits(jnp.asarray(bits), 6)), qm)
    scale = 0.125
    got = paged_attention_reference(**dict(a, qmask=None), qmask_bits=jnp.asarray(bits), page_size=g, sm_scale=scale)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(paged_attention_reference(**a, page_size=g, sm_scale=scale)))


@pytest.mark.parametrize("dtype,g,hq,hkv,e,nq", [
    (jnp.float32, 16, 8, 2, 64, 4),
    (jnp.float16, 1, 4, 4, 64, 1),
    (jnp.float32, 64, 8, 1, 128, 3),
    (jnp.float32, 16, 4, 2, 24, 4),  # head_dim 24 (the tiny pair's): columns padded to 32 and masked
])
def test_triton_interpret_matches_reference(dtype, g, hq, hkv, e, nq):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    a, g = _case(seed, b=3, nq=nq, hq=hq, hkv=hkv, e=e, g=g, pages=max(24, 4 * 6 + 2) if g > 1 else 200,
                 p_width=6 if g > 1 else 90, dtype=dtype)
    want = _run(a, g, "reference")
    got = _run(a, g, "triton", interpret=True, num_splits=2)
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                               atol=TOL[dtype], err_msg=f"seed {seed}")


def test_auto_resolves_to_something_that_runs():
    q = jnp.zeros((1, 1, 4, 64), jnp.bfloat16)
    on_gpu = jax.default_backend() == "gpu"
    assert resolve_attention_implementation("auto", q, 16, False) == ("mosaic" if on_gpu else "reference")
    assert resolve_attention_implementation("reference", q, 1, False) == "reference"
    with pytest.raises(ValueError, match="mosaic"):
        resolve_attention_implementation("mosaic", q, 1, False)  # page size 1: not for the Mosaic kernel


# ----------------------------------------------------------------------------------------------------
# shared memory: each kernel's need from its tiles, and what ``auto`` picks (device query monkeypatched)


def test_smem_estimates_bound_what_the_h200_reported():
    """The Triton kernel's bound for its old untiled plan at f32, head_dim 64, 1024 rows, 2 stages is at least
    what XLA requested on the H200 (411648 bytes, over the 232448 a block may use); every plan the kernels
    pick fits the limit, for f32 / bf16 / f16 and head_dim 64 / 128 / 256."""
    assert AP.SMEM_LIMIT == 232448
    assert AP.triton_smem_bytes(1024, 64, 4, stages=2) >= 411648 > AP.SMEM_LIMIT
    for itemsize in (4, 2):
        for e in (24, 64, 128, 256):
            for num_rows in (1, 3, 40, 600, 4096):
                rows, tile, stages = AP.triton_plan(num_rows, e, itemsize)
                assert rows == max(16, 1 << (num_rows - 1).bit_length()) and rows % tile == 0
                assert AP.triton_smem_bytes(tile, e, itemsize, stages=stages) <= AP.SMEM_LIMIT
                if tile < rows:  # the largest fitting tile: twice as many rows would not fit
                    assert AP.triton_smem_bytes(2 * tile, e, itemsize, stages=stages) > AP.SMEM_LIMIT
    assert AP.triton_plan(600, 64, 4)[1] < 1024  # the failing case now runs in row tiles
    for e in (64, 128, 256):
        for g in (16, 64, 128):
            block, stages = AP.mosaic_plan(e, 2, g)
            assert block == max(64, g) and stages in (1, 2)
            assert AP.mosaic_smem_bytes(e, 2, block=block, stages=stages) <= AP.SMEM_LIMIT
    assert AP.mosaic_plan(256, 2, 128) == (128, 1)  # two 128-token stages of 256-wide K and V would not fit
    assert AP.triton_plan(16, 8192, 4) is None and AP.mosaic_plan(8192, 2, 16) is None


@pytest.fixture
def hopper(monkeypatch):
    """Resolve as on an H200 with both Pallas lowerings."""
    monkeypatch.setattr(B, "gpu_available", lambda: True)
    monkeypatch.setattr(B, "hopper_available", lambda: True)
    monkeypatch.setattr(B, "backend_available", lambda name: True)
    return monkeypatch


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("e", [64, 128, 256, 96])
@pytest.mark.parametrize("nq", [1, 200])
def test_auto_on_hopper_picks_a_kernel_that_fits(hopper, dtype, e, nq):
    """``auto`` on Hopper: the Mosaic kernel for bf16 / fp16 with head_dim a multiple of 64, else the Triton kernel
    (f32 KV included, in row tiles that fit); decode and a 200-token prefill of 9 query / 3 KV heads."""
    q = jnp.zeros((1, nq, 9, e), dtype)
    want = "mosaic" if dtype != jnp.float32 and e % 64 == 0 else "triton"
    assert resolve_attention_implementation("auto", q, 16, False, hkv=3) == want
    assert resolve_attention_implementation("pallas", q, 16, False, hkv=3) == want
    if want == "triton":
        with pytest.raises(ValueError, match="mosaic kernel does not support"):
            resolve_attention_implementation("mosaic", q, 16, False, hkv=3)
        rows, tile, stages = AP.triton_plan(nq * 3, e, q.dtype.itemsize)
        assert AP.triton_smem_bytes(tile, e, q.dtype.itemsize, stages=stages) <= AP.SMEM_LIMIT


def test_auto_falls_back_where_no_kernel_fits_or_runs(hopper):
    """No kernel's tiles fit (a huge head): ``auto`` runs the reference and ``pallas`` says why; a GPU without
    Hopper takes the Triton kernel for bf16; a jax without the Triton lowering: the reference, with a warning."""
    huge = jnp.zeros((1, 1, 2, 8192), jnp.float32)
    assert resolve_attention_implementation("auto", huge, 16, False, hkv=1) == "reference"
    with pytest.raises(ValueError, match="does not fit shared memory"):
        resolve_attention_implementation("pallas", huge, 16, False, hkv=1)
    q = jnp.zeros((1, 4, 8, 128), jnp.bfloat16)
    hopper.setattr(B, "hopper_available", lambda: False)
    assert resolve_attention_implementation("auto", q, 16, False, hkv=2) == "triton"
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        resolve_attention_implementation("mosaic", q, 16, False, hkv=2)
    hopper.setattr(B, "backend_available", lambda name: False)
    hopper.setattr(B, "_warned", set())
    with pytest.warns(B.PallasBackendWarning, match="no Pallas triton lowering"):
        assert resolve_attention_implementation("auto", q.astype(jnp.float32), 16, False, hkv=2) == "reference"


def test_triton_row_tiles_equal_one_tile():
    """The Triton kernel split into row tiles (``max_tile``: 4 programs of 16 rows per KV head) computes the
    partials of one 64-row program (to f32 rounding: the dots block differently); interpret mode."""
    from jaxspec.kernels import paged_attention_triton as T

    a, g = _case(5, b=2, nq=12, hq=4, hkv=1, e=32, g=16, pages=12, p_width=4, lens=[37, 60])
    args = (a["q"], 1, a["k_pool"], a["v_pool"], a["page_table"], a["prefix_lens"])
    kw = dict(page_size=g, sm_scale=0.2, num_splits=2, interpret=True)
    whole, tiled = T.prefix_partials(*args, **kw), T.prefix_partials(*args, max_tile=16, **kw)
    assert whole[0].shape == tiled[0].shape == (2, 1, 2, 64, 32)
    for w, t in zip(whole, tiled):
        np.testing.assert_allclose(np.asarray(t), np.asarray(w), rtol=1e-5, atol=1e-4)  # f32 dot blocking


SMEM_GPU_CASES = [(d, e, nq) for d in (jnp.float32, jnp.bfloat16, jnp.float16) for e in (64, 128, 256) for nq in (1, 5, 200)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,e,nq", SMEM_GPU_CASES)
def test_gpu_auto_runs_every_dtype_and_head_dim(dtype, e, nq):
    """``auto`` on the GPU for f32 / bf16 / fp16 KV and head_dim 64 / 128 / 256: decode, verify and a 200-token
    prefill (9 query / 3 KV heads, 600 query rows per KV head: the f32 case that once asked for more shared
    memory than a block has) against the reference."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    a, g = _case(seed, b=2, nq=nq, hq=9, hkv=3, e=e, g=16, pages=100, p_width=40, dtype=dtype,
                 mask="causal" if nq > 1 else "ones")
    want = _run(a, g, "reference")
    got = _run(a, g, "auto")
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                               atol=TOL[dtype], err_msg=f"seed {seed} impl "
                               f"{resolve_attention_implementation('auto', a['q'], g, False, hkv=3)}")


def test_bad_arguments_raise():
    a, g = _case(0)
    with pytest.raises(ValueError, match="page_table"):
        paged_attention_reference(**dict(a, page_table=a["page_table"][:1]), page_size=g, sm_scale=0.1)
    with pytest.raises(ValueError, match="qmask"):
        paged_attention_reference(**dict(a, qmask=a["qmask"][:, :1]), page_size=g, sm_scale=0.1)
    with pytest.raises(ValueError, match="page_size"):
        paged_attention_reference(**a, page_size=7, sm_scale=0.1)
    with pytest.raises(ValueError, match="k_new"):
        paged_attention_reference(**dict(a, k_new=a["k_new"][:, :, :1, :3]), page_size=g, sm_scale=0.1)
    with pytest.raises(ValueError, match="implementation"):
        _run(a, g, "cuda")


@pytest.mark.parametrize("dtype,g,hq,hkv,e,nq,splits", [
    (jnp.bfloat16, 16, 8, 2, 64, 5, 2),  # 64-token blocks of 4 pages, 2 prefix slices, 20 of 24 rows out
    (jnp.float16, 64, 16, 2, 128, 9, 1),  # 72 query rows: two 64-row tiles
])
def test_mosaic_interpret_matches_reference(dtype, g, hq, hkv, e, nq, splits):
    """The Mosaic GPU kernel under the GPU interpreter (wgmma replaced by plain dots there, everything else
    -- TMA page copies, barriers, multi-buffering, slices, masking -- as compiled)."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    a, g = _case(seed, b=2, nq=nq, hq=hq, hkv=hkv, e=e, g=g, pages=16, p_width=5 if g == 16 else 3, dtype=dtype,
                 lens=[0, 5 * g - 3] if g == 16 else [2 * g + 1, 0])
    want = _run(a, g, "reference")
    got = _run(a, g, "mosaic", interpret=True, num_splits=splits)
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                               atol=TOL[dtype], err_msg=f"seed {seed}")


GPU_CASES = [  # (impl, dtype, page size, Hq, Hkv, E, Q, mask)
    ("mosaic", jnp.bfloat16, 16, 32, 8, 128, 8, "tree"),
    ("mosaic", jnp.bfloat16, 16, 32, 8, 128, 1, "ones"),
    ("mosaic", jnp.float16, 64, 8, 8, 64, 4, "causal"),
    ("mosaic", jnp.bfloat16, 16, 16, 2, 256, 5, "tree"),
    ("mosaic", jnp.bfloat16, 64, 32, 4, 128, 17, "causal"),  # 136 rows: 3 row tiles
    ("triton", jnp.bfloat16, 1, 32, 8, 128, 8, "tree"),
    ("triton", jnp.float16, 16, 8, 1, 64, 4, "causal"),
    ("triton", jnp.float16, 16, 4, 2, 24, 4, "tree"),  # head_dim not a power of two (masked columns)
    ("auto", jnp.bfloat16, 1, 32, 8, 128, 1, "ones"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("impl,dtype,g,hq,hkv,e,nq,mask", GPU_CASES)
def test_gpu_kernels_match_reference(impl, dtype, g, hq, hkv, e, nq, mask):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    width = max(1, 700 // g)
    a, g = _case(seed, b=5, nq=nq, hq=hq, hkv=hkv, e=e, g=g, pages=6 * width + 2, p_width=width, dtype=dtype,
                 mask=mask)
    want = _run(a, g, "reference")
    for splits in (None, 3):
        got = _run(a, g, impl, num_splits=splits)
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                                   atol=TOL[dtype], err_msg=f"seed {seed} splits {splits}")


@pytest.mark.interop
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's -inf - -inf in SGLang's empty kv splits
@pytest.mark.parametrize("nq,mask", [(5, "tree"), (3, "causal"), (1, "ones")])
def test_side_by_side_with_sglang_originals(nq, mask):
    """Ours (reference, and the Triton kernel in interpret mode) vs SGLang 0.5.23's extend_attention_fwd
    (custom_mask) and, for Q = 1, decode_attention_fwd, on the same buffers, fp16 (the CPU Triton
    interpreter miscomputes bf16 dots). Same tolerance as above for fp16; the wrong-mask run must fail it."""
    pytest.importorskip("torch")
    from jaxspec.interop.attention_originals import run_decode, run_extend

    seed = int(np.random.SeedSequence().entropy % 2**31)
    a, g = _case(seed, b=3, nq=nq, hq=8, hkv=2, e=64, g=16, pages=24, p_width=6, dtype=jnp.float16, mask=mask)
    scale = 0.125
    ref = np.asarray(paged_attention_reference(**a, page_size=g, sm_scale=scale).astype(jnp.float32))
    ours = np.asarray(_run(a, g, "triton", interpret=True).astype(jnp.float32))
    orig = run_extend(**a, page_size=g, sm_scale=scale)
    tol = TOL[jnp.float16]
    np.testing.assert_allclose(orig, ref, atol=tol, err_msg=f"extend vs reference, seed {seed}")
    np.testing.assert_allclose(ours, orig, atol=tol, err_msg=f"triton vs extend, seed {seed}")
    if mask != "ones":
        wrong = run_extend(**dict(a, qmask=jnp.ones_like(a["qmask"])), page_size=g, sm_scale=scale)
        assert np.abs(wrong - ref).max() > 10 * tol
    else:
        dec = run_decode(**{k: v for k, v in a.items() if k != "qmask"}, page_size=g, sm_scale=scale)
        np.testing.assert_allclose(dec, ref, atol=tol, err_msg=f"decode vs reference, seed {seed}")


@pytest.mark.parametrize("impl", ["reference", "triton", "mosaic"])
def test_slots_outside_the_prefixes_are_never_used(impl):
    """Poison: every pool slot outside the requests' prefixes is NaN (for the Mosaic kernel, which copies
    whole pages: every slot outside the requests' used pages, the last page's tail keeps finite stale
    values, see the module docstring); the answer must equal the unpoisoned one bit for bit."""
    dtype = jnp.float32 if impl != "mosaic" else jnp.bfloat16
    a, g = _case(11, b=3, nq=3, hq=4, hkv=2, e=64, g=16, pages=24, p_width=5, dtype=dtype, lens=[0, 37, 80])
    pt, lens = np.asarray(a["page_table"]).copy(), np.asarray(a["prefix_lens"])
    for i in range(3):  # garbage entries past the used pages point at page 0: never handed out, all NaN below
        pt[i, -(-int(lens[i]) // g):] = 0
    a["page_table"] = jnp.asarray(pt)
    keep = np.zeros(a["k_pool"].shape[0], bool)
    for i in range(3):
        for pos in range(int(lens[i])):
            page = pt[i, pos // g]
            if impl == "mosaic":
                keep[page * g:(page + 1) * g] = True
            else:
                keep[page * g + pos % g] = True
    nan = jnp.asarray(np.where(keep[:, None, None], 0.0, np.nan).astype(np.float32)).astype(dtype)
    poisoned = dict(a, k_pool=a["k_pool"] + nan, v_pool=a["v_pool"] + nan)
    kw = dict(interpret=True) if impl != "reference" else {}
    want = np.asarray(_run(a, g, impl, **kw).astype(jnp.float32))
    got = np.asarray(_run(poisoned, g, impl, **kw).astype(jnp.float32))
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("impl", ["reference", "triton", "mosaic"])
def test_layer_of_a_whole_pool(impl):
    """``layer=``: a model's ``[L, X, Hkv, E]`` pool and a layer index (an int, or ``i32[]`` under jit) give
    exactly what that layer's own pool gives; the other layers hold NaN, so reading one would show."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    dtype = jnp.float32 if impl != "mosaic" else jnp.bfloat16
    a, g = _case(seed, b=2, nq=3, hq=4, hkv=2, e=64, g=16, pages=12, p_width=4, dtype=dtype, lens=[37, 64])
    kw = dict(interpret=impl != "reference", num_splits=2) if impl != "reference" else {}
    want = _run(a, g, impl, **kw)
    nan = jnp.full_like(a["k_pool"], jnp.nan)
    whole = dict(a, k_pool=jnp.stack([nan, nan, a["k_pool"]]), v_pool=jnp.stack([nan, a["v_pool"], nan]))
    k_at_2 = dict(whole, v_pool=jnp.stack([nan, nan, a["v_pool"]]))
    got = _run(k_at_2, g, impl, layer=2, **kw)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                                  err_msg=f"seed {seed}")
    traced = jax.jit(lambda x, i: _run(x, g, impl, layer=i, **kw))(k_at_2, jnp.int32(2))
    np.testing.assert_array_equal(np.asarray(traced.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)))
    with pytest.raises(ValueError, match="layer"):
        _run(whole, g, impl, layer=3, **kw)
    with pytest.raises(ValueError, match="k_pool"):
        _run(a, g, impl, layer=0, **kw)  # a single layer's pool with layer=


def _fresh_slots(a, g, oob):
    """Each request's fresh tokens at the positions after its prefix (the slots a forward writes: on its last
    prefix page first), through its page table; ``oob``: the last token's slot is out of range."""
    pt, lens = np.asarray(a["page_table"]), np.asarray(a["prefix_lens"])
    b, nq = a["q"].shape[:2]
    locs = np.array([[pt[i, (lens[i] + t) // g] * g + (lens[i] + t) % g for t in range(nq)] for i in range(b)],
                    np.int32)
    if oob:
        locs[-1, -1] = a["k_pool"].shape[0] + 3
    return locs


@pytest.mark.parametrize("impl,nq,compiled", [
    ("reference", 3, False), ("reference", 1, False), ("triton", 3, False), ("mosaic", 3, False), ("mosaic", 1, False),
    ("mosaic", 19, False),
    pytest.param("mosaic", 1, True, marks=pytest.mark.gpu), pytest.param("mosaic", 4, True, marks=pytest.mark.gpu),
    pytest.param("mosaic", 19, True, marks=pytest.mark.gpu), pytest.param("triton", 4, True, marks=pytest.mark.gpu),
])
def test_write_locs_store_the_fresh_kv(impl, nq, compiled):
    """``write_locs=``: the output is the one without writing (bit for bit), and the returned pools equal the
    input pools with the fresh K/V at those slots of that layer, every other element unchanged (the other
    layers and slots hold NaN or random values: compared bitwise); an out-of-range slot writes nothing. The
    Mosaic kernel writes in chunks of 16 tokens (Q = 19: two chunks, the second overlapping the first)."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    dtype = jnp.float32 if impl != "mosaic" else jnp.bfloat16
    g, width = 16, 4
    a, g = _case(seed, b=3, nq=nq, hq=4, hkv=2, e=64, g=g, pages=14, p_width=width, dtype=dtype,
                 lens=[0, 21, width * g - nq])
    pt = np.asarray(a["page_table"]).copy()
    for i, n in enumerate([0, 21, width * g - nq]):  # the pages the fresh tokens land on are the request's own
        used = -(-(n + nq) // g)
        pt[i, :used] = np.arange(1 + i * width, 1 + i * width + used)
    a["page_table"] = jnp.asarray(pt)
    kw = dict(interpret=not compiled, num_splits=2) if impl != "reference" else {}
    want = np.asarray(_run(a, g, impl, **kw).astype(jnp.float32))
    nan = jnp.full_like(a["k_pool"], jnp.nan)
    k_whole, v_whole = jnp.stack([nan, a["k_pool"], nan]), jnp.stack([a["v_pool"], a["v_pool"], nan])
    for oob in (False, True):
        locs = _fresh_slots(a, g, oob)
        whole = dict(a, k_pool=jnp.array(k_whole), v_pool=jnp.array(v_whole))  # copies: the call donates them
        out, k_pool, v_pool = _run(whole, g, impl, layer=1, write_locs=jnp.asarray(locs), **kw)
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), want, err_msg=f"seed {seed}")
        for got, pool, new in ((k_pool, k_whole, a["k_new"]), (v_pool, v_whole, a["v_new"])):
            exp = np.asarray(pool.astype(jnp.float32)).copy()
            flat, rows = locs.reshape(-1), np.asarray(new.astype(jnp.float32)).reshape(-1, 2, 64)
            keep = flat < exp.shape[1]
            exp[1, flat[keep]] = rows[keep]
            np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), exp, err_msg=f"seed {seed} oob {oob}")
    with pytest.raises(ValueError, match="write_locs"):
        _run(a, g, impl, write_locs=jnp.zeros((3, nq + 1), jnp.int32), **kw)
