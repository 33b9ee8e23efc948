#!/usr/bin/env bash
# Side-by-side publish benchmark on this machine: a local three-node Runnev cluster (release
# build) and a 3-node NATS JetStream R3 file-stream cluster (bench/peers/nats.sh), both driven
# by the SAME Rust load generator (runnev_bench::publish: `runnev bench publish` for Runnev,
# `runnev-peer-bench nats` from the bench/ crate for NATS), 1 KiB payloads.
#
#   bench/compare.sh [ROUNDS] [--update-doc]
#
# ROUNDS (default 3) alternating rounds; each round starts fresh clusters and runs, per system
# (Runnev; NATS sync_interval: always; NATS default): c=64 plain, c=1 plain, c=64 with seq
# (one stream per worker), c=64 with 100 batches per request (Runnev: frames, SPEC §6, one
# request and one Raft entry; NATS: 100 async publishes sent back to back, then their 100
# PubAcks awaited, so both keep 6,400 publishes in flight), and for Runnev and NATS sync always an open loop (`--rate`, latency
# from each publish's scheduled time) at the round's rate: half of the Runnev c=64 plain maximum
# measured last before it (in odd rounds this round's, as Runnev runs first; in even rounds the
# previous round's), the same rate for both systems in a round. Even rounds run the systems in
# reverse order, so both see the same drift in background noise. Writes one JSON line per run to
# target/bench/results.jsonl, the medians table to target/bench/table.md, and prints it;
# --update-doc also replaces the section between <!-- results:start --> and <!-- results:end -->
# in BENCHMARKS.md with it.
#
# Needs bench/peers/install.sh run once (the NATS server in $PEERS_VENV, and jq). Not part of
# CI: it takes minutes and its figures depend on the machine.
#
# Env: PEERS_DIR (default bench/peers), PEERS_VENV (default target/peers/venv), NATS_DIR
# (default /tmp/runnev-bench-nats), OUT_DIR, COUNT64 (default 30000), COUNT1 (default 2000),
# DURATION_SECS (default 60, bound of each run), DOC (default BENCHMARKS.md), OPEN_SECS (default
# 15: each open-loop run schedules this many seconds of publishes), OPEN_CONCURRENCY (default 256:
# most open-loop publishes in flight), OPEN_RATE (batches/s: a fixed open-loop rate instead of
# half the measured maximum), FRAMES (default 100: batches per request of the frames load),
# COUNT_FRAMES (default 300000: batches of the frames load), SCALE (default 1; 0 skips the scale
# runs, about 10 minutes), FILL_BYTES (default 1GiB: the disk and restart fills), FAILOVER_TRIALS
# (default 20), STREAMS_ROUNDS (default 2), CATCHUP_BATCHES (default 200000), SUBSCRIBERS
# (default 1000), SUBSCRIBER_RATE (default 300 batches/s published while they read).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
UPDATE_DOC=0
for a in "$@"; do
  case "$a" in
    --update-doc) UPDATE_DOC=1 ;;
    -h | --help) sed -n 2,34p "$0"; exit 0 ;;
    *[!0-9]* | '') echo "unknown argument $a (usage: bench/compare.sh [ROUNDS] [--update-doc])" >&2; exit 2 ;;
    *) ROUNDS=$a ;;
  esac
done
[ "$ROUNDS" -ge 1 ] || { echo "ROUNDS must be at least 1" >&2; exit 2; }
PEERS=${PEERS_DIR:-bench/peers}
export PEERS_VENV=${PEERS_VENV:-$PWD/target/peers/venv}
# NATS keeps its data on the same filesystem as the Runnev cluster (mktemp -d /tmp/… below),
# so both pay the same fsync.
export NATS_DIR=${NATS_DIR:-/tmp/runnev-bench-nats}
OUT_DIR=${OUT_DIR:-target/bench}
# Kept from cargo's environment: build scripts (ring's, through cc) rerun when an OUT_DIR there
# changes, and would rebuild half the dependency tree.
export -n OUT_DIR
OUT=$OUT_DIR/results.jsonl
LOGS=$OUT_DIR/logs
COUNT64=${COUNT64:-30000}
COUNT1=${COUNT1:-2000}
DURATION_SECS=${DURATION_SECS:-60}
DOC=${DOC:-BENCHMARKS.md}
OPEN_SECS=${OPEN_SECS:-15}
OPEN_CONCURRENCY=${OPEN_CONCURRENCY:-256}
FRAMES=${FRAMES:-100}
COUNT_FRAMES=${COUNT_FRAMES:-300000}
PAYLOAD=1024
SCALE=${SCALE:-1}
FILL_BYTES=${FILL_BYTES:-1GiB}
FAILOVER_TRIALS=${FAILOVER_TRIALS:-20}
STREAMS_ROUNDS=${STREAMS_ROUNDS:-2}
CATCHUP_BATCHES=${CATCHUP_BATCHES:-200000}
SUBSCRIBERS=${SUBSCRIBERS:-1000}
SUBSCRIBER_RATE=${SUBSCRIBER_RATE:-300}
SCALE_OUT=$OUT_DIR/scale.jsonl
TCK=$(getconf CLK_TCK)
# The pids of the servers under load (the three Runnev nodes or NATS servers), for their CPU.
SERVER_PIDS=
# The open-loop rate of the current round, batches/s (set by open_rate on its first use).
ROUND_RATE=

