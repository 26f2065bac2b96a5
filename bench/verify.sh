#!/usr/bin/env bash
# Benchmark of staged verification against the SGLang stand-in behaving as real SGLang does
# (fixtures/fake-sglang/README.md), on one throwaway test host:
#   healthy loads:     N applies of a server with the realistic start-up shape (a /health that
#                      takes 1.5 s, a 2 s warmup answering 503, a flat JIT phase with a busy CPU
#                      three times the stall timeout); every one must converge (target: 0 false
#                      rollbacks);
#   dead rank:         SGLang 0.5.9 (no watchdog): a TP rank dies, the main process lives on; from
#                      the rank's death (its last journal line) to reconcile failing the stage
#                      (target <= 3 s);
#   crash, /health hung: the server's /health never answers; its main process is killed while a
#                      probe waits; from systemd seeing the exit to reconcile failing the stage
#                      (target <= 1.5 s).
# Usage: bench/verify.sh [HEALTHY_LOADS] [TRIALS]   (defaults 20 and 5; ~8 minutes)
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "the test host is a container" "$@"
cd "$(dirname "$0")/.."
LOADS=${1:-20}
TRIALS=${2:-5}
export STATE=/tmp/reconcile-bench-verify PREFIX=bv SUBNET=10.216  # apart from the test lab
lab_up 1
work=$(mktemp -d)
on_host() { ssh -F "$STATE/ssh_config" bv1 "$@"; }
manifest() {  # $1: folder, $2: extra env, $3: extra verify settings
  mkdir -p "$1"
  cat > "$1/m.yaml" <<EOM
service: bench-verify
hosts: [bv1]
sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench, port: 30000, flags: { tp-size: 2 } }
env: { CUDA_VISIBLE_DEVICES: "0,1", FAKE_SGLANG_LOAD_SECONDS: "${LOAD:-2}"$2 }
verify: { crash_window: 3s, sample_interval: 500ms, load_deadline: ${DEADLINE:-60s}$3 }
EOM
}
rc() {  # $1: manifests folder, $2: where its JSON report goes; a run that reports nothing ends the bench
  ./target/release/reconcile apply "$1" --ssh-config "$STATE/ssh_config" --format json > "$2" 2> "$work/stderr" || true
  [ -s "$2" ] || { echo "reconcile printed no report:" >&2; cat "$work/stderr" >&2; exit 1; }
}
outcome() { python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["units"][0]; print(u["outcome"], u.get("failed_stage") or "-", u["verification"]["load_seconds"] if u.get("verification") else "-")' "$1"; }

echo "healthy loads with the realistic shape ($LOADS):"
[ "$LOADS" -gt 0 ] || echo "  (skipped)"
shape=', FAKE_SGLANG_HEALTH_SECONDS: "1.5", FAKE_SGLANG_WARMUP_SECONDS: "2", FAKE_SGLANG_JIT_SECONDS: "4.5"'
converged=0; false_rollbacks=0
for i in $(seq 1 "$LOADS" 2>/dev/null); do
  # Each round changes an env var, so each apply restarts and verifies a fresh load.
  manifest "$work/healthy" "$shape, BENCH_ROUND: \"$i\"" ", stall_timeout: 1500ms"
  rc "$work/healthy" "$work/h.json"
  read -r out stage load < <(outcome "$work/h.json")
  if [ "$out" = converged ]; then converged=$((converged + 1)); else false_rollbacks=$((false_rollbacks + 1)); echo "  round $i: $out at $stage"; fi
  printf '  round %2d: %s, ready after %.1f s\n' "$i" "$out" "$load"
done
[ "$LOADS" -gt 0 ] && echo "  $converged converged, $false_rollbacks false rollbacks (target 0)"

echo "dead rank, SGLang 0.5.9 mode ($TRIALS trials):"
manifest "$work/good" ', FAKE_SGLANG_VERSION: "0.5.9"' ""
rc "$work/good" "$work/g.json"
[ "$(outcome "$work/g.json" | cut -d' ' -f1)" = converged ] || { echo "the good unit did not converge" >&2; exit 1; }
# The rank dies 4 s into a 6 s load: past the crash window, before the server is ready.
LOAD=6 manifest "$work/deadrank" ', FAKE_SGLANG_VERSION: "0.5.9", FAKE_SGLANG_FAIL: dead-rank, FAKE_SGLANG_FAIL_AT: "4"' ""
: > "$work/dead"
for i in $(seq 1 "$TRIALS"); do
  start=$(date +%s)
  rc "$work/deadrank" "$work/d.json"
  died=$(on_host journalctl -u bench-verify -o short-unix --no-pager --since "@$start" | grep -m1 'Process group watchdog thread terminated' | awk '{print $1}')
  python3 - "$work/d.json" "$died" "$i" <<'PY' | tee -a "$work/dead"
import json, sys
unit = json.load(open(sys.argv[1]))["units"][0]
assert unit["outcome"] == "rolled_back", unit["detail"]
failed = unit["verification"]["stages"][-1]
assert "worker process died" in failed["detail"], failed
print(f"  trial {sys.argv[3]}: rank died -> reported {failed['at_unix'] - float(sys.argv[2]):.2f} s ({failed['name']}: {failed['detail'][:70]}...)")
PY
done

echo "crash while a /health probe hangs ($TRIALS trials):"
DEADLINE=120s manifest "$work/hang" ', FAKE_SGLANG_FAIL: health-hang' ""
: > "$work/hung"
for i in $(seq 1 "$TRIALS"); do
  start=$(date +%s)
  rc "$work/hang" "$work/c.json" &
  apply=$!
  # Once the port answers, reconcile's /health probe is waiting on an answer that never comes.
  for _ in $(seq 300); do
    on_host "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:30000/ready\", timeout=1)'" 2>/dev/null && break
    sleep 0.2
  done
  sleep 2
  on_host systemctl kill -s KILL bench-verify
  wait "$apply" || true
  exits=$(on_host journalctl -u bench-verify -o short-unix --no-pager --since "@$start" | grep 'Main process exited' | awk '{print $1}' | tr '\n' ' ')
  python3 - "$work/c.json" "$exits" "$i" <<'PY' | tee -a "$work/hung"
import json, sys
unit = json.load(open(sys.argv[1]))["units"][0]
failed = unit["verification"]["stages"][-1]
crash = max(t for t in map(float, sys.argv[2].split()) if t <= failed["at_unix"])
print(f"  trial {sys.argv[3]}: crash -> reported {failed['at_unix'] - crash:.2f} s ({failed['name']})")
PY
done

python3 - "$work/dead" "$work/hung" <<'PY'
import re, statistics, sys
def times(path):
    return [float(m.group(1)) for m in re.finditer(r"-> reported (\d+\.\d+) s", open(path).read())]
dead, hung = times(sys.argv[1]), times(sys.argv[2])
print(f"dead rank -> reported: median {statistics.median(dead):.2f} s, max {max(dead):.2f} s (target <= 3 s)")
print(f"crash -> reported while /health hangs: median {statistics.median(hung):.2f} s, max {max(hung):.2f} s (target <= 1.5 s)")
PY
rm -rf "$work"
