"""The side-by-side registry (torch-free): one entry per name, known-difference classes must be declared."""

import pytest

from jaxspec.interop import registry


def _op(name="toy", **kw):
    return registry.OpDef(name, "m:f", "orig", (registry.config(B=1),), None, None, None, **kw)


def test_register_refuses_a_second_definition(monkeypatch):
    monkeypatch.setattr(registry, "OPS", {})
    registry.register(_op())
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(_op())


def test_known_class_must_be_declared():
    op = _op(known_differences={"ties": "why"}, classify=lambda inputs: inputs["k"])
    assert op.known_class({"k": "ties"}) == "ties" and op.known_class({"k": None}) is None
    with pytest.raises(ValueError, match="not one of"):
        op.known_class({"k": "undocumented"})
    assert _op().known_class({}) is None
    assert _op().label({"B": 2, "mode": "x"}) == "B=2 mode=x"
