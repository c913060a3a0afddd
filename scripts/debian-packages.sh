#!/usr/bin/env bash
# scripts/debian-packages.sh PACKAGE=PATH... — make sure Debian packages the tests drive are
# installed: chromium for the dashboard's browser test (Playwright drives /usr/bin/chromium;
# browsers cannot download themselves here) and pgbouncer for the tests that run cyclone
# behind it (they start their own /usr/sbin/pgbouncer; the package's service is not used).
# A package whose PATH is missing is installed with one apt-get run, only as root (as in
# .ci/run); otherwise this says once what to do. Quiet when everything is there.
set -euo pipefail

missing=()
for spec in "$@"; do
    [[ -x "${spec#*=}" ]] || missing+=("${spec%%=*}")
done
(( ${#missing[@]} )) || exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "cyclone-env: missing ${missing[*]}; the tests that need them will fail" \
        "(as root: apt-get install -y ${missing[*]})" >&2
    exit 0
fi
echo "cyclone-env: installing ${missing[*]} for the tests" >&2
log="$(mktemp)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    echo "cyclone-env: ERROR: apt-get install ${missing[*]} failed" >&2
    exit 1
fi
rm -f "$log"
