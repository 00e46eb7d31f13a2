"""The original SGLang / TokenSpeed kernels, loaded file by file from their pinned PyPI releases.

``ORIGINALS`` is the one table mapping each jaxspec op to the upstream (distribution, pinned version,
file inside the wheel, symbol) it is compared against. ``python -m jaxspec.interop.fetch`` extracts
exactly those files into ``.originals/<dist>-<version>/<path>`` (git-ignored; nothing upstream is
committed); this module checks each file's bytes against its sha256 in ``jaxspec.interop.pins`` (a
modified file raises ``pins.PinMismatch``, whatever ``manifest.json`` says) and executes exactly those
bytes, *as published*, after installing a few tiny stand-in modules in ``sys.modules`` for its package
imports:

* ``sglang.srt.utils``: ``is_cpu/is_cuda/is_hip/is_musa/is_npu/is_xpu`` all False (so no file imports
  ``sgl_kernel`` or the JIT CUDA path at import time) and ``next_power_of_2`` (the upstream function,
  taken from ``sglang/srt/utils/common.py`` of the same release);
* ``sglang.srt.platforms`` / ``.interface``: a ``current_platform`` that is not out-of-tree, and
  ``reject_out_of_tree_path`` raising;
* ``tokenspeed.runtime.utils`` (``get_colorful_logger``) and ``tokenspeed.runtime.utils.triton``.

The stand-ins live in ``sys.modules`` only while a file executes (the real packages are never imported,
and a real ``sglang`` install is left untouched). Loaded modules are registered under private names
(``_jaxspec_originals.<dist>_<version>.<stem>``).

``select_top_k_tokens`` is pure torch inside ``spec_utils.py``, a file that imports most of the SGLang
server; its three functions (and ``fast_topk`` from ``common.py``) are compiled from the published
source text (``ast``), without their ``@torch.compile`` decorator (a speed-only wrapper; tests run with
``TORCHDYNAMO_DISABLE=1`` anyway).

CPU: when no CUDA device is visible and ``TRITON_INTERPRET`` is unset, it is set to ``1`` before the
first kernel file executes (``@triton.jit`` picks the interpreter at decoration time). Callers use the
raw ``@triton.jit`` kernels or the Triton host functions: the ``*_func`` dispatchers misbehave off CUDA
(``assign_extend_cache_locs_func`` returns None, ``verify_tree_greedy_func`` does nothing).

torch and triton are imported lazily, so ``import jaxspec.interop.originals`` (e.g. by ``fetch``) is
cheap; ``load_*`` needs both.
"""

import ast
import contextlib
import dataclasses
import functools
import linecache
import logging
import os
import pathlib
import sys
import types
from typing import Any, Callable

from jaxspec.interop import pins

__all__ = [
    "Original",
    "ORIGINALS",
    "SUPPORT_FILES",
    "OriginalsMissing",
    "originals_root",
    "original_path",
    "load_file",
    "load",
    "load_select_top_k_tokens",
    "next_power_of_2",
    "require",
    "verified_bytes",
]

# the pinned releases (their wheel and file hashes live in jaxspec.interop.pins)
SGLANG, SGLANG_MTP, TOKENSPEED, FLASHINFER, TVM_FFI = (
    pins.SGLANG, pins.SGLANG_MTP, pins.TOKENSPEED, pins.FLASHINFER, pins.TVM_FFI
)

_SPEC = "sglang/kernels/ops/speculative"


@dataclasses.dataclass(frozen=True)
class Original:
    """One upstream symbol: where it is published and how the harness reaches it."""

    dist: str
    version: str
    path: str  # file inside the wheel (and under .originals/<dist>-<version>/)
    symbol: str
    kind: str  # "triton" (raw @triton.jit kernel), "host" (Triton host function), "torch-source", "cuda"
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.dist}-{self.version}"


def _o(dv, path, symbol, kind, note=""):
    return Original(dv[0], dv[1], path, symbol, kind, note)


# jaxspec op -> the original it is compared against. THE table: fetch, loader and harness all read it.
_ATTN = "sglang/kernels/ops/attention"

