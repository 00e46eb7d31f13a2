#!/usr/bin/env bash
# A/B of two source trees on the GPU: bench/e2e.py rows run alternately on this checkout (A) and on another
# tree (B: a folder holding that commit's jaxspec/, e.g. from
# `git archive <commit> jaxspec | tar -x -C out/old_tree`), N processes each, under the
# decode loops' XLA options (bench/gpu_all.sh). One process's figures move by 2-5% from the next (BENCHMARKS.md),
# so a change of that size needs interleaved processes, not one run each.
#   git archive <commit> jaxspec | (mkdir -p out/old_tree && tar -x -C out/old_tree)
#   bash bench/ab_trees.sh out/old_tree 2 --models 8b --batches 1,32 ...
# Writes $OUT/ab_{A,B}_<i>.{log,json}; prints each process's table and which jaxspec it imported.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash bench/ab_trees.sh TREE_B N [e2e.py args...]" >&2; exit 2; }
TREE_B=$1 N=$2; shift 2
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
source bench/_gpu_env.sh  # GPU_XLA_FLAGS, jaxspec_site
export XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "A: editable install failed" >&2
# B as an importable package
SITE_B=/tmp/ab_tree_b
jaxspec_site "$SITE_B" "$TREE_B" || exit 1
ROOT=$PWD
for i in $(seq 1 "$N"); do
  for side in A B; do
    pp=""; [ $side = B ] && pp=$SITE_B
    # the imported tree, checked from a folder that does not shadow it
    where=$(cd /tmp && PYTHONPATH=$pp python3 -c "import jaxspec.models.decoder as m; print(m.__file__)")
    echo "$side imports $where"
    if [ $side = B ] && [[ $where != $SITE_B/* ]]; then echo "B does not import $SITE_B: stop" >&2; exit 1; fi
    PYTHONPATH=$pp timeout "${AB_TIMEOUT:-300}" python3 "$ROOT/bench/e2e.py" "$@" --json "$OUT/ab_${side}_$i.json" \
      > "$OUT/ab_${side}_$i.log" 2>&1
    echo "--- $side $i rc=$?"; tac "$OUT/ab_${side}_$i.log" | sed '/^model config/q' | tac | grep -v "^wrote" | grep .
  done
done
