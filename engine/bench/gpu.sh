#!/usr/bin/env bash
# The speculative benchmark on a CUDA GPU: float32 (must match greedy exactly) and bf16 (match rate
# reported, kernels differ). Usage: engine/bench/gpu.sh CORPUS_DIR [MODEL] > results.txt
set -euo pipefail
corpus=${1:?usage: gpu.sh CORPUS_DIR [MODEL]}
model=${2:+--model $2}
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
for dtype in float32 bfloat16; do
  echo "== cuda $dtype"
  memosight bench speculative --corpus "$corpus" $model --device cuda --dtype "$dtype" --prompts 48
done
