"""jaxspec: speculative decoding (EAGLE/MTP tree speculation) in JAX/Pallas."""

__version__ = "0.1.0"
