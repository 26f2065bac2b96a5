//! The survey: everything `plan` and `apply` read from a host before deciding, in one command per
//! host. On a real network each sequential command costs a round trip (tens of ms across sites),
//! and a host's units used to cost two or three each.
//!
//! One fixed script, with every manifest value as a positional argument (never part of its text),
//! runs each part in the background under `timeout`, so the parts overlap as the separate
//! commands did, and a hung part (`nvidia-smi` on a GPU that fell off the bus, `test -r` on a stale
//! NFS mount) ends at the command limit and is named as its own command was. Its output, one
//! section per part with the part's exit status, is read by `reconcile_core::survey`.
//!
//! The checks only a change needs (model path, GPUs, port) are skipped for a unit whose file on the
//! host is byte-identical to the rendered one (same sha256: the plan's "no change"), as before.
//!
//! A Python's answer (the SGLang version, the weights of the units that change) is cached on the
//! host with the stat of every file and folder it read, and a plan reads it back while those are
//! as they were: one `stat` where a Python start cost ~20 ms of the host's CPU. What changes by
//! the moment (systemd's state, the GPUs, the port's listeners, the memory available) is read
//! afresh every time, and `apply` reads everything afresh.

use std::time::Duration;

use reconcile_core::preflight::owners;
use reconcile_core::survey::{self, Fault, Sections};

use super::{Access, DeepWhen, Gpus, Port, Python, Want, WeightsCheck};
use crate::digest::sha256;
use crate::observed::{Observed, SHOW_PROPERTIES};
use crate::plan::UNIT_DIR;
use crate::record::{parse_record, Record, RecordError, RecordProblem};
use crate::remote::{Host, RemoteError};
use crate::targets::Target;

/// Arguments a unit takes in the script: name, unit path, sha256 of the rendered unit, model
/// path, port, record path ("" for none), then the lookup's of a cached deep-check verdict (the
/// controller's half of its key, "" for no lookup; the model, tokenizer and chat-template paths),
/// then the index of the unit's Python among the survey's (which checks the model's weights).
const PER_UNIT: usize = 11;

/// The script. `$1` the parts' limit in seconds, `$2` systemctl's properties, `$3`..`$8` the fixed
/// scripts of the parts (`scripts.rs`: the Python runner and the survey's Python; the model path's
/// access, the port's listeners; the unit's files: `reconcile_core::unit_files`; the lookup of a
/// cached deep-check verdict: `cache.rs`), `$9` where the Pythons' answers are cached ("": not cached),
/// `$10` 1 to read them from there, then the number of Pythons and each one's path and the name
/// of its cached answers, then the number of units and each one's [`PER_UNIT`] arguments (an empty
/// model path: no checks for a change).
///
/// Every process counts: with 16 hosts a plan is as slow as its slowest host, and a survey used
/// to start ~100 of them for a unit that changes. So the local files (the unit, its records) are
/// read with one `cat` each, `systemctl show` runs once a unit and its unit files are read from its
/// answer, one Python a host reads the SGLang version and checks the weights of every unit that
/// changes, and one `base64` encodes every answer. What could hang (systemctl, a model path on a
/// stale NFS mount, `nvidia-smi` on a GPU that fell off the bus, `ss`, the Python) runs in the
/// background under `timeout` and is named as its own command would be. The lookup of a cached
/// verdict runs beside the version read it depends on, for any version: the caller compares.
/// Every part writes to files of its own, never to the script's stdout, so a part that outlives
/// its `timeout` cannot hold the session open. Without `base64`, `sha256sum` or `stat` it exits 101
/// before printing anything: the caller then asks one command per fact.
const SCRIPT: &str = r##"# survey: unit files, systemctl show, drop-ins, SGLang versions, model paths, nvidia-smi, ss, records
t=$1 props=$2 py=$3 spy=$4 acc=$5 lis=$6 lay=$7 kept=$8 keep=$9 reuse=${10}
shift 10
command -v base64 >/dev/null 2>&1 && command -v sha256sum >/dev/null 2>&1 &&
  command -v stat >/dev/null 2>&1 || exit 101
command -v timeout >/dev/null 2>&1 || timeout() { shift 3; "$@"; }
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
keys=
# A section's files, there before anything writes them: an answer always has both bodies.
section() { : >"$d/$1.o"; : >"$d/$1.e"; : >"$d/$1.s"; keys="$keys $1"; }
part() {
  k=$1; shift; section "$k"
  { timeout -k 1 "$t" "$@" >"$d/$k.o" 2>"$d/$k.e"; echo $? >"$d/$k.s"; } </dev/null &
}
# The environment the Pythons start with, as far as it decides where they look for SGLang: an
# answer kept on the host is read only for the same (CACHED_OR_PYTHON).
kenv=$(printf '%s\037' "$PYTHONPATH" "$PYTHONHOME" "$PYTHONUSERBASE" "$PYTHONNOUSERSITE" \
  "$PYTHONSAFEPATH" "$PYTHONPLATLIBDIR")
