//! What verification asks of the host and the server, behind `Probes` so the driver can be run
//! over a scripted fake. `HostProbes` is the real one: systemd and the samples over the host's
//! connection, the HTTP port from a task of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::judge::Sample;
use super::stages::Seen;
use super::Expect;
use crate::manifest::Smoke;
use crate::observed::UnitState;
use crate::remote::http::{Answer, ApiError};
use crate::remote::{GpuReading, Health, Host, RemoteError, Server};
use crate::systemd::Systemd as _;

/// One sample's readings, and the notes they gave rise to (kept even when the sample fails).
pub struct Sampled {
    pub notes: Vec<String>,
    /// `seconds` is left to the caller, who owns the clock.
    pub sample: Result<Sample, RemoteError>,
}

/// The remote side of verification.
pub trait Probes {
    /// The unit as `systemctl show` sees it.
    async fn unit_state(&self) -> Result<UnitState, RemoteError>;
    /// Memory, GPU memory and the other signs of life. `first` is the state at the restart (its
    /// invocation's journal is read), `now` the latest (its `MemoryCurrent`).
    async fn sample(&self, first: &UnitState, now: &UnitState) -> Sampled;
    /// What the HTTP probe has seen of the port so far.
    fn seen(&self) -> Seen;
    /// Whether the last sample found something listening on the port: the HTTP probe waits
    /// while nothing does.
    fn listening(&self, open: Option<bool>);
    /// The smoke completion.
    async fn smoke(&self, smoke: &Smoke) -> Result<Answer, ApiError>;
}

/// Where the journal reading continues, and what the GPUs did.
#[derive(Default)]
struct Readings {
    journal_cursor: Option<String>,
    journal_lines: u64,
    /// nvidia-smi did not answer once: GPUs are not asked again.
    gpus_hung: bool,
}

pub struct HostProbes<'a> {
    host: &'a dyn Host,
    unit: &'a str,
    expect: &'a Expect,
    server: Server,
    seen: watch::Receiver<Seen>,
    listening: watch::Sender<Option<bool>>,
    _probing: AbortOnDrop,
    /// Never held across an await.
    readings: Mutex<Readings>,
}

impl<'a> HostProbes<'a> {
    /// Starts probing `server` every `every` (one request at a time) as soon as a sample says
    /// the port listens.
    pub fn new(
        host: &'a dyn Host,
        unit: &'a str,
        expect: &'a Expect,
        server: Server,
        started: Instant,
        every: Duration,
    ) -> HostProbes<'a> {
        // Just restarted: nothing listens yet, until a sample says otherwise.
        let (listening, listening_rx) = watch::channel(Some(false));
        let (seen, probing) = probe(
            server.clone(),
            started,
            every,
            listening_rx,
            !expect.follower,
        );
        HostProbes {
            host,
            unit,
            expect,
            server,
            seen,
            listening,
            _probing: probing,
            readings: Mutex::default(),
        }
    }

    fn readings(&self) -> std::sync::MutexGuard<'_, Readings> {
        self.readings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The GPUs the unit uses, in MiB, noting why there are none.
    fn gpu_mib(
        &self,
        gpus: Option<Result<GpuReading, RemoteError>>,
        notes: &mut Vec<String>,
    ) -> Result<Vec<u64>, RemoteError> {
        Ok(match gpus {
            None => Vec::new(),
            // A GPU that fell off the bus hangs nvidia-smi.
            Some(Err(e @ RemoteError::TimedOut { .. })) => {
                self.readings().gpus_hung = true;
                notes.push(format!(
                    "{e}: GPU memory is not judged for the rest of this verification (a GPU that fell off the bus hangs nvidia-smi; check the host)"
                ));
                Vec::new()
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(GpuReading::Gpus(all))) => all
                .iter()
                .filter(|g| {
                    self.expect
                        .gpus
                        .as_ref()
                        .is_none_or(|mine| mine.contains(&g.index))
                })
                .map(|g| g.used_mib)
                .collect(),
            Some(Ok(GpuReading::NoTooling(why))) => {
                notes.push(format!(
                    "no GPU tooling on the host ({why}); judged without GPU memory"
                ));
                Vec::new()
            }
        })
    }

    async fn read(
        &self,
        first: &UnitState,
        now: &UnitState,
        notes: &mut Vec<String>,
    ) -> Result<Sample, RemoteError> {
        let (gpus_hung, cursor) = {
            let r = self.readings();
            (r.gpus_hung, r.journal_cursor.clone())
        };
        let gpus = async {
            // Not asked again once it hung: that would hold up every sample by the timeout.
            if gpus_hung {
                None
            } else {
                Some(self.host.gpu_memory().await)
            }
        };
        let (gpus, life) = tokio::join!(
            gpus,
            self.host.liveness(
                self.unit,
                &first.invocation_id,
                cursor.as_deref(),
                self.expect.endpoint.port
            )
        );
        let gpu_mib = self.gpu_mib(gpus, notes)?;
        let life = life?;
        if life.cpu_usec.is_none() {
            notes.push(
                "the host reports no CPU time for the unit's cgroup; a stall is judged without it"
                    .into(),
            );
        }
        let mut r = self.readings();
        r.journal_cursor = life.cursor.clone();
        r.journal_lines += life.new_journal_lines;
        Ok(Sample {
            seconds: 0.0,
            service_bytes: now.memory_current,
            gpu_mib,
            anon_bytes: life.anon_bytes,
            cpu_seconds: life.cpu_usec.map(|us| us as f64 / 1e6),
            journal_lines: Some(r.journal_lines),
            processes: life.processes,
            schedulers: life.schedulers,
            listening: life.listening,
        })
    }
}

