#!/usr/bin/env bash
# Benchmark of the pull agents' coordination: AGENTS `reconcile agent` processes on this machine
# against one real etcd (Debian's etcd-server, on loopback), no test hosts. Each agent runs one round
# of a real manifests repository in which one service lists every agent as a host; applying is the
# agent's hidden drill (`--drill restart`: a restart is a sleep of RESTART; only the coordination is
# real). Two passes, each against a fresh etcd:
#   restart: every agent has a restart to do, `rollout.max_parallel: MAX_PARALLEL`. From the
#            restarts' own start and end times: the most ever running at once (target: exactly
#            MAX_PARALLEL, never more), the canary finished before any other started, all
#            AGENTS done; and the wall time against the ideal (canary + ceil((AGENTS-1)/MAX) restarts);
#   nothing: every agent is up to date (the steady state of a fleet between changes). Per agent
#            round, what coordinating cost: requests to etcd (target: at most 2) and the time spent
#            in them (target: under 50 ms), from each agent's own count; the median and the worst.
#            Its baseline, measured in the same run: the same agents' rounds without
#            `--coordinator` (the round's own git and manifest work, all 200 at once), so the
#            ratio says what coordination adds to a round.
# Usage: bench/agents.sh [AGENTS] [MAX_PARALLEL] [RESTART]   (default 200 2 0.5s)
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTS=${1:-200}
MAX_PARALLEL=${2:-2}
RESTART=${3:-0.5s}
PORT=${PORT:-23790}
command -v etcd >/dev/null || { echo "bench/agents.sh: needs etcd (Debian: apt-get install etcd-server)" >&2; exit 1; }
cargo build --locked --release --quiet
bin=$PWD/target/release/reconcile
work=$(mktemp -d)
etcd_pid=
trap '[ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

start_etcd() {
  [ -n "$etcd_pid" ] && { kill "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true; }
  rm -rf "$work/etcd"
  etcd --name bench --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$((PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((PORT + 1))" >"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do
    ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$PORT" endpoint health >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "etcd did not start:" >&2; cat "$work/etcd.log" >&2; exit 1
}

# The manifests repository: one service, every agent a host, the canary the first.
hosts=$(seq -f 'a%g' 1 "$AGENTS" | paste -sd, -)
git init -q -b main "$work/repo"
mkdir -p "$work/repo/manifests"
cat >"$work/repo/manifests/drill.yaml" <<EOF
service: drill
hosts: [$hosts]
sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: drill, port: 30000, flags: { tp-size: 2 } }
rollout: { max_parallel: $MAX_PARALLEL, max_failures: 1 }
EOF
git -C "$work/repo" add -A
git -C "$work/repo" -c user.name=bench -c user.email=bench@example.com commit -qm drill

# run NAME NEED [coordinated] [SPREAD_MS]: one round of every agent, all at once or their starts
# spread evenly over SPREAD_MS (as the example timer's RandomizedDelaySec spreads a fleet's);
# each agent's output in $work/NAME/.
run() {
  local name=$1 need=$2 coordinated=${3:-yes} spread=${4:-0}
  mkdir -p "$work/$name"
  local pids=()
  for i in $(seq "$AGENTS"); do
    [ "$spread" -gt 0 ] && sleep "$(printf '0.%03d' $((spread / AGENTS)))"
    local args=(agent --once --repo "$work/repo" --checkout "$work/$name/checkout-$i" --as "a$i")
    args+=(--drill "$need" --drill-restart "$RESTART" --drill-log "$work/$name/restarts")
    [ "$coordinated" = yes ] && args+=(--coordinator "etcd://127.0.0.1:$PORT" --coordinator-poll 100ms)
    "$bin" "${args[@]}" >"$work/$name/a$i.out" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
  echo "$failed"
}

echo "bench/agents.sh: $AGENTS agents, max_parallel $MAX_PARALLEL, a restart of $RESTART, one etcd $(etcd --version | head -1 | awk '{print $3}')"

start_etcd
ms() { echo $(($(date +%s%N) / 1000000)); }
began=$(ms)
failed=$(run restart restart)
wall=$(($(ms) - began))
restart_ok=0
python3 - "$work/restart/restarts" "$AGENTS" "$MAX_PARALLEL" "$RESTART" "$wall" "$failed" <<'EOF' || restart_ok=1
import sys, math
path, agents, maxp, restart, wall, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]) / 1000, int(sys.argv[6])
rows = [l.split() for l in open(path)]
spans = sorted((int(b), int(e), h) for h, b, e in rows)
events = sorted([(b, 1) for b, _, _ in spans] + [(e, -1) for _, e, _ in spans], key=lambda x: (x[0], x[1]))
now = peak = 0
for _, d in events:
    now += d
    peak = max(peak, now)
