//! A unit put back on a unit it had before, through the one transaction apply runs: preflight,
//! the lock, a guard armed, the restart, verification and a deployment record. `reconcile
//! rollback` restores a saved deployment so ([`saved_target`]); a rollout undoes a unit it converged
//! so, by `--rollback-all` when it stopped elsewhere or by the canary's bake when live traffic
//! found the canary worse ([`undo`]).

use std::sync::Arc;

use super::decide::{self, UndoneBy};
use super::restore::{restore_and_verify, NotRestored, Restore, Restored, Then};
use super::verifier::ServerVerifier;
use super::{ApplyOptions, GitInfo, Outcome, Restoring, UnitReport};
use crate::flags::{console_script, flags};
use crate::manifest::{HostSpec, Manifest, SglangSpec, VerifySpec};
use crate::plan::Verdict;
use crate::remote::{Host, RemoteError};
use crate::state;
use crate::targets::Target;
use crate::unit::{parse_unit, Desired};

/// Why a unit could not be put back. The report writes it with its causes (`error_chain`); an
/// `ApplyError` or a `NotRestored` held here writes its own cause's chain already, so it is kept
/// whole but not as a `source`, which that would walk and write again.
#[derive(Debug, thiserror::Error)]
pub(super) enum UndoError {
    /// Its host could not be reached.
    #[error("its host cannot be reached")]
    Unreachable(#[source] RemoteError),
    /// Its router was unreachable, or did not let it out.
    #[error("it could not be taken out of its router: {0}")]
    NotTakenOut(super::ApplyError),
    /// The generations or deployment records on the host could not be read.
    #[error("what the host keeps cannot be read")]
    Read(#[source] RemoteError),
    /// The host keeps no generation to go back to.
    #[error("the host keeps no unit from before this rollout")]
    NothingSaved,
    /// The unit's lock could not be taken to remove it.
    #[error("{0}")]
    NotLocked(crate::state::LockError),
    /// The unit this rollout installed could not be removed (or what systemd has beneath it
    /// failed its verification).
    #[error("{0}")]
    NotRemoved(NotRestored),
    /// The apply of the previous unit did not converge: `detail` says what it did instead (a
    /// restored unit that fails its verification is rolled back to the one it replaced).
    #[error("putting the previous unit back ended {}: {detail}", outcome.name())]
    NotRestored { outcome: Outcome, detail: String },
}

/// Says in `r`, a unit's report, what `by` undoing it for `why` came to (`restored`): its ending,
/// and the restored unit's verification.
pub(super) fn report(
    r: &mut UnitReport,
    why: &str,
    by: UndoneBy,
    restored: Result<Restored, UndoError>,
) {
    let ending = decide::undone(
        &r.detail,
        why,
        by,
        restored
            .as_ref()
            .map_err(|e| e as &(dyn std::error::Error + 'static)),
    );
    if let Ok(Restored::Verified(v)) = restored {
        r.rollback = Some(*v);
    }
    r.outcome = ending.outcome;
    r.detail = ending.detail;
    r.error = ending.error;
}

/// Puts back the unit `r` reports converged (or reloaded) from `t`: the generation its install
/// kept, applied as any unit is, with `by` named in its progress. Its record names the deployment
/// that unit came from, when one did. A unit that was new has no previous server to guard: it is
/// stopped, disabled and removed under the lock (its text stays saved under `deployed/`).
pub(super) async fn undo(
    host: &dyn Host,
    r: &UnitReport,
    t: &Target,
    options: &ApplyOptions,
    by: UndoneBy,
) -> Result<Restored, UndoError> {
    let unit = r.unit.as_str();
    if r.verdict == Some(Verdict::Install) {
        return remove(host, r, &t.verify, options, by).await;
    }
    let previous = state::newest_generation(host, unit)
        .await
        .map_err(UndoError::Read)?
        .ok_or(UndoError::NothingSaved)?;
    let history = state::read_history(host, unit)
        .await
        .map_err(UndoError::Read)?;
    let (restoring, git, digest) = match recorded(&history, &state::sha256(&previous)) {
        Some((n, record)) => (
            Restoring::Deployment(n),
            GitInfo {
                commit: record.git_commit.clone(),
                author: record.git_author.clone(),
            },
            record.manifest_sha256.clone(),
        ),
        None => (Restoring::Unrecorded, GitInfo::default(), String::new()),
    };
    let target = saved_target(
        &t.host,
        unit,
        previous,
        &t.source,
        &digest,
        Some(&t.manifest),
    );
    let mut applied = super::apply_one(host, &target, &options.restoring(restoring, git)).await;
    match (applied.outcome, applied.verification.take()) {
        (Outcome::Converged, Some(v)) => Ok(Restored::Verified(Box::new(v))),
        (Outcome::Reloaded, _) => Ok(Restored::Reloaded),
        (outcome, _) => Err(UndoError::NotRestored {
            outcome,
            detail: applied.detail,
        }),
    }
}

/// The newest deployment in `history` that installed the unit whose sha256 is `sha`, and its
/// number.
fn recorded<'h>(
    history: &'h [Result<state::Record, state::RecordProblem>],
    sha: &str,
) -> Option<(usize, &'h state::Record)> {
    history
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, line)| match line {
            Ok(record) if record.unit_sha256 == sha => Some((i + 1, record)),
            _ => None,
        })
}

/// Under the unit's lock, stops, disables and removes a unit this rollout installed.
async fn remove(
    host: &dyn Host,
    r: &UnitReport,
    spec: &VerifySpec,
    options: &ApplyOptions,
    by: UndoneBy,
) -> Result<Restored, UndoError> {
    let unit = r.unit.clone();
    state::lock(host, &unit, &options.owner, options.lock)
        .await
        .map_err(UndoError::NotLocked)?;
    let restore = Restore {
        host,
        unit: &unit,
        previous: None,
        then: Then::Restart,
        spec,
        label: format!("{} {unit} ({})", r.host, by.name()),
        aside: None,
        beneath: false,
        disable: false,
        expect: None,
    };
    let verifier = ServerVerifier {
        progress: options.progress.as_ref(),
    };
    let removed = restore_and_verify(restore, &verifier).await;
    let _ = state::unlock(host, &unit).await;
    removed.map_err(UndoError::NotRemoved)
}

/// An apply target whose desired unit is `text`, a saved one, from the manifest at `source` whose
/// digest was `digest` when that unit was applied. Preflight reads the Python, model path and port
/// from the restored unit itself, not from a manifest that may have moved on.
pub(crate) fn saved_target(
    host: &str,
    unit: &str,
    text: String,
    source: &str,
    digest: &str,
    manifest: Option<&Manifest>,
) -> Target {
    let model = parse_unit(&text);
    let (command, unit_flags) = flags(&model.exec_start);
    let service = unit.strip_suffix(".service").unwrap_or(unit).to_string();
    let mut m = manifest.cloned().unwrap_or_else(|| Manifest {
        source: source.to_string(),
        digest: digest.to_string(),
        text: String::new(),
        service,
        description: None,
        secret_env: Vec::new(),
        hosts: vec![HostSpec {
            name: host.to_string(),
            ..HostSpec::default()
        }],
        sglang: SglangSpec {
            python: String::new(),
            console_script: None,
            version: String::new(),
            model_path: String::new(),
            served_model_name: None,
            pinned: None,
            host: None,
            port: 30000,
            flags: Default::default(),
        },
        env: Default::default(),
        references: Vec::new(),
        systemd: Default::default(),
        verify: VerifySpec::default(),
        router: None,
        rollout: None,
        group: None,
        drain: None,
        dropins: Default::default(),
        apply: Default::default(),
    });
    // A rollback restarts onto the saved unit: never a live change.
    m.apply.live = false;
    // The restored unit's own entry point: `<script> serve`, or `<python> -m ...`.
    match (console_script(&model.exec_start), command.first()) {
        (Some(script), _) => m.sglang.console_script = Some(script.clone()),
        (None, Some(python)) => {
            m.sglang.python = python.clone();
            m.sglang.console_script = None;
        }
        (None, None) => {}
    }
    if let Some(path) = unit_flags.get("model-path") {
        m.sglang.model_path = path.clone();
    }
    if let Some(port) = unit_flags.get("port").and_then(|p| p.parse().ok()) {
        m.sglang.port = port;
    }
    m.sglang.served_model_name = unit_flags.get("served-model-name").cloned();
    Target {
        host: host.to_string(),
        source: source.to_string(),
        verify: m.verify.clone(),
        manifest_digest: digest.to_string(),
        desired: Desired {
            unit: unit.to_string(),
            text,
            model,
            dropins: m.dropins,
            sglang_version: m.sglang.version.clone(),
            live: false,
            // The saved unit names its own secrets file, still on the host.
            secrets: None,
        },
        manifest: Arc::new(m),
        conflicts: Vec::new(),
        labels: Default::default(),
        expected: None,
        group: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_runs_the_kept_unit_and_preflight_reads_it() {
        let text = "[Service]\nExecStart=/opt/py -m sglang.launch_server --model-path /m/old --port 31000\n";
        let t = saved_target(
            "gpu-a",
            "s.service",
            text.into(),
            "manifests/s.yaml",
            "abc",
            None,
        );
        assert_eq!(t.desired.text, text);
        assert_eq!(t.manifest_digest, "abc");
        let want = crate::preflight::Want::of(&t);
        assert_eq!(
            (want.python.as_str(), want.model_path.as_str(), want.port),
            ("/opt/py", "/m/old", 31000)
        );
        assert_eq!(t.verify, VerifySpec::default());
    }

    fn record(sha: &str, commit: &str) -> state::Record {
        state::Record {
            unit_sha256: sha.into(),
            git_commit: Some(commit.into()),
            ..state::Record::default()
        }
    }

    #[test]
    fn the_deployment_restored_is_the_newest_that_installed_the_kept_unit() {
        let history = vec![
            Ok(record("a", "first")),
            Ok(record("b", "second")),
            Err(state::RecordProblem::Unparsable("EOF".into())),
            Ok(record("a", "third")),
            Ok(record("c", "fourth")),
        ];
        let (n, r) = recorded(&history, "a").expect("found");
        assert_eq!((n, r.git_commit.as_deref()), (4, Some("third")));
        assert_eq!(recorded(&history, "z").map(|(n, _)| n), None);
    }
}
