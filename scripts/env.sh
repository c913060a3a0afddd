# shellcheck shell=bash
# scripts/env.sh — sourced by scripts/test, scripts/demo (and .ci/run via scripts/test).
#
# After sourcing:
#   * $CYCLONE_ROOT is the repository root and $CYCLONE_VENV its .venv (created and
#     installed with `pip install -e '.[dev]'` when needed); .venv/bin is first on PATH.
#   (The Debian packages only the tests need, chromium and pgbouncer, are scripts/test's
#   business: it runs scripts/debian-packages.sh itself, so scripts/demo installs nothing.)
#   * $CYCLONE_DATABASE_URL points at a reachable PostgreSQL server, as a SQLAlchemy URL
#     (postgresql+psycopg://...). The test suite creates/drops its own database there.
#
# Where the server comes from, first match wins:
#   (a) CYCLONE_DATABASE_URL already set            -> kept as is
#   (b) user postgres can log in (no password) at 127.0.0.1:5432, db postgres -> used
#   (c) Debian clusters named "main" (pg_lsclusters): started if down (needs root or the
#       postgres user), then used if user postgres can log in over TCP on their port
#   (d) PostgreSQL server binaries in /usr/lib/postgresql/*/bin
#                                                    -> private throwaway cluster on 127.0.0.1:54329
#   (e) nothing at all                               -> `pip install pgserver` (PostgreSQL in a wheel)
#
# Knobs (mostly for testing the fallbacks):
#   CYCLONE_SKIP_INSTALL=1        don't create/refresh the venv install (venv must already exist)
#   CYCLONE_PG_PROBE_HOST/PORT    where (b) looks (default 127.0.0.1 / 5432)
#   CYCLONE_PG_FORCE=private|embedded
#                                 skip (b)/(c) (and (d) for "embedded") to exercise a fallback
#   CYCLONE_PG_PRIVATE_PORT       port of the private cluster (d) (default 54329)
#   CYCLONE_PG_USER               unprivileged OS user for (d) when running as root
#                                 (default: cyclonepg, created if missing)
#
# Every step that matters ends in `|| _cy_die` (exit 1) rather than relying on set -e,
# because set -e is ignored when the caller writes `source scripts/env.sh && ...`.
#
# This file is meant to be sourced by scripts that run under `set -euo pipefail`; it
# turns those options on while it runs and restores the caller's options at the end.
# A failure while sourcing exits the sourcing shell, so from an interactive shell use e.g.
#   bash -c 'source scripts/env.sh && echo "$CYCLONE_DATABASE_URL"'

# Remember the caller's -e/-u/pipefail. ($- rather than `$(set +o)`: bash resets errexit
# inside command substitutions, so that would always report it off.)
_cyclone_saved_flags="$-"
_cyclone_saved_pipefail="$(shopt -po pipefail)"
set -euo pipefail

CYCLONE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
CYCLONE_VENV="$CYCLONE_ROOT/.venv"
export CYCLONE_ROOT CYCLONE_VENV

_cy_log() { echo "cyclone-env: $*" >&2; }
_cy_die() { echo "cyclone-env: ERROR: $*" >&2; exit 1; }

# --------------------------------------------------------------------------------------
# Virtualenv
# --------------------------------------------------------------------------------------
_cy_setup_venv() {
    local py="$CYCLONE_VENV/bin/python"
    if [[ -x "$py" ]] && ! "$py" -c '' 2>/dev/null; then
        # e.g. the base interpreter moved; --clear rebuilds it in place.
        _cy_log "existing .venv is broken; recreating it"
        python3 -m venv --clear "$CYCLONE_VENV" || _cy_die "could not recreate $CYCLONE_VENV"
        rm -f "$CYCLONE_VENV/.installed"
    elif [[ ! -x "$py" ]]; then
        python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || _cy_die "python3 is $(python3 -V 2>&1); cyclone needs Python >= 3.11"
        _cy_log "creating .venv"
        python3 -m venv "$CYCLONE_VENV" || _cy_die "could not create $CYCLONE_VENV"
    fi

    if [[ "${CYCLONE_SKIP_INSTALL:-}" == 1 ]]; then
        return 0
    fi
    # (Re)install only when pyproject.toml changed since the last successful install.
    # The stamp is touched only after pip succeeded, so a failed install is retried.
    if [[ ! -e "$CYCLONE_VENV/.installed" || "$CYCLONE_ROOT/pyproject.toml" -nt "$CYCLONE_VENV/.installed" ]]; then
        [[ -f "$CYCLONE_ROOT/pyproject.toml" ]] || _cy_die "no pyproject.toml in $CYCLONE_ROOT"
        _cy_log "installing cyclone[dev] into .venv"
        # pip >= 21.3 installs a pyproject.toml project editable (PEP 660): upgrade only an
        # older one (asking the index for the newest pip costs a fresh clone seconds).
        "$py" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (21, 3))' 2>/dev/null \
            || "$py" -m pip install -q --upgrade pip || _cy_die "could not upgrade pip in .venv"
        (cd "$CYCLONE_ROOT" && "$py" -m pip install -q -e '.[dev]') \
            || _cy_die "pip install -e '.[dev]' failed"
        touch "$CYCLONE_VENV/.installed"
    fi
}