ORIGINALS: dict[str, Original] = {
    # jaxspec.ops.draft
    "select_top_k_tokens": _o(SGLANG, "sglang/srt/speculative/spec_utils.py", "select_top_k_tokens", "torch-source"),
    # jaxspec.ops.tree (Triton XPU tree builder; FULL_MASK and QLEN_ONLY)
    "build_tree": _o(SGLANG, f"{_SPEC}/spec_tree.py", "sgl_build_tree_kernel_triton", "host"),
    # jaxspec.ops.verify
    "verify_tree_greedy": _o(SGLANG, f"{_SPEC}/spec_tree.py", "verify_tree_greedy_triton", "host"),
    # jaxspec.ops.accept
    "fill_bonus_tokens": _o(SGLANG, f"{_SPEC}/eagle.py", "fill_bonus_tokens", "triton"),
    # jaxspec.kernels.cache_locs
    "assign_extend_cache_locs": _o(SGLANG, f"{_SPEC}/cache_locs.py", "assign_extend_cache_locs", "triton"),
    "fill_accept_out_cache_loc": _o(SGLANG, f"{_SPEC}/eagle.py", "fill_accept_out_cache_loc", "triton"),
    # jaxspec.kernels.kv_move
    "move_kv_cache": _o(SGLANG, "sglang/kernels/ops/kvcache/cache_move.py", "copy_all_layer_kv_cache_tiled", "triton"),
    # jaxspec.kernels.multi_layer_eagle (MTP helpers, sglang 0.5.12)
    "rotate_input_ids": _o(SGLANG_MTP, "sglang/srt/speculative/multi_layer_eagle_utils.py", "rotate_input_ids_triton", "host"),
    "assign_hidden_states_pool": _o(
        SGLANG_MTP, "sglang/srt/speculative/multi_layer_eagle_utils.py", "assign_hidden_states_pool_triton", "host"
    ),
    # the 0.5.23 successor of rotate_input_ids_triton (same kernel body), compared as a second original
    "rotate_input_ids@sglang-0.5.23": _o(SGLANG, f"{_SPEC}/multi_layer_eagle.py", "rotate_input_ids", "host"),
    # jaxspec.kernels.paged_cache_locs (TokenSpeed 0.1.0)
    "update_req_to_page": _o(TOKENSPEED, "tokenspeed/runtime/execution/cache_loc_kernel.py", "update_req_to_page", "host"),
    "compute_out_cache_loc": _o(
        TOKENSPEED, "tokenspeed/runtime/execution/cache_loc_kernel.py", "compute_out_cache_loc", "host"
    ),
    "compute_out_cache_loc_uniform": _o(
        TOKENSPEED, "tokenspeed/runtime/execution/cache_loc_kernel.py", "compute_out_cache_loc_uniform", "host"
    ),
    "fused_decode_input_prep": _o(
        TOKENSPEED, "tokenspeed/runtime/execution/cache_loc_kernel.py", "fused_decode_input_prep", "host"
    ),
    # jaxspec.kernels.paged_attention (SGLang's Triton attention; loaded with its sibling files, see load_attention)
    "paged_attention": _o(SGLANG, f"{_ATTN}/extend_attention.py", "extend_attention_fwd", "attention"),
    "paged_attention@decode": _o(SGLANG, f"{_ATTN}/decode_attention.py", "decode_attention_fwd", "attention"),
    # GPU only: SGLang 0.5.23's JIT CUDA kernels (compiled at run time by interop/cuda_originals.py)
    "build_tree@cuda": _o(SGLANG, "sglang/kernels/jit/csrc/speculative/tree.cuh", "build_tree_kernel_efficient", "cuda"),
    "verify_tree_greedy@cuda": _o(SGLANG, "sglang/kernels/jit/csrc/speculative/tree.cuh", "verify_tree_greedy", "cuda"),
    "tree_speculative_sampling_target_only@cuda": _o(
        SGLANG,
        "sglang/kernels/jit/csrc/speculative/sampling.cuh",
        "tree_speculative_sampling_target_only",
        "cuda",
    ),
}

# Files the loader needs besides the table's (dist, version) -> paths.
SUPPORT_FILES: dict[tuple[str, str], tuple[str, ...]] = {
    SGLANG: ("sglang/srt/utils/common.py", f"{_ATTN}/score_mod.py"),  # next_power_of_2, fast_topk (read as source, never imported)
}

FLASHINFER_INCLUDE = "flashinfer/data/include"


class OriginalsMissing(FileNotFoundError):
    """An original kernel file is not extracted; the message says how to fetch it."""


def originals_root() -> pathlib.Path:
    """``$JAXSPEC_ORIGINALS`` or ``<repo>/.originals`` (the repo holding this package), else ``./.originals``."""
    env = os.environ.get("JAXSPEC_ORIGINALS")
    if env:
        return pathlib.Path(env).resolve()
    repo = pathlib.Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / ".originals"
    return pathlib.Path.cwd() / ".originals"


def original_path(dist: str, version: str, path: str) -> pathlib.Path:
    return originals_root() / f"{dist}-{version}" / path


def _present(dist: str, version: str, path: str) -> pathlib.Path:
    p = original_path(dist, version, path)
    if not p.is_file():
        raise OriginalsMissing(
            f"original kernel file {dist}=={version}:{path} is missing (looked for {p}). "
            f"Run `python -m jaxspec.interop.fetch` (add --cuda for the GPU-only CUDA sources) to download the "
            f"pinned wheels from PyPI and extract it."
        )
    return p


