#!/usr/bin/env bash
# Benchmark of the throughput gate's client itself: how much of one core one reconcile process
# spends taking in streamed tokens at concurrency 64. Against the SGLang stand-in run locally (no
# test host, no root), which streams SSE chat completions as SGLang does
# (FAKE_SGLANG_TOKENS_PER_SECOND per request, FAKE_SGLANG_MAX_TOKENS_PER_SECOND over the server).
# Two passes, each with a fresh stand-in:
#   at the target: the server capped at 5,400 tok/s (just above 5,000 at the client); target: the client sustains
#                  >= 5,000 tok/s with <= 20 % of one core;
#   uncapped:      200 tok/s a request x 64 = 12,800 tok/s offered; what the client then takes in,
#                  and its CPU per token, which says how far a real host (a 122B TP=4 server does
#                  ~1,600 tok/s) is from measuring the client instead of the server.
# The client is `reconcile bench` with its hidden `--url` (the server at that URL alone: no host,
# nothing stored), run under /usr/bin/time for its user + system CPU time, start-up included.
# Usage: bench/client.sh [REQUESTS]   (default 512 a pass, 128 output tokens each)
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-512}
PORT=${PORT:-37999}
cargo build --locked --release --quiet
work=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT

# measure NAME MAX_TOKENS_PER_SECOND: one pass against a fresh stand-in; prints its figures.
measure() {
  local name=$1 cap=$2 state="$work/state-$1"
  mkdir -p "$state" "$work/manifests"
  FAKE_SGLANG_STATE_DIR="$state" FAKE_SGLANG_LOAD_SECONDS=0.2 FAKE_SGLANG_GRAPH_SECONDS=0 \
  FAKE_SGLANG_WARMUP_SECONDS=0 FAKE_SGLANG_HEALTH_SECONDS=0 FAKE_SGLANG_TTFT_SECONDS=0.02 \
  FAKE_SGLANG_TOKENS_PER_SECOND=200 FAKE_SGLANG_MAX_TOKENS_PER_SECOND="$cap" CUDA_VISIBLE_DEVICES=0 \
  PYTHONPATH=fixtures/fake-sglang python3 -m sglang.launch_server --model-path /models/test \
    --served-model-name bench --host 127.0.0.1 --port "$PORT" >"$work/server-$name.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || { cat "$work/server-$name.log"; exit 1; }
  cat > "$work/manifests/bench.yaml" <<EOM
service: bench-client
hosts: [local]
sglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /models/test, served_model_name: bench, port: $PORT }
verify: { benchmark: { levels: [64], prompt_tokens: 128, output_tokens: 128, requests: $REQUESTS } }
EOM
  /usr/bin/time -f '%U %S %e' -o "$work/time-$name" ./target/release/reconcile bench bench-client \
    "$work/manifests" --url "http://127.0.0.1:$PORT" --format json >"$work/report-$name.json" \
    2>"$work/progress-$name" || { cat "$work/report-$name.json" "$work/progress-$name"; exit 1; }
  kill "$server"; wait "$server" 2>/dev/null || true; server=
}
measure target 5400
measure uncapped 100000
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def figures(name):
    host = json.load(open(f"{work}/report-{name}.json"))["hosts"][0]
    assert host["error"] is None, host["error"]
    level = host["benchmark"]["levels"][0]
    user, system, wall = map(float, open(f"{work}/time-{name}").read().split()[-3:])
    return level, user, system, wall
for name in ["target", "uncapped"]:
    level, user, system, wall = figures(name)
    tokens = level["output_tokens_per_s"]
    cpu = (user + system) / wall * 100
    print(f"{name}: concurrency {level['concurrency']}: {tokens:,.0f} tok/s streamed, {level['requests_per_s']:.1f} req/s, "
          f"TTFT p50 {level['ttft_p50_ms']:.0f} ms p99 {level['ttft_p99_ms']:.0f} ms, "
          f"ITL p50 {level['itl_p50_ms']:.1f} ms p99 {level['itl_p99_ms']:.1f} ms, {level['errors']} errors")
    print(f"  client CPU: {user + system:.2f} s ({user:.2f} s user, {system:.2f} s system) over {wall:.2f} s "
          f"= {cpu:.1f} % of one core, {(user + system) / (tokens * wall) * 1e6:.0f} us a token")
    if name == "target":
        print(f"  against the targets: {tokens / 5000:.2f}x the 5,000 tok/s (>= 1 meets it), "
              f"{cpu / 20:.2f}x the 20 % of one core (<= 1 meets it)")
    else:
        per_token = (user + system) / (tokens * wall)
        print(f"  one core would take in {1 / per_token:,.0f} tok/s: {1 / per_token / 1600:.0f}x what a 122B TP=4 "
              f"server streams (~1,600 tok/s), so the client costs {1600 * per_token * 100:.1f} % of a core there")
PY
