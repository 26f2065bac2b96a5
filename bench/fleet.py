"""The measuring half of bench/fleet.sh: runs reconcile and the ssh floor over the hosts fb1..fb16
and prints a table of medians and ratios measured in the same run."""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import ansible as ansible_peer  # bench/ansible.py (this script's folder comes first on sys.path)

SSH_CONFIG, REPEATS = sys.argv[1], int(sys.argv[2])
BIN = os.path.abspath("target/release/reconcile")
HOSTS = [f"fb{i}" for i in range(1, 17)]
UNIT = "bench-fleet.service"


def manifest(hosts, failing=(), release="1", faults=None):
    """`failing` hosts crash a second in; `faults` maps hosts to a stand-in failure mode."""
    faults = dict(faults or {})
    faults.update({h: "crash" for h in failing})
    return ansible_peer.fleet_manifest(hosts, release, faults)


def write(text):
    d = tempfile.mkdtemp()
    os.makedirs(f"{d}/manifests")
    with open(f"{d}/manifests/m.yaml", "w") as f:
        f.write(text)
    return d


def reconcile(workdir, *args):
    """Runs reconcile; returns (wall seconds, user+sys CPU seconds, peak RSS KiB, exit code, stdout).
    CPU and RSS are this run's alone (its own and the ssh processes it waited for), from wait4:
    RUSAGE_CHILDREN's peak is the largest child this script ever waited for (Ansible's Python)."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        p = subprocess.Popen([BIN, *args, "--ssh-config", SSH_CONFIG], cwd=workdir, stdout=out,
                             stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read().decode()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, p.returncode, stdout


def round_trips(trace):
    """Sequential round trips per host after connect, from --trace-remote's lines: each connection
    counts its longest chain of commands (`rounds=`), and a host reached twice (apply's look at
    every host, then its turn) adds its connections up. Returns {host: round trips}."""
    per_host, current = {}, {}
    for line in trace.splitlines():
        if not line.startswith("trace-remote "):
            continue
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f and not f.startswith("command="))
        host = fields["host"]
        if '"connect"' in line:
            per_host[host] = per_host.get(host, 0) + current.pop(host, 0)
            current[host] = 0
        else:
            current[host] = max(current.get(host, 0), int(fields["rounds"]))
    for host, rounds in current.items():
        per_host[host] = per_host.get(host, 0) + rounds
    return per_host


def traced(workdir, *args):
    """Runs reconcile once with --trace-remote; returns (exit code, stdout, round trips per host)."""
    p = subprocess.run([BIN, *args, "--ssh-config", SSH_CONFIG, "--trace-remote"], cwd=workdir,
                       capture_output=True, text=True)
    return p.returncode, p.stdout, round_trips(p.stderr)


def trips(per_host):
    """Round trips per host as `min-max` (one figure when every host took the same)."""
    if not per_host:
        return "?"
    low, high = min(per_host.values()), max(per_host.values())
    return str(low) if low == high else f"{low}-{high}"


def floor(hosts):
    """Plain parallel ssh, one fresh connection per host, reading the unit. Returns wall seconds."""
    return floor_run(hosts)[0]


def floor_run(hosts):
    """The floor, as (wall seconds, user+sys CPU seconds of the ssh clients)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(["ssh", "-F", SSH_CONFIG, h, "cat", f"/etc/systemd/system/{UNIT}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for h in hosts
    ]
    for p in procs:
        p.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def hosts_cpu(hosts):
    """CPU seconds the hosts' containers have used so far (their sshd and what it runs), from
    each host's own cgroup; on this machine they share its cores with reconcile and the floor."""
    total = 0
    for h in hosts:
        with open(f"/sys/fs/cgroup/unified/hostlab/{h}/cpu.stat") as f:
            total += int(next(l for l in f if l.startswith("usage_usec")).split()[1])
    return total / 1e6


def on_hosts(fn, hosts):
    """Runs fn; returns the CPU seconds it cost on the hosts."""
    before = hosts_cpu(hosts)
    fn()
    return hosts_cpu(hosts) - before


def host_args(hosts):
    return [a for h in hosts for a in ("--host", h)]


def median_of(fn):
    return statistics.median(fn() for _ in range(REPEATS))


v1 = write(manifest(HOSTS))
wall, _, _, code, out = reconcile(v1, "apply", "--format", "json", "--canary", "1", "--max-parallel", "16")
assert code == 0, out
print(f"setup: applied release 1 to {len(HOSTS)} hosts in {wall:.1f} s\n")

# Round trips: sequential remote commands per host after connect (target: <= 2 for a plan and a
# no-op apply), read from --trace-remote; each costs tens of ms on a real network, ~0 here.
print(f"{'what':<34} {'reconcile (s)':>14} {'ssh floor (s)':>14} {'ratio':>7} {'round trips/host':>17}")
for n in (1, 4, 8, 16):
    hosts = HOSTS[:n]
    ours = median_of(lambda: reconcile(v1, "plan", *host_args(hosts))[0])
    base = median_of(lambda: floor(hosts))
    rt = trips(traced(v1, "plan", *host_args(hosts))[2])
    print(f"{'dry-run, ' + str(n) + ' hosts':<34} {ours:>14.3f} {base:>14.3f} {ours / base:>7.2f} {rt:>17}")

# A change that restarts the server (another RELEASE): the deep check runs on every host the first
# time (the host's SGLang parses the arguments); the same change planned again, as CI plans each
# push of a pull request, reads the verdict each host kept (target: <= 1.2x the floor).
# The same change with --no-deep is what a plan of it costs without any deep check: the change-only
# checks (model path, nvidia-smi, ss) that every plan of a change runs in its survey.
firsts, agains, no_deeps = [], [], []
for r in range(REPEATS):
    changed = write(manifest(HOSTS, release=f"deep-{r}-{time.time_ns()}"))
    firsts.append(reconcile(changed, "plan", *host_args(HOSTS))[0])
    agains.append(reconcile(changed, "plan", *host_args(HOSTS))[0])
    no_deeps.append(reconcile(changed, "plan", "--no-deep", *host_args(HOSTS))[0])
rt_first = trips(traced(write(manifest(HOSTS, release=f"deep-t-{time.time_ns()}")), "plan", *host_args(HOSTS))[2])
rt_again = trips(traced(changed, "plan", *host_args(HOSTS))[2])
base = median_of(lambda: floor(HOSTS))
for what, times, rt in (("restarting change, first plan", firsts, rt_first),
                        ("the same change again", agains, rt_again),
                        ("the same change, --no-deep", no_deeps, "")):
    ours = statistics.median(times)
    print(f"{what + ', 16':<34} {ours:>14.3f} {base:>14.3f} {ours / base:>7.2f} {rt:>17}")
# The same change again on one host, where no other host's work queues on this machine's cores,
# and what the 16 hosts spend on it beside the floor's: on a fleet, each host spends its share on
# its own CPU.
one = HOSTS[:1]
ours = median_of(lambda: reconcile(changed, "plan", *host_args(one))[0])
base = median_of(lambda: floor(one))
print(f"{'the same change again, 1':<34} {ours:>14.3f} {base:>14.3f} {ours / base:>7.2f}")
again_cpu = median_of(lambda: on_hosts(lambda: reconcile(changed, "plan", *host_args(HOSTS)), HOSTS))
floor_cpu = median_of(lambda: on_hosts(lambda: floor(HOSTS), HOSTS))
print(f"CPU on the 16 hosts for the same change again: reconcile {again_cpu:.3f} s, floor {floor_cpu:.3f} s, "
      f"ratio {again_cpu / floor_cpu:.2f}")

# The peer: Ansible's --check --diff of the same rendered unit on the same hosts, in pairs with
# reconcile's dry-run (bench/ansible.py says which of Ansible's fast settings it uses).
check = ansible_peer.check_runs(SSH_CONFIG, HOSTS, UNIT, ansible_peer.render_units(BIN, v1, HOSTS),
                                ansible_peer.ensure_venv())
pairs = [(check()[0], reconcile(v1, "plan", *host_args(HOSTS))[0]) for _ in range(REPEATS)]
theirs, ours = (statistics.median(p[k] for p in pairs) for k in (0, 1))
print(f"{'ansible --check --diff, 16 hosts':<34} {theirs:>14.3f} s; reconcile in the same pairs {ours:.3f} s; "
      f"ansible / reconcile {theirs / ours:.2f}x (target >= 10x)")
print(f"  ansible-core {ansible_peer.ANSIBLE_VERSION}: {ansible_peer.SETTINGS.format(forks=len(HOSTS))}")

cpu_rss = [reconcile(v1, "plan", *host_args(HOSTS)) for _ in range(REPEATS)]
cpu = statistics.median(r[1] for r in cpu_rss)
rss = max(r[2] for r in cpu_rss)
remote_ours = statistics.median(on_hosts(lambda: reconcile(v1, "plan", *host_args(HOSTS)), HOSTS) for _ in range(REPEATS))
remote_floor = statistics.median(on_hosts(lambda: floor(HOSTS), HOSTS) for _ in range(REPEATS))
# reconcile's CPU counts its ssh master processes (they do the key exchange), so the floor's
# ssh clients are the fair comparison.
floor_cpu = statistics.median(floor_run(HOSTS)[1] for _ in range(REPEATS))

eight = HOSTS[:8]
noop = median_of(lambda: reconcile(v1, "apply", "--max-parallel", "8", *host_args(eight))[0])
base8 = median_of(lambda: floor(eight))
rt = trips(traced(v1, "apply", "--max-parallel", "8", *host_args(eight))[2])
print(f"{'no-op apply, 8 hosts':<34} {noop:>14.3f} {base8:>14.3f} {noop / base8:>7.2f} {rt:>17}")

# A restart: one host to release 2 and back, traced (write, daemon-reload, restart, and the
# verification's polling, which is as many round trips as the load takes samples).
restart_v2 = write(manifest(HOSTS[:1], release="2"))
code, out, per_host = traced(restart_v2, "apply", "--host", HOSTS[0])
assert code == 0, out
print(f"{'restart, 1 host (round trips)':<34} {'':>14} {'':>14} {'':>7} {trips(per_host):>17}")
code, out, _ = traced(v1, "apply", "--host", HOSTS[0])
assert code == 0, out

v2 = write(manifest(eight, failing=("fb5",), release="2"))
start = time.time()
wall, _, _, code, out = reconcile(v2, "apply", "--format", "json", "--canary", "1", "--max-parallel", "3", "--max-failures", "1")
units = json.loads(out)["units"]
failed = next(u for u in units if u["outcome"] in ("rolled_back", "rollback_failed"))
stop = failed["verification"]["stages"][-1]["at_unix"] - start
outcomes = ", ".join(f"{u['host']} {u['outcome']}" for u in units)
print(f"\nrolling apply over 8 hosts, fb5 failing (--canary 1 --max-parallel 3 --max-failures 1), exit {code}:")
print(f"  total {wall:.1f} s; stopped (fb5's failure seen) {stop:.1f} s after the start")
print(f"  {outcomes}")
print(f"\nreconcile at 16 hosts: CPU {cpu:.3f} s (user+sys, with its ssh masters; the floor's 16 ssh clients: "
      f"{floor_cpu:.3f} s, ratio {cpu / floor_cpu:.2f}), peak RSS {rss / 1024:.1f} MiB (target < 64 MiB)")

# Load: a rolling apply over all 16 hosts with faults injected in a third of them, the failure
# budget wide open. Every host must end correct: the faulty ones back on release 1 and serving,
# the others on release 2 and serving; no host's failure may touch another.
faults = {"fb3": "crash", "fb6": "stall", "fb9": "wrong-model", "fb12": "crash", "fb14": "no-port"}
_, _, _, code, out = reconcile(v1, "apply", "--format", "json", "--canary", "1", "--max-parallel", "16")
assert code == 0, out
v3 = write(manifest(HOSTS, release="3", faults=faults).replace("load_deadline: 30s", "load_deadline: 10s"))
wall, _, _, code, out = reconcile(v3, "apply", "--format", "json", "--canary", "1", "--max-parallel", "8", "--max-failures", "16")
units = {u["host"]: u["outcome"] for u in json.loads(out)["units"]}
wrong = []
for h in HOSTS:
    want_release, want_outcome = ("1", "rolled_back") if h in faults else ("3", "converged")
    release = subprocess.run(["ssh", "-F", SSH_CONFIG, h, "grep -o 'RELEASE=[0-9]*' /etc/systemd/system/" + UNIT + "; systemctl is-active " + UNIT],
                             capture_output=True, text=True).stdout.split()
    if units.get(h) != want_outcome or release != [f"RELEASE={want_release}", "active"]:
        wrong.append(f"{h}: {units.get(h)} {release}")
print(f"CPU on the 16 hosts during one dry-run (their sshd and the commands it runs): reconcile {remote_ours:.3f} s, "
      f"floor {remote_floor:.3f} s, ratio {remote_ours / remote_floor:.2f} (here the hosts share this machine's cores)")

print(f"\nload: rolling apply over 16 hosts with faults in {len(faults)} ({', '.join(f'{h} {m}' for h, m in faults.items())}): "
      f"{wall:.1f} s, exit {code}")
print(f"  {sum(o == 'converged' for o in units.values())} converged, {sum(o == 'rolled_back' for o in units.values())} rolled back; "
      + ("every host ended correct (faulty hosts on release 1, the others on release 3, all active)" if not wrong else f"WRONG: {wrong}"))
