"""Every ```python block of README.md runs as written, each on its own (fresh namespace, no shared imports).

A block whose fence is preceded by the line ``<!-- test: slow -->`` (one that downloads a model) runs only with
``--runslow`` / ``JAXSPEC_SLOW=1``; every other block runs in the default suite, offline."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SLOW_MARK = "<!-- test: slow -->"
_BLOCK = re.compile(r"^(?:(" + re.escape(SLOW_MARK) + r")\n)?```python\n(.*?)^```", re.S | re.M)
_NEEDS_NETWORK = re.compile(r"load_chat_model\(|fetch_model\(|jaxspec\.models\.fetch")


def _blocks() -> list[tuple[bool, str]]:
    """(marked slow, code) for every python block, in order."""
    return [(bool(mark), code) for mark, code in _BLOCK.findall(README.read_text())]


def _params():
    return [pytest.param(code, id=f"block{i}", marks=[pytest.mark.slow] if slow else [])
            for i, (slow, code) in enumerate(_blocks())]


def test_readme_has_python_blocks():
    assert len(_blocks()) >= 2, "README.md should show the pipeline and bring-your-own-model in code"


def test_slow_marks_sit_on_python_fences():
    """Each slow mark is the line right before a python fence (a mark anywhere else would mark nothing)."""
    text = README.read_text()
    assert text.count(SLOW_MARK) == sum(slow for slow, _ in _blocks()), \
        f"README.md: every '{SLOW_MARK}' must be the line right before a ```python fence"


def test_blocks_that_download_are_marked_slow():
    """The default suite stays offline: a block that fetches a named model carries the slow mark."""
    unmarked = [i for i, (slow, code) in enumerate(_blocks()) if not slow and _NEEDS_NETWORK.search(code)]
    assert not unmarked, f"README.md python blocks {unmarked} fetch a model; put '{SLOW_MARK}' before their fence"


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs(code, request):
    name = request.node.callspec.id
    exec(compile(code, f"README.md {name}", "exec"), {"__name__": f"readme_{name}"})
