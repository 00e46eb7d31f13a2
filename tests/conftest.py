"""Strict test configuration.

TRITON_INTERPRET must be set before any Triton kernel module is imported (interop side-by-side tests
run the original SGLang/TokenSpeed Triton kernels on CPU torch tensors).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu") if not os.environ.get("JAXSPEC_TEST_GPU") else None

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=False,
    )
    settings.load_profile("ci")
except ImportError:  # pragma: no cover
    pass


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (or set JAXSPEC_SLOW=1)")


def pytest_collection_modifyitems(config, items):
    gpu = jax.default_backend() == "gpu"
    slow = config.getoption("--runslow") or os.environ.get("JAXSPEC_SLOW") == "1"
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow or JAXSPEC_SLOW=1")
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not slow:
            item.add_marker(skip_slow)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code():
    """Drop every compiled executable after each test module: the suite runs ~600 tests in one process, and
    the executables of earlier modules (none shared across modules) only grow its memory. A full run once
    died in an XLA:CPU compile (segfault) near its end, in a test that passes alone."""
    yield
    jax.clear_caches()
    import gc  # noqa: PLC0415

    gc.collect()
