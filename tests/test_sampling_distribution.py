"""Lossless in distribution: speculative sampling in the compiled loop samples the target's own distribution.

On the shipped tiny pair (CPU), one fixed prompt is decoded by many independent requests in one batch (each
with its own seed); the joint distribution of the first three generated tokens ``(t1, t2, t3)`` (``t1`` from
the prefill, ``t2, t3`` from the first speculative round, or ``t3`` from the second when round 1 accepted no
draft) is compared with the target's own sampling distribution, computed EXACTLY on the host:
``P(t1) P(t2 | t1) P(t3 | t1, t2)`` from target forwards over every needed prefix (``64 + 64**2``
prefixes), each row processed by ``ops.accept.sampling_probs`` (temperature, top-k, top-p) -- the definition of
"sampling the target" the engine's plain decoding uses too.

Settings (temperature, top_k, top_p): (1.0, off, 1.0), (0.7, off, 0.9), (1.3, 4, 1.0), mixed in the same
batch (requests round-robin over them: the parameters are per-request arrays, so one executable serves
all). Configs: chain S3/K1/N4 and tree S3/K2/N6 with SGLang's target-only verify, and the chain with
``verify="draft_probs"`` (sampled drafts, classic rule).

Test: Pearson chi-square over the joint cells of every setting (cells with expected count < 5 pooled into
one bin; the three settings' statistics and degrees of freedom summed, they are independent), p-value from
``scipy.stats.chi2.sf``. The test FAILS when p < 1e-4: false-alarm rate 1e-4 per config (3e-4 for the file).
The detector is shown to bite: the same check REJECTS (p < 1e-4) a deliberately biased verifier, the
chain with ``threshold_single=0`` (SGLang's threshold that accepts every draft the target gives positive
mass), on a quarter of the samples.

Samples: ``SAMPLES`` per config over the three settings (default 26 * 4096 = 106496, ~35.5k per setting;
``JAXSPEC_SAMPLING_SAMPLES`` overrides). The engine tests are compute- and compile-bound on CPU (each config
compiles once, ~1 min with the B=4096 constant folding of the prefill attention, then ~1-3 ms per request
on a 2-core CPU): measured 96-350 s per config, 11 min for the file under load, so they are
marked slow; the op-level test at the end is fast (~10 s). Measured (106496 samples): chain p=0.555
(chi2 140.0, df 143), tree p=0.484 (143.0 / 143), chain draft_probs p=0.764 (130.5 / 143); biased
verifier p=0 (chi2 ~2e6, df 95, on 28672 samples).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxspec import pipeline
from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import MTPDrafter, load_pair
from jaxspec.protocols import make_req_to_token
from jaxspec.ops.accept import sampling_probs
from jaxspec.ops.verify import chain_speculative_sampling

PROMPT = np.array([3, 17, 42, 8, 25], np.int32)
SETTINGS = [(1.0, -1, 1.0), (0.7, -1, 0.9), (1.3, 4, 1.0)]
CHUNK = 4096  # requests per generate call (one executable per config)
SAMPLES = int(os.environ.get("JAXSPEC_SAMPLING_SAMPLES", 26 * CHUNK))
P_FAIL = 1e-4
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)


@pytest.fixture(scope="module")
def model():
    return load_pair()


def _last_logits(model, seqs: np.ndarray) -> np.ndarray:
    """Target logits after each full row of ``seqs (M, L)`` (a plain prefill forward)."""
    m, length = seqs.shape
    r2t = jnp.asarray(make_req_to_token(m, length, 1))
    cache = model.make_cache(r2t, m * length + 1)
    meta = pipeline.prefill_metadata(jnp.full((m,), length, jnp.int32), r2t, length, page_size=1)
    logits, _, _ = jax.jit(model.forward)(jnp.asarray(seqs), meta, cache)
    return np.asarray(logits[:, -1])


def _probs(logits: np.ndarray, setting) -> np.ndarray:
    t, k, p = setting
    m, v = logits.shape
    k = v if k == -1 else k
    out = sampling_probs(jnp.asarray(logits)[:, None], jnp.full((m,), t, jnp.float32), jnp.full((m,), k, jnp.int32),
                         jnp.full((m,), p, jnp.float32))
    return np.asarray(out[:, 0], np.float64)


@pytest.fixture(scope="module")
def exact(model):
    """``{setting: P[t1, t2, t3]}`` (V, V, V) from the target's probabilities."""
    v = model.vocab_size
    l1 = _last_logits(model, PROMPT[None])
    t1 = np.arange(v, dtype=np.int32)
    l2 = _last_logits(model, np.concatenate([np.repeat(PROMPT[None], v, 0), t1[:, None]], 1))
    pairs = np.stack(np.meshgrid(t1, t1, indexing="ij"), -1).reshape(-1, 2)
    l3 = _last_logits(model, np.concatenate([np.repeat(PROMPT[None], v * v, 0), pairs], 1))
    out = {}
    for s in SETTINGS:
        p1, p2, p3 = _probs(l1, s)[0], _probs(l2, s), _probs(l3, s).reshape(v, v, v)
        out[s] = p1[:, None, None] * p2[:, :, None] * p3
    return out


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom, cells with expected count < 5 pooled (the pool merged into
    the smallest kept cell when it is itself below 5)."""
    counts, probs = counts.ravel().astype(np.float64), probs.ravel() / probs.sum()
    n = counts.sum()
    exp = probs * n
    keep = exp >= 5
    obs_k, exp_k = list(counts[keep]), list(exp[keep])
    pool_o, pool_e = counts[~keep].sum(), exp[~keep].sum()
    if pool_e >= 5:
        obs_k.append(pool_o)
        exp_k.append(pool_e)
    elif pool_o or pool_e:
        i = int(np.argmin(exp_k))
        obs_k[i] += pool_o
        exp_k[i] += pool_e
    o, e = np.array(obs_k), np.array(exp_k)
    return float(np.sum((o - e) ** 2 / e)), len(o) - 1


def _sample(model, spec, samples, **kw):
    """``{setting: tokens (n, 3)}`` from the engine, requests round-robin over SETTINGS."""
    drafter = MTPDrafter(model, sample_drafts=kw.get("verify") == "draft_probs")
    eng = Engine(model, drafter, spec=spec, max_context=16, page_size=16, max_batch=CHUNK, **kw)
    which = np.arange(CHUNK) % len(SETTINGS)
    cols = [np.array([SETTINGS[w][i] for w in which]) for i in range(3)]
    got = {s: [] for s in SETTINGS}
    accept = []
    for c in range(-(-samples // CHUNK)):
        res = eng.generate([PROMPT] * CHUNK, 3, temperature=cols[0].astype(float), top_k=cols[1].astype(int),
                           top_p=cols[2].astype(float), seed=np.arange(CHUNK) + c * CHUNK)
        toks = np.stack(res.tokens)
        for i, s in enumerate(SETTINGS):
            got[s].append(toks[which == i])
        accept.append(res.mean_accept_length)
    return {s: np.concatenate(x) for s, x in got.items()}, float(np.mean(accept))


def _test(exact, samples_by_setting):
    v = next(iter(exact.values())).shape[0]
    stat, df, lines = 0.0, 0, []
    for s, toks in samples_by_setting.items():
        counts = np.bincount((toks[:, 0] * v + toks[:, 1]) * v + toks[:, 2], minlength=v**3)
        x, d = chi_square(counts, exact[s])
        tv = 0.5 * np.abs(counts / counts.sum() - exact[s].ravel()).sum()
        lines.append(f"{s}: n={len(toks)} chi2={x:.1f} df={d} p={stats.chi2.sf(x, d):.3g} tv={tv:.4f}")
        stat, df = stat + x, df + d
    return float(stats.chi2.sf(stat, df)), f"chi2={stat:.1f} df={df}; " + "; ".join(lines)


CONFIGS = {
    "chain": (CHAIN, {}),
    "tree": (TREE, {}),
    "chain_draft_probs": (CHAIN, dict(verify="draft_probs")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lossless_in_distribution(model, exact, name):
    spec, kw = CONFIGS[name]
    samples, accept = _sample(model, spec, SAMPLES, **kw)
    p, report = _test(exact, samples)
    print(f"\n{name}: mean accept length {accept:.3f}; p={p:.3g}; {report}")
    assert p >= P_FAIL, report


@pytest.mark.slow
def test_detector_rejects_biased_verifier(model, exact):
    samples, accept = _sample(model, CHAIN, SAMPLES // 4, threshold_single=0.0)
    p, report = _test(exact, samples)
    print(f"\nbiased (threshold_single=0): mean accept length {accept:.3f}; p={p:.3g}; {report}")
    assert p < P_FAIL, report


def test_chain_op_exact_distribution():
    """``chain_speculative_sampling`` alone (fast): random target / draft distributions (V=5, S=2), drafts
    drawn from q, 200k rows in one call; the joint of the first two committed tokens must match
    ``p0(x1) p1(x2 | x1)`` (the chain's target rows are fixed per position, so the exact joint is the product).
    Chi-square as above, fails at p < 1e-4. Its biased twin (accept every draft) must be rejected."""
    rng = np.random.default_rng(0)
    v, s, b = 5, 2, 200_000
    p = rng.dirichlet(np.ones(v), size=s + 1).astype(np.float32)
    q = rng.dirichlet(np.ones(v), size=s).astype(np.float32)
    p[1, 3] = 0.0  # a token the target never samples but the draft may propose
    p[1] /= p[1].sum()
    key = jax.random.key(1)
    kx, kc, kf = jax.random.split(key, 3)
    drafts = jax.random.categorical(kx, jnp.log(jnp.asarray(q))[None], axis=-1, shape=(b, s)).astype(jnp.int32)
    cand = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), drafts], 1)
    coins = jax.random.uniform(kc, (b, s + 1))
    final = jax.random.uniform(kf, (b,))
    tp = jnp.broadcast_to(jnp.asarray(p)[None], (b, s + 1, v))
    dp = jnp.broadcast_to(jnp.asarray(q)[None], (b, s, v))
    out = chain_speculative_sampling(cand, coins, final, tp, dp)
    pred = np.asarray(out.predict).reshape(b, s + 1)
    num = np.asarray(out.num_correct_drafts)
    assert np.array_equal(np.asarray(out.accept_index)[:, 0], np.arange(b) * (s + 1))
    # t2 is committed by this call when draft 1 was accepted; else it is the next round's first token, whose
    # target row is p[1] in this synthetic model (drawn here from p[1] directly).
    t2 = np.where(num >= 1, pred[:, 1], rng.choice(v, size=b, p=_normalised(p[1])))
    joint = np.bincount(pred[:, 0] * v + t2, minlength=v * v)
    want = (p[0][:, None] * p[1][None, :]).astype(np.float64)
    x, d = chi_square(joint, want)
    assert stats.chi2.sf(x, d) >= P_FAIL, (x, d)
    biased = np.where(np.arange(s)[None] < s, np.asarray(drafts), 0)  # accept-all: the drafts themselves
    xb, db = chi_square(np.bincount(biased[:, 0] * v + biased[:, 1], minlength=v * v), want)
    assert stats.chi2.sf(xb, db) < P_FAIL, (xb, db)


def _normalised(x):
    x = np.asarray(x, np.float64)
    return x / x.sum()
