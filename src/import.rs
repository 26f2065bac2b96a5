//! `reconcile import HOST UNIT`: adopting a host. Reads what systemd runs for a unit there (its
//! file and drop-ins, as `systemctl cat` prints them) and the SGLang version of the unit's Python,
//! and hands them to the pure `reconcile_core::import`, which writes the manifest. Nothing on the
//! host is changed.

use std::io::Write;
use std::path::{Path, PathBuf};

use reconcile_core::import::{self as core_import, ImportErrors, Imported, Request, UnitFile};

use crate::manifest;
use crate::observed::Show;
use crate::remote::{self, Host, RemoteError, SshOptions};
use crate::targets;

/// What `reconcile import` was asked.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub host: String,
    /// `<name>.service` (a bare name gets `.service`).
    pub unit: String,
    /// Env names to treat as secret besides those that look secret.
    pub secret_env: Vec<String>,
}

/// Why nothing was imported.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// systemd knows no such unit on the host.
    #[error("{host} has no unit {unit} (systemd says not-found)")]
    NotFound { host: String, unit: String },
    /// Masked: linked to /dev/null, so there is nothing it runs to import.
    #[error("{unit} is masked on {host} (linked to /dev/null): there is nothing it runs to import; unmask it first")]
    Masked { host: String, unit: String },
    /// Loaded with an error, or in a state import cannot read.
    #[error("systemd on {host} could not load {unit} (LoadState={state}): fix the unit first (`systemctl status {unit}` says why)")]
    NotLoaded {
        host: String,
        unit: String,
        state: String,
    },
    /// Loaded from no file at all (a transient unit).
    #[error("{unit} on {host} has no unit file (a transient unit?): there is nothing to write a manifest from")]
    NoFile { host: String, unit: String },
    /// `systemctl cat` did not show a file `systemctl show` named.
    #[error("`systemctl cat {unit}` on {host} does not show {path}, which systemd says it reads")]
    Cat {
        host: String,
        unit: String,
        path: String,
    },
    /// The unit's Python has no SGLang, or is not there.
    #[error("{host}: the unit's Python {python} has no SGLang installed (or is not an executable file), so its flags cannot be read with the right catalog")]
    NoSglang { host: String, python: String },
    #[error("{host}: {errors}")]
    Inexpressible { host: String, errors: ImportErrors },
    #[error("{0} exists; pass --force to replace it")]
    Exists(PathBuf),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the unit on its host and writes its manifest (not yet to any file).
pub async fn import(options: &ImportOptions, ssh: &SshOptions) -> Result<Imported, Error> {
    let host = remote::connect(&options.host, ssh).await?;
    let result = import_from(host.as_ref(), options).await;
    host.close().await;
    result
}

async fn import_from(host: &dyn Host, options: &ImportOptions) -> Result<Imported, Error> {
    let unit = unit_name(&options.unit);
    let files = unit_files(host, &unit).await?;
    // `<venv>/bin/sglang serve ...`: the Python is the one on the script's `#!` line.
    let interpreter = match core_import::console_script(&unit, &files) {
        Some(script) => interpreter_of(host, &script).await?,
        None => None,
    };
    let python = interpreter
        .clone()
        .or_else(|| core_import::python(&unit, &files));
    let version = match python {
        Some(python) => Some(sglang_version(host, &unit, &python).await?),
        // No ExecStart: the core says so, with the file.
        None => None,
    };
    let request = Request {
        host: &options.host,
        unit: &unit,
        files: &files,
        version: version.as_deref().unwrap_or(""),
        secret_env: &options.secret_env,
        interpreter: interpreter.as_deref(),
    };
    core_import::import(&request).map_err(|errors| Error::Inexpressible {
        host: options.host.clone(),
        errors,
    })
}

/// The Python a console script runs: the absolute path on its `#!` line (pip writes one), or
/// `None` when it names none (`#!/usr/bin/env python3`, which a manifest cannot).
async fn interpreter_of(host: &dyn Host, script: &str) -> Result<Option<String>, Error> {
    let out = host
        .run(&["sh", "-c", "head -n 1 -- \"$1\"", "sh", script])
        .await?;
    Ok(shebang_python(&out.stdout))
}

fn shebang_python(first_line: &str) -> Option<String> {
    let program = first_line.strip_prefix("#!")?.split_whitespace().next()?;
    (program.starts_with('/') && !program.ends_with("/env")).then(|| program.to_string())
}

