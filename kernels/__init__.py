"""Pallas GPU kernels (paged cache locations, KV move, MTP helpers), each beside a pure-jnp reference."""
