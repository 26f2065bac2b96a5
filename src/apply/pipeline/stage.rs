//! `Step::Stage`: every rank's weights read into its host's page cache while the old servers
//! serve. It only saves time, so it always passes.

use futures::future::join_all;
use reconcile_core::transaction::Went;

use super::Rank;
use crate::plan::Verdict;

/// `Step::Stage` (step 2b), for a restart: every rank's weights read into its host's page cache
/// at once, while the old servers serve (`reconcile_core::stage`). Only where a server runs: a
/// new or stopped one has no downtime to shorten. Each rank's report says what staging did.
pub(super) async fn stage(ranks: &mut [Rank<'_>]) -> Went {
    let staged = join_all(ranks.iter().map(|r| async move {
        let (job, options) = (&r.job, r.job.options);
        // A live weight move loads from the page cache as a restart does.
        let loads = match r.verdict {
            Verdict::Restart => true,
            Verdict::Live => r.live.as_ref().is_some_and(|l| l.weights.is_some()),
            _ => false,
        };
        if !options.stage || !r.fallback.was_running || !loads {
            return None;
        }
        let plan = r
            .weights
            .as_ref()
            .ok_or_else(|| "the weights were not checked".to_string())
            .and_then(|w| {
                reconcile_core::stage::plan(w, job.t.verify.load_deadline)
                    .map_err(|e| e.to_string())
            });
        Some(match plan {
            Ok(plan) => {
                let model = &job.t.manifest.sglang.model_path;
                crate::apply::stage::stage(job.host, model, &plan, &options.cancel).await
            }
            Err(why) => reconcile_core::stage::Staging::skipped(why),
        })
    }))
    .await;
    for (r, staging) in ranks.iter_mut().zip(staged) {
        if let Some(staging) = staging {
            r.report.report.notes.push(staging.note());
            r.report.report.staging = Some(staging);
        }
    }
    Went::Passed
}