# --------------------------------------------------------------------------------------
# PostgreSQL discovery helpers
# --------------------------------------------------------------------------------------

# _cy_pg_login HOST PORT [DBNAME] — succeeds if user postgres can really log in (no
# password prompt). A real login (not just pg_isready) is used so that a server that
# answers but wants a password (Debian's default pg_hba for TCP) is not picked.
_cy_pg_login() {
    local host="$1" port="$2" db="${3:-postgres}"
    if command -v psql >/dev/null 2>&1; then
        PGCONNECT_TIMEOUT=3 psql -w -X -q -A -t -h "$host" -p "$port" -U postgres -d "$db" \
            -c 'select 1' >/dev/null 2>&1
    elif "$CYCLONE_VENV/bin/python" -c 'import psycopg' 2>/dev/null; then
        "$CYCLONE_VENV/bin/python" - "$host" "$port" "$db" >/dev/null 2>&1 <<'PY'
import sys, psycopg
host, port, db = sys.argv[1:]
psycopg.connect(host=host, port=int(port), user="postgres", dbname=db, connect_timeout=3).close()
PY
    elif command -v pg_isready >/dev/null 2>&1; then
        # Weakest check: only says the server accepts connections, not that we may log in.
        pg_isready -q -t 3 -h "$host" -p "$port" -U postgres -d "$db"
    else
        return 1
    fi
}

# _cy_pg_wait HOST PORT — retry the login check for a few seconds (server just started).
_cy_pg_wait() {
    local i
    for i in $(seq 1 30); do
        _cy_pg_login "$1" "$2" && return 0
        # Up and accepting connections, yet the login failed (password required?):
        # waiting won't help.
        if command -v pg_isready >/dev/null 2>&1 && pg_isready -q -t 3 -h "$1" -p "$2"; then
            return 1
        fi
        sleep 0.5
    done
    return 1
}

_cy_use() {  # _cy_use URL DESCRIPTION
    export CYCLONE_DATABASE_URL="$1"
    _cy_log "using $2 -> $CYCLONE_DATABASE_URL"
}

# (c) Debian clusters: start any "main" cluster that is down, then look for a usable one.
_cy_try_debian_cluster() {
    command -v pg_lsclusters >/dev/null 2>&1 || return 1
    local ver name port status _rest
    while read -r ver name port status _rest; do
        [[ "$name" == main ]] || continue
        if [[ "$status" != online* ]]; then
            _cy_log "starting Debian cluster $ver/main (port $port)"
            if ! pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2; then
                _cy_log "could not start cluster $ver/main (not root/postgres?)"
                continue
            fi
        fi
        if _cy_pg_wait 127.0.0.1 "$port"; then
            _cy_use "postgresql+psycopg://postgres@127.0.0.1:$port/postgres" \
                "Debian cluster $ver/main"
            return 0
        fi
        _cy_log "Debian cluster $ver/main on port $port refuses user postgres over TCP without a password"
    done < <(pg_lsclusters --no-header 2>/dev/null)
    return 1
}

# _cy_as_pg CMD... — run CMD as the cluster's OS user: ourselves, or $_cy_pg_user when root.
_cy_as_pg() {
    if [[ -n "${_cy_pg_user:-}" ]]; then
        # cd /: the current directory may not be accessible to that user (pg_ctl warns).
        (cd / && runuser -u "$_cy_pg_user" -- "$@")
    else
        "$@"
    fi
}

