//! The bake (`verify.bake`): the rollout's canary replica, back in its router once every gate
//! passed, judged on the live traffic it serves against the stable replicas over the same window
//! (`reconcile_core::bake` judges; this file takes the looks). Three results, as Argo Rollouts'
//! analysis has them. Failed (worse beyond a limit and beyond chance, or restarted in the
//! window): the canary leaves the router, its previous unit is restored and verified, it goes
//! back in, and its host counts as failed, which stops the rollout. Inconclusive (too few
//! requests, a look that could not be taken): the canary stays and the rollout pauses
//! ([`BakeReport::paused`]). Passed: the rollout goes on.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reconcile_core::bake::{self, Judged, Snapshot, Verdict, Window};
use serde::Serialize;

use super::decide::UndoneBy;
use super::error::{ApplyError, RouterFailure};
use super::routed::TakenOut;
use super::undo::{self, undo, UndoError};
use super::{ApplyOptions, Outcome, UnitReport};
use crate::remote::http::Server;
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
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
    /// The verdict, why, and both sides' figures where the looks were taken.
    pub judged: Judged,
    /// Looks that failed and were taken again, each with its replica and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_looks: Vec<String>,
    pub detail: String,
}

/// How long a replica's look may keep failing (a busy event loop past `/metrics`' timeout, a
/// dropped connection or port forward) before the bake gives up on judging: three of those
/// timeouts. A look that fails once says nothing of the canary.
const LOOK_FOR: Duration = Duration::from_secs(30);

