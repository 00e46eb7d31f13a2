"""jaxspec.models."""
