#!/usr/bin/env bash
# CI for deploy/: builds the container image (no registry), validates the Kubernetes manifests,
# the Compose file and the systemd unit, smoke-tests the Compose cluster, then runs the chaos test
# across real containers (which prints the unavailability window of each fault).
# Needs a reachable Docker engine; fails (does not skip) without one.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==== %s\n' "$*"; }

# The image is built from the simulation's profile (release speed with debug assertions and
# overflow checks), which scripts/test has just built for the simulation: only runnev's main.rs is
# compiled again, where a release build would compile every crate once more (about 5 minutes of
# CI's 2 cores). The containers then also check every `debug_assert!`. `RUNNEV_BIN=path
# deploy/ci.sh` uses another binary; deploy/build-image.sh alone builds a release one.
if [[ -z "${RUNNEV_BIN:-}" ]]; then
  log "cargo build --profile sim --locked -p runnev -p simulation --bin runnev"
  cargo build --profile sim --locked -p runnev -p simulation --bin runnev
  export RUNNEV_BIN="${CARGO_TARGET_DIR:-$PWD/target}/sim/runnev"
fi

log "deploy/build-image.sh"
./deploy/build-image.sh

log "deploy/validate.sh"
./deploy/validate.sh

log "deploy/compose-smoke.sh"
./deploy/compose-smoke.sh

log "cargo test --workspace --exclude simulation --test container_chaos"
# Without an engine or the image the test fails (it skips only with RUNNEV_SKIP_DOCKER=1, which
# this script clears: here it must run). `--workspace --exclude simulation` resolves the
# dependencies' features as scripts/test's debug build did, so the test binary built there is
# reused instead of rebuilt.
env -u RUNNEV_SKIP_DOCKER cargo test --workspace --exclude simulation --locked --test container_chaos -- --nocapture
