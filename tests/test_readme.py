"""Every ```python block of README.md and of the guides in docs/ runs as written, each on its own (fresh namespace,
no shared imports).

A block whose fence is preceded by the line ``<!-- test: slow -->`` (one that downloads a model) runs only with
``--runslow`` / ``JAXSPEC_SLOW=1``; every other block runs in the default suite, offline.

The server's blocks (``<!-- test: server -->``: the commands, one per line; ``server-curl``: a curl command;
``server-client``: the openai client in Python) run against each command of the server block, started once as a
subprocess from the repository's root on a free port (the blocks' ``8000`` replaced): the tiny pair's in the default
suite (its greedy reply equal to the plain engine's on the chat prompt, cut at the first stop token), the others
(``--model`` a registered name: a download) with ``--runslow``; the replies are non-empty text."""

import contextlib
import io
import json
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]  # the README and the guides it links to
SLOW_MARK = "<!-- test: slow -->"
_BLOCK = re.compile(r"^(?:<!-- test: ([a-z-]+) -->\n)?```python\n(.*?)^```", re.S | re.M)
_MARKED = re.compile(r"^<!-- test: ([a-z-]+) -->\n```[a-z]*\n(.*?)^```", re.S | re.M)
ROOT = README.parent
_NEEDS_NETWORK = re.compile(r"load_chat_model\(|fetch_model\(|jaxspec\.models\.fetch")


def _blocks(page: pathlib.Path = None) -> list[tuple[bool, str]]:
    """(marked slow, code) for every python block of ``page`` (default: every page), in order."""
    pages = PAGES if page is None else [page]
    return [(mark == "slow", code) for p in pages for mark, code in _BLOCK.findall(p.read_text())
            if not mark.startswith("server")]


def _params():
    return [pytest.param(code, id=f"{p.stem}-block{i}", marks=[pytest.mark.slow] if slow else [])
            for p in PAGES for i, (slow, code) in enumerate(_blocks(p))]


def test_readme_has_python_blocks():
    assert len(_blocks(README)) >= 2, "README.md should show the pipeline and bring-your-own-model in code"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_slow_marks_sit_on_python_fences(page):
    """Each slow mark is the line right before a python fence (a mark anywhere else would mark nothing)."""
    assert page.read_text().count(SLOW_MARK) == sum(slow for slow, _ in _blocks(page)), \
        f"{page.name}: every '{SLOW_MARK}' must be the line right before a ```python fence"


def test_blocks_that_download_are_marked_slow():
    """The default suite stays offline: a block that fetches a named model carries the slow mark."""
    unmarked = [f"{p.name} block {i}" for p in PAGES for i, (slow, code) in enumerate(_blocks(p))
                if not slow and _NEEDS_NETWORK.search(code)]
    assert not unmarked, f"{unmarked} fetch a model; put '{SLOW_MARK}' before their fence"


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs(code, request):
    name = request.node.callspec.id
    exec(compile(code, f"{name}.md", "exec"), {"__name__": f"readme_{name.replace('-', '_')}"})


# ------------------------------------------------------------------------------------------------ the server
def _marked(name: str) -> str:
    """The one block of all pages marked ``<!-- test: name -->``."""
    found = [code for p in PAGES for mark, code in _MARKED.findall(p.read_text()) if mark == name]
    assert len(found) == 1, f"expected one fenced block after '<!-- test: {name} -->' in README.md and docs/, " \
                            f"found {len(found)}"
    return found[0]


def _commands() -> list[str]:
    cmds = [c for c in _marked("server").splitlines() if c.strip()]
    assert cmds and all(c.startswith("python -m jaxspec.serve ") and "--port 8000" in c for c in cmds), cmds
    return cmds


def _is_tiny(cmd: str) -> bool:
    return "--model jaxspec/assets/tiny_pair" in cmd


def _cmd_params():
    cmds = _commands()
    assert sum(map(_is_tiny, cmds)) == 1, "the server block: one command on the tiny pair (offline)"
    return [pytest.param(c, id="tiny" if _is_tiny(c) else f"cmd{i}", marks=[] if _is_tiny(c) else [pytest.mark.slow])
            for i, c in enumerate(cmds)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=_cmd_params())
def readme_server(request):
    """``(command, port)``: the README's command running (``/health`` answered 200)."""
    cmd, port = request.param, _free_port()
    argv = shlex.split(cmd.replace("--port 8000", f"--port {port}"))
    argv[0] = sys.executable
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + (120 if _is_tiny(cmd) else 900)
            while True:
                assert proc.poll() is None, f"{cmd} exited with {proc.returncode}"
                assert time.monotonic() < deadline, f"{cmd}: /health did not answer"
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.25)
            yield cmd, port
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.seek(0)
            print(log.read()[-3000:])


def _tiny_reply(content: str, max_tokens: int) -> str:
    """The tiny pair's greedy chat reply: the plain engine on the chat prompt, cut at the first stop token."""
    from jaxspec.engine import Engine
    from jaxspec.models import DEFAULT_WEIGHTS, load_pair
    from jaxspec.text import Tokenizer

    tok = Tokenizer.from_dir(DEFAULT_WEIGHTS)
    ids = tok.encode_chat([{"role": "user", "content": content}])
    out = Engine(load_pair(DEFAULT_WEIGHTS), None, max_context=128).generate([ids], max_tokens).tokens[0].tolist()
    stop = set(tok.chat_stop_token_ids)
    cut = next((k for k, t in enumerate(out) if t in stop), len(out))
    return tok.decode(out[:cut], skip_special_tokens=True)


def _expect(cmd: str, text: str, body: dict):
    assert isinstance(text, str) and text.strip(), text
    if _is_tiny(cmd):
        assert text == _tiny_reply(body["messages"][0]["content"], body["max_tokens"])


def test_readme_curl(readme_server):
    cmd, port = readme_server
    block = _marked("server-curl")
    body = json.loads(re.search(r"-d '(.*?)'", block, re.S).group(1))
    out = subprocess.run(["bash", "-c", block.replace("localhost:8000", f"localhost:{port}")], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    reply = json.loads(out)
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    _expect(cmd, reply["choices"][0]["message"]["content"], body)


def test_readme_openai_client(readme_server):
    cmd, port = readme_server
    code = _marked("server-client").replace("localhost:8000", f"localhost:{port}")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "README.md server-client", "exec"), {"__name__": "readme_server_client"})
    body = {"messages": [{"content": re.search(r'"content": "(.*?)"', code).group(1)}],
            "max_tokens": int(re.search(r"max_tokens=(\d+)", code).group(1))}
    _expect(cmd, buf.getvalue().removesuffix("\n"), body)
