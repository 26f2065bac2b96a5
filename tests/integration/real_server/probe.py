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
import threading
import time

unit, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# LONG_TOKENS=N among the KEY=VALUE pairs is the probe's own: max_tokens of the long completion.
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
    except (OSError, http.client.HTTPException):  # refused, reset, cut off mid-answer
        return "refused", b"", time.monotonic() - started


def systemctl(*args):
    return subprocess.run(["systemctl", *args], capture_output=True, text=True)


env_of = dict(e.split("=", 1) for e in envs)


def start():
    """Starts the server as a transient unit; what /health answered, in order, until its first
    200 (repeats folded)."""
    systemctl("stop", unit)
    systemctl("reset-failed", unit)
    subprocess.run(["systemd-run", "-q", "--unit", unit, "-p", "RemainAfterExit=yes",
                    *["-E" + e for e in envs if not e.startswith("LONG_TOKENS=")], *argv],
                   check=True)
    states = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status, _, _ = request("GET", "/health", timeout=30)
        if not states or states[-1] != status:
            states.append(status)
        if status == 200:
            break
        time.sleep(0.2)
    return states


states = start()
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

# Requests in flight when the server is told to stop. `long` is a completion that takes seconds
# (LONG_TOKENS of the real model; the stand-in makes every completion take
# FAKE_SGLANG_REQUEST_SECONDS); its answer is read in a thread.
long_body = {"model": model, "messages": [{"role": "user", "content": "a story"}],
             "max_tokens": int(env_of.get("LONG_TOKENS", "16")), "ignore_eos": True, "temperature": 0}


def in_flight():
    result = {}

    def run():
        status, _, _ = request("POST", "/v1/chat/completions", long_body, timeout=300)
        result["status"] = status if status != "refused" else "error"

    t = threading.Thread(target=run)
    t.start()
    for _ in range(300):  # until the server counts it
        _, body, _ = request("GET", "/metrics", timeout=5)
        if any(l.startswith("sglang:num_running_reqs") and not l.endswith(" 0.0")
               for l in body.decode().splitlines()):
            break
        time.sleep(0.1)
    return lambda: (t.join(300), result.get("status"))[1]


def wait_stopped():
    for _ in range(600):
        if systemctl("show", "-p", "SubState", "--value", unit).stdout.strip() != "running":
            return
        time.sleep(0.1)


# SIGTERM to the main process alone: /health 503 at once, the request in flight answered in
# full (a drain), then exit status 0.
answer = in_flight()
systemctl("kill", "-s", "TERM", "--kill-who=main", unit)
time.sleep(0.3)
status, _, _ = request("GET", "/health", timeout=5)
health = status
request_status = answer()
wait_stopped()
code = systemctl("show", "-p", "ExecMainStatus", "--value", unit).stdout.strip()
seen["sigterm_to_main"] = {"health_at_once": health, "request_in_flight": request_status,
                           "exit_status": code}

# A stop by systemd (SIGTERM to every process of the unit, as every restart does): the request
# in flight is cut off and the unit ends killed.
start()
answer = in_flight()
systemctl("stop", unit)
request_status = answer()
result = systemctl("show", "-p", "Result", "--value", unit).stdout.strip()
seen["systemctl_stop"] = {"request_in_flight": request_status, "result": result}
systemctl("stop", unit)
systemctl("reset-failed", unit)

# A misspelt flag: argparse's exit status and message.
out = subprocess.run(["env", *envs, *argv, "--tp-sizee", "1"],
                     capture_output=True, text=True, timeout=120)
last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
seen["misspelt_flag"] = [out.returncode, last[last.find("error: "):]]

print(json.dumps(seen, sort_keys=True))
