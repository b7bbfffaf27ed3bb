#!/usr/bin/env bash
# Every GPU figure in one go, on a lent CUDA machine (issue 48). Usage, from the project's root:
#   engine/bench/gpu.sh CORPUS_DIR [SMOLLM2_GGUF] > gpu.txt
# On the device machine after ../shared/gpu/bundle.sh's three calls (SmolLM2 at /tmp/g/smollm2.gguf):
#   bash /tmp/g/run.sh run 'bash engine/bench/gpu.sh /tmp/g/corpus /tmp/g/smollm2.gguf'
# Each step has its own time limit (all of them together 570 s, under the device tool's 600 s a call)
# and says when it failed, so one bad step leaves the others' figures. ONLY=name,name runs some steps
# (tests embedded-f32 embedded-bf16 smol-f32 smol-bf16 qwen-shape complete replay), e.g. to split the
# run over two calls. float32 must give greedy's tokens exactly (the "= greedy" column); bfloat16 is
# reported as a match rate. The Qwen2.5-Coder shape runs with random weights (bench/random_shape.py):
# speed only. A dry run of every step on a CPU, before spending device time:
#   DEVICE=cpu PROMPTS=1 engine/bench/gpu.sh DIR [SMOLLM2_GGUF]
set -uo pipefail
corpus=${1:?usage: gpu.sh CORPUS_DIR [SMOLLM2_GGUF]}
smol=${2:-}
device=${DEVICE:-cuda}
prompts=${PROMPTS:-8}
only=${ONLY:-}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one step: its name, time limit and command line; its output, exit code and seconds ("ms" is
# `memosight`: timeout runs programs, not shell functions)
step() { local name=$1 limit=$2; shift 2; local cmd=("$@")
  [ -z "$only" ] || [[ ",$only," == *",$name,"* ]] || return 0
  echo; echo "== $name: $* (limit ${limit}s)"; local t0=$SECONDS
  [ "${cmd[0]}" = ms ] && cmd=(python3 -m memosight.server.cli "${cmd[@]:1}")
  timeout "$limit" "${cmd[@]}"; local rc=$?; echo "-- $name: rc $rc, $((SECONDS - t0)) s"; }
if [ "$device" = cuda ]; then
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__)"
fi

spec="--corpus $corpus --device $device --prompts $prompts --min-new 64 --max-new 64 --prompt-tokens 256"
step tests 45 python3 -m pytest -q -p no:cacheprovider tests/engine/runtime/test_static_cache.py
step embedded-f32 60 ms bench speculative $spec --dtype float32 --methods hf_greedy,plain,spec_all
# hf_static compiles transformers' decoding step first (untimed): the longer limits
step embedded-bf16 90 ms bench speculative $spec --dtype bfloat16 --methods hf_greedy,hf_static,plain,spec_all
if [ -n "$smol" ]; then
  step smol-f32 75 ms bench speculative $spec --model "$smol" --runtime torch --dtype float32 --methods hf_greedy,plain,spec_all
  step smol-bf16 105 ms bench speculative $spec --model "$smol" --runtime torch --dtype bfloat16 --methods hf_greedy,hf_static,plain,spec_heads,spec_ngram,spec_all
fi
step qwen-shape 75 ms bench speculative $spec --shape qwen2.5-coder-0.5b --dtype bfloat16 --methods hf_greedy,plain
step complete 30 ms complete tests/data/sample.py:33:20 --device "$device" --json
step replay 90 ms bench replay --corpus "$corpus" --pattern bursts --functions 2 --set "device=$device" --breakdown
[ "$device" = cuda ] && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
exit 0
