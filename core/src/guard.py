# reconcile's guard: the host's own rollback, armed before a restart (core/src/guard.rs).
#
# It runs on the host as a transient systemd unit, started by `systemd-run`, so it outlives the
# machine that ran `reconcile apply`. It needs only the Python that runs SGLang and the standard
# library. Every decision reads and writes `guard.json` under an flock on `guard.lock`, the one
# lock the controller takes too: of the two, exactly one acts.
#
# Usage: python3 -c SCRIPT COMMAND DIR [SECONDS]
#   watch DIR       wait, then judge and act (the transient unit runs this)
#   renew DIR       the controller is alive: push the lease out by the margin
#   take DIR        the controller starts its own rollback: the guard finishes it if the
#                   controller dies; prints the state found before
#   disarm DIR      the controller is done: prints the state found (a guard that already acted
#                   keeps its state)
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

# How often the watch looks, and how long one /health may take: SGLang answers /health after a
# one-token generation, up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) on a busy server.
POLL = 1.0
HEALTH_TIMEOUT = 25.0
# A unit that systemd restarted this often since the new invocation began is crash-looping. A rank
# of a server group is broken at its first restart: its process group cannot be rejoined
# (guard.json's `crash_loop_restarts` says 1 then).
CRASH_LOOP_RESTARTS = 2
# systemd's D-Bus calls give up after 25 s (sd-bus's default method timeout): a `systemctl show`
# that has not answered in 30 s is wedged. The guard reads it holding its lock, which the
# controller's renewals wait on: it looks again at the next poll rather than wait on.
SHOW_TIMEOUT = 30.0


def now():
    return time.monotonic()


class Locked:
    """guard.json under the guard's flock, written back on exit when changed."""

    def __init__(self, folder):
        self.folder = folder

    def __enter__(self):
        self.lock = open(os.path.join(self.folder, "guard.lock"), "a")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        with open(os.path.join(self.folder, "guard.json")) as f:
            self.guard = json.load(f)
        self.before = json.dumps(self.guard, sort_keys=True)
        return self.guard

    def __exit__(self, *exc):
        if json.dumps(self.guard, sort_keys=True) != self.before:
            path = os.path.join(self.folder, "guard.json")
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.guard, f, sort_keys=True)
                f.write("\n")
            os.rename(tmp, path)
        self.lock.close()
        return False


def settle(guard, state, detail):
    guard["state"] = state
    guard["detail"] = detail
    guard["settled_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def systemctl(*args, timeout=None):
    return subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, check=False, timeout=timeout
    )


