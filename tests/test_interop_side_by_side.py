"""Side by side on CPU: the ORIGINAL SGLang / TokenSpeed kernels (Triton interpreter, loaded from their pinned
release files) vs the jaxspec ops (Pallas interpret + jnp reference) on identical random inputs.

Missing originals make these tests FAIL with the fetch instruction (never skip): run
``python -m jaxspec.interop.fetch`` (tools/setup.sh does). Sizes are bounded (batch <= 16, N <= 16) and
hypothesis draws from each op's first two configs, so the number of compiles stays small.
"""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("triton")

from jaxspec.interop import fetch, harness, originals  # noqa: E402

pytestmark = pytest.mark.interop

CPU_OPS = harness.ops_for("cpu")
MAX_CONFIGS = 2  # per op in the test suite (compile time dominates; the CLI covers every config)
EXAMPLES = 3


def test_every_original_file_is_present_and_matches_the_manifest():
    """Fails (does not skip) without the extracted originals, naming the fetch command."""
    for (dist, version), paths in fetch.required_files().items():
        for p in sorted(paths):
            originals.require(dist, version, p)  # raises OriginalsMissing("... run python -m jaxspec.interop.fetch")
    manifest = json.loads((originals.originals_root() / fetch.MANIFEST).read_text())
    for (dist, version), paths in fetch.required_files().items():
        files = manifest[f"{dist}-{version}"]["files"]
        for p in paths:
            data = originals.original_path(dist, version, p).read_bytes()
            assert hashlib.sha256(data).hexdigest() == files[p], p


def test_missing_originals_error_names_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_ORIGINALS", str(tmp_path))
    with pytest.raises(originals.OriginalsMissing, match=r"python -m jaxspec\.interop\.fetch"):
        originals.require("sglang", "0.5.23", "sglang/kernels/ops/speculative/eagle.py")


def test_table_covers_the_harness_and_loads_without_server_packages():
    import sys

    for op in harness.OPS.values():
        assert op.original in originals.ORIGINALS, op.name
    for key, o in originals.ORIGINALS.items():
        if o.kind != "cuda":
            assert callable(originals.load(key)), key
    assert not [m for m in sys.modules if m == "sglang" or m.startswith(("sglang.", "tokenspeed"))]


def test_every_cpu_op_is_available():
    missing = {}
    for op in CPU_OPS:
        try:
            harness.jaxspec_fn(op)
        except (ImportError, AttributeError) as e:
            missing[op] = f"{type(e).__name__}: {e}"
    assert not missing, missing


@pytest.mark.parametrize("op", CPU_OPS)
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_side_by_side(op, data):
    configs = harness.OPS[op].configs[:MAX_CONFIGS]
    config = data.draw(st.sampled_from(configs), label="config")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    inputs = harness.make_inputs(op, np.random.default_rng(seed), config)
    for label, _ in harness.implementations(op, "cpu"):
        rep = harness.compare(op, implementation=label, device="cpu", **inputs)
        assert rep.ok, str(rep)


def test_harness_detects_a_mismatch(monkeypatch):
    """The harness can fail: an off-by-one jaxspec output is reported per element."""
    op = harness.OPS["fill_bonus_tokens"]

    def off_by_one(fn, j, impl):
        return {"bonus_tokens": fn(j["predict"], j["accept_index"], j["accept_lens"]) + 1}

    monkeypatch.setitem(harness.OPS, op.name, dataclasses.replace(op, run_jaxspec=off_by_one))
    inputs = harness.make_inputs(op.name, np.random.default_rng(0), op.configs[0])
    rep = harness.compare(op.name, **inputs)
    assert not rep.ok and rep.mismatches == op.configs[0]["B"]
    assert rep.outputs[0].max_abs_diff == 1.0


def test_check_cli_single_op(capsys):
    from jaxspec.interop import check

    rc = check.main(["--ops", "fill_bonus_tokens", "--cases", "2", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fill_bonus_tokens" in out and "OK: 0 mismatching" in out


def test_cuda_originals_not_imported_on_cpu(monkeypatch):
    """The CPU path of an op with a CUDA twin never imports cuda_originals (other test files may have)."""
    import sys

    monkeypatch.delitem(sys.modules, "jaxspec.interop.cuda_originals", raising=False)
    rows = harness.run_cases("verify_tree_greedy", seed=0, cases=1, max_configs=1)
    assert rows[0].mismatches == 0
    assert "jaxspec.interop.cuda_originals" not in sys.modules


def test_select_top_k_known_differences_are_generated_and_named():
    """Ties and subnormal scores are generated on purpose and reported under their names (the
    differences are real: every generated case differs), never as mismatches or silent passes."""
    op = harness.OPS["select_top_k_tokens"]
    assert set(op.known_differences) == {"ties", "subnormals"}
    rows = [r for r in harness.run_cases(op.name, seed=0, cases=2) if r.config.get("case")]
    assert sorted(r.known_class for r in rows) == ["subnormals", "ties"]
    for r in rows:
        assert r.mismatches == 0 and r.known == r.cases == 2, r
        assert r.known_differing >= 1, r  # the class really differs, so reporting it is not vacuous
    random_inputs = harness.make_inputs(op.name, np.random.default_rng(0), op.configs[1])
    assert op.known_class(random_inputs) is None  # ordinary inputs stay strict


def test_check_cli_reports_known_differences(capsys):
    from jaxspec.interop import check

    rc = check.main(["--ops", "select_top_k_tokens", "--cases", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[ties]" in out and "[subnormals]" in out and "known difference select_top_k_tokens [ties]:" in out


def test_unfetched_original_is_a_setup_error_not_a_mismatch(tmp_path, monkeypatch, capsys):
    """Without the extracted originals the side-by-side check stops with the fetch command (exit 2), instead of
    counting every case of the op as a mismatch."""
    monkeypatch.setenv("JAXSPEC_ORIGINALS", str(tmp_path))
    with pytest.raises(originals.OriginalsMissing, match=r"python -m jaxspec\.interop\.fetch"):
        harness.run_cases("fill_bonus_tokens", seed=0, cases=1, max_configs=1)
    from jaxspec.interop import check

    assert check.main(["--ops", "fill_bonus_tokens", "--cases", "1"]) == 2
    assert "python -m jaxspec.interop.fetch" in capsys.readouterr().err


def test_unfetched_tvm_ffi_wheel_names_the_cuda_fetch(tmp_path, monkeypatch):
    """The CUDA originals' missing tvm-ffi wheel is the same set-up error (``check --device cuda`` exits 2)."""
    import builtins

    from jaxspec.interop import cuda_originals

    real_import = builtins.__import__

    def no_tvm_ffi(name, *a, **kw):
        if name == "tvm_ffi":
            raise ImportError("no tvm_ffi in this test")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tvm_ffi)
    monkeypatch.setenv("JAXSPEC_ORIGINALS", str(tmp_path))
    with pytest.raises(originals.OriginalsMissing, match=r"python -m jaxspec\.interop\.fetch --cuda"):
        cuda_originals._tvm_ffi.__wrapped__()
