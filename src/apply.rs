//! `reconcile apply`: make each host run what its manifest says, prove the server survived its
//! start, or put the host back the way it was.
//!
//! Per unit: plan; nothing to do -> touch nothing. Otherwise take the unit's lock on the host, keep
//! the current unit as a generation, write the new one atomically, daemon-reload, and restart only
//! when the plan says so. A restarted server must pass the crash window; if it does not, the
//! previous unit is restored, restarted and watched the same way (or a new unit is removed).

use std::time::{Duration, Instant, SystemTime};

use futures::stream::{self, StreamExt};
use serde::Serialize;

use crate::observed::Observed;
use crate::plan::{plan, Verdict, UNIT_DIR};
use crate::redact::{redact_text, secret_values, Secret, REDACTED};
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::targets::Target;
use crate::unit::parse_unit;
use crate::verify::{crash_window, VerifyError};

/// Where `reconcile` keeps its lock and the previous units, per unit, on each host.
pub const STATE_DIR: &str = "/var/lib/reconcile";
/// Previous units kept per unit on a host.
const GENERATIONS_KEPT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing differed; nothing was touched.
    Unchanged,
    /// The unit was replaced and systemd reloaded; the server kept running.
    Reloaded,
    /// The unit was replaced and the server restarted and passed verification.
    Converged,
    /// Nothing was changed because of an error (unreachable, locked, unreadable).
    Error,
    /// Verification failed; the previous unit runs again and passed verification.
    RolledBack,
    /// Verification failed and so did the rollback: the host needs attention.
    RollbackFailed,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Unchanged | Outcome::Reloaded | Outcome::Converged => 0,
            Outcome::Error => 1,
            Outcome::RolledBack => 3,
            Outcome::RollbackFailed => 4,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UnitReport {
    pub host: String,
    pub unit: String,
    pub source: String,
    pub verdict: Option<Verdict>,
    pub outcome: Outcome,
    /// What happened, or why it failed.
    pub detail: String,
    /// The unit's journal since the failed start, when verification failed.
    pub journal: Option<String>,
    pub seconds: f64,
}

#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Who holds the lock while this run works on a unit (`user@machine pid N`).
    pub owner: String,
}

pub async fn apply_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let results: Vec<Vec<UnitReport>> = stream::iter(crate::targets::by_host(targets))
        .map(|(name, targets)| async move {
            let started = Instant::now();
            let host = match Host::connect(&name, ssh).await {
                Ok(host) => host,
                Err(e) => {
                    let detail = error_chain(&e);
                    return targets
                        .iter()
                        .map(|t| report(t, None, Outcome::Error, detail.clone(), started))
                        .collect();
                }
            };
            let mut reports = Vec::new();
            for t in &targets {
                reports.push(apply_unit(&host, t, options).await);
            }
            host.close().await;
            reports
        })
        .buffered(parallel.max(1))
        .collect()
        .await;
    results.into_iter().flatten().collect()
}

fn report(
    t: &Target,
    verdict: Option<Verdict>,
    outcome: Outcome,
    detail: String,
    started: Instant,
) -> UnitReport {
    UnitReport {
        host: t.host.clone(),
        unit: t.desired.unit.clone(),
        source: t.source.clone(),
        verdict,
        outcome,
        detail,
        journal: None,
        seconds: started.elapsed().as_secs_f64(),
    }
}

async fn apply_unit(host: &Host, t: &Target, options: &ApplyOptions) -> UnitReport {
    let started = Instant::now();
    let span = tracing::info_span!("unit", host = %t.host, unit = %t.desired.unit);
    let _guard = span.enter();
    let observed = match host.observe(&t.desired.unit).await {
        Ok(o) => o,
        Err(e) => return report(t, None, Outcome::Error, error_chain(&e), started),
    };
    let verdict = plan(&t.host, &t.source, &t.desired, &observed).verdict;
    if verdict == Verdict::NoChange {
        return report(
            t,
            Some(verdict),
            Outcome::Unchanged,
            "already up to date; nothing touched".into(),
            started,
        );
    }
    let unit = &t.desired.unit;
    if let Err(e) = lock(host, unit, &options.owner).await {
        return report(t, Some(verdict), Outcome::Error, e, started);
    }
    let mut result = install(host, t, &observed, verdict, started).await;
    if let Err(e) = unlock(host, unit).await {
        result.detail.push_str(&format!(
            "; and the lock could not be released: {}",
            error_chain(&e)
        ));
    }
    result.seconds = started.elapsed().as_secs_f64();
    result
}

