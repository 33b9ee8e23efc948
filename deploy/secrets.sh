#!/usr/bin/env bash
# Makes the credentials of a three-node Runnev deployment, once:
#
#   deploy/secrets.sh [DIR]          # default: deploy/secrets (ignored by git)
#
# DIR/ca.pem and DIR/ca.key         the cluster CA (keep ca.key offline; no node needs it)
# DIR/node-N.pem, DIR/node-N.key    node N's certificate, naming node id N and the host names it
#                                   is reached at: runnevN (Compose), runnev-(N-1).runnev-peers
#                                   and its .NAMESPACE.svc.cluster.local form (Kubernetes),
#                                   localhost and 127.0.0.1 (probes), $RUNNEV_EXTRA_HOSTS (names every
#                                   node shares, a load balancer's), and $RUNNEV_NODE_N_HOSTS (node N's
#                                   own names: RUNNEV_NODE_1_HOSTS="db1.example.com 10.0.0.11")
# DIR/admin.token                   the cluster's first admin token (every node's --admin-token-file)
#
# Keys and the token are mode 0600. The image runs as uid 10001: run this as root (as CI does)
# and they are given to uid 10001 for the Compose bind mounts; otherwise give them yourself
# (`sudo chown 10001:10001 DIR/node-*.key DIR/admin.token`). Kubernetes reads them from a Secret
# instead (docs/security.md). Nothing is overwritten: a run on a DIR that has them makes only what
# is missing (a node whose certificate or key is missing gets both anew from the same CA; a
# missing admin.token is a new token, which only a cluster that never had one takes as its admin).
#
# It runs `runnev cert` from $RUNNEV_BIN, else target/release/runnev, else `runnev` on PATH, else
# the image ($RUNNEV_IMAGE, default runnev:local) under docker.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-deploy/secrets}
NODES=${RUNNEV_NODE_COUNT:-3}
NAMESPACE=${RUNNEV_K8S_NAMESPACE:-default}
IMAGE=${RUNNEV_IMAGE:-runnev:local}

mkdir -p "$DIR"
chmod 0700 "$DIR"
DIR=$(cd "$DIR" && pwd)
if [[ -e "$DIR/ca.pem" && ! -e "$DIR/ca.key" ]]; then
  echo "secrets.sh: $DIR/ca.pem exists without its ca.key: cannot sign anything new there" >&2
  exit 1
fi

if [[ -n "${RUNNEV_BIN:-}" ]]; then
  runnev() { "$RUNNEV_BIN" "$@"; }
elif [[ -x target/release/runnev ]]; then
  runnev() { target/release/runnev "$@"; }
elif command -v runnev >/dev/null; then
  runnev() { command runnev "$@"; }
else
  # The image has only runnev: run it as the caller, writing into DIR through a bind mount.
  runnev() { docker run --rm --user "$(id -u):$(id -g)" -v "$DIR:$DIR" --entrypoint /usr/local/bin/runnev "$IMAGE" "$@"; }
fi

[[ -e "$DIR/ca.pem" ]] || runnev cert create-ca --dir "$DIR"
for ((n = 1; n <= NODES; n++)); do
  [[ -e "$DIR/node-$n.pem" && -e "$DIR/node-$n.key" ]] && continue
  rm -f "$DIR/node-$n.pem" "$DIR/node-$n.key"
  hosts=(--host "runnev$n" --host "runnev-$((n - 1)).runnev-peers"
    --host "runnev-$((n - 1)).runnev-peers.$NAMESPACE.svc.cluster.local" --host localhost --host 127.0.0.1)
  own="RUNNEV_NODE_${n}_HOSTS"
  for h in ${RUNNEV_EXTRA_HOSTS:-} ${!own:-}; do hosts+=(--host "$h"); done
  runnev cert create-node --dir "$DIR" --id "$n" "${hosts[@]}"
done
[[ -e "$DIR/admin.token" ]] || runnev cert create-admin-token --dir "$DIR"
if [[ "$(id -u)" == 0 ]]; then
  chown 10001:10001 "$DIR"/node-*.key "$DIR/admin.token"
  echo "secrets.sh: node keys and admin.token now belong to uid 10001 (the image's user)"
fi
echo "secrets.sh: wrote $DIR"
