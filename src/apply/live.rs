//! Changes the running server takes without a restart (`reconcile_core::live` decides which):
//! what a plan reads from the host to say so, the calls that tell the server a change and take
//! it back, and the command line of the process told, which the deployment record names. The transaction around them (armed guard, verification, the way back) is
//! `pipeline`'s.

use std::time::{Duration, Instant};

use reconcile_core::live::{self, Checkpoint, LiveChange, SAMPLING_FILE, TOKENIZER_FILES};
use serde_json::Value;

use crate::observed::{split_nul, Observed};
use crate::plan::UnitPlan;
use crate::remote::http::Endpoint;
use crate::remote::{error_chain, Host, RemoteError};
use crate::targets::Target;

/// `/set_internal_state` is answered by each scheduler between two batches
/// (`scheduler_components/internal_state.py`): a minute without an answer is a stuck scheduler,
/// not a slow one.
const SETTINGS_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes `planned`, a restart of a running server, live when its manifest asks for live changes
/// (`apply.live`) and the server can take this one: another checkpoint of the same shape whose
/// tokenizer and sampling defaults are the same, or values `/set_internal_state` takes. Otherwise
/// the plan says why it restarts. Reads the two checkpoints from the host only for a weight move.
pub(crate) async fn plan(host: &dyn Host, t: &Target, observed: &Observed, planned: &mut UnitPlan) {
    let change = match live::candidate(planned, observed, &t.desired) {
        None => return,
        Some(Err(why)) => return planned.not_live(&why),
        Some(Ok(change)) => change,
    };
    if let Some(m) = &change.weights {
        // Both read at once: each is two round trips.
        let read = futures::future::join(checkpoint(host, &m.from), checkpoint(host, &m.to));
        let agree = match read.await {
            (Ok(old), Ok(new)) => live::checkpoints_agree(m, &old, &new).map_err(|e| e.to_string()),
            (Err(e), _) | (_, Err(e)) => Err(format!(
                "the checkpoints could not be read: {}",
                error_chain(&e)
            )),
        };
        if let Err(why) = agree {
            return planned.not_live(&why);
        }
    }
    planned.go_live(change);
}

/// What the host holds of the checkpoint in `dir`: its `config.json`, and the hashes of the files
/// a restart reads besides the weights.
async fn checkpoint(host: &dyn Host, dir: &str) -> Result<Checkpoint, RemoteError> {
    let config = host.read_file(&format!("{dir}/config.json")).await?;
    let paths: Vec<String> = TOKENIZER_FILES
        .iter()
        .chain(&[SAMPLING_FILE])
        .map(|f| format!("{}/{f}", dir.trim_end_matches('/')))
        .collect();
    let mut argv = vec!["sha256sum", "--"];
    argv.extend(paths.iter().map(String::as_str));
    // A file the checkpoint lacks is left out: sha256sum names it on stderr and exits 1.
    let out = host.run(&argv).await?;
    let hashes = out
        .stdout
        .lines()
        .filter_map(|line| {
            let (hash, path) = line.split_once("  ")?;
            let name = path.rsplit('/').next()?;
            Some((name.to_string(), hash.to_string()))
        })
        .collect();
    Ok(Checkpoint { config, hashes })
}

/// Tells the server at `endpoint` the change: the weights first (a load, bounded by `limit` as a
/// load after a restart is), then the values. What it did, or why it did not: a server that did
/// not take a part may have taken the parts before it, so a failure is undone whole.
pub(super) async fn tell(
    host: &dyn Host,
    endpoint: &Endpoint,
    url: Option<&str>,
    change: &LiveChange,
    limit: Duration,
) -> Result<String, TellError> {
    let server = host
        .server(endpoint, url)
        .await
        .map_err(TellError::Unreached)?;
    let mut done = Vec::new();
    if let (Some(body), Some(m)) = (change.weights_body(), &change.weights) {
        let started = Instant::now();
        let answer = server
            .post_json_within("/update_weights_from_disk", &body, limit)
            .await
            .map_err(TellError::Post)?;
        // SGLang answers 400 with `success: false` when it kept its weights; a 200 must say
        // `success: true` as well.
        let success = serde_json::from_str::<Value>(&answer)
            .ok()
            .and_then(|v| v.get("success")?.as_bool());
        if success != Some(true) {
            return Err(TellError::WeightsRefused { answer });
        }
        done.push(format!(
            "weights loaded from {} in {:.2}s",
            m.to,
            started.elapsed().as_secs_f64()
        ));
    }
    if let Some(body) = change.settings_body() {
        let answer = server
            .post_json_within("/set_internal_state", &body, SETTINGS_TIMEOUT)
            .await
            .map_err(TellError::Post)?;
        // One boolean per data-parallel rank; a `false` rank refused a value and changed nothing.
        match serde_json::from_str::<Vec<bool>>(&answer) {
            Ok(ranks) if !ranks.is_empty() && ranks.iter().all(|r| *r) => {}
            _ => {
                return Err(TellError::SettingsRefused {
                    values: body["server_args"].to_string(),
                    answer,
                })
            }
        }
        done.push(live::held::settings_set(&change.settings));
    }
    Ok(done.join("; "))
}

/// The command line of the main process `pid` (`/proc/<pid>/cmdline`).
pub(crate) async fn process_argv(host: &dyn Host, pid: u32) -> Result<Vec<String>, ArgvError> {
    if pid == 0 {
        return Err(ArgvError::NoProcess);
    }
    match host.read_file(&format!("/proc/{pid}/cmdline")).await {
        Ok(Some(cmdline)) if !cmdline.is_empty() => Ok(split_nul(&cmdline)),
        Ok(_) => Err(ArgvError::Gone(pid)),
        Err(e) => Err(ArgvError::Unreadable(e)),
    }
}

/// Why a server's command line could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArgvError {
    /// systemd's `MainPID` is 0.
    #[error("systemd names no main process")]
    NoProcess,
    /// `/proc/<pid>/cmdline` is gone or empty.
    #[error("process {0} is gone")]
    Gone(u32),
    /// The host could not be asked.
    #[error("{}", error_chain(.0))]
    Unreadable(#[source] RemoteError),
}

/// Why a running server did not take a live change told to it; a part it did not take may
/// follow parts it did, so the change is undone whole.
#[derive(Debug, thiserror::Error)]
pub enum TellError {
    /// The server's endpoint could not be reached through its host.
    #[error("{}", error_chain(.0))]
    Unreached(#[source] RemoteError),
    /// The request itself failed (no answer, an HTTP error, past its time).
    #[error("{0}")]
    Post(#[source] crate::remote::http::ApiError),
    /// `/update_weights_from_disk` answered without `success: true`: the server kept its weights.
    #[error("/update_weights_from_disk answered {answer}")]
    WeightsRefused { answer: String },
    /// A data-parallel rank refused a value of `/set_internal_state` (`values`: what it was sent).
    #[error("/set_internal_state did not take {values} (it answered {answer})")]
    SettingsRefused { values: String, answer: String },
}