def facts(guard):
    """What the guard judges by: the unit file, systemd's view of the unit; None when systemd
    did not answer in SHOW_TIMEOUT."""
    try:
        with open(guard["unit_path"], "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        sha = None
    shown = {}
    try:
        out = systemctl(
            "show", "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts",
            "-p", "InactiveExitTimestampMonotonic", "-p", "NeedDaemonReload", "--", guard["unit"],
            timeout=SHOW_TIMEOUT,
        ).stdout
    except subprocess.TimeoutExpired:
        return None
    for line in out.splitlines():
        key, _, value = line.partition("=")
        shown[key] = value
    return {
        "sha256": sha,
        "active": shown.get("ActiveState", ""),
        "sub": shown.get("SubState", ""),
        "restarts": int(shown.get("NRestarts", "0") or 0),
        # When the unit last began to start, on the monotonic clock `now()` reads too.
        "entered": int(shown.get("InactiveExitTimestampMonotonic", "0") or 0) / 1e6,
        # systemd still runs an older definition than the file on disk (no daemon-reload yet).
        "stale": shown.get("NeedDaemonReload", "no") == "yes",
    }


def health(guard):
    """/health's status code, or None when nothing answered."""
    try:
        with urllib.request.urlopen(guard["health_url"], timeout=HEALTH_TIMEOUT) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def running(f):
    return f["active"] + "/" + f["sub"]


def judge(guard, f, at, healthy):
    """The guard's decision from what it saw; `healthy()` (a /health request) only when needed.

    Returns (verdict, why); verdict is one of wait, keep, restore, leave, done, failed.
    """
    if at < guard.get("lease_until", 0):
        return ("wait", "the controller renewed its lease")
    state = guard["state"]
    if state == "armed":
        if f["sha256"] != guard["new_sha256"]:
            return ("leave", "the unit file changed since the guard was armed; left as it is")
        # Only the new invocation counts: the old one's state and restarts say nothing of it.
        started = f["entered"] > guard["armed_mono"]
        if started and f["active"] == "failed":
            return ("restore", "the new unit failed")
        if started and f["restarts"] >= guard.get("crash_loop_restarts", CRASH_LOOP_RESTARTS):
            n = f["restarts"]
            return ("restore", "the new unit is crash-looping (%d restart%s)" % (n, "" if n == 1 else "s"))
        if at < guard["judge_at"]:
            return ("wait", "before the deadline")
        code = healthy()
        if f["active"] == "active" and code == 200:
            return ("keep", "active and /health 200 at the deadline, but no apply confirmed it")
        return ("restore", "not healthy by the deadline (%s, /health %s)" % (
            running(f), code if code is not None else "no answer"))
    if state == "rolling_back":
        removal = guard.get("previous") is None and not guard.get("beneath")
        if removal or guard["then"] != "restart":
            if guard.get("restored"):
                return ("done", "the rollback finished")
            return ("restore", "the controller's rollback did not finish")
        # Restarted since the rollback began, from the previous unit's file as systemd loaded it,
        # and not crash-looping since: wait for it to load, rather than restart a previous unit
        # that may already serve. A file put back without the reload still runs the new
        # definition. After the guard's own restore, its start and restart count are the ones
        # read once its restart returned: that restart may have joined a start already under way
        # (a dead controller's), and systemd keeps NRestarts across a restart of a unit waiting
        # to auto-restart.
        # Once the guard restored the unit itself, its restarts do not judge it: a group's rank
        # restarts while its peers come back (its first process dies with the group it joined),
        # so the restored unit has until its deadline to answer /health.
        if guard.get("restored"):
            started = f["entered"] >= guard.get("restored_entered", guard.get("restored_at", 0))
            steady = True
        else:
            started = f["entered"] > guard.get("taken_at", 0)
            steady = (f["restarts"] - guard.get("taken_restarts", 0)
                      < guard.get("crash_loop_restarts", CRASH_LOOP_RESTARTS))
        back = (f["sha256"] == guard.get("previous_sha256") and not f.get("stale") and started
                and steady)
        if back and f["active"] in ("active", "activating"):
            if healthy() == 200:
                return ("done", "the previous unit runs again and answers /health 200")
            if at < guard["judge_at"]:
                return ("wait", "the restored unit is loading")
            return ("failed", "the restored unit was not healthy by its deadline (%s)" % running(f))
        if guard.get("restored"):
            return ("failed", "the restored unit did not start or did not stay up (%s)" % running(f))
        return ("restore", "the controller's rollback did not finish")
    return ("leave", "the guard is %s" % state)


def put_back_aside(guard):
    if not guard.get("aside"):
        return
    with open(guard["aside"]) as f:
        files = json.load(f)
    for moved in files:
        parent = os.path.dirname(moved["path"])
        os.makedirs(parent, exist_ok=True)
        if os.path.lexists(moved["path"]):
            os.remove(moved["path"])
        if moved.get("mask"):
            os.symlink("/dev/null", moved["path"])
        else:
            write(moved["path"], moved["text"], 0o644)


def write(path, text, mode):
    tmp = path + ".reconcile-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def must(*args):
    r = systemctl(*args)
    if r.returncode != 0:
        raise RuntimeError("systemctl %s: %s" % (" ".join(args), r.stderr.strip()))


def restore(guard):
    """apply's rollback (src/apply/restore.rs `restore`), on the host: the previous unit back,
    the files moved aside back, then restarted or left stopped as it was."""
    unit, path = guard["unit"], guard["unit_path"]
    if guard.get("previous") is None and not guard.get("beneath"):
        systemctl("disable", "--now", "--", unit)
        if os.path.lexists(path):
            os.remove(path)
        put_back_aside(guard)
        must("daemon-reload")
        systemctl("reset-failed", "--", unit)
        return "the new unit was stopped, disabled and removed"
    if guard.get("previous"):
        with open(guard["previous"]) as f:
            write(path, f.read(), 0o644)
    elif os.path.lexists(path):
        os.remove(path)
    put_back_aside(guard)
    must("daemon-reload")
    if guard.get("disable"):
        must("disable", "--", unit)
    if guard["then"] == "restart":
        must("restart", "--", unit)
        return "the previous unit was restored and restarted"
    must("stop", "--", unit)
    return "the previous unit was restored and left stopped, as it was"


def watch(folder):
    with Locked(folder) as guard:
        # Times are the host's monotonic clock, read here: the controller's clock may differ.
        guard["armed_mono"] = now()
        guard["judge_at"] = guard["armed_mono"] + guard["judge_after"]
        guard["lease_until"] = guard["armed_mono"] + guard["margin"]
    while True:
        time.sleep(POLL)
        with Locked(folder) as guard:
            if guard["state"] not in ("armed", "rolling_back"):
                return
            seen = facts(guard)
            if seen is None:
                continue
            verdict, why = judge(guard, seen, now(), lambda: health(guard))
            if verdict == "wait":
                continue
            settled = {"keep": "unconfirmed", "leave": "left", "done": "rolled_back",
                       "failed": "rollback_failed"}
            if verdict in settled:
                detail = why if verdict in ("keep", "leave") else "%s; %s" % (guard.get("why", ""), why)
                settle(guard, settled[verdict], detail.strip("; "))
                return
            guard.setdefault("why", why)
            guard["state"] = "rolling_back"
            guard["restored"] = True
            guard["restored_at"] = now()
            guard["judge_at"] = guard["restored_at"] + guard["judge_after"]
            try:
                guard["did"] = restore(guard)
            except Exception as e:
                settle(guard, "rollback_failed", "%s; the rollback failed: %s" % (guard["why"], e))
                return
            after = facts(guard)
            if after is not None:
                guard["restored_entered"] = after["entered"]
                guard["restored_restarts"] = after["restarts"]
            guard["detail"] = "%s; %s" % (guard["why"], guard["did"])


def renew(folder):
    with Locked(folder) as guard:
        if guard["state"] in ("armed", "rolling_back"):
            guard["lease_until"] = now() + guard["margin"]
        print(guard["state"])


def take(folder):
    with Locked(folder) as guard:
        print(guard["state"])
        if guard["state"] == "armed":
            guard["state"] = "rolling_back"
            guard["why"] = "the controller's verification failed"
            guard["taken_at"] = now()
            # Unread (systemd wedged): none counted before, so the guard finishes the rollback
            # should the controller die, as the controller meant to.
            seen = facts(guard)
            guard["taken_restarts"] = seen["restarts"] if seen is not None else 0
            guard["lease_until"] = now() + guard["margin"]
            guard["judge_at"] = now() + guard["judge_after"]


def disarm(folder):
    with Locked(folder) as guard:
        print(guard["state"])
        if guard["state"] in ("armed", "rolling_back"):
            settle(guard, "disarmed", "the controller finished")


if __name__ == "__main__":
    command, folder = sys.argv[1], sys.argv[2]
    {"watch": watch, "renew": renew, "take": take, "disarm": disarm}[command](folder)
