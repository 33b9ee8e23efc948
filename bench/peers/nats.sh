#!/usr/bin/env bash
# A three-node NATS JetStream cluster on 127.0.0.1, the peer bench/compare.sh measures Runnev
# against, with an R3 file-storage stream for the load.
#
#   bench/peers/nats.sh start [--sync always|default] [--stream NAME] [--subjects PATTERN] [--no-stream]
#   bench/peers/nats.sh stop [--wipe]
#   bench/peers/nats.sh status
#
# start   writes one config per node under $NATS_DIR/nN, starts the three servers in the
#         background and waits (at most 60 s) until each is healthy and JetStream has a meta
#         leader; then checks that each server runs with the fsync setting asked for, and creates
#         the stream (default BENCH, subjects bench.>, 3 replicas, file storage: what
#         runnev-peer-bench uses) and waits until its replicas are current. Refuses to start over
#         a running cluster of its own; wipes the previous data.
#           --sync always    JetStream fsyncs every write before it acknowledges it
#                            (`sync_interval: always`), as Runnev does: the durable comparison.
#           --sync default   the server's default: acknowledged once a quorum holds the write in
#                            memory, fsynced every two minutes.
#           --no-stream      start the servers only (runnev-peer-bench creates its stream itself).
# stop    stops only the servers this script started: each pid comes from the server's own pid
#         file and is signalled only if /proc/PID/cmdline names this cluster's config. SIGTERM,
#         then SIGKILL after 10 s. --wipe also deletes $NATS_DIR.
# status  prints each node's pid and whether it runs.
#
# Ports (loopback only): clients 14222-14224 (runnev-peer-bench's default --servers), routes
# between the servers 14322-14324, monitoring 14422-14424.
# Env: PEERS_VENV (default target/peers/venv, from install.sh), NATS_DIR (default
# target/peers/nats).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${PEERS_VENV:-$ROOT/target/peers/venv}
DIR=${NATS_DIR:-$ROOT/target/peers/nats}
BIN=$VENV/bin/nats-server
NODES=(1 2 3)
client_port() { echo $((14221 + $1)); }
route_port() { echo $((14321 + $1)); }
monitor_port() { echo $((14421 + $1)); }

usage() { sed -n 5,7p "$0" | sed 's/^# *//' >&2; exit 2; }

# The pid in node N's pid file if that process is one of ours and alive, else nothing.
our_pid() {
  local n=$1 pid_file="$DIR/n$1/nats.pid" pid
  [ -s "$pid_file" ] || return 0
  pid=$(cat "$pid_file")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  [ -r "/proc/$pid/cmdline" ] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$DIR/n$n/nats.conf"; then echo "$pid"; fi
}

