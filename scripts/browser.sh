#!/usr/bin/env bash
# Idempotent: installs Debian's Chromium (apt, if no chromium is found) for the browser tests,
# which drive it with Playwright for Python (Playwright's own browser download is not reachable,
# so `playwright install` is never run), and prints the path of its executable:
#     bash scripts/browser.sh       # → /usr/bin/chromium
# Override the executable with TALARIA_CHROMIUM. Installing needs root and apt. As root the
# browser needs --no-sandbox, which Playwright passes by default (chromium_sandbox=False).
set -euo pipefail

find_chromium() {
    local candidate
    for candidate in chromium chromium-browser; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return
        fi
    done
    return 1
}

apt_update() {
    apt-get update -qq >&2 || {
        echo "browser.sh: apt-get update failed" >&2
        exit 1
    }
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

if [ -n "${TALARIA_CHROMIUM:-}" ]; then
    CHROMIUM=$(command -v "$TALARIA_CHROMIUM" 2>/dev/null) || {
        echo "browser.sh: TALARIA_CHROMIUM=$TALARIA_CHROMIUM is not an executable" >&2
        exit 1
    }
elif ! CHROMIUM=$(find_chromium); then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "browser.sh: no chromium on PATH, and no apt-get to install it with" >&2
        exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "browser.sh: no chromium on PATH; installing it with apt-get needs root" >&2
        exit 1
    fi
    echo "browser.sh: installing chromium with apt-get" >&2
    # No fonts package: chromium → libfontconfig1 → fontconfig-config pulls in fonts-dejavu-core.
    PACKAGES=(chromium)
    # The package lists are refreshed only if they do not know chromium, or if they are stale
    # (the install then fails to fetch a package that has since been replaced).
    updated=
    if ! LC_ALL=C apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        apt_update
        updated=1
    fi
    if ! apt_install "${PACKAGES[@]}"; then
        if [ -n "$updated" ]; then
            echo "browser.sh: apt-get install chromium failed" >&2
            exit 1
        fi
        apt_update
        apt_install "${PACKAGES[@]}" || {
            echo "browser.sh: apt-get install chromium failed" >&2
            exit 1
        }
    fi
    CHROMIUM=$(find_chromium) || {
        echo "browser.sh: chromium was installed but is not on PATH" >&2
        exit 1
    }
fi
# (Debian's /usr/bin/chromium is a launcher script; on a failure, show what it said.)
if ! VERSION=$("$CHROMIUM" --version 2>&1); then
    echo "browser.sh: $CHROMIUM --version failed: $VERSION" >&2
    exit 1
fi
echo "$CHROMIUM"