canary = [s for s in spans if s[2] == "a1"]
canary_first = bool(canary) and all(b >= canary[0][1] for b, _, h in spans if h != "a1")
secs = float(restart.rstrip("s"))
ideal = secs * (1 + math.ceil((agents - 1) / maxp))
print(f"restart pass: {len(spans)} of {agents} restarted, {failed} agent(s) exited non-zero")
print(f"  most restarting at once: {peak} (max_parallel {maxp}; target: exactly {maxp}, never more)")
print(f"  canary a1 finished before any other started: {'yes' if canary_first else 'NO'}")
print(f"  wall time {wall:.1f}s against the ideal {ideal:.1f}s of back-to-back restarts: x{wall / ideal:.2f}")
ok = peak == min(maxp, max(agents - 1, 1)) and canary_first and len(spans) == agents and failed == 0
sys.exit(0 if ok else 1)
EOF

start_etcd
# Every agent's entry says up to date once, as a fleet between changes has it; the pass measured is
# the next round, with nothing to write.
run warm nothing >/dev/null
began=$(ms)
failed=$(run burst nothing)
burst_wall=$(($(ms) - began))
SPREAD_MS=${SPREAD_MS:-10000}
began=$(ms)
failed=$((failed + $(run nothing nothing yes "$SPREAD_MS")))
wall=$(($(ms) - began))
began=$(ms)
base_failed=$(run plain nothing no "$SPREAD_MS")
base_wall=$(($(ms) - began))
nothing_ok=0
python3 - "$work" "$AGENTS" "$wall" "$base_wall" "$burst_wall" "$failed" "$base_failed" "$SPREAD_MS" <<'EOF' || nothing_ok=1
import sys, re, glob, statistics
work, agents = sys.argv[1], int(sys.argv[2])
wall, base_wall, burst_wall = (float(a) / 1000 for a in sys.argv[3:6])
failed, base_failed, spread = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
def costs(name):
    reqs, ms = [], []
    for f in glob.glob(f"{work}/{name}/a*.out"):
        m = re.search(r"drill: (\d+) requests to the coordinator, ([\d.]+) ms", open(f).read())
        if m:
            reqs.append(int(m.group(1))); ms.append(float(m.group(2)))
    return reqs, ms
reqs, ms = costs("nothing")
burst_reqs, burst_ms = costs("burst")
print(f"nothing-to-do pass, starts spread over {spread / 1000:g}s: {len(reqs)} of {agents} agents reported, {failed} exited non-zero (baseline: {base_failed})")
if reqs:
    print(f"  requests to etcd per round: median {statistics.median(reqs):g}, most {max(reqs)} (target: at most 2)")
    print(f"  time in them per round (connecting included): median {statistics.median(ms):.2f} ms, worst {max(ms):.2f} ms (target: under 50 ms)")
print(f"  the pass: {wall:.1f}s with the coordinator, {base_wall:.1f}s without it (baseline, the same rounds): x{wall / base_wall:.2f}")
if burst_ms:
    print(f"  all {agents} at once on this machine's cores instead: {max(burst_reqs)} request(s) each, median {statistics.median(burst_ms):.2f} ms, worst {max(burst_ms):.2f} ms, {burst_wall:.1f}s in all (CPU contention of {agents} processes, not etcd)")
ok = len(reqs) == agents and max(reqs) <= 2 and max(ms) < 50 and failed == 0 and base_failed == 0
sys.exit(0 if ok else 1)
EOF
[ "$restart_ok" = 0 ] && [ "$nothing_ok" = 0 ]
