//! Rolling out over a fleet: a canary first, which must pass every stage before any other host
//! starts; then batches; no new host once the rollout has seen `max_failures` failed hosts; and,
//! when asked, the hosts already converged in this rollout rolled back when it stops.

use futures::future::join_all;
use futures::stream::{self, StreamExt};

use super::{apply_host, restore, state, ApplyOptions, Fallback, Outcome, UnitReport};
use crate::manifest::VerifySpec;
use crate::plan::UNIT_DIR;
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
use crate::targets::{by_host, Target};
use crate::unit::parse_unit;
use crate::verify::{verify, Expect, Progress};

#[derive(Debug, Clone, Copy)]
pub struct Rollout {
    /// Hosts that go first, alone, and must all pass.
    pub canary: usize,
    /// Hosts applied at once after the canary.
    pub max_parallel: usize,
    /// Failed hosts, across the whole rollout, after which no new host starts.
    pub max_failures: usize,
    /// When the rollout stops, roll back the hosts it already converged.
    pub rollback_all: bool,
}

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

/// Looks at a host, changing nothing: is there work for the rollout?
async fn survey(
    name: String,
    targets: Vec<Target>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Survey {
    let started = std::time::Instant::now();
    let host = match remote::connect(&name, ssh).await {
        Ok(host) => host,
        Err(e) => {
            return Survey::Turn(Turn::Unreachable(super::unreachable(&targets, &e, started)))
        }
    };
    let mut work = false;
    for t in &targets {
        if super::has_work(&*host, t, options).await {
            work = true;
            break;
        }
    }
    host.close().await;
    if work {
        Survey::Turn(Turn::Work(name, targets))
    } else {
        Survey::UpToDate(
            targets
                .iter()
                .map(|t| super::unchanged(t, started))
                .collect(),
        )
    }
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
    let rollout = options.rollout;
    let specs: Specs = targets
        .iter()
        .map(|t| ((t.host.clone(), t.desired.unit.clone()), t.verify.clone()))
        .collect();
    let hosts = by_host(targets);
    let order: std::collections::HashMap<String, usize> = hosts
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), i))
        .collect();
    let surveys: Vec<Survey> = stream::iter(hosts)
        .map(|(name, targets)| survey(name, targets, ssh, options))
        .buffered(SURVEY_AT_ONCE)
        .collect()
        .await;
    let mut reports: Vec<UnitReport> = Vec::new();
    let mut turns = Vec::new();
    for survey in surveys {
        match survey {
            Survey::UpToDate(done) => reports.extend(done),
            Survey::Turn(turn) => turns.push(turn),
        }
    }
    let mut turns = turns.into_iter();
    let mut failed_hosts = 0;
    let mut stopped: Option<String> = None;
    let mut first = true;
    loop {
        let size = if first && rollout.canary > 0 {
            rollout.canary
        } else {
            rollout.max_parallel.max(1)
        };
        let batch: Vec<Turn> = turns.by_ref().take(size).collect();
        if batch.is_empty() {
            break;
        }
        if let Some(why) = &stopped {
            for turn in batch {
                match turn {
                    Turn::Work(_, targets) => {
                        reports.extend(targets.iter().map(|t| super::not_started(t, why)))
                    }
                    Turn::Unreachable(failed) => reports.extend(failed),
                }
            }
            continue;
        }
        let results = join_all(batch.into_iter().map(|turn| async move {
            match turn {
                Turn::Work(name, targets) => apply_host(name, targets, ssh, options).await,
                Turn::Unreachable(failed) => failed,
            }
        }))
        .await;
        let failed = results
            .iter()
            .filter(|host| host.iter().any(|r| failed(r.outcome)))
            .count();
        failed_hosts += failed;
        if first && rollout.canary > 0 && failed > 0 {
            stopped = Some("the canary failed, so the rollout stopped".into());
        } else if failed_hosts >= rollout.max_failures.max(1) {
            stopped = Some(format!(
                "{failed_hosts} host(s) failed (--max-failures {}), so the rollout stopped",
                rollout.max_failures
            ));
        }
        reports.extend(results.into_iter().flatten());
        first = false;
    }
    if let (Some(why), true) = (&stopped, rollout.rollback_all) {
        roll_back_converged(&mut reports, why, &specs, ssh, options).await;
    }
    reports.sort_by_key(|r| order.get(&r.host).copied().unwrap_or(usize::MAX));
    reports
}