/// `sglang-qwen` is `sglang-qwen.service`, as every other command reads it.
fn unit_name(unit: &str) -> String {
    format!("{}.service", unit.strip_suffix(".service").unwrap_or(unit))
}

/// The files systemd reads for `unit`, in its order, as `systemctl cat` prints them; a unit that
/// is not there, masked or broken is refused.
async fn unit_files(host: &dyn Host, unit: &str) -> Result<Vec<UnitFile>, Error> {
    let shown = host
        .run_ok(&[
            "systemctl",
            "show",
            "-p",
            "FragmentPath,DropInPaths,LoadState,UnitFileState",
            "--",
            unit,
        ])
        .await?;
    let show = Show::parse(&shown);
    let who = || (host.name().to_string(), unit.to_string());
    match show.text("LoadState").as_str() {
        "loaded" => {}
        "not-found" => {
            let (host, unit) = who();
            return Err(Error::NotFound { host, unit });
        }
        "masked" => {
            let (host, unit) = who();
            return Err(Error::Masked { host, unit });
        }
        state => {
            let (host, unit) = who();
            let state = state.to_string();
            return Err(Error::NotLoaded { host, unit, state });
        }
    }
    let fragment = show.text("FragmentPath");
    if fragment.is_empty() {
        let (host, unit) = who();
        return Err(Error::NoFile { host, unit });
    }
    let mut paths = vec![fragment];
    paths.extend(
        show.text("DropInPaths")
            .split_whitespace()
            .map(str::to_string),
    );
    let cat = host.run_ok(&["systemctl", "cat", "--", unit]).await?;
    core_import::split_cat(&cat, &paths).map_err(|e| {
        let (host, unit) = who();
        Error::Cat {
            host,
            unit,
            path: e.path,
        }
    })
}

/// The SGLang version `python` has, read as preflight reads it (`installed_sglang`, which reads
/// it for a target: here one of a stand-in manifest naming that Python).
async fn sglang_version(host: &dyn Host, unit: &str, python: &str) -> Result<String, Error> {
    let no_sglang = || Error::NoSglang {
        host: host.name().to_string(),
        python: python.to_string(),
    };
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let text = format!(
        "service: {}\nhosts: [{}]\nsglang: {{ python: {}, version: \"0\", model_path: /, port: 1 }}\n",
        quote(unit.strip_suffix(".service").unwrap_or(unit)),
        quote(host.name()),
        quote(python),
    );
    let m = manifest::parse("import", &text).map_err(|_| no_sglang())?;
    let target = targets::targets(&[m], &targets::Filter::default())
        .ok()
        .and_then(|mut t| t.pop())
        .ok_or_else(no_sglang)?;
    crate::preflight::installed_sglang(host, &target)
        .await?
        .ok_or_else(no_sglang)
}

/// Writes the manifest to `path`, refusing to replace a file unless `force`.
pub fn write_manifest(path: &Path, text: &str, force: bool) -> Result<(), Error> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true);
    if force {
        open.create(true).truncate(true);
    } else {
        open.create_new(true);
    }
    let failed = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            Error::Exists(path.to_path_buf())
        } else {
            Error::Write {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let mut file = open.open(path).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_a_service() {
        assert_eq!(unit_name("sglang-qwen"), "sglang-qwen.service");
        assert_eq!(unit_name("sglang-qwen.service"), "sglang-qwen.service");
        assert_eq!(unit_name("qwen3.5"), "qwen3.5.service");
    }

    #[test]
    fn a_console_scripts_python_is_the_absolute_one_on_its_first_line() {
        assert_eq!(
            shebang_python("#!/opt/venv/bin/python3\n").as_deref(),
            Some("/opt/venv/bin/python3")
        );
        assert_eq!(
            shebang_python("#!/usr/bin/python3 -E\n").as_deref(),
            Some("/usr/bin/python3")
        );
        assert_eq!(shebang_python("#!/usr/bin/env python3\n"), None);
        assert_eq!(shebang_python("import sys\n"), None);
    }

    #[test]
    fn an_existing_file_is_kept_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        write_manifest(&path, "a\n", false).unwrap();
        let e = write_manifest(&path, "b\n", false).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("exists; pass --force to replace it"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\n");
        write_manifest(&path, "b\n", true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
    }
}
