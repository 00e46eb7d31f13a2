#!/usr/bin/env bash
# Creates .venv (Python >= 3.11), installs jaxspec editable with the test/interop/bench extras, and
# fetches the original SGLang/TokenSpeed kernel files from their pinned, hash-checked PyPI releases into
# the git-ignored .originals/. Quiet: the installer's own chatter goes to .venv/setup.log and is shown
# only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
LOG=.venv/setup.log
: >"$LOG"
step() {  # step <description> <command...>: run quietly, print the log's tail on failure
  local what=$1; shift
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
echo "setup: .venv ready ($(.venv/bin/python -c 'import jax, jaxspec; print("jax", jax.__version__)')), originals in .originals/"
