//! Staged verification of a restarted server, each stage with its own deadline and reason, in the
//! order real SGLang starts (0.5.23, `sglang/srt/managers/scheduler.py`, `init_model_worker`, and
//! `sglang/srt/entrypoints/http_server.py`, `_wait_and_warmup`):
//!
//! 1. crash window: systemd polled every 250 ms; any crash, restart or new invocation fails at once;
//! 2. loading: weights, KV cache and CUDA graphs, port closed. Memory, CPU time and the journal are
//!    sampled; no progress on all of them for the stall timeout is a stall, and a worker process
//!    that dies while the main process lives (a GPU's memory falling, a scheduler gone) fails at
//!    once. Memory over its ceiling or dropping fails at any time;
//! 3. warmup: the port is open and `/health` answers 503 while SGLang's warmup request runs;
//!    `/v1/models` already answers, so identity is checked here, without waiting for warmup;
//! 4. readiness: `/health` 200 (empty body; it takes at least a second, as it runs a generation);
//! 5. memory plateau, then the smoke completion when the manifest asks for one.
//!
//! The judges are pure (`judge`); this file is the poller that owns the clock. Probes of the
//! HTTP port run in a task of their own, one at a time, so a slow `/health` never delays the
//! crash polling.

mod judge;
mod progress;

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

pub use judge::{bytes, crash_reason, sparkline, MemoryPolicy, Sample};
pub use progress::Progress;

use crate::manifest::VerifySpec;
use crate::observed::UnitState;
use crate::plan::flags;
use crate::probe::liveness::ReadLiveness;
use crate::remote::{error_chain, Endpoint, GpuReading, Health, Host, RemoteError, Server};
use crate::sglang::human_readable_int_value;
use crate::systemd::Systemd;
use crate::unit::UnitModel;

/// How often systemd is asked: well under a second, so a crash is reported moments after it
/// happens rather than at the end of a window.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Polls of systemd, one `POLL_INTERVAL` apart, that tell a crash from a worker's death or a
/// memory drop seen in the same moment.
const CONFIRM_POLLS: u32 = 4;

/// What the server must turn out to be, read from the unit being verified.
#[derive(Debug, Clone)]
pub struct Expect {
    pub endpoint: Endpoint,
    pub model_id: String,
    pub context_length: Option<u64>,
    /// GPU indices the service may use (`CUDA_VISIBLE_DEVICES`), all when unset.
    pub gpus: Option<Vec<u32>>,
    /// `--reasoning-parser` is set: answers may come as `reasoning_content`.
    pub reasoning: bool,
}

impl Expect {
    pub fn from_unit(model: &UnitModel) -> Expect {
        let (_, flags) = flags(&model.exec_start);
        let model_id = flags
            .get("served-model-name")
            .or(flags.get("model-path"))
            .cloned()
            .unwrap_or_default();
        Expect {
            endpoint: Endpoint {
                port: flags
                    .get("port")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(30000),
                bind: flags.get("host").cloned(),
                api_key: flags.get("api-key").cloned().filter(|k| !k.is_empty()),
            },
            model_id,
            context_length: flags
                .get("context-length")
                .and_then(|c| human_readable_int_value(c)),
            gpus: model
                .env
                .get("CUDA_VISIBLE_DEVICES")
                .map(|v| v.split(',').filter_map(|i| i.trim().parse().ok()).collect()),
            reasoning: flags.contains_key("reasoning-parser"),
        }
    }
}

/// One stage's result.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    pub name: &'static str,
    pub passed: bool,
    /// Since the restart.
    pub seconds: f64,
    /// When the stage ended, in seconds since the Unix epoch (for comparing with host logs).
    pub at_unix: f64,
    pub detail: String,
}

/// Everything verification saw, for the report and the deployment record.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    pub stages: Vec<Stage>,
    pub samples: Vec<Sample>,
    /// Seconds from the restart to `/health` answering 200.
    pub load_seconds: Option<f64>,
    /// Seconds from the restart to the port answering (the start of warmup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_open_seconds: Option<f64>,
    /// The last sample once loaded.
    pub plateau: Option<Sample>,
    pub notes: Vec<String>,
}

