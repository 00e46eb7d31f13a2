#!/usr/bin/env bash
# The real model on the H200: SmolLM2-135M-Instruct's drafters trained, then plain and speculative decoding on
# MT-Bench against transformers (bench/real_model.py).  bash bench/gpu_real.sh PART...
#
# The GPU machine has no network, so the inputs come with the call (REAL_INPUTS, default ../ of this tree):
#   $REAL_INPUTS/pN/part0N              the GGUF in parts (`split -n 2 -d MODEL.gguf part`: two of 49 MB), one per
#                                       call while the machine stays warm (a call carries 64 MiB; the tree is 60 MB
#                                       with the shipped heads, 13.5 MB without: the ggufN calls do not read
#                                       jaxspec/assets/heads, so move it out of the tree for them and back after;
#                                       `gguf` joins whatever parts came, in name order)
#   $REAL_INPUTS/w/gguf-*.whl           the gguf package (pure Python; not in the GPU image), and any other wheel the
#                                       run needs that the image lacks (e.g. the http mode's aiohttp and its
#                                       dependencies, prometheus-client: `pip download --only-binary=:all:
#                                       --python-version 3.12 --platform manylinux2014_x86_64 -d w aiohttp
#                                       prometheus-client`): every wheel there is installed, none from the network
#   $REAL_INPUTS/q/question.jsonl       MT-Bench questions (python -m jaxspec.data.mtbench)
# State that later calls of the same warm machine reuse lives under /tmp (the model, the site, the runs).
# Parts:
#   gguf0..gguf9  keep part0N under /tmp/parts;  gguf: assemble /tmp/model.gguf from the parts, check its sha256
#   drafters  bench/train_heads.sh: the self-distilled data, then the EAGLE-3 and MTP heads (resumable: a rerun
#             continues where a cut-short one stopped; on one H200 the whole recipe needs two calls; RECIPE=seeded:
#             the seeded chat recipe, its evaluation check against $REAL_INPUTS/q/question.jsonl)
#   real      bench/real_model.py (REAL_ARGS: its options; heads: $OUT/heads from drafters, else the shipped ones);
#             REAL_CB_LOG=1: with the command-buffer update log, as SERVING_CB_LOG below; REAL_HLO=1: the decode
#             executables' optimized HLO dumped, then bench/hlo_grep.py's report of it: $OUT/hlo_grep.txt.gz
#   serving   bench/serving.py (SERVING_ARGS: its options; the shipped EAGLE-3 head): $OUT/serving.json, .png;
#             SERVING_CB_LOG=1: with XLA's command-buffer update log (TF_CPP_VMODULE=command_buffer_thunk=3), then the
#             count and time of the re-recordings (a step whose buffers moved re-records its loop's graph on the host)
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
IN=$(cd "${REAL_INPUTS:-$SRC/..}" && pwd)  # absolute: train_heads.sh runs from /tmp
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
source bench/_gpu_env.sh
GGUF=/tmp/model.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # jaxspec/models/fetch.py's pin
RUNS=/tmp/runs
fail=0
site() {  # gguf and jaxspec importable (no install needs the network)
  if [ ! -d /tmp/site/gguf ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site "$IN"/w/*.whl; fi
  jaxspec_site /tmp/jsite "$SRC"
  export PYTHONPATH=/tmp/jsite:/tmp/site
}
cb_log_on() {  # XLA's command-buffer update log (a call whose buffers moved updates its graphs on the host)
  export TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3
}
cb_log_summary() {  # LOG: the count and time of the updates, then LOG with each run of them as one line (too big)
  grep -ao "Updated command buffer in [0-9]* [^ ]*; num_commands=[0-9]*" "$1" > /tmp/cb_updates.txt
  echo "command-buffer updates: $(wc -l < /tmp/cb_updates.txt), us in all: $(awk '{s += $5} END {print s + 0}' /tmp/cb_updates.txt)"
  sort /tmp/cb_updates.txt | uniq -c | sort -rn | head -12
  # in LOG, each run of updates becomes one line where it happened (which rows paid for them)
  awk 'function flush() { if (n) printf "[command-buffer updates: %d, %d us]\n", n, us; n = 0; us = 0 }
       /Updated command buffer in [0-9]+ / { match($0, /in [0-9]+ /); us += substr($0, RSTART + 3, RLENGTH - 4); n++; next }
       /command_buffer_thunk/ { next }
       { flush(); print } END { flush() }' "$1" > /tmp/rows.log && mv /tmp/rows.log "$1"
  unset TF_CPP_VMODULE
}
heads() {  # the heads real_model.py uses: this machine's trained ones, else the shipped ones
  local a=$SRC/jaxspec/assets/heads/smollm2-135m-instruct
  E3=$RUNS/e3/eagle3; [ -f "$E3/config.json" ] || E3=$a-eagle3
  MTP=$RUNS/mtp/mtp; [ -f "$MTP/config.json" ] || MTP=$a-mtp
}
for p in "$@"; do case $p in
  gguf[0-9]) n=${p#gguf}; mkdir -p /tmp/parts && cp "$IN/p$n/part0$n" /tmp/parts/ && ls -la /tmp/parts || fail=1 ;;
  gguf) cat /tmp/parts/part0* > $GGUF && echo "$GGUF_SHA  $GGUF" | sha256sum -c | tee "$OUT/gguf.sha256" || fail=1 ;;
  drafters) site  # bench/train_heads.sh under per-stage limits; heads and curves come back as heads.tar.NN (the
    # device returns at most 8 files of 16 MiB): cat heads.tar.* | tar -x
    DATA_TIMEOUT=${DATA_TIMEOUT:-170} E3_TIMEOUT=${E3_TIMEOUT:-300} MTP_TIMEOUT=${MTP_TIMEOUT:-150} PY=python3 \
      QUESTIONS=${QUESTIONS:-$IN/q/question.jsonl} \
      run drafters 590 bash bench/train_heads.sh $GGUF $RUNS
    got=$(cd $RUNS && ls -d e3/eagle3 e3/curves.json e3/curves.png mtp/mtp mtp/curves.json mtp/curves.png 2>/dev/null)
    [ -n "$got" ] && tar -cf /tmp/heads.tar -C $RUNS $got && split -b 15000000 -d /tmp/heads.tar "$OUT/heads.tar." \
      && ls -la "$OUT" ;;  # what exists: a stage cut short by its limit leaves the others
  real) site; heads
    [ -n "${REAL_CB_LOG:-}" ] && cb_log_on
    hlo=; [ -n "${REAL_HLO:-}" ] && rm -rf /tmp/hlo && hlo="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*decode.*"
    XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}${hlo:+ $hlo}" run real ${REAL_TIMEOUT:-560} env -u TORCHDYNAMO_DISABLE python3 bench/real_model.py \
      --model $GGUF --questions "$IN/q/question.jsonl" --eagle3 "$E3" --mtp "$MTP" --json "$OUT/real_model.json" \
      --png "$OUT/real_model.png" ${REAL_ARGS:-}
    [ -n "${REAL_CB_LOG:-}" ] && cb_log_summary "$OUT/real.log"
    [ -n "$hlo" ] && python3 bench/hlo_grep.py /tmp/hlo | gzip > "$OUT/hlo_grep.txt.gz" ;;
  serving) site  # one persistent compilation cache: the http mode's server reuses the in-process plain compiles
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2
    [ -n "${SERVING_CB_LOG:-}" ] && cb_log_on
    XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}" run serving ${SERVING_TIMEOUT:-540} python3 bench/serving.py \
      --model $GGUF --questions "$IN/q/question.jsonl" --eagle3 "$SRC/jaxspec/assets/heads/smollm2-135m-instruct-eagle3" \
      --budget-s ${SERVING_BUDGET:-480} --json "$OUT/serving.json" --png "$OUT/serving.png" ${SERVING_ARGS:-}
    [ -n "${SERVING_CB_LOG:-}" ] && cb_log_summary "$OUT/serving.log" ;;
  *) echo "unknown part $p"; fail=1 ;;
esac; done
exit $fail
