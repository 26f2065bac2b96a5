//! Pull mode's turn: what one host's agent does about a change its unit needs a restart for,
//! decided from what every agent of the service wrote to the coordinator (one read) and the
//! service's rollout order, which every agent computes alike from the same commit.
//!
//! The rules, in the order they are applied:
//! 1. A host that failed this change does not try it again: it waits for another change (a new
//!    commit), as push mode would not retry it either, and every retry is a model load.
//! 2. A host whose own earlier attempt was cut off (its agent died mid-way: the entry says
//!    `started` and its slot's lease has run out) finishes it first, as soon as a slot is free:
//!    its unit is installed but not verified, and only a verification (or the rollback a failed
//!    one brings) ends that. The budget already counts the attempt, so it does not stop it.
//! 3. `max_failures` failed hosts (an abandoned attempt counts) stop every host that has not
//!    started: held, their servers as they were.
//! 4. The canary is the first host of the order that has something to do (a host already up to
//!    date proves nothing). Until some host has succeeded with this change, only the canary may
//!    start; a failed canary stops the rollout whatever the budget says.
//!    An agent with work writes its entry (waiting) before it reads, and takes a slot only if no
//!    entry or slot changed since that read, so two hosts that both think they are first cannot
//!    both go.
//! 5. At most `max_parallel` slots are held at once (a slot of an older change still counts: that
//!    host is restarting too).

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::{HostEntry, ServiceLedger, State};
use super::Rollout;

/// What the coordinator holds for one service, as one read saw it.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The change the deciding agent is on.
    pub revision: String,
    /// Each host's latest entry.
    pub hosts: BTreeMap<String, HostEntry>,
    /// The hosts holding a restart slot (their lease is alive).
    pub slots: BTreeSet<String>,
}

impl View {
    /// What a host deciding its turn on `revision` works from: the service's ledger as read.
    pub fn of(ledger: &ServiceLedger, revision: &str) -> View {
        View {
            revision: revision.to_string(),
            hosts: ledger.hosts.clone(),
            slots: ledger.slots.keys().cloned().collect(),
        }
    }

    /// The host's entry, when it is about this change.
    fn on_this(&self, host: &str) -> Option<&HostEntry> {
        self.hosts.get(host).filter(|e| e.revision == self.revision)
    }

    /// Whether the host's attempt at this change was cut off: started, and no slot any more.
    pub fn abandoned(&self, host: &str) -> bool {
        self.on_this(host)
            .is_some_and(|e| e.state == State::Started && !self.slots.contains(host))
    }

    /// Hosts that failed this change, abandoned attempts included, by name.
    pub fn failed(&self) -> Vec<String> {
        self.hosts
            .iter()
            .filter(|(host, e)| {
                e.revision == self.revision && (e.state == State::Failed || self.abandoned(host))
            })
            .map(|(host, _)| host.clone())
            .collect()
    }

    fn state(&self, host: &str) -> Option<State> {
        self.on_this(host).map(|e| e.state)
    }
}

/// What the agent does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Take a slot and apply; `resume`: finishing its own attempt that was cut off.
    Go { resume: bool },
    /// Not yet: ask again later, changing nothing.
    Wait(Wait),
    /// Not this change: report why and keep the running server.
    Stop(Stop),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// The canary has not succeeded yet; its state on this change, `None`: not reported yet.
    Canary { host: String, state: Option<State> },
    /// Every slot is held.
    Slots { holders: Vec<String>, max: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// This host failed this change already.
    FailedHere,
    /// The canary failed this change.
    CanaryFailed { host: String },
    /// The failure budget is spent.
    Budget { failed: Vec<String>, max: usize },
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::Canary { host, state: None } => {
                write!(
                    f,
                    "waiting for the canary {host}, which has not reported this change yet"
                )
            }
            Wait::Canary {
                host,
                state: Some(s),
            } => write!(
                f,
                "waiting for the canary {host} to succeed with this change (it is {})",
                s.name()
            ),
            Wait::Slots { holders, max } => write!(
                f,
                "waiting for a restart slot: {} of {max} held ({})",
                holders.len(),
                holders.join(", ")
            ),
        }
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::FailedHere => write!(
                f,
                "this host failed this change already; it is not retried until the manifests change"
            ),
            Stop::CanaryFailed { host } => {
                write!(
                    f,
                    "the canary {host} failed this change, so the rollout stopped"
                )
            }
            Stop::Budget { failed, max } => write!(
                f,
                "{} host(s) failed this change ({}; max_failures {max}), so the rollout stopped",
                failed.len(),
                failed.join(", ")
            ),
        }
    }
}

