#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests (docs/sources.md §7: the server refuses to run as root, so
# as root everything runs as user postgres).
#   scripts/pg.sh start DIR PORT   initdb DIR/data if missing, start on 127.0.0.1:PORT (socket in
#                                  DIR, log in DIR/log), create database talaria_test, and print
#                                  postgresql+asyncpg://postgres@127.0.0.1:PORT/talaria_test
#   scripts/pg.sh stop DIR         stop it (fast shutdown); a stopped server is not an error
set -euo pipefail

bindir() {
    if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        # /usr/local/bin may link pg_ctl and initdb only: the real folder also has psql.
        dirname "$(readlink -f "$(command -v pg_ctl)")"
        return
    fi
    local dir
    for dir in /usr/lib/postgresql/15/bin $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ]; then
            echo "$dir"
            return
        fi
    done
    echo "pg.sh: PostgreSQL binaries (pg_ctl, initdb) not found on PATH or in /usr/lib/postgresql" >&2
    return 1
}

as_pg() {
    # From /: user postgres may not enter the caller's folder (a mktemp -d clone is 0700), and
    # PostgreSQL's tools warn when they cannot change back to it. Every path here is absolute.
    if [ "$(id -u)" = 0 ]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

usage() {
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
BIN=$(bindir)

case "$cmd" in
start)
    port=${3:-}
    [ -n "$port" ] || usage
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" = 0 ]; then
        chown postgres "$dir"
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_pg "$BIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 >"$dir/initdb.log" 2>&1 || {
            cat "$dir/initdb.log" >&2
            exit 1
        }
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_pg "$BIN/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -h 127.0.0.1" -l "$dir/log" -w \
            start >/dev/null || {
            cat "$dir/log" >&2
            exit 1
        }
    fi
    exists=$(as_pg "$BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'talaria_test'")
    if [ "$exists" != 1 ]; then
        as_pg "$BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres talaria_test
    fi
    echo "postgresql+asyncpg://postgres@127.0.0.1:$port/talaria_test"
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        dir=$(cd "$dir" && pwd)
        as_pg "$BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    ;;
*)
    usage
    ;;
esac
