//! The rollout's order of turns as a state machine, without hosts or clocks: which turns go next,
//! which are skipped (and why) once the rollout stops, and whether `--rollback-all` must undo what
//! already converged, in push mode (`reconcile apply`). The driver (the binary's `apply::rollout`) applies each batch and reports back how
//! many of its hosts failed.
//!
//! A turn is a host with work, in the rollout's order. The canary (the first `canary` turns) goes
//! alone and must pass entirely; then batches of `max_parallel` (at least 1). Once the rollout has
//! seen `max_failures` (at least 1) failed hosts, or the canary failed, no new turn starts: the
//! rest are skipped. An unreachable host takes its turn like any other (and fails at it).

use super::Rollout;

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Apply these turns (indices into the turns, ascending) at once, then call
    /// [`Schedule::finished`].
    Apply(Vec<usize>),
    /// These turns never start, for this reason (an unreachable host keeps its own failure).
    Skip {
        turns: Vec<usize>,
        why: String,
    },
    /// The rollout stopped and `--rollback-all` was asked for: roll back what it converged.
    RollBackConverged {
        why: String,
    },
    Done,
}

#[derive(Debug, Clone)]
pub struct Schedule {
    policy: Rollout,
    turns: usize,
    /// The first turn not yet handed out.
    next: usize,
    /// A batch was handed out and its result not yet reported.
    awaiting: bool,
    failed_hosts: usize,
    stopped: Option<String>,
    /// Stopped by [`Schedule::paused`]: what converged stays, even with `--rollback-all`.
    paused: bool,
    rolled_back: bool,
}

impl Schedule {
    pub fn new(policy: Rollout, turns: usize) -> Schedule {
        Schedule {
            policy,
            turns,
            next: 0,
            awaiting: false,
            failed_hosts: 0,
            stopped: None,
            paused: false,
            rolled_back: false,
        }
    }

    /// Whether the next batch is the canary's (or, once handed out, the one under way is).
    pub fn canary_next(&self) -> bool {
        self.next == 0 && self.policy.canary > 0
    }

    pub fn next_step(&mut self) -> Step {
        debug_assert!(
            !self.awaiting,
            "finished() was not called for the last batch"
        );
        if self.next < self.turns {
            let rest = self.next..self.turns;
            if let Some(why) = &self.stopped {
                self.next = self.turns;
                return Step::Skip {
                    turns: rest.collect(),
                    why: why.clone(),
                };
            }
            let size = if self.canary_next() {
                self.policy.canary
            } else {
                self.policy.max_parallel.max(1)
            };
            let end = self.turns.min(self.next + size);
            let batch = (self.next..end).collect();
            self.awaiting = true;
            return Step::Apply(batch);
        }
        match &self.stopped {
            Some(why) if self.policy.rollback_all && !self.rolled_back && !self.paused => {
                self.rolled_back = true;
                Step::RollBackConverged { why: why.clone() }
            }
            _ => Step::Done,
        }
    }

    /// After [`Schedule::finished`]: the batch's canary could not be judged (an inconclusive
    /// bake), so no new turn starts, and what converged stays for the operator to judge, as
    /// Argo Rollouts pauses on an inconclusive analysis. A stop already decided stands.
    pub fn paused(&mut self, why: String) {
        if self.stopped.is_none() {
            self.stopped = Some(why);
            self.paused = true;
        }
    }

