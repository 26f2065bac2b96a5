//! The rollout's fetch ahead: every host with work brings its pinned weights (`sglang.model:`)
//! to it at once, before the rollout's first stop, while the old servers serve. The hosts after
//! the canary then find their copy verified at their turn instead of fetching in it, and a host
//! whose fetch fails fails before any server stopped anywhere.

use std::collections::HashMap;

use indicatif::{ProgressBar, ProgressStyle};
use reconcile_core::pinned::Fetched;

use super::error::ApplyError;
use super::{ApplyOptions, Report, UnitReport};
use crate::fleet;
use crate::pinned;
use crate::remote::{error_chain, Host, SshOptions};
use crate::targets::Target;

/// What the fetch ahead did, by (host, unit).
#[derive(Default)]
pub(super) struct Ahead {
    pub fetched: HashMap<(String, String), Fetched>,
    /// The units whose host could not bring its copy, and why.
    pub failed: HashMap<(String, String), String>,
}

impl Ahead {
    /// The reports of a rollout that stops before its first stop: each failed unit with its
    /// cause, every other unit of `targets` not started.
    pub fn refuse(&self, targets: &[Target]) -> Vec<UnitReport> {
        let mut hosts: Vec<&str> = self.failed.keys().map(|(h, _)| h.as_str()).collect();
        hosts.sort();
        hosts.dedup();
        let others = ApplyError::NotStarted(format!(
            "the pinned weights could not be brought to {}: no server was stopped",
            hosts.join(", ")
        ));
        let started = std::time::Instant::now();
        targets
            .iter()
            .map(
                |t| match self.failed.get(&(t.host.clone(), t.desired.unit.clone())) {
                    Some(why) => {
                        Report::new(t, started).fail(&ApplyError::FetchFailed(why.clone()))
                    }
                    None => Report::new(t, started).fail(&others),
                },
            )
            .collect()
    }

    /// Gives each report the figures of its host's fetch.
    pub fn attach(&self, reports: &mut [UnitReport]) {
        for r in reports {
            if let Some(f) = self.fetched.get(&(r.host.clone(), r.unit.clone())) {
                r.notes.insert(0, pinned::fetched_note(f));
                r.fetch = Some(f.clone());
            }
        }
    }
}

/// Fetches every pinned revision `targets` need to their hosts, `at_once` hosts at a time (the
/// smallest `at_once` of their manifests), each host's progress on a bar of its own.
pub(super) async fn fetch_ahead(
    targets: &[Target],
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Ahead {
    let mut by_host: HashMap<String, Vec<Target>> = HashMap::new();
    for t in targets
        .iter()
        .filter(|t| t.manifest.sglang.pinned.is_some())
    {
        by_host.entry(t.host.clone()).or_default().push(t.clone());
    }
    let mut ahead = Ahead::default();
    if by_host.is_empty() {
        return ahead;
    }
    let at_once = targets
        .iter()
        .filter_map(|t| t.manifest.sglang.pinned.as_ref())
        .map(|p| p.at_once)
        .min()
        .unwrap_or(1);
    let mut hosts: Vec<(String, Vec<Target>)> = by_host.into_iter().collect();
    hosts.sort_by(|a, b| a.0.cmp(&b.0));
    let results = fleet::each_host(
        hosts,
        ssh,
        at_once,
        |name| tracing::info_span!("fetch", host = %name),
        async |host: &dyn Host, visit: &fleet::Visit<'_>, targets: Vec<Target>| {
            let mut done = Vec::new();
            for t in &targets {
                let Some(spec) = &t.manifest.sglang.pinned else {
                    continue;
                };
                let bar = options.progress.as_ref().map(|m| {
                    let bar = m.add(ProgressBar::new(0));
                    bar.set_style(bar_style());
                    bar.set_prefix(format!("{} weights", visit.name));
                    bar
                });
                let token = t.desired.model.env.get("HF_TOKEN").map(String::as_str);
                let python = &t.manifest.sglang.python;
                let result =
                    pinned::ensure(host, python, spec, token, bar.as_ref(), &options.cancel).await;
                if let Some(bar) = bar {
                    bar.finish_and_clear();
                }
                done.push((t.desired.unit.clone(), result.map_err(|e| error_chain(&e))));
            }
            (visit.name.to_string(), done)
        },
        |visit, targets, e| {
            let why = error_chain(&e);
            let done = targets
                .iter()
                .map(|t| (t.desired.unit.clone(), Err(why.clone())))
                .collect();
            (visit.name.to_string(), done)
        },
    )
    .await;
    for (host, units) in results {
        for (unit, result) in units {
            match result {
                Ok(Some(fetched)) => {
                    ahead.fetched.insert((host.clone(), unit), fetched);
                }
                Ok(None) => {}
                Err(why) => {
                    ahead.failed.insert((host.clone(), unit), why);
                }
            }
        }
    }
    ahead
}

/// `gpu-a weights [=====>    ] 12.1 GB/234.1 GB 1.1 GB/s ETA 3m`.
fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}
