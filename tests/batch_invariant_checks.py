"""The batch-invariant mode's end-to-end properties on XLA:CPU, run by ``test_batch_invariant.py`` in a process of
its own (the mode needs ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` before jax starts, which the rest
of the suite does not set). Prints one JSON object: per property, what was compared.

The target is the shipped tiny pair in bf16 (weights and KV) with its trained MTP head, so drafts are accepted
(accept lengths well above 1) and the verify forward's rows carry real drafted tokens.
"""

import json
import sys

import numpy as np


def _decode_equals_extend() -> list:
    """SmolLM2-135M's widths (576 hidden, 9 / 3 heads of 64, 2 layers, bf16, page size 16), the interpreted Pallas
    kernels and the references: 4 tokens decoded one forward each == the same tokens in one causal extend, logits
    bit for bit (after a 70-token prefill through the same kernels)."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec import pipeline
    from jaxspec.models import Decoder, DecoderConfig
    from jaxspec.protocols import make_req_to_token

    cfg = DecoderConfig(vocab_size=1024, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                        num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                        tie_word_embeddings=True)
    target = Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    g, w, b, p, n = 16, 128, 2, 70, 4
    r2t = jnp.asarray(make_req_to_token(b, w, g, seed=1))
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, p)), jnp.int32)
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, n)), jnp.int32)
    fwd = jax.jit(lambda tok, meta, cache: target.forward(tok, meta, cache)[::2])
    same = []
    for impl, interpret in (("pallas", True), ("reference", False)):
        def inv(meta, impl=impl, interpret=interpret):
            return dataclasses.replace(meta, batch_invariant=True, implementation=impl, interpret=interpret)

        meta = pipeline.prefill_metadata(jnp.full((b,), p, jnp.int32), r2t, p, page_size=g,
                                         prefix_lens=jnp.zeros((b,), jnp.int32))
        _, c0 = fwd(prompts, inv(meta), target.make_cache(r2t, b * w + g))
        c, rows = c0, []
        for j in range(n):
            meta = pipeline.decode_metadata(jnp.full((b,), p + j, jnp.int32), r2t, page_size=g)
            logits, c = fwd(toks[:, j:j + 1], inv(meta), c)
            rows.append(logits[:, 0])
        meta = pipeline.prefill_metadata(jnp.full((b,), n, jnp.int32), r2t, n, page_size=g,
                                         prefix_lens=jnp.full((b,), p, jnp.int32))
        ext, _ = fwd(toks, inv(meta), c0)
        same.append(bool((np.asarray(jnp.stack(rows, 1)) == np.asarray(ext)).all()))
    return same


def main(pallas: bool) -> dict:
    import jax.numpy as jnp

    from jaxspec.config import SpecConfig
    from jaxspec.engine import AdaptivePolicy, Engine
    from jaxspec.models import DEFAULT_WEIGHTS, MTPDrafter, load_model
    from jaxspec.serving import RequestParams, ServingEngine

    model = load_model(DEFAULT_WEIGHTS, mtp=True, param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    kw = dict(max_context=96, page_size=4, batch_invariant=True)
    if pallas:  # the Pallas kernels, interpreted
        kw.update(implementation="pallas", interpret=True)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(2, 64, int(n)).astype(np.int32) for n in rng.integers(3, 30, 8)]
    new = 40
    out = {}
    plain = Engine(model, None, max_batch=8, **kw).generate(prompts, new)
    ref = [t.tolist() for t in plain.tokens]
    shapes = {"chain": SpecConfig(3, 1, 4), "tree": SpecConfig(3, 2, 6)}
    for name, spec in shapes.items():
        res = Engine(model, MTPDrafter(model), spec=spec, max_batch=8, **kw).generate(prompts, new)
        out[name] = dict(same=[t.tolist() == r for t, r in zip(res.tokens, ref)], accept=res.mean_accept_length)
    eng = Engine(model, MTPDrafter(model), spec=list(shapes.values()), adaptive=AdaptivePolicy(warm_start=False),
                 max_batch=8, **kw)
    eng.round_costs[8] = np.array([1.0, 1.3, 1.6])  # what a GPU measures, roughly: speculation pays (CPU's may not)
    res = eng.generate(prompts, new)
    out["adaptive"] = dict(same=[t.tolist() == r for t, r in zip(res.tokens, ref)], accept=res.mean_accept_length,
                           mode_rounds=np.asarray(res.mode_rounds).tolist())
    if pallas:
        return out
    out["smollm2_widths"] = dict(same=_decode_equals_extend())
    # one request alone == the same request in a batch of 32 with random neighbours (plain and chain)
    crowd = [rng.integers(2, 64, int(n)).astype(np.int32) for n in rng.integers(3, 40, 32)]
    crowd[11] = prompts[3]
    for name, spec in (("plain", None), ("chain", shapes["chain"])):
        drafter = None if spec is None else MTPDrafter(model)
        big = Engine(model, drafter, spec=spec, max_batch=32, **kw).generate(crowd, new)
        alone = Engine(model, drafter, spec=spec, max_batch=1, **kw).generate([prompts[3]], new)
        out[f"batch32_{name}"] = dict(same=[big.tokens[11].tolist() == alone.tokens[0].tolist()])
    # the serving core, random arrivals and chunked prompts, against the plain batch above
    se = ServingEngine(Engine(model, MTPDrafter(model), spec=shapes["chain"], max_batch=3, **kw),
                       max_prefill_tokens=8)
    arrive = rng.integers(0, 6, len(prompts))
    handles, step = {}, 0
    while len(handles) < len(prompts) or se.has_unfinished():
        for i in np.flatnonzero(arrive == step):
            handles[int(i)] = se.submit(prompts[i], RequestParams(max_new_tokens=new))
        se.step()
        step += 1
        if step > 400:
            raise RuntimeError("serving core did not finish")
    out["serving"] = dict(same=[handles[i].output == ref[i] for i in range(len(prompts))])
    return out


if __name__ == "__main__":
    print(json.dumps(main(pallas="--pallas" in sys.argv)))
