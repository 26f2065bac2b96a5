//! One apply of one server as a state machine, without hosts or clocks: which step comes next,
//! given how the last one went. A server is a group of ranks, one unit on one host each; a single
//! server is a group of one, so every apply (a replica, a rank, `reconcile rollback`, an
//! experiment's variant) takes this one path. The driver (the binary's `apply::pipeline`) carries
//! each step out on every rank and reports back with [`Transaction::went`].
//!
//! The order is the promise: nothing changes before every rank passed preflight and is locked;
//! the drain comes before any file changes; every guard is armed before its rank's new file is
//! written, so no new file is ever on a host with nobody watching it (should this process die
//! between the two, a reboot would start it unverified); a failure before the restart puts the
//! files back and leaves the servers alone; a failure after it rolls every rank back (a rollback
//! costs a full load, so only then). A unit the host's guard let stand unconfirmed is verified as it
//! runs, never rewritten or restarted.

use crate::plan::Verdict;

/// What the apply does to the server, decided from the ranks' plans before the first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A change systemd takes with `daemon-reload`: the server keeps serving.
    ReloadOnly,
    /// A new unit, or one whose change restarts the server.
    Restart,
    /// A change the running server takes without a restart (`crate::live`): written, armed,
    /// told live, verified as it runs; a failure puts the previous weights or values back live,
    /// and only if that fails is the previous unit restarted.
    Live,
    /// The unit runs already, let stand unconfirmed by the host's guard after its apply died: armed,
    /// verified as it runs and confirmed, or rolled back if it fails.
    Confirm,
}

impl Kind {
    /// The kind for a server whose ranks do `verdict` together (`group::group_verdict`);
    /// `confirm` when every rank is a unit its guard let stand. `None`: nothing to do.
    pub fn of(verdict: Verdict, confirm: bool) -> Option<Kind> {
        match verdict {
            Verdict::NoChange => None,
            Verdict::ReloadOnly => Some(Kind::ReloadOnly),
            Verdict::Live if confirm => Some(Kind::Confirm),
            Verdict::Live => Some(Kind::Live),
            Verdict::Restart | Verdict::Install if confirm => Some(Kind::Confirm),
            Verdict::Restart | Verdict::Install => Some(Kind::Restart),
        }
    }
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Every rank's pinned weights on its host, fetched and checked (`crate::pinned`; a change
    /// of no server), preflight on every rank (and the rendezvous port on rank 0), then every
    /// rank's lock. Stopped here, nothing was changed.
    Prepare,
    /// Every rank's weights read into its host's page cache while the old server serves
    /// (`crate::preload`). It only saves time: it never stops the apply (a signal during it is seen
    /// at [`Step::Arm`]).
    Preload,
    /// Rank 0, the server's API, drained when the manifest asks (`drain:`).
    Drain,
    /// Every rank's new unit written and loaded (`daemon-reload`); for a restart or a live
    /// change, under the guard armed just before. The last moment a signal stops the apply
    /// without a restart.
    Write,
    /// A reload-only change took: recorded, the server untouched.
    RecordReload,
    /// Every rank's previous unit saved and its guard armed on its host, before the new file is
    /// written and before any server stops.
    Arm,
    /// Every rank stopped and started in SGLang's order.
    Restart,
    /// The running server told the change (`/update_weights_from_disk`, `/set_internal_state`).
    Live,
    /// Every rank verified at once, under its guard's lease.
    Verify,
    /// Rank 0's throughput and quality gates.
    Gates,
    /// Passed: every guard disarmed, every deployment recorded.
    Confirm,
    /// Nothing restarted yet: every previous file put back, the servers left as they run.
    PutBack,
    /// A live change failed: the previous weights or values told back live, the previous unit
    /// file put back (`daemon-reload`), the server verified as it runs, the guards disarmed.
    LiveBack,
    /// Every rank's previous unit back, restarted in order and verified.
    RollBack,
    Done(End),
}

impl Step {
    /// The step's name in snake case, as the crash matrix's fail points name it.
    pub fn name(self) -> &'static str {
        match self {
            Step::Prepare => "prepare",
            Step::Preload => "stage",
            Step::Drain => "drain",
            Step::Write => "write",
            Step::RecordReload => "record_reload",
            Step::Arm => "arm",
            Step::Restart => "restart",
            Step::Live => "live",
            Step::Verify => "verify",
            Step::Gates => "gates",
            Step::Confirm => "confirm",
            Step::PutBack => "put_back",
            Step::LiveBack => "live_back",
            Step::RollBack => "roll_back",
            Step::Done(_) => "done",
        }
    }
}

/// How a step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Went {
    Passed,
    /// Stopped before it changed anything on this step (a refusal, a drain that timed out, a
    /// signal before the restart).
    Stopped,
    /// Failed after it changed something (a file written, a server restarted).
    Failed,
}

