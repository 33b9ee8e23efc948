#!/usr/bin/env bash
# Validates the deployment files offline:
# - deploy/k8s/*.yaml against the Kubernetes OpenAPI schemas bundled in the PyPI package
#   kubernetes-validate (strict: unknown fields are errors), for the oldest and newest Kubernetes
#   versions we claim, plus Runnev-specific consistency checks (peers match replicas and the
#   headless Service, probes hit /readyz, labels match);
# - deploy/docker-compose.yml with `docker-compose config` (when docker-compose is installed);
# - deploy/runnev.service with `systemd-analyze verify` (when systemd-analyze is installed).
# Installs kubernetes-validate into a virtualenv under target/ the first time (from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${RUNNEV_DEPLOY_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/deploy-venv}
KV_VERSION=1.37.0
K8S_VERSIONS=${RUNNEV_K8S_VERSIONS:-"1.29.0 1.37.0"}

log() { printf '\n== %s\n' "$*"; }

if [[ ! -x "$VENV/bin/kubernetes-validate" ]] || ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep "$KV_VERSION" >/dev/null; then
  log "installing kubernetes-validate==$KV_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi

for v in $K8S_VERSIONS; do
  log "kubernetes-validate --strict -k $v deploy/k8s/*.yaml"
  "$VENV/bin/kubernetes-validate" --strict -k "$v" deploy/k8s/*.yaml
done

log "Runnev consistency checks on deploy/k8s"
"$VENV/bin/python" - deploy/k8s/*.yaml <<'PY'
import sys, yaml
docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
problems = []
(sts,) = by_kind["StatefulSet"]
spec = sts["spec"]
replicas = spec["replicas"]
svc_name = spec["serviceName"]
services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
headless = services.get(svc_name)
if headless is None:
    problems.append(f"serviceName {svc_name} has no Service")
else:
    if headless["spec"].get("clusterIP") != "None":
        problems.append(f"Service {svc_name} is not headless (clusterIP: None)")
    if not headless["spec"].get("publishNotReadyAddresses"):
        problems.append(f"Service {svc_name} must publish not-ready addresses (peers resolve before readiness)")
if spec.get("podManagementPolicy") != "Parallel":
    problems.append("podManagementPolicy must be Parallel (OrderedReady deadlocks cluster formation)")
labels = spec["template"]["metadata"]["labels"]
for k, v in spec["selector"]["matchLabels"].items():
    if labels.get(k) != v:
        problems.append(f"selector {k}={v} does not match the pod template labels")
for s in list(services.values()) + by_kind.get("PodDisruptionBudget", []):
    sel = s["spec"]["selector"]
    sel = sel.get("matchLabels", sel)
    if any(labels.get(k) != v for k, v in sel.items()):
        problems.append(f"{s['kind']} {s['metadata']['name']} selector {sel} selects no runnev pod")
(c,) = spec["template"]["spec"]["containers"]
args = c.get("args", [])
peers = [a.split("=", 1)[1] for a in args if a.startswith("--peers=")]
if len(peers) != 1:
    problems.append("the container needs exactly one --peers=… argument")
else:
    entries = dict(p.split("=", 1) for p in peers[0].split(","))
    want = {str(i + 1): f"{sts['metadata']['name']}-{i}.{svc_name}:7001" for i in range(replicas)}
    if entries != want:
        problems.append(f"--peers lists {entries}, expected {want} (pod runnev-N is node N+1)")
if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
    problems.append("readinessProbe must GET /readyz")
for probe in ("readinessProbe", "livenessProbe"):
    if c.get(probe, {}).get("httpGet", {}).get("scheme") != "HTTPS":
        problems.append(f"{probe} must use scheme HTTPS (the nodes serve TLS)")
if "--insecure" in args:
    problems.append("--insecure: the manifests run with peer TLS and --auth")
for flag in ("--tls-ca=", "--tls-cert=", "--tls-key=", "--admin-token-file="):
    if not any(a.startswith(flag) for a in args):
        problems.append(f"the container needs {flag}… (secure by default)")
if "--auth" not in args:
    problems.append("the container needs --auth")
secret_mounts = {m["mountPath"] for m in c.get("volumeMounts", []) if m["name"] in
                 {v["name"] for v in spec["template"]["spec"].get("volumes", []) if "secret" in v}}
for a in args:
    if a.startswith(("--tls-", "--admin-token-file=")):
        path = a.split("=", 1)[1]
        if not any(path.startswith(m.rstrip("/") + "/") for m in secret_mounts):
            problems.append(f"{a}: not under a mounted Secret")
if not spec.get("volumeClaimTemplates"):
    problems.append("no volumeClaimTemplates: the data directory must be persistent")
mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
if "/var/lib/runnev" not in mounts or not any(a == "--data-dir=/var/lib/runnev" for a in args):
    problems.append("the data dir /var/lib/runnev must be the mounted persistent volume")
pdb = by_kind.get("PodDisruptionBudget", [])
if not pdb or pdb[0]["spec"].get("maxUnavailable") != 1:
    problems.append("a PodDisruptionBudget with maxUnavailable: 1 is required (keeps a majority)")
if problems:
    print("\n".join("PROBLEM: " + p for p in problems))
    sys.exit(1)
print(f"ok: {replicas} replicas, peers via {svc_name}, readiness /readyz over HTTPS, TLS and --auth from a Secret, PDB maxUnavailable 1")
PY

if command -v docker-compose >/dev/null; then
  log "docker-compose config (deploy/docker-compose.yml)"
  docker-compose -f deploy/docker-compose.yml config -q && echo ok
else
  echo "docker-compose not installed: skipping the compose file check"
fi

if command -v systemd-analyze >/dev/null; then
  log "systemd-analyze verify (deploy/runnev.service)"
  # verify wants ExecStart's binary and the EnvironmentFile to exist: check a copy that points at
  # /bin/true and marks the environment file optional.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  sed -e 's|/usr/local/bin/runnev |/bin/true |' -e 's|^EnvironmentFile=/|EnvironmentFile=-/|' \
    deploy/runnev.service > "$tmp/runnev.service"
  systemd-analyze verify "$tmp/runnev.service" && echo ok
else
  echo "systemd-analyze not installed: skipping the unit file check"
fi
log "secure by default: Compose, the systemd unit and the image run with TLS and --auth"
for f in deploy/docker-compose.yml deploy/runnev.service deploy/Dockerfile; do
  # No `grep -q` at the end of a pipe: under pipefail its early exit can fail the writer (SIGPIPE).
  if grep -v '^ *#' "$f" | grep -- '--insecure' >/dev/null; then
    echo "validate.sh: $f runs a node with --insecure" >&2; exit 1
  fi
  for flag in --tls-ca --tls-cert --tls-key --auth --admin-token-file; do
    grep -v '^ *#' "$f" | grep -- "$flag" >/dev/null || { echo "validate.sh: $f lacks $flag" >&2; exit 1; }
  done
done
grep -q '^LoadCredential=node.key:' deploy/runnev.service ||
  { echo "validate.sh: the unit must pass the node key as a credential (LoadCredential=)" >&2; exit 1; }
echo ok

echo
echo "validate.sh: all deployment files are valid"
