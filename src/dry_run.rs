//! `reconcile --dry-run`: read every host concurrently, one SSH connection each, and plan each
//! unit, with its preflight checks (the hosts visited through `fleet`). Nothing on a host is changed. An unreachable host is reported;
//! the others are planned. What a unit's planning comes to ([`PlanOutcome`]) and its tally are
//! pure, in `reconcile_core::dry_run`.

use futures::stream::{self, StreamExt};

use crate::digest::sha256;
use crate::fleet;
use crate::observed::Observed;
use crate::plan::{plan, PlannedState, UnitPlan, Verdict};
use crate::preflight;
use crate::redact::Redactor;
use crate::remote::{error_chain, Host, SshOptions};
use crate::systemd::Systemd;
use crate::targets::Target;

pub use reconcile_core::dry_run::{PlanOutcome, Tally};

/// Units planned at once on one connection: sshd allows 10 sessions per connection by default, and
/// a unit runs at most two commands at once (observing it, then its preflight).
const UNITS_PER_HOST_AT_ONCE: usize = 4;

/// Plans every target, at most `parallel` hosts at once. Results come back in the targets' order.
/// `deep` adds preflight's deep check (the host's SGLang parses each unit's argv, ~10 s a unit).
pub async fn plan_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    parallel: usize,
    deep: bool,
    redactor: &Redactor,
) -> Vec<PlanOutcome> {
    let results: Vec<Vec<PlanOutcome>> = fleet::each_host(
        crate::targets::by_host(targets),
        ssh,
        parallel,
        |name| tracing::info_span!("host", host = %name),
        async |host: &dyn Host, _: &fleet::Visit<'_>, targets: Vec<Target>| {
            plan_host(host, &targets, deep, redactor).await
        },
        |_, targets, e| {
            let error = error_chain(&e);
            targets
                .iter()
                .map(|t| PlanOutcome::failed(t, error.clone()))
                .collect()
        },
    )
    .await;
    results.into_iter().flatten().collect()
}

/// A connected host's units, planned a few at once.
async fn plan_host(
    host: &dyn Host,
    targets: &[Target],
    deep: bool,
    redactor: &Redactor,
) -> Vec<PlanOutcome> {
    stream::iter(targets)
        .map(|t| plan_unit(host, t, deep, redactor))
        .buffered(UNITS_PER_HOST_AT_ONCE)
        .collect()
        .await
}

async fn plan_unit(host: &dyn Host, t: &Target, deep: bool, redactor: &Redactor) -> PlanOutcome {
    // Planned as soon as it is observed: preflight's other checks depend on the verdict.
    let observe = async {
        let observed = host.observe(&t.desired.unit).await?;
        let planned = plan(&t.host, &t.source, &t.desired, &observed, redactor);
        Ok((observed, planned))
    };
    let changes = |(_, p): &(Observed, UnitPlan)| p.verdict != Verdict::NoChange;
    let ((observed, mut planned), findings, sglang) =
        match preflight::check_with(host, t, deep, observe, |(o, _)| &o.state, changes).await {
            Ok(all) => all,
            Err(e) => return PlanOutcome::failed(t, error_chain(&e)),
        };
    planned.preflight = findings;
    planned.recorded = Some(PlannedState {
        desired_sha256: sha256(&t.desired.text),
        current_sha256: observed.unit_text.as_deref().map(sha256),
        sglang_version: sglang,
    });
    PlanOutcome::Planned(Box::new(planned))
}
