//! Plan files on disk: `reconcile plan --out plan.json` writes one, `reconcile apply plan.json`
//! finds and reads it. The model, its JSON and the staleness checks are pure, in
//! `reconcile_core::plan_file` (re-exported here); this module adds what touches the disk and the
//! clock.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use reconcile_core::plan_file::*;

use crate::dry_run::PlanOutcome;

/// The plan of a `plan` run, made now by this reconcile.
pub fn new(
    manifests: &[PathBuf],
    git_commit: Option<String>,
    outcomes: &[PlanOutcome],
) -> PlanFile {
    PlanFile::new(
        manifests,
        git_commit,
        outcomes,
        SystemTime::now(),
        env!("CARGO_PKG_VERSION"),
    )
}

pub fn write(plan: &PlanFile, path: &Path) -> Result<(), Error> {
    let error = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut text =
        serde_json::to_string_pretty(plan).map_err(|e| error(std::io::Error::other(e)))?;
    text.push('\n');
    std::fs::write(path, text).map_err(error)
}

/// The plan file among `apply`'s paths, if one is: a `.json` file whose top level has
/// `"format": "reconcile-plan"`. Anything else is left to the manifest loader.
pub fn find(paths: &[PathBuf]) -> Result<Option<PlanFile>, Error> {
    for path in paths {
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if !is_json || !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?;
        if let Some(plan) = PlanFile::parse(path, &text)? {
            if paths.len() > 1 {
                return Err(Error::NotAlone { path: path.clone() });
            }
            return Ok(Some(plan));
        }
    }
    Ok(None)
}
