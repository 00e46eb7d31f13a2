#!/usr/bin/env bash
# Creates .venv (Python >= 3.11), installs jaxspec editable with the test/interop/bench/hf extras, and
# fetches the original SGLang/TokenSpeed kernel files from their pinned, hash-checked PyPI releases into
# the git-ignored .originals/. Quiet: the installer's own chatter goes to .venv/setup.log and is shown
# only when a step fails; each step prints one line as it starts.
#   bash tools/setup.sh [--fresh]     --fresh: remove .venv first (a brand-new environment, newest releases)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--fresh" ] && [ -e .venv ]; then
  echo "setup: removing .venv for a brand-new environment"
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv and installing jaxspec with its test extras (a few minutes on a new machine)"
  "$PY" -m venv .venv
fi
LOG=.venv/setup.log
: >"$LOG"
step() {  # step <description> <command...>: one progress line, the command's own output to the log (its tail on failure)
  local what=$1; shift
  echo "setup: $what ..."
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: $what failed; last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}
step "pip upgrade" .venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 (CPU) is the interop torch on the dev/CI machines; pinning it keeps pip from pulling a CUDA build.
step "install" .venv/bin/python -m pip install -q -e ".[test,interop,bench,hf]" "torch==2.13.0" "triton==3.7.1"
step "fetch originals" .venv/bin/python -m jaxspec.interop.fetch
versions=$(.venv/bin/python -c 'import importlib.metadata as m; print(", ".join(f"{d} {m.version(d)}" for d in ("jax", "flax", "torch", "transformers", "gguf")))')
echo "setup: .venv ready ($versions), originals in .originals/"
