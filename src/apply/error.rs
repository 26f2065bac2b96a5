//! Why a unit was not applied, or what went wrong while it was: one variant per cause, so a JSON
//! consumer can match the report's `error` (an [`ApplyErrorKind`]) instead of parsing `detail`.
//!
//! `Display` is the text the report's `detail` has carried all along (integration tests and
//! dashboards read it), so each message here is the byte-exact wording apply always used. Where a
//! unit's detail goes on after the error (what was put back, how the rollback went), the error is
//! the detail's first part. The cause a variant stands for is kept whole (as its `source`) until
//! the report writes it; the kind and the words both come from the variant, never from text.
//! Sources sit behind an `Arc`: one host's failure is the error of each of its units. A message
//! writes its cause's own chain (`error_chain`), as the detail always had it, so the detail is
//! `to_string()`, never an `error_chain` of these, which would walk the causes a second time.

use std::sync::Arc;

use reconcile_core::record::RecordError;
use serde::Serialize;

use super::live::TellError;
use crate::pinned::PinnedError;
use crate::remote::{error_chain, RemoteError};
use crate::router::RouterError;
use crate::verify::Stage;

/// The cause's text with its own causes after it, as the detail has always read.
fn chain<E: std::error::Error + 'static>(e: &Arc<E>) -> String {
    error_chain(&**e)
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApplyError {
    /// The host could not be reached; nothing was changed.
    #[error("{}", chain(.0))]
    Unreachable(#[source] Arc<RemoteError>),
    /// The unit's file or systemd state could not be read.
    #[error("{}", chain(.0))]
    ObserveFailed(#[source] Arc<RemoteError>),
    /// A plan file's unit: the host no longer has what the plan was made against. Each way it
    /// differs, in words (`plan_file`'s staleness), joined: prose, not a cause.
    #[error("nothing was changed: {0}")]
    PlanStale(String),
    /// A plan file's unit: the host could not be asked whether it still matches the plan.
    #[error("nothing was changed: the plan could not be checked: {}", chain(.0))]
    PlanCheckFailed(#[source] Arc<RemoteError>),
    /// The unit's deployment record exists but cannot be read or parsed.
    #[error("nothing was changed: {0}")]
    RecordUnreadable(#[source] Arc<RecordError>),
    /// Preflight found that the host cannot run the unit (each finding's message).
    #[error("preflight failed, nothing was changed: {}", .0.join("; "))]
    PreflightFailed(Vec<String>),
    /// The host could not be asked what preflight checks.
    #[error("preflight could not run: {}", chain(.0))]
    PreflightCouldNotRun(#[source] Arc<RemoteError>),
    /// The pinned weights (`sglang.model:`) could not be fetched or verified on the host; the
    /// old server was not touched.
    #[error("the pinned weights are not on the host, nothing was changed: {}", chain(.0))]
    FetchFailed(#[source] Arc<PinnedError>),
    /// Another run holds the unit's lock.
    #[error("{unit} on {host} is locked by another apply ({holder}); if that run is dead, rerun with --break-stale-lock")]
    Locked {
        unit: String,
        host: String,
        holder: String,
    },
    /// A stale lock was broken, and the lock was taken by someone else before this run got it.
    #[error("{unit} on {host}: could not take the lock")]
    LockNotTaken { unit: String, host: String },
    /// The host failed while the lock was being taken.
    #[error("{}", chain(.0))]
    LockFailed(#[source] Arc<RemoteError>),
    /// Keeping the previous unit, arming the guard, writing the new one or daemon-reload failed.
    #[error("installing failed: {0}")]
    InstallFailed(#[source] InstallFailure),
    /// The new unit could not be started, or not under a guard that holds.
    #[error("restart failed: {0}")]
    RestartFailed(#[source] RestartFailure),
    /// The running server did not take a live change (`apply.live`).
    #[error("the live change failed: {0}")]
    LiveFailed(#[source] LiveFailure),
    /// A drain before the restart did not see the server idle (or could not see it at all), and
    /// the manifest says `drain.on_timeout: refuse`: the old server keeps running. The drain's
    /// own account of what it saw (its report's detail), not an error of its own.
    #[error("{0}")]
    DrainRefused(String),
    /// A stage of the new unit's verification failed.
    #[error("{stage} failed: {reason}")]
    VerificationFailed { stage: Stage, reason: String },
    /// Putting the previous unit back failed, or the restored unit failed verification. The text is
    /// the whole detail: what failed first, then how the rollback failed, composed by `decide`
    /// from the outcomes of several steps; no one cause stands for it.
    #[error("{0}")]
    RollbackFailed(String),
    /// A signal arrived before the host's turn.
    #[error("interrupted before this host's turn")]
    InterruptedBeforeHost,
    /// A signal arrived before this unit's turn (why the run is stopping, in the signals
    /// module's words).
    #[error("not started: {0}")]
    Interrupted(String),
    /// The rollout stopped before this host's turn (the canary or the failure budget): the
    /// rollout's words for why.
    #[error("not started: {0}")]
    NotStarted(String),
    /// Refused before its host was touched, for a reason found elsewhere (a manifest conflict, a
    /// deployment that cannot be restored), in that place's words.
    #[error("nothing was changed: {0}")]
    Refused(String),
    /// Another rank of the server group was refused, so none of it is applied.
    #[error("nothing was changed: the server group is applied whole, and its rank {rank} ({host}) was refused: {source}")]
    PeerRefused {
        rank: usize,
        host: String,
        source: Box<ApplyError>,
    },
    /// The router could not be reached or did not take the replica back.
    #[error("{0}")]
    Router(#[source] RouterFailure),
    /// systemd runs more than the managed unit (a drop-in, a mask, a unit file elsewhere) and the
    /// manifest does not say to move it aside: each reason, then the fix.
    #[error("nothing was changed: {}", .0.join("; "))]
    Overridden(Vec<String>),
}

/// Why a guard could not be armed.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// The guard program is not beside reconcile, or cannot be read.
    #[error("cannot read the guard program {} (reconcile-guard is built and installed beside reconcile)", path.display())]
    Program {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The guard of a run that died is still at work on the unit.
    #[error("the host's guard of the apply by {armed_by} at {armed_at} is still at work ({state}): nothing was changed; apply again once it settles (within its deadline)")]
    Busy {
        armed_by: String,
        armed_at: String,
        state: &'static str,
    },
    /// The unit to confirm is no longer the one the host's guard let stand: it acted since the plan.
    #[error("the host's guard acted since this run planned (its record is {state} now): nothing to confirm; plan again")]
    Moved { state: &'static str },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// A host's guard that no longer holds for this run: no step that needs it goes on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the guard on {host} does not hold for this run, {why}")]
pub struct GuardNotHeld {
    pub host: String,
    #[source]
    pub why: GuardLost,
}

/// Why a guard does not hold.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GuardLost {
    /// Its lease ran out and it acted on its own.
    #[error("it acted already (its lease ran out while this run could not reach the host)")]
    Acted,
    /// It could not be asked.
    #[error("it could not be reached: {}", chain(.0))]
    Unreachable(#[source] Arc<RemoteError>),
}

/// Why the new unit was not installed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InstallFailure {
    /// A guard stopped holding before the write: nothing was written.
    #[error("nothing was written: {0}")]
    NotWritten(#[source] GuardNotHeld),
    /// Keeping the previous unit, writing the new one or daemon-reload failed on the host.
    #[error("{}", chain(.0))]
    Host(#[source] Arc<RemoteError>),
    /// A server of one's guard could not be armed.
    #[error("the host's guard could not be armed: {}", chain(.0))]
    NotArmed(#[source] Arc<ArmError>),
    /// A group's rank's guard could not be armed.
    #[error("the host's guard could not be armed on rank {rank} ({host}): {}", chain(.source))]
    RankNotArmed {
        rank: usize,
        host: String,
        source: Arc<ArmError>,
    },
    /// Another rank of the server group could not be installed (this rank's file went back).
    #[error("rank {rank} ({host}) of the server group could not be installed: {source}")]
    Peer {
        rank: usize,
        host: String,
        source: Box<ApplyError>,
    },
}

/// Why the new unit was not (re)started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RestartFailure {
    /// A guard stopped holding before the restart: nothing was restarted.
    #[error("nothing was restarted: {0}")]
    NotRestarted(#[source] GuardNotHeld),
    /// systemd on the host could not stop, enable or start a rank, or say what it started.
    #[error("{}", chain(.0))]
    Host(#[source] Arc<RemoteError>),
}

/// Why the running server did not take its live change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LiveFailure {
    /// A guard stopped holding before the server was told.
    #[error("the server was not told: {0}")]
    NotTold(#[source] GuardNotHeld),
    /// No live change was planned for the server to be told.
    #[error("no live change was planned")]
    NotPlanned,
    /// The server did not take the change, or could not be told it.
    #[error("{0}")]
    Tell(#[source] Arc<TellError>),
    /// systemd could not say which process was told (for verification and the record).
    #[error("{}", chain(.0))]
    Host(#[source] Arc<RemoteError>),
}

/// Why a replica's router failed it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RouterFailure {
    /// The router could not be reached when the run began.
    #[error("{0}")]
    Unreachable(#[source] Arc<crate::router::RouterError>),
    /// The manifest that found the router names no `router:` for the server.
    #[error("{manifest} has no `router:` to take {host} out of {url}")]
    NoSpec {
        manifest: String,
        host: String,
        url: String,
    },
    /// The router failed while the server was being taken out.
    #[error("{0}")]
    TakeOut(#[source] Arc<RouterError>),
    /// A server that converged, which the router did not take back: `detail` is the unit's
    /// detail until then.
    #[error("{detail}; but the router did not take it back: {source}")]
    NotTakenBack {
        detail: String,
        source: Arc<RouterError>,
    },
}

/// The report's `error`: which kind of failure a unit's outcome is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyErrorKind {
    Unreachable,
    ObserveFailed,
    PlanStale,
    PlanCheckFailed,
    RecordUnreadable,
    PreflightFailed,
    PreflightCouldNotRun,
    /// The pinned weights could not be fetched or verified; nothing stopped.
    FetchFailed,
    Locked,
    LockFailed,
    InstallFailed,
    RestartFailed,
    LiveFailed,
    DrainRefused,
    VerificationFailed,
    RollbackFailed,
    Interrupted,
    NotStarted,
    Refused,
    /// Converged, then rolled back by `--rollback-all` because the rollout stopped elsewhere.
    RolloutStopped,
    /// Converged, then rolled back because its bake on live traffic found it worse than the
    /// stable replicas (`verify.bake`).
    BakeFailed,
    /// The router a replica sits behind could not be reached, or did not take it back.
    RouterFailed,
    /// A drop-in, mask or unit file elsewhere on the host that the manifest does not own.
    OverriddenOnHost,
}

impl From<crate::state::LockError> for ApplyError {
    fn from(e: crate::state::LockError) -> Self {
        use crate::state::LockError;
        match e {
            LockError::Held { unit, host, holder } => ApplyError::Locked { unit, host, holder },
            LockError::NotTaken { unit, host } => ApplyError::LockNotTaken { unit, host },
            LockError::Failed(chain) => ApplyError::LockFailed(chain),
        }
    }
}

impl ApplyError {
    pub fn kind(&self) -> ApplyErrorKind {
        use ApplyErrorKind as K;
        match self {
            ApplyError::Unreachable(_) => K::Unreachable,
            ApplyError::ObserveFailed(_) => K::ObserveFailed,
            ApplyError::PlanStale(_) => K::PlanStale,
            ApplyError::PlanCheckFailed(_) => K::PlanCheckFailed,
            ApplyError::RecordUnreadable(_) => K::RecordUnreadable,
            ApplyError::PreflightFailed(_) => K::PreflightFailed,
            ApplyError::PreflightCouldNotRun(_) => K::PreflightCouldNotRun,
            ApplyError::FetchFailed(_) => K::FetchFailed,
            ApplyError::Locked { .. } | ApplyError::LockNotTaken { .. } => K::Locked,
            ApplyError::LockFailed(_) => K::LockFailed,
            ApplyError::InstallFailed(_) => K::InstallFailed,
            ApplyError::RestartFailed(_) => K::RestartFailed,
            ApplyError::LiveFailed(_) => K::LiveFailed,
            ApplyError::DrainRefused(_) => K::DrainRefused,
            ApplyError::VerificationFailed { .. } => K::VerificationFailed,
            ApplyError::RollbackFailed(_) => K::RollbackFailed,
            ApplyError::InterruptedBeforeHost | ApplyError::Interrupted(_) => K::Interrupted,
            ApplyError::NotStarted(_) => K::NotStarted,
            ApplyError::Refused(_) | ApplyError::PeerRefused { .. } => K::Refused,
            ApplyError::Router(_) => K::RouterFailed,
            ApplyError::Overridden(_) => K::OverriddenOnHost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command on gpu-a that failed with `stderr`.
    fn failed(stderr: &str) -> Arc<RemoteError> {
        Arc::new(RemoteError::Failed {
            host: "gpu-a".into(),
            command: "cat".into(),
            status: 1,
            stderr: stderr.into(),
        })
    }

    #[test]
    fn messages_are_the_details_apply_always_wrote() {
        let locked = ApplyError::Locked {
            unit: "s.service".into(),
            host: "gpu-a".into(),
            holder: "me@box pid 7, 3s ago".into(),
        };
        assert_eq!(locked.to_string(), "s.service on gpu-a is locked by another apply (me@box pid 7, 3s ago); if that run is dead, rerun with --break-stale-lock");
        assert_eq!(
            ApplyError::PreflightFailed(vec!["a".into(), "b".into()]).to_string(),
            "preflight failed, nothing was changed: a; b"
        );
        assert_eq!(
            ApplyError::PlanCheckFailed(failed("x")).to_string(),
            "nothing was changed: the plan could not be checked: gpu-a: `cat` exited with 1: x"
        );
        assert_eq!(
            ApplyError::VerificationFailed {
                stage: Stage::Readiness,
                reason: "503".into()
            }
            .to_string(),
            "readiness failed: 503"
        );
        assert_eq!(
            ApplyError::RestartFailed(RestartFailure::Host(failed("boom"))).to_string(),
            "restart failed: gpu-a: `cat` exited with 1: boom"
        );
        assert_eq!(
            ApplyError::NotStarted("why".into()).to_string(),
            "not started: why"
        );
        assert_eq!(locked.kind(), ApplyErrorKind::Locked);
        // A cause's own causes follow it, as `error_chain` has always written them.
        let transport = Arc::new(RemoteError::Transport {
            host: "gpu-a".into(),
            command: "ssh".into(),
            source: "reset by peer".into(),
        });
        let unreachable = ApplyError::Unreachable(transport.clone());
        assert_eq!(
            unreachable.to_string(),
            "gpu-a: `ssh` could not run: reset by peer"
        );
        assert_eq!(unreachable.kind(), ApplyErrorKind::Unreachable);
        assert_eq!(
            ApplyError::LockFailed(transport).to_string(),
            "gpu-a: `ssh` could not run: reset by peer"
        );
        let lost = GuardNotHeld {
            host: "gpu-a".into(),
            why: GuardLost::Acted,
        };
        assert_eq!(
            ApplyError::InstallFailed(InstallFailure::NotWritten(lost.clone())).to_string(),
            "installing failed: nothing was written: the guard on gpu-a does not hold for this run, it acted already (its lease ran out while this run could not reach the host)"
        );
        assert_eq!(
            ApplyError::RestartFailed(RestartFailure::NotRestarted(GuardNotHeld {
                host: "gpu-a".into(),
                why: GuardLost::Unreachable(failed("gone")),
            }))
            .to_string(),
            "restart failed: nothing was restarted: the guard on gpu-a does not hold for this run, it could not be reached: gpu-a: `cat` exited with 1: gone"
        );
        assert_eq!(
            ApplyError::LiveFailed(LiveFailure::NotTold(lost)).to_string(),
            "the live change failed: the server was not told: the guard on gpu-a does not hold for this run, it acted already (its lease ran out while this run could not reach the host)"
        );
        let peer = InstallFailure::Peer {
            rank: 1,
            host: "gpu-b".into(),
            source: Box::new(ApplyError::InstallFailed(InstallFailure::Host(failed(
                "full",
            )))),
        };
        assert_eq!(
            ApplyError::InstallFailed(peer).to_string(),
            "installing failed: rank 1 (gpu-b) of the server group could not be installed: installing failed: gpu-a: `cat` exited with 1: full"
        );
        let no_spec = ApplyError::Router(RouterFailure::NoSpec {
            manifest: "m.yaml".into(),
            host: "gpu-a".into(),
            url: "http://r".into(),
        });
        assert_eq!(
            no_spec.to_string(),
            "m.yaml has no `router:` to take gpu-a out of http://r"
        );
        assert_eq!(no_spec.kind(), ApplyErrorKind::RouterFailed);
        assert_eq!(
            serde_json::to_string(&ApplyErrorKind::PreflightCouldNotRun).unwrap(),
            "\"preflight_could_not_run\""
        );
    }
}
