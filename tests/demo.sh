#!/usr/bin/env bash
# The whole loop on three throwaway test hosts named like the example manifests' (gpu-a, gpu-b,
# gpu-c), no GPU host needed: the plan, apply with its live verification, a second apply that
# touches nothing, a misspelt flag caught offline, a change whose server crashes while loading
# rolled back, status and history, then the weights pinned by revision and fetched to every host. The hosts are containers (tests/hostlab/) running the
# SGLang stand-in (fixtures/fake-sglang/), and are torn down at the end.
#
#   tests/demo.sh                       the loop (about 80 s once the image and build exist)
#   tests/demo.sh --dry-run [OPTIONS]   only `reconcile --dry-run manifests/ [OPTIONS]`
#
# Needs root (containers); as another user it builds, then re-runs itself through sudo.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.."
root=$PWD
built=0
[ "${1:-}" = --built ] && { built=1; shift; }
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || {
    echo "tests/demo.sh: needs root (the test hosts are containers) and there is no sudo here: run it from a root shell" >&2
    exit 1
  }
  # The packages first (as root: the build needs protoc), then built as this user before sudo:
  # sudo's PATH (secure_path) seldom has cargo, and a root build would leave target/ owned by root.
  sudo -- bash tests/hostlab/build-rootfs.sh >/dev/null
  cargo build --locked --release --quiet
  exec sudo -- "$self" --built "$@"
fi
mode=loop
[ "${1:-}" = --dry-run ] && { mode=dry-run; shift; }

export STATE=${STATE:-/tmp/reconcile-demo} PREFIX=demo SUBNET=10.215 ALIASES="gpu-a gpu-b gpu-c"
start=$SECONDS
echo "Setting up: the test hosts' image, the release build, three hosts (gpu-a, gpu-b, gpu-c)..."
bash tests/hostlab/build-rootfs.sh >/dev/null
[ "$built" = 1 ] || cargo build --locked --release --quiet
bash tests/hostlab/down.sh >/dev/null 2>&1 || true # what a killed earlier run left
repo=$(mktemp -d /tmp/reconcile-demo-repo.XXXXXX)
trap 'bash "$root/tests/hostlab/down.sh" >/dev/null; rm -rf "$repo"' EXIT
bash tests/hostlab/up.sh 3 >/dev/null

on() { ssh -F "$STATE/ssh_config" "$@"; }
for h in gpu-a gpu-b gpu-c; do
  # What the manifests expect of a GPU host, so preflight passes: the venv's Python (here the
  # system one, which has the stand-in as its `sglang`) and the model folders.
  on "$h" 'mkdir -p /root/ml-env/bin /shared/models/Qwen3.5-122B-A10B /shared/models/Qwen3.5-397B-A17B-NVFP4 && ln -sf /usr/bin/python3 /root/ml-env/bin/python3'
  # The 122B model's folder as the same share on every host, with stand-in weights (two 8 MiB
  # safetensors shards, their index and a config, the same bytes everywhere): what the last
  # step pins.
  on "$h" python3 - /shared/models/Qwen3.5-122B-A10B <<'EOF'
