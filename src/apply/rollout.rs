//! Rolling out over a fleet: a canary first, which must pass every stage before any other host
//! starts; then batches; no new host once the rollout has seen `max_failures` failed hosts; and,
//! when asked, the hosts already converged in this rollout rolled back when it stops. The order
//! and when to stop are `schedule`'s; this file looks at the hosts and runs the turns it hands out.
//!
//! A replica whose manifest has `router:` is applied [`behind_router`]: taken out of the router,
//! drained, applied (install, restart, every stage of verification, or rolled back), and put back
//! once the router lists it healthy; then the next.

use futures::future::join_all;

use super::decide;
use super::error::{ApplyError, RouterFailure};
use super::routed::TakenOut;
use super::undo;
use super::{apply_hosts, ApplyOptions, Outcome, UnitReport};
use crate::remote::{Host, SshOptions};
use crate::router::{Connected, Routers};
use crate::systemd::Systemd;
use crate::targets::{by_host, Target};
use crate::visit;
use reconcile_core::rollout::schedule::{Schedule, Step};

/// Hosts looked at at once before the rollout starts.
const SURVEY_AT_ONCE: usize = 32;

/// What the look before the rollout found on a host.
enum Survey {
    /// Every unit is up to date: nothing to roll out.
    UpToDate(Vec<UnitReport>),
    /// The host takes a turn in the rollout.
    Turn(Turn),
}

enum Turn {
    /// Some unit has work.
    Work(String, Vec<Target>),
    /// Not reachable: the host fails at its turn, as if it had been tried then.
    Unreachable(Vec<UnitReport>),
}

/// Looks at each host, changing nothing, [`SURVEY_AT_ONCE`] at once: is there work for the
/// rollout?
async fn survey(
    hosts: Vec<(String, Vec<Target>)>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<Survey> {
    visit::each_host(
        hosts,
        ssh,
        SURVEY_AT_ONCE,
        visit::no_span,
        async |host: &dyn Host, visit: &visit::Visit<'_>, targets: Vec<Target>| {
            if super::host_has_work(host, &targets, options).await {
                Survey::Turn(Turn::Work(visit.name.to_string(), targets))
            } else {
                Survey::UpToDate(
                    targets
                        .iter()
                        .map(|t| super::unchanged(t, visit.started))
                        .collect(),
                )
            }
        },
        |visit, targets, e| {
            Survey::Turn(Turn::Unreachable(super::unreachable(
                &targets,
                e,
                visit.started,
            )))
        },
    )
    .await
}

/// Applies every target host by host, in the rollout's order. Hosts never started are reported
/// as `not_started`, with why.
///
/// Every host is looked at first, all at once, and only hosts with work take part: a canary
/// that has nothing to change proves nothing, and a batch of hosts already up to date would only
/// delay the ones that are not. The canary is the first host (by name) with work.
pub async fn roll_out(
    targets: Vec<Target>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let all = targets.clone();
    // A server group's ranks are one server: applied together, group after group, once the
    // replicas' rollout is done (`pipeline::apply_group`).
    let (grouped, targets): (Vec<Target>, Vec<Target>) =
        targets.into_iter().partition(|t| t.group.is_some());
    let hosts = canary_first(by_host(targets));
    let order: std::collections::HashMap<String, usize> = hosts
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), i))
        .collect();
    let routers = Routers::connect(&all, ssh).await;
    let with_routers;
    let options = if routers.is_empty() {
        options
    } else {
        with_routers = ApplyOptions {
            routers: Some(std::sync::Arc::new(routers)),
            ..options.clone()
        };
        &with_routers
    };
    let surveys = survey(hosts, ssh, options).await;
    let mut reports: Vec<UnitReport> = Vec::new();
    let mut turns = Vec::new();
    for survey in surveys {
        match survey {
            Survey::UpToDate(done) => reports.extend(done),
            Survey::Turn(turn) => turns.push(turn),
        }
    }
    // Every host with work brings its pinned weights before the first stop, all at once.
    let working: Vec<Target> = turns
        .iter()
        .filter_map(|turn| match turn {
            Turn::Work(_, targets) => Some(targets.iter().cloned()),
            Turn::Unreachable(_) => None,
        })
        .flatten()
        .chain(grouped.iter().cloned())
        .collect();
    let ahead = super::fetch::fetch_ahead(&working, ssh, options).await;
    if !ahead.failed.is_empty() {
        reports.extend(ahead.refuse(&working));
        for turn in turns {
            if let Turn::Unreachable(failed) = turn {
                reports.extend(failed);
            }
        }
        reports.sort_by_key(|r| order.get(&r.host).copied().unwrap_or(usize::MAX));
        return reports;
    }
    let mut turns: Vec<Option<Turn>> = turns.into_iter().map(Some).collect();
    let mut schedule = Schedule::new(options.rollout, turns.len());
    loop {
        match schedule.next_step() {
            Step::Apply(batch) => {
                let batch: Vec<Turn> = batch.iter().filter_map(|&i| turns[i].take()).collect();
                let mut results = take_turns(batch, ssh, options).await;
                // The canary's batch is baked on live traffic before the others start.
                if schedule.canary_next() {
                    let canaries: Vec<String> =
                        results.iter().flatten().map(|r| r.host.clone()).collect();
                    let reports = results.iter_mut().flatten();
                    let baked =
                        reports.map(|r| super::bake::canary(r, &all, &canaries, ssh, options));
                    join_all(baked).await;
                }
                let failed = results
                    .iter()
                    .filter(|host| host.iter().any(|r| failed(r.outcome)))
                    .count();
                schedule.finished(failed);
                if let Some((host, why)) = results.iter().flatten().find_map(|r| {
                    let why = r.bake.as_ref()?.paused()?;
                    Some((r.host.as_str(), why))
                }) {
                    schedule.paused(paused_why(host, why));
                }
                reports.extend(results.into_iter().flatten());
            }
            Step::Skip {
                turns: skipped,
                why,
            } => {
                let e = ApplyError::NotStarted(why);
                for turn in skipped.iter().filter_map(|&i| turns[i].take()) {
                    match turn {
                        Turn::Work(_, targets) => {
                            reports.extend(targets.iter().map(|t| super::not_started(t, &e)))
                        }
                        Turn::Unreachable(failed) => reports.extend(failed),
                    }
                }
            }
            Step::RollBackConverged { why } => {
                rollback_all(&mut reports, &why, &all, ssh, options).await
            }
            Step::Done => break,
        }
    }
    let failed_hosts = reports.iter().filter(|r| failed(r.outcome)).count();
    reports.extend(roll_out_groups(grouped, failed_hosts, ssh, options).await);
    ahead.attach(&mut reports);
    reports.sort_by_key(|r| order.get(&r.host).copied().unwrap_or(usize::MAX));
    reports
}