command -v jq >/dev/null || { echo "needs jq ($PEERS/install.sh installs it)" >&2; exit 1; }
[ -x "$PEERS_VENV/bin/nats-server" ] || { echo "no NATS in $PEERS_VENV: run $PEERS/install.sh first" >&2; exit 1; }
mkdir -p "$LOGS"
: > "$OUT"
: > "$SCALE_OUT"

# One build of both packages (`runnev bench` runs runnev-bench from beside runnev): built
# separately, cargo would resolve features twice and build runnev's dependencies twice.
cargo build --release --locked -p runnev --bin runnev -p runnev-bench --bin runnev-bench --bin runnev-peer-bench
RUNNEV=target/release/runnev
PEER_BENCH=target/release/runnev-peer-bench
PORT=17001
NODES=http://127.0.0.1:$PORT,http://127.0.0.1:$((PORT + 1)),http://127.0.0.1:$((PORT + 2))

LOCAL_PID=
LOCAL_DIR=
cleanup() {
  if [ -n "$LOCAL_PID" ]; then kill -TERM "$LOCAL_PID" 2>/dev/null || true; wait "$LOCAL_PID" 2>/dev/null || true; fi
  [ -n "$LOCAL_DIR" ] && rm -rf "$LOCAL_DIR"
  "$PEERS/nats.sh" stop --wipe >/dev/null 2>&1 || true
}
trap cleanup EXIT

