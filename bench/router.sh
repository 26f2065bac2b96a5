#!/usr/bin/env bash
# Zero-downtime rollout behind the real sglang-router (issue 16), on throwaway test hosts of its own:
# host 1 runs sglang-router 0.3.2 (from the test-host image, /opt/sglang-router) as a systemd unit,
# hosts 2-4 run one SGLang stand-in replica each; a client loop on host 1 sends chat completions
# through the router while `reconcile apply` rolls a restarting change over the three replicas.
# Prints the requests sent and lost (target: 0 lost of at least 500) and, per replica, the time the
# rollout spent on router bookkeeping (take out, drain, put back, wait until listed healthy;
# target: <= 2 s) next to its restart and verification.
#
# Usage: bench/router.sh
#   BIN=target/debug/reconcile   use this binary (default: a release build)
#   KEEP_LAB=1                   use hosts already up under STATE/PREFIX/SUBNET (booted with ROUTE=1)
#   REQUEST_SECONDS=0.2 THREADS=8  how long each request takes on a replica, and how many at once
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "the test hosts are containers" "$@"
cd "$(dirname "$0")/.."
export STATE=${STATE:-/tmp/reconcile-router-bench} PREFIX=${PREFIX:-rb} SUBNET=${SUBNET:-10.219} ROUTE=1
MIN_REQUESTS=${MIN_REQUESTS:-500}
# Each request takes this long on a replica (the stand-in's FAKE_SGLANG_REQUEST_SECONDS), so a
# replica taken out of the router has requests in flight to drain.
REQUEST_SECONDS=${REQUEST_SECONDS:-0.2}
THREADS=${THREADS:-8}             # the client loop's requests at once
if [ -z "${BIN:-}" ]; then cargo build --locked --release --quiet; BIN=target/release/reconcile; fi
if [ "${KEEP_LAB:-0}" != 1 ]; then
  bash tests/hostlab/build-rootfs.sh >/dev/null
  trap 'bash tests/hostlab/down.sh >/dev/null' EXIT
  bash tests/hostlab/up.sh 4 >/dev/null
fi
R=${PREFIX}1; REPLICAS=("${PREFIX}2" "${PREFIX}3" "${PREFIX}4")
on() { ssh -F "$STATE/ssh_config" "$@"; }
ip_of() { awk -v h="$1" '$1==h{print $2}' "$STATE/hosts.tsv"; }
KEY=bench-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
# The router's worker list, read on its host with its admin key (the image has python3, no curl).
LIST="import urllib.request as u; k = open('/etc/sglang-router/admin-key').read().strip(); print(u.urlopen(u.Request('http://127.0.0.1:30100/workers', headers={'Authorization': 'Bearer ' + k}), timeout=10).read().decode())"
on "$R" "mkdir -p /etc/sglang-router && umask 077 && echo $KEY > /etc/sglang-router/admin-key
  systemctl stop bench-router 2>/dev/null; systemctl reset-failed bench-router 2>/dev/null
  systemd-run -q --unit bench-router /opt/sglang-router/bin/python -m sglang_router.launch_router \
    --host 127.0.0.1 --port 30100 --policy round_robin --health-check-interval-secs 2 \
    --control-plane-api-keys reconcile:reconcile:admin:$KEY
  for i in \$(seq 100); do python3 -c \"$LIST\" >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1" \
  || { on "$R" "journalctl -u bench-router -n 20 --no-pager" >&2; exit 1; }
scp -q -F "$STATE/ssh_config" bench/router_client.py "$R:/root/router_client.py"
DIR=$(mktemp -d); mkdir -p "$DIR/manifests"
manifest() {  # $1: the value of BENCH_GENERATION (a new one restarts every replica)
  {
    echo "service: bench-replica"
    echo "hosts: [$(IFS=,; echo "${REPLICAS[*]}")]"
    echo "sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench-model, host: 0.0.0.0, port: 30000, flags: { enable-metrics: true } }"
    echo "env: { FAKE_SGLANG_LOAD_SECONDS: \"2\", FAKE_SGLANG_MEMORY_MB: \"10\", FAKE_SGLANG_REQUEST_SECONDS: \"$REQUEST_SECONDS\", BENCH_GENERATION: \"$1\" }"
    echo "verify: { crash_window: 3s }"
    echo "router:"
    echo "  url: http://127.0.0.1:30100"
    echo "  via: $R"
    echo "  admin_key_file: /etc/sglang-router/admin-key"
    echo "  workers:"
    for h in "${REPLICAS[@]}"; do echo "    $h: http://$(ip_of "$h"):30000"; done
  } > "$DIR/manifests/bench.yaml"
}
rc() { (cd "$DIR" && "$OLDPWD/$BIN" "$@" --ssh-config "$STATE/ssh_config"); }
manifest 1
rc apply --format json > "$DIR/first.json" 2> "$DIR/first.log" || { cat "$DIR/first.json" "$DIR/first.log"; exit 1; }
on "$R" "python3 -c \"$LIST\"" | python3 -c '
import json, sys; w = json.load(sys.stdin)["workers"]; print("router lists %d worker(s), healthy: %d" % (len(w), sum(x["is_healthy"] for x in w)))'
on "$R" "rm -f /root/stop; nohup python3 /root/router_client.py http://127.0.0.1:30100 bench-model /root/stop $THREADS > /root/client.json 2>&1 &"
sleep 2
manifest 2
started=$(date +%s.%N)
rc apply --format json > "$DIR/rollout.json" 2> "$DIR/rollout.log" || true
took=$(awk -v a="$(date +%s.%N)" -v b="$started" 'BEGIN{printf "%.1f", a-b}')
# Keep the loop going until it has sent enough requests, then stop it and read what it saw.
sleep 2
on "$R" "touch /root/stop; for i in \$(seq 600); do [ -s /root/client.json ] && break; sleep 0.1; done; cat /root/client.json" > "$DIR/client.json"
python3 - "$DIR/rollout.json" "$DIR/client.json" "$took" "$MIN_REQUESTS" <<'EOF'
import json, re, sys
report, client, took, need = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], int(sys.argv[4])
sent = client["ok"] + client["failed"]
print(f"rolling apply of {len(report['units'])} replicas behind sglang-router 0.3.2: {took}s")
print(f"requests through the router during it: {sent} sent, {client['failed']} lost, slowest {client['slowest_s']}s"
      + ("" if sent >= need else f"  (fewer than {need}: rerun with a longer load)"))
for f in client["failures"]:
    print("  lost:", f)
for u in report["units"]:
    note = next((n for n in u["notes"] if n.startswith("router:")), "")
    m = re.search(r"bookkeeping ([0-9.]+)s", note)
    print(f"  {u['host']}: {u['outcome']}, restart + verification {u['seconds']:.1f}s, router bookkeeping "
          + (f"{m.group(1)}s" if m else "n/a") + f"  ({note})")
EOF
on "$R" "python3 -c \"$LIST\"" | python3 -c '
import json, sys; w = json.load(sys.stdin)["workers"]; print("router lists %d worker(s) at the end, healthy: %d" % (len(w), sum(x["is_healthy"] for x in w)))'
on "$R" "systemctl stop bench-router" || true
for h in "${REPLICAS[@]}"; do on "$h" "systemctl disable --now bench-replica.service 2>/dev/null; rm -rf /etc/systemd/system/bench-replica.service /var/lib/reconcile/bench-replica.service; systemctl daemon-reload" || true; done
rm -rf "$DIR"
