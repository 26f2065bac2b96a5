#!/usr/bin/env python3
"""Probes one SGLang server the way reconcile watches it and prints what it saw, as one JSON
object of observations that do not depend on the model or the machine's speed. The comparison
test (compare.rs) runs it against the stand-in and against the real server on the same host and
fails on any difference the stand-in is meant to copy (fixtures/fake-sglang/README.md).

Usage: probe.py UNIT PORT MODEL [KEY=VALUE ...] -- ARGV...
ARGV is the server's command line (`python3 -m sglang.launch_server ...`), started as a transient
systemd unit UNIT with the given environment. Standard library only: it runs on a test host.
"""
import http.client
import json
import subprocess
import sys
import time

unit, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rest = sys.argv[4:]
envs, argv = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
seen = {}


def request(method, path, body=None, timeout=30):
    """(status or 'refused', body, seconds)."""
    started = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, data, time.monotonic() - started
    except (ConnectionError, OSError):
        return "refused", b"", time.monotonic() - started


def systemctl(*args):
    return subprocess.run(["systemctl", *args], capture_output=True, text=True)


systemctl("stop", unit)
systemctl("reset-failed", unit)
subprocess.run(["systemd-run", "-q", "--unit", unit, "-p", "RemainAfterExit=yes",
                *["-E" + e for e in envs], *argv], check=True)

# Start-up: what /health answers, in order, until its first 200 (repeats folded).
states = []
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    status, body, took = request("GET", "/health", timeout=30)
    if not states or states[-1] != status:
        states.append(status)
    if status == 200:
        break
    time.sleep(0.2)
seen["startup_states"] = [states[0], states[-1]]
seen["startup_other_states"] = sorted({str(s) for s in states[1:-1]} - {"503"})

# /health once ready: 200, an empty body, no sooner than a second (it is a generation).
status, body, took = request("GET", "/health")
seen["health"] = [status, body.decode(), 1.0 <= took < 3.0]
# /ready (0.5.23): at once.
status, body, took = request("GET", "/ready")
seen["ready"] = [status, took < 0.5]

# /v1/models: its shape and the served name.
status, body, _ = request("GET", "/v1/models")
models = json.loads(body)
entry = models["data"][0]
seen["models"] = {
    "status": status,
    "object": models["object"],
    "keys": sorted(entry),
    "id": entry["id"] == model,
    "owned_by": entry["owned_by"],
    "max_model_len_is_int": isinstance(entry["max_model_len"], int),
}

# A streamed chat completion with usage: the kinds of chunks, runs of content folded.
body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("POST", "/v1/chat/completions", body=json.dumps(body),
          headers={"Content-Type": "application/json"})
r = c.getresponse()
kinds, usage = [], None
for raw in r.read().decode().splitlines():
    if not raw.startswith("data: "):
        continue
    data = raw[len("data: "):]
    if data == "[DONE]":
        kind = "done"
    else:
        chunk = json.loads(data)
        choices = chunk.get("choices")
        if choices == [] and chunk.get("usage"):
            kind, usage = "usage", chunk["usage"]
        elif choices and choices[0].get("finish_reason"):
            kind = "finish"
        elif choices and choices[0].get("delta", {}).get("role"):
            kind = "role"
        else:
            kind = "content"
    if not kinds or kinds[-1] != kind or kind != "content":
        kinds.append(kind)
seen["stream"] = {"status": r.status, "content_type": r.getheader("Content-Type", "").split(";")[0],
                  "kinds": kinds, "completion_tokens": (usage or {}).get("completion_tokens")}

# /metrics (--enable-metrics): the request gauges, their labels, idle values.
status, body, _ = request("GET", "/metrics")
gauges = {}
for line in body.decode().splitlines():
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
        if line.startswith(name + "{"):
            labels = sorted(kv.split("=")[0] for kv in line[len(name) + 1 : line.index("}")].split(","))
            gauges[name] = [labels, line.rsplit(" ", 1)[1]]
seen["metrics"] = {"status": status, "gauges": gauges}

# SIGTERM: /health turns 503 at once, then the server exits 0.
systemctl("kill", "-s", "TERM", "--kill-who=main", unit)
time.sleep(0.3)
status, _, _ = request("GET", "/health", timeout=5)
after = [status]
for _ in range(600):
    if systemctl("show", "-p", "SubState", "--value", unit).stdout.strip() != "running":
        break
    time.sleep(0.1)
code = systemctl("show", "-p", "ExecMainStatus", "--value", unit).stdout.strip()
seen["sigterm"] = {"health_at_once": after[0] in (503, "refused") and after[0], "exit_status": code}
systemctl("stop", unit)
systemctl("reset-failed", unit)

# A misspelt flag: argparse's exit status and message.
env = dict(e.split("=", 1) for e in envs)
out = subprocess.run(["env", *[f"{k}={v}" for k, v in env.items()], *argv, "--tp-sizee", "1"],
                     capture_output=True, text=True, timeout=120)
last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
seen["misspelt_flag"] = [out.returncode, last[last.find("error: "):]]

print(json.dumps(seen, sort_keys=True))
