#!/usr/bin/env bash
# Everything jaxspec measures and checks on the GPU (H200), from the repository root of a checkout:
#   python -m jaxspec.interop.fetch --cuda     # once: .originals/ (the CUDA originals of `check` need --cuda)
#   bash bench/gpu_all.sh [parts]
# parts (default: env tests kernels check step decode; also decode-quick (greedy device loop only), attention,
# attention-quick, train, e2e: end-to-end at 8B / 1B scale, bench/e2e.py --quick, about 9 min on its own;
# e2e-flags, call-cost: bench/call_cost.py; invariance: bench/invariance.py; invariance-profile;
# train-profile: bench/train_profile.py;
# the real model: gguf0..gguf3, gguf, drafters, real, serving, see bench/gpu_real.sh). Each part has its own time limit; all of them together take more
# than 10 minutes, so on a machine lent for 10 minutes at a time run them in groups, e.g. "env tests check step"
# then "env decode attention".
# Writes logs/JSON/PNG under $OUT (or ./out). Keeps going after a failing part; exit 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 TORCHDYNAMO_DISABLE=1 JAXSPEC_TEST_GPU=1
PARTS=${*:-env tests kernels check step decode}
PY=python3
source bench/_gpu_env.sh  # GPU_XLA_FLAGS (the decode loops' XLA:GPU options), jaxspec_site
# GPU_XLA_FLAGS_EXTRA: appended for one call (e.g. --xla_dump_to=... for the HLO and thunk sequences)
GPU_XLA_FLAGS="$GPU_XLA_FLAGS${GPU_XLA_FLAGS_EXTRA:+ $GPU_XLA_FLAGS_EXTRA}"
fail=0
# Offline installs: tvm-ffi (for SGLang's run-time-compiled CUDA kernels) and jaxspec itself.
whl=$(ls .originals/apache-tvm-ffi-*/*.whl 2>/dev/null | head -1)
if [ -n "$whl" ]; then $PY -m pip install -q --no-index --no-deps --target /tmp/site "$whl" && export PYTHONPATH=/tmp/site; fi
# Where the image's setuptools cannot build the package install, assemble the package in a site folder.
if ! $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1; then
  jaxspec_site /tmp/jsite . && export PYTHONPATH=/tmp/jsite${PYTHONPATH:+:$PYTHONPATH}
  echo "jaxspec from /tmp/jsite (editable install unavailable)"
fi
for p in $PARTS; do case $p in
  env) run env 120 $PY -c "import jax, torch, triton, jaxspec, jaxspec.kernels; print(jax.__version__, jax.devices(), torch.__version__, torch.cuda.get_device_name(), triton.__version__); import subprocess; print(subprocess.run(['nvcc','--version'],capture_output=True,text=True).stdout[-80:])" ;;
  tests) run tests 300 $PY -m pytest -q -x -m gpu -p no:cacheprovider ${TESTS:-tests} ;;  # TESTS: a subset
  kernels) run kernels 300 $PY bench/kernel_ops.py --move-configs 16x1,8x4 --span-modes par --reps 20 --json "$OUT/kernels.json" ;;
  check) run check 240 $PY -m jaxspec.interop.check --device cuda --seed 0 --cases 3 ;;
  step) run step 300 $PY bench/step.py --device cuda --json "$OUT/step.json" --png "$OUT/step.png" ;;
  decode-quick) run decode ${DECODE_TIMEOUT:-200} $PY bench/decode.py --device gpu --batch-sizes 1,32 --modes loop --sampling greedy --repeats 1 --json "$OUT/decode.json" ;;
  decode) run decode 280 $PY bench/decode.py --device gpu --batch-sizes 1,32 --json "$OUT/decode.json" ;;
  # paged attention, ours (Mosaic GPU) vs SGLang's Triton extend/decode kernels vs jnp (~4.5 min at full
  # size; `attention-quick` for the subset). SGLang's attention files come from .originals (or
  # $JAXSPEC_ATTN_ORIGINALS/sglang-0.5.23/...); a missing original is reported per row, ours still timed.
  # E2E_ARGS replaces --quick (e.g. E2E_ARGS="--models 8b --batches 8 --contexts 4096" for a second call)
  # The e2e part runs under GPU_XLA_FLAGS (above) unless XLA_FLAGS is set (set it empty for XLA's defaults).
  e2e) XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}" run e2e ${E2E_TIMEOUT:-570} $PY bench/e2e.py ${E2E_ARGS:---quick} --json "$OUT/e2e.json" --png "$OUT/e2e.png" ;;
  # e2e-flags: the E2E_ARGS rows once per XLA_FLAGS set in E2E_FLAG_SETS (';'-separated, '-' = none): A/B of
  # XLA:GPU options (e.g. command buffers) on the decode loop; one log/JSON per set, e2e_flags_<i>
  e2e-flags) i=0; IFS=';' read -ra sets <<< "${E2E_FLAG_SETS:--}"; for f in "${sets[@]}"; do
      [ "$f" = "-" ] && f=""; echo "XLA_FLAGS set $i: '$f'"
      XLA_FLAGS="$f" run "e2e_flags_$i" ${E2E_TIMEOUT:-200} $PY bench/e2e.py ${E2E_ARGS:---quick} --json "$OUT/e2e_flags_$i.json"
      i=$((i + 1)); done ;;
  # call-cost: a decode call's fixed cost next to its round cost, fresh vs reused state buffers (bench/call_cost.py),
  # at CALL_COST_BATCHES (CALL_COST_ARGS: more options, e.g. --configs), with XLA's command-buffer update log (each
  # re-record and its microseconds)
  call-cost) for b in ${CALL_COST_BATCHES:-1 8}; do
      XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}" TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 \
        run "call_cost_b$b" 280 $PY bench/call_cost.py --batch "$b" --json "$OUT/call_cost_b$b.json" ${CALL_COST_ARGS:-}
      echo "command-buffer updates at batch $b (count, time, commands):"
      grep -ao "Updated command buffer in [0-9]* .s; num_commands=[0-9]*" "$OUT/call_cost_b$b.log" | sort | uniq -c | sort -rn | head -12
    done ;;
  # train: a target + MTP pair (jaxspec.train_tiny) into $OUT/$TRAIN_NAME; TRAIN_ARGS (default: the shipped demo
  # pair's recipe, ~100 s of training on the H200 against ~26 min on this repo's 2-core CPU)
  train) run "train_${TRAIN_NAME:-pair}" ${TRAIN_TIMEOUT:-500} $PY -m jaxspec.train_tiny --out "$OUT/${TRAIN_NAME:-pair}" \
      ${TRAIN_ARGS:---config demo --steps 2500 --batch 32} ;;
  # invariance: batch invariance checked and timed (bench/invariance.py; INVARIANCE_ARGS replaces the default
  # "--checks --matmul", e.g. "--timing --batches 1,32" or "--prefill --layers 4" for a second call), under
  # GPU_XLA_FLAGS
  # train-profile: the drafter trainer's per-stage profile (bench/train_profile.py; TRAIN_PROFILE_ARGS)
  invariance) XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}" run invariance ${INVARIANCE_TIMEOUT:-300} $PY bench/invariance.py \
      ${INVARIANCE_ARGS:---checks --matmul} --json "$OUT/invariance.json" ;;
  # invariance-profile: where the batch-invariant mode's decode rounds spend their time, per kernel class, next to
  # the default mode's (bench/e2e.py --profile at SmolLM2's shape, then bench/round_profile.py): $OUT/profile_inv/,
  # $OUT/profile_def/ (PROFILE_ARGS replaces the rows; PROFILE_TIMEOUT each mode)
  invariance-profile) for m in inv def; do mkdir -p "$OUT/profile_$m"; f=""; [ $m = inv ] && f=--batch-invariant
      XLA_FLAGS="${XLA_FLAGS-$GPU_XLA_FLAGS}" run "profile_$m/e2e" ${PROFILE_TIMEOUT:-200} $PY bench/e2e.py \
        ${PROFILE_ARGS:---models smollm2 --batches 1,32 --contexts 512 --configs plain,chain,tree16 --draft-vocab 8192 \
        --breakdown 1,32 --profile --max-new 32 --repeats 1 --no-pairs --reps 4} $f --json "$OUT/profile_$m/e2e.json"
      run "profile_$m/round_profile" 60 $PY bench/round_profile.py "$OUT/profile_$m/e2e.json" \
        --json "$OUT/profile_$m/round_profile.json"; done ;;
  train-profile) run train_profile ${TRAIN_PROFILE_TIMEOUT:-240} $PY bench/train_profile.py --out "$OUT/train_profile.json" \
      ${TRAIN_PROFILE_ARGS:-} ;;
  attention) run attention 330 $PY bench/attention.py --json "$OUT/attention.json" --png "$OUT/attention.png" ;;
  attention-quick) run attention 150 $PY bench/attention.py --quick --triton --json "$OUT/attention.json" --png "$OUT/attention.png" ;;
  # the real model (SmolLM2-135M-Instruct): gguf0..gguf3 (its GGUF in parts), gguf (assembled), drafters, real,
  # serving (bench/gpu_real.sh)
  gguf[0-9]|gguf|drafters|real|serving) bash bench/gpu_real.sh "$p" || fail=1 ;;
  *) echo "unknown part $p"; fail=1 ;;
esac; done
exit $fail