def verified_bytes(dist: str, version: str, path: str) -> bytes:
    """The extracted file's bytes, read once and checked against its pin in ``jaxspec.interop.pins``.

    ``OriginalsMissing`` if absent; ``pins.PinMismatch`` (naming the file and both hashes) if modified,
    whatever ``manifest.json`` says: the manifest is a record, the pins are the trust anchor."""
    return pins.check_file(_present(dist, version, path), pins.file_pin(dist, version, path))


def require(dist: str, version: str, path: str) -> pathlib.Path:
    """The extracted file after checking it against its pin; ``OriginalsMissing`` tells how to fetch it."""
    verified_bytes(dist, version, path)
    return original_path(dist, version, path)


# ----------------------------------------------------------------------------------------------------
# stand-in modules


def _source_function(key: tuple[str, str, str], names: tuple[str, ...], namespace: dict) -> dict:
    """Compile the named top-level functions of a published (verified) file, decorators dropped, into ``namespace``."""
    path = original_path(*key)
    tree = ast.parse(verified_bytes(*key).decode("utf-8"), filename=str(path))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            found[node.name] = node
    missing = set(names) - set(found)
    if missing:
        raise RuntimeError(f"{path}: functions {sorted(missing)} not found in the published file")
    module = ast.Module(body=[found[n] for n in names], type_ignores=[])
    exec(compile(module, filename=str(path), mode="exec"), namespace)  # noqa: S102 - published upstream source
    return {n: namespace[n] for n in names}


def _sglang_utils_source() -> dict:
    return _sglang_utils_source_at(originals_root())


@functools.cache  # per originals root: a different root is loaded (and verified) afresh
def _sglang_utils_source_at(root: pathlib.Path) -> dict:
    """``next_power_of_2`` and ``fast_topk`` exactly as published in sglang 0.5.23 ``srt/utils/common.py``."""
    import torch

    return _source_function((*SGLANG, "sglang/srt/utils/common.py"), ("next_power_of_2", "fast_topk"), {"torch": torch})


def next_power_of_2(n: int) -> int:
    """SGLang's ``next_power_of_2`` (sglang 0.5.23 ``srt/utils/common.py``), as its launchers compute grid sizes."""
    return _sglang_utils_source()["next_power_of_2"](n)


def stub_module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = []  # a package, so submodule stand-ins resolve
    return m


def _stand_ins(dist: str) -> dict[str, types.ModuleType]:
    if dist == "sglang":
        false = lambda: False  # noqa: E731 - every platform probe answers "not this platform"
        flags = {f: false for f in ("is_cpu", "is_cuda", "is_hip", "is_musa", "is_npu", "is_xpu")}
        utils = stub_module("sglang.srt.utils", next_power_of_2=_sglang_utils_source()["next_power_of_2"], **flags)

        class _Platform:
            def is_out_of_tree(self):
                return False

        def reject_out_of_tree_path(platform, subsystem=""):
            raise RuntimeError(f"jaxspec stand-in: no SGLang platform for {subsystem} (call the Triton kernels)")

        return {
            "sglang": stub_module("sglang"),
            "sglang.srt": stub_module("sglang.srt"),
            "sglang.srt.utils": utils,
            "sglang.srt.platforms": stub_module("sglang.srt.platforms", current_platform=_Platform()),
            "sglang.srt.platforms.interface": stub_module(
                "sglang.srt.platforms.interface", reject_out_of_tree_path=reject_out_of_tree_path
            ),
        }
    if dist == "tokenspeed":
        return {
            "tokenspeed": stub_module("tokenspeed"),
            "tokenspeed.runtime": stub_module("tokenspeed.runtime"),
            "tokenspeed.runtime.utils": stub_module("tokenspeed.runtime.utils", get_colorful_logger=logging.getLogger),
            "tokenspeed.runtime.utils.triton": stub_module("tokenspeed.runtime.utils.triton"),
        }
    return {}


def _ensure_interpreter_if_no_gpu() -> None:
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def load_file(dist: str, version: str, path: str) -> types.ModuleType:
    """Execute one published kernel file with stand-ins for its package imports; cached per file (and root).

    The bytes executed are the bytes checked against the pin (``linecache`` is primed with them, so
    ``@triton.jit``'s source lookup sees the same text)."""
    return _load_file_at(originals_root(), dist, version, path)