# A local file: read at once (100: there is none).
file() {
  section "$1"
  if [ -e "$2" ]; then cat -- "$2" >"$d/$1.o" 2>"$d/$1.e"; echo $? >"$d/$1.s"; else echo 100 >"$d/$1.s"; fi
}
np=$1; shift
j=0
while [ "$j" -lt "$np" ]; do
  eval "py_$j=\$1 pk_$j=\$2"
  shift 2; j=$((j + 1))
done
n=$1; shift
i=0
changed=0
while [ "$i" -lt "$n" ]; do
  file "unit.$i" "$2"
  section "show.$i"; section "layers.$i"
  { timeout -k 1 "$t" systemctl show -p "$props" -- "$1" >"$d/show.$i.o" 2>"$d/show.$i.e"
    echo $? >"$d/show.$i.s"
    sh -c "$lay" sh "$1" "$2" "$d/show.$i.o" >"$d/layers.$i.o" 2>"$d/layers.$i.e"
    echo $? >"$d/layers.$i.s"; } </dev/null &
  [ -n "$6" ] && file "record.$i" "$6" && file "guard.$i" "${6%/*}/guard.json"
  # A drop-in directory may change what runs even when the file is the rendered one.
  h=$(sha256sum <"$2" 2>/dev/null)
  dropins=
  for f in "/etc/systemd/system/$1.d/"* "/run/systemd/system/$1.d/"* \
    "/usr/lib/systemd/system/$1.d/"* "/lib/systemd/system/$1.d/"*; do
    [ -e "$f" ] && dropins=1
  done
  if [ -n "$4" ] && { [ "${h%% *}" != "$3" ] || [ -n "$dropins" ]; }; then
    changed=1
    part "access.$i" sh -c "$acc" sh "$4"
    part "ports.$i" sh -c "$lis" sh "$5"
    [ -n "$7" ] && part "kept.$i" sh -c "$kept" sh "$7" "$8" "$9" "${10}" ""
    printf '%s\0%s\0' "$i" "$4" >>"$d/weights.${11}"
  fi
  shift 11; i=$((i + 1))
done
j=0
while [ "$j" -lt "$np" ]; do
  eval "p=\$py_$j kf=\$pk_$j"
  # Kept by the Python's name and the weights it is to check.
  kf=${keep:+$keep/$kf}
  if [ -n "$kf" ] && [ -s "$d/weights.$j" ]; then
    w=$(sha256sum <"$d/weights.$j") && kf=$kf-${w%% *} || kf=
  fi
  part "python.$j" sh -c "$py" sh "$kf" "$reuse" "$kenv" interpreter "$p" -I -S -c "$spy" "$d/weights.$j" "$kf" "$p" "$kenv"
  j=$((j + 1))
done
[ "$changed" = 1 ] && part gpus nvidia-smi -L
wait
# Every body, in header order: stat sizes them for the headers, then one base64 encodes them.
set --
for k in $keys; do set -- "$@" "$d/$k.o" "$d/$k.e"; done
[ $# = 0 ] || stat -c %s -- "$@" | for k in $keys; do
  read -r o; read -r e; s=; read -r s <"$d/$k.s"
  printf '== %s %s %s %s\n' "$k" "${s:-125}" "$o" "$e"
done
echo '== end 0'
[ $# = 0 ] || cat -- "$@" | base64
"##;

/// What the whole survey may take beyond one part's limit: `timeout -k 1`'s second for a part
/// that ignores TERM, and the start of the script and its Pythons (~0.1 s each on a real host).
const SLACK: Duration = Duration::from_secs(5);

/// The name of the survey in errors and traces.
pub const NAME: &str = "the survey (unit files, systemctl show, SGLang versions, model paths, nvidia-smi, ss, records)";

/// What a host answered for a set of targets, read once.
pub struct Survey {
    host: String,
    limit: Duration,
    sections: Sections,
    pythons: Vec<String>,
    units: Vec<String>,
    records: Option<String>,
}

/// What a survey asks besides each unit's file and `systemctl show`.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Each Python's SGLang version, and for units that change, the checks a change needs.
    pub preflight: bool,
    /// The deployment records under this state directory (`apply`).
    pub records: Option<&'a str>,
    /// For units that change, the deep check's verdict cached on the host for what it would read,
    /// so that a cached one costs no command of its own.
    pub cached_deep: bool,
    /// Each Python's answer (SGLang version, weights) as the host cached it while nothing it read
    /// has changed, instead of a Python start. A plan's; `apply` asks afresh, since preloading
    /// needs the memory available now. Every survey caches what its Pythons answered.
    pub cached_python: bool,
}

impl Ask<'_> {
    /// What `plan` needs: preflight, the records under `state_dir` for what the host's guard
    /// did, and cached deep-check verdicts where the deep check runs.
    pub fn plan(state_dir: &str, deep: DeepWhen) -> Ask<'_> {
        Ask {
            preflight: true,
            records: Some(state_dir),
            cached_deep: deep != DeepWhen::Never,
            cached_python: true,
        }
    }
}

