//! Why a unit was not applied, or what went wrong while it was: one variant per cause, so a JSON
//! consumer can match the report's `error` (an [`ApplyErrorKind`]) instead of parsing `detail`.
//!
//! `Display` is the text the report's `detail` has carried all along (integration tests and
//! dashboards read it), so each message here is the byte-exact wording apply always used. Where a
//! unit's detail goes on after the error (what was put back, how the rollback went), the error is
//! the detail's first part.

use serde::Serialize;

use crate::verify::Stage;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The host could not be reached; nothing was changed.
    #[error("{0}")]
    Unreachable(String),
    /// The unit's file or systemd state could not be read.
    #[error("{0}")]
    ObserveFailed(String),
    /// A plan file's unit: the host no longer has what the plan was made against.
    #[error("nothing was changed: {0}")]
    PlanStale(String),
    /// A plan file's unit: the host could not be asked whether it still matches the plan.
    #[error("nothing was changed: the plan could not be checked: {0}")]
    PlanCheckFailed(String),
    /// The unit's deployment record exists but cannot be read or parsed.
    #[error("nothing was changed: {0}")]
    RecordUnreadable(String),
    /// Preflight found that the host cannot run the unit (each finding's message).
    #[error("preflight failed, nothing was changed: {}", .0.join("; "))]
    PreflightFailed(Vec<String>),
    #[error("preflight could not run: {0}")]
    PreflightCouldNotRun(String),
    /// The pinned weights (`sglang.model:`) could not be fetched or verified on the host; the
    /// old server was not touched.
    #[error("the pinned weights are not on the host, nothing was changed: {0}")]
    FetchFailed(String),
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
    #[error("{0}")]
    LockFailed(String),
    /// Keeping the previous unit, writing the new one or daemon-reload failed.
    #[error("installing failed: {0}")]
    InstallFailed(String),
    #[error("restart failed: {0}")]
    RestartFailed(String),
    /// The running server did not take a live change (`apply.live`).
    #[error("the live change failed: {0}")]
    LiveFailed(String),
    /// A drain before the restart did not see the server idle (or could not see it at all), and
    /// the manifest says `drain.on_timeout: refuse`: the old server keeps running.
    #[error("{0}")]
    DrainRefused(String),
    /// A stage of the new unit's verification failed.
    #[error("{stage} failed: {reason}")]
    VerificationFailed { stage: Stage, reason: String },
    /// Putting the previous unit back failed, or the restored unit failed verification. The text is
    /// the whole detail: what failed first, then how the rollback failed.
    #[error("{0}")]
    RollbackFailed(String),
    /// A signal arrived before the host's turn.
    #[error("interrupted before this host's turn")]
    InterruptedBeforeHost,
    /// A signal arrived before this unit's turn (why the run is stopping).
    #[error("not started: {0}")]
    Interrupted(String),
    /// The rollout stopped before this host's turn (the canary or the failure budget).
    #[error("not started: {0}")]
    NotStarted(String),
    /// Refused before its host was touched, for a reason found elsewhere (a manifest conflict, a
    /// deployment that cannot be restored).
    #[error("nothing was changed: {0}")]
    Refused(String),
    /// The router could not be reached or did not take the replica back.
    #[error("{0}")]
    Router(String),
    /// systemd runs more than the managed unit (a drop-in, a mask, a unit file elsewhere) and the
    /// manifest does not say to move it aside: each reason, then the fix.
    #[error("nothing was changed: {}", .0.join("; "))]
    Overridden(Vec<String>),
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
            ApplyError::Refused(_) => K::Refused,
            ApplyError::Router(_) => K::RouterFailed,
            ApplyError::Overridden(_) => K::OverriddenOnHost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ApplyError::PlanCheckFailed("x".into()).to_string(),
            "nothing was changed: the plan could not be checked: x"
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
            ApplyError::RestartFailed("boom".into()).to_string(),
            "restart failed: boom"
        );
        assert_eq!(
            ApplyError::NotStarted("why".into()).to_string(),
            "not started: why"
        );
        assert_eq!(locked.kind(), ApplyErrorKind::Locked);
        assert_eq!(
            serde_json::to_string(&ApplyErrorKind::PreflightCouldNotRun).unwrap(),
            "\"preflight_could_not_run\""
        );
    }
}
