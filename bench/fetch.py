"""The measuring half of bench/fetch.sh: builds a repository of SIZE_MB on the lab's hub (olah in
pw1), measures olah's unshaped rate, shapes pw1's link with tc, then for each host count N fetches
the same files with plain GETs and with `reconcile apply` of a fresh revision to pw2..pw(N+1), and
times `reconcile plan` of the pinned manifest against a plain `model_path` one. Every figure is
printed beside the baseline it is measured against in the same run."""

import atexit
import concurrent.futures
import hashlib
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SSH_CONFIG, BIN, SIZE_MB = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Ascending: each run's hosts are the last run's and more, so no host's unit is left behind.
COUNTS = sorted(int(n) for n in sys.argv[4:])
LINK_MBIT = int(os.environ.get("LINK_MBIT", "100"))
REPEATS = int(os.environ.get("REPEATS", "5"))
HUB_NS, ENDPOINT = "pw1", "http://10.218.1.2:8090"
REPO_ID = "labs/fetch-bench"
REPO = f"/var/lib/reconcile-fetch-bench/hub/mirrors/models/{REPO_ID}"
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


def manifest(hosts, revision, at_once, model_path=None):
    # One service, one unit a host (the GPU pair 0,1 on each); the stand-in's start-up kept short.
    if model_path:
        model = f"model_path: {model_path}"
    else:
        model = f"model: {{ hub: {REPO_ID}, revision: {revision}, endpoint: {ENDPOINT}, at_once: {at_once} }}"
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