/// Asks `host` for every fact of `targets` at once. `Ok(None)`: the host could not run the survey
/// (no `mktemp`, `base64` or `sha256sum`, or an output that does not read): the caller falls back
/// to one command per fact. An error is the connection's, or the survey hung past every part's
/// limit.
pub async fn survey(
    host: &dyn Host,
    targets: &[Target],
    ask: Ask<'_>,
) -> Result<Option<Survey>, RemoteError> {
    let records = ask.records;
    let limit = host.limits().command;
    let wants: Vec<Want> = targets.iter().map(Want::of).collect();
    let mut pythons: Vec<String> = Vec::new();
    for w in wants.iter().filter(|_| ask.preflight) {
        if !pythons.contains(&w.python) {
            pythons.push(w.python.clone());
        }
    }
    let units: Vec<String> = targets.iter().map(|t| t.desired.unit.clone()).collect();
    let record_path = |unit: &str| records.map(|dir| format!("{dir}/{unit}/current.json"));
    let mut args: Vec<String> = vec![
        format!("{:.3}", limit.as_secs_f64()),
        SHOW_PROPERTIES.to_string(),
        super::scripts::CACHED_OR_PYTHON.to_string(),
        super::scripts::SURVEY_PYTHON.to_string(),
        super::scripts::ACCESS.to_string(),
        super::scripts::LISTENERS.to_string(),
        crate::unit_files::UNIT_FILES_SCRIPT.to_string(),
        super::cache::lookup_script(&super::cache::cache_dir()),
        cached_python_dir(),
        if ask.cached_python { "1" } else { "0" }.to_string(),
        pythons.len().to_string(),
    ];
    for python in &pythons {
        let name = sha256(&serde_json::json!([python, super::scripts::SURVEY_PYTHON]).to_string());
        args.extend([python.clone(), name]);
    }
    args.push(targets.len().to_string());
    for (t, w) in targets.iter().zip(&wants) {
        let unit = &t.desired.unit;
        let fields = [
            unit.clone(),
            format!("{UNIT_DIR}/{unit}"),
            sha256(&t.desired.text),
            // An empty model path: no change-only checks (see the script).
            if ask.preflight {
                w.model_path.clone()
            } else {
                String::new()
            },
            w.port.to_string(),
            record_path(unit).unwrap_or_default(),
        ];
        // The lookup without a version: the survey reads it beside.
        let lookup: Vec<String> = match ask.preflight && ask.cached_deep {
            true => super::cache::Cached::of(t).lookup_args("")[..4]
                .iter()
                .map(|a| a.to_string())
                .collect(),
            false => vec![String::new(); 4],
        };
        // The unit's Python, by its place among the survey's (none without preflight: nothing
        // changes then, and no weights are checked).
        let python = pythons.iter().position(|p| *p == w.python).unwrap_or(0);
        let fields: Vec<String> = fields
            .into_iter()
            .chain(lookup)
            .chain([python.to_string()])
            .collect();
        debug_assert_eq!(fields.len(), PER_UNIT);
        args.extend(fields);
    }
    let mut argv: Vec<&str> = vec!["sh", "-c", SCRIPT, "sh"];
    argv.extend(args.iter().map(String::as_str));
    let out = host
        .run_within(&argv, None, limit + SLACK)
        .await
        .map_err(named)?;
    if out.status != 0 {
        tracing::debug!(host = host.name(), status = out.status, stderr = %out.stderr.trim(), "the survey did not run; one command per fact instead");
        return Ok(None);
    }
    match Sections::parse(&out.stdout) {
        Ok(sections) => {
            said_cached(host.name(), &pythons, &sections);
            Ok(Some(Survey {
                host: host.name().to_string(),
                limit,
                sections,
                pythons,
                units,
                records: records.map(str::to_string),
            }))
        }
        Err(e) => {
            tracing::debug!(host = host.name(), error = %e, "one command per fact instead");
            Ok(None)
        }
    }
}

/// Says where a Python's answer was read from what the host cached, or cached for the next plan.
fn said_cached(host: &str, pythons: &[String], sections: &Sections) {
    for (j, python) in pythons.iter().enumerate() {
        let Ok(section) = sections.get(&format!("python.{j}")) else {
            continue;
        };
        for line in section.stderr.lines() {
            if let Some(path) = line.strip_prefix("#reconcile-survey-kept-as ") {
                tracing::info!(
                    host,
                    "{python}'s SGLang version and weights are kept on the host as {path}"
                );
            } else if let Some(path) = line.strip_prefix("#reconcile-survey-kept ") {
                tracing::info!(host, "{python}'s SGLang version and weights were kept on the host ({path}): nothing they read has changed");
            }
        }
    }
}

