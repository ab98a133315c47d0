#!/usr/bin/env bash
# onceflow local infrastructure without Docker and without systemd:
#   * MariaDB 10.11 (Debian package) on 127.0.0.1:3306
#   * Apache Kafka (real broker jars from Maven Central, KRaft, one combined
#     broker+controller node) on 127.0.0.1:9092 (controller on :9093), and a SASL_SSL
#     listener on 127.0.0.1:9094 (TLS with a local CA; SCRAM-SHA-512, SCRAM-SHA-256, PLAIN)
#   * a local CA and certificates (openssl, made on this machine) in <run dir>/tls: MariaDB
#     serves TLS with them too (TLS is offered, not required, except for user onceflow_tls)
#   * Debian's chromium, installed when missing: the headless browser the operator
#     console's browser test drives (tools/consoletest; OFTEST_CHROMIUM names
#     another Chrome or Chromium binary instead)
#
# Usage: scripts/infra.sh up|down|status|reset|db-start|db-stop|kafka-start|kafka-stop
#
#   up           install what is missing, start what is not running, wait until
#                both answer, create databases, users and topics (idempotent)
#   status       print up/down for each service (exit 0 only when both are up)
#   down         stop Kafka (SIGTERM via pid file) and MariaDB (mariadb-admin shutdown)
#   reset        stop Kafka and wipe its data (re-formatted by the next up), drop and
#                re-create the databases; leaves both services down
#   db-start / db-stop / kafka-start / kafka-stop / pg-start / pg-stop   one service only
#                (chaos tests)
#   PostgreSQL 15 (Debian package) on 127.0.0.1:5432 is started by up too, from its own data
#   dir <run dir>/postgres (scripts/infra-postgres.sh; INFRA_PG_PORT another port;
#   INFRA_POSTGRES=0 leaves it out)
#   galera-up|galera-down|galera-status|galera-reset, galera-start|galera-stop|galera-kill N
#                a three-node MariaDB Galera cluster on 127.0.0.1:4306-4308 beside the single
#                node (scripts/infra-galera.sh; INFRA_GALERA_PORT another first port)
#   cluster-up|cluster-down|cluster-status|cluster-reset, cluster-start|cluster-stop|cluster-kill N
#                a separate three-broker KRaft cluster on 127.0.0.1:19092-19094 (replication
#                factor 3, min.insync.replicas 2; scripts/infra-cluster.sh); with
#                INFRA_KAFKA_BROKERS=3, up / down / status act on MariaDB and the cluster
#
# The databases, users, grants, topics, ports and versions are those of
# deploy/dev/services.env (DEV_*), which docker-compose.yml reads too; the SQL that makes the
# databases and users is deploy/dev/sql.sh's. The defaults below that name a DEV_* variable
# come from there.
#
# Environment:
#   INFRA_TOPICS             topics to create (space or comma separated), default DEV_KAFKA_TOPICS
#   INFRA_TOPIC_PARTITIONS   default DEV_KAFKA_TOPIC_PARTITIONS
#   INFRA_KAFKA_VERSION      default DEV_KAFKA_VERSION (org.apache.kafka:kafka_2.13)
#   INFRA_RUN_DIR            runtime dir, default <repo>/.run
#   INFRA_WAIT_SECONDS       bounded wait per service, default 90
#   INFRA_KAFKA_SASL_PORT    the SASL_SSL listener's port: default DEV_KAFKA_SASL_PORT for the
#                            default instance (Kafka on DEV_KAFKA_PORT), none for any other;
#                            empty: none
#   KAFKA_HEAP_OPTS          default DEV_KAFKA_HEAP_OPTS
#
# A second, independent instance (the chaos harness restarts its services; scripts/chaos.sh
# uses one so that the shared services stay untouched) is selected by:
#   INFRA_RUN_DIR                    its own runtime dir (Kafka data, pid files, logs; MariaDB
#                                    datadir, socket and pid file in <run dir>/mariadb)
#   INFRA_DB_PORT                    default DEV_MYSQL_PORT = the machine's MariaDB (Debian
#                                    paths, /etc/mysql config). Any other port = a private
#                                    mariadbd (mariadb-install-db --datadir=<run dir>/mariadb/data,
#                                    own my.cnf, socket and pid file there, --user=mysql)
#   INFRA_KAFKA_PORT                 default DEV_KAFKA_PORT
#   INFRA_KAFKA_CONTROLLER_PORT      default DEV_KAFKA_CONTROLLER_PORT
#   INFRA_KAFKA_CHAOS_PORT           default none: a third listener CHAOS on this port, ...
#   INFRA_KAFKA_CHAOS_ADVERTISED_PORT  ... advertised on this port (default CHAOS port + 1),
#                                    where tools/chaos's fault-injecting proxy listens: clients
#                                    bootstrapped through the proxy then fetch and produce
#                                    through it too
# e.g. INFRA_RUN_DIR=$PWD/.run/chaos-infra INFRA_DB_PORT=3307 INFRA_KAFKA_PORT=9192 \
#      INFRA_KAFKA_CONTROLLER_PORT=9193 INFRA_KAFKA_CHAOS_PORT=9194 scripts/infra.sh up
# Every command acts only on the instance the environment selects: processes are found by
# that instance's pid files (or on its port, only if their command line names its own
# server.properties / my.cnf), never by name, so two checkouts or instances on one machine
# cannot stop each other's services.
#
# Connection facts: users and passwords, databases and grants, topics and ports in
# deploy/dev/services.env (the migration user DEV_ADMIN_USER, the app user DEV_APP_USER, which
# `router migrate` grants its tables, the TLS user DEV_TLS_USER, REQUIRE SSL, and the monitor
# user DEV_MONITOR_USER; deploy/dev/sql.sh says who gets what), and:
#   kafka TLS      SASL_SSL on DEV_KAFKA_SASL_PORT, user DEV_KAFKA_SASL_USER, password in
#                  <run dir>/tls/kafka-<user>.password
#   TLS files      <run dir>/tls: ca.pem (trust this), server.pem/.key (broker and MariaDB, SAN
#                  127.0.0.1 and localhost), client.pem/.key (a client certificate of the CA)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=deploy/dev/services.env
source "$ROOT/deploy/dev/services.env"
# shellcheck source=deploy/dev/sql.sh
source "$ROOT/deploy/dev/sql.sh"
RUN_DIR="${INFRA_RUN_DIR:-$ROOT/.run}"
WAIT_SECONDS="${INFRA_WAIT_SECONDS:-90}"

