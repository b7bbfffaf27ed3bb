#!/usr/bin/env bash
# The speculative benchmark on a CUDA GPU: float32 (must match greedy exactly), bf16 (match rate
# reported, kernels differ) and int8 (weight-only int8, bf16 arithmetic; lossless against its own
# greedy). Usage: engine/bench/gpu.sh CORPUS_DIR [MODEL] > results.txt
set -euo pipefail
corpus=${1:?usage: gpu.sh CORPUS_DIR [MODEL]}
model=${2:+--model $2}
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
for dtype in float32 bfloat16 int8; do
  echo "== cuda $dtype"
  memosight bench speculative --corpus "$corpus" $model --device cuda --dtype "$dtype" --prompts 48
done
