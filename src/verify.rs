//! Judging a restarted server. The judges are pure predicates over what systemd reports; the
//! poller that feeds them owns the clock, so tests can feed states directly.

use std::time::Duration;

use crate::observed::UnitState;
use crate::remote::{Host, RemoteError};

/// How often systemd is asked during the crash window: well under a second, so a crash is
/// reported moments after it happens rather than at the end of the window.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Why a started service is judged crashed, or `None` while it still looks healthy.
pub fn crash_reason(started: &UnitState, now: &UnitState) -> Option<String> {
    if now.n_restarts > started.n_restarts {
        return Some(format!(
            "systemd restarted it (NRestarts {} -> {}, last exit status {})",
            started.n_restarts, now.n_restarts, now.main_status
        ));
    }
    if !now.invocation_id.is_empty() && now.invocation_id != started.invocation_id {
        return Some("a new invocation started (the process was restarted)".into());
    }
    match (now.active_state.as_str(), now.sub_state.as_str()) {
        ("active", "running") | ("activating", "start") | ("activating", "start-pre") => None,
        ("activating", "auto-restart") => Some(format!(
            "it exited with status {} and waits to restart",
            now.main_status
        )),
        (state, sub) => Some(format!(
            "it is {state} ({sub}) with result {} and exit status {}",
            now.result, now.main_status
        )),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("crashed {after:.1?} after the restart: {reason}")]
    Crashed { after: Duration, reason: String },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// Watches a freshly started unit for `window`; fails at the first sign of a crash.
pub async fn crash_window(
    host: &Host,
    unit: &str,
    window: Duration,
) -> Result<UnitState, VerifyError> {
    let start = tokio::time::Instant::now();
    let started = host.unit_state(unit).await?;
    if let Some(reason) = crash_reason(&started, &started) {
        return Err(VerifyError::Crashed {
            after: start.elapsed(),
            reason,
        });
    }
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        let now = host.unit_state(unit).await?;
        if let Some(reason) = crash_reason(&started, &now) {
            return Err(VerifyError::Crashed {
                after: start.elapsed(),
                reason,
            });
        }
        if start.elapsed() >= window {
            return Ok(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(active: &str, sub: &str, restarts: u32, invocation: &str) -> UnitState {
        UnitState {
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: sub.into(),
            n_restarts: restarts,
            invocation_id: invocation.into(),
            result: "success".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_running_service_is_healthy() {
        let s = state("active", "running", 0, "a");
        assert_eq!(crash_reason(&s, &s), None);
    }

    #[test]
    fn restarts_new_invocations_and_failures_are_crashes() {
        let started = state("active", "running", 0, "a");
        assert!(crash_reason(&started, &state("active", "running", 1, "b"))
            .unwrap()
            .contains("NRestarts 0 -> 1"));
        assert!(crash_reason(&started, &state("active", "running", 0, "b"))
            .unwrap()
            .contains("new invocation"));
        assert!(crash_reason(&started, &state("failed", "failed", 0, "a"))
            .unwrap()
            .contains("failed"));
        assert!(
            crash_reason(&started, &state("activating", "auto-restart", 0, "a"))
                .unwrap()
                .contains("waits to restart")
        );
        assert!(crash_reason(&started, &state("inactive", "dead", 0, "a")).is_some());
    }
}
