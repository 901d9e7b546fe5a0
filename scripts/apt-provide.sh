#!/usr/bin/env bash
# Idempotent: prints the path of the first COMMAND found on PATH; if none is, installs Debian's
# PACKAGE with apt-get (root needed) and prints it then:
#     bash scripts/apt-provide.sh chromium chromium chromium-browser   # → /usr/bin/chromium
#     bash scripts/apt-provide.sh nginx-light nginx                    # → /usr/sbin/nginx
# The package lists are refreshed only if they do not know PACKAGE, or if they are stale (the
# install then fails to fetch a package that has since been replaced).
set -euo pipefail
PACKAGE=$1
shift
export PATH="$PATH:/usr/sbin:/sbin" # nginx lives in /usr/sbin

find_command() {
    local candidate
    for candidate in "$@"; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return
        fi
    done
    return 1
}

apt_update() {
    apt-get update -qq >&2 || {
        echo "apt-provide.sh: apt-get update failed" >&2
        exit 1
    }
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$PACKAGE" >&2
}

if FOUND=$(find_command "$@"); then
    echo "$FOUND"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-provide.sh: no $* on PATH, and no apt-get to install $PACKAGE with" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "apt-provide.sh: no $* on PATH; installing $PACKAGE with apt-get needs root" >&2
    exit 1
fi
echo "apt-provide.sh: installing $PACKAGE with apt-get" >&2
updated=
if ! LC_ALL=C apt-cache policy "$PACKAGE" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt_update
    updated=1
fi
if ! apt_install; then
    if [ -n "$updated" ]; then
        echo "apt-provide.sh: apt-get install $PACKAGE failed" >&2
        exit 1
    fi
    apt_update
    apt_install || {
        echo "apt-provide.sh: apt-get install $PACKAGE failed" >&2
        exit 1
    }
fi
find_command "$@" || {
    echo "apt-provide.sh: $PACKAGE was installed but $* is not on PATH" >&2
    exit 1
}
