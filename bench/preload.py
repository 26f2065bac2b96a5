"""The measuring half of bench/preload.sh: restarts one server on the test host sb1 with a cold
page cache, alternately with and without preloading, and prints the load time (the report's "ready
after", from the new server's start to its readiness) of each, their medians and the ratio."""

import json
import os
import statistics
import subprocess
import sys
import tempfile

SSH_CONFIG, REPEATS, SIZE_MB = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BIN = os.path.abspath("target/release/reconcile")
HOST, MODEL, SHARDS = "sb1", "/var/tmp/stage-bench-model", 4


def ssh(script):
    return subprocess.run(["ssh", "-F", SSH_CONFIG, HOST, script], check=True,
                          capture_output=True, text=True).stdout


def manifest(release):
    return f"""service: stage-bench
hosts: [{HOST}]
sglang: {{ python: /usr/bin/python3, version: 0.5.23, model_path: {MODEL}, served_model_name: bench, port: 30000, flags: {{ tp-size: 2 }} }}
env: {{ CUDA_VISIBLE_DEVICES: "0,1", FAKE_SGLANG_LOAD_SECONDS: "0.5", FAKE_SGLANG_GRAPH_SECONDS: "0", FAKE_SGLANG_WARMUP_SECONDS: "0", RELEASE: "{release}" }}
verify: {{ crash_window: 2s, sample_interval: 250ms, stall_timeout: 60s, load_deadline: 300s }}
"""


def apply(release, *flags):
    d = tempfile.mkdtemp()
    os.makedirs(f"{d}/manifests")
    with open(f"{d}/manifests/m.yaml", "w") as f:
        f.write(manifest(release))
    p = subprocess.run([BIN, "apply", "--format", "json", "--no-deep", "--ssh-config", SSH_CONFIG, *flags],
                       cwd=d, capture_output=True, text=True)
    report = json.loads(p.stdout)["units"][0]
    assert report["outcome"] == "converged", (p.stdout, p.stderr)
    return report


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# The weights: SHARDS safetensors files of one U8 tensor each, SIZE_MB in all, written whole
# (zeros on disk, not a sparse file) and flushed.
per = SIZE_MB * 1024 * 1024 // SHARDS
ssh(f"""rm -rf {MODEL} && mkdir -p {MODEL} && cd {MODEL} && python3 -c '
import json, struct
names = ["model-%05d-of-%05d.safetensors" % (i + 1, {SHARDS}) for i in range({SHARDS})]
for n in names:
    header = json.dumps({{"w": {{"dtype": "U8", "shape": [{per}], "data_offsets": [0, {per}]}}}}).encode()
    with open(n, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        chunk = bytes(64 << 20)
        left = {per}
        while left:
            f.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
json.dump({{"weight_map": {{"w%d" % i: n for i, n in enumerate(names)}}}}, open("model.safetensors.index.json", "w"))
' && sync""")
apply("0")

loads = {"staged": [], "not staged": []}
staging = []
for r in range(REPEATS):
    for mode in ("not staged", "staged"):
        drop_caches()
        flags = ("--no-stage",) if mode == "not staged" else ()
        report = apply(f"{r}-{mode}", *flags)
        loads[mode].append(report["verification"]["load_seconds"])
        if mode == "staged":
            assert report["staging"]["outcome"] == "staged", report
            staging.append(report["staging"]["seconds"])

without, with_ = statistics.median(loads["not staged"]), statistics.median(loads["staged"])
print(f"weights: {SHARDS} safetensors shards, {SIZE_MB} MiB, read whole by the stand-in's load; page cache dropped before each restart")
print(f"{'load after the restart':<28} {'median (s)':>10}   runs")
print(f"{'not staged (--no-stage)':<28} {without:>10.2f}   {', '.join(f'{x:.2f}' for x in loads['not staged'])}")
print(f"{'staged before the stop':<28} {with_:>10.2f}   {', '.join(f'{x:.2f}' for x in loads['staged'])}")
print(f"load not staged / staged: {without / with_:.2f}x; staging itself (before the stop, the old server serving): median {statistics.median(staging):.2f} s")
