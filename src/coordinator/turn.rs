//! One unit's apply under the coordinator, on the agent's host: a unit with nothing to do, or
//! only a reload, goes at once and says so; a restart waits for its turn (the canary, a free
//! slot), goes under a slot held on a lease, and writes its outcome; a rollout stopped by the
//! canary or the budget leaves the server as it is. The decisions are
//! `reconcile_core::rollout::turn::decide`'s; this is the loop that reads, decides and waits.
//!
//! An agent never restarts without a slot: a coordinator it cannot reach makes it wait, changing
//! nothing, for at most `--coordinator-wait`, then give the round up.

use std::time::{Duration, Instant};

use reconcile_core::rollout::ledger::{HostEntry, State};
use reconcile_core::rollout::turn::{decide, Turn, View, Wait};
use reconcile_core::rollout::Rollout;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{entry, Coordinator, CoordinatorOptions};
use crate::apply::{self, Need, Outcome, UnitReport};
use crate::redact::Redactor;
use crate::remote::error_chain;
use crate::remote::etcd::EtcdError;
use crate::targets::Target;

/// The agent's link to the coordinator, connected on first use and kept across rounds.
pub struct Link {
    options: CoordinatorOptions,
    connected: Mutex<Option<Coordinator>>,
}

impl Link {
    pub fn new(options: CoordinatorOptions) -> Link {
        Link {
            options,
            connected: Mutex::new(None),
        }
    }

    pub fn options(&self) -> &CoordinatorOptions {
        &self.options
    }

    /// Requests made to the coordinator so far and the time they took; `None`: not connected.
    pub async fn spent(&self) -> Option<(u64, Duration)> {
        self.connected.lock().await.as_ref().map(Coordinator::spent)
    }

    async fn get(&self) -> Result<Coordinator, EtcdError> {
        let mut connected = self.connected.lock().await;
        if let Some(c) = connected.as_ref() {
            return Ok(c.clone());
        }
        let c = Coordinator::connect(&self.options.etcd, &self.options.prefix).await?;
        *connected = Some(c.clone());
        Ok(c)
    }
}

/// What one unit's coordinated apply works with.
pub struct Coordination<'a> {
    pub link: &'a Link,
    /// The change of the unit's service (`ledger::revision`) and the commit it was read from.
    pub revision: &'a str,
    pub commit: &'a str,
    /// The service's hosts in rollout order, canary first.
    pub order: &'a [&'a str],
    pub policy: Rollout,
    pub stop: &'a CancellationToken,
    /// Says what the coordination does, for the agent's journal.
    pub say: &'a dyn Fn(String),
    /// The manifests' secret names: what an entry says is redacted with them before it is written
    /// (every agent of the fleet reads it).
    pub redactor: &'a Redactor,
}

