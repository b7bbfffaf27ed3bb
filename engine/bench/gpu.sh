#!/usr/bin/env bash
# Every GPU figure in one go, on a lent CUDA machine (issue 48). Usage, from the project's root:
#   engine/bench/gpu.sh CORPUS_DIR [SMOLLM2_GGUF] > gpu.txt
# On the device machine after ../shared/gpu/bundle.sh's three calls (SmolLM2 at /tmp/g/smollm2.gguf):
#   bash /tmp/g/run.sh run 'bash engine/bench/gpu.sh /tmp/g/corpus /tmp/g/smollm2.gguf'
# Each step has its own time limit and says when it failed, so one bad step leaves the others'
# figures. float32 must give greedy's tokens exactly (the "= greedy" column); bfloat16 is reported as
# a match rate. The Qwen2.5-Coder shapes run with random weights (bench/random_shape.py): speed only.
set -uo pipefail
corpus=${1:?usage: gpu.sh CORPUS_DIR [SMOLLM2_GGUF]}
smol=${2:-}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ms() { python3 -m memosight.server.cli "$@"; }
step() { local limit=$1; shift; echo; echo "== $* (limit ${limit}s)"; local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?; echo "-- rc $rc, $((SECONDS - t0)) s"; }
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__)"

step 120 python3 -m pytest -q -p no:cacheprovider tests/engine/runtime/test_static_cache.py
spec="--corpus $corpus --device cuda --prompts 8 --min-new 64 --max-new 64 --prompt-tokens 256"
step 150 ms bench speculative $spec --dtype float32 --methods hf_greedy,plain,spec_all
step 150 ms bench speculative $spec --dtype bfloat16 --methods hf_greedy,hf_static,plain,spec_all
if [ -n "$smol" ]; then
  step 150 ms bench speculative $spec --model "$smol" --runtime torch --dtype float32 --methods hf_greedy,plain,spec_all
  step 180 ms bench speculative $spec --model "$smol" --runtime torch --dtype bfloat16 --methods hf_greedy,hf_static,plain,spec_heads,spec_ngram,spec_all
fi
step 150 ms bench speculative $spec --shape qwen2.5-coder-0.5b --dtype bfloat16 --prompts 4 --methods hf_greedy,plain
step 120 ms complete tests/data/sample.py:33:20 --device cuda --json
step 240 ms bench replay --corpus "$corpus" --pattern bursts --functions 2 --set device=cuda --breakdown
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
