"""Engine resources and checked mode.

* The KV pools are sized at construction; what does not fit is refused at once with the bytes it needs.
* ``max_new_tokens`` and the batch are bucketed: one executable serves many limits and batch sizes, and
  padding rows change nothing in the real rows.
* ``JAXSPEC_CHECKS=1``: ``Engine.generate`` runs (prefill and loop are checkified) and a failed kernel check
  is a ``ValueError`` naming the entry point. Run in a subprocess, so that the checked traces start from
  fresh jit caches.
"""

import os
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import TINY_PAIR_CONFIG, MTPDrafter, MTPModel

CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)


@pytest.fixture(scope="module")
def model():
    return MTPModel(TINY_PAIR_CONFIG, rngs=nnx.Rngs(7), kv_dtype=jnp.float32)


def test_memory_estimate_refuses_quickly(model):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"max_context=10000000: the KV pools need \d+ bytes"):
        Engine(model, MTPDrafter(model), spec=CHAIN, max_context=10**7)
    assert time.perf_counter() - t0 < 5.0  # nothing was allocated
    per_slot = model.kv_bytes_per_slot() + MTPDrafter(model).kv_bytes_per_slot(CHAIN)
    assert per_slot == (2 + 3) * 2 * 2 * 24 * 4
    eng = Engine(model, MTPDrafter(model), spec=CHAIN, max_context=64, max_batch=2)
    assert eng.pool_bytes == (2 * 64 + 1) * per_slot + 2 * 64 * 4
    with pytest.raises(ValueError, match=rf"need {eng.pool_bytes} bytes .* more than {eng.pool_bytes - 1} bytes"):
        Engine(model, MTPDrafter(model), spec=CHAIN, max_context=64, max_batch=2, memory_limit_bytes=eng.pool_bytes - 1)
    with pytest.raises(ValueError, match="max_batch=2"):
        eng.prepare([np.arange(3)] * 3, 4)


def test_buckets_share_one_executable(model):
    """Plain decoding: batches of 3 and 4 (bucket 4) and limits 5..16 (bucket 16) run one executable, and
    the padded batch gives the same tokens as the full one."""
    eng = Engine(model, None, max_context=48, page_size=16, max_batch=4)
    prompts = [np.arange(2, 2 + n) % 64 for n in (4, 9, 6, 3)]
    full = eng.generate(prompts, [16, 9, 5, 12])
    jitted = eng._entry_points(False).decode
    compiles = jitted._cache_size()
    part = eng.generate(prompts[:3], 11)
    assert jitted._cache_size() == compiles
    assert [len(t) for t in full.tokens] == [16, 9, 5, 12] and [len(t) for t in part.tokens] == [11] * 3
    for a, b in zip(part.tokens, full.tokens):
        n = min(len(a), len(b))
        np.testing.assert_array_equal(a[:n], b[:n])


_CHECKED = textwrap.dedent(
    """
    import numpy as np
    from flax import nnx
    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine
    import jax.numpy as jnp
    from jaxspec.models import TINY_PAIR_CONFIG, MTPDrafter, MTPModel

    m = MTPModel(TINY_PAIR_CONFIG, rngs=nnx.Rngs(7), kv_dtype=jnp.float32)
    eng = Engine(m, MTPDrafter(m), spec=SpecConfig(3, 2, 6), max_context=40, max_batch=2)
    prompts = [np.array([5, 6, 7, 8]), np.array([9, 10])]
    print("TOKENS", [t.tolist() for t in eng.generate(prompts, 6).tokens])
    state, p, lens = eng.prepare(prompts, 6)
    try:
        eng.run(state, p, lens.at[0].set(38))  # a prompt length past the padded prompts: rows overflow
        print("NO ERROR")
    except ValueError as e:
        print("ERROR", e)
    """
)


def test_checked_mode_generates_and_reports(model):
    env = dict(os.environ, JAXSPEC_CHECKS="1")
    out = subprocess.run([sys.executable, "-c", _CHECKED], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0] in ("TOKENS", "ERROR"))
    eng = Engine(model, MTPDrafter(model), spec=TREE, max_context=40, max_batch=2)
    want = eng.generate([np.array([5, 6, 7, 8]), np.array([9, 10])], 6)
    assert lines["TOKENS"] == str([t.tolist() for t in want.tokens])
    assert lines["ERROR"].startswith(("JAXSPEC_CHECKS: a check failed in Engine.prefill:",
                                      "JAXSPEC_CHECKS: a check failed in Engine.decode:")), out.stdout
