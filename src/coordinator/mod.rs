//! The coordinator of pull agents: an etcd cluster where each host's agent writes where it stands
//! on a change of each service and takes a restart slot, on its own lease, before restarting. What
//! the keys mean and every decision over them are `reconcile_core::rollout`'s (`ledger`, `turn`);
//! this module reads and writes them through the etcd edge.
//!
//! Why etcd and leases: a slot held on a lease is freed by the cluster when its holder dies (the
//! lease runs out), which is what an agent killed mid-restart needs; the one-read-then-conditional-
//! write pattern (`Etcd::write_if_unchanged`) keeps the count of slots at `max_parallel` however many
//! agents ask at once.

mod setup;
mod turn;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use reconcile_core::rollout::ledger::{self, HostEntry, Keys, ServiceLedger, SlotEntry, State};

use crate::remote::etcd::{Etcd, EtcdError, EtcdOptions, Lease, Put};

pub use setup::{etcd_options, Given, SetupError, PASSWORD_ENV};
pub use turn::{coordinated, Coordination, Link};

/// How agents reach the coordinator and how long they wait on it.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    pub etcd: EtcdOptions,
    /// The key prefix every key of this fleet is under.
    pub prefix: String,
    /// The slot lease's TTL: how long after an agent dies its slot frees itself.
    pub lease_ttl: Duration,
    /// How long an agent waits for its turn, or for an unreachable coordinator, before the round
    /// gives up (changing nothing); the next round asks again.
    pub wait: Duration,
    /// Time between looks while waiting.
    pub poll: Duration,
}

/// A connection to the coordinator.
#[derive(Clone)]
pub struct Coordinator {
    etcd: Etcd,
    keys: Keys,
}

/// A slot this agent holds: released with the host's outcome written.
pub struct Held {
    service: String,
    host: String,
    lease: Lease,
}

impl Held {
    /// Whether the cluster let the slot's lease run out while this agent held it (it could not
    /// reach the cluster for longer than the TTL): another agent may have taken the slot since.
    pub fn lost(&self) -> bool {
        self.lease.lost()
    }
}

/// Unix seconds now, for entries.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Coordinator {
    /// Connects to the cluster, for the keys under `prefix`.
    pub async fn connect(etcd: &EtcdOptions, prefix: &str) -> Result<Coordinator, EtcdError> {
        Ok(Coordinator {
            etcd: Etcd::connect(etcd).await?,
            keys: Keys::new(prefix),
        })
    }

    /// Requests made to the coordinator so far, and the time they took.
    pub fn spent(&self) -> (u64, Duration) {
        self.etcd.spent()
    }

    /// The host's entry for the service. One round trip.
    pub async fn entry(&self, service: &str, host: &str) -> Result<Option<HostEntry>, EtcdError> {
        let key = self.keys.host(service, host);
        Ok(self
            .etcd
            .get(&key)
            .await?
            .and_then(|text| serde_json::from_str(&text).ok()))
    }

    /// Writes the host's entry. One round trip.
    pub async fn write_entry(
        &self,
        service: &str,
        host: &str,
        entry: &HostEntry,
    ) -> Result<(), EtcdError> {
        self.etcd
            .write(&[self.entry_put(service, host, entry)], &[])
            .await
    }

    fn entry_put(&self, service: &str, host: &str, entry: &HostEntry) -> Put {
        Put {
            key: self.keys.host(service, host),
            value: serde_json::to_string(entry).expect("an entry is JSON"),
            lease: None,
        }
    }

    /// What the coordinator holds for the service, and the cluster revision of the read. One
    /// round trip.
    pub async fn ledger(&self, service: &str) -> Result<(ServiceLedger, i64), EtcdError> {
        let (mut services, revision) = self.read(&self.keys.service(service)).await?;
        Ok((services.remove(service).unwrap_or_default(), revision))
    }

    /// The ledgers of the services under `prefix`, and the cluster revision of the read.
    async fn read(
        &self,
        prefix: &str,
    ) -> Result<(BTreeMap<String, ServiceLedger>, i64), EtcdError> {
        let snapshot = self.etcd.range(prefix).await?;
        let read = snapshot
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()));
        Ok((ledger::collect(&self.keys, read), snapshot.revision))
    }

    /// Takes a restart slot for `host` with `entry` (state `started`) written, if nothing of the
    /// service changed since the read at `seen`; `None`: something did (another agent wrote or
    /// took a slot), read again. Two round trips (the lease, then the transaction).
    pub async fn claim(
        &self,
        service: &str,
        host: &str,
        seen: i64,
        entry: &HostEntry,
        ttl: Duration,
        commit: &str,
    ) -> Result<Option<Held>, EtcdError> {
        let lease = self.etcd.lease(ttl).await?;
        let slot = SlotEntry {
            revision: entry.revision.clone(),
            commit: commit.to_string(),
            since: entry.at,
        };
        let hosts = self.keys.hosts(service);
        let slots = self.keys.slots(service);
        let puts = [
            Put {
                key: self.keys.slot(service, host),
                value: serde_json::to_string(&slot).expect("a slot is JSON"),
                lease: Some(lease.id),
            },
            self.entry_put(service, host, entry),
        ];
        let took = self
            .etcd
            .write_if_unchanged(&[&hosts, &slots], seen, &puts, &[])
            .await?;
        if took {
            Ok(Some(Held {
                service: service.to_string(),
                host: host.to_string(),
                lease,
            }))
        } else {
            // Not taken: the lease holds nothing, and revoking it spares the cluster its TTL.
            let _ = lease.release(&self.etcd).await;
            Ok(None)
        }
    }

    /// Writes the outcome and gives the slot back, at once; then ends the lease.
    pub async fn release(&self, held: Held, entry: &HostEntry) -> Result<(), EtcdError> {
        let written = self.finish(&held.service, &held.host, entry).await;
        let revoked = held.lease.release(&self.etcd).await;
        written.and(revoked)
    }

    /// Writes the host's outcome and deletes its slot, in one transaction.
    pub async fn finish(
        &self,
        service: &str,
        host: &str,
        entry: &HostEntry,
    ) -> Result<(), EtcdError> {
        let slot = self.keys.slot(service, host);
        self.etcd
            .write(&[self.entry_put(service, host, entry)], &[&slot])
            .await
    }

    /// Every service's entries and slots. One round trip.
    pub async fn fleet(&self) -> Result<BTreeMap<String, ServiceLedger>, EtcdError> {
        Ok(self.read(&self.keys.all()).await?.0)
    }
}

/// An entry for now.
pub fn entry(
    revision: &str,
    commit: &str,
    unit_sha256: &str,
    state: State,
    detail: Option<String>,
) -> HostEntry {
    HostEntry {
        revision: revision.to_string(),
        commit: commit.to_string(),
        unit_sha256: unit_sha256.to_string(),
        state,
        at: now(),
        detail,
    }
}
