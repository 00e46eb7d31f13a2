#!/usr/bin/env bash
# The README's main command: set up, run the speculative decoding demo on real text (SmolLM2-135M-Instruct,
# fetched into ~/.cache/jaxspec when missing, with its shipped draft head; plain vs chain vs tree, each
# generation one XLA while_loop), then the side-by-side check of jaxspec against the original
# SGLang/TokenSpeed kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
.venv/bin/python -m jaxspec.demo "$@"
TRITON_INTERPRET=1 .venv/bin/python -m jaxspec.interop.check --device cpu --seed 0 --cases 3
