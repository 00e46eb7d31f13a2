"""Pinned sha256 of every upstream wheel jaxspec downloads and of every file it extracts from them.

This module is the trust anchor of ``jaxspec.interop``: ``fetch`` accepts a wheel only when its sha256
is one of ``WHEELS[(dist, version)]`` (checked before the zip is opened; pip also downloads with
``--require-hashes``), extracts only the paths listed in ``FILES`` / ``CUDA_FILES`` and checks each
extracted file's bytes against its pin; ``originals`` checks a file's bytes against the same pin
before executing it, and ``cuda_originals`` before compiling it. ``.originals/manifest.json`` is a
record of what was fetched, never trusted. A mismatch raises ``PinMismatch`` naming the file and both
hashes.

Where the pins come from: the wheel digests are PyPI's (``https://pypi.org/pypi/<name>/json``); the
file digests were taken from those wheels (the cp311 and cp312 sglang wheels carry byte-identical
files). ``CUDA_FILES`` is the ``#include`` closure of SGLang's ``speculative/tree.cuh`` and
``sampling.cuh`` inside ``sglang/kernels/jit/include`` plus the FlashInfer 0.7.2 headers that closure
reaches (``flashinfer/sampling.cuh`` and what it includes), and the two Python wrappers
``speculative/{tree,sampling}.py`` (read for reference). Upgrading a pin means re-deriving these.

Pure Python, no torch/triton.
"""

import hashlib
import pathlib

__all__ = [
    "SGLANG", "SGLANG_MTP", "TOKENSPEED", "FLASHINFER", "TVM_FFI", "WHEELS", "FILES", "CUDA_FILES",
    "PinMismatch", "sha256", "file_pin", "check_bytes", "check_file", "requirement_line",
]

SGLANG = ("sglang", "0.5.23")
SGLANG_MTP = ("sglang", "0.5.12")  # last release with the MTP helpers (multi_layer_eagle_utils.py)
TOKENSPEED = ("tokenspeed", "0.1.0")  # 0.1.1 dropped half of cache_loc_kernel.py
FLASHINFER = ("flashinfer-python", "0.7.2")
TVM_FFI = ("apache-tvm-ffi", "0.1.11")

# (dist, version) -> {wheel file name: sha256}. sglang wheels are platform-specific (x86_64 cp311 for the
# dev/CI machines, cp312 for the GPU machine); tvm-ffi: the cp312 abi3 x86_64 builds the GPU machine installs.
WHEELS: dict[tuple[str, str], dict[str, str]] = {
    SGLANG: {
        "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl":
            "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
        "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl":
            "8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",
    },
    SGLANG_MTP: {
        "sglang-0.5.12-cp311-cp311-manylinux_2_34_x86_64.whl":
            "4ed786a38655851fd055ef57380c34d29b87753b53f63457309f51e5bf48c2e6",
        "sglang-0.5.12-cp312-cp312-manylinux_2_34_x86_64.whl":
            "d3fc7ecb61ad3e533ebe1ae9b4109fbb62ecbf2d17453b62770c8a7ec49d539a",
    },
    TOKENSPEED: {
        "tokenspeed-0.1.0-py3-none-any.whl": "2649dfcb853bbba74a065fa10d3280513e5755da057b6a9cbf6b82ff47d70b2a",
    },
    FLASHINFER: {
        "flashinfer_python-0.7.2-py3-none-any.whl": "770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8",
    },
    TVM_FFI: {
        "apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl":
            "2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128",
        "apache_tvm_ffi-0.1.11-cp312-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl":
            "78aa1857b04a2ea718317041ab3f01288b3d496e6036eb1b99ebdc9da0fdaef5",
    },
}

