#!/usr/bin/env bash
# Short fuzz run for CI: each target for FUZZ_SECONDS (default 30) seconds, starting from the
# checked-in corpus. Exits non-zero when a target crashes (panics, times out, runs out of memory),
# after printing the input that did it and how to reproduce it.
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer=address); on a stable toolchain
# RUSTC_BOOTSTRAP=1 lets it use them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-30}
targets=(manifest_parse render_roundtrip)

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
for target in "${targets[@]}"; do
  # New inputs go to a scratch folder first: the checked-in corpus is read, never written.
  mkdir -p "$logs/$target.new"
  log="$logs/$target.log"
  if cargo fuzz run "$target" "$logs/$target.new" "corpus/$target" -- \
    -max_total_time="$seconds" -dict=manifest.dict -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 >"$log" 2>&1; then
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
