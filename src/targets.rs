//! From manifests to the (host, unit) pairs a run works on, each with its rendered unit. Pure.

use std::sync::Arc;

use crate::manifest::{Manifest, VerifySpec};
use crate::preflight;
use crate::unit::{render, Desired};

/// One unit on one host.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub source: String,
    pub desired: Desired,
    pub verify: VerifySpec,
    /// sha256 of the manifest's text.
    pub manifest_digest: String,
    /// The manifest, for preflight's checks against the SGLang version the host really has.
    pub manifest: Arc<Manifest>,
    /// Preflight findings known without the host: GPUs this unit shares with another service there.
    pub conflicts: Vec<preflight::Finding>,
}

#[derive(Debug, thiserror::Error)]
#[error("no host named {} in the manifests (hosts there: {})", .wanted.join(", "), .known.join(", "))]
pub struct UnknownHosts {
    pub wanted: Vec<String>,
    pub known: Vec<String>,
}

/// Every unit of every manifest on every host, kept to `only` when it names hosts; sorted by host,
/// then unit, so output is stable however the manifests are laid out.
pub fn targets(manifests: &[Manifest], only: &[String]) -> Result<Vec<Target>, UnknownHosts> {
    let mut all: Vec<Target> = manifests
        .iter()
        .flat_map(|m| {
            let shared = Arc::new(m.clone());
            m.hosts.iter().map(move |h| Target {
                host: h.name.clone(),
                source: m.source.clone(),
                desired: render(m, h),
                verify: m.verify.clone(),
                manifest_digest: m.digest.clone(),
                manifest: Arc::clone(&shared),
                conflicts: Vec::new(),
            })
        })
        .collect();
    all.sort_by(|a, b| (&a.host, &a.desired.unit).cmp(&(&b.host, &b.desired.unit)));
    // Before `only` narrows the run: a clash is with any service on the host.
    let conflicts = preflight::gpu_conflicts(&all);
    for (t, conflicts) in all.iter_mut().zip(conflicts) {
        t.conflicts = conflicts;
    }
    let missing: Vec<String> = only
        .iter()
        .filter(|w| !all.iter().any(|t| &t.host == *w))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let mut known: Vec<String> = all.iter().map(|t| t.host.clone()).collect();
        known.dedup();
        return Err(UnknownHosts {
            wanted: missing,
            known,
        });
    }
    if !only.is_empty() {
        all.retain(|t| only.contains(&t.host));
    }
    Ok(all)
}

/// Targets grouped by host, for work done over one connection per host.
pub fn by_host(targets: Vec<Target>) -> std::collections::BTreeMap<String, Vec<Target>> {
    let mut grouped: std::collections::BTreeMap<String, Vec<Target>> = Default::default();
    for t in targets {
        grouped.entry(t.host.clone()).or_default().push(t);
    }
    grouped
}
