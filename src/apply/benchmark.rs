//! The `benchmark` stage: after every other stage passed, when the manifest has
//! `verify.benchmark`, the throughput benchmark (`crate::bench`) runs against the new server, and
//! its figures are judged against the previous deployment's (`reconcile_core::benchmark::judge`).
//! A regression with the gate on fails the stage, which rolls back like any other.

use std::time::Instant;

use super::Job;
use crate::bench;
use crate::benchmark::{judge, BenchmarkReport, Level};
use crate::manifest::BenchmarkSpec;
use crate::remote::{error_chain, RemoteError};
use crate::state::Record;
use crate::verify::{Stage, Verification};

/// Runs the benchmark against the unit just verified (`v`, which gains the stage) and judges it
/// against `before`, the deployment record read before the restart.
pub async fn stage(
    job: &Job<'_>,
    spec: &BenchmarkSpec,
    v: &mut Verification,
    before: Option<&Record>,
) -> BenchmarkReport {
    let (expect, progress) = job.measuring("benchmark");
    let started = Instant::now();
    let measured = async {
        let server = job.server(&expect).await?;
        let on_level = |l: &Level| progress.line(&bench::level_line(l));
        Ok::<_, RemoteError>(bench::run(&server, &expect.model_id, spec, &on_level).await)
    };
    let report = tokio::select! {
        m = measured => match m {
            Ok(m) => judge(
                spec,
                m.record,
                before.and_then(|r| r.benchmark.as_ref()),
                m.first_error.as_deref(),
            ),
            Err(e) => BenchmarkReport::could_not_run(spec, &error_chain(&e)),
        },
        _ = job.options.cancel.cancelled() => BenchmarkReport::could_not_run(spec, &crate::signals::interrupted()),
    };
    v.push_after(Stage::Benchmark, !report.fails(), started, &report.detail);
    progress.stage(Stage::Benchmark, !report.fails(), &report.detail);
    report
}