# Deleting $DIR is safe only if it is this script's: absent, empty, or holding its node configs.
check_dir_is_ours() {
  case "$DIR" in /*/*) ;; *) echo "NATS_DIR must be an absolute path at least two levels deep (like /tmp/runnev-nats), not '$DIR'" >&2; exit 2 ;; esac
  if [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && [ ! -f "$DIR/n1/nats.conf" ]; then
    echo "$DIR holds files that are not this script's; set NATS_DIR to another directory" >&2
    exit 1
  fi
}

stop_cluster() {
  local wipe=$1 n pid
  for n in "${NODES[@]}"; do
    pid=$(our_pid "$n")
    if [ -z "$pid" ]; then
      rm -f "$DIR/n$n/nats.pid"
      continue
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "nats n$n (pid $pid) still runs 10 s after SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/n$n/nats.pid"
    echo "stopped nats n$n (pid $pid)"
  done
  if [ "$wipe" = 1 ]; then check_dir_is_ours; rm -rf "$DIR"; fi
}

start_cluster() {
  local sync=$1 stream=$2 subjects=$3 make_stream=$4 n deadline sync_line routes
  case "$sync" in always | default) ;; *) echo "--sync is always or default, not $sync" >&2; exit 2 ;; esac
  [ -x "$BIN" ] || { echo "no nats-server in $VENV: run bench/peers/install.sh first" >&2; exit 1; }
  command -v jq >/dev/null || { echo "needs jq: run bench/peers/install.sh first" >&2; exit 1; }
  for n in "${NODES[@]}"; do
    if [ -n "$(our_pid "$n")" ]; then
      echo "nats n$n already runs (pid $(our_pid "$n")); run: $0 stop" >&2
      exit 1
    fi
  done
  check_dir_is_ours
  rm -rf "$DIR"
  sync_line=""
  [ "$sync" = always ] && sync_line="sync_interval: always"
  routes=""
  for n in "${NODES[@]}"; do routes+="${routes:+, }nats-route://127.0.0.1:$(route_port "$n")"; done
  for n in "${NODES[@]}"; do
    mkdir -p "$DIR/n$n/store"
    cat > "$DIR/n$n/nats.conf" <<CONF
server_name: runnev-peer-n$n
listen: 127.0.0.1:$(client_port "$n")
http: 127.0.0.1:$(monitor_port "$n")
pid_file: "$DIR/n$n/nats.pid"
jetstream {
  store_dir: "$DIR/n$n/store"
  $sync_line
}
cluster {
  name: runnev-peers
  listen: 127.0.0.1:$(route_port "$n")
  routes: [ $routes ]
}
CONF
    # A session of its own, so the server outlives this script and a terminal's Ctrl-C.
    setsid "$BIN" -c "$DIR/n$n/nats.conf" < /dev/null > "$DIR/n$n/server.log" 2>&1 &
  done
  echo "nats $("$BIN" --version | sed 's/^nats-server: //'), sync $sync, data under $DIR"

  deadline=$((SECONDS + 60))
  for n in "${NODES[@]}"; do
    until [ -n "$(our_pid "$n")" ] && curl -fsS "http://127.0.0.1:$(monitor_port "$n")/healthz" > /dev/null 2>&1; do
      if [ $SECONDS -ge $deadline ]; then
        echo "nats n$n is not healthy after 60 s; see $DIR/n$n/server.log" >&2
        exit 1
      fi
      sleep 0.2
    done
  done
  until curl -fsS "http://127.0.0.1:$(monitor_port 1)/jsz" | jq -e '.meta_cluster.leader // empty' > /dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "JetStream has no meta leader after 60 s" >&2; exit 1; fi
    sleep 0.2
  done
  # The comparison is only fair if the setting took: check what each server reports.
  for n in "${NODES[@]}"; do
    local always
    always=$(curl -fsS "http://127.0.0.1:$(monitor_port "$n")/varz" | jq -r '.jetstream.config.sync_always // false')
    if { [ "$sync" = always ] && [ "$always" != true ]; } || { [ "$sync" = default ] && [ "$always" = true ]; }; then
      echo "nats n$n reports sync_always=$always, but --sync $sync was asked for" >&2
      exit 1
    fi
  done
  if [ "$make_stream" = 1 ]; then
    "$VENV/bin/python" "$HERE/nats_stream.py" --servers "$(servers)" --stream "$stream" --subjects "$subjects"
  fi
  echo "nats ready: $(servers)"
}

servers() {
  local n out=""
  for n in "${NODES[@]}"; do out+="${out:+,}nats://127.0.0.1:$(client_port "$n")"; done
  echo "$out"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  start)
    sync=default stream=BENCH subjects='bench.>' make_stream=1
    while [ $# -gt 0 ]; do
      case "$1" in
        --sync) sync=${2:?--sync needs always or default}; shift 2 ;;
        --stream) stream=${2:?--stream needs a name}; shift 2 ;;
        --subjects) subjects=${2:?--subjects needs a pattern}; shift 2 ;;
        --no-stream) make_stream=0; shift ;;
        *) usage ;;
      esac
    done
    start_cluster "$sync" "$stream" "$subjects" "$make_stream"
    ;;
  stop)
    wipe=0
    while [ $# -gt 0 ]; do
      case "$1" in
        --wipe) wipe=1; shift ;;
        *) usage ;;
      esac
    done
    stop_cluster "$wipe"
    ;;
  status)
    for n in "${NODES[@]}"; do
      pid=$(our_pid "$n")
      if [ -n "$pid" ]; then echo "nats n$n: running, pid $pid, nats://127.0.0.1:$(client_port "$n")"; else echo "nats n$n: stopped"; fi
    done
    ;;
  *) usage ;;
esac
