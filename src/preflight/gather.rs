//! The edge of preflight: the facts, read over the host's one connection. Manifest values (the
//! Python path, the model path, the port) are positional arguments of fixed scripts, never part
//! of a shell string.

use super::cache::{self, deep_input, Cached};
use super::scripts::{ACCESS, DEEP_RUNNER, DEEP_SCRIPT, LISTENERS, VERSION_SCRIPT, WEIGHTS_SCRIPT};
use super::survey::Survey;
use super::{
    judge, read_deep, Access, Deep, DeepWhen, Facts, Finding, Gpus, Port, Python, WeightsCheck,
};
use crate::observed::UnitState;
use crate::plan::Verdict;
use crate::remote::{Host, RemoteError};
use crate::targets::Target;
use reconcile_core::preflight::owners;
use reconcile_core::survey as answer;

/// Preflight for a plan: the unit is observed and its SGLang version read at the same time, over
/// the same connection. A unit that changes (its `verdict`, judged on what was observed) then gets
/// the other checks, and the deep check when `deep` runs for that verdict; the port check needs
/// the unit's `MainPID`. A unit with nothing to change gets only the version check: preflight vets
/// a change before apply makes it, and apply leaves such a unit alone whatever the checks say,
/// while the version still tells whether the manifest's SGLang is what the host has. Also returns
/// that version (`None`: none found), which a plan file records.
pub async fn check_with<T>(
    host: &dyn Host,
    t: &Target,
    deep: DeepWhen,
    observe: impl std::future::Future<Output = Result<T, RemoteError>>,
    state_of: impl Fn(&T) -> &UnitState,
    verdict: impl Fn(&T) -> Verdict,
) -> Result<(T, Vec<Finding>, Option<String>), RemoteError> {
    let want = super::Want::of(t);
    let (observed, (python, writable)) =
        tokio::try_join!(observe, python_and_owners(host, &want.python))?;
    let version = installed(&python);
    let verdict = verdict(&observed);
    let owners = owners::judge_owners(&t.desired.model, &want.python, &writable);
    if verdict == Verdict::NoChange {
        let findings = super::judge_unchanged(t, &python);
        return Ok((observed, [findings, owners].concat(), version));
    }
    let mut facts = host_facts(host, t, deep_for(deep, verdict), python).await?;
    facts.main_pid = state_of(&observed).main_pid;
    facts.weights = weights_for(host, t, verdict, None).await?;
    Ok((observed, [judge(t, &facts), owners].concat(), version))
}

/// What preflight found for one unit: its findings, the SGLang version installed for its Python
/// (`None`: none found), and the check of its weights where the change starts the server, which
/// preloading reads.
pub struct Checked {
    pub findings: Vec<Finding>,
    pub sglang: Option<String>,
    pub weights: Option<WeightsCheck>,
}

impl Checked {
    fn of(t: &Target, facts: Facts) -> Checked {
        Checked {
            findings: judge(t, &facts),
            sglang: installed(&facts.python),
            weights: facts.weights,
        }
    }
}

/// Preflight from a survey: as [`check_with`], with the unit already observed (`state`) and
/// judged (`verdict`), and the facts read from `survey`. Only what it lacks is asked of the host:
/// the deep check, and the change-only checks of a unit the survey found unchanged.
pub async fn check_surveyed(
    host: &dyn Host,
    t: &Target,
    survey: &Survey,
    state: &UnitState,
    verdict: Verdict,
    deep: DeepWhen,
) -> Result<Checked, RemoteError> {
    let python = survey.python(t)?;
    let owners = owners::judge_owners(
        &t.desired.model,
        &super::Want::of(t).python,
        &survey.writable(t),
    );
    if verdict == Verdict::NoChange {
        return Ok(Checked {
            findings: [super::judge_unchanged(t, &python), owners].concat(),
            sglang: installed(&python),
            weights: None,
        });
    }
    let checked = match survey.checks(t) {
        Some(checked) => checked?,
        None => checks(host, t).await?,
    };
    let cached = survey.cached_deep(t, &python);
    let deep = deep_for(deep, verdict);
    let mut facts = with_deep(host, t, deep, python, checked, cached).await?;
    facts.main_pid = state.main_pid;
    facts.weights = weights_for(host, t, verdict, survey.weights(t)).await?;
    let mut checked = Checked::of(t, facts);
    checked.findings.extend(owners);
    Ok(checked)
}

