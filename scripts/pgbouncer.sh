#!/usr/bin/env bash
# scripts/pgbouncer.sh — make sure Debian's pgbouncer is installed for the tests that run
# cyclone behind it (tests/test_pgbouncer.py starts its own /usr/sbin/pgbouncer). Installs
# it with apt-get only when it is missing and we are root (as in .ci/run); otherwise says
# once what to do. Quiet on success. The package's own service is not started.
set -euo pipefail

[[ -x /usr/sbin/pgbouncer ]] && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "cyclone-env: /usr/sbin/pgbouncer is missing; the PgBouncer tests will fail" \
        "(as root: apt-get install -y pgbouncer)" >&2
    exit 0
fi
echo "cyclone-env: installing pgbouncer for the PgBouncer tests" >&2
log="$(mktemp)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    echo "cyclone-env: ERROR: apt-get install pgbouncer failed" >&2
    exit 1
fi
rm -f "$log"