impl Probes for HostProbes<'_> {
    async fn unit_state(&self) -> Result<UnitState, RemoteError> {
        self.host.unit_state(self.unit).await
    }

    async fn sample(&self, first: &UnitState, now: &UnitState) -> Sampled {
        let mut notes = Vec::new();
        let sample = self.read(first, now, &mut notes).await;
        Sampled { notes, sample }
    }

    fn seen(&self) -> Seen {
        self.seen.borrow().clone()
    }

    fn listening(&self, open: Option<bool>) {
        self.listening.send_replace(open);
    }

    async fn smoke(&self, smoke: &Smoke) -> Result<Answer, ApiError> {
        let reasoning = self.expect.reasoning;
        self.server
            .chat(
                &self.expect.model_id,
                &smoke.prompt,
                smoke.max_tokens(reasoning),
                reasoning,
            )
            .await
    }
}

/// Probes the port one request at a time until the server is ready and has named its model.
/// Dropping the guard stops it.
///
/// It waits while `listening` says nothing listens on the port: a request through an SSH forward
/// to a closed port can hang rather than fail, and would hold up the next probe.
fn probe(
    server: Server,
    started: Instant,
    every: Duration,
    mut listening: watch::Receiver<Option<bool>>,
    // A rank >= 1 of a group serves no `/v1/models` (`Expect::follower`): not asked.
    identify: bool,
) -> (watch::Receiver<Seen>, AbortOnDrop) {
    let (tx, rx) = watch::channel(Seen::default());
    let task = tokio::spawn(async move {
        let mut seen = Seen::default();
        let mut asked_models = 0;
        loop {
            if listening
                .wait_for(|open| *open != Some(false))
                .await
                .is_err()
            {
                return;
            }
            let health = server.health().await;
            if !matches!(health, Health::Closed(_)) && seen.opened.is_none() {
                seen.opened = Some(started.elapsed().as_secs_f64());
            }
            if identify && seen.opened.is_some() && seen.models.is_none() {
                // A connection that breaks once is asked again; the third failure is the answer.
                asked_models += 1;
                match server.models().await {
                    Err(_) if asked_models < MODELS_TRIES => {}
                    answer => seen.models = Some(answer.map_err(Arc::new)),
                }
            }
            let ready = matches!(health, Health::Ready(_));
            seen.health = Some(health);
            if tx.send(seen.clone()).is_err() || (ready && (seen.models.is_some() || !identify)) {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    (rx, AbortOnDrop(task))
}

const MODELS_TRIES: u32 = 3;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
