//! The bake (`verify.bake`): the rollout's canary replica, back in its router once every gate
//! passed, judged on the live traffic it serves against the stable replicas over the same window
//! (`reconcile_core::bake` judges; this file takes the looks). Worse beyond the limits: the canary
//! leaves the router, its previous unit is restored and verified, it goes back in, and its host
//! counts as failed, which stops the rollout. Too few requests, or a look that could not be
//! taken: the canary stays, and its report says so.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reconcile_core::bake::{self, Snapshot, Window};
use serde::Serialize;

use super::decide::UndoneBy;
use super::routed::TakenOut;
use super::undo::{self, undo, UndoError};
use super::{ApplyOptions, Outcome, UnitReport};
use crate::remote::http::Server;
use crate::remote::{self, error_chain, Host, SshOptions};
use crate::targets::Target;
use crate::unit::parse_unit;
use crate::verify::{Expect, Progress};

/// What the bake saw, in the canary's report.
#[derive(Debug, Clone, Serialize)]
pub struct BakeReport {
    /// How long the canary served live traffic before it was judged.
    pub seconds: f64,
    /// The stable replicas it was judged against.
    pub stable: Vec<String>,
    /// The verdict and both sides' figures; absent when a look could not be taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judged: Option<bake::Verdict>,
    /// Looks that failed and were taken again, each with its replica and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_looks: Vec<String>,
    pub detail: String,
}

/// How long a replica's look may keep failing (a busy event loop past `/metrics`' timeout, a
/// dropped connection or port forward) before the bake gives up on judging: three of those
/// timeouts. A look that fails once says nothing of the canary.
const LOOK_FOR: Duration = Duration::from_secs(30);

/// Why a look failed: worth another try, or not (no `--enable-metrics`, figures it cannot read).
enum LookFailed {
    Again(String),
    Final(String),
}

/// One replica's `/metrics`, reached as verification reaches a server; reached again after a
/// look failed.
struct Replica<'t> {
    target: &'t Target,
    reached: Option<(Box<dyn Host>, Server)>,
    /// Why each failed look failed, for the report.
    failed: Vec<String>,
}

