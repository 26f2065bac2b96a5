//! The fleet as the coordinator holds it, for `reconcile status --coordinator` and `reconcile
//! rollout status`: each host's last word on each service, set against the change the manifests
//! render now, without a connection to any host.

use std::collections::BTreeMap;

use serde::Serialize;

use super::ledger::{ServiceLedger, State};
use super::turn::{progress, Progress, View};

/// A service's newest change as the manifests render it, and its hosts in rollout order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest {
    pub revision: String,
    pub order: Vec<String>,
}

impl Newest {
    /// The newest change of one service from its targets (every host's, all of one manifest):
    /// every agent and every reader computes the same one from the same commit.
    pub fn of(service: &[&crate::targets::Target]) -> Option<Newest> {
        let manifest = &service.first()?.manifest;
        let hosts: Vec<&str> = manifest.hosts.iter().map(|h| h.name.as_str()).collect();
        let canary = manifest.rollout.as_ref().and_then(|r| r.canary.as_deref());
        Some(Newest {
            revision: super::ledger::revision(
                service
                    .iter()
                    .map(|t| (t.host.as_str(), t.desired.text.as_str())),
            ),
            order: super::order(&hosts, canary)
                .into_iter()
                .map(str::to_string)
                .collect(),
        })
    }

    /// Every service's newest change, from all the targets the manifests make.
    pub fn all(targets: &[crate::targets::Target]) -> BTreeMap<String, Newest> {
        let mut by_service: BTreeMap<&str, Vec<&crate::targets::Target>> = BTreeMap::new();
        for t in targets {
            by_service.entry(&t.manifest.service).or_default().push(t);
        }
        by_service
            .into_iter()
            .filter_map(|(s, ts)| Some((s.to_string(), Newest::of(&ts)?)))
            .collect()
    }
}

/// One host of one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub service: String,
    pub host: String,
    /// Its last entry's state; `None`: no agent has written one.
    pub state: Option<State>,
    pub revision: Option<String>,
    pub commit: Option<String>,
    /// Unix seconds of its last entry.
    pub at: Option<u64>,
    pub detail: Option<String>,
    /// It holds a restart slot now.
    pub restarting: bool,
    /// Its entry is about the change the manifests render now; `None`: the manifests were not
    /// read, or do not have the service.
    pub on_newest: Option<bool>,
}

impl Row {
    /// Whether the host is where the manifests want it: on the newest change (when known), up to
    /// date or succeeded, not restarting.
    pub fn in_sync(&self) -> bool {
        matches!(self.state, Some(State::UpToDate | State::Succeeded))
            && self.on_newest != Some(false)
            && !self.restarting
    }
}

/// Every host of every service the coordinator or the manifests know, by service then host (the
/// manifests' order for their services); hosts the manifests list with no entry come as rows
/// without a state.
pub fn rows(
    ledgers: &BTreeMap<String, ServiceLedger>,
    newest: &BTreeMap<String, Newest>,
) -> Vec<Row> {
    let mut services: Vec<&String> = ledgers.keys().chain(newest.keys()).collect();
    services.sort();
    services.dedup();
    let empty = ServiceLedger::default();
    let mut out = Vec::new();
    for service in services {
        let ledger = ledgers.get(service).unwrap_or(&empty);
        let wanted = newest.get(service);
        let mut hosts: Vec<&String> = wanted.map(|n| n.order.iter().collect()).unwrap_or_default();
        for h in ledger.hosts.keys().chain(ledger.slots.keys()) {
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        for host in hosts {
            let entry = ledger.hosts.get(host);
            out.push(Row {
                service: service.clone(),
                host: host.clone(),
                state: entry.map(|e| e.state),
                revision: entry.map(|e| e.revision.clone()),
                commit: entry.map(|e| e.commit.clone()),
                at: entry.map(|e| e.at),
                detail: entry.and_then(|e| e.detail.clone()),
                restarting: ledger.slots.contains_key(host),
                on_newest: wanted.map(|n| entry.is_some_and(|e| e.revision == n.revision)),
            });
        }
    }
    out
}

/// A service's rollout of its newest change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RolloutView {
    pub service: String,
    pub revision: String,
    #[serde(flatten)]
    pub progress: Progress,
    /// Every host is done with the change, one way or another.
    pub finished: bool,
}

