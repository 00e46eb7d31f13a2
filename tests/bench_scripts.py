"""Load a ``bench/`` script as a module for a test, without leaving ``bench/`` on ``sys.path``.

The scripts import their siblings (``_cli``, ``_timing``, ...) from their own folder, as a script run puts it first
on ``sys.path``; here the folder is on the path only while the script's module body runs.
"""

import contextlib
import importlib.util
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


@contextlib.contextmanager
def bench_on_path():
    """``bench/`` first on ``sys.path`` for the block, removed after it (also when the block raises)."""
    entry = str(BENCH)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def load(name: str):
    """``bench/<name>.py`` as module ``_bench_<name>`` (loaded once per process)."""
    key = f"_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    try:
        with bench_on_path():
            spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[key]
        raise
    return mod