import json, struct, sys
folder = sys.argv[1]
json.dump({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe"}, open(folder + "/config.json", "w"))
shards = {}
for i in (1, 2):
    name = "model-%05d-of-00002.safetensors" % i
    header = json.dumps({"w%d" % i: {"dtype": "BF16", "shape": [4194304], "data_offsets": [0, 8388608]}}).encode()
    with open(folder + "/" + name, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes([i]) * 8388608)
    shards["w%d" % i] = name
json.dump({"metadata": {"total_size": 2 * 8388608}, "weight_map": shards}, open(folder + "/model.safetensors.index.json", "w"))
EOF
  # The stand-in's timings, as a manager-wide default rather than in the manifests: nothing sets
  # them on a real GPU host, so manifests/ stays the real thing and they appear in no rendered unit
  # or diff; and a default reaches every unit systemd starts, the one a rollback restores too.
  # A 5 s weight load (a real one takes ~15 min), 1.5 s of CUDA graph capture, a 2 s warmup
  # answering 503, 600 MiB of resident memory over the ranks, enough for a sparkline.
  on "$h" 'mkdir -p /etc/systemd/system.conf.d && cat > /etc/systemd/system.conf.d/fake-sglang.conf && systemctl daemon-reload' <<'EOF'
[Manager]
DefaultEnvironment=FAKE_SGLANG_LOAD_SECONDS=5 FAKE_SGLANG_GRAPH_SECONDS=1.5 FAKE_SGLANG_WARMUP_SECONDS=2 FAKE_SGLANG_MEMORY_MB=600
EOF
done
# gpu-a already runs a hand-written unit, as a host adopting reconcile would.
on gpu-a 'cat > /etc/systemd/system/sglang-qwen.service && systemctl daemon-reload && systemctl enable sglang-qwen' \
  < fixtures/demo/sglang-qwen.service
echo "Set up in $((SECONDS - start))s."

if [ "$mode" = dry-run ]; then
  set +e
  ./target/release/reconcile --dry-run manifests/ --ssh-config "$STATE/ssh_config" "$@"
  rc=$?
  echo "(exit code $rc: 0 nothing to change, 2 changes pending, 1 error)"
  exit 0
fi

# The loop runs on a copy of manifests/ in a git repository of its own: steps 4 and 5 edit and
# commit there, never in this checkout, and apply records that repository's commits.
git -C "$repo" init -q
git -C "$repo" config user.name "reconcile demo"
git -C "$repo" config user.email demo@localhost.invalid
cp -r manifests "$repo/"
git -C "$repo" add manifests
git -C "$repo" commit -qm "manifests/ as in the reconcile repository"
loop_start=$SECONDS
export PATH=$root/target/release:$PATH RECONCILE_SSH_CONFIG=$STATE/ssh_config
cd "$repo"
cat <<EOF

The loop runs in $repo, a git repository holding a copy of manifests/ (steps 4 and 5
edit the copy; manifests/ is not changed). Every command below runs there, with
RECONCILE_SSH_CONFIG=$STATE/ssh_config (the test hosts' ssh_config).
EOF

n=0
unexpected=0
bold='' plain=''
[ -t 1 ] && [ -z "${NO_COLOR:-}" ] && bold=$'\033[1m' plain=$'\033[0m'
step() {
  n=$((n + 1))
  step_start=$SECONDS
  printf '\n%s== %d. %s%s\n' "$bold" "$n" "$1" "$plain"
}
# run EXPECTED MEANING-OF-EACH-CODE... -- COMMAND: shows the command, runs it, explains its exit code.
run() {
  local expected=$1 meanings=() rc
  shift
  while [ "$1" != -- ]; do meanings+=("$1"); shift; done
  shift
  printf '$ %s\n' "$*"
  set +e
  "$@"
  rc=$?
  set -e
  local why="not one of its documented codes"
  for m in "${meanings[@]}"; do [ "${m%%:*}" = "$rc" ] && why=${m#*: }; done
  printf '(exit code %d: %s; step took %ds)\n' "$rc" "$why" $((SECONDS - step_start))
  if [ "$rc" != "$expected" ]; then
    echo "demo: expected exit code $expected here" >&2
    unexpected=$((unexpected + 1))
  fi
}
PLAN=("0: nothing to change" "1: error" "2: changes pending")
APPLY=("0: every unit converged or needed nothing" "1: error before any change on some host"
  "3: verification failed on some host, which was rolled back to its previous unit, verified"
  "4: verification failed and so did the rollback")
STATUS=("0: every unit in sync" "1: a host could not be read" "2: some unit not in sync")
# edit SED-ARGS...: edits the copy of the 122B manifest and shows the change; a pattern that no
# longer matches (manifests/ changed) stops the demo rather than show a step that changed nothing.
edit() {
  sed -i "$@" manifests/sglang-qwen3.5-122b.yaml
  if git diff --quiet; then
    echo "demo: the edit of manifests/sglang-qwen3.5-122b.yaml matched nothing; update tests/demo.sh" >&2
    exit 1
  fi
  printf '$ git diff\n'
  git --no-pager diff --color=auto
}

step "The plan: gpu-a's hand-written unit adopted (a restart: flags change), two new units"
run 2 "${PLAN[@]}" -- reconcile plan

step "Apply: gpu-a first (the canary), then gpu-b and gpu-c, each verified live while it loads"
run 0 "${APPLY[@]}" -- reconcile apply

step "Apply again: nothing changed, so nothing is touched (no upload, reload or restart)"
run 0 "${APPLY[@]}" -- reconcile apply

step "A misspelt flag, caught offline: no host is contacted"
edit 's/enable-fused-moe-sum-all-reduce: true/enable-fused-moe-sum-allreduce: true/'
run 1 "${APPLY[@]}" -- reconcile apply
printf '$ git checkout manifests/   # the typo is dropped\n'
git checkout -q manifests/

step "A change whose server crashes while loading: rolled back, with the failed start's journal"
# A higher static memory fraction leaves too little GPU memory for CUDA graph capture: SGLang then
# dies in capture with CUDA out of memory. The stand-in has no GPU to run out of, so the change
# also sets its failure knob: FAKE_SGLANG_FAIL=oom, 0.5 s into the 1.5 s capture (5 s load).
edit -e 's/mem-fraction-static: 0.85/mem-fraction-static: 0.93/' \
  -e 's/^env:$/env:\n  FAKE_SGLANG_FAIL: oom           # the stand-in: CUDA out of memory at FAIL_AT\n  FAKE_SGLANG_FAIL_AT: "5.5"/'
printf '$ git commit -am "sglang-qwen: mem-fraction-static 0.93"\n'
git commit -qam "sglang-qwen: mem-fraction-static 0.93"
run 3 "${APPLY[@]}" -- reconcile apply

step "Status: the hosts run the last good unit; git still says 0.93 (pending_change)"
run 2 "${STATUS[@]}" -- reconcile status

step "History: gpu-a's deployments (the rolled-back change is not one) and the units kept to fall back on"
run 0 "0: shown" "1: error" -- reconcile history sglang-qwen --host gpu-a

step "The weights pinned by revision: locked, then fetched to every host and verified before its server stops"
printf '$ git revert --no-edit HEAD   # the 0.93 change goes\n'
git revert --no-edit HEAD >/dev/null
# The share's folder could change under the servers; pinned, each host runs a copy of its own,
# every file's sha256 checked against reconcile.lock (written by `reconcile lock`, committed).
edit 's|^  model_path: /shared/models/Qwen3.5-122B-A10B$|  model:                               # pinned: reconcile.lock holds the hashes\n    store: /shared/models/Qwen3.5-122B-A10B\n    revision: 2026-11-30|'
run 0 "0: the lock file is written" "1: a revision could not be listed" -- reconcile lock
printf '$ git add manifests && git commit -m "sglang-qwen: pin the weights by revision"\n'
git add manifests && git commit -qm "sglang-qwen: pin the weights by revision"
run 2 "${PLAN[@]}" -- reconcile plan
run 0 "${APPLY[@]}" -- reconcile apply

cat <<EOF

What an operator does next with a change that fails: fix it, or revert it (git revert HEAD), and apply again.
The loop took $((SECONDS - loop_start))s (set-up $((loop_start - start))s before it). The hosts are torn down now.
EOF
[ "$unexpected" = 0 ] || { echo "demo: $unexpected step(s) ended with an unexpected exit code" >&2; exit 1; }
