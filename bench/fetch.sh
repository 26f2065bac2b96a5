#!/usr/bin/env bash
# Fetch benchmark: pinned weights (`sglang.model:`) fetched from one hub to N hosts at once, on
# throwaway test hosts of its own. Host pw1 is the hub's namespace (olah serving a local git
# repository offline, tests/hostlab/hub/serve.sh), its link shaped with tc to a rate well below
# olah's own ceiling; hosts pw2.. run one SGLang stand-in each. It prints:
#   olah's unshaped rate over the lab link, and the limit the link gets;
#   per N: plain concurrent GETs (curl, one per host, the same files) through the shaped link, then
#   `reconcile apply` of a fresh revision over the same N hosts (at_once: N): the slowest host's
#   fetch.seconds, the aggregate rate as a ratio of the limit and of the plain GETs, the per-host rate;
#   the plan's cost: `reconcile plan` of the pinned manifest against the same manifest with a
#   plain model_path naming the fetched folder (medians of REPEATS, and the ratio).
# Usage: bench/fetch.sh [SIZE_MB] [HOSTS...]   (defaults 96 and 1 2 4; about four minutes)
#   LINK_MBIT=100   the shaped link's rate in Mbit/s
#   REPEATS=5       plans of each manifest
# PEERS=N bench/fetch.sh [SIZE_MB]   (default 64; N=16 about five minutes): instead of the above,
#   the swarm (`peers:`) against independent fetches. N hosts and the hub, every host's link shaped
#   the same (so a peer serves no faster than the hub); a fresh revision to all N at once
#   (at_once: N), first each host from the hub, then with `peers: { port: 39209 }`. It prints the
#   apply's time, the fetch's (apply start to the last copy in place), the hub's downloads of each
#   shard (its access log) and the bytes its link sent (tc), each as peers / independent.
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "test hosts, tc" "$@"
cd "$(dirname "$0")/.."
export PEERS=${PEERS:-0}
if [ "$PEERS" != 0 ]; then
  SIZE_MB=${1:-64}
  COUNTS=("$PEERS")
else
  SIZE_MB=${1:-96}
  shift || true
  COUNTS=("$@")
  [ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1 2 4)
fi
MAX=$(printf '%s\n' "${COUNTS[@]}" | sort -n | tail -1)
# Apart from the test lab (rl, 10.213) and the other benches' labs; ROUTE=1 so that the hosts
# reach the hub in pw1.
export STATE=/tmp/reconcile-fetch-bench PREFIX=pw SUBNET=10.218 ROUTE=1
HUB_ROOT=/var/lib/reconcile-fetch-bench/hub
bash tests/hostlab/build-rootfs.sh >/dev/null
cargo build --locked --release --quiet
TARGET=${CARGO_TARGET_DIR:-target}
case $TARGET in /*) ;; *) TARGET=$(pwd)/$TARGET ;; esac
BIN=$TARGET/release/reconcile
# down.sh also stops the hub (a process in pw1's namespace); the repository goes with it.
trap 'bash tests/hostlab/down.sh >/dev/null; rm -rf "$HUB_ROOT"' EXIT
bash tests/hostlab/up.sh $((MAX + 1)) >/dev/null
bash tests/hostlab/hub/serve.sh pw1 "$SUBNET.1.2" 8090 "$HUB_ROOT"
python3 bench/fetch.py "$STATE/ssh_config" "$BIN" "$SIZE_MB" "${COUNTS[@]}"