impl Verification {
    pub fn sparkline(&self) -> String {
        let values: Vec<u64> = self
            .samples
            .iter()
            .map(|s| s.service_bytes.unwrap_or(0))
            .collect();
        sparkline(&values)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{stage}: {reason}")]
pub struct Failure {
    pub stage: &'static str,
    pub reason: String,
    pub verification: Verification,
}

/// What the probe task has seen of the server's port.
#[derive(Debug, Clone, Default)]
struct Seen {
    health: Option<Health>,
    /// Since the restart, when the port first answered.
    opened: Option<f64>,
    /// `/v1/models`, asked once the port answers (it answers during warmup).
    models: Option<Result<Vec<crate::remote::Model>, String>>,
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
            if seen.opened.is_some() && seen.models.is_none() {
                // A connection that breaks once is asked again; the third failure is the answer.
                asked_models += 1;
                match server.models().await {
                    Err(_) if asked_models < MODELS_TRIES => {}
                    answer => seen.models = Some(answer),
                }
            }
            let ready = matches!(health, Health::Ready(_));
            seen.health = Some(health);
            if tx.send(seen.clone()).is_err() || (ready && seen.models.is_some()) {
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

/// Verifies a unit systemd has just (re)started. `cancel` turning true (Ctrl-C) fails it.
pub async fn verify(
    host: &dyn Host,
    unit: &str,
    spec: &VerifySpec,
    expect: &Expect,
    progress: &Progress,
    cancel: &watch::Receiver<bool>,
) -> Result<Verification, Failure> {
    let mut run = Run {
        started: Instant::now(),
        record: Verification::default(),
        progress,
        journal_cursor: None,
        journal_lines: 0,
        gpus_hung: false,
    };
    let policy = MemoryPolicy {
        stall_timeout: spec.stall_timeout,
        ceiling_bytes: spec.memory_ceiling,
        gpu_expected_mib: spec.gpu_memory_per_gpu,
        gpu_tolerance_percent: spec.gpu_memory_tolerance,
    };
    let first = run.remote("crash window", host.unit_state(unit).await)?;
    let server = run.remote(
        "readiness",
        host.server(&expect.endpoint, spec.url.as_deref()).await,
    )?;
    let every = spec
        .sample_interval
        .clamp(POLL_INTERVAL, Duration::from_secs(2));
    // Just restarted: nothing listens yet, until a sample says otherwise.
    let (listening, listening_rx) = watch::channel(Some(false));
    let (seen, _probing) = probe(server.clone(), run.started, every, listening_rx);
    let mut cancel = cancel.clone();
    let mut crash_passed = false;
    let mut identified = false;
    let mut ready = false;
    let mut next_sample = run.started;
    loop {
        let stage = if crash_passed {
            "loading"
        } else {
            "crash window"
        };
        if *cancel.borrow() {
            return Err(run.fail(stage, crate::signals::interrupted()));
        }
        let asked = tokio::select! {
            r = host.unit_state(unit) => Some(r),
            _ = cancelled(&mut cancel) => None,
        };
        let Some(asked) = asked else {
            return Err(run.fail(stage, crate::signals::interrupted()));
        };
        let now = run.remote(stage, asked)?;
        if let Some(reason) = crash_reason(&first, &now) {
            return Err(run.crashed(stage, Ok(reason)));
        }
        if !crash_passed && run.elapsed() >= spec.crash_window.as_secs_f64() {
            crash_passed = true;
            run.pass(
                "crash window",
                format!(
                    "no crash, restart or new invocation in {:?}",
                    spec.crash_window
                ),
            );
        }
        let seen = seen.borrow().clone();
        if let (false, Some(models)) = (identified, &seen.models) {
            run.identity(models, expect)?;
            identified = true;
        }
        if !ready {
            if let Some(Health::Ready(took)) = &seen.health {
                ready = true;
                run.ready(seen.opened, *took);
            }
        }
        let phase = match (ready, seen.opened) {
            (true, _) => "loaded",
            (false, Some(_)) => "warmup",
            (false, None) => stage,
        };
        if Instant::now() >= next_sample {
            next_sample += spec.sample_interval;
            // A sample can wait on a slow host (a hung nvidia-smi, up to the command timeout):
            // systemd is still polled meanwhile, so a crash is not reported late.
            let sampled = tokio::select! {
                r = run.sample(host, unit, &first, &now, expect) => Meanwhile::Done(r),
                crash = crash_meanwhile(host, unit, &first) => Meanwhile::Crashed(crash),
                _ = cancelled(&mut cancel) => Meanwhile::Cancelled,
            };
            let sample = match sampled {
                Meanwhile::Done(sample) => sample?,
                Meanwhile::Crashed(crash) => return Err(run.crashed(stage, crash)),
                Meanwhile::Cancelled => return Err(run.fail(stage, crate::signals::interrupted())),
            };
            listening.send_replace(sample.listening);
            run.progress
                .update(phase, run.elapsed(), &sample, &run.record);
            let judged = judge::memory_failure(&run.record.samples, &policy)
                .map(|reason| ("memory", reason))
                .or_else(|| {
                    judge::dead_worker(&run.record.samples, expect.gpus.is_some())
                        .map(|reason| (stage, reason))
                });
            if let Some((failed, reason)) = judged {
                // A server that exits frees its memory and GPUs a moment before its main process
                // is gone (SGLang kills its children first): if systemd sees the exit within a
                // second, that is a crash, and is reported as one.
                for _ in 0..CONFIRM_POLLS {
                    let again = run.remote(stage, host.unit_state(unit).await)?;
                    if let Some(crash) = crash_reason(&first, &again) {
                        return Err(run.crashed(stage, Ok(crash)));
                    }
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                return Err(run.fail(failed, reason));
            }
            if seen.opened.is_none() {
                if let Some(reason) = judge::stall(&run.record.samples, &policy) {
                    return Err(run.fail("loading", reason));
                }
            }
        }
        if ready && identified && crash_passed {
            let finished = tokio::select! {
                r = run.finish(host, unit, &first, &now, expect, &policy, &server, spec) => Meanwhile::Done(r),
                crash = crash_meanwhile(host, unit, &first) => Meanwhile::Crashed(crash),
                _ = cancelled(&mut cancel) => Meanwhile::Cancelled,
            };
            return match finished {
                Meanwhile::Done(verified) => verified,
                Meanwhile::Crashed(crash) => Err(run.crashed("loading", crash)),
                Meanwhile::Cancelled => Err(run.fail("smoke", crate::signals::interrupted())),
            };
        }
        let last = seen
            .health
            .as_ref()
            .map_or("not asked yet".to_string(), describe);
        if let Some(opened) = seen.opened.filter(|_| !ready) {
            let warming = run.elapsed() - opened;
            if warming >= spec.warmup_timeout.as_secs_f64() {
                let reason = format!(
                    "still warming up {warming:.0}s after the port opened (warmup timeout {:?}); last: {last}",
                    spec.warmup_timeout
                );
                return Err(run.fail("warmup", reason));
            }
        }
        if run.elapsed() >= spec.load_deadline.as_secs_f64() {
            let reason = format!(
                "not ready after the {:?} load deadline; last: {last}",
                spec.load_deadline
            );
            let stage = if seen.opened.is_some() {
                "warmup"
            } else {
                "readiness"
            };
            return Err(run.fail(stage, reason));
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = cancel.changed() => {}
        }
    }
}

/// What happened while a long step (a sample, the smoke completion) ran.
enum Meanwhile<T> {
    Done(T),
    Crashed(Result<String, RemoteError>),
    Cancelled,
}

/// Polls systemd until the unit shows a crash (its reason) or cannot be asked; never resolves
/// while the unit is healthy. Its first look comes a poll interval in, so a quick step never
/// pays for one.
async fn crash_meanwhile(
    host: &dyn Host,
    unit: &str,
    first: &UnitState,
) -> Result<String, RemoteError> {
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        if let Some(reason) = crash_reason(first, &host.unit_state(unit).await?) {
            return Ok(reason);
        }
    }
}

/// Resolves once `cancel` turns true; never when nobody can cancel any more.
async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await
    }
}

fn describe(health: &Health) -> String {
    match health {
        Health::Ready(took) => format!("/health answered 200 in {:.1}s", took.as_secs_f64()),
        Health::Warming(why) => format!("warming up ({why})"),
        Health::Closed(e) => format!("the port is not open yet ({e})"),
    }
}

struct Run<'a> {
    started: Instant,
    record: Verification,
    progress: &'a Progress,
    /// Where the next journal read continues, and the lines read so far.
    journal_cursor: Option<String>,
    journal_lines: u64,
    /// nvidia-smi did not answer once: GPUs are not asked again.
    gpus_hung: bool,
}

impl Run<'_> {
    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn pass(&mut self, name: &'static str, detail: String) {
        self.progress.stage(name, true, &detail);
        self.record.stages.push(Stage {
            name,
            passed: true,
            seconds: self.elapsed(),
            at_unix: unix_now(),
            detail,
        });
    }

