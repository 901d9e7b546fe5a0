#!/usr/bin/env bash
# Idempotent: llama.cpp's own OpenAI-compatible server, `llama-server`, built for this CPU from
# the llama.cpp sources that the PyPI sdist of llama-cpp-python vendors (the machines reach
# PyPI, not GitHub), and prints the executable's path:
#     bash scripts/llama-server.sh   # → ~/.cache/talaria/llama.cpp-0.3.36/bin/llama-server
# It fronts SmolLM2's GGUF file as an `engine = "openai"` upstream in tests/real/
# (docs/upstream.md). The build takes about 5 minutes on 2 cores, once: the executable is
# kept in the user's cache, as pip keeps the wheels it builds (TALARIA_CACHE_DIR overrides it).
# Portable x86-64 flags (AVX2, FMA, F16C), not -march=native: a native build on a CPU with AMX
# (Sapphire Rapids) crashed with SIGSEGV in ggml's AMX kernels on the first decode here.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36 # llama-cpp-python's sdist; its vendor/llama.cpp is the server built
CACHE=${TALARIA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/talaria}
OUT="$CACHE/llama.cpp-$VERSION"
BIN="$OUT/bin/llama-server"
if [ ! -x "$BIN" ]; then
    bash scripts/apt-provide.sh cmake cmake >/dev/null # Debian's, if missing
    bash scripts/apt-provide.sh g++ g++ >/dev/null
    WORK=$(mktemp -d -t talaria-llama.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d "$WORK" \
        "llama-cpp-python==$VERSION" >&2
    tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
    SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
    echo "llama-server.sh: building llama-server $VERSION (about 5 minutes, once)" >&2
    cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >&2
    cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
    mkdir -p "$OUT/bin.new"
    cp "$WORK/build/bin/llama-server" "$OUT/bin.new/"
    rm -rf "$OUT/bin" && mv "$OUT/bin.new" "$OUT/bin" # whole or not at all
fi
echo "$BIN"
