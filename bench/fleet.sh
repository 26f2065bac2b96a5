#!/usr/bin/env bash
# Fleet benchmark against the SSH floor, on throwaway test hosts of its own (16 by default):
#   dry-run over N = 1, 4, 8, 16 hosts vs a plain parallel `ssh host cat <unit>` over the same
#   hosts, one fresh connection each (target: <= 1.2x the floor at N = 16);
#   a dry-run of a change that restarts (the deep check runs on each host), then the same change
#   again (each host's kept deep-check verdict and Python answer read instead; target: <= 1.2x the
#   floor at N = 16);
#   reconcile's own CPU time and peak RSS for the dry-run at N = 16 (target: peak RSS < 64 MiB);
#   a no-op apply over 8 hosts vs the same floor;
#   beside each, the sequential round trips per host after connect (from --trace-remote; target:
#   <= 2 for a plan and a no-op apply), and those of one restart;
#   Ansible's `--check --diff` of the same rendered unit on the same 16 hosts, in pairs with
#   reconcile's dry-run (bench/ansible.py: ansible-core pinned in a venv it makes, forks = N,
#   pipelining; target: Ansible / reconcile >= 10x);
#   a rolling apply over 8 hosts with one failing: total time and time to stop.
# Usage: bench/fleet.sh [REPEATS]   (default 5; about four minutes, plus ~2.5 minutes the first time
# for Ansible's venv)
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "the test hosts are containers" "$@"
cd "$(dirname "$0")/.."
REPEATS=${1:-5}
export STATE=/tmp/reconcile-fleet-bench PREFIX=fb SUBNET=10.216
lab_up 16
python3 bench/fleet.py "$STATE/ssh_config" "$REPEATS"
