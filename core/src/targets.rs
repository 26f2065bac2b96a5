//! From manifests to the (host, unit) pairs a run works on, each with its rendered unit. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::finding::Finding;
use crate::gpu_claims::{gpu_conflicts, Claimant};
use crate::manifest::{Manifest, VerifySpec};
use crate::plan::PlannedState;
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
    /// `Some` for a rank of a server group (`nodes:`): the ranks restart together (see
    /// `crate::group`).
    pub group: Option<Rank>,
}

/// This target's place in its server group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank {
    /// `--node-rank`: the host's position in the manifest's `nodes:`.
    pub rank: usize,
    /// every rank's host name, in rank order
    pub nodes: Vec<String>,
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

/// A `--selector` whose label name is empty or has characters a label name cannot have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a selector like role=canary, zone!=b or gpu")]
pub struct BadSelector {
    /// As written.
    pub text: String,
}

impl std::str::FromStr for Selector {
    type Err = BadSelector;
    fn from_str(s: &str) -> Result<Selector, BadSelector> {
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
            Err(BadSelector { text: s.into() })
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
    /// `--host` named some but not all of a server group's nodes.
    #[error("{service} is a server group, applied whole: --host names {} of its nodes; name all of its nodes ({}) or none", .named.join(", "), .nodes.join(", "))]
    PartialGroup {
        /// The group's unit, `<service>.service`.
        service: String,
        /// The nodes `--host` named.
        named: Vec<String>,
        /// All of the group's nodes, in rank order.
        nodes: Vec<String>,
    },
}

/// Every unit of every manifest on every host, kept to `only` when it names hosts; sorted by host,
/// then unit, so output is stable however the manifests are laid out.
pub fn targets(manifests: &[Manifest], filter: &Filter) -> Result<Vec<Target>, UnknownHosts> {
    let only = &filter.hosts;
    let mut all: Vec<Target> = manifests
        .iter()
        .flat_map(|m| {
            let shared = Arc::new(m.clone());
            let nodes: Vec<String> = m.hosts.iter().map(|h| h.name.clone()).collect();
            m.hosts.iter().enumerate().map(move |(rank, h)| Target {
                host: h.name.clone(),
                source: m.source.clone(),
                desired: render(m, h),
                verify: m.verify.clone(),
                manifest_digest: m.digest.clone(),
                manifest: Arc::clone(&shared),
                conflicts: Vec::new(),
                labels: labels(m, h),
                expected: None,
                group: m.group.as_ref().map(|_| Rank {
                    rank,
                    nodes: nodes.clone(),
                }),
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
        // A server group's ranks restart together and each waits for the others; applying some
        // of them would leave them waiting for peers running an older unit. Refused rather than
        // widened: `--host` is an operator's explicit list, and reaching further than it names
        // would surprise them.
        for t in &all {
            let Some(rank) = &t.group else { continue };
            let named: Vec<String> = rank
                .nodes
                .iter()
                .filter(|n| only.contains(n))
                .cloned()
                .collect();
            if !named.is_empty() && named.len() < rank.nodes.len() {
                return Err(UnknownHosts::PartialGroup {
                    service: t.desired.unit.clone(),
                    named,
                    nodes: rank.nodes.clone(),
                });
            }
        }
        all.retain(|t| only.contains(&t.host));
    }
    if !filter.selectors.is_empty() {
        // A selector that picks some ranks of a group picks the whole group: labels describe
        // hosts (a zone, a GPU kind), and a group spans hosts, so a label on one node means the
        // server it belongs to. Unlike `--host`, a selector is no explicit list of hosts, so
        // widening it to the group is what it asks for rather than a surprise.
        let picked = |t: &Target| filter.selectors.iter().all(|s| s.matches(&t.labels));
        let groups: Vec<(String, String)> = all
            .iter()
            .filter(|t| t.group.is_some() && picked(t))
            .map(|t| (t.source.clone(), t.desired.unit.clone()))
            .collect();
        all.retain(|t| {
            picked(t)
                || (t.group.is_some()
                    && groups
                        .iter()
                        .any(|(source, unit)| *source == t.source && *unit == t.desired.unit))
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;

    const GROUP: &str = "service: big\nlabels: { zone: a }\nnodes:\n  - gpu-a\n  - name: gpu-b\n    labels: { zone: b }\n  - gpu-c\nsglang:\n  python: /p\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";
    const SINGLE: &str = "service: small\nhosts: [gpu-a, gpu-d]\nsglang:\n  python: /p\n  version: 0.5.23\n  model_path: /m\n  port: 30001\n";

    fn manifests() -> Vec<Manifest> {
        vec![
            parse("big.yaml", GROUP).unwrap(),
            parse("small.yaml", SINGLE).unwrap(),
        ]
    }

    fn hosts(filter: Filter) -> Result<Vec<(String, String, Option<usize>)>, UnknownHosts> {
        Ok(targets(&manifests(), &filter)?
            .into_iter()
            .map(|t| (t.host, t.desired.unit, t.group.map(|g| g.rank)))
            .collect())
    }

    fn row(host: &str, unit: &str, rank: Option<usize>) -> (String, String, Option<usize>) {
        (host.into(), unit.into(), rank)
    }

    #[test]
    fn every_rank_of_a_group_knows_its_place() {
        let all = targets(&manifests(), &Filter::default()).unwrap();
        let b = all
            .iter()
            .find(|t| t.host == "gpu-b" && t.desired.unit == "big.service")
            .unwrap();
        assert_eq!(
            b.group,
            Some(Rank {
                rank: 1,
                nodes: vec!["gpu-a".into(), "gpu-b".into(), "gpu-c".into()]
            })
        );
        assert!(b.desired.model.exec_start.contains(&"--node-rank".into()));
        let small = all
            .iter()
            .find(|t| t.desired.unit == "small.service")
            .unwrap();
        assert_eq!(small.group, None);
    }

    #[test]
    fn host_filter_takes_a_group_whole_or_not_at_all() {
        let filter = |names: &[&str]| Filter {
            hosts: names.iter().map(|n| n.to_string()).collect(),
            selectors: vec![],
        };
        let e = hosts(filter(&["gpu-a", "gpu-b"])).unwrap_err();
        assert!(
            matches!(&e, UnknownHosts::PartialGroup { service, named, nodes }
                if service == "big.service" && named == &["gpu-a", "gpu-b"] && nodes.len() == 3),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "big.service is a server group, applied whole: --host names gpu-a, gpu-b of its nodes; name all of its nodes (gpu-a, gpu-b, gpu-c) or none"
        );
        assert_eq!(
            hosts(filter(&["gpu-a", "gpu-b", "gpu-c"])).unwrap(),
            [
                row("gpu-a", "big.service", Some(0)),
                row("gpu-a", "small.service", None),
                row("gpu-b", "big.service", Some(1)),
                row("gpu-c", "big.service", Some(2)),
            ]
        );
        // Naming none of the group's nodes leaves it out.
        assert_eq!(
            hosts(filter(&["gpu-d"])).unwrap(),
            [row("gpu-d", "small.service", None)]
        );
    }

    #[test]
    fn a_selector_that_picks_one_rank_takes_the_whole_group() {
        let filter = |s: &str| Filter {
            hosts: vec![],
            selectors: vec![s.parse().unwrap()],
        };
        let bad = "=b".parse::<Selector>().unwrap_err();
        assert_eq!(bad, BadSelector { text: "=b".into() });
        assert_eq!(
            bad.to_string(),
            "`=b` is not a selector like role=canary, zone!=b or gpu"
        );
        assert_eq!(
            hosts(filter("zone=b")).unwrap(),
            [
                row("gpu-a", "big.service", Some(0)),
                row("gpu-b", "big.service", Some(1)),
                row("gpu-c", "big.service", Some(2)),
            ]
        );
        // A host of a plain service is still picked alone.
        assert_eq!(
            hosts(filter("host=gpu-d")).unwrap(),
            [row("gpu-d", "small.service", None)]
        );
        assert!(matches!(
            hosts(filter("zone=z")),
            Err(UnknownHosts::NoneSelected)
        ));
    }
}
