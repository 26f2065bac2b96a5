#!/bin/bash
# reboot.sh HOST -- reboots one host of a lab made by up.sh, for real: `systemctl reboot` inside it,
# then, once its systemd-nspawn has exited (nspawn ends on a reboot, exit status 133; under
# systemd-nspawn@.service systemd would start it again), boots the same container again the way
# up.sh did: the same overlay (its upper dir keeps /etc/systemd/system, /var/lib/reconcile, the host
# keys, so known_hosts still matches), the same network namespace and address, the same cgroups.
# Returns once sshd accepts our key again; prints how long the host was down.
# Env: WORK, STATE, PREFIX as for up.sh; BOOT_TIMEOUT (s, default 60) for each of the two waits;
# HOLD (s, default 0): how long the host stays down before it boots again (a slow or stuck reboot).
set -euo pipefail
h=${1:?usage: reboot.sh HOST}
PREFIX=${PREFIX:-rl}
WORK=${WORK:-/var/lib/reconcile-lab/hosts-$PREFIX}
STATE=${STATE:-/tmp/reconcile-lab}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-60}
d=$WORK/$h
[ "$(id -u)" = 0 ] || { echo "reboot.sh: must run as root" >&2; exit 1; }
[ -f "$d/pid" ] && mountpoint -q "$d/root" || { echo "reboot.sh: $h is not a host up.sh booted ($d)" >&2; exit 1; }
is_nspawn() { [ "$(cat /proc/$1/comm 2>/dev/null)" = systemd-nspawn ]; }
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN{printf "%.1f", a-b}'; }
pid=$(cat "$d/pid")
is_nspawn "$pid" || { echo "reboot.sh: $h's nspawn (pid $pid) is not running" >&2; exit 1; }

t0=$(date +%s.%N)
# The reboot cuts this very connection, so ssh's own status says nothing.
ssh -n -F "$STATE/ssh_config" "$h" systemctl reboot >/dev/null 2>&1 || true
until ! is_nspawn "$pid"; do
  if (( $(date +%s) - ${t0%.*} > BOOT_TIMEOUT )); then echo "reboot.sh: $h did not go down within ${BOOT_TIMEOUT}s" >&2; exit 1; fi
  sleep 0.1
done
down=$(since "$t0")
sleep "${HOLD:-0}"

# Boot it again, as up.sh does (keep the two in step).
mapfile -t cgs < "$d/cgroups"
memflag=0; [ "${#cgs[@]}" -ge 3 ] && memflag=1
echo "--- reboot.sh: booting $h again ($(date -Is)) ---" >> "$d/console.log"
setsid bash -c '
  for cg in "${@:3}"; do echo $$ > "$cg/cgroup.procs"; done
  exec systemd-nspawn --quiet --register=no --keep-unit -M "$1" -D "$2" \
    --network-namespace-path="/run/netns/$1" --console=read-only \
    --setenv=HOSTLAB_MEMCG='"$memflag"' --kill-signal=SIGRTMIN+3 /usr/local/sbin/hostlab-init
' _ "$h" "$d/root" "${cgs[@]}" >> "$d/console.log" 2>&1 < /dev/null &
new=$!
echo "$new" > "$d/pid"
# hosts.tsv: name ip pid; only this host's line changes.
[ -f "$STATE/hosts.tsv" ] && sed -i "s/^\\($h\\t[^\\t]*\\)\\t.*\$/\\1\\t$new/" "$STATE/hosts.tsv"

t1=$(date +%s.%N)
until ssh -n -F "$STATE/ssh_config" -o ConnectTimeout=1 "$h" true 2>/dev/null; do
  if ! kill -0 "$new" 2>/dev/null; then echo "reboot.sh: $h's systemd-nspawn exited:" >&2; tail -20 "$d/console.log" >&2; exit 1; fi
  if (( $(date +%s) - ${t1%.*} > BOOT_TIMEOUT )); then echo "reboot.sh: $h's sshd not up ${BOOT_TIMEOUT}s after booting again" >&2; tail -20 "$d/console.log" >&2; exit 1; fi
  sleep 0.2
done
echo "$h rebooted: down after ${down}s, held down ${HOLD:-0}s, ssh ok again $(since "$t1")s after booting again, $(since "$t0")s in all"
