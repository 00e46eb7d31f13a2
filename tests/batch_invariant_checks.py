"""The batch-invariant mode's end-to-end properties on XLA:CPU, run by ``test_batch_invariant.py`` in a process of
its own (the mode needs ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` before jax starts, which the rest
of the suite does not set). Prints one JSON object: per property, what was compared.

The target is the shipped tiny pair in bf16 (weights and KV) with its trained MTP head, so drafts are accepted
(accept lengths well above 1) and the verify forward's rows carry real drafted tokens.
"""

import json
import sys

import numpy as np


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
