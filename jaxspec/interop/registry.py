"""The side-by-side op registry: op definitions (``ops_spec``, ``ops_kernels``) register here, the harness reads.

An ``OpDef`` names one jaxspec op and the original it is compared against (a key of
``originals.ORIGINALS``), with the small fixed set of input configs the generator draws from, the
runner of each side, and the classes of inputs on which the two are documented to differ
(``known_differences``). Nothing here imports torch, the harness or the op modules: the import graph is
``ops_* -> registry <- harness -> ops_*`` with no circle.
"""

import dataclasses
from collections.abc import Callable, Mapping

__all__ = ["OpDef", "OPS", "register", "config"]


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One side-by-side pair. ``configs`` is the small fixed shape set the generator draws from.

    ``known_differences`` maps a class name to the documented reason the two sides may differ on inputs of
    that class; ``classify(inputs)`` returns the class an input belongs to (or None). A differing case in
    a known class is reported under that name, never as a silent pass or an unexplained mismatch."""

    name: str
    jaxspec: str  # "module:attr"
    original: str  # key in originals.ORIGINALS
    configs: tuple[dict, ...]
    gen: Callable  # (numpy Generator, config) -> inputs (numpy arrays / host torch tensors / statics)
    run_original: Callable  # (torch inputs, device) -> {output name: tensor}
    run_jaxspec: Callable  # (fn, jax inputs, implementation kwargs) -> {output name: array}
    has_implementation: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    known_differences: Mapping[str, str] = dataclasses.field(default_factory=dict)
    classify: Callable | None = None  # (inputs) -> a key of known_differences, or None
    # float outputs: an element differs when |original - jaxspec| > atol (None: bit-exact, as for every
    # integer output); the op's module states why its atol is right
    atol: float | None = None
    # (device) -> [(label, implementation kwargs)] when the op's implementations differ from the default
    # pallas (interpret on CPU) + reference pair
    implementations: Callable | None = None

    def label(self, config: dict) -> str:
        return " ".join(f"{k}={getattr(v, 'name', v)}" for k, v in config.items())

    def known_class(self, inputs: dict) -> str | None:
        """The known-difference class ``inputs`` fall in (a key of ``known_differences``), or None."""
        if self.classify is None:
            return None
        name = self.classify(inputs)
        if name is not None and name not in self.known_differences:
            raise ValueError(f"{self.name}: classify returned {name!r}, not one of {sorted(self.known_differences)}")
        return name


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add ``op`` to ``OPS`` (a name may be registered once)."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is registered twice")
    OPS[op.name] = op
    return op


def config(**kw) -> dict:
    """One input config of an op (sizes and modes the generator reads)."""
    return kw