@contextlib.contextmanager
def stand_in_modules(modules: dict[str, types.ModuleType], also_restore=()):
    """Install ``modules`` in ``sys.modules`` for the duration; afterwards restore those names and
    ``also_restore`` (names the block registers itself) to what they were."""
    saved = {name: sys.modules.get(name) for name in (*modules, *also_restore)}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def exec_verified(dist: str, version: str, path: str, module_name: str, *aliases: str) -> types.ModuleType:
    """Execute one pinned upstream file as module ``module_name`` (also registered under ``aliases``).

    The bytes executed are the bytes checked against the pin; ``linecache`` is primed with them, so
    ``@triton.jit``'s source lookup sees the same text. Stand-ins for the file's package imports must be
    installed by the caller (``stand_in_modules``)."""
    data = verified_bytes(dist, version, path)  # PinMismatch / OriginalsMissing before anything runs
    file = str(original_path(dist, version, path))
    text = data.decode("utf-8")
    linecache.cache[file] = (len(text), None, text.splitlines(keepends=True), file)
    module = types.ModuleType(module_name)
    module.__file__ = file
    for name in (module_name, *aliases):
        sys.modules[name] = module
    try:
        exec(compile(data, file, "exec"), module.__dict__)  # noqa: S102 - pinned upstream source
    except Exception:
        sys.modules.pop(module_name, None)
        raise
    return module


@functools.cache
def _load_file_at(root: pathlib.Path, dist: str, version: str, path: str) -> types.ModuleType:
    _ensure_interpreter_if_no_gpu()
    import triton  # noqa: F401 - fail here, clearly, if triton is absent

    stem = pathlib.PurePosixPath(path).stem
    mod_name = f"_jaxspec_originals.{dist.replace('-', '_')}_{version.replace('.', '_')}.{stem}"
    with stand_in_modules(_stand_ins(dist)):
        return exec_verified(dist, version, path, mod_name)


def load(op: str) -> Callable[..., Any]:
    """The original symbol for a jaxspec op (a raw ``@triton.jit`` kernel or a Triton host function)."""
    o = ORIGINALS[op]
    if o.kind == "torch-source":
        return load_select_top_k_tokens()
    if o.kind == "cuda":
        raise ValueError(f"{op} is a CUDA original: use jaxspec.interop.cuda_originals (GPU only)")
    if o.kind == "attention":
        return getattr(_load_attention_at(originals_root())[pathlib.PurePosixPath(o.path).stem], o.symbol)
    return getattr(load_file(o.dist, o.version, o.path), o.symbol)


def _attention_stand_ins(torch) -> dict[str, types.ModuleType]:
    """What SGLang's attention files import: platform probes (CUDA = a visible CUDA device, so the Hopper
    block sizes are chosen on the H200; every ROCm probe False), ``envs`` flags at their defaults."""
    cuda = torch.cuda.is_available()
    false = lambda *a, **k: False  # noqa: E731

    def get_device_core_count(device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).multi_processor_count if cuda else 0

    class _Flag:
        def get(self):
            return False

    class _Envs:
        def __getattr__(self, name):
            return _Flag()

    utils = stub_module("sglang.srt.utils", is_cuda=lambda: cuda, is_hip=false, is_gfx95_supported=false,
                        is_gfx1250_supported=false, get_device_core_count=get_device_core_count)
    names = ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention")
    return {**{n: stub_module(n) for n in names}, "sglang.srt.utils": utils,
            "sglang.srt.environ": stub_module("sglang.srt.environ", envs=_Envs())}


@functools.cache
def _load_attention_at(root: pathlib.Path) -> dict[str, types.ModuleType]:
    """SGLang 0.5.23's ``score_mod`` / ``decode_attention`` / ``extend_attention`` (each imports the ones
    before it), executed from their verified bytes; ``{stem: module}``."""
    _ensure_interpreter_if_no_gpu()
    import torch
    import triton  # noqa: F401 - fail here, clearly, if triton is absent

    stems = ("score_mod", "decode_attention", "extend_attention")
    siblings = [f"sglang.kernels.ops.attention.{stem}" for stem in stems]
    with stand_in_modules(_attention_stand_ins(torch), also_restore=siblings):
        return {stem: exec_verified(*SGLANG, f"{_ATTN}/{stem}.py", f"_jaxspec_originals.sglang_0_5_23.attention_{stem}",
                                    f"sglang.kernels.ops.attention.{stem}") for stem in stems}


def load_select_top_k_tokens() -> Callable[..., Any]:
    """SGLang 0.5.23 ``select_top_k_tokens`` compiled from the published ``spec_utils.py`` function source."""
    return _load_select_top_k_tokens_at(originals_root())


@functools.cache
def _load_select_top_k_tokens_at(root: pathlib.Path) -> Callable[..., Any]:
    from typing import Optional

    import torch

    o = ORIGINALS["select_top_k_tokens"]
    ns = {"torch": torch, "Optional": Optional, "fast_topk": _sglang_utils_source()["fast_topk"]}
    fns = _source_function(
        (o.dist, o.version, o.path),
        ("_select_top_k_tokens_first", "_select_top_k_tokens_later", "select_top_k_tokens"),
        ns,
    )
    return fns["select_top_k_tokens"]