/// How the apply ended, as the steps it took tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// Stopped before anything changed.
    Refused,
    Reloaded,
    Converged,
    /// The files were put back before any restart.
    PutBack,
    /// A live change failed and was undone live: the server was never restarted.
    LivedBack,
    RolledBack,
    /// Verified, then started again before it was confirmed (the host rebooted): not recorded,
    /// and left to the host's guard, still armed, which judges that start.
    LeftToGuard,
}

/// One apply's progress through [`Step`]s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Transaction {
    kind: Kind,
    step: Step,
    /// Guards are armed on the ranks' hosts: the driver disarms them (or its rollback takes them
    /// over) before it is done.
    armed: bool,
}

impl Transaction {
    pub fn new(kind: Kind) -> Transaction {
        Transaction {
            kind,
            step: Step::Prepare,
            armed: false,
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The step to carry out now.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Whether the ranks' guards are armed.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// The current step went `went`: the next step.
    pub fn went(&mut self, went: Went) -> Step {
        use Step::*;
        let confirm = self.kind == Kind::Confirm;
        self.step = match (self.step, went) {
            (Done(end), _) => Done(end),
            (Prepare, Went::Passed) if confirm => Arm,
            (Prepare, Went::Passed) if self.kind == Kind::ReloadOnly => Drain,
            (Prepare, Went::Passed) => Preload,
            (Preload, _) => Drain,
            (Drain, Went::Passed) if self.kind == Kind::ReloadOnly => Write,
            (Drain, Went::Passed) => Arm,
            (Prepare | Drain, _) => Done(End::Refused),
            (Arm, Went::Passed) => {
                self.armed = true;
                if confirm {
                    Verify
                } else {
                    Write
                }
            }
            // A unit let stand unconfirmed was not touched: nothing to put back.
            (Arm, _) if confirm => Done(End::Refused),
            (Arm, _) => PutBack,
            (Write, Went::Passed) => match self.kind {
                Kind::ReloadOnly => RecordReload,
                Kind::Live => Live,
                _ => Restart,
            },
            (Write, _) => PutBack,
            (RecordReload, _) => Done(End::Reloaded),
            (Restart | Live, Went::Passed) => Verify,
            (Verify, Went::Passed) => Gates,
            (Gates, Went::Passed) => Confirm,
            // A live change is undone live first: a rollback costs a full load.
            (Live | Verify | Gates, _) if self.kind == Kind::Live => LiveBack,
            (LiveBack, Went::Passed) => Done(End::LivedBack),
            (Restart | Verify | Gates | Live | LiveBack, _) => RollBack,
            (Confirm, Went::Passed) => Done(End::Converged),
            (Confirm, _) => Done(End::LeftToGuard),
            (PutBack, _) => Done(End::PutBack),
            (RollBack, _) => Done(End::RolledBack),
        };
        self.step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Step::*;

    /// The steps a transaction of `kind` takes when each goes as `went` says (the rest pass).
    fn walk(kind: Kind, went: &[(Step, Went)]) -> Vec<Step> {
        let mut t = Transaction::new(kind);
        let mut steps = vec![t.step()];
        while !matches!(t.step(), Done(_)) {
            let how = went
                .iter()
                .find(|(s, _)| *s == t.step())
                .map_or(Went::Passed, |(_, w)| *w);
            steps.push(t.went(how));
            assert!(steps.len() < 20, "no end: {steps:?}");
        }
        steps
    }

    /// [`walk`], asserting that its last steps are `last`.
    #[track_caller]
    fn walk_to(kind: Kind, went: &[(Step, Went)], last: &[Step]) -> Vec<Step> {
        let steps = walk(kind, went);
        assert_eq!(
            &steps[steps.len() - last.len()..],
            last,
            "{went:?}: {steps:?}"
        );
        steps
    }

    #[test]
    fn a_restart_is_prepared_staged_drained_armed_written_restarted_verified_and_confirmed() {
        assert_eq!(
            walk(Kind::Restart, &[]),
            [
                Prepare,
                Preload,
                Drain,
                Arm,
                Write,
                Restart,
                Verify,
                Gates,
                Confirm,
                Done(End::Converged)
            ]
        );
    }

    #[test]
    fn a_reload_only_change_never_arms_or_restarts() {
        assert_eq!(
            walk(Kind::ReloadOnly, &[]),
            [Prepare, Drain, Write, RecordReload, Done(End::Reloaded)]
        );
    }

    #[test]
    fn a_kept_unit_is_verified_as_it_runs_never_written_drained_or_restarted() {
        let steps = walk(Kind::Confirm, &[]);
        assert_eq!(
            steps,
            [Prepare, Arm, Verify, Gates, Confirm, Done(End::Converged)]
        );
        let failed = walk(Kind::Confirm, &[(Verify, Went::Failed)]);
        assert_eq!(
            failed,
            [Prepare, Arm, Verify, RollBack, Done(End::RolledBack)]
        );
        let unarmed = walk(Kind::Confirm, &[(Arm, Went::Failed)]);
        assert_eq!(unarmed, [Prepare, Arm, Done(End::Refused)]);
    }

    #[test]
    fn staging_only_saves_time_it_never_stops_the_apply() {
        for went in [Went::Stopped, Went::Failed] {
            let steps = walk(Kind::Restart, &[(Preload, went)]);
            assert_eq!(steps[..3], [Prepare, Preload, Drain], "{went:?}");
            assert_eq!(steps.last(), Some(&Done(End::Converged)));
        }
    }

    #[test]
    fn a_refusal_before_the_write_changes_nothing() {
        for step in [Prepare, Drain] {
            let steps = walk(Kind::Restart, &[(step, Went::Stopped)]);
            assert_eq!(steps.last(), Some(&Done(End::Refused)), "{step:?}");
            assert!(!steps.contains(&Write), "{step:?}: {steps:?}");
        }
    }

    #[test]
    fn before_the_restart_files_are_put_back_and_the_server_left_alone() {
        for (step, went) in [
            (Write, Went::Failed),
            (Write, Went::Stopped),
            (Arm, Went::Failed),
            (Arm, Went::Stopped),
        ] {
            let steps = walk_to(
                Kind::Restart,
                &[(step, went)],
                &[PutBack, Done(End::PutBack)],
            );
            assert!(!steps.contains(&Restart) && !steps.contains(&RollBack));
        }
    }

    #[test]
    fn after_the_restart_any_failure_rolls_back_once() {
        for step in [Restart, Verify, Gates] {
            let steps = walk_to(
                Kind::Restart,
                &[(step, Went::Failed)],
                &[RollBack, Done(End::RolledBack)],
            );
            assert_eq!(steps.iter().filter(|s| **s == RollBack).count(), 1);
            assert!(!steps.contains(&Confirm) && !steps.contains(&PutBack));
        }
    }

    #[test]
    fn a_live_change_is_armed_before_the_server_is_told_and_never_restarts_when_it_passes() {
        let steps = walk(Kind::Live, &[]);
        assert_eq!(
            steps,
            [
                Prepare,
                Preload,
                Drain,
                Arm,
                Write,
                Live,
                Verify,
                Gates,
                Confirm,
                Done(End::Converged)
            ]
        );
    }

    #[test]
    fn a_failed_live_change_is_undone_live_and_restarts_only_when_that_fails() {
        for (step, went) in [
            (Live, Went::Stopped),
            (Live, Went::Failed),
            (Verify, Went::Failed),
            (Gates, Went::Failed),
        ] {
            let steps = walk_to(
                Kind::Live,
                &[(step, went)],
                &[LiveBack, Done(End::LivedBack)],
            );
            assert!(!steps.contains(&Restart) && !steps.contains(&RollBack));
            walk_to(
                Kind::Live,
                &[(step, went), (LiveBack, Went::Failed)],
                &[LiveBack, RollBack, Done(End::RolledBack)],
            );
        }
        // Before the server is told, the files go back as for a restart.
        walk_to(
            Kind::Live,
            &[(Write, Went::Stopped)],
            &[PutBack, Done(End::PutBack)],
        );
    }

    #[test]
    fn guards_are_armed_from_the_arm_step_on_before_any_file_is_written() {
        for kind in [Kind::Restart, Kind::Live] {
            let mut t = Transaction::new(kind);
            for _ in 0..3 {
                assert!(!t.armed(), "{:?}", t.step());
                assert_ne!(t.step(), Write);
                t.went(Went::Passed);
            }
            assert_eq!(t.step(), Arm);
            assert_eq!(t.went(Went::Passed), Write);
            assert!(t.armed());
        }
        let mut unarmed = Transaction::new(Kind::Restart);
        for _ in 0..3 {
            unarmed.went(Went::Passed);
        }
        assert_eq!(unarmed.went(Went::Stopped), PutBack);
        assert!(!unarmed.armed());
    }

    #[test]
    fn a_server_started_again_before_its_confirm_is_left_to_its_guard() {
        let steps = walk_to(
            Kind::Restart,
            &[(Confirm, Went::Failed)],
            &[Confirm, Done(End::LeftToGuard)],
        );
        assert!(!steps.contains(&RollBack));
    }

    #[test]
    fn a_finished_transaction_stays_finished() {
        let mut t = Transaction::new(Kind::Restart);
        t.went(Went::Stopped);
        assert_eq!(t.went(Went::Passed), Done(End::Refused));
    }

    #[test]
    fn the_kind_follows_the_servers_verdict() {
        assert_eq!(Kind::of(Verdict::NoChange, false), None);
        assert_eq!(Kind::of(Verdict::ReloadOnly, true), Some(Kind::ReloadOnly));
        assert_eq!(Kind::of(Verdict::Restart, false), Some(Kind::Restart));
        assert_eq!(Kind::of(Verdict::Install, false), Some(Kind::Restart));
        assert_eq!(Kind::of(Verdict::Restart, true), Some(Kind::Confirm));
        assert_eq!(Kind::of(Verdict::Live, false), Some(Kind::Live));
    }
}
