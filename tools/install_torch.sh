#!/usr/bin/env bash
# tools/install_torch.sh PYTHON: install torch into PYTHON's environment without pulling CUDA
# libraries onto a machine that has no NVIDIA GPU. Idempotent: a working torch is kept.
set -euo pipefail
py=${1:-python3}
want=${TORCH_VERSION:-2.13.0}
if "$py" -c "import torch" 2>/dev/null; then
  echo "torch $("$py" -c 'import torch; print(torch.__version__)') already installed"; exit 0
fi
pip=("$py" -m pip install --no-input)
# 1. A local torch wheel (pip's find-links): pip prefers it and downloads only its small deps.
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
if "$py" -m pip download -q --no-index --no-deps -d "$scratch" "torch==$want" >/dev/null 2>&1; then
  "${pip[@]}" "torch==$want"; exit 0
fi
# 2. No NVIDIA GPU: ask PyTorch's CPU-only index so gigabytes of CUDA libraries stay away.
if ! command -v nvidia-smi >/dev/null 2>&1 && [[ $(uname -s) == Linux ]]; then
  if "${pip[@]}" --retries 1 --timeout 20 "torch==$want" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"; then
    exit 0
  fi
  echo "CPU index unreachable; falling back to the default index" >&2
fi
# 3. A GPU box (or macOS, whose wheels are CPU-only anyway): the default build.
"${pip[@]}" "torch==$want"
