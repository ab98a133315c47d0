# shellcheck shell=bash
# A three-broker KRaft cluster of the same Apache Kafka, on loopback, beside (never instead
# of) the one-broker service that `make test` uses. Sourced by scripts/infra.sh, which
# provides log, warn, fail, port_open, port_pids, is_kafka, kafka_install, kafka_tool, the
# KAFKA_* paths and the DEV_* variables.
#
#   cluster-up            start the three nodes (formatting their storage the first time),
#                         wait until all three are registered, create the topics with
#                         replication factor 3 and min.insync.replicas=2 (idempotent)
#   cluster-down          stop the three nodes (SIGTERM: controlled shutdown)
#   cluster-status        up/down, pid and RSS of each node (exit 0 only when all three are up)
#   cluster-reset         stop them and delete their data (re-formatted by the next cluster-up)
#   cluster-start N / cluster-stop N / cluster-kill N   one node (1-3): start, SIGTERM, SIGKILL
#   INFRA_KAFKA_BROKERS=3 scripts/infra.sh up|down|status   MariaDB and the cluster
#                         (instead of the one broker; 1 or unset: the one broker)
#
# Every node is broker and controller (node.id 1-3, a static quorum of the three: any two
# keep it). Every topic the project creates here is replicated on all three with
# min.insync.replicas=2: the broker defaults (default.replication.factor=3,
# min.insync.replicas=2), the internal topics (offsets.topic.replication.factor=3,
# transaction.state.log.replication.factor=3, transaction.state.log.min.isr=2), the
# application topics (created here) and the relay's positions topic (the relay creates it
# with replication factor 3 and min.insync.replicas=2 on a cluster of three or more). No
# unclean leader election (Kafka's default). Clients use acks=all (pkg/kafkax, the relay).
#
# Environment (the defaults from deploy/dev/services.env):
#   INFRA_CLUSTER_PORT             first broker port (nodes on it and the next two), default
#                                  DEV_CLUSTER_PORT_1..3 (19092, 19093, 19094)
#   INFRA_CLUSTER_CONTROLLER_PORT  first controller port, default DEV_CLUSTER_CONTROLLER_PORT_1..3
#                                  (19192, 19193, 19194)
#   INFRA_CLUSTER_HEAP_OPTS        each node's heap, default DEV_CLUSTER_HEAP_OPTS
#   INFRA_TOPICS, INFRA_TOPIC_PARTITIONS, INFRA_RUN_DIR as for the one broker; data,
#   logs and pid files in <run dir>/kafka-cluster/node-N.

CLUSTER_NODES=3
CLUSTER_HEAP_OPTS="${INFRA_CLUSTER_HEAP_OPTS:-$DEV_CLUSTER_HEAP_OPTS}"
CLUSTER_DIR="$RUN_DIR/kafka-cluster"
CLUSTER_ID_FILE="$CLUSTER_DIR/cluster.id"

# cluster_nth_port FIRST KEY N: node N's port: FIRST + N - 1 when FIRST (an INFRA_* port) is
# given, else the data file's KEY<N>.
cluster_nth_port() {
  if [[ -n "$1" ]]; then
    echo $(($1 + $3 - 1))
  else
    local key="$2$3"
    echo "${!key}"
  fi
}
cluster_port() { cluster_nth_port "${INFRA_CLUSTER_PORT:-}" DEV_CLUSTER_PORT_ "$1"; }
cluster_ctrl_port() { cluster_nth_port "${INFRA_CLUSTER_CONTROLLER_PORT:-}" DEV_CLUSTER_CONTROLLER_PORT_ "$1"; }
cluster_node_dir() { echo "$CLUSTER_DIR/node-$1"; }
cluster_bootstrap() {
  local n out=""
  for n in $(seq 1 $CLUSTER_NODES); do out+="${out:+,}$KAFKA_HOST:$(cluster_port "$n")"; done
  echo "$out"
}

cluster_check_node() {
  [[ "$1" =~ ^[1-3]$ ]] || { echo "infra: cluster node must be 1, 2 or 3 (got '${1:-}')" >&2; exit 2; }
}

