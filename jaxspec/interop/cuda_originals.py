"""SGLang 0.5.23's JIT CUDA speculative kernels, compiled at run time from the published sources. GPU only.

Mirrors what ``sglang/kernels/ops/speculative/{tree,sampling}.py`` do through ``load_jit``, without
importing sglang:

1. write a ``cuda.cu`` that includes tvm-ffi's headers and the kernel's ``.cuh`` and exports the entry
   points with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` inside ``namespace sglang`` (as load_jit's generated
   wrapper does);
2. ``nvcc -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -DSGL_CUDA_ARCH=900 -std=c++20 -O3
   --expt-relaxed-constexpr -I<tvm_ffi include> -I<dlpack include> -I<sglang jit include>
   [-I<flashinfer include>] -c cuda.cu`` (the target follows the visible GPU; sm_90a on the H200);
3. ``c++ cuda_0.o -shared -L<tvm_ffi lib> -ltvm_ffi -L$CUDA_HOME/lib64 -lcudart``, then
   ``tvm_ffi.load_module``.

Inputs come from ``python -m jaxspec.interop.fetch --cuda`` (the .cuh files and their header closure,
8 FlashInfer 0.7.2 headers, the apache-tvm-ffi 0.1.11 cp312 wheel, installed on first use with
``pip install --no-index --no-deps --require-hashes --target <build dir>/tvm_ffi_site`` unless ``tvm_ffi`` is
importable). Before anything is compiled, every file in the include directories and every source must
match its sha256 in ``jaxspec.interop.pins`` (an unpinned extra file is refused too: it could shadow a
system header), and the tvm-ffi wheel must match its pinned hash.
``CUDA_HOME`` (or ``CUDA_PATH``) should be set explicitly: SGLang derives it wrongly when ``nvcc`` is a
wrapper script; we fall back to ``/usr/local/cuda`` and say so. Builds are cached under
``$JAXSPEC_CUDA_BUILD`` (default ``~/.cache/jaxspec/cuda_build``), keyed by a hash of the wrapper, the
flags and every header. Every failure raises ``CudaOriginalsError`` with the command and its output.

``python -m jaxspec.interop.cuda_originals`` compiles both modules and prints where they are.

The CPU path never imports this module (only the harness's ``@cuda`` entries do, on ``--device cuda``).
"""

import argparse
import functools
import hashlib
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid

from jaxspec.interop import originals as _orig
from jaxspec.interop import pins

__all__ = [
    "CudaOriginalsError",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "tree_speculative_sampling_target_only",
    "tree_module",
    "sampling_module",
]

_JIT = "sglang/kernels/jit"
_FFI_INCLUDES = (
    "#include <tvm/ffi/container/tensor.h>",
    "#include <tvm/ffi/dtype.h>",
    "#include <tvm/ffi/error.h>",
    "#include <tvm/ffi/extra/c_env_api.h>",
    "#include <tvm/ffi/function.h>",
)


class CudaOriginalsError(RuntimeError):
    """Building or loading SGLang's CUDA kernels failed; the message says exactly where and why."""


def _build_root() -> pathlib.Path:
    env = os.environ.get("JAXSPEC_CUDA_BUILD")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "jaxspec" / "cuda_build"


@functools.cache
def cuda_home() -> pathlib.Path:
    tried = []
    for name in ("CUDA_HOME", "CUDA_PATH"):
        v = os.environ.get(name)
        if v:
            tried.append(f"${name}={v}")
            if (pathlib.Path(v) / "bin" / "nvcc").is_file():
                return pathlib.Path(v)
    for cand in ("/usr/local/cuda",):
        tried.append(cand)
        if (pathlib.Path(cand) / "bin" / "nvcc").is_file():
            print(f"[cuda_originals] CUDA_HOME not set; using {cand}", file=sys.stderr)
            return pathlib.Path(cand)
    raise CudaOriginalsError(
        f"no CUDA toolkit with bin/nvcc found (tried {', '.join(tried)}); set CUDA_HOME to the toolkit root"
    )