/// Where a host caches its Pythons' answers, one file each Python and list of weights to check.
fn cached_python_dir() -> String {
    format!("{}/survey", crate::state::STATE_DIR)
}

/// The survey's error, naming it rather than showing its argv (its fixed scripts, every value).
fn named(e: RemoteError) -> RemoteError {
    match e {
        RemoteError::TimedOut { host, after, .. } => RemoteError::TimedOut {
            host,
            command: NAME.to_string(),
            after,
        },
        RemoteError::Transport { host, source, .. } => RemoteError::Transport {
            host,
            command: NAME.to_string(),
            source,
        },
        e => e,
    }
}

impl Survey {
    /// Which of the surveyed units `unit` is.
    fn index(&self, unit: &str) -> Result<usize, RemoteError> {
        self.units
            .iter()
            .position(|u| u == unit)
            .ok_or_else(|| self.error(Fault::Absent { key: unit.into() }))
    }

    fn error(&self, fault: Fault) -> RemoteError {
        match fault {
            Fault::TimedOut { command } => RemoteError::TimedOut {
                host: self.host.clone(),
                command,
                after: self.limit,
            },
            Fault::Failed {
                command,
                status,
                stderr,
            } => RemoteError::Failed {
                host: self.host.clone(),
                command,
                status,
                stderr,
            },
            Fault::Absent { key } => RemoteError::Failed {
                host: self.host.clone(),
                command: NAME.to_string(),
                status: -1,
                stderr: format!("its answer has no section {key}"),
            },
        }
    }

    fn read<T>(
        &self,
        key: &str,
        read: impl FnOnce(&survey::Section) -> Result<T, Fault>,
    ) -> Result<T, RemoteError> {
        self.sections
            .get(key)
            .and_then(read)
            .map_err(|f| self.error(f))
    }

    /// The unit's file and systemd's state for it, as `Systemd::observe` reads them.
    pub fn observed(&self, unit: &str) -> Result<Observed, RemoteError> {
        let i = self.index(unit)?;
        let path = format!("{UNIT_DIR}/{unit}");
        let unit_text = self.read(&format!("unit.{i}"), |s| survey::file(s, &path))?;
        let state = self.read(&format!("show.{i}"), |s| survey::show(s, unit))?;
        let unit_files = self.read(&format!("layers.{i}"), |s| {
            survey::unit_files(s, &state.load_state, &state.unit_file_state)
        })?;
        Ok(Observed {
            unit_text,
            state,
            unit_files,
        })
    }

    /// The SGLang installed for the target's Python.
    pub fn python(&self, t: &Target) -> Result<Python, RemoteError> {
        let python = Want::of(t).python;
        let j = self
            .pythons
            .iter()
            .position(|p| *p == python)
            .ok_or_else(|| self.error(Fault::Absent { key: python }))?;
        self.read(&format!("python.{j}"), survey::python)
    }

    /// What the trust check found writable by others among what the target's Python runs.
    pub fn writable(&self, t: &Target) -> Vec<owners::Writable> {
        let python = Want::of(t).python;
        let j = self.pythons.iter().position(|p| *p == python);
        j.and_then(|j| self.sections.get(&format!("python.{j}")).ok())
            .map(|s| owners::writable(&s.stderr))
            .unwrap_or_default()
    }

    /// The checks a change needs (model path, GPUs, port); `None` when they were skipped (the
    /// unit on the host was the rendered one).
    pub fn checks(&self, t: &Target) -> Option<Result<(Access, Gpus, Port), RemoteError>> {
        let i = self.index(&t.desired.unit).ok()?;
        let (access, ports) = (format!("access.{i}"), format!("ports.{i}"));
        if !self.sections.contains(&access) || !self.sections.contains(&ports) {
            return None;
        }
        let want = Want::of(t);
        let read = || {
            Ok((
                self.read(&access, |s| survey::access(s, &want.model_path))?,
                self.read("gpus", survey::gpus)?,
                self.read(&ports, |s| survey::listeners(s, want.port))?,
            ))
        };
        Some(read())
    }

    /// The deep check's verdict the host cached for the target's inputs and this `python`'s SGLang:
    /// the lookup's output, read as the check's own. `None` where none was looked up or cached.
    pub fn cached_deep(&self, t: &Target, python: &Python) -> Option<&str> {
        let Python::Sglang(version) = python else {
            return None;
        };
        let i = self.index(&t.desired.unit).ok()?;
        let section = self.sections.get(&format!("kept.{i}")).ok()?;
        match super::cache::read(&section.stdout) {
            super::cache::Lookup::Cached { version: v, .. }
                if section.status == 0 && v == version =>
            {
                Some(&section.stdout)
            }
            _ => None,
        }
    }

