"""The jaxspec models in the engine, losslessly (greedy speculative == plain greedy, token for token):

* a random Llama target made by Hugging Face ``transformers`` (``save_pretrained``), loaded with
  ``load_model`` and given a random MTP head with ``add_mtp_layers``, chain and tree;
* the shipped tiny pair with its attention on the Pallas paged attention kernel (interpret mode on CPU),
  selected through ``AttentionMetadata.implementation`` / ``interpret``.
CPU, f32.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.kernels.paged_attention import resolve_attention_implementation
from jaxspec.models import MTPDrafter, MTPModel, add_mtp_layers, load_model, load_pair

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)


def _assert_same(res, ref, max_new):
    assert len(res.tokens) == len(ref.tokens)
    for i, (a, b) in enumerate(zip(res.tokens, ref.tokens)):
        assert len(a) == max_new
        np.testing.assert_array_equal(a, b, err_msg=f"request {i}")


# ------------------------------------------------------------------ transformers-made Llama + random MTP head


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # unit-scale weights: HF's std 0.02 init gives near-uniform logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.ndim == 2 and "embed" not in name:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
            else:
                p.copy_(torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf_llama")
    model.save_pretrained(path)
    target = load_model(str(path), kv_dtype=jnp.float32)
    assert not isinstance(target, MTPModel)  # no MTP weights in the checkpoint
    return add_mtp_layers(target, 3, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def hf_prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(0, 96, n).astype(np.int32) for n in (4, 9, 6)]


@pytest.fixture(scope="module")
def hf_plain(hf_model, hf_prompts):
    return Engine(hf_model, None, max_context=48, page_size=16, max_batch=4).generate(hf_prompts, 16)


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_transformers_llama_with_random_mtp_head_lossless(hf_model, hf_prompts, hf_plain, spec):
    eng = Engine(hf_model, MTPDrafter(hf_model), spec=spec, max_context=48, page_size=16, max_batch=4)
    res = eng.generate(hf_prompts, 16)
    _assert_same(res, hf_plain, 16)
    assert 1.0 <= res.mean_accept_length <= spec.num_steps + 1


# ------------------------------------------------------------------ the tiny pair on the Pallas attention kernel


class KernelAttention(nnx.Module):
    """``model`` with every forward's ``AttentionMetadata`` set to the given attention implementation (what
    ``Engine(implementation=..., interpret=...)`` does once the round's metadata builders pass the switch)."""

    def __init__(self, model: MTPModel, implementation: str, interpret: bool):
        self.model, self.implementation, self.interpret = model, implementation, interpret
        self.vocab_size, self.feature_size = model.vocab_size, model.feature_size
        self.num_draft_steps = model.num_draft_steps

    def _meta(self, meta):
        return dataclasses.replace(meta, implementation=self.implementation, interpret=self.interpret)

    def make_cache(self, req_to_token, num_slots):
        return self.model.make_cache(req_to_token, num_slots)

    def make_draft_cache(self, req_to_token, num_slots):
        return self.model.make_draft_cache(req_to_token, num_slots)

    def kv_bytes_per_slot(self):
        return self.model.kv_bytes_per_slot()

    def forward(self, tokens, meta, cache):
        return self.model.forward(tokens, self._meta(meta), cache)

    def mtp_forward(self, step, h_prev, tokens, meta, cache, rows=None):
        return self.model.mtp_forward(step, h_prev, tokens, self._meta(meta), cache, rows=rows)


@pytest.mark.slow  # the Pallas kernel interpreted inside the whole decode loop (~1-2 min on a shared CPU)
def test_tiny_pair_on_pallas_attention_kernel_lossless():
    model = load_pair()
    q = jnp.zeros((1, 1, 4, 24), jnp.float32)
    assert resolve_attention_implementation("pallas", q, 16, True) == "triton"  # a kernel, not the reference
    prompts = [np.array([5, 6, 7, 8, 9], np.int32), np.array([10, 11, 12], np.int32)]
    kw = dict(max_context=32, page_size=16, max_batch=2)
    plain = Engine(model, None, **kw).generate(prompts, 10)
    fast = KernelAttention(model, "pallas", True)
    res = Engine(fast, MTPDrafter(fast), spec=CHAIN, **kw).generate(prompts, 10)
    _assert_same(res, plain, 10)
    assert res.mean_accept_length > 1.5  # trained pair: drafts accepted, so verify and draft extend both ran


@pytest.mark.parametrize("prompts", [[[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5], [7, 8, 9]]], ids=["batch1", "batch2"])
def test_bf16_model_on_the_mosaic_kernel_lossless(prompts):
    """A bf16 target with 64-wide heads (what the Mosaic attention kernel takes) in the whole decode loop,
    the kernel run by the Mosaic GPU interpreter: it writes the fresh K/V itself (prefill, verify, the MTP
    layers' extends; a single decode token through XLA's in-place update), the pools aliased in and out of
    it. Greedy plain and chain outputs equal the reference engine's token for token, with checks on too."""
    import jaxspec
    from jaxspec.models import DecoderConfig

    cfg = DecoderConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_nextn_predict_layers=2)
    m = MTPModel(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    kw = dict(page_size=16, max_context=64, max_batch=len(prompts))
    q = jnp.zeros((1, 1, 2, 64), jnp.bfloat16)
    assert resolve_attention_implementation("pallas", q, 16, True) == "mosaic"
    ref = Engine(m, None, spec=None, implementation="reference", **kw).generate(prompts, 8)
    for spec in (None, SpecConfig(2, 1, 3)):
        eng = Engine(m, None if spec is None else MTPDrafter(m), spec=spec, implementation="pallas", interpret=True,
                     **kw)
        _assert_same(eng.generate(prompts, 8), ref, 8)
    with jaxspec.checks():
        eng = Engine(m, MTPDrafter(m), spec=SpecConfig(2, 1, 3), implementation="pallas", interpret=True, **kw)
        _assert_same(eng.generate(prompts, 8), ref, 8)
