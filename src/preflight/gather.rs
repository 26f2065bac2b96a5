//! The edge of preflight: the facts, read over the host's one connection. Manifest values (the
//! Python path, the model path, the port) are positional arguments of fixed scripts, never part
//! of a shell string.

use super::scripts::{ACCESS, LISTENERS, PYTHON, VERSION_SCRIPT};
use super::survey::Survey;
use super::{judge, Access, Deep, Facts, Finding, Gpus, Port, Python};
use crate::observed::UnitState;
use crate::remote::{Host, RemoteError};
use crate::targets::Target;
use reconcile_core::survey as answer;

/// The deep check: the host's SGLang parses the unit's exact arguments as `launch_server` would,
/// without starting a server. What that checks depends on the version (read from each wheel's
/// `launch_server.py` and `srt/server_args.py`):
/// - 0.5.2x: `load_plugins()`, then `prepare_server_args` (argparse only: `ServerArgs.__post_init__`
///   checks nothing there), then `ServerArgs.resolve_once()`, which `run_server` calls and where the
///   checks live. It asks for an accelerator and queries the GPUs; the GPUs belong to the running
///   server, so they are hidden from it, and what needs one is reported as not checked (exit 3);
/// - 0.5.9 and older: `prepare_server_args`, whose `__post_init__` runs the checks.
///
/// Exit 0: accepted; 2: argparse refused; 1: resolution refused; 3: resolution needs a GPU.
/// On a real host this imports torch: about 10 s.
const DEEP_SCRIPT: &str = r#"import os, sys
try:
    from sglang.srt.plugins import load_plugins
except ImportError:
    load_plugins = None
if load_plugins is not None:
    load_plugins()
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
resolve = getattr(args, "resolve_once", None)
if resolve is None:
    sys.exit(0)
os.environ["CUDA_VISIBLE_DEVICES"] = ""
try:
    resolve()
except Exception as e:
    text = ("%s: %s" % (type(e).__name__, e)).strip().splitlines()[0]
    gpu = any(w in text.lower() for w in ("accelerator", "cuda", "nvidia-smi", "gpu", "nvml"))
    print(text, file=sys.stderr)
    sys.exit(3 if gpu else 1)
"#;

/// Importing torch takes about 10 s on a warm host, and minutes from a cold network filesystem.
const DEEP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Preflight for a plan: the unit is observed and its SGLang version read at the same time, over
/// the same connection. A unit that `changes` (judged on what was observed) then gets the other
/// checks; the port check needs the unit's `MainPID`. A unit with nothing to change gets only the
/// version check: preflight vets a change before apply makes it, and apply leaves such a unit
/// alone whatever the checks say, while the version still tells whether the manifest's SGLang is
/// what the host has. Also returns that version (`None`: none found), which a plan file records.
pub async fn check_with<T>(
    host: &dyn Host,
    t: &Target,
    deep: bool,
    observe: impl std::future::Future<Output = Result<T, RemoteError>>,
    state_of: impl Fn(&T) -> &UnitState,
    changes: impl Fn(&T) -> bool,
) -> Result<(T, Vec<Finding>, Option<String>), RemoteError> {
    let want = super::Want::of(t);
    let (observed, python) = tokio::try_join!(observe, sglang_version(host, &want.python))?;
    let version = installed(&python);
    if !changes(&observed) {
        return Ok((observed, super::judge_unchanged(t, &python), version));
    }
    let mut facts = host_facts(host, t, deep, python).await?;
    facts.main_pid = state_of(&observed).main_pid;
    Ok((observed, judge(t, &facts), version))
}

