"""jaxspec.engine."""