# (dist, version) -> {path inside the wheel: sha256}: every file the CPU side extracts and loads.
FILES: dict[tuple[str, str], dict[str, str]] = {
    SGLANG: {
        "sglang/kernels/ops/kvcache/cache_move.py": "8a345a31a71e12c0a8fe478e4d6f6b1a41ff191cc3cee25e7854c74eed8a1c25",
        "sglang/kernels/ops/speculative/cache_locs.py": "c4f86bfe64a3da3063cc5ad25591561c4afd2068f4ada071c42b0d0d97506784",
        "sglang/kernels/ops/speculative/eagle.py": "1be9e66380b0b576e8fb0c648280fe58383ba1334f4b0b8e6dbc4beb3b5fe858",
        "sglang/kernels/ops/speculative/multi_layer_eagle.py": "f43949449eef3361780bdf3b0b8d258fb6cbfe384936871b442dc90868cb6544",
        "sglang/kernels/ops/speculative/spec_tree.py": "2bd4944222af9860aae0ab1c51cde21351d96a6ebee2922175368a0e18916222",
        "sglang/srt/speculative/spec_utils.py": "427bd9b723bda6a79761ff60964c01a35a781a8269d84bd26f581140deb0b27c",
        "sglang/srt/utils/common.py": "60c3b514fcaba47dce2b1f7b74484db809c0d635ba646d94554552170cf01d73",
        # SGLang's Triton attention (the originals of jaxspec.kernels.paged_attention)
        "sglang/kernels/ops/attention/decode_attention.py": "7a3b66ce3daabbb027efd860411cd9abe4b399b1f2cfc3ed5c6c01731eb9fa0a",
        "sglang/kernels/ops/attention/extend_attention.py": "be3baffc80ef9fe484d0b896842522b02bf671785088e05a66ca4dcdb2e8a9b3",
        "sglang/kernels/ops/attention/score_mod.py": "127e2e6466bbfac3c2189cc4f2a9d7751fd819b30d25de65378d66ae63bbafa6",
    },
    SGLANG_MTP: {
        "sglang/srt/speculative/multi_layer_eagle_utils.py": "4e2debd7a0b43d395c75fb66098694775c91efac234319042a17d79ddac6e1fa",
    },
    TOKENSPEED: {
        "tokenspeed/runtime/execution/cache_loc_kernel.py": "aa032073a7bd400822b8683b4817af4d288a49f8ad06f223b0531eab90e3af53",
    },
}

