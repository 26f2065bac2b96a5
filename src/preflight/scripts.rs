//! The fixed scripts preflight runs on a host, as their own commands (`gather`) or as parts of
//! the survey (`survey`). Manifest values reach them only as positional arguments.

/// Records each file and folder a script reads, with its stat from before the read: what an
/// answer cached on the host is keyed by (`keep_fn`).
macro_rules! seen_fn {
    () => {
        r#"import os
SEEN = {}
def seen(path):
    if path not in SEEN:
        try:
            SEEN[path] = os.stat(path)
        except OSError:
            SEEN[path] = None
"#
    };
}

/// Reads the installed version from the distribution's metadata, as `importlib.metadata` does:
/// the first `sglang-<version>.dist-info` (or `.egg-info`) along `sys.path`. Importing `sglang`
/// would take seconds (it imports torch); importing `importlib.metadata` alone costs ~0.1 s of CPU
/// a host, which a 16-host plan feels, so the folder scan comes first and `importlib.metadata`
/// (same answer, same PackageNotFoundError) only when the scan finds nothing.
macro_rules! sglang_version_fn {
    () => {
        r#"import os, sys
# `python -I -S`: no site.py ran, so no `.pth` file ran its code as root. The folders site.py
# would have added, found as it finds them: the venv's (a `pyvenv.cfg` beside or above the
# interpreter), the base's where the venv includes them, and the paths `.pth` files list (their
# `import` lines are code, and skipped).
def add_site_folders():
    import site
    exe = os.path.dirname(os.path.abspath(os.environ.get("RECONCILE_PYTHON") or sys.executable))
    # A venv's own folder, as the venv module lays it out on every distribution (a distribution's
    # site.py, Debian's, names its own layout for a prefix it takes for the system's).
    dirs = site.getsitepackages([sys.prefix])
    for cfg in (os.path.join(exe, "pyvenv.cfg"), os.path.join(os.path.dirname(exe), "pyvenv.cfg")):
        if os.path.isfile(cfg):
            include = False
            try:
                with open(cfg) as f:
                    for line in f:
                        key, _, value = line.partition("=")
                        if key.strip().lower() == "include-system-site-packages":
                            include = value.strip().lower() == "true"
            except OSError:
                pass
            venv = os.path.dirname(cfg)
            version = "python%d.%d" % sys.version_info[:2]
            dirs = [os.path.join(venv, lib, version, "site-packages") for lib in ("lib", "lib64")]
            dirs += site.getsitepackages([sys.base_prefix]) if include else []
            break
    for d in dirs:
        if not os.path.isdir(d) or d in sys.path:
            continue
        sys.path.append(d)
        try:
            pth = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except OSError:
            continue
        for name in pth:
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    for line in f:
                        line = line.rstrip()
                        if not line or line.startswith('#') or line.startswith(("import ", "import\t")):
                            continue
                        path = os.path.join(d, line)
                        if os.path.isdir(path) and path not in sys.path:
                            sys.path.append(path)
            except (OSError, UnicodeDecodeError):
                pass
if sys.flags.no_site:
    add_site_folders()
def sglang_version():
    for d in sys.path:
        seen(d or ".")
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for n in names:
            low = n.lower()
            if not (low.startswith("sglang-") and low[7:8].isdigit()):
                continue
            meta = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}.get(os.path.splitext(low)[1])
            if meta is None:
                continue
            seen(os.path.join(d or ".", n, meta))
            try:
                with open(os.path.join(d or ".", n, meta), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                pass
    from importlib.metadata import version
    return version("sglang")
"#
    };
}

/// The SGLang version alone: one line (`reconcile_core::survey::python` reads it).
pub(super) const VERSION_SCRIPT: &str = concat!(
    seen_fn!(),
    sglang_version_fn!(),
    "print(sglang_version())\n"
);

