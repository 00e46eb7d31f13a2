"""jaxspec.ops."""
