#!/usr/bin/env python3
"""A client loop through sglang-router: chat completions from a few threads until a stop file
appears, then one JSON line with what it saw. Standard library only (it runs on a test host).

Usage: router_client.py URL MODEL STOP_FILE [THREADS [PROGRESS_FILE [MAX_TOKENS]]]
Each request is a non-streamed chat completion of a few tokens (MAX_TOKENS, 8 by default); any answer but 200 with a
`choices` list, and any connection error, is a failed request. A request's latency is kept so the
output can show the slowest (a request held while its replica drained is slow, not lost).
With PROGRESS_FILE, the counts so far (`OK FAILED`) are written there as they change, so a caller
can wait for answers rather than sleep.
"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

url, model, stop = sys.argv[1], sys.argv[2], sys.argv[3]
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 4
progress = sys.argv[5] if len(sys.argv) > 5 else None
max_tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 8
lock = threading.Lock()
ok = 0
failed = []
slowest = 0.0
body = json.dumps({
    "model": model,
    "messages": [{"role": "user", "content": "Say OK"}],
    "max_tokens": max_tokens,
    "temperature": 0,
}).encode()


def one():
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
            good = r.status == 200 and isinstance(answer.get("choices"), list)
            why = None if good else "status %d: %s" % (r.status, str(answer)[:200])
    except urllib.error.HTTPError as e:
        why = "status %d: %s" % (e.code, e.read()[:200].decode(errors="replace"))
    except Exception as e:  # connection refused or reset, timeout
        why = "%s: %s" % (type(e).__name__, e)
    return why, time.monotonic() - started


def report():
    """Writes the counts to PROGRESS_FILE, whole (a rename), under the lock."""
    if progress:
        with open(progress + ".tmp", "w") as f:
            f.write("%d %d\n" % (ok, len(failed)))
        os.replace(progress + ".tmp", progress)


def loop():
    global ok, slowest
    while not os.path.exists(stop):
        why, took = one()
        with lock:
            slowest = max(slowest, took)
            if why is None:
                ok += 1
            else:
                failed.append("%.3f %s" % (time.time(), why))
            report()


report()
workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(json.dumps({"ok": ok, "failed": len(failed), "failures": failed[:20],
                  "slowest_s": round(slowest, 3)}))