impl RolloutView {
    pub fn new(service: &str, newest: &Newest, ledger: &ServiceLedger) -> RolloutView {
        let order: Vec<&str> = newest.order.iter().map(String::as_str).collect();
        let progress = progress(&order, &View::of(ledger, &newest.revision));
        RolloutView {
            service: service.to_string(),
            revision: newest.revision.clone(),
            finished: progress.finished(),
            progress,
        }
    }

    /// 0 done with no failure, 2 under way, 3 stopped or some host failed.
    pub fn exit_code(&self) -> u8 {
        if !self.progress.failed.is_empty() || !self.progress.held.is_empty() {
            3
        } else if self.finished {
            0
        } else {
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::ledger::SlotEntry;

    use crate::rollout::ledger::entry_for_test as entry;

    fn ledger() -> ServiceLedger {
        let mut l = ServiceLedger::default();
        l.hosts.insert("h1".into(), entry("r2", State::Succeeded));
        l.hosts.insert("h2".into(), entry("r2", State::Started));
        l.hosts.insert("h3".into(), entry("r1", State::Succeeded));
        l.slots.insert(
            "h2".into(),
            SlotEntry {
                revision: "r2".into(),
                commit: "c".into(),
                since: 5,
            },
        );
        l
    }

    #[test]
    fn rows_set_each_host_against_the_newest_change() {
        let ledgers = BTreeMap::from([("s".to_string(), ledger())]);
        let newest = BTreeMap::from([(
            "s".to_string(),
            Newest {
                revision: "r2".into(),
                order: vec!["h1".into(), "h2".into(), "h3".into(), "h4".into()],
            },
        )]);
        let rows = rows(&ledgers, &newest);
        let by: Vec<(&str, bool, Option<bool>)> = rows
            .iter()
            .map(|r| (r.host.as_str(), r.in_sync(), r.on_newest))
            .collect();
        assert_eq!(
            by,
            [
                ("h1", true, Some(true)),
                ("h2", false, Some(true)),
                ("h3", false, Some(false)),
                ("h4", false, Some(false)),
            ]
        );
        assert!(rows[1].restarting && rows[3].state.is_none());
        // Without manifests, a host's last word stands alone.
        let bare = super::rows(&ledgers, &BTreeMap::new());
        assert!(bare.iter().all(|r| r.on_newest.is_none()));
        assert!(bare[2].in_sync());
    }

    #[test]
    fn a_rollout_view_sorts_hosts_and_says_its_exit_code() {
        let newest = Newest {
            revision: "r2".into(),
            order: vec!["h1".into(), "h2".into(), "h3".into()],
        };
        let mut l = ledger();
        let v = RolloutView::new("s", &newest, &l);
        let p = &v.progress;
        assert_eq!(p.canary.as_deref(), Some("h1"));
        assert_eq!((p.succeeded.len(), p.in_flight.len()), (1, 1));
        assert_eq!(p.unreported, ["h3"]);
        assert_eq!(v.exit_code(), 2);
        l.slots.clear();
        l.hosts.insert("h3".into(), entry("r2", State::UpToDate));
        let v = RolloutView::new("s", &newest, &l);
        assert_eq!(
            v.progress.failed,
            ["h2"],
            "a started host without a slot was abandoned"
        );
        assert_eq!(v.exit_code(), 3);
        l.hosts.insert("h2".into(), entry("r2", State::Succeeded));
        assert_eq!(RolloutView::new("s", &newest, &l).exit_code(), 0);
    }
}
