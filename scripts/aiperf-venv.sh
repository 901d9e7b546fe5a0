#!/usr/bin/env bash
# Idempotent: NVIDIA's aiperf (PyPI), pinned, in a venv of its own (.venv-aiperf: its
# dependencies — pandas, pyarrow, plotly, transformers, … — are kept apart from Talaria's), and
# prints the executable's path:
#     bash scripts/aiperf-venv.sh   # → /…/.venv-aiperf/bin/aiperf
# It replays agent sessions against `talaria serve` in tests/real/test_aiperf.py and
# bench/aiperf_live.py (bench/harness/aiperf.py). Override: TALARIA_AIPERF_VENV (path).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TALARIA_AIPERF_VENV:-.venv-aiperf}
VERSION=0.13.0
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
printf '*\n' >"$VENV/.gitignore" # out of git and of ruff's walk
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys
sys.exit(m.version('aiperf') != '$VERSION')" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q "aiperf==$VERSION" >&2
fi
"$VENV/bin/aiperf" --version >/dev/null
realpath "$VENV/bin/aiperf"