DB_HOST=127.0.0.1
DB_PORT="${INFRA_DB_PORT:-$DEV_MYSQL_PORT}"
read -r -a DB_NAMES <<<"$DEV_DATABASES"
DB_MAX_CONNECTIONS=500
DB_LOG="$RUN_DIR/mariadb.log"
if [[ "$DB_PORT" == "$DEV_MYSQL_PORT" ]]; then
  # The machine's MariaDB: Debian paths and /etc/mysql config.
  DB_PRIVATE=0
  DB_CONF=/etc/mysql/mariadb.conf.d/99-onceflow.cnf
  DB_SOCKET=/run/mysqld/mysqld.sock
  DB_PIDFILE=/run/mysqld/mysqld.pid
  DB_SSD_PIDFILE=/run/mysqld/onceflow-start.pid # written by start-stop-daemon (as root)
  DB_TLS_DIR=/etc/mysql/onceflow-tls # copies of the TLS files that mariadbd (user mysql) reads
  DB_TMPDIR=/var/lib/mysql-tmp       # the server's tmpdir (see db_tmpdir)
else
  # A private mariadbd of this run dir: own datadir, config, socket and pid files.
  DB_PRIVATE=1
  DB_DIR="$RUN_DIR/mariadb"
  DB_DATADIR="$DB_DIR/data"
  DB_CONF="$DB_DIR/my.cnf"
  DB_SOCKET="$DB_DIR/mysqld.sock"
  DB_PIDFILE="$DB_DIR/mysqld.pid"
  DB_SSD_PIDFILE="$DB_DIR/onceflow-start.pid"
  DB_TLS_DIR="$DB_DIR/tls"
  DB_TMPDIR="$DB_DIR/tmp"
fi
MARIADBD=/usr/sbin/mariadbd

KAFKA_VERSION="${INFRA_KAFKA_VERSION:-$DEV_KAFKA_VERSION}"
KAFKA_HOST=127.0.0.1
KAFKA_PORT="${INFRA_KAFKA_PORT:-$DEV_KAFKA_PORT}"
KAFKA_CONTROLLER_PORT="${INFRA_KAFKA_CONTROLLER_PORT:-$DEV_KAFKA_CONTROLLER_PORT}"
KAFKA_CHAOS_PORT="${INFRA_KAFKA_CHAOS_PORT:-}"
KAFKA_CHAOS_ADVERTISED_PORT="${INFRA_KAFKA_CHAOS_ADVERTISED_PORT:-}"
if [[ -n "$KAFKA_CHAOS_PORT" && -z "$KAFKA_CHAOS_ADVERTISED_PORT" ]]; then
  KAFKA_CHAOS_ADVERTISED_PORT=$((KAFKA_CHAOS_PORT + 1))
fi
if [[ "$KAFKA_PORT" == "$DEV_KAFKA_PORT" ]]; then
  KAFKA_SASL_PORT="${INFRA_KAFKA_SASL_PORT-$DEV_KAFKA_SASL_PORT}"
else
  KAFKA_SASL_PORT="${INFRA_KAFKA_SASL_PORT:-}"
fi
KAFKA_SASL_USER="$DEV_KAFKA_SASL_USER"
TLS_DIR="$RUN_DIR/tls"
KAFKA_DIR="$RUN_DIR/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_PROPS="$KAFKA_DIR/server.properties"
KAFKA_LOG4J="$KAFKA_DIR/log4j2.xml"
KAFKA_TOOLS_LOG4J="$KAFKA_DIR/tools-log4j2.xml"
KAFKA_PIDFILE="$KAFKA_DIR/kafka.pid"
KAFKA_LOG="$KAFKA_DIR/server.log"
KAFKA_STDOUT="$KAFKA_DIR/stdout.log"
KAFKA_CLUSTER_ID_FILE="$KAFKA_DIR/cluster.id"
KAFKA_POM="$ROOT/scripts/kafka/pom.xml"
KAFKA_HEAP="${KAFKA_HEAP_OPTS:-$DEV_KAFKA_HEAP_OPTS}"
TOPIC_PARTITIONS="${INFRA_TOPIC_PARTITIONS:-$DEV_KAFKA_TOPIC_PARTITIONS}"
read -r -a TOPICS <<<"$(echo "${INFRA_TOPICS:-$DEV_KAFKA_TOPICS}" | tr ',' ' ')"

log() { echo "infra: $*"; }
warn() { echo "infra: WARNING: $*" >&2; }

# fail SERVICE REASON LOGFILE: print why and the tail of the log, then exit 1.
fail() {
  local svc="$1" why="$2" logf="${3:-}"
  echo "infra: FAILED: $svc: $why" >&2
  if [[ -n "$logf" ]]; then
    echo "infra: $svc log: $logf (last 20 lines follow)" >&2
    if [[ -f "$logf" ]]; then tail -n 20 "$logf" | sed 's/^/    /' >&2; else echo "    (no log file)" >&2; fi
  fi
  exit 1
}

