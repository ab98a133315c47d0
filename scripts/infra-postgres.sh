# shellcheck shell=bash
# PostgreSQL (Debian's postgresql-N, N = DEV_POSTGRES_VERSION) for scripts/infra.sh: a private
# cluster of the run dir (<run dir>/postgres/data, owned by user postgres;
# /var/tmp/onceflow-postgres-<hash> when user postgres cannot reach the run dir), on
# 127.0.0.1:$PG_PORT (INFRA_PG_PORT, default DEV_POSTGRES_PORT), started with pg_ctl (no
# systemd). Roles and databases as deploy/dev/services.env says, by deploy/dev/sql.sh's SQL
# (the one docker-compose.yml's postgres runs): the admin user (CREATEDB, pg_signal_backend)
# owns DEV_NAMED_DATABASES and the test databases it creates, and `router migrate` runs as it
# and grants the application user its tables; the application user has no privilege on any
# table until then.
# Sourced by scripts/infra.sh: uses its log, fail, apt_install, port_open, RUN_DIR and the DEV_*
# variables.

PG_PORT="${INFRA_PG_PORT:-$DEV_POSTGRES_PORT}"
PG_HOST=127.0.0.1
PG_VERSION="$DEV_POSTGRES_VERSION"
PG_BIN="/usr/lib/postgresql/$PG_VERSION/bin"
PG_DIR="$RUN_DIR/postgres"
PG_DATA="$PG_DIR/data"
PG_LOG="$PG_DIR/postgres.log"

# pg_dirs: the cluster lives in <run dir>/postgres when user postgres can reach the run dir
# (not a checkout under /root, mode 700): else in /var/tmp, named after the run dir. Asked
# once user postgres exists (after pg_install).
pg_dirs() {
  mkdir -p "$RUN_DIR"
  if ! runuser -u postgres -- test -x "$RUN_DIR" 2>/dev/null; then
    PG_DIR="/var/tmp/onceflow-postgres-$(printf '%s' "$RUN_DIR" | sha256sum | cut -c1-12)"
    PG_DATA="$PG_DIR/data"
    PG_LOG="$PG_DIR/postgres.log"
  fi
}

pg_as() { runuser -u postgres -- "$@"; }
pg_psql() { pg_as "$PG_BIN/psql" -h "$PG_DIR" -p "$PG_PORT" -U postgres -d postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

pg_install() {
  [[ -x "$PG_BIN/postgres" ]] && return 0
  # The package's own cluster ($PG_VERSION/main) is neither wanted nor started: a policy-rc.d keeps
  # the install from starting services.
  local policy=/usr/sbin/policy-rc.d had_policy=1
  if [[ ! -e $policy ]]; then
    had_policy=0
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  fi
  apt_install "postgresql-$PG_VERSION"
  [[ $had_policy == 1 ]] || rm -f "$policy"
  [[ -x "$PG_BIN/postgres" ]] || fail postgres "apt-get install postgresql-$PG_VERSION left no $PG_BIN/postgres"
}

pg_running() { port_open "$PG_HOST" "$PG_PORT"; }

pg_ours() { [[ -s "$PG_DATA/postmaster.pid" ]] && kill -0 "$(head -1 "$PG_DATA/postmaster.pid")" 2>/dev/null; }

pg_init() {
  [[ -s "$PG_DATA/PG_VERSION" ]] && return 0
  log "postgres: initdb $PG_DATA"
  mkdir -p "$PG_DIR"
  chown postgres:postgres "$PG_DIR"
  chmod 700 "$PG_DIR"
  local out
  out="$(pg_as "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 2>&1)" || fail postgres "initdb failed: $out"
  cat >>"$PG_DATA/postgresql.conf" <<CONF
# onceflow (scripts/infra-postgres.sh)
listen_addresses = '$PG_HOST'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
max_connections = 400
shared_buffers = 256MB
default_transaction_isolation = 'read committed'
log_min_messages = warning
CONF
}

pg_start() {
  pg_install
  pg_dirs
  pg_init
  if pg_running; then
    pg_ours || fail postgres "127.0.0.1:$PG_PORT is taken by another server (not $PG_DATA): stop it or set INFRA_PG_PORT"
    log "postgres: already up on $PG_HOST:$PG_PORT"
  else
    log "postgres: starting on $PG_HOST:$PG_PORT (data $PG_DATA)"
    local out
    out="$(pg_as "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$WAIT_SECONDS" start 2>&1)" ||
      fail postgres "pg_ctl start failed: $out" "$PG_LOG"
  fi
  pg_provision
  log "postgres: up on $PG_HOST:$PG_PORT (log: $PG_LOG)"
}

# pg_provision: the roles and databases (deploy/dev/sql.sh), one psql script on its stdin.
pg_provision() {
  dev_pg_sql | pg_psql >/dev/null || fail postgres "provisioning roles and databases failed" "$PG_LOG"
}

pg_stop() {
  id postgres >/dev/null 2>&1 || { log "postgres: not installed"; return 0; }
  pg_dirs
  pg_ours || { log "postgres: not running (from $PG_DATA)"; return 0; }
  pg_as "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null && log "postgres: stopped"
}

pg_status() {
  id postgres >/dev/null 2>&1 && pg_dirs
  if pg_running && pg_ours; then
    echo "infra: postgres up    $PG_HOST:$PG_PORT (data $PG_DATA; log $PG_LOG)"
    return 0
  fi
  echo "infra: postgres down  $PG_HOST:$PG_PORT"
  return 1
}

# pg_wanted: up, down and status include PostgreSQL for the default instance, and for another
# one (INFRA_DB_PORT set) only when it names its own INFRA_PG_PORT; INFRA_POSTGRES=0
# leaves it out, =1 keeps it in.
pg_wanted() {
  case "${INFRA_POSTGRES:-}" in
    0) return 1 ;;
    1) return 0 ;;
  esac
  [[ "$DB_PORT" == "$DEV_MYSQL_PORT" || -n "${INFRA_PG_PORT:-}" ]]
}