    /// The check of the target's model weights; `None` when the survey did not check them (the
    /// unit on the host was the rendered one). The survey's Python checks them, one
    /// `#weights <i> <json>` line a unit: a Python that could not start, or hung, fails them as it
    /// fails the version.
    pub fn weights(&self, t: &Target) -> Option<WeightsCheck> {
        let i = self.index(&t.desired.unit).ok()?;
        if !self.sections.contains(&format!("access.{i}")) {
            return None;
        }
        let python = Want::of(t).python;
        let j = self.pythons.iter().position(|p| *p == python)?;
        let section = self.sections.get(&format!("python.{j}")).ok()?;
        let prefix = format!("#weights {i} ");
        let line = section.stdout.lines().find_map(|l| l.strip_prefix(&prefix));
        Some(match line {
            Some(json) => WeightsCheck::of(0, json, ""),
            // No line of its own: the Python failed before it, or never ran.
            None => WeightsCheck::of(
                if section.status == 0 {
                    1
                } else {
                    section.status
                },
                "",
                &section.stderr,
            ),
        })
    }

    /// The unit's deployment record (`current.json`), as `crate::state::read_record` reads it;
    /// `None` when the survey did not ask for records.
    pub fn record(&self, unit: &str) -> Option<Result<Option<Record>, RecordError>> {
        let dir = self.records.as_deref()?;
        let path = format!("{dir}/{unit}/current.json");
        let error = |problem| RecordError {
            host: self.host.clone(),
            path: path.clone(),
            problem,
        };
        let read = self
            .index(unit)
            .and_then(|i| self.read(&format!("record.{i}"), |s| survey::file(s, &path)));
        Some(match read {
            Ok(None) => Ok(None),
            Ok(Some(text)) => parse_record(&text).map(Some).map_err(error),
            Err(e) => Err(error(RecordProblem::Unreadable(
                crate::remote::error_chain(&e),
            ))),
        })
    }
}

impl Survey {
    /// The unit's guard record (`guard.json`, beside the deployment record), when the survey
    /// asked for records and the host has one that reads.
    pub fn guard(&self, unit: &str) -> Option<reconcile_core::guard::Settled> {
        let dir = self.records.as_deref()?;
        let path = format!("{dir}/{unit}/guard.json");
        let i = self.index(unit).ok()?;
        let text = self
            .read(&format!("guard.{i}"), |s| survey::file(s, &path))
            .ok()??;
        reconcile_core::guard::Settled::parse(&text).ok()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use reconcile_core::survey::Section;
    use std::process::Command;

    /// Runs the real script here, with `bin` first on PATH (stand-ins for systemctl, nvidia-smi
    /// and ss), and reads its answer.
    pub(crate) fn run_script(bin: &std::path::Path, args: &[&str]) -> (i32, String) {
        let out = script(bin).args(args).output().expect("sh runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// The real script, to be given its arguments, with `bin` first on PATH.
    fn script(bin: &std::path::Path) -> Command {
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut sh = Command::new("sh");
        sh.args(["-c", SCRIPT, "sh"]).env("PATH", path);
        sh
    }

    /// A venv as `python3 -m venv` lays it out, its interpreter this machine's `/usr/bin/python3`
    /// (root's), and its site folder, where a test puts SGLang's dist-info.
    pub(super) fn venv(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let venv = dir.join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            "home = /usr/bin\ninclude-system-site-packages = false\n",
        )
        .unwrap();
        let python = venv.join("bin/python3");
        std::os::unix::fs::symlink("/usr/bin/python3", &python).unwrap();
        let out = Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys; print('python%d.%d' % sys.version_info[:2])",
            ])
            .output()
            .expect("/usr/bin/python3 runs (the tests need it, as the hosts do)");
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let site = venv.join("lib").join(version).join("site-packages");
        std::fs::create_dir_all(&site).unwrap();
        (python, site)
    }