    /// The batch last handed out is done; `failed` of its hosts failed.
    pub fn finished(&mut self, failed: usize) {
        let canary = self.canary_next();
        let size = if canary {
            self.policy.canary
        } else {
            self.policy.max_parallel.max(1)
        };
        self.next = self.turns.min(self.next + size);
        self.awaiting = false;
        self.failed_hosts += failed;
        if canary && failed > 0 {
            self.stopped = Some("the canary failed, so the rollout stopped".into());
        } else if self.failed_hosts >= self.policy.max_failures.max(1) {
            self.stopped = Some(format!(
                "{} host(s) failed (max_failures {}), so the rollout stopped",
                self.failed_hosts, self.policy.max_failures
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(canary: usize, max_parallel: usize, max_failures: usize, all: bool) -> Rollout {
        Rollout {
            canary,
            max_parallel,
            max_failures,
            rollback_all: all,
        }
    }

    /// Runs the schedule of `turns` under `policy` to the end; `failed(batch)` says how many
    /// hosts of a batch failed.
    fn run(policy: Rollout, turns: usize, failed: impl Fn(&[usize]) -> usize) -> Vec<Step> {
        let mut s = Schedule::new(policy, turns);
        let mut steps = Vec::new();
        loop {
            let step = s.next_step();
            if let Step::Apply(batch) = &step {
                s.finished(failed(batch));
            }
            let done = step == Step::Done;
            steps.push(step);
            if done || steps.len() > 100 {
                return steps;
            }
        }
    }

    /// `failed` for a run in which only the host of `turn` fails.
    fn only(turn: usize) -> impl Fn(&[usize]) -> usize {
        move |batch| usize::from(batch.contains(&turn))
    }

    fn apply(turns: &[usize]) -> Step {
        Step::Apply(turns.to_vec())
    }

    #[test]
    fn no_turns_is_done_at_once_even_with_rollback_all() {
        assert_eq!(run(policy(1, 2, 1, true), 0, |_| 0), [Step::Done]);
    }

    #[test]
    fn without_a_canary_batches_are_max_parallel_and_at_least_one() {
        assert_eq!(
            run(policy(0, 2, 1, false), 5, |_| 0),
            [apply(&[0, 1]), apply(&[2, 3]), apply(&[4]), Step::Done]
        );
        assert_eq!(
            run(policy(0, 0, 1, false), 2, |_| 0),
            [apply(&[0]), apply(&[1]), Step::Done]
        );
    }

    #[test]
    fn a_canary_that_passes_goes_alone_then_batches_follow() {
        assert_eq!(
            run(policy(2, 3, 1, false), 6, |_| 0),
            [apply(&[0, 1]), apply(&[2, 3, 4]), apply(&[5]), Step::Done]
        );
        // A canary larger than the fleet is the whole fleet.
        assert_eq!(
            run(policy(5, 3, 1, false), 2, |_| 0),
            [apply(&[0, 1]), Step::Done]
        );
    }

    #[test]
    fn a_failed_canary_skips_every_other_host() {
        let why = "the canary failed, so the rollout stopped".to_string();
        // Even with a budget the canary's failure does not reach.
        assert_eq!(
            run(policy(1, 2, 5, false), 4, only(0)),
            [
                apply(&[0]),
                Step::Skip {
                    turns: vec![1, 2, 3],
                    why
                },
                Step::Done
            ]
        );
    }

    #[test]
    fn the_failure_budget_stops_the_rollout_mid_way() {
        // Turns 1 and 3 fail (unreachable hosts count the same: the driver reports them failed).
        let failed = |b: &[usize]| b.iter().filter(|i| [1, 3].contains(*i)).count();
        assert_eq!(
            run(policy(0, 2, 2, false), 7, failed),
            [
                apply(&[0, 1]),
                apply(&[2, 3]),
                Step::Skip {
                    turns: vec![4, 5, 6],
                    why: "2 host(s) failed (max_failures 2), so the rollout stopped".into()
                },
                Step::Done
            ]
        );
        // A budget of 0 is a budget of 1, and the message says what was asked.
        assert_eq!(
            run(policy(0, 1, 0, false), 3, only(0)),
            [
                apply(&[0]),
                Step::Skip {
                    turns: vec![1, 2],
                    why: "1 host(s) failed (max_failures 0), so the rollout stopped".into()
                },
                Step::Done
            ]
        );
    }

    #[test]
    fn a_batch_can_overshoot_the_budget_and_the_count_says_so() {
        assert_eq!(
            run(policy(1, 3, 2, false), 5, |b| b
                .iter()
                .filter(|i| **i > 0)
                .count()),
            [
                apply(&[0]),
                apply(&[1, 2, 3]),
                Step::Skip {
                    turns: vec![4],
                    why: "3 host(s) failed (max_failures 2), so the rollout stopped".into()
                },
                Step::Done
            ]
        );
    }

    #[test]
    fn the_budget_reached_by_the_last_batch_skips_nothing_but_still_rolls_back() {
        let why = "1 host(s) failed (max_failures 1), so the rollout stopped".to_string();
        assert_eq!(
            run(policy(0, 2, 1, true), 2, |_| 1),
            [apply(&[0, 1]), Step::RollBackConverged { why }, Step::Done]
        );
    }

    #[test]
    fn rollback_all_only_when_the_rollout_stopped() {
        assert_eq!(
            run(policy(1, 1, 1, true), 3, only(0)),
            [
                apply(&[0]),
                Step::Skip {
                    turns: vec![1, 2],
                    why: "the canary failed, so the rollout stopped".into()
                },
                Step::RollBackConverged {
                    why: "the canary failed, so the rollout stopped".into()
                },
                Step::Done
            ]
        );
        // Failures under the budget do not stop the rollout: nothing is rolled back.
        assert_eq!(
            run(policy(0, 1, 3, true), 3, only(1)),
            [apply(&[0]), apply(&[1]), apply(&[2]), Step::Done]
        );
        // Stopped, without --rollback-all: done after the skipped hosts.
        assert_eq!(
            run(policy(1, 1, 1, false), 2, |_| 1),
            [
                apply(&[0]),
                Step::Skip {
                    turns: vec![1],
                    why: "the canary failed, so the rollout stopped".into()
                },
                Step::Done
            ]
        );
    }

    #[test]
    fn done_stays_done() {
        let mut s = Schedule::new(policy(0, 1, 1, true), 0);
        assert_eq!(s.next_step(), Step::Done);
        assert_eq!(s.next_step(), Step::Done);
    }

    #[test]
    fn an_inconclusive_canary_pauses_the_rollout_and_keeps_what_converged() {
        let mut s = Schedule::new(policy(1, 2, 1, true), 4);
        assert_eq!(s.next_step(), apply(&[0]));
        s.finished(0);
        s.paused("could not judge".into());
        assert_eq!(
            s.next_step(),
            Step::Skip {
                turns: vec![1, 2, 3],
                why: "could not judge".into()
            }
        );
        // Not rolled back, even with --rollback-all: the operator decides.
        assert_eq!(s.next_step(), Step::Done);
        // A failed canary's stop stands.
        let mut s = Schedule::new(policy(1, 2, 1, false), 2);
        s.next_step();
        s.finished(1);
        s.paused("could not judge".into());
        assert!(
            matches!(s.next_step(), Step::Skip { why, .. } if why.starts_with("the canary failed"))
        );
    }
}
