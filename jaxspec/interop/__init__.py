"""torch <-> JAX interop: pinned upstream files (pins, fetch, originals, cuda_originals), the DLPack shim,
the side-by-side op registry and harness (registry, ops_spec, ops_kernels, harness, check) and the
whole-step original (original_step)."""
