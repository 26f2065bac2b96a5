# weights: pinned copies of model weights under ROOT, one folder per revision.
# Usage: python -I -S -c SCRIPT MODE ROOT KEY REVISION, a JSON object on stdin, one on stdout.
# ROOT/KEY/REV is complete and verified (made only by renaming ROOT/KEY/.REV.partial);
# ROOT/KEY/.REV.progress tells how far a fetch is. Weights are not secret: folders 0755 and
# files 0644, so the server's own user reads them; nothing is left world-writable.
import hashlib, json, os, re, select, shutil, sys, time

CHUNK = 1 << 20
os.umask(0o022)

class Exit(Exception):
    def __init__(self, code, answer):
        Exception.__init__(self, code)
        self.code, self.answer = code, answer

def safe_rel(path):
    # A file's path inside a revision: relative, no "..", ".", or empty components.
    if not isinstance(path, str) or path.startswith("/"):
        return False
    return all(p not in ("", ".", "..") and "\0" not in p for p in path.split("/"))

def checked(files):
    for f in files:
        if not safe_rel(f.get("path")):
            raise Exit(2, {"error": "path", "path": f.get("path")})
    return files

def mkdirs(path):
    # Only the folders made here get chmod: an existing parent (/shared, /var) is not ours.
    if os.path.isdir(path):
        return
    mkdirs(os.path.dirname(path))
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    os.chmod(path, 0o755)

def tree_bytes(path):
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total

def look(root, key, rev, req):
    files = checked(req.get("files") or [])
    here = root
    while not os.path.exists(here):
        here = os.path.dirname(here)
    st = os.statvfs(here)
    base, copy = os.path.join(root, key), os.path.join(root, key, rev)
    present = os.path.isdir(copy)
    lock, differ = None, []
    if present:
        try:
            with open(os.path.join(copy, ".reconcile-lock")) as f:
                lock = f.read().strip()
        except OSError:
            pass
        for f in files:
            try:
                size = os.stat(os.path.join(copy, f["path"])).st_size
            except OSError:
                differ.append({"path": f["path"], "why": "missing"})
                continue
            if size != f["size"]:
                differ.append({"path": f["path"], "why": "size %d of %d" % (size, f["size"])})
    revisions = []
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    for name in names:
        folder = os.path.join(base, name)
        if name == rev or name.startswith(".") or not os.path.isdir(folder):
            continue
        if os.path.islink(folder):
            continue
        # A revision no confirmed apply ran (fetched for a change that was rolled back) counts
        # as never used: the first that `keep` lets go.
        used = os.path.join(folder, ".reconcile-used")
        mtime = os.stat(used).st_mtime if os.path.exists(used) else 0.0
        revisions.append({"revision": name, "bytes": tree_bytes(folder), "used": mtime})
    return {"free": st.f_bavail * st.f_frsize, "present": present, "lock": lock,
            "differ": differ, "partial": tree_bytes(os.path.join(base, "." + rev + ".partial")),
            "revisions": revisions}

