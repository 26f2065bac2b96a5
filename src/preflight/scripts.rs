//! The fixed scripts preflight runs on a host, as their own commands (`gather`) or as parts of
//! the survey (`survey`). Manifest values reach them only as positional arguments.

/// Records each file and folder a script reads, with its stat from before the read: what an
/// answer kept on the host is keyed by (`keep_fn`).
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

/// Runs the Python only when it is an executable file, so a missing one is told apart from one
/// that fails (status 100).
macro_rules! python_runner {
    () => {
        "test -f \"$1\" && test -x \"$1\" || exit 100; p=$1; shift; exec \"$p\" \"$@\""
    };
}
pub(super) const PYTHON: &str = python_runner!();

/// The survey's runner of its Python: the answer the host kept for it (`keep_fn`: `$1`, read
/// when `$2` is 1) while the environment line (`$3`) and every file and folder it read are as they
/// were, in one `stat` where a Python start costs ~20 ms of a host's CPU; else [`PYTHON`] with the
/// arguments after these three. A kept answer read says so on stderr.
pub(super) const KEPT_OR_PYTHON: &str = concat!(
    r##"kf=$1 reuse=$2 kenv=$3; shift 3
kept() {
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
    python_runner!(),
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
/// safetensors library's own limit). Also the host's `MemAvailable`, which staging the weights
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

/// Keeps the survey Python's answer on the host for the next plan ([`KEPT_OR_PYTHON`]
/// reads it): one file, written whole then renamed, readable by root alone, with the shell's
/// environment line, every path the answer read (and what decides `sys.path`: the Python the
/// survey ran, which may be a wrapper, `pyvenv.cfg`, the site folders and their `.pth` files),
/// then the stat of each that exists, as GNU `stat -L -c '%n %i %s %.9Y %.9Z'` prints it, then
/// the answer. Not kept: anything changed in the last 2 s, since a write in the same clock tick
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
/// Then, where `$2` names a file, the answer is kept there (`keep_fn`) for the Python `$3` the
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