@functools.cache
def _tvm_ffi():
    try:
        import tvm_ffi  # noqa: F401

        return tvm_ffi
    except ImportError:
        pass
    key = "-".join(_orig.TVM_FFI)
    wheels = sorted((_orig.originals_root() / key).glob("*.whl"))
    if not wheels:
        raise _orig.OriginalsMissing(
            f"tvm_ffi is not importable and no {key} wheel under {_orig.originals_root() / key}; "
            f"run `python -m jaxspec.interop.fetch --cuda`"
        )
    wheel = wheels[0]
    pin = pins.WHEELS[pins.TVM_FFI].get(wheel.name)
    if pin is None:
        raise pins.PinMismatch(f"{wheel}: not one of the pinned tvm-ffi wheels {sorted(pins.WHEELS[pins.TVM_FFI])}")
    pins.check_file(wheel, pin)
    site = _build_root() / f"tvm_ffi_site-{_orig.TVM_FFI[1]}"
    if not (site / "tvm_ffi").is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            req = pathlib.Path(tmp) / "requirements.txt"
            req.write_text(f"{wheel} --hash=sha256:{pin}\n")
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--require-hashes",
                   "--target", str(site), "-r", str(req)]
            _run(cmd, "installing the tvm-ffi wheel")
    sys.path.insert(0, str(site))
    try:
        import tvm_ffi

        return tvm_ffi
    except ImportError as e:
        raise CudaOriginalsError(f"tvm_ffi installed under {site} but failed to import: {e}") from e


def _run(cmd, what: str, cwd=None) -> None:
    try:
        r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError as e:
        raise CudaOriginalsError(f"{what}: executable not found: {e}") from e
    if r.returncode != 0:
        raise CudaOriginalsError(
            f"{what} failed (exit {r.returncode}):\n$ {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{r.stdout[-6000:]}\n--- stderr ---\n{r.stderr[-6000:]}"
        )


def _arch() -> tuple[str, int]:
    import torch

    if not torch.cuda.is_available():
        raise CudaOriginalsError("no CUDA device visible to torch: the CUDA originals are GPU-only")
    major, minor = torch.cuda.get_device_capability()
    suffix = "a" if major >= 9 else ""  # SGLang's rule: arch-specific target (sm_90a) for Hopper and newer
    return f"{major}{minor}{suffix}", major * 100 + minor * 10


def _require_dir(p: pathlib.Path) -> pathlib.Path:
    if not p.is_dir():
        raise _orig.OriginalsMissing(
            f"{p} is missing; run `python -m jaxspec.interop.fetch --cuda` (fetches SGLang's CUDA sources, "
            f"the FlashInfer headers and the tvm-ffi wheel)"
        )
    return p


def verify_include_dir(dist_version: tuple[str, str], rel: str) -> pathlib.Path:
    """``.originals/<dist>-<version>/<rel>`` after checking every file under it against its pin.

    A modified file, or any file without a pin (it could shadow a header nvcc would otherwise find
    elsewhere), raises ``pins.PinMismatch`` naming it."""
    root = _require_dir(_orig.original_path(*dist_version, rel))
    base = _orig.original_path(*dist_version, "")
    for f in sorted(root.rglob("*")):
        if f.is_file() or f.is_symlink():
            _orig.require(*dist_version, f.relative_to(base).as_posix())
    return root


