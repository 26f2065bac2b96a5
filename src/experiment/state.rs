//! The experiment's progress, kept on the host beside the unit's deployment records: the report
//! so far, tied to the experiment file and manifest it was run from. `--resume` reads it; a run
//! that finishes removes it.

use reconcile_core::experiment::Report;
use serde::{Deserialize, Serialize};

use crate::remote::{error_chain, Host, RemoteError};
use crate::state::unit_dir;

/// Why the kept progress cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read.
    #[error("the experiment's state could not be read ({})", error_chain(.0))]
    Read(#[source] RemoteError),
    /// The file at `path` is not a [`Saved`] (another version's, or damaged).
    #[error("{path} is not an experiment's state ({source})")]
    NotState {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Saved {
    /// sha256 of the experiment file's and the manifest's texts.
    pub digest: String,
    pub report: Report,
}

fn path(unit: &str) -> String {
    format!("{}/experiment.json", unit_dir(unit))
}

/// The saved progress, `None` when there is none; an error says why it cannot be used.
pub async fn read(host: &dyn Host, unit: &str) -> Result<Option<Saved>, StateError> {
    let text = host
        .read_file(&path(unit))
        .await
        .map_err(StateError::Read)?;
    match text {
        None => Ok(None),
        Some(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|source| StateError::NotState {
                path: path(unit),
                source,
            }),
    }
}

/// Keeps the progress. A failure to write costs only `--resume`, so it is reported, not fatal.
pub async fn write(host: &dyn Host, unit: &str, digest: &str, report: &Report) {
    let saved = Saved {
        digest: digest.to_string(),
        report: report.clone(),
    };
    let text = serde_json::to_string_pretty(&saved).expect("a report serialises");
    let dir = unit_dir(unit);
    let written = async {
        crate::state::private_dir(host, &dir).await?;
        host.write_file(&path(unit), &text, "0644").await
    };
    if let Err(e) = written.await {
        eprintln!(
            "warning: the experiment's progress could not be kept on {} ({}): --resume will not find it",
            host.name(),
            reconcile_core::terminal::escape_controls(&error_chain(&e))
        );
    }
}

pub async fn clear(host: &dyn Host, unit: &str) {
    let _ = host.run(&["rm", "-f", &path(unit)]).await;
}
