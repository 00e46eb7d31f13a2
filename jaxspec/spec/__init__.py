"""jaxspec.spec."""