def _build(name: str, cuda_files: list[str], wrappers: list[tuple[str, str]], flashinfer: bool):
    includes = [verify_include_dir(_orig.SGLANG, f"{_JIT}/include")]
    if flashinfer:
        includes.append(verify_include_dir(_orig.FLASHINFER, _orig.FLASHINFER_INCLUDE))
    sources = [_orig.require(*_orig.SGLANG, f"{_JIT}/csrc/{f}") for f in cuda_files]
    tvm = _tvm_ffi()
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path, find_libtvm_ffi

    tvm_includes = list(dict.fromkeys([find_include_path(), find_dlpack_include_path()]))
    lib = pathlib.Path(find_libtvm_ffi())
    home = cuda_home()
    target, sgl_arch = _arch()
    cuda_flags = [
        "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{target},code=sm_{target}", f"-DSGL_CUDA_ARCH={sgl_arch}",
        "-std=c++20", "-O3", "--expt-relaxed-constexpr",
        *[f"-I{p}" for p in tvm_includes], *[f"-I{p}" for p in includes],
    ]
    wrapper = "\n".join(
        [*_FFI_INCLUDES, *[f'#include "{s}"' for s in sources], "namespace sglang {",
         *[f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({e}, ({k}));" for e, k in wrappers], "}  // namespace sglang", ""]
    )
    h = hashlib.sha256()
    h.update(wrapper.encode())
    h.update(" ".join(cuda_flags).encode())
    h.update(str(home).encode() + getattr(tvm, "__version__", "").encode())
    for inc in includes:
        for f in sorted(inc.rglob("*")):
            if f.is_file():
                h.update(f.read_bytes())
    for s in sources:
        h.update(s.read_bytes())
    out_dir = _build_root() / f"{name}-{h.hexdigest()[:16]}"
    so = out_dir / f"{name}.so"
    if not so.is_file():
        staging = _build_root() / f".staging-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        try:
            (staging / "cuda.cu").write_text(wrapper)
            _run([home / "bin" / "nvcc", *cuda_flags, "-c", "cuda.cu", "-o", "cuda_0.o"], f"nvcc ({name})", staging)
            cxx = os.environ.get("CXX", "c++")
            _run([cxx, "cuda_0.o", "-shared", f"-L{lib.parent}", f"-l{lib.stem.removeprefix('lib')}",
                  f"-Wl,-rpath,{lib.parent}", f"-L{home / 'lib64'}", "-lcudart", f"-Wl,-rpath,{home / 'lib64'}",
                  "-o", f"{name}.so"], f"link ({name})", staging)
            if out_dir.exists():
                shutil.rmtree(out_dir, ignore_errors=True)
            staging.rename(out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    try:
        return tvm.load_module(str(so))
    except Exception as e:  # noqa: BLE001 - re-raised with the path
        raise CudaOriginalsError(f"tvm_ffi.load_module({so}) failed: {type(e).__name__}: {e}") from e


@functools.cache
def tree_module():
    """The compiled ``speculative/tree.cuh`` module (build_tree_kernel_efficient, verify_tree_greedy)."""
    return _build("speculative_tree", ["speculative/tree.cuh"],
                  [("build_tree_kernel_efficient", "build_tree_kernel_efficient"),
                   ("verify_tree_greedy", "verify_tree_greedy")], flashinfer=False)


@functools.cache
def sampling_module(vec_size: int, deterministic: bool = True):
    """The compiled ``speculative/sampling.cuh`` module, template ``<vec_size, deterministic>`` like sampling.py."""
    det = "true" if deterministic else "false"
    return _build(f"speculative_sampling_{vec_size}_{det}", ["speculative/sampling.cuh"],
                  [("sample", f"tree_speculative_sampling_target_only<{vec_size}, {det}>")], flashinfer=True)


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                                retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num,
                                tree_mask_mode) -> None:
    """SGLang 0.5.23 ``tree.py::build_tree_kernel_efficient`` (same arguments; out-params mutated)."""
    tree_module().build_tree_kernel_efficient(
        parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index, retrive_next_token,
        retrive_next_sibling, int(topk), int(depth), int(draft_token_num), int(tree_mask_mode),
    )


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict) -> None:
    """SGLang 0.5.23 ``tree.py::verify_tree_greedy`` (same arguments; out-params mutated)."""
    tree_module().verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                     retrive_next_token, retrive_next_sibling, target_predict)


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    """SGLang 0.5.23 ``sampling.py::tree_speculative_sampling_target_only`` (VEC_SIZE = gcd(4, V))."""
    module = sampling_module(math.gcd(4, target_probs.shape[-1]), bool(deterministic))
    module.sample(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                  retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                  draft_probs, float(threshold_single), float(threshold_acc))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.interop.cuda_originals",
        description="Compile (or load from the build cache) SGLang 0.5.23's JIT CUDA speculative kernels "
                    "(tree.cuh: build_tree_kernel_efficient, verify_tree_greedy; sampling.cuh: "
                    "tree_speculative_sampling_target_only<4, true>) from the pinned files under .originals/ "
                    "and print where the modules are. GPU only: needs nvcc (CUDA_HOME), a CUDA device and "
                    "`python -m jaxspec.interop.fetch --cuda` beforehand.",
        epilog="Environment: CUDA_HOME / CUDA_PATH (toolkit root), JAXSPEC_CUDA_BUILD (build cache, default "
               "~/.cache/jaxspec/cuda_build), JAXSPEC_ORIGINALS (the extracted files).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.parse_args(argv)
    try:
        for what, get in (("tree", tree_module), ("sampling<4,true>", lambda: sampling_module(4, True))):
            m = get()
            print(f"[cuda_originals] {what}: loaded {m}")
    except (CudaOriginalsError, _orig.OriginalsMissing, pins.PinMismatch) as e:
        print(f"[cuda_originals] FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
