#!/usr/bin/env bash
# Preload benchmark: how long a restarted server takes to load its weights from a cold page cache,
# with and without `reconcile apply` preloading them into the cache before the old server stops, on
# a throwaway test host of its own. The weights are real files (safetensors shards of SIZE_MB in
# all) that the SGLang stand-in reads whole while it loads, as the real loader does; the kernel's
# page cache is dropped before each restart (`echo 3 > /proc/sys/vm/drop_caches`, this machine's:
# the test host shares its kernel). Prints medians of REPEATS and the ratio.
# Usage: bench/preload.sh [REPEATS] [SIZE_MB]   (defaults 3 and 4096; about three minutes)
set -euo pipefail
. "$(dirname "$0")/lab.sh"
need_root "test hosts, drop_caches" "$@"
cd "$(dirname "$0")/.."
REPEATS=${1:-3}
SIZE_MB=${2:-4096}
export STATE=/tmp/reconcile-stage-bench PREFIX=sb SUBNET=10.217  # apart from the test lab
lab_up 1
python3 bench/preload.py "$STATE/ssh_config" "$REPEATS" "$SIZE_MB"