cluster_write_config() {
  local n="$1" dir voters="" i
  dir="$(cluster_node_dir "$n")"
  mkdir -p "$dir/data"
  for i in $(seq 1 $CLUSTER_NODES); do voters+="${voters:+,}$i@$KAFKA_HOST:$(cluster_ctrl_port "$i")"; done
  cat >"$dir/server.properties" <<EOF
# Written by onceflow scripts/infra.sh (cluster node $n of $CLUSTER_NODES); rewritten on every start.
process.roles=broker,controller
node.id=$n
listeners=PLAINTEXT://$KAFKA_HOST:$(cluster_port "$n"),CONTROLLER://$KAFKA_HOST:$(cluster_ctrl_port "$n")
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$(cluster_port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.quorum.voters=$voters
log.dirs=$dir/data
num.partitions=$TOPIC_PARTITIONS
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=12
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
num.network.threads=2
num.io.threads=4
log.retention.hours=168
log.segment.bytes=268435456
EOF
  cat >"$dir/log4j2.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <RollingFile name="server" fileName="$dir/server.log" filePattern="$dir/server.log.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="50 MB"/></Policies>
      <DefaultRolloverStrategy max="2"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
EOF
}

cluster_format() {
  local n="$1" dir cid
  dir="$(cluster_node_dir "$n")"
  [[ -f "$dir/data/meta.properties" ]] && return 0
  mkdir -p "$CLUSTER_DIR"
  if [[ ! -s "$CLUSTER_ID_FILE" ]]; then
    cid="$(kafka_tool kafka.tools.StorageTool random-uuid 2>>"$CLUSTER_DIR/tool.err" | tail -n 1)"
    [[ -n "$cid" ]] || fail kafka-cluster "StorageTool random-uuid failed" "$CLUSTER_DIR/tool.err"
    echo "$cid" >"$CLUSTER_ID_FILE"
  fi
  cid="$(cat "$CLUSTER_ID_FILE")"
  log "kafka-cluster: formatting node $n storage $dir/data (cluster id $cid)"
  kafka_tool kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" --ignore-formatted >>"$dir/stdout.log" 2>&1 \
    || fail kafka-cluster "StorageTool format (node $n) failed" "$dir/stdout.log"
}

# cluster_node_pid N: pid of node N (pid file, else the process on its port), only a
# kafka.Kafka started with that node's server.properties.
cluster_node_pid() {
  local n="$1" dir props pid
  dir="$(cluster_node_dir "$n")"
  props="$dir/server.properties"
  for pid in $(cat "$dir/kafka.pid" 2>/dev/null) $(port_pids "$(cluster_port "$n")"); do
    if is_kafka "$pid" "$props"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

cluster_node_launch() {
  local n="$1" dir
  dir="$(cluster_node_dir "$n")"
  if cluster_node_pid "$n" >/dev/null; then return 0; fi
  if port_open "$KAFKA_HOST" "$(cluster_port "$n")"; then
    fail kafka-cluster "port $(cluster_port "$n") is taken by something that is not node $n of $CLUSTER_DIR"
  fi
  cluster_write_config "$n"
  cluster_format "$n"
  log "kafka-cluster: starting node $n on $KAFKA_HOST:$(cluster_port "$n") (controller :$(cluster_ctrl_port "$n"), log $dir/server.log)"
  # shellcheck disable=SC2086
  (
    cd "$dir"
    exec setsid nohup java $CLUSTER_HEAP_OPTS \
      -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
      -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
      -Dkafka.logs.dir="$dir" -Dlog4j2.configurationFile="$dir/log4j2.xml" \
      -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties"
  ) </dev/null >>"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/kafka.pid"
}

# cluster_wait_node N: until node N answers metadata requests (bounded).
cluster_wait_node() {
  local n="$1" dir deadline=$((SECONDS + WAIT_SECONDS))
  dir="$(cluster_node_dir "$n")"
  until port_open "$KAFKA_HOST" "$(cluster_port "$n")" \
    && KAFKA_TOOL_TIMEOUT=30 kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_HOST:$(cluster_port "$n")" --list >/dev/null 2>"$dir/tool.err"; do
    if ((SECONDS >= deadline)); then
      fail kafka-cluster "node $n: no metadata from $KAFKA_HOST:$(cluster_port "$n") after ${WAIT_SECONDS}s" "$dir/server.log"
    fi
    if ! cluster_node_pid "$n" >/dev/null && ! port_open "$KAFKA_HOST" "$(cluster_port "$n")"; then
      tail -n 20 "$dir/stdout.log" 2>/dev/null | sed 's/^/    /' >&2 || true
      fail kafka-cluster "node $n exited during start-up" "$dir/server.log"
    fi
    sleep 1
  done
}

cluster_create_topics() {
  local t out existing deadline=$((SECONDS + WAIT_SECONDS))
  existing="$(KAFKA_TOOL_TIMEOUT=30 kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(cluster_bootstrap)" --list 2>/dev/null || true)"
  for t in "${TOPICS[@]}"; do
    [[ -n "$t" ]] || continue
    if grep -qxF -- "$t" <<<"$existing"; then continue; fi
    log "kafka-cluster: creating topic $t (partitions=$TOPIC_PARTITIONS, rf=3, min.insync.replicas=2)"
    # Retried: right after a start the controller may not count all three brokers yet.
    until out="$(kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(cluster_bootstrap)" \
      --create --if-not-exists --topic "$t" --partitions "$TOPIC_PARTITIONS" --replication-factor 3 \
      --config min.insync.replicas=2 2>&1)"; do
      ((SECONDS < deadline)) || fail kafka-cluster "creating topic $t failed: $out" "$(cluster_node_dir 1)/server.log"
      sleep 2
    done
  done
}