/// The turn of `me`, one of the service's hosts in rollout `order` (canary first), under
/// `policy`, from what the coordinator holds.
pub fn decide(me: &str, order: &[&str], policy: &Rollout, view: &View) -> Turn {
    let max_parallel = policy.max_parallel.max(1);
    let slots = |resume| {
        let holders: Vec<String> = view.slots.iter().cloned().collect();
        if holders.len() >= max_parallel {
            Turn::Wait(Wait::Slots {
                holders,
                max: max_parallel,
            })
        } else {
            Turn::Go { resume }
        }
    };
    if view.state(me) == Some(State::Failed) {
        return Turn::Stop(Stop::FailedHere);
    }
    if view.abandoned(me) {
        return slots(true);
    }
    let failed = view.failed();
    let max_failures = policy.max_failures.max(1);
    if failed.len() >= max_failures {
        return Turn::Stop(Stop::Budget {
            failed,
            max: max_failures,
        });
    }
    // The deciding host has something to do whatever its entry says (the agent writes its entry
    // as waiting before it asks, so that two hosts that both have work see each other).
    let canary = order
        .iter()
        .find(|h| **h == me || view.state(h) != Some(State::UpToDate))
        .copied();
    let succeeded = order
        .iter()
        .any(|h| view.state(h) == Some(State::Succeeded));
    match canary {
        Some(c) if c != me && !succeeded => {
            let state = view.state(c);
            if state == Some(State::Failed) || view.abandoned(c) {
                Turn::Stop(Stop::CanaryFailed {
                    host: c.to_string(),
                })
            } else {
                Turn::Wait(Wait::Canary {
                    host: c.to_string(),
                    state,
                })
            }
        }
        _ => slots(false),
    }
}

/// A change's progress over a service, for `reconcile rollout status`: each host of the order
/// under one heading.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    /// The first host with something to do, as the agents decide it.
    pub canary: Option<String>,
    pub succeeded: Vec<String>,
    pub up_to_date: Vec<String>,
    pub in_flight: Vec<String>,
    pub failed: Vec<String>,
    pub waiting: Vec<String>,
    pub held: Vec<String>,
    /// No entry for this change yet (its agent has not run a round on it, or is down).
    pub unreported: Vec<String>,
}

impl Progress {
    /// Whether every host is done with the change, one way or another.
    pub fn finished(&self) -> bool {
        self.in_flight.is_empty() && self.waiting.is_empty() && self.unreported.is_empty()
    }
}

