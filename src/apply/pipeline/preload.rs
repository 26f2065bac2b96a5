//! `Step::Preload`: every rank's weights read into its host's page cache while the old servers
//! serve. It only saves time, so it always passes.

use futures::future::join_all;
use reconcile_core::transaction::Went;

use super::Rank;
use crate::plan::Verdict;

/// `Step::Preload` (step 2b), for a restart: every rank's weights read into its host's page cache
/// at once, while the old servers serve (`reconcile_core::preload`). Only where a server runs: a
/// new or stopped one has no downtime to shorten. Each rank's report says what preloading did.
pub(super) async fn preload(ranks: &mut [Rank<'_>]) -> Went {
    let preloaded = join_all(ranks.iter().map(|r| async move {
        let (job, options) = (&r.job, r.job.options);
        // A live weight move loads from the page cache as a restart does.
        let loads = match r.verdict {
            Verdict::Restart => true,
            Verdict::Live => r.live.as_ref().is_some_and(|l| l.weights.is_some()),
            _ => false,
        };
        if !options.preload || !r.fallback.was_running || !loads {
            return None;
        }
        let plan = r
            .weights
            .as_ref()
            .ok_or_else(|| "the weights were not checked".to_string())
            .and_then(|w| {
                reconcile_core::preload::plan(w, job.t.verify.load_deadline)
                    .map_err(|e| e.to_string())
            });
        Some(match plan {
            Ok(plan) => {
                let model = &job.t.manifest.sglang.model_path;
                crate::apply::preload::preload(job.host, model, &plan, &options.cancel).await
            }
            Err(why) => reconcile_core::preload::Preloading::skipped(why),
        })
    }))
    .await;
    for (r, preloading) in ranks.iter_mut().zip(preloaded) {
        if let Some(preloading) = preloading {
            r.report.report.notes.push(preloading.note());
            r.report.report.preloading = Some(preloading);
        }
    }
    Went::Passed
}
