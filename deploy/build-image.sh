#!/usr/bin/env bash
# Builds the Runnev container image with no registry and tags it runnev:local (or $RUNNEV_IMAGE).
#
#   deploy/build-image.sh            # cargo build --release, assemble the rootfs, docker build
#   RUNNEV_BIN=path deploy/build-image.sh   # use an already built binary instead of building
#
# The Docker engine here has no images and cannot pull any, so the image is FROM scratch: the
# release binary is built on the host, and the shared libraries `ldd` lists (plus the dynamic
# loader) are copied next to it. glibc >= 2.34 has the `files` and `dns` name services built into
# libc.so.6, so Compose/Kubernetes host names resolve with no libnss_* module; /etc/nsswitch.conf
# says `hosts: files dns`, and Docker provides /etc/hosts and /etc/resolv.conf at run time.
# The script checks, inside a container, that the binary runs and that a host name resolves.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
IMAGE=${RUNNEV_IMAGE:-runnev:local}

log() { printf '\n== %s\n' "$*"; }

command -v docker >/dev/null || { echo "build-image.sh: docker CLI not found" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-image.sh: no Docker engine reachable (docker info failed)" >&2; exit 1; }

if [[ -n "${RUNNEV_BIN:-}" ]]; then
  BIN=$RUNNEV_BIN
else
  # With the simulation selected too, cargo resolves dependency features as the simulation's
  # release tests do (`scripts/test` runs them first), so those builds are reused: runnev alone
  # enables fewer features of rand and num-traits and rebuilds openraft and runnev for them.
  log "cargo build --release --locked -p runnev -p simulation --bin runnev"
  cargo build --release --locked -p runnev -p simulation --bin runnev
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/runnev
fi
[[ -x "$BIN" ]] || { echo "build-image.sh: no executable at $BIN" >&2; exit 1; }

CTX=${CARGO_TARGET_DIR:-$ROOT/target}/deploy-image
rm -rf "$CTX"
mkdir -p "$CTX/rootfs/usr/local/bin" "$CTX/rootfs/etc" "$CTX/rootfs/tmp" "$CTX/data"
chmod 1777 "$CTX/rootfs/tmp"
cp deploy/Dockerfile "$CTX/Dockerfile"

log "assembling the root filesystem in $CTX"
# Debug info stays on the host binary; the image gets a copy without it (symbols are kept, so
# panics still show function names).
objcopy --strip-debug "$BIN" "$CTX/rootfs/usr/local/bin/runnev"
# Health checks use `runnev probe URL` (no curl/wget in a scratch image). One std-only helper,
# built with plain rustc: the StatefulSet launcher (node id = pod ordinal + 1) for Kubernetes.
rustc --edition 2021 -O -C strip=symbols deploy/statefulset-launcher.rs \
  -o "$CTX/rootfs/usr/local/bin/runnev-statefulset"

# Every shared library either program needs, at the path the loader will look for it.
copy_libs() {
  local exe=$1 line path
  while read -r line; do
    case "$line" in
      *"=> not found"*) echo "build-image.sh: $exe: $line" >&2; exit 1 ;;
      *"=> /"*) path=${line#*=> }; path=${path%% (*} ;;
      /*) path=${line%% (*} ;;
      *) continue ;;  # linux-vdso.so.1 and friends live in the kernel
    esac
    mkdir -p "$CTX/rootfs$(dirname "$path")"
    cp -L "$path" "$CTX/rootfs$path"
  done < <(ldd "$exe")
}
copy_libs "$CTX/rootfs/usr/local/bin/runnev"
copy_libs "$CTX/rootfs/usr/local/bin/runnev-statefulset"

cat > "$CTX/rootfs/etc/nsswitch.conf" <<'NSS'
# glibc >= 2.34 has files and dns built in: no libnss_* module is needed.
hosts: files dns
passwd: files
group: files
NSS
printf 'root:x:0:0:root:/:/sbin/nologin\nrunnev:x:10001:10001:runnev:/var/lib/runnev:/sbin/nologin\n' \
  > "$CTX/rootfs/etc/passwd"
printf 'root:x:0:\nrunnev:x:10001:\n' > "$CTX/rootfs/etc/group"
( cd "$CTX/rootfs" && find . -type f -printf '%P  %s bytes\n' | sort )

REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null; then REV="$REV-dirty"; fi

log "docker build -t $IMAGE (revision $REV)"
# The legacy builder is used: this engine (20.10) may have no BuildKit/buildx, and FROM scratch
# needs neither.
DOCKER_BUILDKIT=0 docker build --build-arg "RUNNEV_REVISION=$REV" -t "$IMAGE" "$CTX"

log "checking the image"
docker run --rm "$IMAGE" --version
# The probe runs and fails cleanly on a closed port.
if docker run --rm "$IMAGE" probe http://127.0.0.1:7001/readyz --timeout-ms 500; then
  echo "build-image.sh: the probe reported a closed port as healthy" >&2; exit 1
fi
# Secure by default: without its credentials under /etc/runnev the default command refuses to
# start, naming the file it lacks (it never falls back to plain HTTP).
if out=$(docker run --rm "$IMAGE" 2>&1); then
  echo "build-image.sh: the image started without credentials: $out" >&2; exit 1
fi
grep -q '/etc/runnev/ca.pem' <<<"$out" ||
  { echo "build-image.sh: without credentials the image should name /etc/runnev/ca.pem: $out" >&2; exit 1; }
echo "without credentials the default command refuses to start: $out"
# Name resolution inside a scratch container: Docker's /etc/hosts (the container's own host name)
# and, on a user-defined network, Docker's DNS server for another container's name.
NET=runnev-build-check-$$
cleanup() {
  docker rm -f -v "$NET-a" >/dev/null 2>&1 || true
  docker network rm "$NET" >/dev/null 2>&1 || true
}
trap cleanup EXIT
docker network create "$NET" >/dev/null
docker run -d --name "$NET-a" --network "$NET" --network-alias peer-a "$IMAGE" \
  serve --id 1 --data-dir /var/lib/runnev --listen 0.0.0.0:7001 --insecure --peers 1=127.0.0.1:7001 >/dev/null
# runnev probe resolves the alias with getaddrinfo (the same call runnev's dialer makes), then
# connects: the one-node cluster in peer-a (plain HTTP: this checks name resolution only)
# answers /healthz.
ok=""
for _ in $(seq 1 50); do
  if docker run --rm --network "$NET" "$IMAGE" probe \
       http://peer-a:7001/healthz --timeout-ms 1000; then ok=1; break; fi
  sleep 0.2
done
[[ -n "$ok" ]] || { echo "build-image.sh: could not reach peer-a by name from another container" >&2; docker logs "$NET-a" >&2 || true; exit 1; }
docker run --rm --network "$NET" "$IMAGE" probe \
  http://no-such-host.invalid:7001/healthz --timeout-ms 1000 && { echo "build-image.sh: resolving a missing name succeeded?" >&2; exit 1; }
# The StatefulSet launcher derives the node id from the pod's host name.
docker rm -f -v "$NET-a" >/dev/null
docker run -d --name "$NET-a" --network "$NET" --hostname runnev-2 --entrypoint /usr/local/bin/runnev-statefulset \
  "$IMAGE" --data-dir '/var/lib/runnev/node-{id}' --listen 0.0.0.0:7001 --insecure --peers 3=127.0.0.1:7001 >/dev/null
ok=""
for _ in $(seq 1 50); do
  if docker run --rm --network "$NET" "$IMAGE" probe \
       http://$NET-a:7001/readyz --timeout-ms 1000 >/dev/null; then ok=1; break; fi
  sleep 0.2
done
[[ -n "$ok" ]] || { echo "build-image.sh: the launcher's node never became ready" >&2; docker logs "$NET-a" >&2 || true; exit 1; }
# The logs are read whole before they are searched: `docker logs | grep -q` fails under pipefail
# when grep exits at its first match and docker logs, still writing, gets SIGPIPE (a CI run
# failed so with the line in the logs).
launcher_logs="$(docker logs "$NET-a" 2>&1)"
grep -q 'host runnev-2 -> node id 3' <<<"$launcher_logs" \
  || { echo "build-image.sh: runnev-statefulset did not map runnev-2 to node id 3" >&2; echo "$launcher_logs" >&2; exit 1; }
grep -q 'data_dir=/var/lib/runnev/node-3' <<<"$launcher_logs" \
  || { echo "build-image.sh: runnev-statefulset did not put the node id in place of {id}" >&2; echo "$launcher_logs" >&2; exit 1; }
echo "runnev-statefulset: host runnev-2 runs node id 3 (with {id} replaced), ready"
docker image ls "$IMAGE"
echo "build-image.sh: $IMAGE is ready"
