#!/usr/bin/env bash
# Everything a short GPU session should run, in order of importance, in one command (about 6-9
# minutes on one H200; every step has its own time limit and writes its figures as it goes, so a
# step cut short still leaves what it measured):
#   1. scripts/gpu/gpu_check.py   float32 exactness on CUDA and bf16 mismatch (eager and CUDA graphs),
#                             tokens/s and step costs on the 1B and 7B shapes in both modes
#   2. tests/model/test_gpu.py the CUDA tests (skipped in CI)
#   3. scripts/gpu/gpu_profile.py where the time goes in one generation, with CUDA graphs
# Usage (the device tool, from the repository root):  bash scripts/gpu/gpu_session.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu_session}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c \
  "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"; } \
  > "$out/env.txt" 2>&1
timeout 450 python3 scripts/gpu/gpu_check.py --out "$out/gpu_check.json" > "$out/gpu_check.log" 2>&1
echo "gpu_check: exit $?"
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/model/test_gpu.py > "$out/pytest_gpu.log" 2>&1
echo "pytest tests/model/test_gpu.py: exit $?"; tail -3 "$out/pytest_gpu.log"
timeout 60 python3 scripts/gpu/gpu_profile.py --cuda-graphs --out "$out/gpu_profile_graphs.json" > "$out/gpu_profile.log" 2>&1
echo "gpu_profile --cuda-graphs: exit $?"
tail -2 "$out/gpu_check.log"
