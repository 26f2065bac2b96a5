//! The figures of one run: the baseline benchmarked where it runs (no restart: it is already
//! verified), and a variant's from apply's report of it.

use std::time::Duration;

use reconcile_core::experiment::results::{RunResult, Status};
use reconcile_core::experiment::Variant;
use tokio_util::sync::CancellationToken;

use crate::apply::{Outcome, UnitReport};
use crate::benchmark::Level;
use crate::manifest::BenchmarkSpec;
use crate::remote::{error_chain, Host, RemoteError};
use crate::targets::Target;
use crate::verify::{Expect, Verification};

/// What a quality measurement is taken to cost in the estimate before any was timed: the
/// stand-in's default prompts take about a second, a real server's (short prompts, the needle at
/// a few lengths, the cases) some ten seconds.
pub const QUALITY_GUESS_SECONDS: f64 = 15.0;

/// The running baseline's benchmark. `None` when a stop signal cut it short.
pub async fn baseline(
    host: &dyn Host,
    t: &Target,
    spec: &BenchmarkSpec,
    cancel: &CancellationToken,
) -> Option<RunResult> {
    let expect = Expect::from_unit(&t.desired.model);
    let started = std::time::Instant::now();
    let measured = async {
        let server = host
            .server(&expect.endpoint, t.verify.url.as_deref())
            .await?;
        let on_level = |l: &Level| eprintln!("baseline {}", crate::bench::level_line(l));
        Ok::<_, RemoteError>(crate::bench::run(&server, &expect.model_id, spec, &on_level).await)
    };
    let measured = cancel.run_until_cancelled(measured).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (status, detail, levels) = match measured {
        Ok(m) => match m.first_error {
            None => (
                Status::Measured,
                "benchmarked where it runs".to_string(),
                m.record.levels,
            ),
            Some(e) => (
                Status::Failed,
                format!("requests failed: {e}"),
                m.record.levels,
            ),
        },
        Err(e) => (
            Status::Failed,
            format!("the server could not be reached: {}", error_chain(&e)),
            Vec::new(),
        ),
    };
    Some(RunResult {
        name: "baseline".into(),
        changes: Vec::new(),
        status,
        detail,
        failed_stage: None,
        diagnosis: None,
        levels,
        quality: Some("reference".into()),
        seconds,
        server_seconds: seconds,
    })
}

/// A variant's result from apply's report of it and of the baseline's restore after it
/// (`None`: its own rollback restored the baseline), and systemd's stop times of the old server
/// in each (`stops`, seconds).
pub fn result_of(
    v: &Variant,
    report: &UnitReport,
    restore: Result<&Option<UnitReport>, &super::BaselineError>,
    took: Duration,
    stops: f64,
) -> RunResult {
    let status = match report.outcome {
        Outcome::Converged | Outcome::Reloaded | Outcome::Unchanged => Status::Measured,
        Outcome::RolledBack => Status::RolledBack,
        _ => Status::Failed,
    };
    let levels = report
        .benchmark
        .as_ref()
        .map(|b| b.levels.clone())
        .unwrap_or_default();
    let quality = report.quality.as_ref().and_then(|q| {
        serde_json::to_value(q.verdict)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
    });
    let restore_seconds = match restore {
        Ok(Some(r)) => server_seconds(r),
        _ => 0.0,
    };
    RunResult {
        name: v.name.clone(),
        changes: v.changes.iter().map(|c| c.text()).collect(),
        status,
        detail: report.detail.clone(),
        failed_stage: report.failed_stage,
        diagnosis: report
            .diagnosis
            .as_ref()
            .map(|d| format!("{} ({})", d.cause, d.advice)),
        levels,
        quality,
        seconds: took.as_secs_f64(),
        server_seconds: (server_seconds(report) + restore_seconds + stops).min(took.as_secs_f64()),
    }
}

/// The server's share of an apply: from each restart to the end of its last stage (load,
/// verification windows, benchmark, quality), for the new unit and for a rollback's restore, the
/// drain, and the quality gate's measurement of the old server before the restart. The rest of the apply's time is the experiment's own: SSH round trips, the plan,
/// preflight, writing the unit and records, systemd's stop of the old server.
pub fn server_seconds(r: &UnitReport) -> f64 {
    let span = |v: &Option<Verification>| {
        v.as_ref()
            .and_then(|v| v.stages.last())
            .map_or(0.0, |s| s.seconds)
    };
    let drain = r.drain.as_ref().map_or(0.0, |d| d.seconds);
    let quality_before = r
        .quality
        .as_ref()
        .and_then(|q| q.before_seconds)
        .unwrap_or(0.0);
    span(&r.verification) + span(&r.rollback) + drain + quality_before
}
