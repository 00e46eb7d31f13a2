"""``import jaxspec`` (ops, kernels, models, engine) works with torch and triton absent; ``jaxspec.interop``
is lazy: importing the package (and its torch-free submodules) never imports torch or triton."""

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    r"""
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = ("torch", "triton")
    attempts = []

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ImportError(f"blocked import of {name} (torch/triton absent)")
            return None

    sys.meta_path.insert(0, _Block())

    import numpy as np
    import jaxspec, jaxspec.kernels, jaxspec.interop
    from jaxspec.interop import originals, fetch, pins  # torch-free interop modules

    # every module of the JAX side must import without torch/triton
    broken = {}
    for pkg in ("jaxspec", "jaxspec.ops", "jaxspec.kernels", "jaxspec.models", "jaxspec.engine"):
        mod = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(mod.__path__, pkg + "."):
            if info.name.startswith("jaxspec.interop"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as e:  # noqa: BLE001 - reported below
                broken[info.name] = f"{type(e).__name__}: {e}"
    torchy = {k: v for k, v in broken.items() if "blocked import" in v}
    assert not torchy, f"modules needing torch/triton: {torchy}"
    for k, v in broken.items():
        print(f"note: {k} failed to import for another reason: {v}")

    # the ops run
    from jaxspec.config import SpecConfig
    from jaxspec.ops.tree import TreeMaskMode, build_tree
    from jaxspec.ops.verify import verify_tree_greedy
    from jaxspec.kernels.cache_locs import assign_extend_cache_locs

    cfg = SpecConfig(num_steps=2, topk=1, num_draft_tokens=3)
    t = build_tree(np.array([7], np.int32), np.array([[-1, 0]], np.int32), np.array([[0, 1]], np.int32),
                   np.array([[8, 9]], np.int32), np.array([4], np.int32), config=cfg,
                   mask_mode=TreeMaskMode.QLEN_ONLY)
    assert np.asarray(t.positions).tolist() == [4, 5, 6], t.positions
    v = verify_tree_greedy(np.asarray(t.draft_tokens).reshape(1, 3), t.retrieve_index, t.retrieve_next_token,
                           t.retrieve_next_sibling, np.array([[8, 9, 5]], np.int32), num_steps=2)
    assert int(v.num_correct_drafts[0]) == 2, v
    locs = assign_extend_cache_locs(np.array([0], np.int32), np.arange(8, dtype=np.int32).reshape(1, 8),
                                    np.array([2], np.int32), np.array([5], np.int32), out_size=4,
                                    implementation="reference")
    assert np.asarray(locs).tolist() == [2, 3, 4, 0], locs

    # the torch-needing interop modules refuse cleanly
    try:
        import jaxspec.interop.dlpack  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("jaxspec.interop.dlpack imported without torch")
    assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "torch/triton in sys.modules"
    assert set(attempts) <= {"torch", "triton"} and "torch" in attempts, attempts  # only the dlpack probe
    print("OK")
    """
)


def test_import_jaxspec_without_torch_or_triton():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
