"""CPU smoke test of bench/step.py's correctness path.

The jaxspec one-jit step (Pallas kernels in interpret mode) and SGLang 0.5.23's step (its Triton
kernels under TRITON_INTERPRET=1, set by conftest) run on the same tiny inputs; every output (tree
arrays, predict, accept_index, accept_lens, bonus, move pairs, the KV pool bit-exact, next cache
locations) must be equal. Plus the plotting script on a synthetic result.
"""

import pytest

from bench_scripts import load as _load
from jaxspec.testing import make_step_inputs

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def step():
    from jaxspec.interop import originals

    # Missing originals fail (python -m jaxspec.interop.fetch; tools/setup.sh runs it) -- never a skip.
    for f in ("spec_tree.py", "eagle.py", "cache_locs.py"):
        originals.require(*originals.SGLANG, f"sglang/kernels/ops/speculative/{f}")
    originals.require(*originals.SGLANG, "sglang/kernels/ops/kvcache/cache_move.py")
    originals.require(*originals.SGLANG, "sglang/srt/utils/common.py")
    mod = _load("step")
    mod.configure("cpu")  # conftest already pinned JAX to CPU and TRITON_INTERPRET=1
    return mod


@pytest.mark.interop
def test_step_matches_original_cpu(step):
    # tiny pool: 2 layers x 2 KV heads x 64 dims, 2048 slots; tree (S5 K4 N8) and chain (S3 K1 N4)
    res = step.run("cpu", batch_sizes=(1, 4), configs=("tree", "chain"), check_only=True)
    rows = res["rows"]
    assert [(r["config"], r["bs"]) for r in rows] == [("tree", 1), ("tree", 4), ("chain", 1), ("chain", 4)]
    assert all(r["checked"] for r in rows)
    tree4 = rows[1]
    assert tree4["moved_locations"] == 4 * 6 and tree4["kv_bytes"] == 2 * 24 * 2 * 2 * 256
    assert rows[3]["moved_locations"] == 0  # K == 1: upstream skips the move


@pytest.mark.interop
def test_inputs_spread_accept_lengths(step):
    pool = step.PoolShape(layers=2, kv_heads=2, head_dim=64, slots=2**14)  # sizes only, nothing allocated
    inp = make_step_inputs(5, 4, 8, 64, pool.slots, max_bs=64, seed=7)
    lens = inp.expected_accept_lens
    assert lens.min() == 1 and lens.max() >= 5  # target_predict was built for varied acceptance
    assert inp.out_cache_loc.shape == (64 * 8,) and (inp.out_cache_loc > 0).all()  # never the dummy slot 0


def test_plot_synthetic(tmp_path):
    pytest.importorskip("matplotlib")
    plot_step = _load("plot_step")
    rows = []
    for cfg, (s, k, n) in (("tree", (5, 4, 8)), ("chain", (3, 1, 4))):
        for bs in (1, 16, 64, 256):
            rows.append(dict(
                config=cfg, S=s, K=k, N=n, bs=bs, ours_wall_us=50.0 + bs, ours_gpu_us=None, ours_loop_us=20.0 + bs,
                orig_eager_wall_us=330.0 + 10 * bs, orig_eager_gpu_us=300.0 + 10 * bs,
                orig_graph_gpu_us=44.0 + 10 * bs, floor_us=0.4 * bs,
            ))
    out = tmp_path / "step.png"
    plot_step.plot({"meta": {"device": "cpu"}, "rows": rows}, str(out))
    assert out.stat().st_size > 1000
    # a floor six decades below the data (the H200 chain panel) must not stretch the axis over it
    for r in rows:
        r["floor_us"] = 1e-4 * r["bs"]
    limits = plot_step.plot({"meta": {"device": "cpu"}, "rows": rows}, str(out))
    assert all(lo > 10.0 and hi < 5000.0 for lo, hi in limits), limits
    assert plot_step.main([str(_write_json(tmp_path, rows)), str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 1000


def _write_json(tmp_path, rows):
    import json

    path = tmp_path / "step.json"
    path.write_text(json.dumps({"meta": {"device": "cpu"}, "rows": rows}))
    return path


@pytest.mark.interop
def test_packed_step_roundtrip(step):
    """PackedStep (the default: one int32 + one float32 input buffer) returns exactly what the unpacked
    step returns."""
    import jax.numpy as jnp
    import numpy as np

    def toy(k, v, x):
        out = {"a": x["ints"][0] * 2 + x["ints"][1].sum(), "m": x["ints"][1] > 3,
               "s": (x["floats"][0] > 0.5).astype(jnp.int32)}
        return k + 1, v, out

    x = {"ints": [jnp.arange(3, dtype=jnp.int32), jnp.arange(6, dtype=jnp.int32).reshape(2, 3)],
         "floats": [jnp.linspace(0, 1, 4, dtype=jnp.float32)]}
    k, v = jnp.zeros((2, 3), jnp.bfloat16), jnp.ones((2, 3), jnp.bfloat16)
    _, _, want = toy(k, v, x)
    ps = step.PackedStep(toy, x)
    k2, _, packed = ps.jit(k, v, *ps.pack(x))
    got = ps.unpack(packed)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], np.asarray(want[name]))
        assert got[name].dtype == np.asarray(want[name]).dtype
    np.testing.assert_array_equal(np.asarray(k2, np.float32), 1.0)
