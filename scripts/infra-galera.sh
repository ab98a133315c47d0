# shellcheck shell=bash
# A three-node MariaDB Galera cluster (Debian's galera-4 with mariadb-server) on loopback,
# beside (never instead of) the single node that `make test` uses. Sourced by
# scripts/infra.sh, which provides log, warn, fail, port_open, port_pids, apt_install,
# is_mariadbd, db_provision, db_app, MARIADBD, WAIT_SECONDS, RUN_DIR and the DEV_* variables.
#
#   galera-up              install what is missing, start the nodes that are not running
#                          (the first one with --wsrep-new-cluster when none runs), wait until
#                          all three are Synced, create the databases and users (idempotent)
#   galera-down            stop the three nodes (mariadb-admin shutdown)
#   galera-status          each node's state (exit 0 only when all three are Synced)
#   galera-reset           stop them and delete their data (initialised again by galera-up)
#   galera-start N / galera-stop N / galera-kill N   one node (1-3): join the running
#                          cluster (IST, else SST by rsync), shutdown, SIGKILL
#
# Node N listens for SQL on 127.0.0.1:(INFRA_GALERA_PORT + N - 1), INFRA_GALERA_PORT by default
# DEV_GALERA_PORT of deploy/dev/services.env (4306: nodes on 4306-4308); its
# group communication on SQL port + 20000, IST on + 21000, SST (rsync) on + 22000. Data,
# my.cnf, socket, pid file and log in <run dir>/galera/node-N. No TLS. Buffer pools are small
# (64M): three servers share the machine. Durability per node as the single node's
# (innodb_flush_log_at_trx_commit=1); a commit is acknowledged once its write set is
# certified by the cluster (synchronous replication, wsrep_sync_wait for causal reads).
# Users and grants as the single node's (db_provision); the app user's DSN for the cluster is
#   <app user>:<password>@tcp(127.0.0.1:4306,127.0.0.1:4307,127.0.0.1:4308)/<db>   (pkg/dbx)

GALERA_NODES=3
GALERA_PORT="${INFRA_GALERA_PORT:-$DEV_GALERA_PORT}"
GALERA_DIR="$RUN_DIR/galera"
GALERA_PROVIDER=/usr/lib/galera/libgalera_smm.so
GALERA_WAIT="${INFRA_GALERA_WAIT_SECONDS:-180}" # a joiner's SST can take a while

galera_port() { echo $((GALERA_PORT + $1 - 1)); }
galera_gcomm_port() { echo $((GALERA_PORT + 20000 + $1 - 1)); }
galera_node_dir() { echo "$GALERA_DIR/node-$1"; }
galera_sock() { echo "$(galera_node_dir "$1")/mysqld.sock"; }
galera_conf() { echo "$(galera_node_dir "$1")/my.cnf"; }
galera_log() { echo "$(galera_node_dir "$1")/mysqld.log"; }

galera_check_node() {
  [[ "$1" =~ ^[1-3]$ ]] || { echo "infra: galera node must be 1, 2 or 3 (got '${1:-}')" >&2; exit 2; }
}

galera_root() {
  local sock
  sock="$(galera_sock "$1")"
  shift
  mariadb --protocol=socket -S "$sock" -uroot --batch --skip-column-names "$@"
}

# galera_state N: wsrep_local_state of node N (4 = Synced), empty when it does not answer.
galera_state() {
  galera_root "$1" -e "SHOW GLOBAL STATUS LIKE 'wsrep_local_state'" 2>/dev/null | awk '{print $2}'
}

galera_install() {
  if [[ ! -x "$MARIADBD" ]] || ! command -v mariadb >/dev/null; then
    apt_install mariadb-server mariadb-client
  fi
  [[ -f "$GALERA_PROVIDER" ]] || apt_install galera-4
  command -v rsync >/dev/null || apt_install rsync
  [[ -f "$GALERA_PROVIDER" ]] || fail galera "apt-get install galera-4 left no $GALERA_PROVIDER"
}

