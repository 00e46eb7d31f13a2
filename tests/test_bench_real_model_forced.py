"""bench/real_model.py's forced-mode rows on CPU (and its timing helper): an adaptive engine with every round forced
to each of its modes, on the same prompts (what each mode costs inside the adaptive loop). Every mode gives the
plain greedy output (the engine is lossless in f32), plain accepts one token a round, and a draft shape at least
one."""

import jax.numpy as jnp
import numpy as np
from bench_scripts import load
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import AdaptivePolicy, Engine
from jaxspec.models import DecoderConfig, MTPDrafter, MTPModel

CFG = DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)


def test_forced_rows_one_per_mode():
    rm = load("real_model")
    model = MTPModel(CFG, rngs=nnx.Rngs(3), kv_dtype=jnp.float32, num_mtp_layers=3)
    kw = dict(max_context=64, page_size=8, max_batch=2)
    eng = Engine(model, MTPDrafter(model), spec=(SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)), adaptive=AdaptivePolicy(),
                 **kw)
    rng = np.random.default_rng()
    prompts = [rng.integers(0, CFG.vocab_size, n).astype(np.int32) for n in (6, 3)]
    want = [t.tolist() for t in Engine(model, None, **kw).generate(prompts, 12).tokens]
    args = rm._parse(["--model", "unused", "--questions", "unused.jsonl", "--new-tokens", "12", "--repeats", "1"])
    run = rm.Run(None, None, {})
    rm._forced_rows(run, eng, "adaptive", prompts, args, 100.0, "default")
    rows = run.doc["rows"]
    assert [r["forced_mode"] for r in rows] == [0, 1, 2]
    assert all(r["config"] == "adaptive" and r["batch"] == 2 and r["tokens"] == 24 for r in rows)
    assert rows[0]["accept_len"] == 1.0 and all(r["accept_len"] >= 1.0 for r in rows[1:])
    assert all(r["speedup"] == r["tok_s"] / 100.0 for r in rows)
    st = eng.run_decode(eng.run_prefill(*eng.prepare(prompts, 12)), mode=2)
    assert [t.tolist() for t in eng.result(st, 2).tokens] == want


def test_policy_learned_reads_the_warm_start_of_each_bucket():
    """The adaptive rows' ``policy_learned``: per batch bucket the policy the last call left (the next call's warm
    start), per mode: plain's accept length fixed at 1, a shape that ran has request-rounds and its mean."""
    rm = load("real_model")
    model = MTPModel(CFG, rngs=nnx.Rngs(4), kv_dtype=jnp.float32, num_mtp_layers=3)
    eng = Engine(model, MTPDrafter(model), spec=(SpecConfig(3, 1, 4),), adaptive=AdaptivePolicy(), max_context=64,
                 page_size=8, max_batch=2)
    eng.round_costs[2] = np.float32([1e-3, 1e-3])  # priced alike: the shape runs first (its optimistic start)
    assert rm._policy_learned(eng) == {}
    rng = np.random.default_rng()
    res = eng.generate([rng.integers(0, CFG.vocab_size, 5).astype(np.int32) for _ in range(2)], 12)
    got = rm._policy_learned(eng)
    assert list(got) == [2] and sorted(got[2]) == ["accept", "backoff", "idle", "seen"]
    ps = eng.policy_memory[2]
    assert got[2]["accept"] == np.asarray(ps.accept).tolist() and got[2]["accept"][0] == 1.0
    assert res.mode_rounds[1] > 0 and got[2]["seen"][1] > 0 and 1.0 <= got[2]["accept"][1] <= 4.0


def test_timed_rows_describe_the_timed_calls():
    """The result a row reports (rounds per mode, accept length) is a timed call's, not the untimed first one's: an
    adaptive engine's later calls start from what the first one learned."""
    rm = load("real_model")
    calls = []
    res, first_s, s = rm._timed(lambda: calls.append(len(calls)) or len(calls), 3)
    assert calls == [0, 1, 2, 3] and res == 4 and first_s >= 0 and s >= 0