impl<'t> Replica<'t> {
    fn of(target: &'t Target) -> Replica<'t> {
        Replica {
            target,
            reached: None,
            failed: Vec::new(),
        }
    }

    fn name(&self) -> &str {
        &self.target.host
    }

    /// The server as its host runs it now: the endpoint of the unit on disk, which for a stable
    /// replica is the one before this rollout.
    async fn reach(t: &Target, ssh: &SshOptions) -> Result<(Box<dyn Host>, Server), String> {
        let host = remote::connect(&t.host, ssh)
            .await
            .map_err(|e| error_chain(&e))?;
        let running = host
            .read_file(&format!("{}/{}", crate::plan::UNIT_DIR, t.desired.unit))
            .await
            .map_err(|e| error_chain(&e))?
            .map(|text| parse_unit(&text))
            .unwrap_or_else(|| t.desired.model.clone());
        let endpoint = Expect::from_unit(&running).endpoint;
        match host.server(&endpoint, t.verify.url.as_deref()).await {
            Ok(server) => Ok((host, server)),
            Err(e) => {
                host.close().await;
                Err(error_chain(&e))
            }
        }
    }

    async fn look_once(&mut self, ssh: &SshOptions) -> Result<Snapshot, LookFailed> {
        if self.reached.is_none() {
            self.reached = Some(
                Self::reach(self.target, ssh)
                    .await
                    .map_err(LookFailed::Again)?,
            );
        }
        let (_, server) = self.reached.as_ref().expect("reached just above");
        match server.metrics().await {
            Ok(Some(text)) => Snapshot::parse(&text).map_err(|e| LookFailed::Final(e.to_string())),
            Ok(None) => Err(LookFailed::Final(
                "/metrics answered 404 (no --enable-metrics)".into(),
            )),
            Err(e) => {
                self.close().await;
                Err(LookFailed::Again(e))
            }
        }
    }

    /// A look, tried again for up to [`LOOK_FOR`] while it fails for a reason that may pass.
    async fn look(&mut self, ssh: &SshOptions, options: &ApplyOptions) -> Result<Snapshot, String> {
        let until = Instant::now() + LOOK_FOR;
        loop {
            let why = match self.look_once(ssh).await {
                Ok(snapshot) => return Ok(snapshot),
                Err(LookFailed::Final(why)) => {
                    return Err(format!("{}'s /metrics: {why}", self.name()))
                }
                Err(LookFailed::Again(why)) => why,
            };
            if Instant::now() >= until {
                return Err(format!(
                    "{}'s /metrics, tried for {}s: {why}",
                    self.name(),
                    LOOK_FOR.as_secs()
                ));
            }
            // Only a look taken again is listed: the last one, given up on, is the bake's error.
            self.failed
                .push(format!("{}'s /metrics: {why}", self.name()));
            tracing::info!(host = self.name(), error = %why, "bake: a look failed; trying again");
            let slept = tokio::time::sleep(Duration::from_secs(1));
            if options.cancel.run_until_cancelled(slept).await.is_none() {
                return Err(format!("interrupted: {}", crate::signals::interrupted()));
            }
        }
    }

    async fn close(&mut self) {
        if let Some((host, _)) = self.reached.take() {
            host.close().await;
        }
    }
}

/// Bakes the canary whose apply ended as `report`, when its manifest asks (`verify.bake`), it
/// converged, and it sits behind a router; the stable replicas are its manifest's hosts in `all`
/// that are not among the rollout's `canaries` (which this rollout changed). Says in `report` what
/// the bake saw, and rolls the canary back when it was worse.
pub(super) async fn canary(
    report: &mut UnitReport,
    all: &[Target],
    canaries: &[String],
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let Some(t) = all
        .iter()
        .find(|t| t.host == report.host && t.desired.unit == report.unit)
    else {
        return;
    };
    let Some(spec) = t.verify.bake.as_ref() else {
        return;
    };
    let router = options.routers.as_ref().and_then(|r| r.of(t));
    let (Outcome::Converged, Some(router)) = (report.outcome, router) else {
        return;
    };
    let stable: Vec<&Target> = all
        .iter()
        .filter(|s| {
            s.source == t.source && s.desired.unit == t.desired.unit && !canaries.contains(&s.host)
        })
        .collect();
    let started = Instant::now();
    let (judged, failed_looks) = judge(t, &stable, spec, ssh, options).await;
    let mut baked = BakeReport {
        seconds: started.elapsed().as_secs_f64(),
        stable: stable.iter().map(|s| s.host.clone()).collect(),
        judged: None,
        failed_looks,
        detail: String::new(),
    };
    match judged {
        Err(why) => {
            baked.detail = format!("bake could not judge the canary ({why}); it stays");
            report.notes.push(baked.detail.clone());
        }
        Ok(verdict) => {
            baked.detail = format!("bake: {}", verdict.describe());
            if let [.., last] = &baked.failed_looks[..] {
                baked.detail += &format!(
                    " ({} look(s) failed and were taken again; the last: {last})",
                    baked.failed_looks.len()
                );
            }
            report.notes.push(baked.detail.clone());
            if matches!(verdict, bake::Verdict::Worse { .. }) {
                let why = baked.detail.clone();
                take_back(report, t, router, &why, ssh, options).await;
            }
            baked.judged = Some(verdict);
        }
    }
    report.bake = Some(baked);
}

/// Both sides looked at, the window waited out (a signal ends it early: not judged), looked at
/// again, and judged; with the looks that failed on the way.
async fn judge(
    t: &Target,
    stable: &[&Target],
    spec: &crate::manifest::BakeSpec,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> (Result<bake::Verdict, String>, Vec<String>) {
    if stable.is_empty() {
        return (
            Err("no stable replica to judge it against".into()),
            Vec::new(),
        );
    }
    let mut replicas: Vec<Replica> = std::iter::once(t)
        .chain(stable.iter().copied())
        .map(Replica::of)
        .collect();
    let watched = watch(&mut replicas, spec, ssh, options).await;
    join_all(replicas.iter_mut().map(Replica::close)).await;
    let failed = replicas
        .iter_mut()
        .flat_map(|r| std::mem::take(&mut r.failed))
        .collect();
    (
        watched.and_then(|(before, after)| compare(t, stable, spec, &before, &after)),
        failed,
    )
}

/// The canary's window against the stable replicas' together.
fn compare(
    t: &Target,
    stable: &[&Target],
    spec: &crate::manifest::BakeSpec,
    before: &[Snapshot],
    after: &[Snapshot],
) -> Result<bake::Verdict, String> {
    let window = |i: usize, name: &str| {
        Window::between(&before[i], &after[i])
            .ok_or_else(|| format!("{name} restarted during the bake"))
    };
    let canary_window = window(0, &t.host)?;
    let stable_windows = stable
        .iter()
        .enumerate()
        .map(|(i, s)| window(i + 1, &s.host))
        .collect::<Result<Vec<_>, _>>()?;
    let stable_window = Window::merged(&stable_windows)
        .ok_or("the stable replicas' histograms have different buckets")?;
    Ok(bake::judge(&canary_window, &stable_window, &spec.limits()))
}

/// The replicas' looks at the start and the end of the window (the canary first).
async fn watch(
    replicas: &mut [Replica<'_>],
    spec: &crate::manifest::BakeSpec,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Result<(Vec<Snapshot>, Vec<Snapshot>), String> {
    let before = looks(replicas, ssh, options).await?;
    let (canary, stable) = replicas.split_first().expect("the canary comes first");
    // Shown as it goes: a spinner's text on a terminal, a line at the start elsewhere.
    let show = Progress::new(
        format!("{} {} (bake)", canary.name(), canary.target.desired.unit),
        options.progress.as_ref(),
    );
    show.line(&format!(
        "baking on live traffic for {}s against {}",
        spec.duration.as_secs(),
        stable
            .iter()
            .map(Replica::name)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let until = Instant::now() + spec.duration;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        show.status(&format!("baking on live traffic: {}s left", left.as_secs()));
        let slept = tokio::time::sleep(left.min(Duration::from_secs(1)));
        if options.cancel.run_until_cancelled(slept).await.is_none() {
            return Err(format!("interrupted: {}", crate::signals::interrupted()));
        }
    }
    Ok((before, looks(replicas, ssh, options).await?))
}

/// Every replica's `/metrics` at once, the canary first.
async fn looks(
    replicas: &mut [Replica<'_>],
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Result<Vec<Snapshot>, String> {
    join_all(replicas.iter_mut().map(|r| r.look(ssh, options)))
        .await
        .into_iter()
        .collect()
}

/// The canary, worse than the stable replicas, out of its router, back on its previous unit
/// (verified) and in again; its report says so, and its host counts as failed.
async fn take_back(
    report: &mut UnitReport,
    t: &Target,
    router: Result<std::sync::Arc<crate::router::Router>, String>,
    why: &str,
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let out = match router {
        Ok(router) => TakenOut::take_out(router, t)
            .await
            .map_err(|e| UndoError::NotTakenOut(e.to_string())),
        Err(e) => Err(UndoError::NotTakenOut(e)),
    };
    let (restored, out) = match out {
        Err(e) => (Err(e), None),
        Ok(out) => {
            let restored = match remote::connect(&t.host, ssh).await {
                Ok(host) => {
                    let restored = undo(&*host, report, t, options, UndoneBy::Bake).await;
                    host.close().await;
                    restored
                }
                Err(e) => Err(UndoError::Unreachable(e)),
            };
            (restored, Some(out))
        }
    };
    undo::report(report, why, UndoneBy::Bake, restored);
    // Back in on its previous unit, verified; a failed rollback stays out.
    if let Some(out) = out {
        out.put_back(report).await;
    }
}