need_root() {
  [[ "$(id -u)" == 0 ]] || { echo "infra: must run as root (installs packages, starts mariadbd as user mysql)" >&2; exit 1; }
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

# port_pids PORT: the pids of the processes listening on PORT.
port_pids() { ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u; }

apt_updated=0
apt_install() {
  if [[ $apt_updated == 0 ]]; then
    log "apt-get update"
    apt-get update -qq >/dev/null || apt-get update
    apt_updated=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 "$@" >/dev/null \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

# ---------------------------------------------------------------- TLS material

# A local CA and the certificates it signs, made with openssl on this machine (nothing is
# downloaded), in $TLS_DIR: ca.pem/ca.key, server.pem/server.key (the broker's and MariaDB's,
# SAN 127.0.0.1 and localhost), client.pem/client.key (a client certificate), the broker's
# PKCS12 keystore and its password, and the Kafka user's SASL password. Idempotent: a file is
# made again only when it is missing or expires within 30 days (and everything the CA signed
# when the CA is made again).
tls_valid() { [[ -s "$1" ]] && openssl x509 -in "$1" -noout -checkend $((30 * 86400)) >/dev/null 2>&1; }

# tls_sign NAME CN EXTENSIONS: a key and a certificate of the CA for NAME.
tls_sign() {
  local name="$1" cn="$2" ext="$3" tmp
  tmp="$(mktemp -d)"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$tmp/$name.key" 2>/dev/null \
    || fail tls "openssl genpkey ($name) failed"
  openssl req -new -key "$tmp/$name.key" -subj "/O=onceflow local/CN=$cn" -out "$tmp/$name.csr" 2>/dev/null \
    || fail tls "openssl req ($name) failed"
  printf '%s\n' "$ext" >"$tmp/ext.cnf"
  openssl x509 -req -in "$tmp/$name.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" -CAcreateserial \
    -CAserial "$TLS_DIR/ca.srl" -days 825 -sha256 -extfile "$tmp/ext.cnf" -out "$tmp/$name.pem" 2>/dev/null \
    || fail tls "openssl x509 -req ($name) failed"
  install -m 0600 "$tmp/$name.key" "$TLS_DIR/$name.key"
  install -m 0644 "$tmp/$name.pem" "$TLS_DIR/$name.pem"
  rm -rf "$tmp"
}

tls_setup() {
  command -v openssl >/dev/null || apt_install openssl
  mkdir -p "$TLS_DIR"
  chmod 0755 "$TLS_DIR"
  local renewed=0
  if ! tls_valid "$TLS_DIR/ca.pem" || [[ ! -s "$TLS_DIR/ca.key" ]]; then
    log "tls: making a local CA in $TLS_DIR"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/O=onceflow local/CN=onceflow local CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout "$TLS_DIR/ca.key.tmp" -out "$TLS_DIR/ca.pem.tmp" 2>/dev/null || fail tls "openssl req -x509 (CA) failed"
    chmod 0600 "$TLS_DIR/ca.key.tmp"
    mv "$TLS_DIR/ca.key.tmp" "$TLS_DIR/ca.key"
    mv "$TLS_DIR/ca.pem.tmp" "$TLS_DIR/ca.pem"
    renewed=1
  fi
  if [[ $renewed == 1 ]] || ! tls_valid "$TLS_DIR/server.pem" || [[ ! -s "$TLS_DIR/server.key" ]]; then
    log "tls: making the server certificate (127.0.0.1, localhost)"
    tls_sign server 127.0.0.1 "subjectAltName=IP:127.0.0.1,DNS:localhost
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
    rm -f "$TLS_DIR/kafka-broker.p12"
  fi
  if [[ $renewed == 1 ]] || ! tls_valid "$TLS_DIR/client.pem" || [[ ! -s "$TLS_DIR/client.key" ]]; then
    log "tls: making a client certificate (CN onceflow)"
    tls_sign client onceflow "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  fi
  local f
  for f in kafka-keystore.password "kafka-$KAFKA_SASL_USER.password"; do
    if [[ ! -s "$TLS_DIR/$f" ]]; then
      (umask 077 && openssl rand -hex 16 >"$TLS_DIR/$f.tmp") && mv "$TLS_DIR/$f.tmp" "$TLS_DIR/$f"
    fi
  done
  if [[ ! -s "$TLS_DIR/kafka-broker.p12" ]]; then
    openssl pkcs12 -export -name broker -inkey "$TLS_DIR/server.key" -in "$TLS_DIR/server.pem" -certfile "$TLS_DIR/ca.pem" \
      -passout "file:$TLS_DIR/kafka-keystore.password" -out "$TLS_DIR/kafka-broker.p12.tmp" 2>/dev/null \
      || fail tls "openssl pkcs12 -export (broker keystore) failed"
    chmod 0600 "$TLS_DIR/kafka-broker.p12.tmp"
    mv "$TLS_DIR/kafka-broker.p12.tmp" "$TLS_DIR/kafka-broker.p12"
  fi
}

# ---------------------------------------------------------------- MariaDB

db_root() { mariadb --protocol=socket -S "$DB_SOCKET" -uroot --batch --skip-column-names "$@"; }

db_install() {
  if [[ ! -x "$MARIADBD" ]] || ! command -v mariadb >/dev/null || ! command -v mariadb-admin >/dev/null; then
    # Written before the install too, so a server that the package's postinst
    # may start already has these settings.
    db_write_conf
    apt_install mariadb-server mariadb-client
  fi
}

db_write_conf() {
  db_tmpdir
  if [[ $DB_PRIVATE == 1 ]]; then
    db_write_private_conf
    return
  fi
  mkdir -p "$(dirname "$DB_CONF")"
  local tmp
  tmp="$(mktemp)"
  cat >"$tmp" <<EOF
# Written by onceflow scripts/infra.sh; rewritten on every \`infra.sh up\`.
[mysqld]
bind-address                   = 127.0.0.1
port                           = $DB_PORT
# Durability stays full (flush at every commit); the buffer pool and log sizes only keep the
# working set in memory and avoid checkpoint stalls on the machine's slow virtual disk.
innodb_buffer_pool_size        = 1G
innodb_log_file_size           = 512M
tmpdir                         = $DB_TMPDIR
$(db_settings)
EOF
  if ! cmp -s "$tmp" "$DB_CONF" 2>/dev/null; then
    install -m 0644 "$tmp" "$DB_CONF"
  fi
  rm -f "$tmp"
}

# A private instance's my.cnf, read with --defaults-file (no /etc/mysql file is read).
db_write_private_conf() {
  mkdir -p "$DB_DIR"
  cat >"$DB_CONF" <<EOF
# Written by onceflow scripts/infra.sh for the private instance of $RUN_DIR; rewritten on every start.
[mysqld]
datadir                        = $DB_DATADIR
socket                         = $DB_SOCKET
pid-file                       = $DB_PIDFILE
log-error                      = $DB_LOG
bind-address                   = 127.0.0.1
port                           = $DB_PORT
innodb_buffer_pool_size        = 512M
innodb_log_file_size           = 256M
tmpdir                         = $DB_TMPDIR
$(db_settings)
EOF
  chmod 0644 "$DB_CONF"
}

# db_settings: the [mysqld] settings of both instances' my.cnf (docker-compose.yml's mysql
# gives its server the same ones: compose_test.go compares them).
db_settings() {
  cat <<EOF
skip-name-resolve
max_connections                = $DB_MAX_CONNECTIONS
innodb_flush_log_at_trx_commit = 1
sync_binlog                    = 1
innodb_lock_wait_timeout       = 10
character-set-server           = utf8mb4
collation-server               = utf8mb4_unicode_ci
# TLS offered to every client (copies of <run dir>/tls, scripts/infra.sh); required only of
# users created with REQUIRE SSL.
ssl_ca                         = $DB_TLS_DIR/ca.pem
ssl_cert                       = $DB_TLS_DIR/server.pem
ssl_key                        = $DB_TLS_DIR/server.key
EOF
}

# db_tls_install: copies of the CA, the server certificate and its key where mariadbd (user
# mysql) reads them; DB_TLS_CHANGED=1 when a copy changed (a running server reloads them).
DB_TLS_CHANGED=0
db_tls_install() {
  mkdir -p "$DB_TLS_DIR"
  local f owner=root
  id mysql >/dev/null 2>&1 && owner=mysql
  chown "$owner:" "$DB_TLS_DIR" 2>/dev/null || true
  chmod 0750 "$DB_TLS_DIR"
  for f in ca.pem server.pem server.key; do
    if ! cmp -s "$TLS_DIR/$f" "$DB_TLS_DIR/$f" 2>/dev/null; then
      install -m 0600 -o "$owner" "$TLS_DIR/$f" "$DB_TLS_DIR/$f"
      DB_TLS_CHANGED=1
    elif [[ "$(stat -c %U "$DB_TLS_DIR/$f")" != "$owner" ]]; then
      chown "$owner:" "$DB_TLS_DIR/$f"
      DB_TLS_CHANGED=1
    fi
  done
}

# db_tls_check: a server running without the TLS files of its config (started before they
# were configured) is restarted once, briefly (then it returns 1: that start did the rest);
# one whose files changed reloads them.
DB_TLS_RESTARTED=0
db_tls_check() {
  local have cert
  have="$(db_root -e 'SELECT @@have_ssl' 2>/dev/null || true)"
  cert="$(db_root -e 'SELECT @@ssl_cert' 2>/dev/null || true)"
  if [[ "$have" == YES && "$cert" == "$DB_TLS_DIR/server.pem" ]]; then
    if [[ $DB_TLS_CHANGED == 1 ]]; then
      log "mariadb: reloading the TLS certificate (FLUSH SSL)"
      db_root -e 'FLUSH SSL' || warn "mariadb: FLUSH SSL failed"
    fi
    return 0
  fi
  if [[ $DB_TLS_RESTARTED == 1 ]]; then
    fail mariadb "TLS still off after a restart (have_ssl=$have, ssl_cert=$cert; config $DB_CONF)" "$DB_LOG"
  fi
  if ! db_pid >/dev/null; then
    warn "mariadb: TLS is off (have_ssl=$have) and the server on $DB_PORT is not one this script can restart; leaving it"
    return 0
  fi
  log "mariadb: TLS is off (have_ssl=${have:-?}, ssl_cert=${cert:-none}): restarting once to load $DB_TLS_DIR"
  DB_TLS_RESTARTED=1
  db_stop
  db_start
  return 1
}

db_running() { port_open "$DB_HOST" "$DB_PORT"; }

# is_mariadbd PID [CONF]: the process is $MARIADBD and, given CONF, was started with
# --defaults-file=CONF.
is_mariadbd() {
  [[ "$(readlink "/proc/$1/exe" 2>/dev/null)" == "$MARIADBD" ]] || return 1
  [[ -z "${2:-}" ]] || tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -qxF -- "--defaults-file=$2"
}

# is_our_mariadbd PID: the process is $MARIADBD and, for a private instance, was started
# with this instance's my.cnf.
is_our_mariadbd() {
  if [[ $DB_PRIVATE == 1 ]]; then is_mariadbd "$1" "$DB_CONF"; else is_mariadbd "$1"; fi
}

# Pid of the running mariadbd: from its pid file, else the process on the port.
db_pid() {
  local pid
  for pid in $(cat "$DB_PIDFILE" "$DB_SSD_PIDFILE" 2>/dev/null) $(port_pids "$DB_PORT"); do
    if is_our_mariadbd "$pid"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# db_app PORT ARGS...: the application user's client on 127.0.0.1:PORT (no database named: it
# has none of its own until `router migrate` grants it tables).
db_app() {
  local port="$1"
  shift
  mariadb -h127.0.0.1 -P"$port" -u"$DEV_APP_USER" -p"$DEV_APP_PASSWORD" --batch --skip-column-names "$@"
}

db_ping_root() { mariadb-admin --protocol=socket -S "$DB_SOCKET" -uroot ping >/dev/null 2>&1; }

# db_tmpdir: the server's own tmpdir, where a query that groups or sorts more than
# tmp_table_size writes its temporary tables (#sql-temptable-…). In /tmp, anything that
# cleans /tmp may delete such a file while its query runs, and the query then fails ("Error
# on delete of '/tmp/#sql-temptable-…' (Errcode: 2)"). A server started before my.cnf named
# it keeps /tmp until its next start.
db_tmpdir() {
  mkdir -p "$DB_TMPDIR"
  if id mysql >/dev/null 2>&1; then
    chown mysql:mysql "$DB_TMPDIR"
    chmod 0750 "$DB_TMPDIR"
  else
    chmod 1777 "$DB_TMPDIR" # before the package's install creates the user; its postinst may start the server
  fi
}

db_start() {
  need_root
  tls_setup
  db_install
  db_tls_install
  db_write_conf
  local started=0
  if db_running; then
    log "mariadb: already listening on $DB_HOST:$DB_PORT, reusing it"
  elif [[ $DB_PRIVATE == 1 ]]; then
    db_start_private
    started=1
  else
    mkdir -p /run/mysqld "$RUN_DIR"
    chown mysql:mysql /run/mysqld
    chmod 0755 /run/mysqld
    touch "$DB_LOG"
    chown mysql:mysql "$DB_LOG"
    if [[ ! -d /var/lib/mysql/mysql ]]; then
      log "mariadb: initialising datadir /var/lib/mysql"
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql --auth-root-authentication-method=socket \
        >>"$DB_LOG" 2>&1 || fail mariadb "mariadb-install-db failed" "$DB_LOG"
    fi
    log "mariadb: starting (log: $DB_LOG)"
    rm -f "$DB_SSD_PIDFILE" "$DB_PIDFILE" # stale: nothing listens on the port
    # mariadbd does not fork, so the pid that start-stop-daemon records is the server's.
    start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "$DB_SSD_PIDFILE" --exec "$MARIADBD" -- \
      --user=mysql --log-error="$DB_LOG" --pid-file="$DB_PIDFILE" --socket="$DB_SOCKET" \
      || fail mariadb "start-stop-daemon could not start $MARIADBD" "$DB_LOG"
    started=1
  fi
  local deadline=$((SECONDS + WAIT_SECONDS))
  until db_running && db_ping_root; do
    if ((SECONDS >= deadline)); then
      fail mariadb "not answering on $DB_HOST:$DB_PORT / $DB_SOCKET after ${WAIT_SECONDS}s" "$DB_LOG"
    fi
    if [[ $started == 1 ]] && ! db_pid >/dev/null; then
      fail mariadb "mariadbd exited during start-up" "$DB_LOG"
    fi
    sleep 0.5
  done
  db_provision
  [[ $started == 0 ]] || DB_TLS_CHANGED=0 # a server started just now read the current files
  db_tls_check || return 0               # restarted: that db_start checked the rest
  local out
  out="$(db_app "$DB_PORT" -e 'SELECT 1' 2>&1)" \
    || fail mariadb "app user $DEV_APP_USER cannot connect over TCP: $out" "$DB_LOG"
  out="$(mariadb -h"$DB_HOST" -P"$DB_PORT" -u"$DEV_TLS_USER" -p"$DEV_TLS_PASSWORD" --ssl --ssl-ca="$TLS_DIR/ca.pem" --ssl-verify-server-cert \
    --batch --skip-column-names -e "SHOW SESSION STATUS LIKE 'Ssl_version'" 2>&1)" \
    || fail mariadb "TLS user $DEV_TLS_USER cannot connect over TLS: $out" "$DB_LOG"
  local maxc
  maxc="$(db_root -e 'SELECT @@max_connections')"
  [[ "$maxc" == "$DB_MAX_CONNECTIONS" ]] || warn "mariadb: max_connections=$maxc (a server started outside this script? run: $0 db-stop && $0 db-start)"
  log "mariadb: up on $DB_HOST:$DB_PORT (databases: ${DB_NAMES[*]}; log: $DB_LOG)"
}

# The private instance: its own datadir, my.cnf, socket and pid file under $DB_DIR.
db_start_private() {
  mkdir -p "$DB_DIR"
  chown mysql:mysql "$DB_DIR"
  touch "$DB_LOG"
  chown mysql:mysql "$DB_LOG"
  if [[ ! -d "$DB_DATADIR/mysql" ]]; then
    log "mariadb: initialising private datadir $DB_DATADIR"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DATADIR" --auth-root-authentication-method=socket \
      >>"$DB_LOG" 2>&1 || fail mariadb "mariadb-install-db --datadir=$DB_DATADIR failed" "$DB_LOG"
  fi
  log "mariadb: starting private instance on $DB_HOST:$DB_PORT (datadir $DB_DATADIR, log: $DB_LOG)"
  rm -f "$DB_SSD_PIDFILE" "$DB_PIDFILE" "$DB_SOCKET" # stale: nothing listens on the port
  start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "$DB_SSD_PIDFILE" --exec "$MARIADBD" -- \
    --defaults-file="$DB_CONF" --user=mysql --datadir="$DB_DATADIR" --socket="$DB_SOCKET" \
    --pid-file="$DB_PIDFILE" --port="$DB_PORT" --log-error="$DB_LOG" \
    || fail mariadb "start-stop-daemon could not start $MARIADBD" "$DB_LOG"
}

# db_provision: the databases and users of deploy/dev/services.env, by deploy/dev/sql.sh's SQL
# (the one docker-compose.yml's mysql runs), for 127.0.0.1 and localhost. Grants name each
# database and the test patterns; no other database is reachable. The application user keeps
# its table grants (`router migrate` made them, on tables this script never sees); every
# database-level grant it has other than the test pattern's is revoked, and so are the table
# grants left behind by dropped test databases (a grant outlives its database).
db_provision() {
  local sql out
  sql="$(dev_mysql_sql 127.0.0.1 localhost)"
  out="$(db_root -e "$sql" 2>&1)" || fail mariadb "provisioning (databases/users as root via $DB_SOCKET) failed: $out" "$DB_LOG"
  # Statements revoking the app user's database-level grants other than the test pattern's
  # (an older install's per-database grants), and the table grants that `router migrate` made
  # in test databases that are gone. mysql.db holds the patterns as granted ('_' escaped).
  local q revokes test_pat grants_pat
  test_pat="$(dev_sql_db_pattern "$DEV_TEST_DATABASES")"
  grants_pat="$(dev_sql_db_pattern "$DEV_GRANTS_TEST_DATABASES")"
  q="SELECT CONCAT('REVOKE ALL PRIVILEGES ON \`', Db, '\`.* FROM ''', User, '''@''', Host, ''';') FROM mysql.db
 WHERE User = '$DEV_APP_USER' AND Db <> '${test_pat//\\/\\\\}'
UNION ALL
SELECT CONCAT('REVOKE ALL PRIVILEGES ON \`', Db, '\`.\`', Table_name, '\` FROM ''', User, '''@''', Host, ''';') FROM mysql.tables_priv
 WHERE (Db LIKE '${grants_pat//\\/\\\\}' OR Db LIKE '${test_pat//\\/\\\\}')
 AND Db NOT IN (SELECT SCHEMA_NAME FROM information_schema.SCHEMATA)"
  revokes="$(db_root --raw -e "$q" 2>&1)" || fail mariadb "reading the app user's grants failed: $revokes" "$DB_LOG"
  if [[ -n "$revokes" ]]; then
    out="$(db_root -e "$revokes" 2>&1)" || fail mariadb "revoking stale grants failed: $out" "$DB_LOG"
  fi
}

db_stop() {
  need_root
  local pid=""
  pid="$(db_pid || true)"
  if [[ -z "$pid" ]] && ! db_running; then
    log "mariadb: already down"
    return 0
  fi
  log "mariadb: stopping${pid:+ (pid $pid)}"
  if command -v mariadb-admin >/dev/null; then
    mariadb-admin --protocol=socket -S "$DB_SOCKET" -uroot shutdown 2>/dev/null \
      || { [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null; } || true
  fi
  local deadline=$((SECONDS + WAIT_SECONDS))
  while { [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; } || db_running; do
    if ((SECONDS >= deadline)); then
      if [[ -n "$pid" ]]; then
        warn "mariadb: pid $pid still running after ${WAIT_SECONDS}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
        break
      fi
      fail mariadb "port $DB_PORT still open after shutdown (not a mariadbd started from $MARIADBD?)" "$DB_LOG"
    fi
    sleep 0.5
  done
  log "mariadb: down"
}

db_reset() {
  local was_running=0
  db_running && was_running=1
  db_start
  local sql="" d
  for d in "${DB_NAMES[@]}"; do
    sql+="DROP DATABASE IF EXISTS \`$d\`;"
  done
  log "mariadb: dropping and re-creating ${DB_NAMES[*]}"
  db_root -e "$sql" || fail mariadb "drop databases failed" "$DB_LOG"
  db_provision
  if [[ $was_running == 0 || "${1:-}" == stop ]]; then db_stop; fi
}

db_status() {
  if db_running; then
    local v
    v="$(db_app "$DB_PORT" -e 'SELECT VERSION()' 2>/dev/null || echo '?')"
    echo "infra: mariadb  up    $DB_HOST:$DB_PORT (version $v; log $DB_LOG)"
    return 0
  fi
  echo "infra: mariadb  down  $DB_HOST:$DB_PORT"
  return 1
}

# ---------------------------------------------------------------- Kafka

java_ok() {
  command -v java >/dev/null || return 1
  local v
  v="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/{print $2}')"
  [[ "${v%%.*}" -ge 17 ]] 2>/dev/null
}

kafka_install() {
  if ! java_ok; then apt_install openjdk-17-jre-headless; fi
  java_ok || fail kafka "Kafka $KAFKA_VERSION needs Java 17+ (found: $(java -version 2>&1 | head -1))"
  if [[ -f "$KAFKA_LIBS/.complete" && "$(cat "$KAFKA_LIBS/.complete")" == "$KAFKA_VERSION" ]]; then
    return 0
  fi
  # A second instance (another INFRA_RUN_DIR) reuses the jars of the default run dir.
  local shared_libs="$ROOT/.run/kafka/libs"
  if [[ "$shared_libs" != "$KAFKA_LIBS" && -f "$shared_libs/.complete" && "$(cat "$shared_libs/.complete")" == "$KAFKA_VERSION" ]]; then
    mkdir -p "$KAFKA_DIR"
    rm -rf "$KAFKA_LIBS.tmp"
    cp -al "$shared_libs" "$KAFKA_LIBS.tmp" 2>/dev/null || cp -a "$shared_libs" "$KAFKA_LIBS.tmp"
    rm -rf "$KAFKA_LIBS"
    mv "$KAFKA_LIBS.tmp" "$KAFKA_LIBS"
    log "kafka: jars linked from $shared_libs"
    return 0
  fi
  command -v mvn >/dev/null || apt_install maven
  mkdir -p "$KAFKA_DIR"
  local tmp="$KAFKA_DIR/libs.tmp" mlog="$KAFKA_DIR/maven.log"
  rm -rf "$tmp"
  log "kafka: fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION + kafka-tools with Maven into $KAFKA_LIBS (log: $mlog)"
  if ! mvn -q -B -f "$KAFKA_POM" -Dkafka.version="$KAFKA_VERSION" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mlog" 2>&1; then
    fail kafka "Maven could not fetch Kafka $KAFKA_VERSION" "$mlog"
  fi
  ls "$tmp"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 || fail kafka "kafka_2.13-$KAFKA_VERSION.jar missing after Maven" "$mlog"
  echo "$KAFKA_VERSION" >"$tmp/.complete"
  rm -rf "$KAFKA_LIBS"
  mv "$tmp" "$KAFKA_LIBS"
}

kafka_write_config() {
  mkdir -p "$KAFKA_DIR" "$KAFKA_DATA"
  # Optional CHAOS listener: advertised on the port of tools/chaos's proxy, so that a client
  # bootstrapped through the proxy keeps talking through it.
  local listeners="PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT"
  local advertised="PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT"
  local protomap="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  if [[ -n "$KAFKA_CHAOS_PORT" ]]; then
    listeners+=",CHAOS://$KAFKA_HOST:$KAFKA_CHAOS_PORT"
    advertised+=",CHAOS://$KAFKA_HOST:$KAFKA_CHAOS_ADVERTISED_PORT"
    protomap+=",CHAOS:PLAINTEXT"
  fi
  # Optional SASL_SSL listener: TLS with the local CA's server certificate (PKCS12 keystore),
  # client certificates verified when presented, and SCRAM-SHA-512/256 (users created with
  # the admin API by kafka_scram_users) or PLAIN (the user below).
  local sasl=""
  if [[ -n "$KAFKA_SASL_PORT" ]]; then
    listeners+=",SASL_SSL://$KAFKA_HOST:$KAFKA_SASL_PORT"
    advertised+=",SASL_SSL://$KAFKA_HOST:$KAFKA_SASL_PORT"
    protomap+=",SASL_SSL:SASL_SSL"
    local ksp upw
    ksp="$(cat "$TLS_DIR/kafka-keystore.password")"
    upw="$(cat "$TLS_DIR/kafka-$KAFKA_SASL_USER.password")"
    sasl="sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER=\"$upw\";
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$TLS_DIR/kafka-broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$ksp
listener.name.sasl_ssl.ssl.key.password=$ksp
listener.name.sasl_ssl.ssl.truststore.type=PEM
listener.name.sasl_ssl.ssl.truststore.location=$TLS_DIR/ca.pem
listener.name.sasl_ssl.ssl.client.auth=requested"
  fi
  (umask 077 && : >"$KAFKA_PROPS") # it holds the keystore and PLAIN passwords
  chmod 0600 "$KAFKA_PROPS"
  cat >"$KAFKA_PROPS" <<EOF
# Written by onceflow scripts/infra.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protomap
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
log.dirs=$KAFKA_DATA
num.partitions=$TOPIC_PARTITIONS
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
num.network.threads=3
num.io.threads=8
log.retention.hours=168
log.segment.bytes=1073741824
$sasl
EOF
  cat >"$KAFKA_LOG4J" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="server" fileName="$KAFKA_LOG" filePattern="$KAFKA_LOG.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="100 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.controller" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
EOF
  cat >"$KAFKA_TOOLS_LOG4J" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="stderr" target="SYSTEM_ERR"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="ERROR"><AppenderRef ref="stderr"/></Root></Loggers>
</Configuration>
EOF
}

kafka_tool() {
  # kafka_tool MAIN_CLASS ARGS...: run an admin tool against the libs (bounded in time).
  timeout "${KAFKA_TOOL_TIMEOUT:-60}" java -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_TOOLS_LOG4J" -cp "$KAFKA_LIBS/*" "$@"
}

kafka_format() {
  if [[ -f "$KAFKA_DATA/meta.properties" ]]; then return 0; fi
  local cid
  if [[ -s "$KAFKA_CLUSTER_ID_FILE" ]]; then
    cid="$(cat "$KAFKA_CLUSTER_ID_FILE")"
  else
    cid="$(kafka_tool kafka.tools.StorageTool random-uuid 2>>"$KAFKA_STDOUT" | tail -n 1)"
    [[ -n "$cid" ]] || fail kafka "StorageTool random-uuid failed" "$KAFKA_STDOUT"
    echo "$cid" >"$KAFKA_CLUSTER_ID_FILE"
  fi
  log "kafka: formatting KRaft storage $KAFKA_DATA (cluster id $cid)"
  kafka_tool kafka.tools.StorageTool format -t "$cid" -c "$KAFKA_PROPS" --ignore-formatted >>"$KAFKA_STDOUT" 2>&1 \
    || fail kafka "StorageTool format failed" "$KAFKA_STDOUT"
}

# is_kafka PID PROPS: the process is kafka.Kafka started with the server.properties PROPS.
is_kafka() {
  tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -qxF -- "$2" || return 1
  tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -q 'kafka\.Kafka '
}

# Pid of our broker: from the pid file, else the process listening on the broker port;
# either way only a kafka.Kafka started with this run dir's server.properties (a broker
# of another checkout or instance on the same port is never ours to stop).
kafka_pid() {
  local pid
  if [[ -f "$KAFKA_PIDFILE" ]]; then
    pid="$(cat "$KAFKA_PIDFILE" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && is_kafka "$pid" "$KAFKA_PROPS"; then
      echo "$pid"
      return 0
    fi
  fi
  for pid in $(port_pids "$KAFKA_PORT"); do
    if is_kafka "$pid" "$KAFKA_PROPS"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

kafka_running() { port_open "$KAFKA_HOST" "$KAFKA_PORT"; }

kafka_list_topics() {
  KAFKA_TOOL_TIMEOUT=30 kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" --list
}

# kafka_sasl_missing: the running broker has no SASL_SSL listener though one is configured
# (an install from before it existed).
kafka_sasl_missing() {
  [[ -n "$KAFKA_SASL_PORT" ]] || return 1
  ! port_open "$KAFKA_HOST" "$KAFKA_SASL_PORT"
}

kafka_start() {
  kafka_install
  [[ -z "$KAFKA_SASL_PORT" ]] || tls_setup
  if kafka_running && kafka_sasl_missing; then
    if kafka_pid >/dev/null; then
      # Upgrade in place: a brief restart with the new listener; $KAFKA_PORT comes back as it was.
      log "kafka: the running broker has no SASL_SSL listener on $KAFKA_HOST:$KAFKA_SASL_PORT: restarting it with one"
      kafka_stop
    else
      warn "kafka: no SASL_SSL listener on $KAFKA_HOST:$KAFKA_SASL_PORT and the broker on $KAFKA_PORT is not ours to restart"
    fi
  fi
  if kafka_running; then
    log "kafka: already listening on $KAFKA_HOST:$KAFKA_PORT, reusing it"
  else
    kafka_write_config
    kafka_format
    log "kafka: starting $KAFKA_VERSION (log: $KAFKA_LOG)"
    # shellcheck disable=SC2086
    (
      cd "$KAFKA_DIR"
      exec setsid nohup java $KAFKA_HEAP \
        -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
        -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
        -Dkafka.logs.dir="$KAFKA_DIR" -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
        -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_PROPS"
    ) </dev/null >>"$KAFKA_STDOUT" 2>&1 &
    echo $! >"$KAFKA_PIDFILE"
  fi
  local deadline=$((SECONDS + WAIT_SECONDS)) topics="" err=""
  while :; do
    if kafka_running && { [[ -z "$KAFKA_SASL_PORT" ]] || port_open "$KAFKA_HOST" "$KAFKA_SASL_PORT" || ! kafka_pid >/dev/null; } \
      && topics="$(kafka_list_topics 2>"$KAFKA_DIR/tool.err")"; then break; fi
    if ((SECONDS >= deadline)); then
      err="$(tail -n 3 "$KAFKA_DIR/tool.err" 2>/dev/null || true)"
      fail kafka "no metadata from $KAFKA_HOST:$KAFKA_PORT after ${WAIT_SECONDS}s${err:+ (admin tool: $err)}" "$KAFKA_LOG"
    fi
    if [[ -f "$KAFKA_PIDFILE" ]] && ! kafka_running && ! kill -0 "$(cat "$KAFKA_PIDFILE")" 2>/dev/null; then
      echo "infra: kafka stdout/stderr: $KAFKA_STDOUT" >&2
      tail -n 20 "$KAFKA_STDOUT" 2>/dev/null | sed 's/^/    /' >&2 || true
      fail kafka "broker process exited during start-up" "$KAFKA_LOG"
    fi
    sleep 1
  done
  kafka_create_topics "$topics"
  if [[ -n "$KAFKA_SASL_PORT" ]] && port_open "$KAFKA_HOST" "$KAFKA_SASL_PORT"; then
    kafka_scram_users
    log "kafka: SASL_SSL on $KAFKA_HOST:$KAFKA_SASL_PORT (user $KAFKA_SASL_USER, password file $TLS_DIR/kafka-$KAFKA_SASL_USER.password, CA $TLS_DIR/ca.pem)"
  fi
  log "kafka: up on $KAFKA_HOST:$KAFKA_PORT (topics: ${TOPICS[*]}; log: $KAFKA_LOG)"
}

# kafka_scram_users: the SASL user's SCRAM-SHA-512 and SCRAM-SHA-256 credentials, set with the
# admin API over the plaintext listener (kafka.admin.ConfigCommand). Skipped when they were
# set for this password and this cluster already (a marker file holds their digest).
kafka_scram_users() {
  local pw mark want
  pw="$(cat "$TLS_DIR/kafka-$KAFKA_SASL_USER.password")"
  mark="$KAFKA_DIR/scram-users.done"
  want="$(printf '%s %s %s' "$(cat "$KAFKA_CLUSTER_ID_FILE" 2>/dev/null)" "$KAFKA_SASL_USER" "$pw" | sha256sum | cut -d' ' -f1)"
  if [[ -f "$mark" && "$(cat "$mark")" == "$want" ]]; then return 0; fi
  log "kafka: setting SCRAM-SHA-512/256 credentials of user $KAFKA_SASL_USER"
  local out m
  # One mechanism per request: the broker refuses two changes of one user in one request.
  for m in SCRAM-SHA-512 SCRAM-SHA-256; do
    out="$(kafka_tool kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" --alter \
      --add-config "$m=[iterations=8192,password=$pw]" \
      --entity-type users --entity-name "$KAFKA_SASL_USER" 2>&1)" || fail kafka "setting $m credentials failed: $out" "$KAFKA_LOG"
  done
  echo "$want" >"$mark"
}

kafka_create_topics() {
  local existing="$1" t out
  for t in "${TOPICS[@]}"; do
    [[ -n "$t" ]] || continue
    if grep -qxF -- "$t" <<<"$existing"; then continue; fi
    log "kafka: creating topic $t (partitions=$TOPIC_PARTITIONS, rf=1)"
    out="$(kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" \
      --create --if-not-exists --topic "$t" --partitions "$TOPIC_PARTITIONS" --replication-factor 1 2>&1)" \
      || fail kafka "creating topic $t failed: $out" "$KAFKA_LOG"
  done
}

kafka_stop() {
  local pid
  if ! pid="$(kafka_pid)"; then
    if kafka_running; then
      warn "kafka: something listens on $KAFKA_PORT but it is not a kafka.Kafka started with $KAFKA_PROPS; leaving it"
      return 1
    fi
    rm -f "$KAFKA_PIDFILE"
    log "kafka: already down"
    return 0
  fi
  log "kafka: stopping (pid $pid, SIGTERM)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + WAIT_SECONDS))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      warn "kafka: pid $pid still running after ${WAIT_SECONDS}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 1
      break
    fi
    sleep 0.5
  done
  rm -f "$KAFKA_PIDFILE"
  log "kafka: down"
}

kafka_reset() {
  kafka_stop
  log "kafka: deleting $KAFKA_DATA (re-formatted by the next up)"
  rm -rf "$KAFKA_DATA" "$KAFKA_CLUSTER_ID_FILE" "$KAFKA_DIR/scram-users.done"
}

kafka_status() {
  local pid=""
  pid="$(kafka_pid 2>/dev/null || true)"
  if kafka_running; then
    local sasl=""
    if [[ -n "$KAFKA_SASL_PORT" ]]; then
      if port_open "$KAFKA_HOST" "$KAFKA_SASL_PORT"; then sasl=" SASL_SSL :$KAFKA_SASL_PORT"; else sasl=" SASL_SSL :$KAFKA_SASL_PORT down (run: $0 up)"; fi
    fi
    echo "infra: kafka    up    $KAFKA_HOST:$KAFKA_PORT${pid:+ (pid $pid)} (version $KAFKA_VERSION; log $KAFKA_LOG)${KAFKA_CHAOS_PORT:+ CHAOS listener :$KAFKA_CHAOS_PORT advertised as :$KAFKA_CHAOS_ADVERTISED_PORT}$sasl"
    return 0
  fi
  echo "infra: kafka    down  $KAFKA_HOST:$KAFKA_PORT"
  return 1
}

# ---------------------------------------------------------------- browser

# browser_install installs Debian's chromium unless a browser is there already; `make test`
# drives it headless (the console's browser test fails, saying how to install it, without).
browser_install() {
  if [[ -n "${OFTEST_CHROMIUM:-}" ]] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    return 0
  fi
  apt_install chromium
  command -v chromium >/dev/null 2>&1 || fail browser "apt-get install chromium left no chromium on the PATH"
}

# ---------------------------------------------------------------- the three-broker cluster

# shellcheck source=scripts/infra-cluster.sh
source "$ROOT/scripts/infra-cluster.sh"

# ---------------------------------------------------------------- the Galera cluster

# shellcheck source=scripts/infra-galera.sh
source "$ROOT/scripts/infra-galera.sh"

# ---------------------------------------------------------------- PostgreSQL

# shellcheck source=scripts/infra-postgres.sh
source "$ROOT/scripts/infra-postgres.sh"

# ---------------------------------------------------------------- main

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

main() {
  local cmd="${1:-}"
  mkdir -p "$RUN_DIR"
  case "$cmd" in
    up)
      need_root
      local t0=$SECONDS
      browser_install
      db_start
      ! pg_wanted || pg_start
      if cluster_mode; then cluster_up; else kafka_start; fi
      log "all up in $((SECONDS - t0))s"
      ;;
    down)
      need_root
      if cluster_mode; then cluster_down; else kafka_stop || true; fi
      db_stop
      ! pg_wanted || pg_stop
      ;;
    status)
      local rc=0
      db_status || rc=1
      ! pg_wanted || pg_status || rc=1
      if cluster_mode; then cluster_status || rc=1; else kafka_status || rc=1; fi
      exit $rc
      ;;
    reset)
      need_root
      kafka_reset
      db_reset stop
      log "reset done; both services are down (run: $0 up)"
      ;;
    db-start) db_start ;;
    db-stop) db_stop ;;
    pg-start) need_root; pg_start ;;
    pg-stop) need_root; pg_stop ;;
    kafka-start) kafka_start ;;
    kafka-stop) kafka_stop ;;
    cluster-up) cluster_up ;;
    cluster-down) cluster_down ;;
    cluster-status) cluster_status ;;
    cluster-reset) cluster_reset ;;
    cluster-start) cluster_node_start "${2:-}" ;;
    cluster-stop) cluster_check_node "${2:-}" && cluster_node_stop "$2" TERM ;;
    cluster-kill) cluster_check_node "${2:-}" && cluster_node_stop "$2" KILL ;;
    galera-up) galera_up ;;
    galera-down) galera_down ;;
    galera-status) galera_status ;;
    galera-reset) need_root; galera_reset ;;
    galera-start) galera_node_start "${2:-}" ;;
    galera-stop) need_root; galera_check_node "${2:-}" && galera_node_stop "$2" TERM ;;
    galera-kill) need_root; galera_check_node "${2:-}" && galera_node_stop "$2" KILL ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

# Sourced (compose_test.go reads the functions), it defines them and runs nothing.
[[ "${BASH_SOURCE[0]}" != "$0" ]] || main "$@"