    fn fail(&mut self, name: &'static str, reason: String) -> Failure {
        self.progress.stage(name, false, &reason);
        self.record.stages.push(Stage {
            name,
            passed: false,
            seconds: self.elapsed(),
            at_unix: unix_now(),
            detail: reason.clone(),
        });
        Failure {
            stage: name,
            reason,
            verification: std::mem::take(&mut self.record),
        }
    }

    /// The stage failed on what systemd said while another step ran: a crash, or no answer.
    fn crashed(&mut self, stage: &'static str, seen: Result<String, RemoteError>) -> Failure {
        let reason = match seen {
            Ok(crash) => format!("crashed {:.1}s after the restart: {crash}", self.elapsed()),
            Err(e) => error_chain(&e),
        };
        self.fail(stage, reason)
    }

    fn remote<T, E: std::error::Error + 'static>(
        &mut self,
        stage: &'static str,
        r: Result<T, E>,
    ) -> Result<T, Failure> {
        r.map_err(|e| self.fail(stage, error_chain(&e)))
    }

    fn note(&mut self, note: String) {
        if !self.record.notes.contains(&note) {
            self.record.notes.push(note);
        }
    }

    /// Memory, GPU memory and the other signs of life, read concurrently.
    async fn sample(
        &mut self,
        host: &dyn Host,
        unit: &str,
        first: &UnitState,
        state: &UnitState,
        expect: &Expect,
    ) -> Result<Sample, Failure> {
        let gpus = async {
            // Not asked again once it hung: that would hold up every sample by the timeout.
            if self.gpus_hung {
                None
            } else {
                Some(host.gpu_memory().await)
            }
        };
        let (gpus, life) = tokio::join!(
            gpus,
            host.liveness(
                unit,
                &first.invocation_id,
                self.journal_cursor.as_deref(),
                expect.endpoint.port
            )
        );
        let gpu_mib = match gpus {
            None => Vec::new(),
            // A GPU that fell off the bus hangs nvidia-smi.
            Some(Err(e @ RemoteError::TimedOut { .. })) => {
                self.gpus_hung = true;
                self.note(format!(
                    "{e}: GPU memory is not judged for the rest of this verification (a GPU that fell off the bus hangs nvidia-smi; check the host)"
                ));
                Vec::new()
            }
            Some(reading) => match self.remote("memory", reading)? {
                GpuReading::Gpus(all) => all
                    .iter()
                    .filter(|g| {
                        expect
                            .gpus
                            .as_ref()
                            .is_none_or(|mine| mine.contains(&g.index))
                    })
                    .map(|g| g.used_mib)
                    .collect(),
                GpuReading::NoTooling(why) => {
                    self.note(format!(
                        "no GPU tooling on the host ({why}); judged without GPU memory"
                    ));
                    Vec::new()
                }
            },
        };
        let life = self.remote("memory", life)?;
        if life.cpu_usec.is_none() {
            self.note(
                "the host reports no CPU time for the unit's cgroup; a stall is judged without it"
                    .into(),
            );
        }
        self.journal_cursor = life.cursor.clone();
        self.journal_lines += life.new_journal_lines;
        let sample = Sample {
            seconds: self.elapsed(),
            service_bytes: state.memory_current,
            gpu_mib,
            anon_bytes: life.anon_bytes,
            cpu_seconds: life.cpu_usec.map(|us| us as f64 / 1e6),
            journal_lines: Some(self.journal_lines),
            processes: life.processes,
            schedulers: life.schedulers,
            listening: life.listening,
        };
        self.record.samples.push(sample.clone());
        Ok(sample)
    }

    /// `/v1/models` must name the expected model, with the expected context length.
    fn identity(
        &mut self,
        models: &Result<Vec<crate::remote::Model>, String>,
        expect: &Expect,
    ) -> Result<(), Failure> {
        let models = match models {
            Ok(m) => m,
            Err(e) => return Err(self.fail("identity", e.clone())),
        };
        let Some(model) = models.iter().find(|m| m.id == expect.model_id) else {
            let serving: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
            let reason = format!(
                "/v1/models lists {serving:?}, not the expected `{}`: wrong model",
                expect.model_id
            );
            return Err(self.fail("identity", reason));
        };
        if let (Some(want), Some(got)) = (expect.context_length, model.max_model_len) {
            if want != got {
                return Err(self.fail(
                    "identity",
                    format!("max_model_len is {got}, the manifest sets context-length {want}"),
                ));
            }
        }
        self.pass("identity", format!("/v1/models serves `{}`", model.id));
        Ok(())
    }

    fn ready(&mut self, opened: Option<f64>, took: Duration) {
        let now = self.elapsed();
        self.record.load_seconds = Some(now);
        self.record.port_open_seconds = opened;
        let opened = opened.unwrap_or(now);
        self.pass(
            "warmup",
            format!(
                "the port opened after {opened:.1}s; warmup ended {:.1}s later",
                (now - opened).max(0.0)
            ),
        );
        self.pass(
            "readiness",
            format!(
                "/health answered 200 after {now:.1}s (the probe took {:.1}s)",
                took.as_secs_f64()
            ),
        );
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        host: &dyn Host,
        unit: &str,
        first: &UnitState,
        state: &UnitState,
        expect: &Expect,
        policy: &MemoryPolicy,
        server: &Server,
        spec: &VerifySpec,
    ) -> Result<Verification, Failure> {
        let loaded = self.sample(host, unit, first, state, expect).await?;
        if let Some(reason) = judge::plateau_failure(&loaded, policy) {
            return Err(self.fail("memory", reason));
        }
        let plateau = format!(
            "plateau: service {}{}",
            loaded.service_bytes.map_or("?".into(), bytes),
            if loaded.gpu_mib.is_empty() {
                String::new()
            } else {
                format!(", GPUs {:?} MiB", loaded.gpu_mib)
            }
        );
        self.pass("memory", plateau);
        self.record.plateau = Some(loaded);
        if let Some(smoke) = &spec.smoke {
            let asked = server
                .chat(
                    &expect.model_id,
                    &smoke.prompt,
                    smoke.max_tokens(expect.reasoning),
                    expect.reasoning,
                )
                .await;
            match asked {
                Ok(answer) if answer.content.contains(&smoke.expect) => {
                    self.pass("smoke", format!("answered {:?}", answer.content))
                }
                Ok(answer)
                    if answer
                        .reasoning
                        .as_deref()
                        .is_some_and(|r| r.contains(&smoke.expect)) =>
                {
                    self.pass(
                        "smoke",
                        format!(
                            "the expected {:?} came in the model's thinking (reasoning_content); content {:?}",
                            smoke.expect, answer.content
                        ),
                    )
                }
                Ok(answer) => {
                    let cut = if answer.finish_reason.as_deref() == Some("length") {
                        " (cut at max_tokens: raise verify.smoke.max_tokens)"
                    } else {
                        ""
                    };
                    return Err(self.fail(
                        "smoke",
                        format!(
                            "answered {:?}, which lacks {:?}{cut}",
                            answer.content, smoke.expect
                        ),
                    ));
                }
                Err(e) => return Err(self.fail("smoke", e)),
            }
        }
        Ok(std::mem::take(&mut self.record))
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::parse_unit;

    const UNIT: &str = "[Service]\nEnvironment=\"CUDA_VISIBLE_DEVICES=4,5\"\nExecStart=/venv/bin/python3 -m sglang.launch_server \\\n\t--model-path /models/m \\\n\t--served-model-name qwen \\\n\t--api-key sk-secret \\\n\t--context-length 256k \\\n\t--reasoning-parser qwen3 \\\n\t--host 10.0.0.5 \\\n\t--port 30001\n";

    #[test]
    fn what_the_server_must_be_is_read_from_its_unit_as_sglang_reads_it() {
        let e = Expect::from_unit(&parse_unit(UNIT));
        assert_eq!(e.model_id, "qwen");
        assert_eq!(
            e.context_length,
            Some(256_000),
            "human_readable_int: k is 1000"
        );
        assert_eq!(e.gpus, Some(vec![4, 5]));
        assert!(e.reasoning);
        assert_eq!(e.endpoint.port, 30001);
        assert_eq!(e.endpoint.forward_address(), "10.0.0.5");
        assert_eq!(e.endpoint.api_key.as_deref(), Some("sk-secret"));
        assert!(
            !format!("{e:?}").contains("sk-secret"),
            "Debug hides the key"
        );
    }

    #[test]
    fn a_unit_without_flags_gets_sglang_defaults() {
        let e = Expect::from_unit(&parse_unit(
            "[Service]\nExecStart=/p -m sglang.launch_server --model-path /models/m\n",
        ));
        assert_eq!(
            e.model_id, "/models/m",
            "SGLang serves the model path by default"
        );
        assert_eq!(
            (e.endpoint.port, e.endpoint.forward_address()),
            (30000, "127.0.0.1")
        );
        assert_eq!(
            (e.context_length, e.gpus.clone(), e.reasoning),
            (None, None, false)
        );
        assert_eq!(e.endpoint.api_key, None);
    }
}