    fn stand_in(bin: &std::path::Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_script_answers_every_part_and_a_hung_one_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        stand_in(
            &bin,
            "systemctl",
            "echo \"LoadState=loaded\"; echo \"Id=$5\"",
        );
        stand_in(&bin, "nvidia-smi", "exec sleep 30");
        stand_in(&bin, "ss", "exit 0");
        let unit = dir.path().join("a.service");
        std::fs::write(&unit, "[Service]\n== end 0\n").unwrap();
        let same = dir.path().join("b.service");
        std::fs::write(&same, "same\n").unwrap();
        let (unit, same) = (unit.to_str().unwrap(), same.to_str().unwrap());
        let evil = "$(touch /tmp/reconcile-survey-pwned)'\"";
        let started = std::time::Instant::now();
        // Each part's limit: 5 s, which a python3 starting on a loaded two-core machine stays
        // inside (it took over 2 s while three builds ran); the hung part (30 s) ends at it.
        // a's model folder, for the lookup of a cached deep-check verdict.
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let cache_dir = dir.path().join("kept");
        let lookup = super::super::cache::lookup_script(cache_dir.to_str().unwrap());
        let model = model.to_str().unwrap();
        // The survey's own Python, with SGLang's version read as if this machine had 0.5.9.
        let python = super::super::scripts::SURVEY_PYTHON
            .replace("version = sglang_version()", "version = '0.5.9'");
        #[rustfmt::skip]
        let survey = || run_script(&bin, &[
            "5", "LoadState", super::super::scripts::CACHED_OR_PYTHON, &python,
            super::super::scripts::ACCESS, super::super::scripts::LISTENERS,
            crate::unit_files::UNIT_FILES_SCRIPT, &lookup, "", "0",
            "1", "/usr/bin/python3", "py0",
            "2",
            "a.service", unit, "0000", evil, "30000", "", "base", model, model, "", "0",
            "b.service", same, &sha256("same\n"), "/nonexistent", "30001", "/nonexistent/current.json",
            "base", model, model, "", "0",
        ]);
        let (status, out) = survey();
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "the hung part ended at its limit"
        );
        assert_eq!(status, 0, "{out}");
        let s = Sections::parse(&out).unwrap();
        assert_eq!(
            survey::file(s.get("unit.0").unwrap(), unit)
                .unwrap()
                .as_deref(),
            Some("[Service]\n== end 0\n")
        );
        assert_eq!(
            survey::show(s.get("show.1").unwrap(), "b")
                .unwrap()
                .load_state,
            "loaded"
        );
        assert!(s.get("show.1").unwrap().stdout.contains("Id=b.service"));
        assert_eq!(
            survey::python(s.get("python.0").unwrap()),
            Ok(Python::Sglang("0.5.9".into()))
        );
        assert_eq!(
            survey::access(s.get("access.0").unwrap(), evil),
            Ok(Access::Missing)
        );
        assert!(!std::path::Path::new("/tmp/reconcile-survey-pwned").exists());
        // Nothing listens, and the shell read this machine's ephemeral port range.
        let Ok(Port::Listeners {
            listeners,
            ephemeral: Some(range),
        }) = survey::listeners(s.get("ports.0").unwrap(), 30000)
        else {
            panic!("{:?}", s.get("ports.0"))
        };
        assert!(listeners.is_empty() && range.low <= range.high, "{range:?}");
        assert_eq!(
            survey::gpus(s.get("gpus").unwrap()),
            Err(Fault::TimedOut {
                command: "nvidia-smi".into()
            })
        );
        // a's model path is no folder: its weights are not checked, and the check says why. The
        // Python that read the version checked them.
        let python = &s.get("python.0").unwrap().stdout;
        let line = python.lines().find_map(|l| l.strip_prefix("#weights 0 "));
        let WeightsCheck::Read(weights) = WeightsCheck::of(0, line.unwrap_or(""), "") else {
            panic!("{python}")
        };
        assert_eq!(
            weights.unchecked.as_deref(),
            Some("the model path is not a folder on the host")
        );
        assert!(weights.files.is_empty() && weights.problems.is_empty());
        // b is unchanged: no change-only checks, and its record is absent.
        assert!(!s.contains("access.1") && !s.contains("ports.1") && !s.contains("record.0"));
        assert!(!s.contains("kept.1") && !python.contains("#weights 1 "));
        assert_eq!(survey::file(s.get("record.1").unwrap(), "/r"), Ok(None));

