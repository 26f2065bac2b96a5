//! The fixed scripts preflight runs on a host, as their own commands (`gather`) or as parts of
//! the survey (`survey`). Manifest values reach them only as positional arguments.

/// Reads the installed version from the distribution's metadata, as `importlib.metadata` does:
/// the first `sglang-<version>.dist-info` (or `.egg-info`) along `sys.path`. Importing `sglang`
/// would take seconds (it imports torch); importing `importlib.metadata` alone costs ~0.1 s of CPU
/// a host, which a 16-host plan feels, so the folder scan comes first and `importlib.metadata`
/// (same answer, same PackageNotFoundError) only when the scan finds nothing.
pub(super) const VERSION_SCRIPT: &str = r#"import os, sys
def scan():
    for d in sys.path:
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
            try:
                with open(os.path.join(d or ".", n, meta), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break
            except OSError:
                pass
found = scan()
if found is None:
    from importlib.metadata import version
    found = version("sglang")
print(found)
"#;

/// Runs the Python only when it is an executable file, so a missing one is told apart from one
/// that fails (status 100).
pub(super) const PYTHON: &str =
    "test -f \"$1\" && test -x \"$1\" || exit 100; p=$1; shift; exec \"$p\" \"$@\"";

/// 0: readable, 100: missing, 101: there but unreadable.
pub(super) const ACCESS: &str = "test -e \"$1\" || exit 100; test -r \"$1\" || exit 101";

/// The listeners on a TCP port and the cgroups of their processes (see `parse_listeners`).
pub(super) const LISTENERS: &str = "command -v ss >/dev/null 2>&1 || exit 100
out=$(ss -Htlnp \"sport = :$1\") || exit 101
[ -n \"$out\" ] && printf '%s\\n' \"$out\"
echo '#cgroups'
for pid in $(printf '%s\\n' \"$out\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
  printf '%s %s\\n' \"$pid\" \"$(tr '\\n' ' ' < /proc/$pid/cgroup 2>/dev/null)\"
done";

/// The deep check (`deep.py`, read there with what it runs and where SGLang 0.5.23 does it): the
/// host's SGLang parses the unit's exact arguments, resolves them, builds the model's config
/// (config.json, dtype, context length, quantization) and checks `--chat-template`, as a launch
/// would before it loads any weights, with the unit's environment and working directory and the
/// GPUs hidden. Its answer is read by `reconcile_core::preflight::read_deep`; `gather` runs it.
pub(super) const DEEP_SCRIPT: &str = include_str!("deep.py");