async fn install(
    host: &Host,
    t: &Target,
    observed: &Observed,
    verdict: Verdict,
    started: Instant,
) -> UnitReport {
    let unit = &t.desired.unit;
    let prepared = async {
        keep_generation(host, unit, observed).await?;
        host.write_file(&unit_path(unit), &t.desired.text, "0644")
            .await?;
        host.run_ok(&["systemctl", "daemon-reload"]).await?;
        Ok::<(), RemoteError>(())
    };
    if let Err(e) = prepared.await {
        // The file is either the complete old or the complete new unit; put the old one back.
        let mut detail = format!("installing failed: {}", error_chain(&e));
        if let Err(e) = restore(host, unit, observed, false).await {
            detail.push_str(&format!(
                "; restoring the previous unit failed too: {}",
                error_chain(&e)
            ));
            return report(t, Some(verdict), Outcome::RollbackFailed, detail, started);
        }
        return report(t, Some(verdict), Outcome::Error, detail, started);
    }
    if verdict == Verdict::ReloadOnly {
        return report(
            t,
            Some(verdict),
            Outcome::Reloaded,
            "unit replaced and daemon-reloaded; no restart".into(),
            started,
        );
    }
    let started_ok = async {
        if verdict == Verdict::Install {
            host.run_ok(&["systemctl", "enable", "--", unit]).await?;
        }
        host.run_ok(&["systemctl", "restart", "--", unit]).await?;
        Ok::<String, RemoteError>(host.unit_state(unit).await?.invocation_id)
    };
    let mut invocation = String::new();
    let verified = match started_ok.await {
        Ok(id) => {
            invocation = id;
            crash_window(host, unit, t.verify.crash_window).await
        }
        Err(e) => Err(VerifyError::Remote(e)),
    };
    match verified {
        Ok(_) => report(
            t,
            Some(verdict),
            Outcome::Converged,
            format!("restarted; no crash in {:?}", t.verify.crash_window),
            started,
        ),
        Err(failure) => {
            let secrets: Vec<Secret> = secret_values(&t.desired.model)
                .into_iter()
                .chain(
                    observed
                        .unit_text
                        .as_deref()
                        .map(|u| secret_values(&parse_unit(u)))
                        .unwrap_or_default(),
                )
                .map(|(name, value)| Secret {
                    name,
                    value,
                    placeholder: REDACTED,
                })
                .collect();
            let mut r = rollback(host, t, observed, verdict, &failure, started).await;
            // Read after the rollback, which gives journald time to take in the last lines of the
            // failed process; SGLang logs its resolved arguments, secrets included.
            r.journal = journal(host, &invocation)
                .await
                .map(|j| redact_text(&j, &secrets));
            r
        }
    }
}

async fn rollback(
    host: &Host,
    t: &Target,
    observed: &Observed,
    verdict: Verdict,
    failure: &VerifyError,
    started: Instant,
) -> UnitReport {
    let unit = &t.desired.unit;
    let failed = format!("verification failed: {}", error_chain(failure));
    let was_running = observed.state.active_state == "active";
    let restored = async {
        restore(host, unit, observed, was_running).await?;
        if observed.unit_text.is_some() && was_running {
            crash_window(host, unit, t.verify.crash_window).await?;
        }
        Ok::<(), VerifyError>(())
    };
    match restored.await {
        Ok(()) => {
            let back = match &observed.unit_text {
                None => "the new unit was stopped, disabled and removed",
                Some(_) if was_running => "the previous unit was restored, restarted and passed the crash window",
                Some(_) => "the previous unit was restored (it was not running before, so it was left stopped)",
            };
            report(
                t,
                Some(verdict),
                Outcome::RolledBack,
                format!("{failed}; {back}"),
                started,
            )
        }
        Err(e) => report(
            t,
            Some(verdict),
            Outcome::RollbackFailed,
            format!("{failed}; rollback failed: {}", error_chain(&e)),
            started,
        ),
    }
}

