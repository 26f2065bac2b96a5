#!/usr/bin/env bash
# Benchmark of apply's failure path, on one throwaway test host running the SGLang stand-in:
#   crash -> reported: from the moment systemd saw the stand-in's process exit (its journal) to the
#                      moment reconcile failed the stage (target <= 1.5 s);
#   rollback:          from that failure to the previous server answering /health again, as
#                      reconcile's rollback verification saw it (target <= the stand-in's time to
#                      ready + 2 s: its weights load, 0.3 s of graph capture, 0.3 s of warmup and
#                      a /health that answers after 1 s, as SGLang's does).
# Usage: bench/apply.sh [TRIALS]   (default 5; ~10 s a trial)
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "the test host is a container" "$@"
cd "$(dirname "$0")/.."
TRIALS=${1:-5}
LOAD=3
export STATE=/tmp/reconcile-bench PREFIX=bench SUBNET=10.214  # apart from the test lab
lab_up 1
work=$(mktemp -d); mkdir -p "$work/good" "$work/bad"
manifest() {  # $1: extra env
  cat <<EOM
service: bench-sglang
hosts: [bench1]
sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench, port: 30000, flags: { tp-size: 2 } }
env: { CUDA_VISIBLE_DEVICES: "0,1", FAKE_SGLANG_LOAD_SECONDS: "$LOAD"$1 }
verify: { crash_window: 5s, sample_interval: 500ms, load_deadline: 60s }
EOM
}
manifest "" > "$work/good/m.yaml"
manifest ', FAKE_SGLANG_FAIL: crash, FAKE_SGLANG_FAIL_AT: "1"' > "$work/bad/m.yaml"
rc() { ./target/release/reconcile apply "$1" --ssh-config "$STATE/ssh_config" --format json 2>/dev/null; }
rc "$work/good" > "$work/first.json" || { cat "$work/first.json"; exit 1; }
printf '%-6s %-22s %-24s\n' trial "crash -> reported (s)" "rollback to serving (s)"
for i in $(seq 1 "$TRIALS"); do
  start=$(date +%s)
  rc "$work/bad" > "$work/report.json" || true
  exits=$(ssh -F "$STATE/ssh_config" bench1 journalctl -u bench-sglang -o short-unix --no-pager --since "@$start" | grep 'Main process exited' | awk '{print $1}' | tr '\n' ' ')
  python3 - "$work/report.json" "$exits" "$i" <<'PY' | tee -a "$work/rows"
import json, sys
unit = json.load(open(sys.argv[1]))["units"][0]
assert unit["outcome"] == "rolled_back", unit["detail"]
failed = unit["verification"]["stages"][-1]["at_unix"]
crash = max(t for t in map(float, sys.argv[2].split()) if t <= failed)
serving = next(s["at_unix"] for s in unit["rollback"]["stages"] if s["name"] == "readiness")
print(f"{sys.argv[3]:<6} {failed - crash:<22.2f} {serving - failed:<24.2f}")
PY
done
python3 - "$work/rows" "$LOAD" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
detect = [float(r[1]) for r in rows]; rollback = [float(r[2]) for r in rows]
# The stand-in's defaults after the weights: graph capture 0.3 s, warmup 0.3 s, /health 1.0 s.
ready = float(sys.argv[2]) + 0.3 + 0.3 + 1.0
print(f"crash -> reported: median {statistics.median(detect):.2f} s, max {max(detect):.2f} s (target <= 1.5 s)")
print(f"rollback to serving: median {statistics.median(rollback):.2f} s, max {max(rollback):.2f} s "
      f"(target <= time to ready {ready:.1f} s + 2 s = {ready + 2:.1f} s; ratio to time to ready {statistics.median(rollback) / ready:.2f})")
PY
rm -rf "$work"