/// Preflight from a survey: as [`check_with`], with the unit already observed (`state`) and
/// judged (`changes`), and the facts read from `survey`. Only what it lacks is asked of the host:
/// the deep check, and the change-only checks of a unit the survey found unchanged.
pub async fn check_surveyed(
    host: &dyn Host,
    t: &Target,
    survey: &Survey,
    state: &UnitState,
    changes: bool,
    deep: bool,
) -> Result<(Vec<Finding>, Option<String>), RemoteError> {
    let python = survey.python(t)?;
    let version = installed(&python);
    if !changes {
        return Ok((super::judge_unchanged(t, &python), version));
    }
    let checked = match survey.checks(t) {
        Some(checked) => checked?,
        None => checks(host, t).await?,
    };
    let mut facts = with_deep(host, t, deep, python, checked).await?;
    facts.main_pid = state.main_pid;
    Ok((judge(t, &facts), version))
}

/// The SGLang version installed for the unit's Python, read as preflight reads it; `None` when
/// there is none (or no such Python). Apply compares it with a plan file's, under the lock.
pub async fn installed_sglang(host: &dyn Host, t: &Target) -> Result<Option<String>, RemoteError> {
    let want = super::Want::of(t);
    Ok(installed(&sglang_version(host, &want.python).await?))
}

fn installed(python: &Python) -> Option<String> {
    match python {
        Python::Sglang(version) => Some(version.clone()),
        _ => None,
    }
}

/// Gathers the facts and judges them.
pub async fn check(
    host: &dyn Host,
    t: &Target,
    state: &UnitState,
    deep: bool,
) -> Result<Vec<Finding>, RemoteError> {
    let mut facts = gather(host, t, deep).await?;
    facts.main_pid = state.main_pid;
    Ok(judge(t, &facts))
}

/// Every fact at once (the host's connection bounds how many commands run together), then the
/// deep check when asked and when there is an SGLang to ask.
async fn gather(host: &dyn Host, t: &Target, deep: bool) -> Result<Facts, RemoteError> {
    let want = super::Want::of(t);
    let (python, checked) = tokio::try_join!(sglang_version(host, &want.python), checks(host, t))?;
    with_deep(host, t, deep, python, checked).await
}

/// The facts besides the SGLang version, which the caller read already.
async fn host_facts(
    host: &dyn Host,
    t: &Target,
    deep: bool,
    python: Python,
) -> Result<Facts, RemoteError> {
    let checked = checks(host, t).await?;
    with_deep(host, t, deep, python, checked).await
}

async fn checks(host: &dyn Host, t: &Target) -> Result<(Access, Gpus, Port), RemoteError> {
    let want = super::Want::of(t);
    tokio::try_join!(
        access(host, &want.model_path),
        gpus(host),
        listeners(host, want.port)
    )
}

/// The facts, with the deep check's when it is asked for and the host's python has SGLang.
/// The last argument is what [`checks`] read.
async fn with_deep(
    host: &dyn Host,
    t: &Target,
    deep: bool,
    python: Python,
    (model_path, gpus, port): (Access, Gpus, Port),
) -> Result<Facts, RemoteError> {
    let want = super::Want::of(t);
    let deep = match (&python, deep) {
        (Python::Sglang(_), true) => {
            Some(deep_check(host, &want.python, &t.desired.model.exec_start).await?)
        }
        _ => None,
    };
    Ok(Facts {
        python,
        model_path,
        gpus,
        port,
        main_pid: 0,
        deep,
    })
}

async fn sglang_version(host: &dyn Host, python: &str) -> Result<Python, RemoteError> {
    let argv = ["sh", "-c", PYTHON, "sh", python, "-c", VERSION_SCRIPT];
    read_one(host, &argv, answer::python).await
}

async fn access(host: &dyn Host, path: &str) -> Result<Access, RemoteError> {
    let argv = ["sh", "-c", ACCESS, "sh", path];
    read_one(host, &argv, |s| answer::access(s, path)).await
}

async fn gpus(host: &dyn Host) -> Result<Gpus, RemoteError> {
    read_one(host, &["nvidia-smi", "-L"], answer::gpus).await
}

async fn listeners(host: &dyn Host, port: u16) -> Result<Port, RemoteError> {
    let arg = port.to_string();
    let argv = ["sh", "-c", LISTENERS, "sh", &arg];
    read_one(host, &argv, |s| answer::listeners(s, port)).await
}