/// The check of the model's weights for a unit planned as `verdict`: only where the change starts
/// the server (new, or restarted) or loads them live, while the old one still runs. `found` is the survey's.
async fn weights_for(
    host: &dyn Host,
    t: &Target,
    verdict: Verdict,
    found: Option<WeightsCheck>,
) -> Result<Option<WeightsCheck>, RemoteError> {
    if !matches!(verdict, Verdict::Restart | Verdict::Install | Verdict::Live) {
        return Ok(None);
    }
    if let Some(found) = found {
        return Ok(Some(found));
    }
    let want = super::Want::of(t);
    let mut argv = super::scripts::isolated_python(&want.python, WEIGHTS_SCRIPT).to_vec();
    argv.push(&want.model_path);
    let out = host.run(&argv).await?;
    Ok(Some(WeightsCheck::of(out.status, &out.stdout, &out.stderr)))
}

/// The deep check's mode for a unit planned as `verdict`: `None` where it does not run.
fn deep_for(deep: DeepWhen, verdict: Verdict) -> Option<DeepWhen> {
    deep.runs(verdict).then_some(deep)
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

/// Gathers the facts of a unit apply is to change as `verdict`, and judges them.
pub async fn check(
    host: &dyn Host,
    t: &Target,
    state: &UnitState,
    verdict: Verdict,
    deep: DeepWhen,
) -> Result<Checked, RemoteError> {
    let mut facts = gather(host, t, deep_for(deep, verdict)).await?;
    facts.main_pid = state.main_pid;
    facts.weights = weights_for(host, t, verdict, None).await?;
    Ok(Checked::of(t, facts))
}

/// Every fact at once (the host's connection bounds how many commands run together), then the
/// deep check when asked and when there is an SGLang to ask.
async fn gather(host: &dyn Host, t: &Target, deep: Option<DeepWhen>) -> Result<Facts, RemoteError> {
    let want = super::Want::of(t);
    let (python, checked) = tokio::try_join!(sglang_version(host, &want.python), checks(host, t))?;
    with_deep(host, t, deep, python, checked, None).await
}

/// The facts besides the SGLang version, which the caller read already.
async fn host_facts(
    host: &dyn Host,
    t: &Target,
    deep: Option<DeepWhen>,
    python: Python,
) -> Result<Facts, RemoteError> {
    let checked = checks(host, t).await?;
    with_deep(host, t, deep, python, checked, None).await
}

async fn checks(host: &dyn Host, t: &Target) -> Result<(Access, Gpus, Port), RemoteError> {
    let want = super::Want::of(t);
    tokio::try_join!(
        access(host, &want.model_path),
        gpus(host),
        listeners(host, want.port)
    )
}

/// The facts, with the deep check's when it runs (`deep`) and the host's python has SGLang.
/// The tuple is what [`checks`] read; `cached`, a verdict the survey found cached for this SGLang.
async fn with_deep(
    host: &dyn Host,
    t: &Target,
    deep: Option<DeepWhen>,
    python: Python,
    (model_path, gpus, port): (Access, Gpus, Port),
    cached: Option<&str>,
) -> Result<Facts, RemoteError> {
    let deep = match (&python, deep) {
        (Python::Sglang(version), Some(when)) => {
            Some(deep_check(host, t, when, version, cached).await?)
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
        weights: None,
    })
}

/// The SGLang version, with what the trust check found writable by others on the way.
async fn python_and_owners(
    host: &dyn Host,
    python: &str,
) -> Result<(Python, Vec<owners::Writable>), RemoteError> {
    let mut writable = Vec::new();
    let argv = super::scripts::isolated_python(python, VERSION_SCRIPT);
    let python = read_one(host, &argv, |s| {
        writable = owners::writable(&s.stderr);
        answer::python(s)
    })
    .await?;
    Ok((python, writable))
}

/// The SGLang version alone: the same command, its trust check's findings left aside.
async fn sglang_version(host: &dyn Host, python: &str) -> Result<Python, RemoteError> {
    Ok(python_and_owners(host, python).await?.0)
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

/// Rank 0 of a server group: whether its rendezvous port is free
/// (`reconcile_core::preflight::rendezvous_port`), `main_pid` being the unit's running process.
pub async fn rendezvous_free(
    host: &dyn Host,
    unit: &str,
    number: u16,
    main_pid: u32,
) -> Result<Vec<Finding>, RemoteError> {
    let listening = listeners(host, number).await?;
    Ok(reconcile_core::preflight::rendezvous_port(
        unit, number, &listening, main_pid,
    ))
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

/// The deep check of one unit, within `when`'s limit. Run by default, a check past its limit is a
/// warning (it could not say); asked for with `--deep`, it fails the unit's preflight, as before.
/// SGLang's verdict is cached on the host ([`cache`]): a verdict the survey found cached (`found`, its
/// output) is read instead, and the check's own command looks one up again before it runs.
async fn deep_check(
    host: &dyn Host,
    t: &Target,
    when: DeepWhen,
    version: &str,
    found: Option<&str>,
) -> Result<Deep, RemoteError> {
    if let Some(stdout) = found {
        return Ok(when.shown(read_cached(host, t, stdout)));
    }
    let python = super::Want::of(t).python;
    let input = deep_input(t);
    let cached = Cached::of(t);
    let limit = when.limit();
    let argv = deep_argv(&cached, version, &python, &t.desired.model, limit);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = match host.run_within(&argv, Some(input.as_bytes()), limit).await {
        Ok(out) => out,
        Err(RemoteError::TimedOut { .. }) if when == DeepWhen::Restarts => {
            return Ok(Deep::TimedOut(limit))
        }
        Err(e) => return Err(named(e)),
    };
    if let cache::Lookup::Cached { .. } = cache::read(&out.stdout) {
        return Ok(when.shown(read_cached(host, t, &out.stdout)));
    }
    let (deep, unchecked) = read_deep(out.status, &out.stdout, &out.stderr);
    // Only what SGLang answered is cached: not a check that died before its answer.
    if let cache::Lookup::Keyed(key) = cache::read(&out.stdout) {
        if answered(&out.stdout) {
            let redactor = crate::redact::Redactor::of_manifests([&*t.manifest]);
            let redact = |text: &str| redactor.redact_desired(&t.desired, text);
            if let Some(answer) =
                reconcile_core::preflight::cached_answer(&deep, &unchecked, redact)
            {
                if cached.store(host, key, version, &answer).await {
                    tracing::info!(host = host.name(), unit = %t.desired.unit, "the deep check's verdict is kept on the host as {}/{key}", cache::cache_dir());
                }
            }
        }
    }
    Ok(when.shown(logged(host, t, deep, &unchecked)))
}

/// A cached verdict, from a lookup's output (`stdout`), read as the check's own would be.
fn read_cached(host: &dyn Host, t: &Target, stdout: &str) -> Deep {
    if let cache::Lookup::Cached { key, .. } = cache::read(stdout) {
        tracing::info!(host = host.name(), unit = %t.desired.unit, "the deep check's verdict for these inputs was kept on the host ({}/{key}): not run again", cache::cache_dir());
    }
    let (deep, unchecked) = read_deep(0, stdout, "");
    logged(host, t, deep, &unchecked)
}

/// The deep check's verdict, with what it could not check logged (`-v`).
fn logged(host: &dyn Host, t: &Target, deep: Deep, unchecked: &[String]) -> Deep {
    for what in unchecked {
        tracing::info!(host = host.name(), unit = %t.desired.unit, "the deep check did not check the {what}");
    }
    if let Deep::ParsedOnly(why) | Deep::Unavailable(why) = &deep {
        tracing::info!(host = host.name(), unit = %t.desired.unit, "the deep check was partial: {why}");
    }
    deep
}

fn answered(stdout: &str) -> bool {
    stdout.lines().any(|l| l.starts_with(super::ANSWER_PREFIX))
}

/// The deep check in errors and traces (`--trace-remote` shows `command="deep check"`).
const DEEP_NAME: &str = "deep check";

/// The deep check's command: the lookup of a verdict cached for SGLang `version`
/// ([`cache::lookup_script`]), then the unit's Python running [`DEEP_SCRIPT`] isolated (`-I`), as
/// the unit's user in its sandbox ([`DEEP_RUNNER`]), within `limit`. Its arguments, environment
/// and working directory travel on stdin ([`deep_input`]): never a secret on a command line. The
/// wrapper's first line names it for traces.
fn deep_argv(
    cached: &Cached,
    version: &str,
    python: &str,
    unit: &reconcile_core::unit::UnitModel,
    limit: std::time::Duration,
) -> Vec<String> {
    let properties = owners::sandbox_properties(unit, limit.as_secs() + 5).join("\n");
    let wrapper = deep_wrapper(&cache::cache_dir());
    ["sh", "-c", &wrapper, "sh"]
        .into_iter()
        .chain(cached.lookup_args(version))
        .chain([
            owners::deep_gate(unit),
            &properties,
            python,
            "-I",
            "-c",
            DEEP_SCRIPT,
        ])
        .map(str::to_string)
        .collect()
}

/// The deep check's shell: a cached verdict looked up in `cache_dir`, else the check run.
fn deep_wrapper(cache_dir: &str) -> String {
    format!(
        "# {DEEP_NAME}: the unit's SGLang checks its arguments and model config\n{}{DEEP_RUNNER}",
        cache::lookup_script(cache_dir)
    )
}

/// An error of the deep check, naming it rather than showing its argv (the whole script).
fn named(e: RemoteError) -> RemoteError {
    let command =
        format!("the {DEEP_NAME} (SGLang checking the unit's arguments and model config)");
    match e {
        RemoteError::TimedOut { host, after, .. } => RemoteError::TimedOut {
            host,
            command,
            after,
        },
        RemoteError::Transport { host, source, .. } => RemoteError::Transport {
            host,
            command,
            source,
        },
        RemoteError::Failed {
            host,
            status,
            stderr,
            ..
        } => RemoteError::Failed {
            host,
            command,
            status,
            stderr,
        },
        e => e,
    }
}

/// For fakes: the start of the deep check's command (its inputs and arguments follow), and the
/// answer of a check SGLang accepted.
#[cfg(test)]
pub(crate) fn deep_command() -> (Vec<String>, String) {
    let argv = vec!["sh".into(), "-c".into(), deep_wrapper(&cache::cache_dir())];
    let accepted = format!(
        "{}{{\"verdict\": \"accepted\", \"unchecked\": []}}\n",
        super::ANSWER_PREFIX
    );
    (argv, accepted)
}

#[cfg(test)]
mod tests {
    use super::super::scripts::VERSION_SCRIPT;
    use std::process::Command;

    /// A safetensors file of one F32 tensor of `floats` values: 8 bytes of header length, the
    /// JSON header, the data.
    fn safetensors(floats: usize) -> Vec<u8> {
        let header = format!(
            "{{\"w\":{{\"dtype\":\"F32\",\"shape\":[{floats}],\"data_offsets\":[0,{}]}}}}",
            floats * 4
        );
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend(vec![0u8; floats * 4]);
        bytes
    }

    fn weights_of(model: &std::path::Path) -> super::WeightsCheck {
        let out = Command::new("python3")
            .args(["-c", super::WEIGHTS_SCRIPT, model.to_str().unwrap()])
            .output()
            .expect("python3 runs");
        super::WeightsCheck::of(
            out.status.code().unwrap_or(-1),
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        )
    }

    #[test]
    fn the_weights_check_finds_a_shard_missing_or_cut_short_from_its_header() {
        use reconcile_core::preflight::{WeightProblem, Weights};
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path();
        let index = r#"{"metadata": {}, "weight_map": {"a.w": "s1.safetensors", "b.w": "s2.safetensors", "c.w": "s2.safetensors", "d.w": "s3.safetensors", "e.w": "s4.safetensors"}}"#;
        std::fs::write(model.join("model.safetensors.index.json"), index).unwrap();
        let whole = safetensors(256);
        std::fs::write(model.join("s1.safetensors"), &whole).unwrap();
        std::fs::write(model.join("s2.safetensors"), &whole[..whole.len() - 4]).unwrap();
        std::fs::write(model.join("s4.safetensors"), [&whole[..], b"tail"].concat()).unwrap();
        let super::WeightsCheck::Read(found) = weights_of(model) else {
            panic!("no answer")
        };
        let n = whole.len();
        let problem = |file: &str, problem: String| WeightProblem {
            file: file.into(),
            problem,
        };
        assert_eq!(
            found,
            Weights {
                files: ["s1", "s2", "s3", "s4"]
                    .map(|s| format!("{s}.safetensors"))
                    .to_vec(),
                bytes: (n + n - 4 + n + 4) as u64,
                problems: vec![
                    problem(
                        "s2.safetensors",
                        format!(
                            "is truncated: {} of the {n} bytes its safetensors header implies",
                            n - 4
                        )
                    ),
                    problem("s3.safetensors", "is missing".into()),
                    problem(
                        "s4.safetensors",
                        format!(
                            "has {} bytes, more than the {n} its safetensors header implies",
                            n + 4
                        )
                    ),
                ],
                unchecked: None,
                mem_available: found.mem_available,
            }
        );
        assert!(found.mem_available.is_some_and(|m| m > 0), "{found:?}");
        // A single file, whole: nothing wrong; no safetensors at all: not checked.
        let single = tempfile::tempdir().unwrap();
        std::fs::write(single.path().join("model.safetensors"), &whole).unwrap();
        let super::WeightsCheck::Read(found) = weights_of(single.path()) else {
            panic!("no answer")
        };
        assert!(
            found.problems.is_empty() && found.bytes == n as u64,
            "{found:?}"
        );
        let empty = tempfile::tempdir().unwrap();
        let super::WeightsCheck::Read(found) = weights_of(empty.path()) else {
            panic!("no answer")
        };
        assert_eq!(
            found.unchecked.as_deref(),
            Some("the model folder has no model.safetensors.index.json or model.safetensors")
        );
    }

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

    /// A small SGLang written from 0.5.23's source, each check under the name it has there (so
    /// the script's reading of tracebacks is tested): `resolve_once` asks for an accelerator
    /// (`get_device`), `ModelConfig` reads config.json (`get_config`) and checks the context length
    /// (`_derive_context_length`, with its message and environment variable), `TemplateManager`
    /// checks a chat template. No torch: it runs in a moment.
    const SMALL_SGLANG: &[(&str, &str)] = &[
        ("sglang/__init__.py", ""),
        ("sglang/srt/__init__.py", ""),
        (
            "sglang/srt/server_args.py",
            r#"import argparse, os
def get_device():
    raise RuntimeError("No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.")
class ServerArgs(argparse.Namespace):
    def resolve_once(self):
        get_device()
def prepare_server_args(argv):
    need = os.environ.get("NEED_AT_START")
    if need and ("NEED_AT_START=" + need).encode() not in open("/proc/self/environ", "rb").read().split(b"\0"):
        raise ImportError("libneeded.so: cannot open shared object file")
    p = argparse.ArgumentParser(prog="sglang serve")
    for flag in ("--model-path", "--chat-template"):
        p.add_argument(flag)
    for flag in ("--context-length", "--port"):
        p.add_argument(flag, type=int)
    return ServerArgs(**vars(p.parse_args(argv)))
"#,
        ),
        ("sglang/srt/configs/__init__.py", ""),
        (
            "sglang/srt/configs/model_config.py",
            r#"import json, os
def get_config(path):
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except OSError:
        raise ValueError(f"Unrecognized model in {path}. Should have a `model_type` key in its config.json.")
class ModelConfig:
    def __init__(self, model_path, context_length=None):
        self.hf_config = get_config(model_path)
        self._derive_context_length(context_length)
    @staticmethod
    def from_server_args(server_args):
        return ModelConfig(server_args.model_path, server_args.context_length)
    def _derive_context_length(self, context_length):
        derived = self.hf_config["max_position_embeddings"]
        if context_length is not None and context_length > derived:
            msg = f"Warning: User-specified context_length ({context_length}) is greater than the derived context_length ({derived}). This may lead to incorrect model outputs or CUDA errors."
            if os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1":
                raise ValueError(f"{msg} To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
"#,
        ),
        ("sglang/srt/parser/__init__.py", ""),
        (
            "sglang/srt/parser/conversation.py",
            "def chat_template_exists(name):\n    return name == \"chatml\"\n",
        ),
        (
            "sglang/srt/parser/template_manager.py",
            r#"import os
class TemplateManager:
    def _load_explicit_chat_template(self, tokenizer_manager, chat_template_arg):
        if not os.path.exists(chat_template_arg):
            raise RuntimeError(f"Chat template {chat_template_arg} is not a built-in template name or a valid chat template file path.")
"#,
        ),
    ];

    /// Runs the deep script here, as a host would: `tree`'s files on PYTHONPATH, `input` on stdin.
    fn deep_with(
        tree: &[(&str, &str)],
        args: &[&str],
        input: &str,
    ) -> (super::Deep, Vec<String>, String) {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in tree {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            r#"{"max_position_embeddings": 2048}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        std::fs::write(model.join("t.jinja"), "{{ messages }}").unwrap();
        let root = dir.path().to_str().unwrap();
        let args: Vec<String> = args.iter().map(|a| a.replace("$ROOT", root)).collect();
        let mut child = Command::new("python3")
            .args(["-c", super::DEEP_SCRIPT])
            .env("PYTHONPATH", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (the tests need it, as the hosts do)");
        let input = with_args(&input.replace("$ROOT", root), &args);
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let (deep, unchecked) = super::read_deep(out.status.code().unwrap_or(-1), &stdout, &stderr);
        (deep, unchecked, stderr.into_owned())
    }

    use super::super::Refusal;
    use super::Deep;

    const NO_ENV: &str = r#"{"env": {}, "cwd": "/"}"#;

    /// The deep script's stdin: `input` with the unit's arguments.
    fn with_args(input: &str, args: &[impl AsRef<str>]) -> String {
        let mut ask: serde_json::Value = serde_json::from_str(input).unwrap();
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        ask["args"] = serde_json::json!(args);
        ask.to_string()
    }

    #[test]
    fn the_deep_script_checks_the_model_config_when_resolution_needs_a_gpu() {
        let ok = ["--model-path", "$ROOT/model", "--context-length", "2048"];
        let (deep, unchecked, err) = deep_with(SMALL_SGLANG, &ok, NO_ENV);
        // resolve_once() needed the hidden GPUs; the model's config was read all the same.
        assert!(
            matches!(&deep, Deep::ParsedOnly(why) if why.starts_with("RuntimeError: No accelerator")),
            "{deep:?} {err}"
        );
        assert!(unchecked.is_empty(), "{unchecked:?}");

        let long = ["--model-path", "$ROOT/model", "--context-length", "1000000"];
        let (deep, _, err) = deep_with(SMALL_SGLANG, &long, NO_ENV);
        let Deep::Refused(r) = &deep else {
            panic!("{deep:?} {err}")
        };
        assert_eq!(
            (r.stage.as_str(), r.flag.as_deref()),
            ("model-config", Some("context-length"))
        );
        assert!(
            r.reason.starts_with("ValueError: Warning: User-specified context_length (1000000) is greater than the derived context_length (2048).")
                && r.reason.ends_with("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
            "{}",
            r.reason
        );
        // The unit's environment reaches SGLang: the override it allows is allowed.
        let allowed = r#"{"env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}, "cwd": "/"}"#;
        assert!(matches!(
            deep_with(SMALL_SGLANG, &long, allowed).0,
            Deep::ParsedOnly(_)
        ));

        let (deep, _, _) = deep_with(SMALL_SGLANG, &["--model-path", "$ROOT/empty"], NO_ENV);
        assert!(
            matches!(&deep, Deep::Refused(r) if r.flag.as_deref() == Some("model-path") && r.reason.contains("config.json")),
            "{deep:?}"
        );
    }

    #[test]
    fn the_deep_script_checks_the_chat_template_from_the_units_working_directory() {
        let with = |template: &str, cwd: &str| {
            let args = ["--model-path", "$ROOT/model", "--chat-template", template];
            let input = format!(r#"{{"env": {{}}, "cwd": "{cwd}"}}"#);
            deep_with(SMALL_SGLANG, &args, &input).0
        };
        assert!(matches!(with("chatml", "/"), Deep::ParsedOnly(_)));
        assert!(matches!(
            with("t.jinja", "$ROOT/model"),
            Deep::ParsedOnly(_)
        ));
        assert_eq!(
            with("t.jinja", "/"),
            Deep::Refused(Refusal::new(
                "chat-template",
                Some("chat-template"),
                "RuntimeError: Chat template t.jinja is not a built-in template name or a valid chat template file path."
            ))
        );
    }

    #[test]
    fn the_deep_script_gives_the_environment_at_the_start_and_reads_argparse() {
        // The loader reads LD_LIBRARY_PATH only when the process starts: so must the check.
        let env = r#"{"env": {"NEED_AT_START": "yes"}, "cwd": "/"}"#;
        let (deep, _, err) = deep_with(SMALL_SGLANG, &["--model-path", "$ROOT/model"], env);
        assert!(matches!(deep, Deep::ParsedOnly(_)), "{deep:?} {err}");
        let (deep, _, _) = deep_with(
            SMALL_SGLANG,
            &["--model-path", "m", "--tp-sizee", "2"],
            NO_ENV,
        );
        assert_eq!(
            deep,
            Deep::Refused(Refusal::new(
                "arguments",
                None,
                "sglang serve: error: unrecognized arguments: --tp-sizee 2"
            ))
        );
        // No sglang.srt at all: the check cannot run.
        let (deep, _, _) = deep_with(
            &[("sglang/__init__.py", "")],
            &["--model-path", "m"],
            NO_ENV,
        );
        assert!(matches!(deep, Deep::Unavailable(_)), "{deep:?}");
    }

    #[test]
    fn the_deep_script_on_the_test_stand_in_checks_no_model_config() {
        // The stand-in (fixtures/fake-sglang) has no configs.model_config, and its hosts' model
        // folder has no config.json: accepted, the model config listed as not checked.
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-sglang");
        let run = |args: &[&str]| {
            let mut child = Command::new("python3")
                .args(["-c", super::DEEP_SCRIPT])
                .env("PYTHONPATH", &here)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(with_args(NO_ENV, args).as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            super::read_deep(
                out.status.code().unwrap_or(-1),
                &String::from_utf8_lossy(&out.stdout),
                &String::from_utf8_lossy(&out.stderr),
            )
        };
        let (deep, unchecked) = run(&[
            "--model-path",
            "/models/test",
            "--tp-size",
            "2",
            "--chat-template",
            "x.jinja",
        ]);
        assert_eq!(deep, Deep::Accepted);
        assert_eq!(unchecked.len(), 2, "{unchecked:?}");
        assert!(
            unchecked[0].starts_with("model config: ModuleNotFoundError"),
            "{unchecked:?}"
        );
        let (deep, _) = run(&["--model-path", "/models/test", "--bogus"]);
        assert_eq!(
            deep,
            Deep::Refused(Refusal::new(
                "arguments",
                None,
                "launch_server.py: error: unrecognized arguments: --bogus"
            ))
        );
    }

    #[test]
    fn the_deep_check_reads_the_units_arguments_and_environment_on_stdin_never_its_argv() {
        let text = "service: s\nhosts: [h]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 30000\n  flags: { api-key: sk_secret }\nenv: { HF_TOKEN: hf_secret }\nsystemd: { WorkingDirectory: -/srv/s, User: svc, ProtectHome: read-only }\n";
        let m = crate::manifest::parse("m.yaml", text).unwrap();
        let t = crate::targets::targets(&[m], &Default::default())
            .unwrap()
            .remove(0);
        let input: serde_json::Value = serde_json::from_str(&super::deep_input(&t)).unwrap();
        assert_eq!(
            input,
            serde_json::json!({
                "args": ["--model-path", "/models/m", "--api-key", "sk_secret", "--port", "30000"],
                "env": {"HF_TOKEN": "hf_secret"},
                "cwd": "/srv/s",
            })
        );
        let python = "/venv/bin/python3";
        let cached = super::Cached::of(&t);
        let limit = std::time::Duration::from_secs(60);
        let argv = super::deep_argv(&cached, "0.5.23", python, &t.desired.model, limit);
        assert!(!argv.iter().any(|a| a.contains("_secret")), "{argv:?}");
        assert_eq!(
            argv[5..10],
            ["/models/m", "/models/m", "", "0.5.23", ""],
            "the lookup's arguments, then no gate: the check runs as the unit's user"
        );
        assert_eq!(
            argv[10],
            "ProtectHome=read-only\nUser=svc\nWorkingDirectory=-/srv/s\nRuntimeMaxSec=65"
        );
        assert_eq!(argv[11..14], ["/venv/bin/python3", "-I", "-c"]);
        assert_eq!(argv.len(), 15, "{argv:?}");
        // `# name: ...` names a script in traces (`remote::command_name`).
        assert!(argv[2].starts_with("# deep check: "), "{}", argv[2]);
    }
}
