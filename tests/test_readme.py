"""Every ```python block of README.md runs as written, each on its own (fresh namespace, no shared imports)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[str]:
    return _BLOCK.findall(README.read_text())


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 2, "README.md should show the pipeline and bring-your-own-model in code"


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_block_runs(index):
    code = _blocks()[index]
    exec(compile(code, f"README.md block {index}", "exec"), {"__name__": f"readme_block_{index}"})
