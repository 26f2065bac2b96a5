//! `reconcile --dry-run`: read every host concurrently, one SSH connection each, and plan each
//! unit, with its preflight checks. Nothing on a host is changed. An unreachable host is reported;
//! the others are planned.

use futures::stream::{self, StreamExt};
use serde::Serialize;

use crate::apply::state::sha256;
use crate::observed::Observed;
use crate::plan::{plan, UnitPlan, Verdict};
use crate::plan_file::PlannedState;
use crate::preflight;
use crate::remote::{self, error_chain, SshOptions};
use crate::systemd::Systemd;
use crate::targets::Target;

/// Units planned at once on one connection: sshd allows 10 sessions per connection by default, and
/// a unit runs at most two commands at once (observing it, then its preflight).
const UNITS_PER_HOST_AT_ONCE: usize = 4;

/// What happened for one unit on one host.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Planned(Box<UnitPlan>),
    Error {
        host: String,
        unit: String,
        source: String,
        error: String,
    },
}

/// Plans every target, at most `parallel` hosts at once. Results come back in the targets' order.
/// `deep` adds preflight's deep check (the host's SGLang parses each unit's argv, ~10 s a unit).
pub async fn plan_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    deep: bool,
) -> Vec<Outcome> {
    let results: Vec<Vec<Outcome>> = stream::iter(crate::targets::by_host(targets))
        .map(|(host, targets)| plan_host(host, targets, ssh, deep))
        .buffered(parallel.max(1))
        .collect()
        .await;
    results.into_iter().flatten().collect()
}

async fn plan_host(
    name: String,
    targets: Vec<Target>,
    ssh: &SshOptions,
    deep: bool,
) -> Vec<Outcome> {
    let span = tracing::info_span!("host", host = %name);
    let _guard = span.enter();
    let host = match remote::connect(&name, ssh).await {
        Ok(host) => host,
        Err(e) => {
            let error = error_chain(&e);
            return targets.iter().map(|t| failed(t, error.clone())).collect();
        }
    };
    let outcomes = stream::iter(&targets)
        .map(|t| async {
            // Planned as soon as it is observed: preflight's other checks depend on the verdict.
            let observe = async {
                let observed = host.observe(&t.desired.unit).await?;
                let planned = plan(&t.host, &t.source, &t.desired, &observed);
                Ok((observed, planned))
            };
            let changes = |(_, p): &(Observed, UnitPlan)| p.verdict != Verdict::NoChange;
            let ((observed, mut planned), findings, sglang) =
                match preflight::check_with(&*host, t, deep, observe, |(o, _)| &o.state, changes)
                    .await
                {
                    Ok(all) => all,
                    Err(e) => return failed(t, error_chain(&e)),
                };
            planned.preflight = findings;
            planned.recorded = Some(PlannedState {
                desired_sha256: sha256(&t.desired.text),
                current_sha256: observed.unit_text.as_deref().map(sha256),
                sglang_version: sglang,
            });
            Outcome::Planned(Box::new(planned))
        })
        .buffered(UNITS_PER_HOST_AT_ONCE)
        .collect()
        .await;
    host.close().await;
    outcomes
}

fn failed(t: &Target, error: String) -> Outcome {
    Outcome::Error {
        host: t.host.clone(),
        unit: t.desired.unit.clone(),
        source: t.source.clone(),
        error,
    }
}

/// Counts for the closing line and the exit code.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
    pub install: usize,
    pub restart: usize,
    pub reload_only: usize,
    pub unchanged: usize,
    pub errors: usize,
    /// Planned units whose preflight found an error: the host cannot run them as they are.
    pub preflight_errors: usize,
}

impl Tally {
    pub fn of(outcomes: &[Outcome]) -> Tally {
        let mut t = Tally::default();
        for o in outcomes {
            match o {
                Outcome::Error { .. } => t.errors += 1,
                Outcome::Planned(p) => {
                    match p.verdict {
                        Verdict::Install => t.install += 1,
                        Verdict::Restart => t.restart += 1,
                        Verdict::ReloadOnly => t.reload_only += 1,
                        Verdict::NoChange => t.unchanged += 1,
                    }
                    if preflight::has_errors(&p.preflight) {
                        t.preflight_errors += 1;
                    }
                }
            }
        }
        t
    }

    pub fn changes(&self) -> usize {
        self.install + self.restart + self.reload_only
    }

    /// Exit status 1 of `plan`: a unit could not be planned, or its host cannot run it.
    pub fn failed(&self) -> bool {
        self.errors > 0 || self.preflight_errors > 0
    }
}
