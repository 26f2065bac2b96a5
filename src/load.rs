//! Reading the manifests for a run: parsed, validated, and checked against the flag catalog of the
//! SGLang version each names. Every error of every file comes back together; warnings are printed
//! and do not stop the run unless `strict`. The only place that reads manifest files: the parsing
//! and checking are pure, in `reconcile_core::manifest`.

use std::path::{Path, PathBuf};

use crate::manifest::{self, Manifest, ManifestError, ManifestErrors};
use crate::redact::Redactor;
use crate::sglang::{self, ManifestFinding, Severity};
use reconcile_core::pinned::{self, Lock};
use reconcile_core::quality;

pub struct Loaded {
    pub manifests: Vec<Manifest>,
    pub warnings: Vec<ManifestFinding>,
    /// Hides the env names the manifests declare secret (`secret_env`), and every value read
    /// from this process's environment (`{ from_env: VAR }`).
    pub redactor: Redactor,
}

/// What a load that failed still found: every error, the warnings, and the secret names of the
/// manifests that did parse (their values may still be shown, in a rollback run by `--host`).
pub struct Failed {
    pub errors: ManifestErrors,
    pub warnings: Vec<ManifestFinding>,
    pub redactor: Redactor,
}

pub fn load(paths: &[PathBuf], strict: bool) -> Result<Loaded, Failed> {
    load_read(read(paths), strict, Locks::Required)
}

/// [`load`] for `reconcile lock`, which writes the lock entries a pinned model lacks: the lock
/// file is not read.
pub fn load_unlocked(paths: &[PathBuf], strict: bool) -> Result<Loaded, Failed> {
    load_read(read(paths), strict, Locks::Ignored)
}

/// Whether a pinned model (`sglang.model:`) must find its files in the lock file beside its
/// manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locks {
    Required,
    Ignored,
}

/// [`load`] of manifests already read: each the path it is shown as (and its `verify.quality`
/// files are read relative to) and its text. `reconcile experiment` checks each variant, an edit
/// of the manifest's text that is not on disk, the same way as the manifest itself.
pub fn load_texts(files: Vec<(String, String)>, strict: bool) -> Result<Loaded, Failed> {
    load_read(files.into_iter().map(Ok).collect(), strict, Locks::Required)
}

fn load_read(
    files: Vec<Result<(String, String), ManifestError>>,
    strict: bool,
    locks: Locks,
) -> Result<Loaded, Failed> {
    let mut warnings = Vec::new();
    let mut redactor = Redactor::default();
    let mut lock_files = LockFiles::default();
    let result = manifest::check_all(files, |m, text| {
        // `{ from_env: VAR }` values come from this process's environment; their names join
        // `secret_env`, so the redactor hides what they resolved to.
        let unresolved = m.resolve_references(|var| std::env::var(var).ok());
        redactor.declare(&m.secret_env);
        if !unresolved.is_empty() {
            return unresolved;
        }
        let quality_errors = read_quality_files(m, text);
        if !quality_errors.is_empty() {
            return quality_errors;
        }
        if locks == Locks::Required {
            if let Err(e) = lock_files.attach(m, text) {
                return vec![e];
            }
        }
        let checked = sglang::check_manifest(m, text);
        // Render what argparse would run: `tp` becomes `--tp-size`, safe from a later ambiguity.
        checked.apply_renames(m);
        let (errors, warned): (Vec<ManifestFinding>, Vec<ManifestFinding>) = checked
            .findings
            .into_iter()
            .partition(|f| f.severity == Severity::Error || strict);
        warnings.extend(warned);
        errors.into_iter().map(Into::into).collect()
    });
    match result {
        Ok(manifests) => Ok(Loaded {
            manifests,
            warnings,
            redactor,
        }),
        Err(errors) => Err(Failed {
            errors,
            warnings,
            redactor,
        }),
    }
}

/// Reads the files `verify.quality` names (`prompts_file`, `texts_file`, `cases`), relative to the manifest's
/// folder, into the spec; what cannot be read or parsed is an error naming the file and line (a
/// file that is not there: the manifest's line naming it).
fn read_quality_files(m: &mut Manifest, text: &str) -> Vec<ManifestError> {
    let source = m.source.clone();
    let Some(q) = m.verify.quality.as_mut() else {
        return Vec::new();
    };
    let folder = Path::new(&source)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut errors = Vec::new();
    let mut read = |key: &str, written: &str| -> Option<(String, String)> {
        let path = folder.join(written);
        let shown = display_path(&path);
        match std::fs::read_to_string(&path) {
            Ok(content) => Some((shown, content)),
            Err(e) => {
                errors.push(ManifestError::Invalid {
                    file: source.clone(),
                    position: manifest::field_position(text, &["verify", "quality", key]),
                    field: format!("verify.quality.{key}"),
                    message: format!("{shown} cannot be read: {e}"),
                });
                None
            }
        }
    };
    let parsed_error = |field: &str, e: quality::QualityFileError| ManifestError::Invalid {
        file: e.file.clone(),
        position: Some(manifest::Position {
            line: e.line,
            column: 1,
        }),
        field: field.to_string(),
        message: e.message,
    };
    let mut parse_errors = Vec::new();
    if let Some(file) = q.prompts_file.as_mut() {
        if let Some((shown, content)) = read("prompts_file", &file.path) {
            match quality::parse_prompts(&shown, &content) {
                Ok(prompts) => file.content = prompts,
                Err(e) => parse_errors.push(parsed_error("prompt", e)),
            }
        }
    }
    if let Some(file) = q.texts_file.as_mut() {
        if let Some((shown, content)) = read("texts_file", &file.path) {
            match quality::parse_texts(&shown, &content) {
                Ok(texts) => file.content = texts,
                Err(e) => parse_errors.push(parsed_error("text", e)),
            }
        }
    }
    if let Some(file) = q.cases.as_mut() {
        if let Some((shown, content)) = read("cases", &file.path) {
            match quality::parse_cases(&shown, &content) {
                Ok(cases) => file.content = cases,
                Err(e) => parse_errors.push(parsed_error("case", e)),
            }
        }
    }
    errors.extend(parse_errors);
    errors
}

