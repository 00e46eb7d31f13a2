"""torch <-> JAX interop: DLPack shim, the original SGLang/TokenSpeed kernels, side-by-side harness."""
