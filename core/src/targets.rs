//! From manifests to the (host, unit) pairs a run works on, each with its rendered unit. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::finding::Finding;
use crate::manifest::{Manifest, VerifySpec};
use crate::plan::PlannedState;
use crate::preflight::fleet::{gpu_conflicts, Claimant};
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
    pub conflicts: Vec<Finding>,
    /// The host entry's labels, plus `host` and `service`, for `--selector`.
    pub labels: BTreeMap<String, String>,
    /// Set when applying a plan file: what the host must still have, checked under the unit's
    /// lock, for the planned change to be applied.
    pub expected: Option<PlannedState>,
}

/// Which targets a run works on: `--host` names and `--selector` label conditions (all must hold).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub hosts: Vec<String>,
    pub selectors: Vec<Selector>,
}

/// `key=value`, `key!=value`, or `key` (the label is set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Equals(String, String),
    Differs(String, String),
    Has(String),
}

impl std::str::FromStr for Selector {
    type Err = String;
    fn from_str(s: &str) -> Result<Selector, String> {
        let valid = |k: &str| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        };
        let selector = if let Some((k, v)) = s.split_once("!=") {
            Selector::Differs(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = s.split_once('=') {
            Selector::Equals(k.trim().into(), v.trim().into())
        } else {
            Selector::Has(s.trim().into())
        };
        let (Selector::Equals(k, _) | Selector::Differs(k, _) | Selector::Has(k)) = &selector;
        if valid(k) {
            Ok(selector)
        } else {
            Err(format!(
                "`{s}` is not a selector like role=canary, zone!=b or gpu"
            ))
        }
    }
}

impl Selector {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Equals(k, v) => labels.get(k) == Some(v),
            Selector::Differs(k, v) => labels.get(k) != Some(v),
            Selector::Has(k) => labels.contains_key(k),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UnknownHosts {
    #[error("no host named {} in the manifests (hosts there: {})", .wanted.join(", "), .known.join(", "))]
    Named {
        wanted: Vec<String>,
        known: Vec<String>,
    },
    #[error("no host in the manifests matches the selectors")]
    NoneSelected,
}

/// Every unit of every manifest on every host, kept to `only` when it names hosts; sorted by host,
/// then unit, so output is stable however the manifests are laid out.
pub fn targets(manifests: &[Manifest], filter: &Filter) -> Result<Vec<Target>, UnknownHosts> {
    let only = &filter.hosts;
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
                labels: labels(m, h),
                expected: None,
            })
        })
        .collect();
    all.sort_by(|a, b| (&a.host, &a.desired.unit).cmp(&(&b.host, &b.desired.unit)));
    // Before `only` narrows the run: a clash is with any service on the host.
    let claimants: Vec<Claimant> = all
        .iter()
        .map(|t| Claimant {
            host: &t.host,
            unit: &t.desired.unit,
            source: &t.source,
            cuda_visible_devices: t
                .desired
                .model
                .env
                .get("CUDA_VISIBLE_DEVICES")
                .map(String::as_str),
        })
        .collect();
    let conflicts = gpu_conflicts(&claimants);
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
        return Err(UnknownHosts::Named {
            wanted: missing,
            known,
        });
    }
    if !only.is_empty() {
        all.retain(|t| only.contains(&t.host));
    }
    if !filter.selectors.is_empty() {
        all.retain(|t| filter.selectors.iter().all(|s| s.matches(&t.labels)));
        if all.is_empty() {
            return Err(UnknownHosts::NoneSelected);
        }
    }
    Ok(all)
}

fn labels(m: &Manifest, h: &crate::manifest::HostSpec) -> BTreeMap<String, String> {
    let mut labels = h.labels.clone();
    labels.insert("host".into(), h.name.clone());
    labels.insert("service".into(), m.service.clone());
    labels
}

/// Targets grouped by host, for work done over one connection per host.
pub fn by_host(targets: Vec<Target>) -> std::collections::BTreeMap<String, Vec<Target>> {
    let mut grouped: std::collections::BTreeMap<String, Vec<Target>> = Default::default();
    for t in targets {
        grouped.entry(t.host.clone()).or_default().push(t);
    }
    grouped
}
