//! `Step::Gates`: rank 0's throughput and quality gates, and what they compare with, read before
//! anything changes: the quality reference just before the drain (the driver calls
//! `quality_reference`), the benchmark's record at the arm (`benchmark_before`).

use reconcile_core::transaction::Went;

use super::{Carried, Cause, Rank};
use crate::apply::guard::{self, Armed};
use crate::apply::install;
use crate::plan::Verdict;
use crate::state;
use crate::verify::{Stage, Verification};

/// The quality gate's reference and noise floor, read from rank 0 while the old server serves,
/// so the driver reads it just before the drain. Not for `reconcile rollback`: a kept
/// deployment is put back because the newest went wrong, and the newest is what the reference
/// may come from.
pub(super) async fn quality_reference(ranks: &[Rank<'_>]) -> Option<crate::apply::quality::Before> {
    let options = ranks[0].job.options;
    match (&ranks[0].job.t.verify.quality, ranks[0].verdict) {
        (Some(spec), Verdict::Restart | Verdict::Install | Verdict::Live)
            if options.restoring.is_none() =>
        {
            let previous = ranks[0]
                .fallback
                .was_running
                .then(|| ranks[0].fallback.previous_expect())
                .flatten();
            let live = ranks[0].verdict == Verdict::Live;
            let job = &ranks[0].job;
            Some(crate::apply::quality::before(job, spec, previous.as_ref(), live).await)
        }
        _ => None,
    }
}

/// The current deployment's record, read before the restart: the figures the benchmark stage
/// compares with. None without a benchmark.
pub(super) async fn benchmark_before(rank0: &Rank<'_>) -> Option<crate::record::Record> {
    match &rank0.job.t.verify.benchmark {
        Some(_) => state::read_record(rank0.job.host, &rank0.job.t.desired.unit)
            .await
            .ok()
            .flatten(),
        None => None,
    }
}

/// `Step::Gates`, under the guards' lease: the new quality reference to keep, or the gate that
/// failed.
pub(super) async fn gates(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    let gates = rank0_gates(
        &mut ranks[0],
        &mut c.verified[0],
        c.before.as_ref(),
        c.quality_before.as_ref(),
    );
    match guard::leased_all(&guards, gates).await {
        Ok(k) => {
            c.keep = k;
            Went::Passed
        }
        Err(cause) => {
            c.failed = Some((vec![cause], Vec::new()));
            Went::Failed
        }
    }
}

/// Rank 0's throughput and quality gates (the server's API is rank 0's): the reference to keep,
/// or the gate that failed.
async fn rank0_gates(
    rank0: &mut Rank<'_>,
    v: &mut Verification,
    before: Option<&crate::record::Record>,
    quality_before: Option<&crate::apply::quality::Before>,
) -> Result<Option<reconcile_core::quality::Reference>, Cause> {
    let Rank { job, report, .. } = rank0;
    if let Some(reason) = install::throughput_gate(job, v, before, &mut report.report).await {
        report.report.verification = Some(v.clone());
        return Err(Cause::stage(0, Stage::Benchmark, reason));
    }
    match install::quality_gate(job, v, quality_before, &mut report.report).await {
        Err(install::QualityFailed { detail }) => {
            report.report.verification = Some(v.clone());
            Err(Cause::stage(0, Stage::Quality, detail))
        }
        Ok(keep) => Ok(keep),
    }
}