# open_rate: sets ROUND_RATE, unless set for this round: OPEN_RATE, else half of the last Runnev
# c=64 plain msgs/s in $OUT.
open_rate() {
  [ -n "$ROUND_RATE" ] && return 0
  if [ -n "${OPEN_RATE:-}" ]; then ROUND_RATE=$OPEN_RATE; return 0; fi
  ROUND_RATE=$(jq -rs '[.[] | select(.system == "runnev" and .mode == "plain" and .concurrency == 64)]
    | if length == 0 then "" else (last.msgs_per_sec / 2 | floor | tostring) end' "$OUT")
  [ -n "$ROUND_RATE" ] && [ "$ROUND_RATE" -gt 0 ] || {
    echo "no Runnev c=64 maximum measured yet to set the open-loop rate (set OPEN_RATE)" >&2; ROUND_RATE=; return 1; }
}

# open_loop ROUND SYSTEM CMD...: the open-loop load at the round's rate.
open_loop() {
  local round=$1 system=$2; shift 2
  open_rate || return 0
  run "$round" "$system" open "$OPEN_CONCURRENCY" $((ROUND_RATE * OPEN_SECS)) "$@" --rate "$ROUND_RATE"
}

# server_ticks: the user + system time, in clock ticks, of the processes in SERVER_PIDS.
server_ticks() {
  local t=0 p
  for p in $SERVER_PIDS; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}

# run ROUND SYSTEM MODE C COUNT CMD...: one load; appends its summary, tagged and with the
# servers' CPU over it (server_cpu_secs), to $OUT.
run() {
  local round=$1 system=$2 mode=$3 c=$4 count=$5; shift 5
  local extra=() log="$LOGS/r$round-$system-$mode-c$c.log" line before after
  [ "$mode" = seq ] && extra=(--with-seq)
  [ "$mode" = frames ] && extra=(--frames "$FRAMES")
  before=$(server_ticks)
  line=$("$@" --stream "b$round-$mode-c$c" --concurrency "$c" --count "$count" \
    --duration-secs "$DURATION_SECS" --payload-bytes "$PAYLOAD" --json "${extra[@]}" 2> "$log") || {
    echo "  $system $mode c=$c FAILED; see $log" >&2; tail -3 "$log" >&2; return 0; }
  after=$(server_ticks)
  jq -c --arg system "$system" --arg mode "$mode" --argjson round "$round" \
    --argjson cpu "$(awk -v t=$((after - before)) -v hz="$TCK" 'BEGIN {print t / hz}')" \
    '. + {system: $system, mode: $mode, round: $round, server_cpu_secs: $cpu}' <<< "$line" >> "$OUT"
  jq -r --arg s "$system" --arg m "$mode" \
    '"  \($s) \($m) c=\(.concurrency)\(if .rate then " rate=\(.rate)" else "" end): \(.msgs_per_sec|floor) msgs/s, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms, \(.errors) errors\(if .rate then ", \(.behind_schedule) behind schedule" else "" end), client CPU \(.client_cpu_secs) s"' \
    <<< "$line" >&2
}

loads() { # ROUND SYSTEM CMD...
  local round=$1 system=$2; shift 2
  run "$round" "$system" plain 64 "$COUNT64" "$@"
  run "$round" "$system" plain 1 "$COUNT1" "$@"
  run "$round" "$system" seq 64 "$COUNT64" "$@"
  run "$round" "$system" frames 64 "$COUNT_FRAMES" "$@"
}

# start_local LOG: a fresh `runnev local` cluster on $PORT.. in LOCAL_DIR (LOCAL_PID), once
# every node answers /readyz.
start_local() {
  local log=$1 ready=0
  LOCAL_DIR=$(mktemp -d /tmp/runnev-bench.XXXXXX)
  "$RUNNEV" local --dir "$LOCAL_DIR" --base-port "$PORT" > "$log" 2>&1 &
  LOCAL_PID=$!
  for _ in $(seq 1 200); do
    if "$RUNNEV" probe "http://127.0.0.1:$PORT/readyz" 2>/dev/null \
      && "$RUNNEV" probe "http://127.0.0.1:$((PORT + 1))/readyz" 2>/dev/null \
      && "$RUNNEV" probe "http://127.0.0.1:$((PORT + 2))/readyz" 2>/dev/null; then ready=1; break; fi
    sleep 0.1
  done
  [ $ready = 1 ] || { echo "runnev local not ready after 20 s; see $log" >&2; exit 1; }
}

stop_local() {
  kill -TERM "$LOCAL_PID"; wait "$LOCAL_PID" || true
  LOCAL_PID=
  rm -rf "$LOCAL_DIR"; LOCAL_DIR=
}

runnev_round() {
  local round=$1
  start_local "$LOGS/r$round-runnev-local.log"
  SERVER_PIDS=$(pgrep -f -- "serve .*--data-dir $LOCAL_DIR/" | tr '\n' ' ')
  loads "$round" runnev "$RUNNEV" bench publish --nodes "$NODES"
  open_loop "$round" runnev "$RUNNEV" bench publish --nodes "$NODES"
  SERVER_PIDS=
  stop_local
}

nats_round() {
  local round=$1 sync=$2
  "$PEERS/nats.sh" stop --wipe >/dev/null 2>&1 || true
  "$PEERS/nats.sh" start --sync "$sync" --no-stream > "$LOGS/r$round-nats-$sync.log" 2>&1 \
    || { echo "nats.sh start failed; see $LOGS/r$round-nats-$sync.log" >&2; exit 1; }
  # One pid per file, without a newline at its end.
  SERVER_PIDS=$(for f in "$NATS_DIR"/n*/nats.pid; do [ -s "$f" ] && echo "$(cat "$f")"; done | tr '\n' ' ')
  loads "$round" "nats-$sync" "$PEER_BENCH" nats
  [ "$sync" = always ] && open_loop "$round" "nats-$sync" "$PEER_BENCH" nats
  SERVER_PIDS=
  "$PEERS/nats.sh" stop --wipe >/dev/null 2>&1 || true
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  ROUND_RATE=
  if [ $((r % 2)) = 1 ]; then
    runnev_round "$r"; nats_round "$r" always; nats_round "$r" default
  else
    nats_round "$r" default; nats_round "$r" always; runnev_round "$r"
  fi
done

# measure NAME CMD...: one scale run; appends each JSON line it prints, tagged, to $SCALE_OUT.
measure() {
  local name=$1 log="$LOGS/scale-$1.log" lines; shift
  echo "scale: $name" >&2
  lines=$("$@" --json 2> "$log") || { echo "  scale $name FAILED; see $log" >&2; tail -3 "$log" >&2; return 0; }
  jq -c --arg m "$name" '. + {measure: $m}' <<< "$lines" >> "$SCALE_OUT"
}

scale_runs() {
  start_local "$LOGS/scale-runnev-local.log"
  measure streams "$RUNNEV" bench streams --nodes "$NODES" --many-streams 10000 --count 20000 \
    --concurrency 64 --rounds "$STREAMS_ROUNDS" --quiet
  measure catchup "$RUNNEV" bench catchup --nodes "$NODES" --batches "$CATCHUP_BATCHES"
  stop_local
  # The rest start clusters of their own.
  measure subscribers "$RUNNEV" bench subscribers --subscribers "$SUBSCRIBERS" --rate "$SUBSCRIBER_RATE" \
    --duration-secs 15
  measure disk "$RUNNEV" bench disk --fill-bytes "$FILL_BYTES" --frames 16
  measure failover "$RUNNEV" bench failover --trials "$FAILOVER_TRIALS"
  measure restart "$RUNNEV" bench restart --fill-bytes "$FILL_BYTES" --signal kill
}

[ "$SCALE" = 0 ] || scale_runs

MACHINE="$(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, Linux $(uname -r); loopback; NATS $("$PEERS_VENV/bin/nats-server" --version 2>/dev/null | head -1 | sed 's/^nats-server: //'); runnev $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo +changes)"
scale_arg=()
[ "$SCALE" = 0 ] || scale_arg=("$SCALE_OUT")
python3 bench/table.py "$OUT" "$ROUNDS" "$MACHINE" "${scale_arg[@]}" > "$OUT_DIR/table.md"
cat "$OUT_DIR/table.md"
if [ "$UPDATE_DOC" = 1 ]; then
  python3 bench/table.py --replace "$DOC" "$OUT_DIR/table.md"
  echo "updated the results section of $DOC" >&2
fi
