"""Input validation for the package: the helpers live in the kernel layer (``jaxspec.kernels._validate``, the
lowest layer that validates input, so the kernels need nothing from above them); ops, models and the engine
import them from here. Checked mode's switch is one state shared by every layer (``checks()`` here and in
the kernels turn the same switch)."""

from jaxspec.kernels._validate import (
    INT32_MAX,
    INT32_MIN,
    call_checked,
    check,
    check_shape,
    checked,
    checks,
    checks_enabled,
    float_array,
    has_tracer,
    index_array,
    static_int,
)

__all__ = ["INT32_MAX", "INT32_MIN", "call_checked", "check", "check_shape", "checked", "checks", "checks_enabled",
           "float_array", "has_tracer", "index_array", "static_int"]