pub fn progress(order: &[&str], view: &View) -> Progress {
    let mut p = Progress {
        canary: order
            .iter()
            .find(|h| view.state(h) != Some(State::UpToDate))
            .map(|h| h.to_string()),
        ..Progress::default()
    };
    for host in order {
        let name = host.to_string();
        let list = if view.abandoned(host) {
            &mut p.failed
        } else {
            match view.state(host) {
                None => &mut p.unreported,
                Some(State::UpToDate) => &mut p.up_to_date,
                Some(State::Succeeded) => &mut p.succeeded,
                Some(State::Started) => &mut p.in_flight,
                Some(State::Failed) => &mut p.failed,
                Some(State::Waiting) => &mut p.waiting,
                Some(State::Held) => &mut p.held,
            }
        };
        list.push(name);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: [&str; 4] = ["h1", "h2", "h3", "h4"];

    fn policy(max_parallel: usize, max_failures: usize) -> Rollout {
        Rollout {
            max_parallel,
            max_failures,
            ..Rollout::DEFAULT
        }
    }

    /// [`decide`] for `me` of [`ORDER`], under `max_parallel` and `max_failures`.
    fn turn(me: &str, max_parallel: usize, max_failures: usize, view: &View) -> Turn {
        decide(me, &ORDER, &policy(max_parallel, max_failures), view)
    }

    use crate::rollout::ledger::entry_for_test as entry;

    fn view(hosts: &[(&str, State)], slots: &[&str]) -> View {
        View {
            revision: "r2".into(),
            hosts: hosts
                .iter()
                .map(|(h, s)| (h.to_string(), entry("r2", *s)))
                .collect(),
            slots: slots.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn on_a_fresh_change_only_the_canary_goes() {
        let v = view(&[], &[]);
        assert_eq!(turn("h1", 2, 1, &v), Turn::Go { resume: false });
        assert_eq!(
            turn("h3", 2, 1, &v),
            Turn::Wait(Wait::Canary {
                host: "h1".into(),
                state: None
            })
        );
    }

    #[test]
    fn hosts_up_to_date_pass_the_canary_on_to_the_first_with_work() {
        let v = view(&[("h1", State::UpToDate)], &[]);
        assert_eq!(turn("h2", 2, 1, &v), Turn::Go { resume: false });
        assert!(matches!(
            turn("h3", 2, 1, &v),
            Turn::Wait(Wait::Canary { host, .. }) if host == "h2"
        ));
    }

    #[test]
    fn an_entry_of_an_older_change_is_no_report_on_this_one() {
        let mut v = view(&[], &[]);
        v.hosts.insert("h1".into(), entry("r1", State::Succeeded));
        assert!(matches!(
            turn("h2", 2, 1, &v),
            Turn::Wait(Wait::Canary { state: None, .. })
        ));
    }

    #[test]
    fn once_the_canary_succeeded_hosts_go_while_slots_are_free() {
        let v = view(&[("h1", State::Succeeded), ("h2", State::Started)], &["h2"]);
        assert_eq!(turn("h3", 2, 1, &v), Turn::Go { resume: false });
        let full = view(
            &[
                ("h1", State::Succeeded),
                ("h2", State::Started),
                ("h3", State::Started),
            ],
            &["h2", "h3"],
        );
        assert_eq!(
            turn("h4", 2, 1, &full),
            Turn::Wait(Wait::Slots {
                holders: vec!["h2".into(), "h3".into()],
                max: 2
            })
        );
    }

    #[test]
    fn a_slot_of_an_older_change_still_counts() {
        let mut v = view(&[("h1", State::Succeeded)], &["h2"]);
        v.hosts.insert("h2".into(), entry("r1", State::Started));
        assert!(matches!(
            turn("h3", 1, 1, &v),
            Turn::Wait(Wait::Slots { .. })
        ));
    }

    #[test]
    fn a_failed_canary_stops_everyone_even_with_budget_left() {
        let v = view(&[("h1", State::Failed)], &[]);
        assert_eq!(
            turn("h2", 2, 3, &v),
            Turn::Stop(Stop::CanaryFailed { host: "h1".into() })
        );
        assert_eq!(turn("h1", 2, 3, &v), Turn::Stop(Stop::FailedHere));
    }

    #[test]
    fn the_budget_stops_hosts_that_have_not_started() {
        let v = view(
            &[
                ("h1", State::Succeeded),
                ("h2", State::Failed),
                ("h3", State::Failed),
            ],
            &[],
        );
        assert_eq!(
            turn("h4", 2, 2, &v),
            Turn::Stop(Stop::Budget {
                failed: vec!["h2".into(), "h3".into()],
                max: 2
            })
        );
        assert_eq!(turn("h4", 2, 3, &v), Turn::Go { resume: false });
    }

    #[test]
    fn an_abandoned_attempt_counts_as_failed_and_is_finished_by_its_own_host() {
        // h2 started and its slot's lease ran out: its agent died mid-way.
        let v = view(&[("h1", State::Succeeded), ("h2", State::Started)], &[]);
        assert_eq!(v.failed(), ["h2"]);
        assert!(matches!(
            turn("h3", 2, 1, &v),
            Turn::Stop(Stop::Budget { .. })
        ));
        assert_eq!(turn("h3", 2, 2, &v), Turn::Go { resume: false });
        // Its own host resumes it though the budget is spent, but only under a free slot.
        assert_eq!(turn("h2", 1, 1, &v), Turn::Go { resume: true });
        let busy = view(
            &[
                ("h1", State::Succeeded),
                ("h2", State::Started),
                ("h3", State::Started),
            ],
            &["h3"],
        );
        assert!(matches!(
            turn("h2", 1, 2, &busy),
            Turn::Wait(Wait::Slots { .. })
        ));
    }

    #[test]
    fn while_its_lease_lives_a_started_host_is_in_flight_not_failed() {
        let v = view(&[("h1", State::Started)], &["h1"]);
        assert!(v.failed().is_empty());
        assert!(matches!(
            turn("h2", 2, 1, &v),
            Turn::Wait(Wait::Canary {
                state: Some(State::Started),
                ..
            })
        ));
    }

    /// Every agent deciding against the same view never lets more than `max_parallel` go, and
    /// before any success at most the canary.
    #[test]
    fn no_view_lets_more_go_than_the_free_slots_or_past_the_canary() {
        let states = [
            None,
            Some(State::UpToDate),
            Some(State::Waiting),
            Some(State::Started),
            Some(State::Succeeded),
            Some(State::Failed),
        ];
        let hosts = ["h1", "h2", "h3", "h4", "h5"];
        let mut seen = 0;
        // Every combination of states over five hosts, each holding a slot or not when started.
        for code in 0..states.len().pow(hosts.len() as u32) {
            let mut v = View {
                revision: "r".into(),
                ..View::default()
            };
            let mut c = code;
            for h in hosts {
                if let Some(s) = states[c % states.len()] {
                    v.hosts.insert(h.into(), entry("r", s));
                    if s == State::Started && c % 2 == 0 {
                        v.slots.insert(h.into());
                    }
                }
                c /= states.len();
            }
            for max in 1..=3 {
                let p = policy(max, 2);
                let going: Vec<&str> = hosts
                    .iter()
                    .copied()
                    // A host whose entry says up to date has nothing to do and does not ask.
                    .filter(|h| v.state(h) != Some(State::UpToDate))
                    .filter(|h| matches!(decide(h, &hosts, &p, &v), Turn::Go { .. }))
                    .collect();
                assert!(
                    going.is_empty() || v.slots.len() < max,
                    "slots full yet {going:?} go in {v:?}"
                );
                let succeeded = v.hosts.values().any(|e| e.state == State::Succeeded);
                let fresh: Vec<&&str> = going.iter().filter(|h| !v.abandoned(h)).collect();
                assert!(
                    succeeded || fresh.len() <= 1,
                    "{fresh:?} go before any success in {v:?}"
                );
                seen += 1;
            }
        }
        assert!(seen > 10_000);
    }

    #[test]
    fn progress_sorts_every_host_under_one_heading() {
        let mut v = view(
            &[
                ("h1", State::Succeeded),
                ("h2", State::Started),
                ("h3", State::Waiting),
            ],
            &["h2"],
        );
        let p = progress(&ORDER, &v);
        assert_eq!(p.canary.as_deref(), Some("h1"));
        assert_eq!(p.succeeded, ["h1"]);
        assert_eq!(p.in_flight, ["h2"]);
        assert_eq!(p.waiting, ["h3"]);
        assert_eq!(p.unreported, ["h4"]);
        assert!(!p.finished());
        v.slots.clear();
        assert_eq!(progress(&ORDER, &v).failed, ["h2"]);
    }
}
