//! Staged verification of a restarted server, each stage with its own deadline and reason:
//!
//! 1. crash window: systemd polled every 250 ms; any crash, restart or new invocation fails at once;
//! 2. memory trajectory: service and GPU memory sampled while the model loads; a stall, a drop or
//!    a ceiling fails, and the loaded server must sit near its expected per-GPU plateau;
//! 3. readiness and identity: `/health` 200 (empty body) and `/v1/models` naming the expected
//!    model with the expected context length, before the load deadline;
//! 4. smoke completion, when the manifest asks for one.
//!
//! The judges are pure (`judge`); this file is the poller that owns the clock.

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
use crate::remote::{error_chain, GpuReading, Health, Host, Server};
use crate::unit::UnitModel;

/// How often systemd is asked: well under a second, so a crash is reported moments after it
/// happens rather than at the end of a window.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// What the server must turn out to be, read from the unit being verified.
#[derive(Debug, Clone)]
pub struct Expect {
    pub port: u16,
    pub model_id: String,
    pub context_length: Option<u64>,
    /// GPU indices the service may use (`CUDA_VISIBLE_DEVICES`), all when unset.
    pub gpus: Option<Vec<u32>>,
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
            port: flags
                .get("port")
                .and_then(|p| p.parse().ok())
                .unwrap_or(30000),
            model_id,
            context_length: flags.get("context-length").and_then(|c| c.parse().ok()),
            gpus: model
                .env
                .get("CUDA_VISIBLE_DEVICES")
                .map(|v| v.split(',').filter_map(|i| i.trim().parse().ok()).collect()),
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

/// Verifies a unit systemd has just (re)started. `cancel` turning true (Ctrl-C) fails it.
pub async fn verify(
    host: &Host,
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
        host.server(expect.port, spec.url.as_deref()).await,
    )?;
    let mut crash_passed = false;
    let mut ready = false;
    let mut next_sample = run.started;
    let mut last_health = String::from("not asked yet");
    loop {
        if *cancel.borrow() {
            return Err(run.fail(
                if crash_passed {
                    "loading"
                } else {
                    "crash window"
                },
                "interrupted (Ctrl-C)".into(),
            ));
        }
        let stage = if crash_passed {
            "loading"
        } else {
            "crash window"
        };
        let now = run.remote(stage, host.unit_state(unit).await)?;
        if let Some(reason) = crash_reason(&first, &now) {
            let stage = if crash_passed {
                "loading"
            } else {
                "crash window"
            };
            return Err(run.fail(
                stage,
                format!("crashed {:.1}s after the restart: {reason}", run.elapsed()),
            ));
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
        if Instant::now() >= next_sample {
            next_sample += spec.sample_interval;
            let sample = run.sample(host, unit, &now, expect).await?;
            run.progress.update(
                if crash_passed {
                    "loading"
                } else {
                    "crash window"
                },
                run.elapsed(),
                &sample,
                &run.record,
            );
            if let Some(reason) = judge::memory_failure(&run.record.samples, &policy, ready) {
                return Err(run.fail("memory", reason));
            }
            if !ready {
                match server.health().await {
                    Health::Ready => {
                        ready = true;
                        run.record.load_seconds = Some(run.elapsed());
                        run.identity(&server, expect).await?;
                    }
                    Health::Starting(code) => last_health = format!("/health answered {code}"),
                    Health::Closed(e) => last_health = format!("the port is not open yet ({e})"),
                }
            }
        }
        if ready && crash_passed {
            return run
                .finish(host, unit, &now, expect, &policy, &server, spec)
                .await;
        }
        if run.elapsed() >= spec.load_deadline.as_secs_f64() {
            let reason = format!(
                "not ready after the {:?} load deadline; last: {last_health}",
                spec.load_deadline
            );
            return Err(run.fail("readiness", reason));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

struct Run<'a> {
    started: Instant,
    record: Verification,
    progress: &'a Progress,
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

    fn remote<T, E: std::error::Error + 'static>(
        &mut self,
        stage: &'static str,
        r: Result<T, E>,
    ) -> Result<T, Failure> {
        r.map_err(|e| self.fail(stage, error_chain(&e)))
    }

    async fn sample(
        &mut self,
        host: &Host,
        unit: &str,
        state: &UnitState,
        expect: &Expect,
    ) -> Result<Sample, Failure> {
        let gpus = self.remote("memory", host.gpu_memory().await)?;
        let gpu_mib = match gpus {
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
                let note =
                    format!("no GPU tooling on the host ({why}); judged on service memory alone");
                if !self.record.notes.contains(&note) {
                    self.record.notes.push(note);
                }
                Vec::new()
            }
        };
        let _ = unit;
        let sample = Sample {
            seconds: self.elapsed(),
            service_bytes: state.memory_current,
            gpu_mib,
        };
        self.record.samples.push(sample.clone());
        Ok(sample)
    }

    async fn identity(&mut self, server: &Server, expect: &Expect) -> Result<(), Failure> {
        self.pass(
            "readiness",
            format!("/health answered 200 after {:.1}s", self.elapsed()),
        );
        let models = match server.models().await {
            Ok(m) => m,
            Err(e) => return Err(self.fail("identity", e)),
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

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        host: &Host,
        unit: &str,
        state: &UnitState,
        expect: &Expect,
        policy: &MemoryPolicy,
        server: &Server,
        spec: &VerifySpec,
    ) -> Result<Verification, Failure> {
        let loaded = self.sample(host, unit, state, expect).await?;
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
            match server
                .chat(&expect.model_id, &smoke.prompt, smoke.max_tokens)
                .await
            {
                Ok(answer) if answer.contains(&smoke.expect) => {
                    self.pass("smoke", format!("answered {answer:?}"))
                }
                Ok(answer) => {
                    return Err(self.fail(
                        "smoke",
                        format!("answered {answer:?}, which lacks {:?}", smoke.expect),
                    ))
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
