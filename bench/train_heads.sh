#!/usr/bin/env bash
# SmolLM2-135M-Instruct's shipped draft heads, reproduced: bash bench/train_heads.sh [GGUF] [RUNS]
#
# GGUF: the target (default: fetched and hash-checked by `python -m jaxspec.models.fetch smollm2-135m-instruct`);
# RUNS: working folder (default /tmp/runs; the data and the resumable training states live there, so a rerun
# continues a cut-short one). The heads land in RUNS/e3/eagle3 and RUNS/mtp/mtp; INSTALL=1 copies them over
# jaxspec/assets/heads/. Per-stage time limits: DATA_TIMEOUT, E3_TIMEOUT, MTP_TIMEOUT (seconds, default none).
# Two recipes:
#   RECIPE=seeded QUESTIONS=question.jsonl: the shipped EAGLE-3 head's (on one H100: data 32768 conversations +
#     a 512-conversation dev set in ~6 min, EAGLE-3 4000 steps of batch 32 at ~7.5 steps/s);
#   default (magpie): the shipped MTP head's (on one H200: data 92 s, EAGLE-3 2500 steps at ~4.5 steps/s, MTP 1500
#     steps at ~10.5 steps/s).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
GGUF=${1:-$(cd /tmp && $PY -m jaxspec.models.fetch smollm2-135m-instruct | tail -1)}
RUNS=${2:-/tmp/runs}
cd /tmp  # python -m puts the working directory first on sys.path: never the source tree by accident
T="$PY -m jaxspec.train_draft --target $GGUF --device gpu --seed 0"
lim() { local t=$1; shift; if [ -n "$t" ]; then timeout "$t" "$@"; else "$@"; fi; }
if [ "${RECIPE:-magpie}" = seeded ]; then
  # RECIPE=seeded: chat prompts of eight kinds from jaxspec's topic seeds, continued by the target, rendered through
  # the chat template users use (its default system turn included) and answered mostly greedily; 16 MiB shards in
  # RUNS/e3/data/, user turns sharing 8 words with $QUESTIONS (MT-Bench's question.jsonl) dropped
  # (jaxspec.data.seeded_chat). A 24576-token draft vocabulary (DRAFT_VOCAB; the largest multiple of 8192 whose
  # head stays under the 40 MB a shipped head may take: 38.7 MB in bf16), its LM head started from the target's.
  : "${QUESTIONS:?RECIPE=seeded needs QUESTIONS=path/to/question.jsonl (the evaluation set kept out of the data)}"
  lim "${DATA_TIMEOUT:-}" $T --arch eagle3 --out "$RUNS/e3" --stage data --recipe seeded \
    --num-prompts "${NUM_PROMPTS:-32768}" --gen-batch "${GEN_BATCH:-256}" --prompt-len 160 --response-len 256 \
    --eval-questions "$QUESTIONS"
  # the dev set the checkpoints are chosen by: 512 greedy conversations of another seed (held out of training)
  lim "${DATA_TIMEOUT:-}" $PY -m jaxspec.train_draft --target "$GGUF" --device gpu --seed 1 --arch eagle3 \
    --out "$RUNS/dev" --stage data --recipe seeded --num-prompts 512 --gen-batch 512 --prompt-len 160 \
    --response-len 256 --greedy-fraction 1 --eval-questions "$QUESTIONS"
  mkdir -p "$RUNS/mtp" && ln -sfn "$RUNS/e3/data" "$RUNS/mtp/data"
  DEV="--dev-data $RUNS/dev/data --eval-every 250 --eval-steps 3"
  lim "${E3_TIMEOUT:-}" $T --arch eagle3 --out "$RUNS/e3" --stage train --recipe seeded --steps "${E3_STEPS:-4000}" \
    --batch "${E3_BATCH:-32}" --lr 5e-4 --draft-vocab "${DRAFT_VOCAB:-24576}" --draft-head-init target --ttt-length 7 --ckpt-every 250 $DEV
  lim "${MTP_TIMEOUT:-}" $T --arch mtp --out "$RUNS/mtp" --stage train --recipe seeded --steps "${MTP_STEPS:-2000}" \
    --batch 32 --lr 5e-4 --mtp-steps 3 --ckpt-every 250 $DEV
else
  # the shipped heads' recipe: 16384 Magpie-style self-synthesized user turns (no external prompt set) and the
  # target's replies, half greedy, half sampled at T=0.7 (train_draft's module docstring)
  lim "${DATA_TIMEOUT:-}" $T --arch eagle3 --out "$RUNS/e3" --stage data --num-prompts 16384 --gen-batch 512 \
    --prompt-len 64 --response-len 256
  mkdir -p "$RUNS/mtp" && ln -sf "$RUNS/e3/data.npz" "$RUNS/mtp/data.npz"
  lim "${E3_TIMEOUT:-}" $T --arch eagle3 --out "$RUNS/e3" --stage train --steps 2500 --batch 64 --lr 5e-4 \
    --draft-vocab 8192 --ttt-length 7 --ckpt-every 250
  lim "${MTP_TIMEOUT:-}" $T --arch mtp --out "$RUNS/mtp" --stage train --steps 1500 --batch 32 --lr 5e-4 \
    --mtp-steps 3 --ckpt-every 250
fi
if [ "${INSTALL:-0}" = 1 ]; then
  H=$SRC/jaxspec/assets/heads/smollm2-135m-instruct
  mkdir -p "$H-eagle3" "$H-mtp"
  cp "$RUNS/e3/eagle3/config.json" "$RUNS/e3/eagle3/model.safetensors" "$H-eagle3/"
  cp "$RUNS/mtp/mtp/config.json" "$RUNS/mtp/mtp/mtp.safetensors" "$H-mtp/"
fi
