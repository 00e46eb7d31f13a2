# Sourced by bench/gpu_all.sh, bench/gpu_real.sh and bench/ab_trees.sh: the decode loops' XLA:GPU options, the
# assembly of an importable jaxspec package from a source tree, and the runner of one part.

# XLA:GPU options for the decode loops (README, "Performance"): command buffers (CUDA graphs) for every run of
# kernels, however short, and for the loops and conditionals themselves. Measured on the H200 (BENCHMARKS.md):
# the 8B chain round at batch 32 9.5 ms instead of 12.1 ms (launch gaps between small kernels).
GPU_XLA_FLAGS="--xla_gpu_graph_min_graph_size=1 --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"

# jaxspec_site DEST TREE: DEST/jaxspec = a copy of TREE's jaxspec/ (an importable package without an install; older
# trees kept kernels/ and interop/ beside it, and those are copied in); put DEST on PYTHONPATH to import it.
jaxspec_site() {
  rm -rf "$1" && mkdir -p "$1" && cp -r "$2/jaxspec" "$1/" || return 1
  local d; for d in kernels interop; do
    if [ -d "$2/$d" ] && [ ! -d "$1/jaxspec/$d" ]; then cp -r "$2/$d" "$1/jaxspec/$d" || return 1; fi
  done
}

# run NAME TIMEOUT CMD...: one part of a GPU script, its output teed to $OUT/NAME.log; a failure sets fail=1
run() {
  local name=$1 t=$2; shift 2
  echo "=== $name ($(date +%T)) ==="
  timeout "$t" "$@" > >(tee "$OUT/$name.log") 2>&1
  local rc=$?
  echo "=== $name rc=$rc ($(date +%T)) ==="
  [ $rc -eq 0 ] || fail=1
}
