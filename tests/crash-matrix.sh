#!/usr/bin/env bash
# The whole crash matrix (tests/integration/crash.rs): `reconcile apply` stopped before each step
# of its transaction by the tests' fail points, times each fault (SIGKILL, a real reboot of the
# host, a link cut past the guard's deadline). Prints the table that docs/guarantees.md shows;
# fails if any cell leaves a host on a unit it cannot tell, or `status` or the next apply says
# otherwise. Boots the test hosts (and tears them down) unless RECONCILE_LAB names a lab up.
# Needs root. Six hosts, a cell on one at a time (a server group's on two): all 93 cells in
# about 19 minutes on 2 cores.
# CRASH_CHANGES=Live,LiveRefused (the `Change` names in crash.rs) runs those rows alone, and
# CRASH_FAULTS=Cut (`Fault`) those faults' cells.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "tests/crash-matrix.sh: needs root (the test hosts are containers)" >&2; exit 1; }
  exec sudo -E -- "$0" "$@"
fi
cd "$(dirname "$0")/.."
cargo build --locked --all-targets
if [ -z "${RECONCILE_LAB:-}" ]; then
  export STATE=${STATE:-/tmp/reconcile-lab}
  bash tests/hostlab/build-rootfs.sh >/dev/null
  bash tests/hostlab/down.sh >/dev/null 2>&1 || true
  trap 'bash tests/hostlab/down.sh' EXIT
  ROUTE=1 bash tests/hostlab/up.sh 41
  export RECONCILE_LAB=$STATE
fi
cargo test --locked --test integration crash::the_whole_matrix -- --include-ignored --exact --nocapture