fn failed(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Error | Outcome::RolledBack | Outcome::RollbackFailed
    )
}

/// Each unit's verification settings, for rolling it back after its target is gone.
type Specs = std::collections::HashMap<(String, String), VerifySpec>;

/// `--rollback-all`: puts the previous unit back on every host this rollout changed.
async fn roll_back_converged(
    reports: &mut [UnitReport],
    why: &str,
    specs: &Specs,
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let changed: Vec<&mut UnitReport> = reports
        .iter_mut()
        .filter(|r| matches!(r.outcome, Outcome::Converged | Outcome::Reloaded))
        .collect();
    join_all(changed.into_iter().map(|r| {
        let spec = specs
            .get(&(r.host.clone(), r.unit.clone()))
            .cloned()
            .unwrap_or_default();
        roll_back_one(r, spec, why, ssh, options)
    }))
    .await;
}

async fn roll_back_one(
    r: &mut UnitReport,
    spec: VerifySpec,
    why: &str,
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let result = async {
        let host = remote::connect(&r.host, ssh)
            .await
            .map_err(|e| error_chain(&e))?;
        let outcome = revert(&*host, r, &spec, options).await;
        host.close().await;
        outcome
    };
    match result.await {
        Ok(detail) => {
            r.outcome = Outcome::RolledBack;
            r.detail = format!("{}; {why}, and --rollback-all {detail}", r.detail);
        }
        Err(e) => {
            r.outcome = Outcome::RollbackFailed;
            r.detail = format!("{}; {why}, and --rollback-all failed: {e}", r.detail);
        }
    }
}

/// Restores what the unit was before this rollout: the generation the install kept, or nothing
/// for a unit that was new.
async fn revert(
    host: &dyn Host,
    r: &mut UnitReport,
    spec: &VerifySpec,
    options: &ApplyOptions,
) -> Result<String, String> {
    let unit = r.unit.clone();
    let was_new = r.verdict == Some(crate::plan::Verdict::Install);
    let previous = if was_new {
        None
    } else {
        state::newest_generation(host, &unit)
            .await
            .map_err(|e| error_chain(&e))?
    };
    let restart = r.outcome == Outcome::Converged;
    state::lock(host, &unit, &options.owner, options.lock).await?;
    let restored = match (&previous, restart) {
        // A reload-only change: the server never restarted, so the old file and a reload suffice.
        (Some(text), false) => reload_previous(host, &unit, text).await,
        _ => {
            restore(
                host,
                &unit,
                &Fallback {
                    previous: previous.clone(),
                    was_running: true,
                    kept: None,
                },
                true,
            )
            .await
        }
    };
    let verified = match (restored.map_err(|e| error_chain(&e)), &previous, restart) {
        (Ok(()), Some(text), true) => {
            let progress = Progress::new(
                format!("{} {unit} (rollback-all)", r.host),
                options.progress.as_ref(),
            );
            let (_keep, never) = tokio::sync::watch::channel(false);
            match verify(
                host,
                &unit,
                spec,
                &Expect::from_unit(&parse_unit(text)),
                &progress,
                &never,
            )
            .await
            {
                Ok(v) => {
                    r.rollback = Some(v);
                    Ok(())
                }
                Err(f) => Err(format!(
                    "the restored unit failed {}: {}",
                    f.stage, f.reason
                )),
            }
        }
        (other, _, _) => other,
    };
    let _ = state::unlock(host, &unit).await;
    verified?;
    Ok(match (&previous, restart) {
        (None, _) => "removed the new unit".into(),
        (Some(_), true) => "restored the previous unit, which passed verification".into(),
        (Some(_), false) => "restored the previous unit (daemon-reload only)".into(),
    })
}

async fn reload_previous(host: &dyn Host, unit: &str, text: &str) -> Result<(), RemoteError> {
    host.write_file(&format!("{UNIT_DIR}/{unit}"), text, "0644")
        .await?;
    host.run_ok(&["systemctl", "daemon-reload"])
        .await
        .map(|_| ())
}