        // a changes: the lookup of its cached deep-check verdict found none, and says its key; a
        // verdict cached under that key is in the next survey, with the version that gave it.
        use super::super::cache::{read, Lookup};
        let lookup = &s.get("kept.0").unwrap().stdout;
        let Lookup::Keyed(key) = read(lookup) else {
            panic!("{lookup}")
        };
        std::fs::create_dir(&cache_dir).unwrap();
        let answer = "#reconcile-deep {\"verdict\": \"accepted\", \"unchecked\": []}\n";
        let kept = format!("#reconcile-deep-version 0.5.9\n{answer}");
        std::fs::write(cache_dir.join(key), kept).unwrap();
        let (status, out) = survey();
        assert_eq!(status, 0, "{out}");
        let s = Sections::parse(&out).unwrap();
        let lookup = &s.get("kept.0").unwrap().stdout;
        assert_eq!(
            read(lookup),
            Lookup::Cached {
                key,
                version: "0.5.9",
                answer
            }
        );
    }

    /// A safetensors file of one 4-byte tensor: 8 bytes of header length, the header, the data.
    fn safetensors() -> Vec<u8> {
        let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0; 4]);
        bytes
    }

    #[test]
    fn a_pythons_answer_is_kept_for_the_next_plan_and_read_until_what_it_read_changes() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        stand_in(&bin, "systemctl", "echo LoadState=loaded");
        stand_in(&bin, "nvidia-smi", "echo 'GPU 0: H100 (UUID: GPU-a)'");
        stand_in(&bin, "ss", "exit 0");
        // This Python's SGLang: a dist-info in its venv's site folder.
        let (python, site) = venv(dir.path());
        let python = python.to_str().unwrap();
        let dist_info = |version: &str| {
            let d = site.join(format!("sglang-{version}.dist-info"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("METADATA"),
                format!("Name: sglang\nVersion: {version}\n"),
            )
            .unwrap();
            d
        };
        let old = dist_info("0.5.9");
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("model.safetensors"), safetensors()).unwrap();
        let unit = dir.path().join("a.service");
        std::fs::write(&unit, "[Service]\n").unwrap();
        let keep = dir.path().join("keep");
        let lookup = super::super::cache::lookup_script(dir.path().join("kept").to_str().unwrap());
        let survey = |reuse: &str| -> (String, Section) {
            let (unit, model) = (unit.to_str().unwrap(), model.to_str().unwrap());
            #[rustfmt::skip]
            let args = [
                "5", "LoadState", super::super::scripts::CACHED_OR_PYTHON, super::super::scripts::SURVEY_PYTHON,
                super::super::scripts::ACCESS, super::super::scripts::LISTENERS,
                crate::unit_files::UNIT_FILES_SCRIPT, &lookup, keep.to_str().unwrap(), reuse,
                "1", python, "py0",
                "1", "a.service", unit, "0000", model, "30000", "", "", "", "", "", "0",
            ];
            let out = script(&bin).args(args).current_dir("/").output().unwrap();
            let s = Sections::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
            let python = s.get("python.0").unwrap().clone();
            let weights = python
                .stdout
                .lines()
                .find_map(|l| l.strip_prefix("#weights 0 "));
            (weights.unwrap_or_default().to_string(), python)
        };
        let weights = |json: &str| match WeightsCheck::of(0, json, "") {
            WeightsCheck::Read(w) => w,
            failed => panic!("{failed:?}"),
        };
        // Cached once nothing it read changed in the last 2 s (see keep_fn): the files are new.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let (fresh, python) = loop {
            let (fresh, python) = survey("1");
            if python.stderr.contains("#reconcile-survey-kept-as ") {
                break (fresh, python);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never kept: {python:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(survey::python(&python), Ok(Python::Sglang("0.5.9".into())));
        let fresh = weights(&fresh);
        assert!(fresh.mem_available.is_some(), "{fresh:?}");
        let kept = std::fs::read_dir(&keep).unwrap().next().unwrap().unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(kept.metadata().unwrap().permissions().mode() & 0o077, 0);

        // Read again: the cached answer, all but the memory available, a fact of the moment.
        let (again, python) = survey("1");
        assert!(
            python.stderr.starts_with("#reconcile-survey-kept /"),
            "{python:?}"
        );
        assert_eq!(survey::python(&python), Ok(Python::Sglang("0.5.9".into())));
        let again = weights(&again);
        assert_eq!((&again.files, again.bytes), (&fresh.files, fresh.bytes));
        assert_eq!(again.mem_available, None);
        // Asked afresh (apply), the Python runs.
        let (_, python) = survey("0");
        assert!(
            !python.stderr.contains("#reconcile-survey-kept /"),
            "{python:?}"
        );

        // Another SGLang installed, then a shard cut short: each read afresh.
        std::fs::remove_dir_all(old).unwrap();
        dist_info("0.6.0");
        let (_, python) = survey("1");
        assert_eq!(survey::python(&python), Ok(Python::Sglang("0.6.0".into())));
        let shard = model.join("model.safetensors");
        std::fs::write(&shard, &safetensors()[..20]).unwrap();
        let (cut, python) = survey("1");
        assert!(
            !python.stderr.contains("#reconcile-survey-kept /"),
            "{python:?}"
        );
        assert_eq!(weights(&cut).problems.len(), 1, "{cut}");
    }

    /// What a fake host answers for the survey: the units and records `files` has, systemd not
    /// knowing any unit, the
    /// Python with SGLang `version`, and, for units that change, the model readable, four GPUs
    /// and the port free. Reads the survey's own arguments, as the script does.
    pub(crate) fn fake_answer(argv: &[&str], version: &str, files: &[(&str, &str)]) -> String {
        let args = &argv[4..];
        let ok = |stdout: &str| Section {
            status: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        };
        let missing = || Section {
            status: 100,
            ..Section::default()
        };
        let pythons: usize = args[10].parse().unwrap();
        let mut sections = Sections::default();
        let mut python_out = vec![String::new(); pythons];
        let units: usize = args[11 + 2 * pythons].parse().unwrap();
        let mut changed = false;
        for i in 0..units {
            let u = &args[12 + 2 * pythons + i * PER_UNIT..][..PER_UNIT];
            let file = files.iter().find(|(p, _)| *p == u[1]).map(|(_, t)| *t);
            sections.insert(&format!("unit.{i}"), file.map_or_else(missing, ok));
            sections.insert(
                &format!("show.{i}"),
                ok("LoadState=not-found\nActiveState=inactive\n"),
            );
            sections.insert(&format!("layers.{i}"), ok(""));
            if !u[5].is_empty() {
                let record = files.iter().find(|(p, _)| *p == u[5]).map(|(_, t)| *t);
                sections.insert(&format!("record.{i}"), record.map_or_else(missing, ok));
            }
            if !u[3].is_empty() && file.map(sha256).as_deref() != Some(u[2]) {
                changed = true;
                sections.insert(&format!("access.{i}"), ok(""));
                sections.insert(&format!("ports.{i}"), ok("#cgroups\n"));
                let j: usize = u[10].parse().unwrap();
                python_out[j] +=
                    &format!("#weights {i} {{\"files\": [\"model.safetensors\"], \"bytes\": 8}}\n");
            }
        }
        for (j, out) in python_out.iter().enumerate() {
            sections.insert(&format!("python.{j}"), ok(&format!("{out}{version}\n")));
        }
        if changed {
            sections.insert("gpus", ok("GPU 0: H100 (UUID: GPU-a)\nGPU 1: H100 (UUID: GPU-b)\nGPU 2: H100 (UUID: GPU-c)\nGPU 3: H100 (UUID: GPU-d)\n"));
        }
        sections.render()
    }
}

