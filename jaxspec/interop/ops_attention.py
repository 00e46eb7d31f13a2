"""Side-by-side op definitions: paged attention vs SGLang 0.5.23's Triton attention kernels.

* ``paged_attention`` vs ``extend_attention_fwd`` with ``custom_mask`` (what SGLang's Triton backend runs
  for target verify): ``N`` fresh tokens per request under a random tree mask or a causal one, over a
  ragged paged prefix (lengths 0..P*G, random pages);
* ``paged_attention@decode`` vs ``decode_attention_fwd`` (one token per request, split-K).

Both sides read the same buffers (SGLang at its page size 1 layout over the same slots: see
``attention_originals.sglang_layout``). Inputs are float16 so that the CPU Triton interpreter computes the
originals correctly (it miscomputes bfloat16 ``tl.dot``); bfloat16 on the H200 is compared by
``bench/attention.py`` at every timed shape.

Tolerance ``ATOL = 2**-8``: both sides accumulate in float32 and round the output to float16 once; the
outputs are convex combinations of N(0, 1) values (|o| < 4, float16 spacing <= 2**-9 there), so one
rounding each plus float32 summation-order differences stay within 2 units of 2**-9. A wrong mask moves
outputs by O(0.1) (``tests/test_interop_attention.py`` checks that the check fails on one).
"""

import numpy as np
import torch

from jaxspec.interop import attention_originals as ao
from jaxspec.interop.registry import OpDef, config, register
from jaxspec.testing import random_tree_qmask

ATOL = 2.0**-8
SM_SCALE = 0.125  # 1 / sqrt(head_dim 64)


def _gen(rng, c):
    b, nq, hq, hkv, e, g, p = c["B"], c["N"], c["Hq"], c["Hkv"], 64, c["G"], c["P"]
    num_pages = b * p + 1
    pages = rng.permutation(np.arange(1, num_pages)).astype(np.int32).reshape(b, p)
    lens = rng.integers(0, p * g + 1, b).astype(np.int32)
    lens[0] = 0 if b > 1 else lens[0]  # a request with no prefix
    x = num_pages * g
    f16 = lambda *shape: rng.standard_normal(shape).astype(np.float16)  # noqa: E731
    qmask = random_tree_qmask(rng, b, nq) if c["mask"] == "tree" else np.tril(np.ones((nq, nq), bool))[None].repeat(b, 0)
    return {"q": f16(b, nq, hq, e), "k_new": f16(b, nq, hkv, e), "v_new": f16(b, nq, hkv, e),
            "k_pool": f16(x, hkv, e), "v_pool": f16(x, hkv, e), "page_table": pages, "prefix_lens": lens,
            "qmask": qmask, "page_size": g}


def _host(t):
    return {k: (v.cpu().numpy() if isinstance(v, torch.Tensor) and k in ("page_table", "prefix_lens", "qmask")
                else v) for k, v in t.items()}


def _orig_extend(t, device):
    h = _host(t)
    run, out = ao.extend_call(h["q"], h["k_new"], h["v_new"], h["k_pool"], h["v_pool"], h["page_table"],
                              h["prefix_lens"], h["qmask"], page_size=h["page_size"], sm_scale=SM_SCALE,
                              device=device, dtype=t["q"].dtype)
    run()
    return {"out": out.float().reshape(t["q"].shape)}


def _orig_decode(t, device):
    h = _host(t)
    run, out = ao.decode_call(h["q"], h["k_new"], h["v_new"], h["k_pool"], h["v_pool"], h["page_table"],
                              h["prefix_lens"], page_size=h["page_size"], sm_scale=SM_SCALE, device=device,
                              dtype=t["q"].dtype)
    with np.errstate(invalid="ignore"):  # the interpreter's -inf - -inf in SGLang's empty KV splits (masked out)
        run()
    return {"out": out.float().reshape(t["q"].shape)}


def _jax(fn, j, impl):
    import jax.numpy as jnp

    out = fn(j["q"], j["k_new"], j["v_new"], j["k_pool"], j["v_pool"], j["page_table"], j["prefix_lens"],
             j["qmask"], page_size=j["page_size"], sm_scale=SM_SCALE, **impl)
    return {"out": out.astype(jnp.float32)}


def _impls(device):
    """CPU: the Pallas-Triton kernel in interpret mode (the Mosaic GPU interpreter is ~50x slower) and the
    reference; CUDA: Mosaic GPU where it applies (else Triton), the Triton kernel, the reference."""
    if device == "cpu":
        return [("triton-interpret", {"implementation": "triton", "interpret": True}),
                ("reference", {"implementation": "reference"})]
    return [("pallas", {"implementation": "pallas"}), ("triton", {"implementation": "triton"}),
            ("reference", {"implementation": "reference"})]


register(OpDef(
    "paged_attention", "jaxspec.kernels.paged_attention:paged_attention", "paged_attention",
    (config(B=3, N=5, Hq=8, Hkv=2, G=16, P=4, mask="tree"), config(B=2, N=4, Hq=4, Hkv=4, G=16, P=3, mask="causal"),
     config(B=2, N=8, Hq=8, Hkv=1, G=1, P=40, mask="tree")),
    _gen, _orig_extend, _jax, has_implementation=True, atol=ATOL, implementations=_impls,
))

register(OpDef(
    "paged_attention@decode", "jaxspec.kernels.paged_attention:paged_attention", "paged_attention@decode",
    (config(B=3, N=1, Hq=8, Hkv=2, G=16, P=4, mask="causal"), config(B=2, N=1, Hq=4, Hkv=1, G=1, P=50, mask="causal")),
    _gen, _orig_decode, _jax, has_implementation=True, atol=ATOL, implementations=_impls,
))
