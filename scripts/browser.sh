#!/usr/bin/env bash
# Idempotent: installs Debian's Chromium (apt, if no chromium is found) for the browser tests,
# which drive it with Playwright for Python (Playwright's own browser download is not reachable,
# so `playwright install` is never run), and prints the path of its executable:
#     bash scripts/browser.sh       # → /usr/bin/chromium
# Override the executable with TALARIA_CHROMIUM. Installing needs root and apt. As root the
# browser needs --no-sandbox, which Playwright passes by default (chromium_sandbox=False).
# No fonts package: chromium → libfontconfig1 → fontconfig-config pulls in fonts-dejavu-core.
set -euo pipefail

if [ -n "${TALARIA_CHROMIUM:-}" ]; then
    CHROMIUM=$(command -v "$TALARIA_CHROMIUM" 2>/dev/null) || {
        echo "browser.sh: TALARIA_CHROMIUM=$TALARIA_CHROMIUM is not an executable" >&2
        exit 1
    }
else
    CHROMIUM=$(bash "$(dirname "$0")/apt-provide.sh" chromium chromium chromium-browser)
fi
# (Debian's /usr/bin/chromium is a launcher script; on a failure, show what it said.)
if ! VERSION=$("$CHROMIUM" --version 2>&1); then
    echo "browser.sh: $CHROMIUM --version failed: $VERSION" >&2
    exit 1
fi
echo "$CHROMIUM"
