#!/usr/bin/env bash
# Smoke test of deploy/docker-compose.yml: makes the cluster's credentials with deploy/secrets.sh
# in a directory of its own, brings the three-node cluster up under a project name of its own on
# free loopback ports, waits for all three healthchecks (/readyz through runnev probe over TLS),
# checks that plain HTTP and a request without a token are refused, publishes through one node
# over TLS with the admin token, reads it back through another, restarts a node and reads again,
# then removes everything (containers, network, volumes, credentials), also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  echo "compose-smoke.sh: neither docker-compose nor docker compose is installed" >&2
  exit 1
fi
PROJECT=rnvsmoke$$
# Three free loopback ports.
read -r RUNNEV_PORT1 RUNNEV_PORT2 RUNNEV_PORT3 < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)
export RUNNEV_PORT1 RUNNEV_PORT2 RUNNEV_PORT3
RUNNEV_SECRETS=$(mktemp -d "${TMPDIR:-/tmp}/runnev-compose-secrets.XXXXXX")
export RUNNEV_SECRETS
./deploy/secrets.sh "$RUNNEV_SECRETS"
# A second run changes nothing; with a file removed, it makes that file only.
made=$(cd "$RUNNEV_SECRETS" && sha256sum ./* | sort)
./deploy/secrets.sh "$RUNNEV_SECRETS" >/dev/null 2>&1
[[ "$(cd "$RUNNEV_SECRETS" && sha256sum ./* | sort)" == "$made" ]] ||
  { echo "compose-smoke.sh: a second deploy/secrets.sh changed the credentials" >&2; exit 1; }
rm "$RUNNEV_SECRETS/node-2.key"
./deploy/secrets.sh "$RUNNEV_SECRETS" >/dev/null 2>&1
[[ -s "$RUNNEV_SECRETS/node-2.key" && -s "$RUNNEV_SECRETS/node-1.key" ]] &&
  cmp -s <(grep -v node-2 <<<"$made") <(cd "$RUNNEV_SECRETS" && sha256sum ./* | sort | grep -v node-2) ||
  { echo "compose-smoke.sh: deploy/secrets.sh did not remake only the missing node-2 files" >&2; exit 1; }
C=("${COMPOSE[@]}" -p "$PROJECT" -f deploy/docker-compose.yml)
TOKEN=$(cat "$RUNNEV_SECRETS/admin.token")
# Every request: TLS verified against the cluster's CA, with the admin token.
api() { curl -fsS --cacert "$RUNNEV_SECRETS/ca.pem" -H "Authorization: Bearer $TOKEN" "$@"; }

cleanup() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    "${C[@]}" ps || true
    "${C[@]}" logs --tail 40 || true
  fi
  "${C[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$RUNNEV_SECRETS"
  exit $rc
}
trap cleanup EXIT

wait_healthy() {
  local i n
  for i in $(seq 1 120); do
    n=0
    for s in runnev1 runnev2 runnev3; do
      id=$("${C[@]}" ps -q "$s")
      [[ -n "$id" ]] && [[ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" == healthy ]] && n=$((n + 1))
    done
    if [[ $n -eq 3 ]]; then echo "all 3 healthy after ~$((i / 2)) s"; return 0; fi
    sleep 0.5
  done
  echo "compose-smoke.sh: the nodes did not all become healthy in 60 s" >&2
  return 1
}

echo "== ${C[*]} up -d (ports $RUNNEV_PORT1 $RUNNEV_PORT2 $RUNNEV_PORT3)"
"${C[@]}" up -d
wait_healthy
# Secure by default: no plain HTTP, no request without a token.
if curl -fsS -m 5 "http://127.0.0.1:$RUNNEV_PORT1/readyz" >/dev/null 2>&1; then
  echo "compose-smoke.sh: a node answered plain HTTP" >&2; exit 1
fi
code=$(curl -sS -o /dev/null -w '%{http_code}' --cacert "$RUNNEV_SECRETS/ca.pem" "https://127.0.0.1:$RUNNEV_PORT1/v1/cluster")
[[ "$code" == 401 ]] || { echo "compose-smoke.sh: a request without a token got $code, not 401" >&2; exit 1; }
echo "plain HTTP refused; no token: 401"
# The admin token becomes valid once the first leader has committed it: wait for it on node 2.
for _ in $(seq 1 40); do api -o /dev/null "https://127.0.0.1:$RUNNEV_PORT2/v1/streams" 2>/dev/null && break; sleep 0.5; done
api "https://127.0.0.1:$RUNNEV_PORT1/v1/cluster"; echo
api -X PUT "https://127.0.0.1:$RUNNEV_PORT2/v1/streams/smoke" >/dev/null
api -X POST "https://127.0.0.1:$RUNNEV_PORT3/v1/streams/smoke/batches?seq=7" --data-binary 'hello from compose'; echo
got=$(api "https://127.0.0.1:$RUNNEV_PORT1/v1/streams/smoke/batches?after=0&wait_ms=5000")
echo "$got"
grep -q "\"seq\":7" <<<"$got" && grep -q "$(printf 'hello from compose' | base64)" <<<"$got" \
  || { echo "compose-smoke.sh: node 1 does not serve the batch published on node 3" >&2; exit 1; }

echo "== restart runnev1 and read again"
"${C[@]}" restart runnev1 >/dev/null
wait_healthy
got=$(api "https://127.0.0.1:$RUNNEV_PORT1/v1/streams/smoke/batches?after=0")
grep -q "\"seq\":7" <<<"$got" || { echo "compose-smoke.sh: the batch is gone after a restart: $got" >&2; exit 1; }
echo "compose-smoke.sh: ok"
