//! `reconcile bench`: the benchmark alone, against the server each host runs now (no restart),
//! under the unit's lock; its figures become the current deployment record's (`current.json`), so
//! the next apply compares with them.

use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::running::{each_running, HostResult, Parts, Visit};
use crate::benchmark::{judge, BenchmarkReport, Level};
use crate::manifest::BenchmarkSpec;
use crate::remote::{error_chain, Host, RemoteError, Server, SshOptions};
use crate::state::{self, LockPolicy, Owner, RecordError};
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

impl HostResult for HostBench {
    fn new(host: &str, unit: &str) -> HostBench {
        HostBench::new(host, unit)
    }

    fn parts(&mut self) -> Parts<'_> {
        (&mut self.notes, &mut self.error, &mut self.seconds)
    }
}

/// Why a host's benchmark was not stored, once its unit was found running and locked.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The current deployment record did not read.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The server could not be reached (its port forward, or its client).
    #[error("{}", error_chain(.source))]
    Server {
        #[source]
        source: RemoteError,
    },
    /// Ctrl-C or SIGTERM stopped the benchmark (`signals::interrupted`'s words).
    #[error("{message}")]
    Interrupted { message: String },
    /// The benchmark's verdict is a failure: its detail.
    #[error("{detail}; nothing was stored")]
    Failed { detail: String },
    /// The unit runs, but no apply recorded it: nowhere to keep the figures.
    #[error("{unit} on {host} has no deployment record to keep the figures in (apply it first); nothing was stored")]
    NoRecord { unit: String, host: String },
    /// The record with the figures was not written.
    #[error("{}", error_chain(.source))]
    Write {
        #[source]
        source: RemoteError,
    },
}

/// Benchmarks `unit` on each host (at most `at_once` at once).
pub async fn bench_hosts(
    hosts: &[String],
    unit: &str,
    ssh: &SshOptions,
    at_once: usize,
    options: &BenchOptions<'_>,
) -> Vec<HostBench> {
    let visit = Visit {
        unit,
        to: "benchmark",
        owner: &options.owner,
        lock: options.lock,
    };
    each_running(
        hosts,
        ssh,
        at_once,
        &visit,
        async |host: &dyn Host, text: &str, out: &mut HostBench| {
            measure_and_store(host, unit, text, options, out).await
        },
    )
    .await
}

/// Under the lock: the current record, the benchmark, and the record rewritten with its figures.
async fn measure_and_store(
    host: &dyn Host,
    unit: &str,
    unit_text: &str,
    options: &BenchOptions<'_>,
    out: &mut HostBench,
) -> Result<(), BenchError> {
    let record = state::read_record(host, unit).await?;
    let expect = Expect::from_unit(&parse_unit(unit_text));
    let server = host
        .server(&expect.endpoint, options.url)
        .await
        .map_err(|source| BenchError::Server { source })?;
    let name = host.name().to_string();
    let on_level = |l: &Level| (options.on_level)(&name, l);
    let measured = tokio::select! {
        m = super::run(&server, &expect.model_id, options.spec, &on_level) => m,
        _ = options.cancel.cancelled() => return Err(BenchError::Interrupted { message: crate::signals::interrupted() }),
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
        return Err(BenchError::Failed { detail: e });
    }
    let Some(mut record) = record else {
        return Err(BenchError::NoRecord {
            unit: unit.to_string(),
            host: host.name().to_string(),
        });
    };
    if record.unit_sha256 != state::sha256(unit_text) {
        out.notes.push(
            "the unit on disk is not the one the current record installed; the figures were stored in that record anyway".into(),
        );
    }
    record.benchmark = figures;
    state::write_current(host, &record)
        .await
        .map_err(|source| BenchError::Write { source })?;
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
