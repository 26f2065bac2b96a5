#!/usr/bin/env bash
# The whole test suite: unit tests, then the integration tests against throwaway test hosts
# (systemd-nspawn containers with a real systemd and sshd, see tests/hostlab/). Needs root.
# The hosts are booted once for the run and always torn down, whatever happens.
set -euo pipefail
# Needs root (the test hosts are containers). Through sudo when there is one (root shells on servers
# and containers often have none); -E keeps the environment variables this script reads.
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "tests/run.sh: needs root (the test hosts are containers) and there is no sudo: run it from a root shell" >&2; exit 1; }
  exec sudo -E -- "$0" "$@"
fi
cd "$(dirname "$0")/.."
export STATE=${STATE:-/tmp/reconcile-lab}
HOSTS=${HOSTS:-21}

bash tests/hostlab/build-rootfs.sh
cargo build --locked --all-targets
bash tests/hostlab/down.sh >/dev/null 2>&1 || true
trap 'bash tests/hostlab/down.sh' EXIT
# ROUTE=1: the router host (rl18) reaches the replica hosts behind it (rl19..rl21).
ROUTE=1 bash tests/hostlab/up.sh "$HOSTS"
log=$(mktemp)
status=0
RECONCILE_LAB=$STATE cargo test --locked -- --test-threads "${TEST_THREADS:-4}" 2>&1 | tee "$log" || status=$?
bash tests/fault-matrix.sh "$log" || status=1
exit "$status"