galera_write_config() {
  local n="$1" dir addrs="" i
  dir="$(galera_node_dir "$n")"
  for i in $(seq 1 $GALERA_NODES); do addrs+="${addrs:+,}127.0.0.1:$(galera_gcomm_port "$i")"; done
  cat >"$dir/my.cnf" <<EOF
# Written by onceflow scripts/infra.sh (galera node $n of $GALERA_NODES); rewritten on every start.
[mysqld]
datadir                        = $dir/data
socket                         = $dir/mysqld.sock
pid-file                       = $dir/mysqld.pid
log-error                      = $dir/mysqld.log
bind-address                   = 127.0.0.1
port                           = $(galera_port "$n")
skip-name-resolve
max_connections                = 300
innodb_flush_log_at_trx_commit = 1
innodb_lock_wait_timeout       = 10
innodb_buffer_pool_size        = 64M
innodb_log_file_size           = 64M
innodb_autoinc_lock_mode       = 2
binlog_format                  = ROW
default_storage_engine         = InnoDB
character-set-server           = utf8mb4
collation-server               = utf8mb4_unicode_ci
wsrep_on                       = ON
wsrep_provider                 = $GALERA_PROVIDER
wsrep_cluster_name             = onceflow-galera-$GALERA_PORT
wsrep_cluster_address          = gcomm://$addrs
wsrep_node_name                = node$n
wsrep_node_address             = 127.0.0.1:$(galera_gcomm_port "$n")
wsrep_node_incoming_address    = 127.0.0.1:$(galera_port "$n")
wsrep_sst_method               = rsync
wsrep_sst_receive_address      = 127.0.0.1:$((GALERA_PORT + 22000 + n - 1))
wsrep_slave_threads            = 2
# A killed node is evicted after evs.suspect_timeout (10 s: the survivors' commits wait until
# then); a node stalled up to evs.inactive_timeout (30 s, as a loaded two-core host stalls) stays
# in the cluster instead of splitting it into non-primary parts;
# its write sets stay in a 128M gcache, so a node back soon catches up by IST.
wsrep_provider_options         = "gmcast.listen_addr=tcp://127.0.0.1:$(galera_gcomm_port "$n");ist.recv_addr=127.0.0.1:$((GALERA_PORT + 21000 + n - 1));gcache.size=128M;evs.suspect_timeout=PT10S;evs.inactive_timeout=PT30S;evs.inactive_check_period=PT1S"
EOF
  chmod 0644 "$dir/my.cnf"
}