/// Puts the host's previous unit back (or removes a unit that was new), and restarts it when asked.
async fn restore(
    host: &Host,
    unit: &str,
    observed: &Observed,
    restart: bool,
) -> Result<(), RemoteError> {
    match &observed.unit_text {
        Some(previous) => {
            host.write_file(&unit_path(unit), previous, "0644").await?;
            host.run_ok(&["systemctl", "daemon-reload"]).await?;
            if restart {
                host.run_ok(&["systemctl", "restart", "--", unit]).await?;
            } else {
                host.run_ok(&["systemctl", "stop", "--", unit]).await?;
            }
        }
        None => {
            host.run(&["systemctl", "disable", "--now", "--", unit])
                .await?;
            host.run_ok(&["rm", "-f", "--", &unit_path(unit)]).await?;
            host.run_ok(&["systemctl", "daemon-reload"]).await?;
            host.run(&["systemctl", "reset-failed", "--", unit]).await?;
        }
    }
    Ok(())
}

fn unit_path(unit: &str) -> String {
    format!("{UNIT_DIR}/{unit}")
}

fn unit_state_dir(unit: &str) -> String {
    format!("{STATE_DIR}/{unit}")
}

/// Takes the unit's lock: `mkdir` is atomic, so of two runs exactly one gets it.
async fn lock(host: &Host, unit: &str, owner: &str) -> Result<(), String> {
    const SCRIPT: &str = "mkdir -p -m 0700 \"$1\" && mkdir -m 0700 \"$1/lock\" 2>/dev/null && printf '%s\\n' \"$2\" > \"$1/lock/owner\"";
    let dir = unit_state_dir(unit);
    let out = host
        .run(&["sh", "-c", SCRIPT, "sh", &dir, owner])
        .await
        .map_err(|e| error_chain(&e))?;
    if out.status == 0 {
        return Ok(());
    }
    let holder = host
        .read_file(&format!("{dir}/lock/owner"))
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    Err(format!(
        "{unit} on {} is locked by another apply ({}); if that run is dead, remove {dir}/lock",
        host.name(),
        holder.trim()
    ))
}

async fn unlock(host: &Host, unit: &str) -> Result<(), RemoteError> {
    host.run_ok(&["rm", "-rf", "--", &format!("{}/lock", unit_state_dir(unit))])
        .await
        .map(|_| ())
}

/// Copies the host's current unit into the unit's generations, keeping the newest few.
async fn keep_generation(host: &Host, unit: &str, observed: &Observed) -> Result<(), RemoteError> {
    let Some(previous) = &observed.unit_text else {
        return Ok(());
    };
    let dir = format!("{}/generations", unit_state_dir(unit));
    let name = format!("{dir}/{}.service", unix_now());
    host.run_ok(&["mkdir", "-p", "-m", "0700", "--", &dir])
        .await?;
    host.write_file(&name, previous, "0600").await?;
    const PRUNE: &str = "cd \"$1\" && ls -1 | sort -n | head -n -\"$2\" | xargs -r rm -f --";
    host.run_ok(&["sh", "-c", PRUNE, "sh", &dir, &GENERATIONS_KEPT.to_string()])
        .await?;
    Ok(())
}

/// The last lines the failed invocation logged, and systemd's lines about it.
async fn journal(host: &Host, invocation: &str) -> Option<String> {
    if invocation.is_empty() {
        return None;
    }
    let process = format!("_SYSTEMD_INVOCATION_ID={invocation}");
    let manager = format!("INVOCATION_ID={invocation}");
    let argv = [
        "journalctl",
        &process,
        "+",
        &manager,
        "-n",
        "50",
        "--no-pager",
        "-o",
        "cat",
    ];
    Some(host.run(&argv).await.ok()?.stdout)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}