class Fetch:
    def __init__(self, root, key, rev, req):
        self.base = os.path.join(root, key)
        self.partial = os.path.join(self.base, "." + rev + ".partial")
        self.progress = os.path.join(self.base, "." + rev + ".progress")
        self.copy = os.path.join(self.base, rev)
        self.req = req
        self.files = checked(req.get("files") or [])
        self.rate = req.get("rate") or 0
        self.total = sum(f["size"] for f in self.files)
        self.fetched = self.resumed = 0
        self.started = time.monotonic()
        self.written = 0.0

    def report(self, path, force=False):
        now = time.monotonic()
        if not force and now - self.written < 0.25:
            return
        self.written = now
        tmp = self.progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"done": self.fetched + self.resumed, "total": self.total, "path": path}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.progress)

    def throttle(self, path):
        # Over the whole run: sleep until the bytes so far fit the rate; and stop when nobody
        # waits for the answer any more (the SSH session is gone), keeping the .part, so that
        # the next fetch is not kept "busy" by this one.
        while True:
            if abandoned():
                raise Exit(7, {"error": "abandoned", "path": path})
            ahead = self.fetched / float(self.rate or 1) - (time.monotonic() - self.started)
            if self.rate <= 0 or ahead <= 0:
                return
            time.sleep(min(ahead, 0.25))

    def open_source(self, path, offset):
        # Answers (stream, offset the stream starts at, early end is a network fault).
        source = self.req["source"]
        if source.startswith("/"):
            try:
                src = open(os.path.join(source, path), "rb")
            except FileNotFoundError:
                raise Exit(4, {"error": "missing", "path": path})
            src.seek(offset)
            return src, offset, False
        import urllib.request, urllib.error, urllib.parse
        url = source.rstrip("/") + "/" + urllib.parse.quote(path)
        r = urllib.request.Request(url, headers={"User-Agent": "reconcile"})
        if offset:
            r.add_header("Range", "bytes=%d-" % offset)
        if self.req.get("token"):
            # Unredirected: a redirect to a CDN does not carry the token.
            r.add_unredirected_header("Authorization", "Bearer " + self.req["token"])
        try:
            resp = urllib.request.urlopen(r, timeout=60)
        except urllib.error.HTTPError as e:
            raise Exit(4, {"error": "http", "status": e.code, "path": path})
        except Exception as e:
            raise Exit(5, {"error": "connect", "path": path, "why": str(e)})
        if resp.status == 206:
            m = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range") or "")
            if not m or int(m.group(1)) != offset:
                raise Exit(4, {"error": "http", "status": 206, "path": path})
            return resp, offset, True
        return resp, 0, True  # a 200: the whole file again

    def one(self, f):
        path, size = f["path"], f["size"]
        done = os.path.join(self.partial, path)
        if os.path.isfile(done) and os.path.getsize(done) == size:
            self.resumed += size  # finished and verified by an earlier run
            return
        mkdirs(os.path.dirname(done))
        part = done + ".part"
        with open(part, "a+b") as out:  # appends: a resumed run writes after what is there
            os.fchmod(out.fileno(), 0o644)
            have = os.fstat(out.fileno()).st_size
            if have > size:
                out.truncate(0)
                have = 0
            h = hashlib.sha256()
            out.seek(0)
            for chunk in iter(lambda: out.read(CHUNK), b""):  # an earlier run's bytes first
                h.update(chunk)
            if have < size:
                got, h = self.download(out, h, path, have, size)
            else:
                got = have
                self.resumed += have
            out.flush()
            os.fsync(out.fileno())
        if got != size:
            os.unlink(part)
            raise Exit(3, {"error": "digest", "path": path, "why": "size %d of %d" % (got, size)})
        if h.hexdigest() != f["sha256"]:
            os.unlink(part)
            raise Exit(3, {"error": "digest", "path": path, "expected": f["sha256"],
                           "got": h.hexdigest()})
        os.rename(part, done)

    def download(self, out, h, path, have, size):
        src, start, network = self.open_source(path, have)
        with src:
            if start != have:  # the server sent the whole file: start over
                out.truncate(0)
                have, h = 0, hashlib.sha256()
            self.resumed += have
            got = have
            while got <= size:  # one byte past the size is enough to know it is wrong
                try:
                    chunk = src.read(min(CHUNK, size + 1 - got))
                except Exception as e:
                    if not network:
                        raise
                    raise Exit(5, {"error": "connect", "path": path, "why": str(e)})
                if not chunk:
                    break
                out.write(chunk)
                h.update(chunk)
                got += len(chunk)
                self.fetched += len(chunk)
                self.report(path)
                self.throttle(path)
        if got < size and network:  # the .part is kept: the next run resumes from here
            raise Exit(5, {"error": "connect", "path": path,
                           "why": "connection closed at byte %d of %d" % (got, size)})
        return got, h

    def run(self):
        if os.path.isdir(self.copy):
            return {"fetched": 0, "resumed": 0, "seconds": 0, "present": True}
        mkdirs(self.partial)
        # One fetch of a revision at a time: a second one would write the same .part files.
        import fcntl
        guard = os.open(self.partial, os.O_RDONLY)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Exit(6, {"error": "busy"})
        for f in self.files:
            self.one(f)
            self.report(f["path"])
        self.report(None, force=True)
        lock = os.path.join(self.partial, ".reconcile-lock")
        with open(lock, "w") as f:
            f.write(self.req.get("lock") or "")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(lock, 0o644)
        for dirpath, _, _ in os.walk(self.partial):
            fsync_dir(dirpath)
        os.rename(self.partial, self.copy)
        fsync_dir(self.base)
        os.close(guard)
        if os.path.lexists(self.progress):
            os.unlink(self.progress)
        return {"fetched": self.fetched, "resumed": self.resumed,
                "seconds": time.monotonic() - self.started}