# galera_pid N: the pid of node N's mariadbd (its pid files, else the process on its port,
# only when started with node N's my.cnf).
galera_pid() {
  local n="$1" dir pid
  dir="$(galera_node_dir "$n")"
  for pid in $(cat "$dir/mysqld.pid" "$dir/start.pid" 2>/dev/null) $(port_pids "$(galera_port "$n")"); do
    if is_mariadbd "$pid" "$(galera_conf "$n")"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

galera_any_running() {
  local i
  for i in $(seq 1 $GALERA_NODES); do galera_pid "$i" >/dev/null && return 0; done
  return 1
}

# galera_launch N [--wsrep-new-cluster]: start node N's mariadbd in the background.
galera_launch() {
  local n="$1" dir
  shift
  dir="$(galera_node_dir "$n")"
  if port_open 127.0.0.1 "$(galera_port "$n")" && ! galera_pid "$n" >/dev/null; then
    fail galera "127.0.0.1:$(galera_port "$n") is taken by another server: stop it or set INFRA_GALERA_PORT"
  fi
  mkdir -p "$dir/data"
  chown mysql:mysql "$dir" "$dir/data"
  touch "$dir/mysqld.log"
  chown mysql:mysql "$dir/mysqld.log"
  galera_write_config "$n"
  rm -f "$dir/start.pid" "$dir/mysqld.pid" "$dir/mysqld.sock"
  local pos
  if [[ $# == 0 ]] && pos="$(galera_recover "$n")"; then
    set -- "--wsrep-start-position=$pos"
  fi
  log "galera: starting node $n on 127.0.0.1:$(galera_port "$n")${1:+ ($1)} (log: $dir/mysqld.log)"
  start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "$dir/start.pid" --exec "$MARIADBD" -- \
    --defaults-file="$dir/my.cnf" --user=mysql "$@" \
    || fail galera "start-stop-daemon could not start node $n" "$dir/mysqld.log"
}

# galera_recover N: the position node N's InnoDB recovered to, after a crash left its
# grastate.dat without one (seqno -1): given to the start, the node asks for the missing
# write sets only (IST) instead of a full copy (SST). Fails when there is nothing to recover.
# The recovering server takes no clients (no TCP, a socket of its own) and is stopped if it
# lingers once it has said the position (or after 60 s).
galera_recover() {
  local n="$1" dir out pid said=0 deadline=$((SECONDS + 60))
  dir="$(galera_node_dir "$n")"
  [[ -f "$dir/data/grastate.dat" && -f "$dir/data/ibdata1" ]] || return 1
  grep -qE '^seqno:[[:space:]]+-1' "$dir/data/grastate.dat" || return 1
  : >"$dir/recover.log"
  chown mysql:mysql "$dir/recover.log"
  "$MARIADBD" --defaults-file="$dir/my.cnf" --user=mysql --wsrep-recover --skip-networking \
    --socket="$dir/recover.sock" --pid-file="$dir/recover.pid" --log-error="$dir/recover.log" >/dev/null 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if ((said == 0)) && grep -q 'Recovered position' "$dir/recover.log"; then
      said=1 deadline=$((SECONDS + 10))
    fi
    if ((SECONDS >= deadline)); then
      warn "galera: node $n's --wsrep-recover still running, SIGKILL (pid $pid)"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
  wait "$pid" 2>/dev/null || true
  out="$(grep -o 'Recovered position: [0-9a-f-]*:[0-9-]*' "$dir/recover.log" | tail -n 1 | awk '{print $3}')"
  [[ -n "$out" && "$out" != *:-1 ]] || return 1
  echo "$out"
}

# galera_wait_synced N: until node N answers and is Synced (bounded).
galera_wait_synced() {
  local n="$1" deadline=$((SECONDS + GALERA_WAIT)) st=""
  while :; do
    st="$(galera_state "$n" || true)"
    [[ "$st" == 4 ]] && return 0
    if ((SECONDS >= deadline)); then
      fail galera "node $n not Synced after ${GALERA_WAIT}s (wsrep_local_state=${st:-none})" "$(galera_log "$n")"
    fi
    if ! galera_pid "$n" >/dev/null; then
      fail galera "node $n exited during start-up" "$(galera_log "$n")"
    fi
    sleep 0.5
  done
}

# galera_bootstrap_node: the node to start a new cluster from when none runs: the one
# grastate.dat marks safe to bootstrap (the last one stopped), else the highest seqno (all
# killed), else node 1 (initialised here).
galera_bootstrap_node() {
  local i best=1 bestseq=-2 seq f
  for i in $(seq 1 $GALERA_NODES); do
    f="$(galera_node_dir "$i")/data/grastate.dat"
    [[ -f "$f" ]] || continue
    if grep -q '^safe_to_bootstrap: 1' "$f"; then
      echo "$i"
      return 0
    fi
    seq="$(awk '/^seqno:/{print $2}' "$f")"
    if [[ -n "$seq" ]] && ((seq > bestseq)); then best=$i bestseq=$seq; fi
  done
  f="$(galera_node_dir "$best")/data/grastate.dat"
  [[ -f "$f" ]] && sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$f"
  echo "$best"
}

galera_up() {
  need_root
  galera_install
  mkdir -p "$GALERA_DIR"
  local n b
  if ! galera_any_running; then
    b="$(galera_bootstrap_node)"
    local dir
    dir="$(galera_node_dir "$b")"
    if [[ ! -d "$dir/data/mysql" ]]; then
      mkdir -p "$dir/data"
      chown mysql:mysql "$dir" "$dir/data"
      log "galera: initialising node $b's datadir"
      mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" --auth-root-authentication-method=socket \
        >>"$dir/mysqld.log" 2>&1 || fail galera "mariadb-install-db for node $b failed" "$dir/mysqld.log"
    fi
    galera_launch "$b" --wsrep-new-cluster
    galera_wait_synced "$b"
  fi
  for n in $(seq 1 $GALERA_NODES); do
    galera_pid "$n" >/dev/null || galera_launch "$n"
  done
  for n in $(seq 1 $GALERA_NODES); do galera_wait_synced "$n"; done
  n="$(galera_first_synced)"
  local DB_SOCKET DB_LOG
  DB_SOCKET="$(galera_sock "$n")" DB_LOG="$(galera_log "$n")"
  db_provision
  local out
  out="$(db_app "$(galera_port 1)" -e 'SELECT @@wsrep_on' 2>&1)" \
    || fail galera "app user $DEV_APP_USER cannot connect to node 1 over TCP: $out" "$(galera_log 1)"
  log "galera: up on 127.0.0.1:$(galera_port 1),127.0.0.1:$(galera_port 2),127.0.0.1:$(galera_port 3) (cluster size $(galera_root "$n" -e "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'" | awk '{print $2}'))"
}

galera_first_synced() {
  local i
  for i in $(seq 1 $GALERA_NODES); do
    [[ "$(galera_state "$i")" == 4 ]] && { echo "$i"; return 0; }
  done
  fail galera "no node is Synced"
}

# galera_node_start N: node N joins the running cluster (IST from a donor's gcache when it
# can, else SST by rsync) and is Synced; with no node running, galera-up's bootstrap.
galera_node_start() {
  galera_check_node "${1:-}"
  need_root
  if galera_pid "$1" >/dev/null; then
    log "galera: node $1 already running"
  elif ! galera_any_running; then
    galera_up
    return
  else
    galera_launch "$1"
  fi
  galera_wait_synced "$1"
  log "galera: node $1 Synced"
}

# galera_node_stop N SIGNAL: TERM = shutdown (waits), KILL = SIGKILL.
galera_node_stop() {
  local n="$1" sig="$2" pid
  if ! pid="$(galera_pid "$n")"; then
    log "galera: node $n already down"
    return 0
  fi
  if [[ "$sig" == KILL ]]; then
    log "galera: node $n SIGKILL (pid $pid)"
    kill -KILL "$pid" 2>/dev/null || true
  else
    log "galera: stopping node $n (pid $pid)"
    mariadb-admin --protocol=socket -S "$(galera_sock "$n")" -uroot shutdown 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  fi
  local deadline=$((SECONDS + WAIT_SECONDS))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      warn "galera: node $n (pid $pid) still running after ${WAIT_SECONDS}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
}

galera_down() {
  need_root
  local n
  # The last one stopped is the one safe to bootstrap from next time.
  for n in 3 2 1; do galera_node_stop "$n" TERM; done
  log "galera: down"
}

galera_reset() {
  galera_down
  log "galera: deleting $GALERA_DIR"
  rm -rf "$GALERA_DIR"
}

galera_status() {
  local n rc=0 st size pid
  for n in $(seq 1 $GALERA_NODES); do
    pid="$(galera_pid "$n" 2>/dev/null || true)"
    st="$(galera_root "$n" -e "SHOW GLOBAL STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null | awk '{print $2}' || true)"
    size="$(galera_root "$n" -e "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'" 2>/dev/null | awk '{print $2}' || true)"
    if [[ "$st" == Synced ]]; then
      echo "infra: galera node $n up    127.0.0.1:$(galera_port "$n") (pid $pid, $st, cluster size $size; log $(galera_log "$n"))"
    else
      echo "infra: galera node $n down  127.0.0.1:$(galera_port "$n")${pid:+ (pid $pid, ${st:-not answering})}"
      rc=1
    fi
  done
  return $rc
}
