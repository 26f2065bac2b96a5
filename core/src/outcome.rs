//! How an apply of a unit ended: what reports, agents' rounds, deployment records and metrics
//! call it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing differed; nothing was touched.
    Unchanged,
    /// The unit was replaced and systemd reloaded; the server kept running.
    Reloaded,
    /// The unit was replaced and the server restarted and passed every stage.
    Converged,
    /// Not started: the run was interrupted before this host's turn.
    NotStarted,
    /// Nothing was changed because of an error (unreachable, locked, unreadable).
    Error,
    /// Verification failed; the previous unit runs again and passed verification.
    RolledBack,
    /// Verification failed and so did the rollback: the host needs attention.
    RollbackFailed,
}

impl Outcome {
    /// Every outcome, in declaration order: the state set of `reconcile_last_outcome`.
    pub const ALL: [Outcome; 7] = [
        Outcome::Unchanged,
        Outcome::Reloaded,
        Outcome::Converged,
        Outcome::NotStarted,
        Outcome::Error,
        Outcome::RolledBack,
        Outcome::RollbackFailed,
    ];

    /// The name reports and metrics give it: its JSON spelling (`rolled_back`).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Unchanged => "unchanged",
            Outcome::Reloaded => "reloaded",
            Outcome::Converged => "converged",
            Outcome::NotStarted => "not_started",
            Outcome::Error => "error",
            Outcome::RolledBack => "rolled_back",
            Outcome::RollbackFailed => "rollback_failed",
        }
    }

    /// The outcome a deployment record names, whose `outcome` stays text on the host.
    pub fn from_name(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.name() == name)
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Unchanged | Outcome::Reloaded | Outcome::Converged => 0,
            Outcome::Error | Outcome::NotStarted => 1,
            Outcome::RolledBack => 3,
            Outcome::RollbackFailed => 4,
        }
    }
}

/// `apply`'s exit code when a canary's bake could not judge it and the rollout paused: the
/// canary runs the new unit, the rest the old, and an operator decides.
pub const PAUSED_EXIT_CODE: u8 = 5;

/// `apply`'s exit code: the worst unit's (0, 1, 3, 4), or [`PAUSED_EXIT_CODE`] when the
/// rollout paused and nothing was rolled back (its hosts not started are the pause, not errors).
pub fn apply_exit_code(outcomes: impl IntoIterator<Item = Outcome>, paused: bool) -> u8 {
    let worst = outcomes
        .into_iter()
        .map(Outcome::exit_code)
        .max()
        .unwrap_or(0);
    if paused && worst < Outcome::RolledBack.exit_code() {
        PAUSED_EXIT_CODE
    } else {
        worst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_is_its_own_exit_code_unless_something_was_rolled_back() {
        let paused = [Outcome::Converged, Outcome::NotStarted];
        assert_eq!(apply_exit_code(paused, true), 5);
        assert_eq!(apply_exit_code(paused, false), 1);
        assert_eq!(
            apply_exit_code([Outcome::RolledBack, Outcome::NotStarted], true),
            3
        );
        assert_eq!(apply_exit_code([], false), 0);
    }

    #[test]
    fn an_outcomes_name_is_its_json_and_reads_back() {
        for o in Outcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), o.name());
            assert_eq!(Outcome::from_name(o.name()), Some(o));
        }
        assert_eq!(Outcome::from_name("rolled back"), None);
    }
}