/// Why the hosts after an inconclusive bake do not start, and how the operator goes on.
fn paused_why(canary: &str, why: &str) -> String {
    format!(
        "the rollout paused: the bake could not judge the canary {canary} ({why}); it keeps the new unit. \
         To go on, apply again (the next host with work is baked against the others); \
         to take it back, `reconcile rollback <service> --host {canary}`"
    )
}

/// Server groups one after another, each as one unit of work (`pipeline::apply_group`). Once the
/// rollout has seen `max_failures` failures (hosts before, groups here), no further group starts.
async fn roll_out_groups(
    grouped: Vec<Target>,
    mut failures: usize,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let mut groups: Vec<Vec<Target>> = Vec::new();
    for t in grouped {
        match groups
            .iter_mut()
            .find(|g| g[0].source == t.source && g[0].desired.unit == t.desired.unit)
        {
            Some(g) => g.push(t),
            None => groups.push(vec![t]),
        }
    }
    let mut reports = Vec::new();
    for group in groups {
        if failures >= options.rollout.max_failures.max(1) {
            let e = ApplyError::NotStarted(format!(
                "the rollout stopped after {failures} failure(s) (rollout.max_failures {})",
                options.rollout.max_failures
            ));
            reports.extend(group.iter().map(|t| super::not_started(t, &e)));
            continue;
        }
        let done = super::pipeline::apply_group(group, ssh, options).await;
        if done.iter().any(|r| failed(r.outcome)) {
            failures += 1;
        }
        reports.extend(done);
    }
    reports
}

/// The hosts by name, with those a manifest names as its `rollout.canary` first: push mode's
/// canary is then the host pull agents would also choose.
fn canary_first(
    hosts: std::collections::BTreeMap<String, Vec<Target>>,
) -> Vec<(String, Vec<Target>)> {
    let named = |targets: &[Target], host: &str| {
        targets.iter().any(|t| {
            t.manifest
                .rollout
                .as_ref()
                .and_then(|r| r.canary.as_deref())
                == Some(host)
        })
    };
    let (mut first, rest): (Vec<_>, Vec<_>) = hosts
        .into_iter()
        .partition(|(host, targets)| named(targets, host));
    first.extend(rest);
    first
}

/// A batch's turns, at once: hosts with work applied, unreachable ones failed as found. The
/// results are in the batch's order.
async fn take_turns(
    batch: Vec<Turn>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<Vec<UnitReport>> {
    let mut results: Vec<Option<Vec<UnitReport>>> = Vec::new();
    let mut work = Vec::new();
    for turn in batch {
        match turn {
            Turn::Work(name, targets) => {
                results.push(None);
                work.push((name, targets));
            }
            Turn::Unreachable(failed) => results.push(Some(failed)),
        }
    }
    let mut applied = apply_hosts(work, ssh, options).await.into_iter();
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| applied.next().unwrap_or_default()))
        .collect()
}