def abandoned():
    # The reader of stdout closed its end: a pipe's writer polls POLLERR, a socket's POLLHUP.
    try:
        p = select.poll()
        p.register(1, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False

def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)

def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()

def verify(root, key, rev, req):
    copy, differ = os.path.join(root, key, rev), []
    for f in checked(req.get("files") or []):
        path = os.path.join(copy, f["path"])
        if not os.path.isfile(path):
            differ.append({"path": f["path"], "why": "missing"})
            continue
        size = os.path.getsize(path)
        if size != f["size"]:
            differ.append({"path": f["path"], "why": "size %d of %d" % (size, f["size"])})
            continue
        got = sha256_of(path)
        if got != f["sha256"]:
            differ.append({"path": f["path"], "why": "sha256 %s, want %s" % (got, f["sha256"])})
    return {"differ": differ}

def unit_texts():
    # Every unit file and drop-in; a test points this elsewhere with RECONCILE_UNIT_DIRS.
    dirs = os.environ.get("RECONCILE_UNIT_DIRS") or "/etc/systemd/system:/run/systemd/system"
    for d in dirs.split(":"):
        for dirpath, _, names in os.walk(d):
            for n in names:
                try:
                    with open(os.path.join(dirpath, n), "rb") as f:
                        yield os.path.join(dirpath, n), f.read()
                except OSError:
                    pass  # a dangling link

def remove(root, key, rev, req):
    base, removed, kept = os.path.join(root, key), [], []
    texts = list(unit_texts())
    for name in req.get("revisions") or []:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            kept.append({"revision": name, "why": "not a revision name"})
            continue
        folder = os.path.join(base, name)
        # The whole path, not a prefix of a longer one (.../r1 is not in .../r10).
        pattern = re.compile(re.escape(folder.encode()) + rb"(?![^/\s\"'=:;,])")
        users = [p for p, text in texts if pattern.search(text)]
        if users:
            kept.append({"revision": name, "why": "a unit uses it: " + users[0]})
            continue
        try:
            for path in (folder, os.path.join(base, "." + name + ".partial")):
                if os.path.islink(path) or os.path.isfile(path):
                    os.unlink(path)
                elif os.path.isdir(path):
                    shutil.rmtree(path)
            progress = os.path.join(base, "." + name + ".progress")
            if os.path.lexists(progress):
                os.unlink(progress)
        except OSError as e:
            kept.append({"revision": name, "why": str(e)})
            continue
        removed.append(name)
    return {"removed": removed, "kept": kept}

def hash_store(root, key, rev, req):
    if not os.path.isdir(root):
        raise Exit(4, {"error": "missing", "path": root})
    files = []
    for dirpath, dirs, names in os.walk(root):  # symlinked folders are listed, not entered
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            path = os.path.join(dirpath, n)
            if n.startswith(".") or not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            files.append({"path": rel, "size": os.path.getsize(path), "sha256": sha256_of(path)})
    files.sort(key=lambda f: f["path"])
    return {"files": files}

def used(root, key, rev, req):
    copy = os.path.join(root, key, rev)
    if not os.path.isdir(copy):
        raise Exit(2, {"error": "absent"})
    mark = os.path.join(copy, ".reconcile-used")
    open(mark, "a").close()
    os.chmod(mark, 0o644)
    os.utime(mark, None)
    return {}

MODES = {"look": look, "fetch": lambda *a: Fetch(*a).run(), "verify": verify,
         "remove": remove, "hash": hash_store, "used": used}

def main(argv):
    if len(argv) != 4 or argv[0] not in MODES or not argv[1].startswith("/"):
        raise Exit(2, {"error": "usage"})
    mode, root, key, rev = argv
    if mode != "hash" and (not safe_rel(key) or not safe_rel(rev) or "/" in rev
                           or rev.startswith(".")):
        raise Exit(2, {"error": "path", "path": key + "/" + rev})
    text = sys.stdin.read()
    return MODES[mode](os.path.normpath(root), key, rev, json.loads(text) if text.strip() else {})

if __name__ == "__main__":
    try:
        code, answer = 0, main(sys.argv[1:])
    except Exit as e:
        code, answer = e.code, e.answer
    except Exception as e:
        code, answer = 1, {"error": "internal", "why": "%s: %s" % (type(e).__name__, e)}
    out = (json.dumps(answer) + "\n").encode()
    try:
        while out:  # unbuffered: an unread answer (exit 7) leaves nothing to flush at exit
            out = out[os.write(1, out):]
    except OSError:
        pass
    sys.exit(code)
