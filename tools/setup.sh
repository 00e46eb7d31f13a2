#!/usr/bin/env bash
# Creates .venv (Python >= 3.11), installs jaxspec editable with test/interop/bench extras, and
# fetches the original SGLang/TokenSpeed kernel files from their pinned PyPI releases into .originals/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 (CPU) is the interop torch on the dev/CI machines; pinning it keeps pip from pulling a CUDA build.
.venv/bin/python -m pip install -q -e ".[test,interop,bench,hf]" "torch==2.13.0" "triton==3.7.1"
.venv/bin/python -m jaxspec.interop.fetch