/// Applies `t` (through `apply`) when and if the coordinator says this host's turn has come;
/// `need` is what applying it would do to the server.
pub async fn coordinated(
    c: &Coordination<'_>,
    t: &Target,
    need: Need,
    apply: impl AsyncFnOnce() -> UnitReport,
) -> UnitReport {
    let service = t.manifest.service.as_str();
    let me = t.host.as_str();
    let unit_sha = crate::state::sha256(&t.desired.text);
    let entry_of = |state, detail: Option<String>| {
        let detail = detail.map(|d| c.redactor.redact_desired(&t.desired, &d));
        entry(c.revision, c.commit, &unit_sha, state, detail)
    };
    match need {
        Need::Nothing => {
            let report = apply::unchanged(t, Instant::now());
            if let Err(e) = note_up_to_date(c, service, me, entry_of(State::UpToDate, None)).await {
                (c.say)(format!(
                    "{me} {}: up to date; the coordinator was not told: {}",
                    t.desired.unit,
                    error_chain(&e)
                ));
            }
            report
        }
        // A reload restarts nothing, so it needs no turn: a coordinator that is down does not
        // hold it back. Its outcome is written when the coordinator can be reached.
        Need::Reload => {
            let report = apply().await;
            let written = match c.link.get().await {
                Ok(coordinator) => {
                    let e = outcome_entry(&report, &entry_of);
                    coordinator.write_entry(service, me, &e).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                (c.say)(format!(
                    "{me} {}: reloaded; the coordinator was not told: {}",
                    t.desired.unit,
                    error_chain(&e)
                ));
            }
            report
        }
        Need::Restart => restart(c, t, &entry_of, apply).await,
    }
}

/// Rewrites the host's entry as up to date unless it already says so (or says it succeeded with
/// this change): a quiet round reads one key and writes nothing.
async fn note_up_to_date(
    c: &Coordination<'_>,
    service: &str,
    me: &str,
    up_to_date: HostEntry,
) -> Result<(), EtcdError> {
    let coordinator = c.link.get().await?;
    let current = coordinator.entry(service, me).await?;
    let settled = current.as_ref().is_some_and(|e| {
        e.same_news(&up_to_date)
            || (e.revision == up_to_date.revision
                && e.commit == up_to_date.commit
                && e.state == State::Succeeded)
    });
    if settled {
        return Ok(());
    }
    coordinator.write_entry(service, me, &up_to_date).await
}

/// The entry an apply's report comes to.
fn outcome_entry(
    report: &UnitReport,
    entry_of: &dyn Fn(State, Option<String>) -> HostEntry,
) -> HostEntry {
    match report.outcome {
        Outcome::Unchanged => entry_of(State::UpToDate, None),
        Outcome::Reloaded | Outcome::Converged => entry_of(State::Succeeded, None),
        Outcome::NotStarted => entry_of(State::Held, Some(cut(&report.detail))),
        Outcome::Error | Outcome::RolledBack | Outcome::RollbackFailed => {
            let detail = match &report.diagnosis {
                Some(d) => format!("{} ({})", report.detail, d.cause),
                None => report.detail.clone(),
            };
            entry_of(State::Failed, Some(cut(&detail)))
        }
    }
}

/// Entries are read by every agent of the service each round: a journal excerpt stays on the
/// host, the entry keeps the gist.
fn cut(text: &str) -> String {
    const KEPT: usize = 400;
    match text.char_indices().nth(KEPT) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// A restart: wait for the turn, go under a slot, write the outcome.
async fn restart(
    c: &Coordination<'_>,
    t: &Target,
    entry_of: &dyn Fn(State, Option<String>) -> HostEntry,
    apply: impl AsyncFnOnce() -> UnitReport,
) -> UnitReport {
    let service = t.manifest.service.as_str();
    let me = t.host.as_str();
    let options = c.link.options();
    let started = Instant::now();
    let mut last_said = String::new();
    let say_once = |last: &mut String, text: String| {
        if *last != text {
            (c.say)(format!("{me} {}: {text}", t.desired.unit));
            *last = text;
        }
    };
    let not_started = |why: String| {
        apply::refused(
            &t.host,
            &t.desired.unit,
            &t.source,
            Outcome::NotStarted,
            why,
        )
    };
    loop {
        if c.stop.is_cancelled() {
            return not_started("not started: the agent is stopping".into());
        }
        let waited = started.elapsed();
        let step = async {
            let coordinator = c.link.get().await?;
            let (mut ledger, mut seen) = coordinator.ledger(service).await?;
            // Seen as waiting before the read it decides on, so that two hosts that both have
            // work see each other (see `turn::decide`); once written, each look is one read.
            let mine = ledger.hosts.get(me).filter(|e| e.revision == c.revision);
            if mine.is_none_or(|e| e.state == State::UpToDate) {
                coordinator
                    .write_entry(service, me, &entry_of(State::Waiting, None))
                    .await?;
                (ledger, seen) = coordinator.ledger(service).await?;
            }
            Ok::<_, EtcdError>((coordinator, View::of(&ledger, c.revision), seen))
        };
        let (coordinator, view, seen) = match step.await {
            Ok(v) => v,
            Err(e) => {
                let why = format!(
                    "the coordinator cannot be reached ({}), so nothing restarts",
                    error_chain(&e)
                );
                if waited >= options.wait {
                    return not_started(format!(
                        "not started: {why}; waited {}s (--coordinator-wait), nothing was changed",
                        waited.as_secs()
                    ));
                }
                say_once(&mut last_said, format!("{why}; waiting"));
                pause(c, options.poll).await;
                continue;
            }
        };
        match decide(me, c.order, &c.policy, &view) {
            Turn::Go { resume } => {
                let claim = entry_of(State::Started, None);
                match coordinator
                    .claim(service, me, seen, &claim, options.lease_ttl, c.commit)
                    .await
                {
                    // Someone wrote in between: read again at once.
                    Ok(None) => continue,
                    Err(e) => {
                        say_once(
                            &mut last_said,
                            format!("taking a slot failed ({}); waiting", error_chain(&e)),
                        );
                        pause(c, options.poll).await;
                        continue;
                    }
                    Ok(Some(held)) => {
                        say_once(
                            &mut last_said,
                            if resume {
                                "took a restart slot to finish the attempt its agent did not end"
                                    .into()
                            } else {
                                "took a restart slot".into()
                            },
                        );
                        let mut report = apply().await;
                        if held.lost() {
                            report.notes.push(
                                "the coordinator let this host's slot lease run out while it restarted (it could not be reached for longer than the lease's TTL): another host may have restarted meanwhile".into(),
                            );
                        }
                        let outcome = outcome_entry(&report, entry_of);
                        if let Err(e) = release_retrying(&coordinator, held, &outcome, c).await {
                            report.notes.push(format!(
                                "the outcome could not be written to the coordinator: {}; its slot frees when the lease runs out, and the next round writes it",
                                error_chain(&e)
                            ));
                        }
                        return report;
                    }
                }
            }
            Turn::Wait(wait) => {
                let why = wait.to_string();
                if waited >= options.wait {
                    return not_started(format!(
                        "not started: {why}; gave up after {}s (--coordinator-wait), the next round asks again",
                        waited.as_secs()
                    ));
                }
                // The entry keeps the kind of wait, not who holds the slots: a fleet of waiting
                // agents rewriting their entries at every change of holders would keep each
                // other's claims failing.
                let waiting = entry_of(State::Waiting, Some(gist(&wait)));
                if view.hosts.get(me).is_none_or(|e| !e.same_news(&waiting)) {
                    let _ = coordinator.write_entry(service, me, &waiting).await;
                }
                say_once(&mut last_said, why);
                pause(c, options.poll).await;
            }
            Turn::Stop(why) => {
                let why = why.to_string();
                // A host that failed keeps its failure on record; the others are held.
                if view.hosts.get(me).is_none_or(|e| e.state != State::Failed) {
                    let held = entry_of(State::Held, Some(why.clone()));
                    if view.hosts.get(me).is_none_or(|e| !e.same_news(&held)) {
                        let _ = coordinator.write_entry(service, me, &held).await;
                    }
                }
                return not_started(format!(
                    "not started: {why}; the running server was left as it is"
                ));
            }
        }
    }
}

/// What a waiting host's entry says: stable while it waits for the same thing.
fn gist(wait: &Wait) -> String {
    match wait {
        Wait::Canary { host, .. } => format!("waiting for the canary {host}"),
        Wait::Slots { max, .. } => format!("waiting for a restart slot (max_parallel {max})"),
    }
}

/// The outcome must reach the coordinator: the other agents decide on it. A coordinator that is
/// down is tried again until `--coordinator-wait` has passed (the slot frees itself meanwhile,
/// when its lease runs out).
async fn release_retrying(
    coordinator: &Coordinator,
    held: super::Held,
    outcome: &HostEntry,
    c: &Coordination<'_>,
) -> Result<(), EtcdError> {
    let (service, host) = (held.service.clone(), held.host.clone());
    let mut result = coordinator.release(held, outcome).await;
    let started = Instant::now();
    while result.is_err() && started.elapsed() < c.link.options().wait {
        tokio::time::sleep(c.link.options().poll).await;
        result = coordinator.finish(&service, &host, outcome).await;
    }
    result
}

/// Waits `poll` (a little less or more, so that a fleet's agents do not ask in step), or until
/// the agent is stopping.
async fn pause(c: &Coordination<'_>, poll: Duration) {
    let jitter = (crate::coordinator::now() as u128 * 7919 + std::process::id() as u128) % 400;
    let poll = poll.mul_f64(0.8 + jitter as f64 / 1000.0);
    c.stop.run_until_cancelled(tokio::time::sleep(poll)).await;
}
