//! The rollout's fetch ahead: every host with work brings its pinned weights (`sglang.model:`)
//! to it at once, before the rollout's first stop, while the old servers serve. The hosts after
//! the canary then find their copy verified at their turn instead of fetching in it, and a host
//! whose fetch fails fails before any server stopped anywhere.
//!
//! With `peers:`, the hosts of one revision form a swarm (as Dragonfly and Kraken spread images):
//! the source serves one host at a time, and every host that holds the revision, or has just
//! fetched it, serves one peer at a time, so the hosts that can serve double as the fetch goes on
//! and the source serves the revision about once. A peer is no more trusted than the source:
//! every file is checked against the lock, and a peer whose copy fails is not asked again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressStyle};
use reconcile_core::pinned::{Fetched, Holding, PinnedModel, Server};
use tokio::sync::Notify;

use super::error::ApplyError;
use super::{ApplyOptions, Report, UnitReport};
use crate::pinned::{self, PinnedError, Seeder};
use crate::remote::{Host, SshOptions};
use crate::targets::Target;
use crate::visit;

/// What the fetch ahead did, by (host, unit).
#[derive(Default)]
pub(super) struct Ahead {
    pub fetched: HashMap<(String, String), Fetched>,
    /// The peer each unit's copy came from, when not from the source.
    pub peer: HashMap<(String, String), String>,
    /// The units whose host could not bring its copy, and why (one error for every unit of a
    /// host that could not be reached).
    pub failed: HashMap<(String, String), Arc<PinnedError>>,
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
            let key = (r.host.clone(), r.unit.clone());
            if let Some(f) = self.fetched.get(&key) {
                let mut note = pinned::fetched_note(f);
                if let Some(peer) = self.peer.get(&key) {
                    note.push_str(&format!("; from {peer}, a peer that held the revision"));
                }
                r.notes.insert(0, note);
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
    let swarms = Swarms::of(targets);
    let results = visit::each_host(
        hosts,
        ssh,
        at_once,
        |name| tracing::info_span!("fetch", host = %name),
        async |host: &dyn Host, visit: &visit::Visit<'_>, targets: Vec<Target>| {
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
                let (result, peer) = match swarms.of_spec(spec) {
                    Some(swarm) => swarm.fetch(host, t, spec, bar.as_ref(), options).await,
                    None => (
                        pinned::ensure(host, python, spec, token, bar.as_ref(), &options.cancel)
                            .await,
                        None,
                    ),
                };
                if let Some(bar) = bar {
                    bar.finish_and_clear();
                }
                done.push((t.desired.unit.clone(), result.map_err(Arc::new), peer));
            }
            (visit.name.to_string(), done)
        },
        |visit, targets, e| {
            let why = Arc::new(PinnedError::Remote(e));
            let done = targets
                .iter()
                .map(|t| (t.desired.unit.clone(), Err(why.clone()), None))
                .collect();
            (visit.name.to_string(), done)
        },
    )
    .await;
    swarms.stop(ssh).await;
    for (host, units) in results {
        for (unit, result, peer) in units {
            if let Some(peer) = peer {
                ahead.peer.insert((host.clone(), unit.clone()), peer);
            }
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

/// The swarms of a rollout's fetch: one per revision whose manifest asks for `peers:`.
struct Swarms {
    by_revision: HashMap<(String, String), Swarm>,
}

impl Swarms {
    fn of(targets: &[Target]) -> Swarms {
        let mut by_revision = HashMap::new();
        for spec in targets
            .iter()
            .filter_map(|t| t.manifest.sglang.pinned.as_ref())
        {
            if let Some(peers) = &spec.peers {
                by_revision
                    .entry((spec.lock_source(), spec.revision.clone()))
                    .or_insert_with(|| Swarm::new(spec.fetch_base(), peers.port));
            }
        }
        Swarms { by_revision }
    }

    fn of_spec(&self, spec: &PinnedModel) -> Option<&Swarm> {
        self.by_revision
            .get(&(spec.lock_source(), spec.revision.clone()))
    }

    /// Stops every host's serving, once every fetch is done.
    async fn stop(&self, ssh: &SshOptions) {
        let mut by_host: HashMap<String, Vec<String>> = HashMap::new();
        for swarm in self.by_revision.values() {
            for seeder in swarm.state().seeders.iter() {
                by_host
                    .entry(seeder.host.clone())
                    .or_default()
                    .push(seeder.unit.clone());
            }
        }
        visit::each_host(
            by_host,
            ssh,
            32,
            visit::no_span,
            async |host: &dyn Host, _: &visit::Visit<'_>, units: Vec<String>| {
                for unit in units {
                    // A service left behind stops by itself (`RuntimeMaxSec=`).
                    let _ = pinned::unseed(host, &unit).await;
                }
            },
            |_, _, _| (),
        )
        .await;
    }
}

/// The hosts that can serve one revision, and who serves whom now: the core's [`Swarm`]
/// decides; this holds it across the hosts' tasks and wakes those waiting for a server.
struct Swarm {
    state: Mutex<SwarmState>,
    changed: Notify,
    port: u16,
}

struct SwarmState {
    /// The revision's own source (the hub).
    source: String,
    decide: reconcile_core::pinned::Swarm,
    /// The serving hosts, in the order the core numbers its peers.
    seeders: Vec<Seeder>,
}

impl Swarm {
    fn new(source: String, port: u16) -> Swarm {
        Swarm {
            state: Mutex::new(SwarmState {
                source,
                decide: Default::default(),
                seeders: Vec::new(),
            }),
            changed: Notify::new(),
            port,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SwarmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A server for one fetch (its URL, and the peer's name when it is one); waits until one is
    /// free.
    async fn take(&self) -> (Server, String, Option<String>) {
        loop {
            // Made before the state is read, so a release between the two is not missed.
            let notified = self.changed.notified();
            {
                let mut state = self.state();
                match state.decide.take() {
                    Some(Server::Source) => return (Server::Source, state.source.clone(), None),
                    Some(Server::Peer(i)) => {
                        let seeder = &state.seeders[i];
                        return (
                            Server::Peer(i),
                            seeder.url.clone(),
                            Some(seeder.host.clone()),
                        );
                    }
                    None => {}
                }
            }
            notified.await;
        }
    }

    fn give_back(&self, server: Server, failed: bool) {
        self.state().decide.done(server, failed);
        self.changed.notify_waiters();
    }

    /// `host` serves its verified copy from now on; a host that cannot serve still has its copy.
    async fn serve(&self, host: &dyn Host, python: &str, spec: &PinnedModel) {
        if let Ok(seeder) = pinned::seed(host, python, spec, self.port).await {
            let mut state = self.state();
            state.decide.join();
            state.seeders.push(seeder);
        }
        self.changed.notify_waiters();
    }

    /// `host`'s copy of `spec`'s revision, from a peer or the source, then served to the others.
    /// Returns the peer it came from, when it came from one.
    async fn fetch(
        &self,
        host: &dyn Host,
        t: &Target,
        spec: &PinnedModel,
        bar: Option<&ProgressBar>,
        options: &ApplyOptions,
    ) -> (Result<Option<Fetched>, PinnedError>, Option<String>) {
        let python = &t.manifest.sglang.python;
        let planned = match pinned::plan(host, python, spec).await {
            Ok(planned) => planned,
            Err(e) => return (Err(e), None),
        };
        match planned.holding {
            Holding::Verified => {
                self.serve(host, python, spec).await;
                return (Ok(None), None);
            }
            Holding::Refused { why } => {
                let host = host.name().to_string();
                return (Err(PinnedError::Refused { host, why }), None);
            }
            Holding::Fetch { .. } => {}
        }
        loop {
            let (slot, url, peer) = tokio::select! {
                taken = self.take() => taken,
                () = options.cancel.cancelled() => {
                    let why = "a signal stopped the apply before its turn to fetch".to_string();
                    return (Err(PinnedError::Interrupted { host: host.name().to_string(), why }), None);
                }
            };
            // The hub's token goes to the hub alone, never to a peer.
            let token = match slot {
                Server::Source => t.desired.model.env.get("HF_TOKEN").map(String::as_str),
                Server::Peer(_) => None,
            };
            let result = pinned::fetch(host, python, spec, &url, token, bar, &options.cancel).await;
            let from_peer = matches!(slot, Server::Peer(_));
            let interrupted = matches!(result, Err(PinnedError::Interrupted { .. }));
            // Serving before the slot is given back: a host waiting for it finds a peer, not
            // the source free again.
            if result.is_ok() {
                self.serve(host, python, spec).await;
            }
            self.give_back(slot, result.is_err() && !interrupted);
            match result {
                Ok(fetched) => return (Ok(Some(fetched)), peer),
                // Another peer, or the source, serves it instead.
                Err(_) if from_peer && !interrupted => continue,
                Err(e) => return (Err(e), None),
            }
        }
    }
}
