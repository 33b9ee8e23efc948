#!/usr/bin/env bash
# A/B of two runnev builds on this machine: the c=64 publish rate and the server CPU per
# acknowledged publish (user + system time of the three nodes, from /proc/PID/stat), one build
# after the other in alternating order, each on a fresh `runnev local` cluster of its own.
#
#   bench/ab-cpu.sh OLD_RUNNEV NEW_RUNNEV [ROUNDS]
#
# OLD_RUNNEV, NEW_RUNNEV: the `runnev` executables to compare (build each tree with
# `cargo build --release`, e.g. one in a `git worktree` of the base commit). ROUNDS (default 3)
# pairs, run old, new, new, old, old, new, … so both see the same drift of background noise.
# Prints a line per run: build, msgs/s, p50 ms, server CPU µs per publish. The load generator
# is the runnev-bench next to NEW_RUNNEV (`cargo build --release -p runnev-bench`).
#
# Env: COUNT (default 30000 batches per run, after WARM to warm up), CONCURRENCY (default 64),
# FRAMES (batches per request, SPEC §6; default 1: one batch a request; the CPU is then per
# batch), RATE (batches per second: an open-loop run on a fixed schedule, latency from the
# scheduled time, each line then adds p99 and p99.9; use CONCURRENCY=256 so the schedule is kept),
# WARM (default 5000 batches at c=64 first), BASE_PORT (default 7600), DIR (default /tmp/runnev-ab).
# Not part of CI: it takes minutes and its figures depend on the machine.
set -euo pipefail

old=${1:?usage: bench/ab-cpu.sh OLD_RUNNEV NEW_RUNNEV [ROUNDS]}
new=${2:?usage: bench/ab-cpu.sh OLD_RUNNEV NEW_RUNNEV [ROUNDS]}
rounds=${3:-3}
bench="$(dirname "$new")/runnev-bench"
count=${COUNT:-30000}
concurrency=${CONCURRENCY:-64}
load=()
[ "${FRAMES:-1}" -gt 1 ] && load=(--frames "$FRAMES")
[ -n "${RATE:-}" ] && load+=(--rate "$RATE")
warm=${WARM:-5000}
base=${BASE_PORT:-7600}
dir=${DIR:-/tmp/runnev-ab}
tck=$(getconf CLK_TCK)
[ -x "$bench" ] || { echo "no $bench: cargo build --release -p runnev-bench" >&2; exit 1; }

order=()
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order+=(old new); else order+=(new old); fi
done

# Sum of utime + stime, in clock ticks, of the processes in "$@".
ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}

run=0
for which in "${order[@]}"; do
  run=$((run + 1))
  bin=$old
  [ "$which" = new ] && bin=$new
  data="$dir/$run"
  port=$((base + run * 10))
  rm -rf "$data"
  "$bin" local --dir "$data" --base-port "$port" >"$dir-$run.log" 2>&1 &
  local_pid=$!
  nodes="http://127.0.0.1:$port,http://127.0.0.1:$((port + 1)),http://127.0.0.1:$((port + 2))"
  for _ in $(seq 1 150); do
    ready=0
    for p in "$port" $((port + 1)) $((port + 2)); do
      curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && ready=$((ready + 1))
    done
    [ "$ready" = 3 ] && break
    sleep 0.2
  done
  "$bench" publish --nodes "$nodes" --concurrency 64 --count "$warm" >/dev/null 2>&1
  mapfile -t pids < <(pgrep -f "runnev serve.*--data-dir $data/")
  before=$(ticks "${pids[@]}")
  summary=$("$bench" publish --nodes "$nodes" --concurrency "$concurrency" --count "$count" "${load[@]}" --json 2>/dev/null | tail -1)
  after=$(ticks "${pids[@]}")
  read -r rate p50 p99 p999 < <(echo "$summary" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["msgs_per_sec"]), d["p50_ms"], d["p99_ms"], d["p999_ms"])')
  tail=""
  [ -n "${RATE:-}" ] && tail=", p99 $p99 ms, p99.9 $p999 ms"
  echo "run $run $which: $rate msgs/s, p50 $p50 ms$tail, server CPU $(((after - before) * 1000000 / tck / count)) us per publish"
  kill "$local_pid"
  wait "$local_pid" 2>/dev/null || true
  rm -rf "$data"
done
