"""The measuring half of bench/fetch.sh: builds a repository of SIZE_MB on the lab's hub (olah in
pw1), measures olah's unshaped rate, shapes pw1's link with tc, then for each host count N fetches
the same files with plain GETs and with `reconcile apply` of a fresh revision to pw2..pw(N+1), and
times `reconcile plan` of the pinned manifest against a plain `model_path` one. With PEERS=N, it
measures the swarm (`peers:`) against N independent fetches instead (`peers()` below). Every
figure is printed beside the baseline it is measured against in the same run."""

import atexit
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

SSH_CONFIG, BIN, SIZE_MB = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Ascending: each run's hosts are the last run's and more, so no host's unit is left behind.
COUNTS = sorted(int(n) for n in sys.argv[4:])
LINK_MBIT = int(os.environ.get("LINK_MBIT", "100"))
REPEATS = int(os.environ.get("REPEATS", "5"))
PEERS = int(os.environ.get("PEERS", "0"))
PEER_PORT = 39209
HUB_NS, ENDPOINT = "pw1", "http://10.218.1.2:8090"
REPO_ID = "labs/fetch-bench"
HUB_ROOT = "/var/lib/reconcile-fetch-bench/hub"
REPO = f"{HUB_ROOT}/mirrors/models/{REPO_ID}"
# Each host's root file system as this machine sees it (up.sh's overlay), and the copies' folder
# in it (weights.md: ROOT/KEY/REV, made only by renaming the verified .REV.partial).
WORK = os.environ.get("WORK", "/var/lib/reconcile-lab/hosts-pw")
COPIES = "/var/lib/reconcile-weights/labs--fetch-bench"
SHARDS = 4
HOSTS = [f"pw{i}" for i in range(2, max(COUNTS) + 2)]
LIMIT = LINK_MBIT * 1e6 / 8  # bytes a second
MB = 1e6
TMP = tempfile.mkdtemp(prefix="fetch-bench-")  # the manifests and locks of each run
atexit.register(shutil.rmtree, TMP, True)


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def lfs(path, header, size):
    """A safetensors shard kept the git-LFS way (tests/integration/hub.rs): the object under
    .git/lfs/objects by its sha256, a pointer in the tree. One U8 tensor of `size` bytes; the data
    is a random MiB repeated (random, so nothing on the way can compress it)."""
    block = os.urandom(1 << 20)
    header = json.dumps(header).encode()
    tmp = f"{REPO}/.git/lfs/tmp-object"
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    h = hashlib.sha256()
    with open(tmp, "wb") as f:
        for chunk in (struct.pack("<Q", len(header)), header):
            f.write(chunk)
            h.update(chunk)
        left = size
        while left:
            chunk = block[:min(left, len(block))]
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
        total = f.tell()
    oid = h.hexdigest()
    obj = f"{REPO}/.git/lfs/objects/{oid[:2]}/{oid[2:4]}/{oid}"
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    os.rename(tmp, obj)
    with open(f"{REPO}/{path}", "w") as f:
        f.write(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {total}\n")
    return total


def commit(run):
    """A fresh revision: the same shards, a config.json that names the run (a new commit is a
    new folder on the hosts, so every run fetches all the bytes again)."""
    with open(f"{REPO}/config.json", "w") as f:
        json.dump({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "run": run}, f)
    git("add", "-A")
    git("commit", "-q", "-m", f"run {run}")
    return git("rev-parse", "HEAD")


def build_repo():
    subprocess.run(["rm", "-rf", REPO], check=True)
    os.makedirs(REPO)
    git("init", "-q", "-b", "main")
    git("config", "user.email", "bench@reconcile.test")
    git("config", "user.name", "bench")
    per = SIZE_MB * (1 << 20) // SHARDS
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    sizes = {}
    for n in names:
        header = {"w": {"dtype": "U8", "shape": [per], "data_offsets": [0, per]}}
        sizes[n] = lfs(n, header, per)
    with open(f"{REPO}/model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {"w": names[0]}}, f)
    return names, sizes


def timed_gets(hosts, urls):
    """Plain GETs: on each host's network namespace, curl fetches `urls` one after another, the
    hosts at once. Answers each host's seconds."""
    script = "; ".join(f"curl -sfL -o /dev/null {u} || exit 1" for u in urls)

    def one(host):
        t0 = time.monotonic()
        subprocess.run(["ip", "netns", "exec", host, "sh", "-c", script], check=True)
        return time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(len(hosts)) as pool:
        return list(pool.map(one, hosts))


def manifest(hosts, revision, at_once, model_path=None, peers=False):
    # One service, one unit a host (the GPU pair 0,1 on each); the stand-in's start-up kept short.
    if model_path:
        model = f"model_path: {model_path}"
    else:
        swarm = f", peers: {{ port: {PEER_PORT} }}" if peers else ""
        model = f"model: {{ hub: {REPO_ID}, revision: {revision}, endpoint: {ENDPOINT}, at_once: {at_once}{swarm} }}"
    return f"""service: fetch-bench
hosts: [{", ".join(hosts)}]
sglang:
  python: /usr/bin/python3
  version: 0.5.23
  {model}
  served_model_name: bench
  port: 30000
  flags: {{ tp-size: 2 }}
env: {{ CUDA_VISIBLE_DEVICES: "0,1", FAKE_SGLANG_GPU_COUNT: "64", FAKE_SGLANG_LOAD_SECONDS: "1", FAKE_SGLANG_GRAPH_SECONDS: "0", FAKE_SGLANG_WARMUP_SECONDS: "0" }}
verify: {{ crash_window: 3s, sample_interval: 500ms, stall_timeout: 4s, load_deadline: 20s }}
"""


def workdir(text):
    d = tempfile.mkdtemp(dir=TMP)
    os.makedirs(f"{d}/manifests")
    with open(f"{d}/manifests/m.yaml", "w") as f:
        f.write(text)
    return d


def reconcile(d, *args, check=True):
    t0 = time.monotonic()
    p = subprocess.run([BIN, *args], cwd=d, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if check and p.returncode != 0:
        sys.exit(f"reconcile {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p, seconds


names, sizes = build_repo()
rev = commit(0)
files = names + ["config.json", "model.safetensors.index.json"]
urls = [f"{ENDPOINT}/{REPO_ID}/resolve/{rev}/{n}" for n in files]
total = sum(os.path.getsize(f"{REPO}/{n}") for n in files[SHARDS:]) + sum(sizes.values())
print(f"repository: {SHARDS} safetensors shards + 2 small files, {total / MB:.1f} MB a revision")


def link_sent(host):
    """Bytes `host`'s link has sent (tc's count on its host0 qdisc)."""
    out = subprocess.run(["ip", "netns", "exec", host, "tc", "-s", "qdisc", "show", "dev", "host0"],
                         check=True, capture_output=True, text=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def hub_gets(rev):
    """How many times the hub served each file of `rev` (olah's access log, as the lab's tests
    count it: tests/integration/hub.rs `served`)."""
    with open(f"{HUB_ROOT}/olah.log", errors="replace") as f:
        log = f.read()
    return {n: log.count(f'"GET /{REPO_ID}/resolve/{rev}/{n} HTTP/1.1" 200') for n in files}


def swarm_apply(hosts, rev, peers):
    """`reconcile apply` of `rev` to `hosts` at once, with or without `peers:`. While it runs, each
    host's copy is watched from this machine (its overlay), so the fetch's own time is known: from
    the apply's start to the last copy in place. fetch.seconds does not tell it with peers, since
    it leaves out the wait for a server."""
    d = workdir(manifest(hosts, rev, len(hosts), peers=peers))
    reconcile(d, "lock")  # the lock reads a file or two from the hub: counted apart
    locked = hub_gets(rev)
    sent = link_sent(HUB_NS)
    in_place, stop = {}, threading.Event()

    def watch():
        while not stop.is_set() and len(in_place) < len(hosts):
            for h in hosts:
                if h not in in_place and os.path.isdir(f"{WORK}/{h}/root{COPIES}/{rev}"):
                    in_place[h] = time.monotonic() - t0
            time.sleep(0.05)

    t0 = time.monotonic()
    watcher = threading.Thread(target=watch)
    watcher.start()
    p, wall = reconcile(d, "apply", "--format", "json", "--ssh-config", SSH_CONFIG)
    stop.set()
    watcher.join()
    sent = link_sent(HUB_NS) - sent
    units = json.loads(p.stdout)["units"]
    ok = all(u["outcome"] == "converged" and u.get("fetch") for u in units)
    assert len(units) == len(hosts) and ok and len(in_place) == len(hosts), p.stdout
    # Who served whom: a unit fetched from a peer says so in its notes.
    source = {}
    for u in units:
        m = re.search(r"from (\S+), a peer that held the revision", json.dumps(u.get("notes")))
        source[u["host"]] = m.group(1) if m else None

    def depth(h):  # 0: a peer not among the hosts (not expected)
        if h not in source:
            return -len(hosts)
        return 1 if source[h] is None else depth(source[h]) + 1

    gets = hub_gets(rev)
    # When each host's transfer began (its copy in place less its fetch.seconds): the wait
    # before it, for the survey and, with peers, for a server.
    began = {u["host"]: in_place[u["host"]] - u["fetch"]["seconds"] for u in units}
    return {
        "wall": wall,
        "fetch": max(in_place.values()),
        "first": min(in_place.values()),
        "slowest": max(u["fetch"]["seconds"] for u in units),
        "fetched": [u["fetch"]["fetched"] for u in units],
        "gets": {n: gets[n] - locked[n] for n in files},
        "lock_gets": sum(locked.values()),
        "began": min(began.values()),
        "hub_seconds": [u["fetch"]["seconds"] for u in units if source[u["host"]] is None],
        "peer_seconds": sorted(u["fetch"]["seconds"] for u in units if source[u["host"]]),
        "sent": sent,
        "from_hub": sum(1 for h in source.values() if h is None),
        "rounds": max(depth(h) for h in source),
        "in_place": sorted(in_place.values()),
    }


def peers():
    """The swarm against independent fetches: PEERS hosts, each link shaped the same."""
    hosts = HOSTS[:PEERS]
    for h in [HUB_NS] + hosts:
        subprocess.run(["ip", "netns", "exec", h, "tc", "qdisc", "del", "dev", "host0", "root"],
                       capture_output=True)
        subprocess.run(["ip", "netns", "exec", h, "tc", "qdisc", "add", "dev", "host0", "root",
                        "tbf", "rate", f"{LINK_MBIT}mbit", "burst", "128kb", "latency", "50ms"],
                       check=True)
    print(f"every link shaped the same (tc tbf on host0 of {HUB_NS} and {hosts[0]}..{hosts[-1]}): "
          f"{LINK_MBIT} Mbit/s = {LIMIT / MB:.1f} MB/s; one copy takes {total / LIMIT:.1f} s at the limit")
    # The hub's rate for one client alone through its shaped link, now (olah is one Python
    # process; on a busy machine it can fall below the limit).
    alone = timed_gets(hosts[:1], urls)[0]
    print(f"one host alone from the hub (curl, the same files): {alone:.1f} s, "
          f"{total / alone / LIMIT:.2f} of the limit")
    # A first revision, not measured, so that both measured runs find the same: the service
    # already running on every host (the first install's survey and rollout differ).
    swarm_apply(hosts, commit(1), True)
    runs = {}
    for run, kind in enumerate(("independent", "peers"), start=2):
        runs[kind] = r = swarm_apply(hosts, commit(run), kind == "peers")
        assert all(f == total for f in r["fetched"]), (kind, r["fetched"], total)
        print(f"{kind}: copies in place at {', '.join(f'{t:.1f}' for t in r['in_place'])} s; "
              f"{r['from_hub']} from the hub, {PEERS - r['from_hub']} from peers, "
              f"{r['rounds']} round(s) deep; the first transfer began at {r['began']:.1f} s")
        hub_s = ", ".join(f"{x:.1f}" for x in r["hub_seconds"])
        peer_s = f"; from a peer {r['peer_seconds'][0]:.1f}-{r['peer_seconds'][-1]:.1f} s" \
            if r["peer_seconds"] else ""
        print(f"  fetch.seconds: from the hub {hub_s}{peer_s}; the lock's own GETs from the hub: "
              f"{r['lock_gets']}")
    # What serves the copies is gone once the fetch is over.
    left = 0
    for h in hosts:
        out = subprocess.run(["ssh", "-F", SSH_CONFIG, h, "systemctl list-units --no-legend "
                              "'reconcile-seed-*' | wc -l"], check=True, capture_output=True,
                             text=True).stdout
        left += int(out.strip())
    print(f"serving services left on the hosts after the peers run: {left}")
    print()
    a, b = runs["independent"], runs["peers"]
    shard = names[0]

    def row(what, x, y, fmt):
        print(f"{what:<40}  {fmt(x):>11}  {fmt(y):>11}  {y / x:>17.2f}")

    print(f"{PEERS} hosts at once (at_once: {PEERS}){'':<17}  {'independent':>11}  {'peers':>11}  "
          f"{'peers/independent':>17}")
    row("apply (s)", a["wall"], b["wall"], lambda v: f"{v:.1f}")
    row("fetch: apply start to last copy (s)", a["fetch"], b["fetch"], lambda v: f"{v:.1f}")
    row("  to first copy (s)", a["first"], b["first"], lambda v: f"{v:.1f}")
    row("  slowest host's fetch.seconds", a["slowest"], b["slowest"], lambda v: f"{v:.1f}")
    row(f"hub downloads of {shard}", a["gets"][shard], b["gets"][shard], str)
    hub_bytes = {k: sum(r["gets"][n] * (sizes.get(n) or os.path.getsize(f"{REPO}/{n}"))
                        for n in files) for k, r in runs.items()}
    row("hub's bytes served (access log, MB)", hub_bytes["independent"] / MB,
        hub_bytes["peers"] / MB, lambda v: f"{v:.1f}")
    row("bytes out of the hub's link (tc, MB)", a["sent"] / MB, b["sent"] / MB, lambda v: f"{v:.1f}")
    each = {k: sorted(set(r["gets"].values())) for k, r in runs.items()}
    print(f"hub downloads of every file: independent {each['independent']}, peers {each['peers']}")


if PEERS:
    peers()
    sys.exit(0)

# 1. Olah's own ceiling, over the lab link before any shaping: one client, then the most hosts at
# once (olah is one Python process that sends 4 KiB chunks; the ceiling is its CPU).
tc = ["ip", "netns", "exec", HUB_NS, "tc", "qdisc"]
subprocess.run(tc + ["del", "dev", "host0", "root"], capture_output=True)  # none unless rerun by hand
timed_gets(HOSTS[:1], urls[:1])  # the first GET reads the object from disk
one = statistics.median(timed_gets(HOSTS[:1], urls)[0] for _ in range(2))
many = max(timed_gets(HOSTS, urls))
print(f"olah unshaped: 1 client {total / one / MB:.1f} MB/s; {len(HOSTS)} at once "
      f"{len(HOSTS) * total / many / MB:.1f} MB/s together")
# Shaped on the hub's side of its link: every host's download shares this one limit.
subprocess.run(tc + ["add", "dev", "host0", "root", "tbf", "rate", f"{LINK_MBIT}mbit",
                     "burst", "128kb", "latency", "50ms"], check=True)
print(f"hub link shaped (tc tbf on {HUB_NS}'s host0): {LINK_MBIT} Mbit/s = {LIMIT / MB:.1f} MB/s, "
      f"{LIMIT * one / total:.2f} of olah's unshaped 1-client rate")
print()
print(f"{'hosts':>5}  {'plain GETs (s)':>14}  {'agg/limit':>9}  {'fetch (s)':>9}  {'agg/limit':>9}"
      f"  {'agg/GETs':>8}  {'per host MB/s':>13}  {'apply (s)':>9}")

# 2. Per N: the plain GETs through the shaped link, then reconcile's fetch of a fresh revision.
for run, n in enumerate(COUNTS, start=1):
    hosts = HOSTS[:n]
    gets = max(timed_gets(hosts, urls))
    rev = commit(run)
    d = workdir(manifest(hosts, rev, n))
    reconcile(d, "lock")
    p, wall = reconcile(d, "apply", "--format", "json", "--ssh-config", SSH_CONFIG)
    units = json.loads(p.stdout)["units"]
    converged = all(u["outcome"] == "converged" and u.get("fetch") for u in units)
    assert len(units) == n and converged, p.stdout
    seconds = max(u["fetch"]["seconds"] for u in units)
    fetched = sum(u["fetch"]["fetched"] for u in units)
    per_host = sorted(u["fetch"]["fetched"] / u["fetch"]["seconds"] / MB for u in units)
    agg, agg_gets = fetched / seconds, n * total / gets
    print(f"{n:>5}  {gets:>14.2f}  {agg_gets / LIMIT:>9.2f}  {seconds:>9.2f}  {agg / LIMIT:>9.2f}"
          f"  {agg / agg_gets:>8.2f}  {', '.join(f'{r:.1f}' for r in per_host):>13}  {wall:>9.2f}")

# 3. The plan's cost on the same hosts, nothing to change: pinned (the lock read, each host's copy
# looked at) against a plain model_path naming the copy the last run fetched.
hosts = HOSTS[:COUNTS[-1]]
pinned = workdir(manifest(hosts, rev, COUNTS[-1]))
reconcile(pinned, "lock")
# The folder the pinned unit runs from, as its --model-path names it (the root is reconcile's).
show = "systemctl show -p ExecStart --value fetch-bench.service"
exec_start = subprocess.run(["ssh", "-F", SSH_CONFIG, hosts[0], show], check=True,
                            capture_output=True, text=True).stdout.split()
folder = exec_start[exec_start.index("--model-path") + 1]
plain = workdir(manifest(hosts, rev, COUNTS[-1], folder))
times, codes = {"pinned": [], "plain": []}, {"pinned": set(), "plain": set()}
for _ in range(REPEATS):
    for kind, d in (("pinned", pinned), ("plain", plain)):
        p, wall = reconcile(d, "plan", "--ssh-config", SSH_CONFIG, check=False)
        times[kind].append(wall)
        codes[kind].add(p.returncode)
pinned_plan = reconcile(pinned, "plan", "--ssh-config", SSH_CONFIG, check=False)[0]
weights = [line.strip() for line in pinned_plan.stdout.splitlines() if "weights:" in line]
print()
print(f"plan over {len(hosts)} hosts, nothing to change (median of {REPEATS}; exit codes "
      f"pinned {sorted(codes['pinned'])}, plain {sorted(codes['plain'])}):")
a, b = statistics.median(times["pinned"]), statistics.median(times["plain"])
print(f"  pinned by revision {a:.3f} s ({', '.join(f'{x:.3f}' for x in times['pinned'])})")
print(f"  plain model_path   {b:.3f} s ({', '.join(f'{x:.3f}' for x in times['plain'])})")
print(f"  pinned / plain {a / b:.2f}x; the pinned plan says: {weights[0] if weights else '(no weights line)'}")