# Pick the unprivileged OS user that runs the private cluster when we are root
# (postgres refuses to run as root).
_cy_pick_pg_user() {
    _cy_pg_user=""
    [[ "$(id -u)" == 0 ]] || return 0
    local u="${CYCLONE_PG_USER:-cyclonepg}"
    if ! id -u "$u" >/dev/null 2>&1; then
        if command -v useradd >/dev/null 2>&1 \
            && useradd --system --no-create-home --home-dir /nonexistent \
                       --shell /usr/sbin/nologin "$u" 2>/dev/null; then
            _cy_log "created system user $u for the private PostgreSQL cluster"
        elif id -u postgres >/dev/null 2>&1; then
            u=postgres
        else
            _cy_die "running as root and cannot create an unprivileged user for PostgreSQL"
        fi
    fi
    _cy_pg_user="$u"
}

# (d) Private throwaway cluster using the distribution's server binaries.
# Layout:  <base>/data (PGDATA), <base>/run (unix socket), <base>/postgres.log
_cy_try_private_cluster() {
    local initdb bindir
    initdb="$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)"
    [[ -n "$initdb" ]] || return 1
    bindir="$(dirname "$initdb")"
    local port="${CYCLONE_PG_PRIVATE_PORT:-54329}"

    _cy_pick_pg_user

    local base="$CYCLONE_ROOT/.pgdata"
    if [[ -n "$_cy_pg_user" ]] && ! runuser -u "$_cy_pg_user" -- test -x "$CYCLONE_ROOT"; then
        # Some parent of the repo is not traversable by that user (mktemp -d makes 0700
        # dirs): keep the cluster under /tmp instead, one per repo path.
        local hash
        hash="$(printf '%s' "$CYCLONE_ROOT" | sha256sum | cut -c1-12)"
        base="/tmp/cyclone-pg-$(id -u)-$hash"
    fi
    mkdir -p "$base" || _cy_die "cannot create $base"
    if [[ -n "$_cy_pg_user" ]]; then chown "$_cy_pg_user:" "$base" || _cy_die "cannot chown $base"; fi
    chmod 700 "$base" && _cy_as_pg mkdir -p "$base/run" || _cy_die "cannot prepare $base"

    local data="$base/data" log="$base/postgres.log"
    if [[ ! -f "$data/PG_VERSION" ]]; then
        _cy_log "initdb private cluster in $data ($bindir)"
        _cy_as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C \
            >"$base/initdb.out" 2>&1 || { cat "$base/initdb.out" >&2; _cy_die "initdb failed"; }
        _cy_as_pg sh -c 'echo "include_if_exists = '"'"'cyclone.conf'"'"'" >> "$1/postgresql.conf"' _ "$data" \
            || _cy_die "cannot edit $data/postgresql.conf"
    fi

    # Settings live in data/cyclone.conf, rewritten on every run so that a changed port or
    # location applies. fsync/full_page_writes off: a throwaway cluster, crash safety is
    # irrelevant. synchronous_commit stays at its default (on): benchmarks measure it.
    local sockdir="$base/run"
    # A unix socket path must fit in ~107 bytes; if it doesn't, go TCP-only.
    (( ${#sockdir} + 20 < 100 )) || sockdir=""
    _cy_as_pg sh -c 'cat > "$1/cyclone.conf"' _ "$data" <<EOF || _cy_die "cannot write $data/cyclone.conf"
# written by scripts/env.sh on every start; edits are lost
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
fsync = off
full_page_writes = off
max_connections = 200
EOF

    if _cy_as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        # Left running by an earlier run: reuse it if it answers where we expect it.
        # Otherwise (port changed, or a stale postmaster.pid after a crash) stop it so
        # that the start below applies cyclone.conf.
        if _cy_pg_login 127.0.0.1 "$port"; then
            _cy_use "postgresql+psycopg://postgres@127.0.0.1:$port/postgres" "private cluster in $data"
            return 0
        fi
        _cy_as_pg "$bindir/pg_ctl" -D "$data" -w -t 60 stop -m fast >/dev/null 2>&1 || true
    fi
    _cy_log "starting private cluster on 127.0.0.1:$port"
    _cy_as_pg "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1 || {
        tail -n 20 "$log" >&2 || true
        _cy_die "private cluster failed to start (port $port taken? set CYCLONE_PG_PRIVATE_PORT)"
    }
    _cy_pg_wait 127.0.0.1 "$port" \
        || _cy_die "private cluster in $data is not answering on 127.0.0.1:$port"
    _cy_log "private cluster started; to stop it:" \
        "${_cy_pg_user:+runuser -u $_cy_pg_user -- }$bindir/pg_ctl -D $data stop -m fast"
    _cy_use "postgresql+psycopg://postgres@127.0.0.1:$port/postgres" "private cluster in $data"
}

# (e) Embedded fallback: PyPI's pgserver ships PostgreSQL 16 binaries in its wheel and
# handles running as root itself (it creates an OS user "pgserver" and chmods the parent
# directories of the data dir and its binaries o+rx).
# pgserver.get_server(..., cleanup_mode=None) starts postgres with `pg_ctl start`, which
# daemonizes; with cleanup_mode=None its atexit hook does not stop it, so the server
# outlives this python process. The next call finds postmaster.pid and reuses it.
# pgserver listens on a unix socket only (it passes -h ""), hence the ?host= URL.
_cy_try_embedded() {
    local py="$CYCLONE_VENV/bin/python"
    if ! "$py" -c 'import pgserver' 2>/dev/null; then
        _cy_log "no PostgreSQL found; installing pgserver (embedded PostgreSQL) into .venv"
        "$py" -m pip install -q 'pgserver>=0.1.4' || _cy_die "pip install pgserver failed"
    fi
    local base="$CYCLONE_ROOT/.pgdata" uri
    mkdir -p "$base" || _cy_die "cannot create $base"
    uri="$("$py" - "$base/embedded" <<'PY'
import sys
import warnings

warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
import pgserver

srv = pgserver.get_server(sys.argv[1], cleanup_mode=None)  # None: leave it running
uri = srv.get_uri()
# Same throwaway-cluster speedups as the private cluster (both settings need only a reload).
import psycopg

with psycopg.connect(uri, autocommit=True) as conn:
    if conn.execute("show fsync").fetchone() != ("off",):
        conn.execute("alter system set fsync = off")
        conn.execute("alter system set full_page_writes = off")
        conn.execute("select pg_reload_conf()")
print(uri)
PY
)" || _cy_die "pgserver failed to start (see $base/embedded/log)"
    # postgresql://postgres:@/postgres?host=/dir -> postgresql+psycopg://postgres@/postgres?host=/dir
    uri="${uri/#postgresql:\/\//postgresql+psycopg://}"
    uri="${uri/postgres:@/postgres@}"
    _cy_use "$uri" "embedded pgserver in $base/embedded"
}

_cy_find_postgres() {
    if [[ -n "${CYCLONE_DATABASE_URL:-}" ]]; then
        _cy_log "using CYCLONE_DATABASE_URL from the environment -> $CYCLONE_DATABASE_URL"
        export CYCLONE_DATABASE_URL
        return 0
    fi
    local force="${CYCLONE_PG_FORCE:-}"
    case "$force" in ""|private|embedded) ;; *) _cy_die "CYCLONE_PG_FORCE must be private or embedded" ;; esac

    if [[ -z "$force" ]]; then
        local host="${CYCLONE_PG_PROBE_HOST:-127.0.0.1}" port="${CYCLONE_PG_PROBE_PORT:-5432}"
        if _cy_pg_login "$host" "$port"; then
            _cy_use "postgresql+psycopg://postgres@$host:$port/postgres" "PostgreSQL at $host:$port"
            return 0
        fi
        _cy_try_debian_cluster && return 0
    fi
    if [[ "$force" != embedded ]]; then
        _cy_try_private_cluster && return 0
    fi
    _cy_try_embedded
}

_cy_setup_venv
export VIRTUAL_ENV="$CYCLONE_VENV"
export PATH="$CYCLONE_VENV/bin:$PATH"
_cy_find_postgres

# Restore the caller's shell options.
[[ "$_cyclone_saved_flags" == *e* ]] || set +e
[[ "$_cyclone_saved_flags" == *u* ]] || set +u
eval "$_cyclone_saved_pipefail"
unset _cyclone_saved_flags _cyclone_saved_pipefail
