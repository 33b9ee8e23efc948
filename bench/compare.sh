#!/usr/bin/env bash
# Side-by-side publish benchmark on this machine: a local three-node Runnev cluster (release
# build) and a 3-node NATS JetStream R3 cluster (../shared/bench-peers), 1 KiB payloads,
# alternating rounds so both see the same background noise. Prints one JSON line per run and a
# table of medians.
#
#   bench/compare.sh [ROUNDS]        (default 3; needs ../shared/bench-peers/setup.sh run once)
#
# Load generators: Runnev is driven by `runnev bench` (Rust); NATS by the peers' pub_bench.py
# (Python, nats-py), which costs the client more CPU: a shared Rust generator is still to do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
PEERS=${PEERS_DIR:-../shared/bench-peers}
VENV=${PEERS_VENV:-/tmp/peers-venv}
OUT=${OUT:-target/bench/results.jsonl}
mkdir -p "$(dirname "$OUT")"
: > "$OUT"

cargo build --release --locked --bin runnev
RUNNEV=target/release/runnev
NODES=http://127.0.0.1:17001,http://127.0.0.1:17002,http://127.0.0.1:17003

runnev_round() {
  local dir; dir=$(mktemp -d)
  "$RUNNEV" local --dir "$dir" --base-port 17001 > "$dir/local.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do
    "$RUNNEV" probe http://127.0.0.1:17001/readyz 2>/dev/null && break; sleep 0.1
  done
  for spec in "64 30000 plain" "1 2000 plain" "64 30000 seq"; do
    set -- $spec
    local extra=(); [ "$3" = seq ] && extra=(--with-seq)
    "$RUNNEV" bench --nodes "$NODES" --stream "b$RANDOM" --concurrency "$1" --count "$2" --payload-bytes 1024 \
      --json "${extra[@]}" 2>/dev/null | jq -c --arg sys "runnev" --arg mode "$3" '. + {system: $sys, mode: $mode}' >> "$OUT"
  done
  kill -TERM "$pid"; wait "$pid" || true
  rm -rf "$dir"
}

nats_round() {
  local sync=$1
  "$PEERS/teardown.sh" nats --wipe >/dev/null 2>&1 || true
  "$PEERS/nats_r3.sh" --sync "$sync" >/dev/null
  for spec in "64 30000" "1 2000"; do
    set -- $spec
    "$VENV/bin/python" "$PEERS/pub_bench.py" nats -c "$1" -n "$2" -s 1024 --out '' 2>/dev/null \
      | tail -1 | jq -c --arg sys "nats-$sync" '. + {system: $sys, concurrency: '"$1"'}' >> "$OUT" || true
  done
  "$PEERS/teardown.sh" nats --wipe >/dev/null 2>&1 || true
}

for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  runnev_round
  nats_round always
  nats_round default
done
cat "$OUT"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def key(r):
    return (r.get("system"), r.get("mode", "plain"), r.get("concurrency"))
groups = {}
for r in rows:
    groups.setdefault(key(r), []).append(r)
def med(rs, *names):
    for n in names:
        vals = [r[n] for r in rs if isinstance(r.get(n), (int, float))]
        if vals:
            return statistics.median(vals)
    return float("nan")
print(f"{'system':<16} {'mode':<6} {'c':>3} {'runs':>4} {'msgs/s':>9} {'p50 ms':>7} {'p99 ms':>7}")
for k in sorted(groups, key=lambda k: (str(k[0]), str(k[1]), k[2] or 0)):
    rs = groups[k]
    print(f"{k[0]:<16} {k[1]:<6} {k[2]:>3} {len(rs):>4} {med(rs,'msgs_per_sec','msgs_per_s'):>9.0f} "
          f"{med(rs,'p50_ms'):>7.2f} {med(rs,'p99_ms'):>7.2f}")
PY