/// Why a look failed: worth another try ([`LookFailed::again`]), or not (no `--enable-metrics`,
/// figures it cannot read).
#[derive(Debug, thiserror::Error)]
enum LookFailed {
    /// The replica's host or server could not be reached.
    #[error("{}", error_chain(.0))]
    Unreached(#[source] RemoteError),
    /// `/metrics` did not answer.
    #[error("{0}")]
    Metrics(#[source] crate::remote::http::ApiError),
    /// `/metrics` answered 404: the server runs without `--enable-metrics`.
    #[error("/metrics answered 404 (no --enable-metrics)")]
    NoMetrics,
    /// `/metrics` answered figures that do not read.
    #[error("{0}")]
    Unreadable(#[source] reconcile_core::prometheus::BadLine),
}

impl LookFailed {
    /// Whether the look may pass when taken again.
    fn again(&self) -> bool {
        matches!(self, LookFailed::Unreached(_) | LookFailed::Metrics(_))
    }
}

/// Why the bake could not look at its replicas over the window: it is then inconclusive.
#[derive(Debug, thiserror::Error)]
enum WatchError {
    /// A look that will not pass when taken again.
    #[error("{host}'s /metrics: {source}")]
    Look { host: String, source: LookFailed },
    /// A look that kept failing for [`LOOK_FOR`].
    #[error("{host}'s /metrics, tried for {}s: {source}", LOOK_FOR.as_secs())]
    GaveUp { host: String, source: LookFailed },
    /// A signal ended the window (the signals module's words for it).
    #[error("interrupted: {0}")]
    Interrupted(String),
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
    async fn reach(t: &Target, ssh: &SshOptions) -> Result<(Box<dyn Host>, Server), RemoteError> {
        let host = remote::connect(&t.host, ssh).await?;
        let running = host
            .read_file(&format!("{}/{}", crate::plan::UNIT_DIR, t.desired.unit))
            .await?
            .map(|text| parse_unit(&text))
            .unwrap_or_else(|| t.desired.model.clone());
        let endpoint = Expect::from_unit(&running).endpoint;
        match host.server(&endpoint, t.verify.url.as_deref()).await {
            Ok(server) => Ok((host, server)),
            Err(e) => {
                host.close().await;
                Err(e)
            }
        }
    }

    async fn look_once(&mut self, ssh: &SshOptions) -> Result<Snapshot, LookFailed> {
        if self.reached.is_none() {
            self.reached = Some(
                Self::reach(self.target, ssh)
                    .await
                    .map_err(LookFailed::Unreached)?,
            );
        }
        let (_, server) = self.reached.as_ref().expect("reached just above");
        match server.metrics().await {
            Ok(Some(text)) => Snapshot::parse(&text).map_err(LookFailed::Unreadable),
            Ok(None) => Err(LookFailed::NoMetrics),
            Err(e) => {
                self.close().await;
                Err(LookFailed::Metrics(e))
            }
        }
    }

    /// A look, tried again for up to [`LOOK_FOR`] while it fails for a reason that may pass.
    async fn look(
        &mut self,
        ssh: &SshOptions,
        options: &ApplyOptions,
    ) -> Result<Snapshot, WatchError> {
        let until = Instant::now() + LOOK_FOR;
        loop {
            let host = self.name().to_string();
            let why = match self.look_once(ssh).await {
                Ok(snapshot) => return Ok(snapshot),
                Err(source) if !source.again() => return Err(WatchError::Look { host, source }),
                Err(why) => why,
            };
            if Instant::now() >= until {
                return Err(WatchError::GaveUp { host, source: why });
            }
            // Only a look taken again is listed: the last one, given up on, is the bake's error.
            self.failed
                .push(format!("{}'s /metrics: {why}", self.name()));
            tracing::info!(host = self.name(), error = %why, "bake: a look failed; trying again");
            let slept = tokio::time::sleep(Duration::from_secs(1));
            if options.cancel.run_until_cancelled(slept).await.is_none() {
                return Err(WatchError::Interrupted(crate::signals::interrupted()));
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
    // A replica this rollout installs the unit on for the first time serves nothing yet.
    let installed = join_all(stable.iter().map(|s| installed(s, ssh))).await;
    let stable: Vec<&Target> = stable
        .into_iter()
        .zip(installed)
        .filter_map(|(s, installed)| installed.then_some(s))
        .collect();
    if stable.is_empty() {
        report.notes.push(format!(
            "not baked: no other replica runs {} yet to judge it against",
            t.desired.unit
        ));
        return;
    }
    let started = Instant::now();
    let (judged, failed_looks) = judge(t, &stable, spec, ssh, options).await;
    let mut detail = format!("bake: {}", judged.describe());
    if let [.., last] = &failed_looks[..] {
        detail += &format!(
            " ({} look(s) failed and were taken again; the last: {last})",
            failed_looks.len()
        );
    }
    report.notes.push(detail.clone());
    if judged.verdict == Verdict::Failed {
        take_back(report, t, router, &detail, ssh, options).await;
    }
    report.bake = Some(BakeReport {
        seconds: started.elapsed().as_secs_f64(),
        stable: stable.iter().map(|s| s.host.clone()).collect(),
        judged,
        failed_looks,
        detail,
    });
}

/// Whether `t`'s host has its unit file; a host that cannot be asked is taken to have it (its
/// look then fails, and the bake says so).
async fn installed(t: &Target, ssh: &SshOptions) -> bool {
    let Ok(host) = remote::connect(&t.host, ssh).await else {
        return true;
    };
    let unit = host
        .read_file(&format!("{}/{}", crate::plan::UNIT_DIR, t.desired.unit))
        .await;
    host.close().await;
    !matches!(unit, Ok(None))
}

impl BakeReport {
    /// Why the rollout pauses after this bake: it could not judge the canary, which stays.
    pub fn paused(&self) -> Option<&str> {
        (self.judged.verdict == Verdict::Inconclusive)
            .then(|| self.judged.why.first().map_or("", String::as_str))
    }
}

/// Both sides looked at after the warm-up, the window waited out, looked at again, and judged;
/// with the looks that failed on the way. A bake that cannot look (a look given up on, a
/// signal) is inconclusive.
async fn judge(
    t: &Target,
    stable: &[&Target],
    spec: &crate::manifest::BakeSpec,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> (Judged, Vec<String>) {
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
    let judged = match watched {
        Ok((before, after)) => compare(t, stable, spec, &before, &after),
        Err(why) => Judged::inconclusive(format!("could not look: {why}")),
    };
    (judged, failed)
}

/// The canary's window against the stable replicas' together. A canary whose counters went
/// down restarted in the window: failed, whatever else it served. A stable replica that did
/// leaves nothing to judge against.
fn compare(
    t: &Target,
    stable: &[&Target],
    spec: &crate::manifest::BakeSpec,
    before: &[Snapshot],
    after: &[Snapshot],
) -> Judged {
    let Some(canary_window) = Window::between(&before[0], &after[0]) else {
        return Judged::failed(format!(
            "{} restarted during the bake (its /metrics counters went down)",
            t.host
        ));
    };
    let mut stable_windows = Vec::new();
    for (i, s) in stable.iter().enumerate() {
        match Window::between(&before[i + 1], &after[i + 1]) {
            Some(w) => stable_windows.push(w),
            None => {
                return Judged::inconclusive(format!(
                    "the stable replica {} restarted during the bake",
                    s.host
                ))
            }
        }
    }
    match Window::merged(&stable_windows) {
        Some(stable_window) => bake::judge(&canary_window, &stable_window, &spec.limits()),
        None => {
            Judged::inconclusive("the stable replicas' histograms have different buckets".into())
        }
    }
}

/// The replicas' looks at the start and the end of the window (the canary first).
async fn watch(
    replicas: &mut [Replica<'_>],
    spec: &crate::manifest::BakeSpec,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Result<(Vec<Snapshot>, Vec<Snapshot>), WatchError> {
    let (canary, stable) = replicas.split_first().expect("the canary comes first");
    // Shown as it goes: a spinner's text on a terminal, a line at the start elsewhere.
    let show = Progress::new(
        format!("{} {} (bake)", canary.name(), canary.target.desired.unit),
        options.progress.as_ref(),
    );
    let warmup = if spec.warmup.is_zero() {
        String::new()
    } else {
        format!(" after a {}s warm-up", spec.warmup.as_secs())
    };
    show.line(&format!(
        "baking on live traffic for {}s{warmup} against {}",
        spec.duration.as_secs(),
        stable
            .iter()
            .map(Replica::name)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    count_down(&show, "warming up on live traffic", spec.warmup, options).await?;
    let before = looks(replicas, ssh, options).await?;
    count_down(&show, "baking on live traffic", spec.duration, options).await?;
    Ok((before, looks(replicas, ssh, options).await?))
}

/// Waits `span` out, saying how much is left; a signal ends it early.
async fn count_down(
    show: &Progress,
    doing: &str,
    span: Duration,
    options: &ApplyOptions,
) -> Result<(), WatchError> {
    let until = Instant::now() + span;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        show.status(&format!("{doing}: {}s left", left.as_secs()));
        let slept = tokio::time::sleep(left.min(Duration::from_secs(1)));
        if options.cancel.run_until_cancelled(slept).await.is_none() {
            return Err(WatchError::Interrupted(crate::signals::interrupted()));
        }
    }
}

/// Every replica's `/metrics` at once, the canary first.
async fn looks(
    replicas: &mut [Replica<'_>],
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Result<Vec<Snapshot>, WatchError> {
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
    router: crate::router::Connected,
    why: &str,
    ssh: &SshOptions,
    options: &ApplyOptions,
) {
    let out = match router {
        Ok(router) => TakenOut::take_out(router, t)
            .await
            .map_err(UndoError::NotTakenOut),
        Err(e) => Err(UndoError::NotTakenOut(ApplyError::Router(
            RouterFailure::Unreachable(e),
        ))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::testing::target;

    /// A replica's `/metrics` after `requests` first tokens in the 0.1 s bucket.
    fn look(requests: u32) -> Snapshot {
        let name = bake::TTFT;
        Snapshot::parse(&format!(
            "{name}_bucket{{le=\"0.1\"}} {requests}\n{name}_bucket{{le=\"+Inf\"}} {requests}\n\
             {}{{}} {requests}\n",
            bake::REQUESTS
        ))
        .unwrap()
    }

    fn spec() -> crate::manifest::BakeSpec {
        crate::manifest::BakeSpec::lasting(Duration::from_secs(60))
    }

    #[test]
    fn a_canary_that_restarted_in_the_window_failed_and_a_stable_one_leaves_it_undecided() {
        let (canary, mut other) = (target(), target());
        other.host = "gpu-b".into();
        let stable = [&other];
        let judge = |before: &[Snapshot], after: &[Snapshot]| {
            compare(&canary, &stable, &spec(), before, after)
        };
        // The canary's counters went down: it restarted, whatever it served.
        let judged = judge(&[look(50), look(50)], &[look(3), look(500)]);
        assert_eq!(judged.verdict, Verdict::Failed);
        assert_eq!(
            judged.why,
            ["gpu-a restarted during the bake (its /metrics counters went down)"]
        );
        let judged = judge(&[look(50), look(50)], &[look(500), look(3)]);
        assert_eq!(judged.verdict, Verdict::Inconclusive);
        assert_eq!(
            judged.why,
            ["the stable replica gpu-b restarted during the bake"]
        );
        // Both served alike, on enough requests: passed.
        let judged = judge(&[look(0), look(0)], &[look(200), look(200)]);
        assert_eq!(judged.verdict, Verdict::Passed, "{judged:?}");
    }
}
