#!/usr/bin/env bash
# Short fuzz run for CI: each target for FUZZ_SECONDS (default 30) seconds, FUZZ_JOBS (default 2)
# targets at a time, starting from the checked-in corpus: the twelve targets take 6 x 30 s = 3
# minutes on 2 cores, after the build. Exits non-zero when a target crashes (panics, times out,
# runs out of memory), after printing the input that did it and how to reproduce it.
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer=address); on a stable toolchain
# RUSTC_BOOTSTRAP=1 lets it use them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-2}
targets=(
  manifest_parse render_roundtrip
  systemctl_show ss_listeners nvidia_smi_list nvidia_smi_query
  sglang_models sglang_answer sglang_metrics liveness deployment_record survey
)

# The manifest targets mutate YAML; the others what hosts answer.
dict_for() {
  case $1 in
    manifest_parse | render_roundtrip) echo manifest.dict ;;
    *) echo host_output.dict ;;
  esac
}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build
bin="target/$(rustc -vV | sed -n 's/^host: //p')/release"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# One target, its fuzzer binary run directly (cargo fuzz run would take cargo's build lock for
# each). New inputs go to a scratch folder first: the checked-in corpus is read, never written.
run_one() {
  local target=$1
  mkdir -p "$logs/$target.new" "artifacts/$target"
  local rc=0
  "$bin/$target" "$logs/$target.new" "corpus/$target" \
    -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" -dict="$(dict_for "$target")" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$logs/$target.log" 2>&1 || rc=$?
  echo "$rc" >"$logs/$target.rc"
}

running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$target" &
  running=$((running + 1))
done
wait || true

failed=0
for target in "${targets[@]}"; do
  log="$logs/$target.log"
  if [ "$(cat "$logs/$target.rc" 2>/dev/null || echo 1)" = 0 ]; then
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz $target: ok, $runs inputs in ${seconds}s"
  else
    failed=1
    echo "fuzz $target: FAILED"
    grep -v '^#[0-9]' "$log" | tail -n 80
    echo "reproduce: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $target <the artifact above>)"
  fi
done
exit "$failed"
