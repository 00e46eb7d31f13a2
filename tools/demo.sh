#!/usr/bin/env bash
# The README's main command: set up, run the XLA-compiled speculative decoding demo, then the
# side-by-side check of jaxspec against the original SGLang/TokenSpeed kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/python -m jaxspec.demo "$@"
TRITON_INTERPRET=1 .venv/bin/python -m jaxspec.interop.check --device cpu --seed 0 --cases 3
