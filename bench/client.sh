#!/usr/bin/env bash
# Benchmark of the throughput gate's client itself: how many streamed tokens/s one reconcile
# process takes in at concurrency 64, and how much of one core it spends doing so. Against the
# SGLang stand-in run locally (no test host, no root), fast enough that the client, not the
# server, is what is measured: FAKE_SGLANG_TOKENS_PER_SECOND per request and
# FAKE_SGLANG_MAX_TOKENS_PER_SECOND over the server, streaming SSE chat completions as SGLang does.
#   streamed tokens/s: target >= 5,000 tok/s;
#   client CPU:        target <= 20 % of one core while doing it.
# The client is `reconcile bench` with its hidden `--url` (the server at that URL alone: no host,
# nothing stored), run under /usr/bin/time for its user + system CPU time.
# Usage: bench/client.sh [REQUESTS]   (default 512 at concurrency 64, 128 output tokens each)
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-512}
PORT=${PORT:-37999}
cargo build --locked --release --quiet
work=$(mktemp -d)
state="$work/state"; mkdir -p "$state" "$work/manifests"
# The stand-in: 200 tok/s per request x 64 in flight = 12,800 tok/s offered, under its cap.
FAKE_SGLANG_STATE_DIR="$state" FAKE_SGLANG_LOAD_SECONDS=0.2 FAKE_SGLANG_GRAPH_SECONDS=0 \
FAKE_SGLANG_WARMUP_SECONDS=0 FAKE_SGLANG_HEALTH_SECONDS=0 FAKE_SGLANG_TTFT_SECONDS=0.02 \
FAKE_SGLANG_TOKENS_PER_SECOND=${TOKENS_PER_SECOND:-200} \
FAKE_SGLANG_MAX_TOKENS_PER_SECOND=${MAX_TOKENS_PER_SECOND:-100000} CUDA_VISIBLE_DEVICES=0 \
PYTHONPATH=fixtures/fake-sglang python3 -m sglang.launch_server --model-path /models/test \
  --served-model-name bench --host 127.0.0.1 --port "$PORT" >"$work/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || { cat "$work/server.log"; exit 1; }
cat > "$work/manifests/bench.yaml" <<EOM
service: bench-client
hosts: [local]
sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench, port: $PORT }
verify: { benchmark: { levels: [64], prompt_tokens: 128, output_tokens: 128, requests: $REQUESTS } }
EOM
/usr/bin/time -f '%U %S %e' -o "$work/time" ./target/release/reconcile bench bench-client \
  "$work/manifests" --url "http://127.0.0.1:$PORT" --format json >"$work/report.json" 2>"$work/progress" \
  || { cat "$work/report.json" "$work/progress"; exit 1; }
python3 - "$work/report.json" "$work/time" <<'PY'
import json, sys
host = json.load(open(sys.argv[1]))["hosts"][0]
assert host["error"] is None, host["error"]
level = host["benchmark"]["levels"][0]
user, system, wall = map(float, open(sys.argv[2]).read().split()[-3:])
# The client's CPU over the whole process's wall time (start-up included: a little pessimistic).
cpu = (user + system) / wall * 100
tokens = level["output_tokens_per_s"]
print(f"concurrency {level['concurrency']}: {tokens:,.0f} tok/s streamed, {level['requests_per_s']:.1f} req/s, "
      f"TTFT p50 {level['ttft_p50_ms']:.0f} ms p99 {level['ttft_p99_ms']:.0f} ms, "
      f"ITL p50 {level['itl_p50_ms']:.1f} ms p99 {level['itl_p99_ms']:.1f} ms, {level['errors']} errors")
print(f"client CPU: {user + system:.2f} s over {wall:.2f} s = {cpu:.1f} % of one core")
print(f"tokens/s against the 5,000 tok/s target: {tokens / 5000:.2f}x; "
      f"CPU against the 20 % target: {cpu / 20:.2f}x (<= 1 is within)")
PY