cluster_up() {
  kafka_install
  mkdir -p "$CLUSTER_DIR"
  local n
  for n in $(seq 1 $CLUSTER_NODES); do cluster_node_launch "$n"; done
  for n in $(seq 1 $CLUSTER_NODES); do cluster_wait_node "$n"; done
  cluster_create_topics
  log "kafka-cluster: up on $(cluster_bootstrap) (topics: ${TOPICS[*]}; rf 3, min.insync.replicas 2)"
}

cluster_node_start() {
  cluster_check_node "$1"
  kafka_install
  cluster_node_launch "$1"
  cluster_wait_node "$1"
  log "kafka-cluster: node $1 up on $KAFKA_HOST:$(cluster_port "$1")"
}

# cluster_node_stop N SIGNAL: SIGTERM (controlled shutdown, SIGKILL after the bounded wait)
# or SIGKILL (a crash); returns once the process is gone.
cluster_node_stop() {
  cluster_check_node "$1"
  local n="$1" sig="${2:-TERM}" pid
  if ! pid="$(cluster_node_pid "$n")"; then
    log "kafka-cluster: node $n already down"
    return 0
  fi
  log "kafka-cluster: node $n: SIG$sig (pid $pid)"
  kill "-$sig" "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + WAIT_SECONDS))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      warn "kafka-cluster: node $n (pid $pid) still running after ${WAIT_SECONDS}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 30))
    fi
    sleep 0.2
  done
  rm -f "$(cluster_node_dir "$n")/kafka.pid"
}

# cluster_down: SIGTERM to every node at once (a node that stops last has no quorum left
# for a controlled shutdown: it gets SIGKILL after 30 s; its log is recovered at the next
# start), then wait for all of them.
cluster_down() {
  local n pid pids=()
  for n in $(seq 1 $CLUSTER_NODES); do
    if pid="$(cluster_node_pid "$n")"; then
      log "kafka-cluster: node $n: SIGTERM (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local deadline=$((SECONDS + 30))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        warn "kafka-cluster: pid $pid still running after 30s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
        break
      fi
      sleep 0.2
    done
  done
  for n in $(seq 1 $CLUSTER_NODES); do rm -f "$(cluster_node_dir "$n")/kafka.pid"; done
  log "kafka-cluster: down"
}

cluster_reset() {
  cluster_down
  log "kafka-cluster: deleting $CLUSTER_DIR data (re-formatted by the next cluster-up)"
  local n
  for n in $(seq 1 $CLUSTER_NODES); do rm -rf "$(cluster_node_dir "$n")/data"; done
  rm -f "$CLUSTER_ID_FILE"
}

cluster_status() {
  local n pid rc=0 rss
  for n in $(seq 1 $CLUSTER_NODES); do
    if pid="$(cluster_node_pid "$n")" && port_open "$KAFKA_HOST" "$(cluster_port "$n")"; then
      rss="$(awk '/^VmRSS:/{printf "%d MiB", $2/1024}' "/proc/$pid/status" 2>/dev/null)"
      echo "infra: kafka-cluster node $n up    $KAFKA_HOST:$(cluster_port "$n") (pid $pid, RSS ${rss:-?}, data $(cluster_node_dir "$n")/data)"
    else
      echo "infra: kafka-cluster node $n down  $KAFKA_HOST:$(cluster_port "$n")"
      rc=1
    fi
  done
  return $rc
}

# cluster_mode: INFRA_KAFKA_BROKERS, a broker count, is 3.
cluster_mode() {
  case "${INFRA_KAFKA_BROKERS:-1}" in
    1) return 1 ;;
    3) return 0 ;;
    *) echo "infra: INFRA_KAFKA_BROKERS=$INFRA_KAFKA_BROKERS: 1 (the one broker) or 3 (the cluster)" >&2; exit 2 ;;
  esac
}