/// Why the lock file beside a manifest cannot be used.
#[derive(Debug, thiserror::Error)]
enum LockFileError {
    /// It is there and could not be read (`shown`: its path as shown).
    #[error("{shown} cannot be read: {source}")]
    Read {
        shown: String,
        #[source]
        source: std::io::Error,
    },
    /// It is not a lock file reconcile reads.
    #[error(transparent)]
    Parse(#[from] pinned::LockError),
}

/// The lock files read so far, by path: every manifest of a folder shares its folder's.
#[derive(Default)]
struct LockFiles {
    read: std::collections::HashMap<PathBuf, Result<Lock, LockFileError>>,
}

impl LockFiles {
    /// Gives a pinned model (`sglang.model:`) its files from the lock file beside its manifest.
    /// A lock that cannot be read, or that lacks the revision, is an error at the revision's
    /// line, saying how to write it: nothing reaches a host without the files' hashes.
    fn attach(&mut self, m: &mut Manifest, text: &str) -> Result<(), ManifestError> {
        let source = m.source.clone();
        let Some(w) = m.sglang.pinned.as_mut() else {
            return Ok(());
        };
        let folder = Path::new(&source)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = folder.join(pinned::LOCK_FILE);
        let shown = display_path(&path);
        let at = |message: String| ManifestError::Invalid {
            file: source.clone(),
            position: manifest::field_position(text, &["sglang", "model", "revision"]),
            field: "sglang.model.revision".into(),
            message,
        };
        let lock =
            self.read
                .entry(path.clone())
                .or_insert_with(|| match std::fs::read_to_string(&path) {
                    Ok(content) => Ok(Lock::parse(&shown, &content)?),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lock::default()),
                    Err(source) => Err(LockFileError::Read {
                        shown: shown.clone(),
                        source,
                    }),
                });
        // A lock file that does not read is the manifest's error at its revision line; that error
        // carries a message, as every `ManifestError::Invalid` does.
        let lock = lock.as_ref().map_err(|e| at(e.to_string()))?;
        let folder_arg = display_path(&folder);
        let folder_arg = if folder_arg.is_empty() {
            ".".to_string()
        } else {
            folder_arg
        };
        let entry = lock.find(&w.lock_source(), &w.revision).ok_or_else(|| {
            at(format!(
                "{} at revision {} is not in {shown}: `reconcile lock {folder_arg}` records its files' hashes",
                w.lock_source(),
                w.revision
            ))
        })?;
        w.locked = Some(entry.clone());
        if w.files().is_empty() {
            return Err(at(format!(
                "none of the revision's {} files in {shown} matches `include`",
                entry.files.len()
            )));
        }
        Ok(())
    }
}

/// Every manifest under `paths` (files, or folders searched for `*.yaml` and `*.yml`), read: the
/// path it is shown as and its text, or why it could not be read. Folders that cannot be listed
/// and paths that do not exist come first, then the files in order.
fn read(paths: &[PathBuf]) -> Vec<Result<(String, String), ManifestError>> {
    let mut errors = Vec::new();
    let files = manifest_files(paths, &mut errors);
    let mut read: Vec<_> = errors.into_iter().map(Err).collect();
    for file in files {
        let shown = display_path(&file);
        read.push(match std::fs::read_to_string(&file) {
            Ok(text) => Ok((shown, text)),
            Err(source) => Err(ManifestError::Read {
                path: shown,
                source,
            }),
        });
    }
    read
}

fn manifest_files(paths: &[PathBuf], errors: &mut Vec<ManifestError>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.is_file() && is_yaml(p))
                        .collect();
                    found.sort();
                    files.extend(found);
                }
                Err(source) => errors.push(ManifestError::Read {
                    path: display_path(path),
                    source,
                }),
            }
        } else if path.exists() {
            files.push(path.clone());
        } else {
            let source =
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder");
            errors.push(ManifestError::Read {
                path: display_path(path),
                source,
            });
        }
    }
    files
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// The path relative to the git work tree holding it, so the rendered header does not depend on
/// where `reconcile` was started from; otherwise the path as given.
pub fn display_path(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut dir = absolute.parent();
    while let Some(d) = dir {
        if d.join(".git").exists() {
            if let Ok(rel) = absolute.strip_prefix(d) {
                return rel.display().to_string();
            }
        }
        dir = d.parent();
    }
    path.display().to_string()
}
