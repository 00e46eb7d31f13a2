#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite (CPU; kernels in interpret mode, originals
# under TRITON_INTERPRET=1).
#   bash tools/test.sh [--fresh] [pytest args...]
# --fresh: a brand-new .venv first (the newest releases the dependency ranges allow, as a fresh clone gets them);
# without it an existing .venv is kept as it is (pip does not upgrade what is installed). CI runs --fresh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fresh" ]; then
  shift
  bash tools/setup.sh --fresh
else
  bash tools/setup.sh
fi
# -P: the working folder is not put on sys.path, so nothing in the repository root stands in for a package
exec .venv/bin/python -P -m pytest -q -p no:cacheprovider --durations=15 "$@"
