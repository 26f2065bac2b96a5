#!/usr/bin/env bash
# The main job on a built-in default, no GPU host needed: boots three throwaway test hosts named
# like the example manifests' (gpu-a, gpu-b, gpu-c), runs `reconcile --dry-run manifests/` against
# them, and tears them down. Needs root (the hosts are containers).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "tests/demo.sh: needs root (test hosts are containers); try: sudo $0" >&2; exit 1; }
export STATE=${STATE:-/tmp/reconcile-demo} PREFIX=demo SUBNET=10.215 ALIASES="gpu-a gpu-b gpu-c"
bash tests/hostlab/build-rootfs.sh >/dev/null
cargo build --locked --release --quiet
trap 'bash tests/hostlab/down.sh >/dev/null' EXIT
bash tests/hostlab/up.sh 3 >/dev/null
# What the manifests expect of a GPU host, so preflight passes: the venv's Python (the stand-in's)
# and the model folders.
for h in gpu-a gpu-b gpu-c; do
  ssh -F "$STATE/ssh_config" "$h" 'mkdir -p /root/ml-env/bin /shared/models/Qwen3.5-122B-A10B /shared/models/Qwen3.5-397B-A17B-NVFP4 && ln -sf /usr/bin/python3 /root/ml-env/bin/python3'
done
# gpu-a already runs a hand-written unit, as a host adopting reconcile would.
ssh -F "$STATE/ssh_config" gpu-a 'cat > /etc/systemd/system/sglang-qwen.service && systemctl daemon-reload' \
  < fixtures/demo/sglang-qwen.service
set +e
./target/release/reconcile --dry-run manifests/ --ssh-config "$STATE/ssh_config" "$@"
rc=$?
echo "(exit code $rc: 0 nothing to change, 2 changes pending, 1 error)"
