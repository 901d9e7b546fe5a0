#!/usr/bin/env bash
# Idempotent: installs the coding-agent CLIs the tests drive (pinned versions, from npm) into
# .agents/ and prints the folder holding their executables:
#     bash scripts/agents.sh        # → /path/to/repo/.agents/node_modules/.bin
# The versions are the ones docs/agents.md was written against. Override the folder with
# TALARIA_AGENTS_DIR. Needs node ≥ 20 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${TALARIA_AGENTS_DIR:-.agents}
PACKAGES=(
    "@anthropic-ai/claude-code@2.1.328"
    "@openai/codex@0.169.0"
    "@qwen-code/qwen-code@0.24.4"
)
# npm trusts only its own CA list; where TLS goes through a local CA (as on these machines),
# the system bundle has it.
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
STAMP="$DIR/.installed"
WANT="${PACKAGES[*]}"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    mkdir -p "$DIR"
    [ -f "$DIR/package.json" ] || echo '{"name": "talaria-test-agents", "private": true}' >"$DIR/package.json"
    # bounded: npm retries a failing fetch for a long time before it gives up
    timeout 900 npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
        --fetch-retries=2 --fetch-timeout=120000 "${PACKAGES[@]}" >&2
    echo "$WANT" >"$STAMP"
fi
BIN=$(cd "$DIR/node_modules/.bin" && pwd)
for tool in claude codex qwen; do
    "$BIN/$tool" --version >/dev/null
done
echo "$BIN"
