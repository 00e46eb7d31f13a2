#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite (CPU; kernels in interpret mode,
# originals under TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
