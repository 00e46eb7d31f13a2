"""``python -m jaxspec.serve --compilation-cache DIR``: the warm-up's executables land in DIR, and a second start
with the same options loads them (no new entries). Each start is a fresh interpreter (the cache is process-wide
JAX configuration, which must not leak into the other tests). CPU, the shipped tiny pair."""

import os
import subprocess
import sys

import pytest

BUILD = """
import sys
from jaxspec.models import DEFAULT_WEIGHTS
from jaxspec.serve import cli
args = cli.parser().parse_args(["--model", DEFAULT_WEIGHTS, "--max-context", "64", "--max-batch", "2", "--greedy",
                                "--compilation-cache", sys.argv[1]])
cli.build(args)
import jax
assert jax.config.jax_compilation_cache_dir == sys.argv[1], jax.config.jax_compilation_cache_dir
"""


def _start(cache):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", BUILD, str(cache)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return sorted(os.listdir(cache))


def test_a_restart_loads_the_warm_up_from_the_cache(tmp_path):
    pytest.importorskip("aiohttp")
    cache = tmp_path / "xla"
    first = _start(cache)
    assert len(first) >= 4  # the page tables, prefills and decodes of the warm-up
    assert _start(cache) == first  # every executable found: nothing compiled, nothing written