/// One fact read by a command of its own (where the survey cannot run), through the survey's
/// own reader of that fact, so both paths read a host's answer the same way.
async fn read_one<T>(
    host: &dyn Host,
    argv: &[&str],
    read: impl FnOnce(&answer::Section) -> Result<T, answer::Fault>,
) -> Result<T, RemoteError> {
    let out = host.run(argv).await?;
    let section = answer::Section {
        status: out.status,
        stdout: out.stdout,
        stderr: out.stderr,
    };
    read(&section).map_err(|fault| {
        let (command, status, stderr) = match fault {
            answer::Fault::Failed {
                command,
                status,
                stderr,
            } => (command, status, stderr),
            // Not under `timeout` here: a status of 124 is the command's own.
            answer::Fault::TimedOut { command } => (command, section.status, section.stderr),
            answer::Fault::Absent { key } => (key, section.status, section.stderr),
        };
        RemoteError::Failed {
            host: host.name().to_string(),
            command,
            status,
            stderr,
        }
    })
}

async fn deep_check(
    host: &dyn Host,
    python: &str,
    exec_start: &[String],
) -> Result<Deep, RemoteError> {
    // ExecStart is `<python> -m sglang.launch_server <args>`; the script gets the args.
    let args = exec_start.get(3..).unwrap_or_default();
    let mut argv = vec!["sh", "-c", PYTHON, "sh", python, "-c", DEEP_SCRIPT];
    argv.extend(args.iter().map(String::as_str));
    let out = host.run_within(&argv, None, DEEP_TIMEOUT).await?;
    let last = answer::last_line(&out.stderr);
    Ok(match out.status {
        0 => Deep::Accepted,
        _ if out.stderr.contains("No module named 'sglang.srt") => Deep::Unavailable(format!(
            "this SGLang has no sglang.srt.server_args to parse arguments with ({last})"
        )),
        3 => Deep::ParsedOnly(last),
        _ => Deep::Refused(last),
    })
}

#[cfg(test)]
mod tests {
    use super::super::scripts::VERSION_SCRIPT;
    use std::process::Command;

    fn version_with(dists: &[(&str, &str, &str)]) -> (bool, String, String) {
        let dir = tempfile::tempdir().unwrap();
        for (folder, file, text) in dists {
            std::fs::create_dir_all(dir.path().join(folder)).unwrap();
            std::fs::write(dir.path().join(folder).join(file), text).unwrap();
        }
        let out = Command::new("python3")
            .args(["-c", VERSION_SCRIPT])
            .env("PYTHONPATH", dir.path())
            .current_dir(dir.path())
            .output()
            .expect("python3 runs (the tests need it, as the hosts do)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    #[test]
    fn the_folder_scan_reads_the_version_importlib_would() {
        let meta = "Metadata-Version: 2.1\nName: sglang\nVersion: 0.4.10.post2\n\nVersion: 9.9\n";
        let (ok, out, err) = version_with(&[("sglang-0.4.10.post2.dist-info", "METADATA", meta)]);
        assert!(ok, "{err}");
        assert_eq!(out, "0.4.10.post2");
        let egg = "Metadata-Version: 1.0\nName: sglang\nVersion: 0.5.9\n";
        let (ok, out, _) = version_with(&[("sglang-0.5.9-py3.11.egg-info", "PKG-INFO", egg)]);
        assert!(ok);
        assert_eq!(out, "0.5.9");
    }

    #[test]
    fn another_package_with_the_same_prefix_is_not_sglang() {
        let router = "Metadata-Version: 2.1\nName: sglang-router\nVersion: 0.2.1\n";
        let (ok, _, err) = version_with(&[("sglang_router-0.2.1.dist-info", "METADATA", router)]);
        assert!(!ok, "no sglang installed, yet a version was found");
        assert!(err.contains("PackageNotFoundError"), "{err}");
    }
}
