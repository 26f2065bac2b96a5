//! What pull agents write to the coordinator, and where: per service, each host's latest entry
//! (which change it is on and how that went) and the restart slots, each held on the holder's
//! lease so that an agent that dies frees its slot when the lease runs out.
//!
//! ```text
//! <prefix>/services/<service>/hosts/<host>   HostEntry, kept
//! <prefix>/services/<service>/slots/<host>   SlotEntry, on the holder's lease
//! ```
//!
//! One range read of `<prefix>/services/<service>/` is everything an agent needs to decide its turn
//! (`turn::decide`), and one of `<prefix>/services/` is the fleet's status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The key prefix when `--coordinator-prefix` is not given.
pub const DEFAULT_PREFIX: &str = "/reconcile";

/// The keys under one prefix (`/reconcile`, or a team's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Host { service: String, host: String },
    Slot { service: String, host: String },
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    /// Every service's keys.
    pub fn all(&self) -> String {
        format!("{}/services/", self.prefix)
    }

    /// One service's keys, hosts and slots.
    pub fn service(&self, service: &str) -> String {
        format!("{}{service}/", self.all())
    }

    /// The prefix of a service's host entries.
    pub fn hosts(&self, service: &str) -> String {
        format!("{}hosts/", self.service(service))
    }

    pub fn host(&self, service: &str, host: &str) -> String {
        format!("{}{host}", self.hosts(service))
    }

    /// The prefix of a service's slots, for the transaction that takes one only while fewer than
    /// `max_parallel` exist.
    pub fn slots(&self, service: &str) -> String {
        format!("{}slots/", self.service(service))
    }

    pub fn slot(&self, service: &str, host: &str) -> String {
        format!("{}{host}", self.slots(service))
    }

    /// What `key` is, or `None` for a key this layout does not have.
    pub fn parse(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(&self.all())?;
        let (service, rest) = rest.split_once('/')?;
        let (kind, host) = rest.split_once('/')?;
        if service.is_empty() || host.is_empty() {
            return None;
        }
        let (service, host) = (service.to_string(), host.to_string());
        match kind {
            "hosts" => Some(Key::Host { service, host }),
            "slots" => Some(Key::Slot { service, host }),
            _ => None,
        }
    }
}

/// Where a host stands on a change of its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Its unit already was what this change renders for it: nothing to do.
    UpToDate,
    /// It has a restart to do and waits for its turn (the canary, or a free slot).
    Waiting,
    /// It will not start this change: the canary or the failure budget stopped the rollout. Its
    /// server runs as before.
    Held,
    /// Its restart is in flight, under a slot. Left so by an agent that died: abandoned, and
    /// counted as failed once the slot's lease has run out.
    Started,
    /// Applied and verified.
    Succeeded,
    /// Its apply failed (and was rolled back, or not: `detail` says).
    Failed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::UpToDate => "up_to_date",
            State::Waiting => "waiting",
            State::Held => "held",
            State::Started => "started",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
        }
    }
}

/// A host's latest entry for a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEntry {
    /// The change it is about ([`revision`]).
    pub revision: String,
    /// The commit the agent read it from.
    pub commit: String,
    /// sha256 of the unit this change renders for the host.
    pub unit_sha256: String,
    pub state: State,
    /// Unix seconds when it was written.
    pub at: u64,
    /// Why it waits or was held, or the failure's diagnosis; free of secrets (the agent redacts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl HostEntry {
    /// Whether writing `next` over this entry would tell a reader anything new. An agent that
    /// finds nothing to do rewrites nothing, so a quiet fleet costs the coordinator one read per
    /// agent round.
    pub fn same_news(&self, next: &HostEntry) -> bool {
        self.revision == next.revision
            && self.commit == next.commit
            && self.unit_sha256 == next.unit_sha256
            && self.state == next.state
            && self.detail == next.detail
    }
}

/// A restart slot: who holds it, for which change, since when (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotEntry {
    pub revision: String,
    pub commit: String,
    pub since: u64,
}

/// One service's keys, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceLedger {
    pub hosts: BTreeMap<String, HostEntry>,
    pub slots: BTreeMap<String, SlotEntry>,
}

/// The services' ledgers from the keys and values of a read under the prefix. A key of another
/// layout, or a value that does not parse (written by another version), is left out: it is no
/// news of any host.
pub fn collect<'a>(
    keys: &Keys,
    read: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, ServiceLedger> {
    let mut services: BTreeMap<String, ServiceLedger> = BTreeMap::new();
    for (key, value) in read {
        match keys.parse(key) {
            Some(Key::Host { service, host }) => {
                put(&mut services, service, host, value, |l| &mut l.hosts)
            }
            Some(Key::Slot { service, host }) => {
                put(&mut services, service, host, value, |l| &mut l.slots)
            }
            None => {}
        }
    }
    services
}

