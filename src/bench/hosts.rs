//! `reconcile bench`: the benchmark alone, against the server each host runs now (no restart),
//! under the unit's lock; its figures become the current deployment record's (`current.json`), so
//! the next apply compares with them.

use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::apply::state::{self, LockPolicy, Owner};
use crate::benchmark::{judge, BenchmarkReport, Level};
use crate::manifest::BenchmarkSpec;
use crate::remote::{error_chain, Host, Server, SshOptions};
use crate::unit::parse_unit;
use crate::verify::Expect;

/// What `reconcile bench` needs besides the hosts.
pub struct BenchOptions<'a> {
    pub spec: &'a BenchmarkSpec,
    /// `verify.url` of the manifest: reach the server there instead of a port forward.
    pub url: Option<&'a str>,
    pub owner: Owner,
    pub lock: LockPolicy,
    /// Cancelled on Ctrl-C: stops the benchmark; nothing is stored.
    pub cancel: CancellationToken,
    /// Each finished level, for live progress (host, figures).
    pub on_level: &'a (dyn Fn(&str, &Level) + Sync),
}

/// One host's benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct HostBench {
    pub host: String,
    pub unit: String,
    /// The figures, and how they compare with those the current record had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<BenchmarkReport>,
    /// The figures were written into the current deployment record.
    pub stored: bool,
    pub notes: Vec<String>,
    pub error: Option<String>,
    pub seconds: f64,
}

impl HostBench {
    fn new(host: &str, unit: &str) -> HostBench {
        HostBench {
            host: host.to_string(),
            unit: unit.to_string(),
            benchmark: None,
            stored: false,
            notes: Vec::new(),
            error: None,
            seconds: 0.0,
        }
    }
}

/// Benchmarks `unit` on each host (at most `at_once` at once).
pub async fn bench_hosts(
    hosts: &[String],
    unit: &str,
    ssh: &SshOptions,
    at_once: usize,
    options: &BenchOptions<'_>,
) -> Vec<HostBench> {
    crate::fleet::each_host(
        hosts.iter().map(|h| (h.clone(), ())),
        ssh,
        at_once,
        crate::fleet::no_span,
        async |host: &dyn Host, visit: &crate::fleet::Visit<'_>, ()| {
            let mut out = HostBench::new(visit.name, unit);
            if let Err(e) = bench_host(host, unit, options, &mut out).await {
                out.error = Some(e);
            }
            out.seconds = visit.started.elapsed().as_secs_f64();
            out
        },
        |visit, (), e| HostBench {
            error: Some(format!("unreachable: {}", error_chain(&e))),
            seconds: visit.started.elapsed().as_secs_f64(),
            ..HostBench::new(visit.name, unit)
        },
    )
    .await
}

async fn bench_host(
    host: &dyn Host,
    unit: &str,
    options: &BenchOptions<'_>,
    out: &mut HostBench,
) -> Result<(), String> {
    let text = crate::systemd::running_unit(host, unit, "benchmark")
        .await
        .map_err(|e| e.to_string())?;
    let note = state::lock(host, unit, &options.owner, options.lock)
        .await
        .map_err(|e| e.to_string())?;
    out.notes.extend(note);
    let result = measure_and_store(host, unit, &text, options, out).await;
    state::unlock_noting(host, unit, &mut out.notes).await;
    result
}

/// Under the lock: the current record, the benchmark, and the record rewritten with its figures.
async fn measure_and_store(
    host: &dyn Host,
    unit: &str,
    unit_text: &str,
    options: &BenchOptions<'_>,
    out: &mut HostBench,
) -> Result<(), String> {
    let record = state::read_record(host, unit)
        .await
        .map_err(|e| e.to_string())?;
    let expect = Expect::from_unit(&parse_unit(unit_text));
    let server = host
        .server(&expect.endpoint, options.url)
        .await
        .map_err(|e| error_chain(&e))?;
    let name = host.name().to_string();
    let on_level = |l: &Level| (options.on_level)(&name, l);
    let measured = tokio::select! {
        m = super::run(&server, &expect.model_id, options.spec, &on_level) => m,
        _ = options.cancel.cancelled() => return Err(crate::signals::interrupted()),
    };
    let previous = record.as_ref().and_then(|r| r.benchmark.as_ref());
    let report = judge(
        options.spec,
        measured.record,
        previous,
        measured.first_error.as_deref(),
    );
    let figures = report.record();
    let failed =
        (report.verdict == crate::benchmark::Verdict::Failed).then(|| report.detail.clone());
    out.benchmark = Some(report);
    if let Some(e) = failed {
        return Err(format!("{e}; nothing was stored"));
    }
    let Some(mut record) = record else {
        return Err(format!(
            "{unit} on {} has no deployment record to keep the figures in (apply it first); nothing was stored",
            host.name()
        ));
    };
    if record.unit_sha256 != state::sha256(unit_text) {
        out.notes.push(
            "the unit on disk is not the one the current record installed; the figures were stored in that record anyway".into(),
        );
    }
    record.benchmark = figures;
    state::write_current(host, &record)
        .await
        .map_err(|e| error_chain(&e))?;
    out.stored = true;
    Ok(())
}

/// The benchmark against `url` alone: no host, no record (the client overhead bench,
/// `bench/client.sh`).
pub async fn bench_url(url: &str, model: &str, options: &BenchOptions<'_>) -> HostBench {
    let mut out = HostBench::new(url, "-");
    let started = Instant::now();
    match Server::at(url, None) {
        Ok(server) => {
            let on_level = |l: &Level| (options.on_level)(url, l);
            let m = super::run(&server, model, options.spec, &on_level).await;
            let report = judge(options.spec, m.record, None, m.first_error.as_deref());
            if report.verdict == crate::benchmark::Verdict::Failed {
                out.error = Some(report.detail.clone());
            }
            out.benchmark = Some(report);
        }
        Err(e) => out.error = Some(e.to_string()),
    }
    out.seconds = started.elapsed().as_secs_f64();
    out
}
