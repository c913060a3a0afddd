#!/usr/bin/env bash
# scripts/chromium.sh — make sure Debian's chromium is installed for the dashboard's
# browser test (tests/test_dashboard_browser.py drives /usr/bin/chromium with Playwright;
# browsers cannot download themselves here). Installs it with apt-get only when it is
# missing and we are root (as in .ci/run); otherwise says once what to do. Quiet on success.
set -euo pipefail

[[ -x /usr/bin/chromium ]] && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "cyclone-env: /usr/bin/chromium is missing; the browser test will fail" \
        "(as root: apt-get install -y chromium)" >&2
    exit 0
fi
echo "cyclone-env: installing chromium for the dashboard's browser test" >&2
log="$(mktemp)"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    echo "cyclone-env: ERROR: apt-get install chromium failed" >&2
    exit 1
fi
rm -f "$log"