/// `value` read as a `T` into the map of `service`'s ledger that `map` names, under `host`; a
/// value that does not parse is left out, and makes no ledger.
fn put<T: serde::de::DeserializeOwned>(
    services: &mut BTreeMap<String, ServiceLedger>,
    service: String,
    host: String,
    value: &str,
    map: fn(&mut ServiceLedger) -> &mut BTreeMap<String, T>,
) {
    if let Ok(entry) = serde_json::from_str::<T>(value) {
        map(services.entry(service).or_default()).insert(host, entry);
    }
}

/// The name of one change of a service: a digest of the units it renders for every host of the
/// service, comments left out (their header names the manifest's path, which differs between
/// agents' checkouts). Every agent computes the same one from the same manifests, and a commit that
/// changes nothing of the service keeps it, so an unrelated commit does not restart its rollout.
pub fn revision<'a>(units: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut units: Vec<(&str, &str)> = units.into_iter().collect();
    units.sort();
    let mut all = String::new();
    for (host, text) in units {
        all.push_str(host);
        all.push('\n');
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            all.push_str(line);
            all.push('\n');
        }
        all.push('\0');
    }
    crate::digest::short(&crate::digest::sha256(&all), crate::digest::SHA_SHOWN).to_string()
}

/// An entry for tests: `state` on `revision`, the rest fixed.
#[cfg(test)]
pub(crate) fn entry_for_test(revision: &str, state: State) -> HostEntry {
    HostEntry {
        revision: revision.into(),
        commit: "c".into(),
        unit_sha256: "u".into(),
        state,
        at: 5,
        detail: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    #[test]
    fn keys_name_hosts_and_slots_and_parse_back() {
        let keys = Keys::new("/reconcile/");
        assert_eq!(
            keys.host("sglang-qwen", "gpu-a"),
            "/reconcile/services/sglang-qwen/hosts/gpu-a"
        );
        assert_eq!(
            keys.slot("sglang-qwen", "gpu-a"),
            "/reconcile/services/sglang-qwen/slots/gpu-a"
        );
        assert_eq!(
            keys.parse(&keys.slot("s", "root@gpu-a:2222")),
            Some(Key::Slot {
                service: "s".into(),
                host: "root@gpu-a:2222".into()
            })
        );
        assert_eq!(keys.parse("/reconcile/services/s/other/x"), None);
        assert_eq!(keys.parse("/elsewhere/services/s/hosts/x"), None);
    }

    #[test]
    fn a_read_is_collected_per_service_and_foreign_values_left_out() {
        let keys = Keys::new("/r");
        let entry = r#"{"revision":"a","commit":"c","unit_sha256":"u","state":"started","at":1}"#;
        let slot = r#"{"revision":"a","commit":"c","since":1}"#;
        let read = [
            ("/r/services/s/hosts/h1", entry),
            ("/r/services/s/slots/h1", slot),
            ("/r/services/s/hosts/h2", "not json"),
            ("/r/services/t/hosts/h9", entry),
            ("/r/elsewhere", entry),
        ];
        let ledgers = collect(&keys, read);
        assert_eq!(ledgers.len(), 2);
        let s = &ledgers["s"];
        assert_eq!(s.hosts.keys().collect::<Vec<_>>(), ["h1"]);
        assert!(s.slots.contains_key("h1"));
    }

    #[test]
    fn the_revision_ignores_comments_and_order_but_not_a_flag() {
        let a = "# Managed by reconcile, rendered from /x/a.yaml.\n[Service]\nExecStart=x --tp 2\n";
        let b = "# Managed by reconcile, rendered from /y/a.yaml.\n[Service]\nExecStart=x --tp 2\n";
        let c = "[Service]\nExecStart=x --tp 4\n";
        assert_eq!(
            revision([("h1", a), ("h2", c)]),
            revision([("h2", c), ("h1", b)])
        );
        assert_ne!(revision([("h1", a)]), revision([("h1", c)]));
        // The same unit on another host is another change.
        assert_ne!(revision([("h1", a)]), revision([("h2", a)]));
    }

    #[test]
    fn entries_are_json_with_snake_case_states_and_no_empty_detail() {
        let e = HostEntry {
            revision: "abc".into(),
            commit: "c0ffee".into(),
            unit_sha256: "d1".into(),
            state: State::UpToDate,
            at: 7,
            detail: None,
        };
        let text = serde_json::to_string(&e).unwrap();
        assert_holds(&text, "\"state\":\"up_to_date\"");
        assert!(!text.contains("detail"), "{text}");
        assert_eq!(serde_json::from_str::<HostEntry>(&text).unwrap(), e);
        let later = HostEntry { at: 9, ..e.clone() };
        assert!(e.same_news(&later));
        let failed = HostEntry {
            state: State::Failed,
            ..e.clone()
        };
        assert!(!e.same_news(&failed));
    }
}