/// Root runs only what root owns. Before a Python starts, the paths that decide what it runs are
/// checked by the shell, `stat` and `find`, never by a Python: the file the interpreter resolves
/// to, every folder above it (one could swap the file) and its standard library (scope
/// `interpreter`: what `python -I -S` imports), and the interpreter's own path (a venv's link),
/// its site folders, a venv's `pyvenv.cfg`, every package and the folders `.pth` files add (scope
/// `site`: what the server and importing SGLang run). Each path another user can write is a line
/// `#reconcile-writable <scope> <uid> <mode> <path>` on stderr, 20 at most a folder
/// (`reconcile_core::preflight::owners::writable` reads them). Folders are searched two levels
/// deep (`site-packages/sglang/__init__.py`): a user's `pip install` owns the package's folder,
/// and a file deeper changed alone took root already. The whole of a GPU venv (~70,000 files) is
/// 0.6 s a plan; two levels, 40 ms. A folder with the sticky bit (`/tmp`) lets
/// no one replace what is not theirs, so it passes. Run as root, a hit in a scope of `$1` keeps
/// the Python from starting: status 102.
macro_rules! trust_fn {
    () => {
        r##"trust() {
  gate=$1 p=$2
  r=$(readlink -f -- "$p") || r=$p
  v=${r##*/}; case $v in python3.*) ;; *) v='python3.*' ;; esac
  base=${r%/*}; base=${base%/*} venv=${p%/*}; venv=${venv%/*}
  out=$(
    above() {
      s=$1 f=$2; set --
      while :; do set -- "$@" "$f"; [ "$f" = / ] && break; f=${f%/*}; f=${f:-/}; done
      stat -c '%u %f %n' -- "$@" 2>/dev/null | while read -r u f x; do
        m=$((0x$f)); [ $((m & 61440)) = 40960 ] && m=0
        if [ "$u" != 0 ] || { [ $((m & 18)) != 0 ] && [ $((m & 512)) = 0 ]; }; then
          printf '#reconcile-writable %s %s %o %s\n' "$s" "$u" $((m & 4095)) "$x"
        fi
      done
    }
    above interpreter "$r"
    [ "$p" = "$r" ] || above site "$p"
    under() {
      s=$1; shift
      for d in "$@"; do
        [ -e "$d" ] && find -H "$d" -xdev -maxdepth 2 ! -type l \( ! -uid 0 -o \( -perm /022 ! -perm -1000 \) \) \
          -printf "#reconcile-writable $s %U %m %p\n" 2>/dev/null | head -n 20
      done
    }
    under interpreter "$base"/lib/$v
    set --
    [ -f "$venv/pyvenv.cfg" ] && set -- "$venv/pyvenv.cfg" "$venv"/lib/python3*/site-packages
    set -- "$@" "$base"/local/lib/$v/dist-packages "$base"/lib/python3/dist-packages "$base"/lib/$v/site-packages
    for d in "$@"; do
      for pth in "$d"/*.pth; do
        [ -f "$pth" ] && while IFS= read -r l; do case $l in /*) set -- "$@" "$l" ;; esac; done <"$pth"
      done
    done
    under site "$@"
  )
  [ -n "$out" ] && printf '%s\n' "$out" >&2
  [ "$(id -u)" = 0 ] || return 0
  for s in $gate; do case $out in *"#reconcile-writable $s "*) exit 102 ;; esac; done
}
"##
    };
}

/// Runs the Python only when it is an executable file, so a missing one is told apart from one
/// that fails (status 100), and only when root may run it ([`trust_fn`]: `$1` names the scopes
/// that keep it from starting). It starts the file the path resolves to, root's, not a venv's
/// link another user could point elsewhere: the script finds the venv from `RECONCILE_PYTHON`.
/// Every Python reconcile starts runs isolated (`-I`, given by the caller): no current folder, no
/// user site, no `PYTHON*` variables of the session.
macro_rules! python_checked {
    () => {
        "g=$1; shift; test -f \"$1\" && test -x \"$1\" || exit 100; p=$1; shift\ntrust \"$g\" \"$p\"\n"
    };
}
macro_rules! python_started {
    () => {
        "export RECONCILE_PYTHON=\"$p\"\nexec \"$r\" \"$@\""
    };
}
pub(super) const PYTHON: &str = concat!(trust_fn!(), python_checked!(), python_started!());

/// The argv that runs reconcile's own `script` with the unit's `python` as root: isolated and
/// without `site` (`-I -S`), started by [`PYTHON`] only once the trust check passed. The
/// script's arguments follow.
pub(crate) fn isolated_python<'a>(python: &'a str, script: &'a str) -> [&'a str; 10] {
    [
        "sh",
        "-c",
        PYTHON,
        "sh",
        INTERPRETER,
        python,
        "-I",
        "-S",
        "-c",
        script,
    ]
}

/// The scopes that keep reconcile's own Pythons (`-I -S`: the version, the weights, the survey)
/// from starting as root: the interpreter's file and standard library are all they run.
pub(super) const INTERPRETER: &str = "interpreter";

/// The deep check's runner: as [`PYTHON`], started by `systemd-run` as a transient service with
/// the unit's own user and sandbox (`$2`, a property a line), so that SGLang's code runs as the
/// server will, with its permissions and folders, and never as root unless the server runs as
/// root. The unit's environment travels on stdin, never in a property.
pub(super) const DEEP_RUNNER: &str = concat!(
    trust_fn!(),
    r#"g=$1 props=$2; shift 2; test -f "$1" && test -x "$1" || exit 100; p=$1; shift
trust "$g" "$p"
set -f; IFS='
'
exec systemd-run --quiet --pipe --wait --collect --service-type=exec $(for x in $props; do printf -- '-p\n%s\n' "$x"; done) -- "$p" "$@""#
);

/// The survey's runner of its Python: the answer the host cached for it (`keep_fn`: `$1`, read
/// when `$2` is 1) while the environment line (`$3`) and every file and folder it read are as they
/// were, in one `stat` where a Python start costs ~20 ms of a host's CPU; else [`PYTHON`] with the
/// arguments after these three. The trust check runs first either way, so that a plan says what
/// it found whether or not the Python starts. A cached answer read says so on stderr.
pub(super) const CACHED_OR_PYTHON: &str = concat!(
    trust_fn!(),
    "kf=$1 reuse=$2 kenv=$3; shift 3\n",
    python_checked!(),
    r##"kept() {
  [ "$reuse" = 1 ] && [ -f "$kf" ] || return 1
  at=0 want= answer=
  set --
  while IFS= read -r l; do
    case $at in
      0) [ "$l" = "#reconcile-survey-kept $kenv" ] || return 1; at=1 ;;
      1) if [ "$l" = -- ]; then at=2; else set -- "$@" "$l"; fi ;;
      2) if [ "$l" = -- ]; then at=3; else want="$want$l
"; fi ;;
      *) answer="$answer$l
" ;;
    esac
  done <"$kf"
  [ $# -gt 0 ] && [ "$(stat -L -c '%n %i %s %.9Y %.9Z' -- "$@" 2>/dev/null; echo .)" = "$want." ] ||
    return 1
  printf '%s' "$answer"
  echo "#reconcile-survey-kept $kf" >&2
}
kept && exit 0
"##,
    python_started!(),
);

/// 0: readable, 100: missing, 101: there but unreadable.
pub(super) const ACCESS: &str = "test -e \"$1\" || exit 100; test -r \"$1\" || exit 101";

/// The listeners on a TCP port and the cgroups of their processes (see `parse_listeners`), then the
/// host's ephemeral port range (`parse_ephemeral`).
pub(super) const LISTENERS: &str = "command -v ss >/dev/null 2>&1 || exit 100
out=$(ss -Htlnp \"sport = :$1\") || exit 101
[ -n \"$out\" ] && printf '%s\\n' \"$out\"
echo '#cgroups'
# Each process's cgroup, read by the shell's builtins: a process is what a survey costs a host.
pids= rest=$out
while :; do
  case $rest in
    *pid=*) rest=${rest#*pid=}; pid=${rest%%[!0-9]*}
      case \" $pids \" in *\" $pid \"*) ;; *) pids=\"$pids $pid\" ;; esac ;;
    *) break ;;
  esac
done
for pid in $pids; do
  cg=
  while IFS= read -r line; do cg=\"$cg$line \"; done 2>/dev/null < /proc/$pid/cgroup
  printf '%s %s\\n' \"$pid\" \"$cg\"
done
# The host's ephemeral port range and its reserved ports, a line each (see parse_ephemeral). One
# `cat`: the shell's `read` takes a byte at a time, and a sysctl file answers only the first.
echo '#ephemeral'
cat /proc/sys/net/ipv4/ip_local_port_range /proc/sys/net/ipv4/ip_local_reserved_ports 2>/dev/null
true";

/// The deep check (`deep.py`, read there with what it runs and where SGLang 0.5.23 does it): the
/// host's SGLang parses the unit's exact arguments, resolves them, builds the model's config
/// (config.json, dtype, context length, quantization) and checks `--chat-template`, as a launch
/// would before it loads any weights, with the unit's environment and working directory and the
/// GPUs hidden. Its answer is read by `reconcile_core::preflight::read_deep`; `gather` runs it.
pub(super) const DEEP_SCRIPT: &str = include_str!("deep.py");

/// Checks the model's weights without reading them (`reconcile_core::preflight::read_weights`
/// reads its answer, one JSON object): each file `model.safetensors.index.json` names (or the
/// single `model.safetensors`) exists and is exactly as long as its safetensors header says. Only
/// the headers are read: 8 bytes of header length, then the JSON header (at most 100 MB, the
/// safetensors library's own limit). Also the host's `MemAvailable`, which preloading the weights
/// needs.
macro_rules! weights_fn {
    () => {
        r#"import json, os, struct, sys
def check_weights(d):
    out = {"files": [], "bytes": 0, "problems": [], "unchecked": None, "mem_available": None}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    out["mem_available"] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    seen(d)
    if not os.path.isdir(d):
        out["unchecked"] = "the model path is not a folder on the host"
        return out
    index = os.path.join(d, "model.safetensors.index.json")
    seen(index)
    seen(os.path.join(d, "model.safetensors"))
    if os.path.isfile(index):
        try:
            with open(index) as f:
                names = list(dict.fromkeys(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            out["problems"].append({"file": "model.safetensors.index.json", "problem": "does not read: %s" % e})
            return out
    elif os.path.isfile(os.path.join(d, "model.safetensors")):
        names = ["model.safetensors"]
    else:
        out["unchecked"] = "the model folder has no model.safetensors.index.json or model.safetensors"
        return out
    for name in names:
        out["files"].append(name)
        path = os.path.join(d, name)
        seen(path)
        try:
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                head = f.read(8)
                n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
                header = json.loads(f.read(n)) if 0 < n <= min(size - 8, 100000000) else None
        except FileNotFoundError:
            out["problems"].append({"file": name, "problem": "is missing"})
            continue
        except (OSError, ValueError) as e:
            out["problems"].append({"file": name, "problem": "cannot be read: %s" % e})
            continue
        out["bytes"] += size
        try:
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
            want = 8 + n + max(ends, default=0)
        except (AttributeError, KeyError, IndexError, TypeError):
            out["problems"].append({"file": name, "problem": "is not safetensors or is cut short: its header does not read (%d bytes)" % size})
            continue
        if size < want:
            out["problems"].append({"file": name, "problem": "is truncated: %d of the %d bytes its safetensors header implies" % (size, want)})
        elif size > want:
            out["problems"].append({"file": name, "problem": "has %d bytes, more than the %d its safetensors header implies" % (size, want)})
    return out
"#
    };
}

/// The weights check alone, of the model path `$1` (`sys.argv[1]`): one JSON line.
pub(super) const WEIGHTS_SCRIPT: &str = concat!(
    seen_fn!(),
    weights_fn!(),
    "print(json.dumps(check_weights(sys.argv[1])))\n"
);

/// Caches the survey Python's answer on the host for the next plan ([`CACHED_OR_PYTHON`]
/// reads it): one file, written whole then renamed, readable by root alone, with the shell's
/// environment line, every path the answer read (and what decides `sys.path`: the Python the
/// survey ran, which may be a wrapper, `pyvenv.cfg`, the site folders and their `.pth` files),
/// then the stat of each that exists, as GNU `stat -L -c '%n %i %s %.9Y %.9Z'` prints it, then
/// the answer. Not cached: anything changed in the last 2 s, since a write in the same clock tick
/// as the stat before it leaves the times as they were, and some filesystems keep times to 2 s
/// (FAT); and a path with a newline, which the shell reads a line at a time.
macro_rules! keep_fn {
    () => {
        r##"def keep(path, runner, env, answer):
    import site, time
    seen(runner)
    seen(os.path.join(sys.prefix, "pyvenv.cfg"))
    try:
        dirs = site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:
        dirs = []
    for d in dirs:
        seen(d)
        try:
            pth = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except OSError:
            continue
        for n in pth:
            seen(os.path.join(d, n))
    now = time.time_ns()
    if "\n" in env or any("\n" in p for p in SEEN):
        return
    if any(st is not None and max(st.st_mtime_ns, st.st_ctime_ns) > now - 2000000000 for st in SEEN.values()):
        return
    def t(ns):
        return "%d.%09d" % divmod(ns, 1000000000)
    stats = ["%s %d %d %s %s" % (p, st.st_ino, st.st_size, t(st.st_mtime_ns), t(st.st_ctime_ns))
             for p, st in SEEN.items() if st is not None]
    text = "\n".join(["#reconcile-survey-kept " + env, *SEEN, "--", *stats, "--", *answer]) + "\n"
    folder = os.path.dirname(path)
    try:
        os.umask(0o077)  # every folder it makes root's alone, not only the last
        os.makedirs(folder, mode=0o700, exist_ok=True)
        part = "%s.%d" % (path, os.getpid())
        with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(text)
        os.replace(part, path)
        # Answers no survey wrote for 30 days are forgotten.
        for e in os.scandir(folder):
            if e.is_file() and e.stat().st_mtime < now / 1e9 - 30 * 86400:
                os.unlink(e.path)
    except OSError:
        return
    print("#reconcile-survey-kept-as " + path, file=sys.stderr)
"##
    };
}

/// The survey's Python, one per Python a host's units run: the weights of the units that change
/// (`$1`, a file of NUL-separated unit indices and model paths the survey wrote), one
/// `#weights <i> <json>` line each, then the SGLang version as the last line. One Python start
/// where the version and each unit's weights took one each: on a host, a Python start is most of
/// what a plan costs. The weights come first, so that a Python without SGLang still checks them.
/// Then, where `$2` names a file, the answer is cached there (`keep_fn`) for the Python `$3` the
/// survey ran and its environment line `$4`, without the memory available, a fact of the moment.
pub(super) const SURVEY_PYTHON: &str = concat!(
    seen_fn!(),
    sglang_version_fn!(),
    weights_fn!(),
    keep_fn!(),
    r##"kept = []
if len(sys.argv) > 1:
    try:
        with open(sys.argv[1], "rb") as f:
            parts = f.read().split(b"\0")
    except OSError:
        parts = []
    for i, path in zip(parts[0::2], parts[1::2]):
        weights = check_weights(os.fsdecode(path))
        print("#weights %s %s" % (i.decode(), json.dumps(weights)), flush=True)
        weights["mem_available"] = None
        kept.append("#weights %s %s" % (i.decode(), json.dumps(weights)))
version = sglang_version()
print(version, flush=True)
if len(sys.argv) > 4 and sys.argv[2]:
    keep(sys.argv[2], sys.argv[3], sys.argv[4], kept + [version])
"##
);