fn failed(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Error | Outcome::RolledBack | Outcome::RollbackFailed
    )
}

/// `--rollback-all`: puts the previous unit back on every host this rollout changed, each through
/// apply's own transaction (`undo::undo`).
async fn rollback_all(
    reports: &mut [UnitReport],
    why: &str,
    all: &[Target],
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let by = decide::UndoneBy::RollbackAll;
    let units: Vec<(String, (&mut UnitReport, &Target))> = reports
        .iter_mut()
        .filter(|r| matches!(r.outcome, Outcome::Converged | Outcome::Reloaded))
        .filter_map(|r| {
            let t = all
                .iter()
                .find(|t| t.host == r.host && t.desired.unit == r.unit)?;
            Some((r.host.clone(), (r, t)))
        })
        .collect();
    let at_once = units.len();
    visit::each_host(
        units,
        ssh,
        at_once,
        visit::no_span,
        async |host: &dyn Host, _: &visit::Visit<'_>, (r, t): (&mut UnitReport, &Target)| {
            let undone = undo::undo(host, r, t, options, by).await;
            undo::report(r, why, by, undone);
        },
        |_, (r, _), e| undo::report(r, why, by, Err(undo::UndoError::Unreachable(e))),
    )
    .await;
}

/// Whether applying `t` restarts its server (or starts a new one): only then does the replica
/// leave the router. A reload-only change keeps it serving; a unit that cannot be read is left to
/// apply to report.
async fn restarts(host: &dyn Host, t: &Target, options: &ApplyOptions) -> bool {
    let Ok(observed) = host.observe(&t.desired.unit).await else {
        return false;
    };
    match crate::plan::plan(&t.host, &t.source, &t.desired, &observed, &options.redactor).verdict {
        // `plan` alone never says live; a restart the manifest lets go live leaves the router
        // too (apply decides live once it read the checkpoints), a moment out for nothing.
        crate::plan::Verdict::Restart
        | crate::plan::Verdict::Install
        | crate::plan::Verdict::Live => true,
        crate::plan::Verdict::ReloadOnly => false,
        // Unchanged, but its last apply did not finish: apply restarts it.
        crate::plan::Verdict::NoChange => {
            t.expected.is_some() || super::observed_work(host, t, options, &observed).await
        }
    }
}

/// One replica's apply behind its router: out of the router (refused when that would leave fewer
/// than `min_available` healthy replicas of its model), applied with a drain before its restart
/// (the manifest's `drain:`, else one of `router.drain_timeout` that refuses when it cannot see the
/// server idle), then back in and listed healthy. A replica rolled back (a stage failed, or
/// Ctrl-C/SIGTERM during verification), or refused before a change (a drain that timed out or was
/// interrupted), runs its old unit and goes back in too; only one whose rollback failed, or a new
/// one that never passed, stays out. The notes time each step.
pub(super) async fn behind_router(
    host: &dyn Host,
    t: &Target,
    options: &ApplyOptions,
    router: Connected,
) -> UnitReport {
    let refuse = |e: ApplyError| super::refused_for(&t.host, &t.desired.unit, &t.source, &e);
    let router = match router {
        Ok(router) => router,
        Err(e) => return refuse(ApplyError::Router(RouterFailure::Unreachable(e))),
    };
    if !restarts(host, t, options).await {
        return super::apply_one(host, t, options).await;
    }
    let out = match TakenOut::take_out(router, t).await {
        Ok(out) => out,
        Err(e) => return refuse(e),
    };
    let mut report = super::apply_one(host, &out.draining(t), options).await;
    out.put_back(&mut report).await;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_canary_host_goes_first_and_the_rest_keep_their_order() {
        let text = "service: s\nhosts: [gpu-a, gpu-b, gpu-c]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 30000\n";
        let hosts = |text: &str| {
            let m = crate::manifest::parse("manifests/s.yaml", text).expect("parses");
            let targets = crate::targets::targets(&[m], &Default::default()).expect("targets");
            canary_first(by_host(targets))
                .into_iter()
                .map(|(h, _)| h)
                .collect::<Vec<_>>()
        };
        assert_eq!(hosts(text), ["gpu-a", "gpu-b", "gpu-c"]);
        assert_eq!(
            hosts(&format!("{text}rollout: {{ canary: gpu-c }}\n")),
            ["gpu-c", "gpu-a", "gpu-b"]
        );
    }
}