# The extra files ``fetch --cuda`` extracts for the GPU-only CUDA originals (the tvm-ffi wheel is kept whole).
CUDA_FILES: dict[tuple[str, str], dict[str, str]] = {
    SGLANG: {
        "sglang/kernels/jit/csrc/speculative/sampling.cuh": "44e8763d748352c43ccc04aa186d5755a321dc266ce761dde093dbe8c30cb903",
        "sglang/kernels/jit/csrc/speculative/tree.cuh": "61c635695d25d6f7664dc96e978d6c87fa71bd5f2755afc56cf5d7e34586d7cd",
        "sglang/kernels/jit/include/sgl_kernel/bits.h": "5bab56d2578d151d3224994eeeae0abb939c26a1ac1e84205a1c942dab9cd605",
        "sglang/kernels/jit/include/sgl_kernel/runtime.cuh": "1f989a2dee7a32ab519eeb49adf407c5e4054195faa77aa92ce4211343973213",
        "sglang/kernels/jit/include/sgl_kernel/source_location.h": "300026cbeeabe03b10b0c46b70e2e85b19a743cbe9ff462faa1dff4268cf806e",
        "sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh": "3ecebf712701d0f9bc9500cfa54b11e149f7e729e4c1593ac5d3de5e74b2f06c",
        "sglang/kernels/jit/include/sgl_kernel/speculative/ngram.cuh": "1fc0eea1eed7b9e09b66ea02237c36544242cbf7667d73a5ad5caf5137e0c93d",
        "sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh": "5dc446636f189325f4c6f5588ebe02f77c50d3e8dc453f6d13f79d7abd2e6e7d",
        "sglang/kernels/jit/include/sgl_kernel/tensor.h": "c66eba28e0f7661711947309c12014d2e880025c7d91ff8a7ac544d4ece60ce2",
        "sglang/kernels/jit/include/sgl_kernel/utils.cuh": "18b0bb2e27dccc20d7509e8b6b6c16e2b57a5ce98be648865fb75059be8a13db",
        "sglang/kernels/jit/include/sgl_kernel/utils.h": "fe54010a29dd4d65110bf4afe60ff91b0f37f3b9704bb5bae4f1086347d7e32d",
        "sglang/kernels/ops/speculative/sampling.py": "ef6085e045fa91e94a78b12f79259f27f9c72e3693dbc90ae7215f8bfeab138b",
        "sglang/kernels/ops/speculative/tree.py": "b7c967cee8727c0aaa91f9b1930fb377407f7560699d30d1957c034cc461c15c",
    },
    FLASHINFER: {
        "flashinfer/data/include/flashinfer/allocator.h": "3d80e3d3d29b1ae41218eb1167ca0059f923a9ccd69de79905d7f37df7cb2109",
        "flashinfer/data/include/flashinfer/exception.h": "83126766f5b3ef24586eca68bcd3ebe45b1f8b1c5952fb55940421618175f271",
        "flashinfer/data/include/flashinfer/math.cuh": "905bd156f57a1667e30be4a890906a628dbe414a650ce51c900c0bb1a65a135f",
        "flashinfer/data/include/flashinfer/sampling.cuh": "28d40dfdbfe07d7c0ddf9ca6464c2f24ef9bbb7e2b732283e6c24ccd7a8e7f9a",
        "flashinfer/data/include/flashinfer/topk.cuh": "7ca7db449d7d9560f04c34de60fe3e4567a7aca192ed8cced7dfbba39798d762",
        "flashinfer/data/include/flashinfer/topk_common.cuh": "4ed389d1535ab2e1b759eddca9fac3c46346b47711be2b72bbb1b99b21524f2d",
        "flashinfer/data/include/flashinfer/utils.cuh": "7252218a8a7bd890213484a7b1567dbde47aa7f87641738e1c6d34b9e32205f6",
        "flashinfer/data/include/flashinfer/vec_dtypes.cuh": "ced77dd54852bf097882e26d7c3db16554671b7fef6732e221640a007dfb10a0",
    },
}


class PinMismatch(ValueError):
    """A wheel or an extracted file does not have its pinned sha256 (or has no pin at all)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_pin(dist: str, version: str, path: str) -> str:
    """The pinned sha256 of ``path`` inside ``dist==version``'s wheel; ``PinMismatch`` if it has none."""
    for table in (FILES, CUDA_FILES):
        pin = table.get((dist, version), {}).get(path)
        if pin is not None:
            return pin
    raise PinMismatch(f"{dist}=={version}:{path} has no pinned sha256 in jaxspec.interop.pins: refusing it")


def check_bytes(data: bytes, expected: str, what) -> bytes:
    """``data`` if its sha256 is ``expected``, else ``PinMismatch`` naming ``what`` and both hashes."""
    got = sha256(data)
    if got != expected:
        raise PinMismatch(f"{what}: sha256 {got} does not match the pinned sha256 {expected} "
                          f"(modified or corrupted; delete it and re-run `python -m jaxspec.interop.fetch`)")
    return data


def check_file(file: pathlib.Path, expected: str) -> bytes:
    """The bytes of ``file`` after checking them against ``expected`` (read once: what is checked is what is used)."""
    return check_bytes(pathlib.Path(file).read_bytes(), expected, file)


def requirement_line(dist: str, version: str) -> str:
    """A pip requirements line pinning ``dist==version`` to its pinned wheel hashes (for ``--require-hashes``)."""
    hashes = " ".join(f"--hash=sha256:{h}" for h in WHEELS[(dist, version)].values())
    return f"{dist}=={version} {hashes}"