#[cfg(test)]
mod trust_tests {
    use std::os::unix::fs::{chown, PermissionsExt};
    use std::process::Command;

    use reconcile_core::preflight::owners::{self, Scope};
    use reconcile_core::preflight::Python;
    use reconcile_core::survey::{self, Section};

    use super::super::scripts::{INTERPRETER, PYTHON, VERSION_SCRIPT};

    /// The version read, as root runs it on a host: `gate`, then the Python and its arguments.
    fn run(gate: &str, python: &std::path::Path) -> Section {
        let out = Command::new("sh")
            .args(["-c", PYTHON, "sh", gate, python.to_str().unwrap()])
            .args(["-I", "-S", "-c", VERSION_SCRIPT])
            .current_dir("/")
            .output()
            .expect("sh runs");
        Section {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Only root can hand a file to another user; CI runs the suite as root.
    fn root() -> bool {
        let out = Command::new("id").arg("-u").output().unwrap();
        let root = String::from_utf8_lossy(&out.stdout).trim() == "0";
        if !root {
            eprintln!("skipped: needs root, to give files to another user");
        }
        root
    }

    const NOBODY: u32 = 65534;

    #[test]
    fn root_starts_no_interpreter_another_user_can_change() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs/bin");
        std::fs::create_dir_all(&theirs).unwrap();
        let python = theirs.join("python3");
        std::fs::copy("/usr/bin/python3", &python).unwrap();
        chown(&python, Some(NOBODY), None).unwrap();
        let s = run(INTERPRETER, &python);
        assert_eq!(s.status, owners::UNTRUSTED_STATUS, "{s:?}");
        let Ok(Python::Untrusted(found)) = survey::python(&s) else {
            panic!("{s:?}")
        };
        assert_eq!(found[0].scope, Scope::Interpreter);
        assert_eq!(
            (found[0].uid, found[0].path.as_str()),
            (NOBODY, python.to_str().unwrap())
        );
        // A folder above it that every user can write is as good as the file.
        chown(&python, Some(0), None).unwrap();
        std::fs::set_permissions(dir.path().join("theirs"), PermissionsExt::from_mode(0o777))
            .unwrap();
        let s = run(INTERPRETER, &python);
        assert_eq!(s.status, owners::UNTRUSTED_STATUS, "{s:?}");
        assert!(s.stderr.contains(" 777 "), "{s:?}");
    }

    #[test]
    fn a_venv_another_user_can_write_is_named_and_only_the_check_importing_it_is_kept_from_root() {
        if !root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (python, site) = super::tests::venv(dir.path());
        // A package of the service user's, and a `.pth` that adds a folder of theirs.
        let planted = site.join("sglang");
        std::fs::create_dir(&planted).unwrap();
        std::fs::write(planted.join("__init__.py"), "open('/tmp/pwned', 'w')\n").unwrap();
        chown(&planted, Some(NOBODY), None).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        chown(&home, Some(NOBODY), None).unwrap();
        std::fs::write(
            site.join("theirs.pth"),
            format!("{}\nimport os\n", home.display()),
        )
        .unwrap();

        // reconcile's own version read runs only root's interpreter and stdlib: it starts, and
        // says what it found.
        let s = run(INTERPRETER, &python);
        assert_eq!(s.status, 1, "no SGLang dist-info: {s:?}");
        let found = owners::writable(&s.stderr);
        let paths: Vec<&str> = found.iter().map(|w| w.path.as_str()).collect();
        assert!(paths.contains(&planted.to_str().unwrap()), "{found:?}");
        assert!(paths.contains(&home.to_str().unwrap()), "{found:?}");
        assert!(found.iter().all(|w| w.scope == Scope::Site), "{found:?}");
        // The check that imports SGLang, run as root, does not start.
        let s = run("interpreter site", &python);
        assert_eq!(s.status, owners::UNTRUSTED_STATUS, "{s:?}");
    }
}
