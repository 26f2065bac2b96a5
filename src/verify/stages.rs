//! The stage machine: what verification has established so far, and given the latest facts (time
//! since the restart, what systemd says, what the HTTP probe and the samples have seen), what to
//! do next. No clock, no I/O: the driver in `mod.rs` asks, does, and reports back, so every branch
//! is tested here with plain values.

use std::time::Duration;

use super::judge::{self, bytes, Sample};
use super::MemoryPolicy;
use super::CONFIRM_POLLS;
use crate::manifest::{Smoke, VerifySpec};
use crate::remote::http::Answer;
use crate::remote::{Health, Model};

/// What the manifest and the unit ask of this verification.
#[derive(Debug, Clone)]
pub struct Rules {
    pub crash_window: Duration,
    pub load_deadline: Duration,
    pub warmup_timeout: Duration,
    pub sample_interval: Duration,
    pub policy: MemoryPolicy,
    /// The unit names its own GPUs (`CUDA_VISIBLE_DEVICES`), so their readings are its own.
    pub own_gpus: bool,
    pub model_id: String,
    pub context_length: Option<u64>,
    pub smoke: Option<Smoke>,
}

impl Rules {
    pub fn new(spec: &VerifySpec, expect: &super::Expect) -> Rules {
        Rules {
            crash_window: spec.crash_window,
            load_deadline: spec.load_deadline,
            warmup_timeout: spec.warmup_timeout,
            sample_interval: spec.sample_interval,
            policy: MemoryPolicy {
                stall_timeout: spec.stall_timeout,
                ceiling_bytes: spec.memory_ceiling,
                gpu_expected_mib: spec.gpu_memory_per_gpu,
                gpu_tolerance_percent: spec.gpu_memory_tolerance,
            },
            own_gpus: expect.gpus.is_some(),
            model_id: expect.model_id.clone(),
            context_length: expect.context_length,
            smoke: spec.smoke.clone(),
        }
    }
}

/// What the probe task has seen of the server's port.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub health: Option<Health>,
    /// Since the restart, when the port first answered.
    pub opened: Option<f64>,
    /// `/v1/models`, asked once the port answers (it answers during warmup).
    pub models: Option<Result<Vec<Model>, String>>,
}

/// What systemd said when asked, judged by `crash_reason` against the state at the restart; or
/// why it could not tell.
#[derive(Debug, Clone, PartialEq)]
pub enum Systemd {
    Healthy,
    Crashed(String),
    /// It could not be asked (the error chain).
    Unreachable(String),
    /// Verification was cancelled (Ctrl-C) before or while asking; the reason to report.
    Cancelled(String),
}

/// How a step that takes a while (a sample, the final steps) ended.
#[derive(Debug, Clone)]
pub enum Took<T> {
    Done(T),
    /// The step itself failed (a remote error, as text).
    Failed(String),
    /// systemd was polled meanwhile and showed a crash or could not be asked, or verification
    /// was cancelled.
    BrokeOff(Systemd),
}

/// What the judges found in the samples so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    pub memory: Option<String>,
    pub dead_worker: Option<String>,
    pub stall: Option<String>,
}

impl Findings {
    pub fn judge(samples: &[Sample], rules: &Rules) -> Findings {
        Findings {
            memory: judge::memory_failure(samples, &rules.policy),
            dead_worker: judge::dead_worker(samples, rules.own_gpus),
            stall: judge::stall(samples, &rules.policy),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Passed {
    pub stage: &'static str,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub stage: &'static str,
    pub reason: String,
}

/// `/health` answered 200: the times for the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub load_seconds: f64,
    pub port_open_seconds: Option<f64>,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Wait a poll interval (or for a cancel), ask systemd, report with `polled`.
    Poll,
    /// Take a sample while systemd is polled meanwhile, report with `sampled`.
    Sample,
    /// Ask systemd again whether the suspected dead worker or memory drop is a crash, wait a
    /// poll interval if not, report with `confirmed`.
    Confirm,
    /// The final steps, systemd polled meanwhile: the plateau sample (report with `plateau`),
    /// then `Smoke` if asked for. A break-off is reported with `final_broke_off`.
    Plateau,
    /// The smoke completion, report with `smoke`.
    Smoke,
    /// Verified.
    Done,
    Fail(Failed),
}

/// Stages passed (in the order to record them), then what to do next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub passed: Vec<Passed>,
    pub loaded: Option<Loaded>,
    pub next: Next,
}

impl Decision {
    fn next(next: Next) -> Decision {
        Decision {
            passed: Vec::new(),
            loaded: None,
            next,
        }
    }

    fn fail(stage: &'static str, reason: String) -> Decision {
        Decision::next(Next::Fail(Failed { stage, reason }))
    }

    fn pass(&mut self, stage: &'static str, detail: String) {
        self.passed.push(Passed { stage, detail });
    }
}

/// What verification has established so far.
#[derive(Debug, Clone)]
pub struct Stages {
    rules: Rules,
    crash_passed: bool,
    identified: bool,
    ready: bool,
    /// What the probe had seen at the last poll of systemd.
    seen: Seen,
    /// When the next sample is due, since the restart.
    next_sample: Duration,
    /// The stage the current round of polling began in: a sample or a confirmation in it fails
    /// that stage, even once the crash window has passed meanwhile.
    round: &'static str,
    /// Confirmation polls of systemd done, and the failure to report if none shows a crash.
    suspect: Option<(u32, Failed)>,
}

impl Stages {
    pub fn new(rules: Rules) -> Stages {
        Stages {
            rules,
            crash_passed: false,
            identified: false,
            ready: false,
            seen: Seen::default(),
            next_sample: Duration::ZERO,
            round: "crash window",
            suspect: None,
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The stage a crash, a cancel or an unreachable systemd fails.
    fn stage(&self) -> &'static str {
        if self.crash_passed {
            "loading"
        } else {
            "crash window"
        }
    }

    /// What the live display shows.
    pub fn phase(&self) -> &'static str {
        match (self.ready, self.seen.opened) {
            (true, _) => "loaded",
            (false, Some(_)) => "warmup",
            (false, None) => self.stage(),
        }
    }

    /// A failure of `stage` on what systemd said.
    fn systemd_failed(stage: &'static str, elapsed: Duration, systemd: Systemd) -> Decision {
        let reason = match systemd {
            Systemd::Healthy => unreachable!("a healthy unit fails nothing"),
            Systemd::Crashed(crash) => format!(
                "crashed {:.1}s after the restart: {crash}",
                elapsed.as_secs_f64()
            ),
            Systemd::Unreachable(reason) | Systemd::Cancelled(reason) => reason,
        };
        Decision::fail(stage, reason)
    }

    /// systemd was polled `elapsed` after the restart, and the probe has `seen` this.
    pub fn polled(&mut self, elapsed: Duration, systemd: Systemd, seen: &Seen) -> Decision {
        self.round = self.stage();
        if systemd != Systemd::Healthy {
            return Self::systemd_failed(self.round, elapsed, systemd);
        }
        let mut d = Decision::next(Next::Poll);
        if !self.crash_passed && elapsed >= self.rules.crash_window {
            self.crash_passed = true;
            d.pass(
                "crash window",
                format!(
                    "no crash, restart or new invocation in {:?}",
                    self.rules.crash_window
                ),
            );
        }
        self.seen = seen.clone();
        if let (false, Some(models)) = (self.identified, &self.seen.models) {
            match identity(models, &self.rules.model_id, self.rules.context_length) {
                Ok(detail) => d.pass("identity", detail),
                Err(reason) => {
                    d.next = Next::Fail(Failed {
                        stage: "identity",
                        reason,
                    });
                    return d;
                }
            }
            self.identified = true;
        }
        if let (false, Some(Health::Ready(took))) = (self.ready, &self.seen.health) {
            self.ready = true;
            let now = elapsed.as_secs_f64();
            d.loaded = Some(Loaded {
                load_seconds: now,
                port_open_seconds: self.seen.opened,
            });
            let opened = self.seen.opened.unwrap_or(now);
            d.pass(
                "warmup",
                format!(
                    "the port opened after {opened:.1}s; warmup ended {:.1}s later",
                    (now - opened).max(0.0)
                ),
            );
            d.pass(
                "readiness",
                format!(
                    "/health answered 200 after {now:.1}s (the probe took {:.1}s)",
                    took.as_secs_f64()
                ),
            );
        }
        if elapsed >= self.next_sample {
            self.next_sample += self.rules.sample_interval;
            d.next = Next::Sample;
            return d;
        }
        d.next = self.deadlines(elapsed);
        d
    }

    /// The sample due after a poll ended, `elapsed` after the restart.
    pub fn sampled(&mut self, elapsed: Duration, took: Took<Findings>) -> Decision {
        let stage = self.round;
        let findings = match took {
            Took::Done(findings) => findings,
            Took::Failed(reason) => return Decision::fail("memory", reason),
            Took::BrokeOff(systemd) => return Self::systemd_failed(stage, elapsed, systemd),
        };
        let suspect = match (findings.memory, findings.dead_worker) {
            (Some(reason), _) => Some(Failed {
                stage: "memory",
                reason,
            }),
            (None, Some(reason)) => Some(Failed { stage, reason }),
            (None, None) => None,
        };
        if let Some(failed) = suspect {
            // A server that exits frees its memory and GPUs a moment before its main process
            // is gone (SGLang kills its children first): if systemd sees the exit within a
            // second, that is a crash, and is reported as one.
            self.suspect = Some((0, failed));
            return Decision::next(Next::Confirm);
        }
        if let (None, Some(reason)) = (self.seen.opened, findings.stall) {
            return Decision::fail("loading", reason);
        }
        Decision::next(self.deadlines(elapsed))
    }

    /// systemd asked again about a suspected death.
    pub fn confirmed(&mut self, elapsed: Duration, systemd: Systemd) -> Decision {
        let Some((polls, failed)) = self.suspect.take() else {
            unreachable!("confirmed without a suspect");
        };
        if systemd != Systemd::Healthy {
            return Self::systemd_failed(self.round, elapsed, systemd);
        }
        if polls + 1 < CONFIRM_POLLS {
            self.suspect = Some((polls + 1, failed));
            return Decision::next(Next::Confirm);
        }
        Decision::next(Next::Fail(failed))
    }

    /// The end of a round: the final steps once everything has passed, or a deadline.
    fn deadlines(&self, elapsed: Duration) -> Next {
        if self.ready && self.identified && self.crash_passed {
            return Next::Plateau;
        }
        let elapsed = elapsed.as_secs_f64();
        let last = self
            .seen
            .health
            .as_ref()
            .map_or("not asked yet".to_string(), describe);
        if let Some(opened) = self.seen.opened.filter(|_| !self.ready) {
            let warming = elapsed - opened;
            if warming >= self.rules.warmup_timeout.as_secs_f64() {
                let reason = format!(
                    "still warming up {warming:.0}s after the port opened (warmup timeout {:?}); last: {last}",
                    self.rules.warmup_timeout
                );
                return Next::Fail(Failed {
                    stage: "warmup",
                    reason,
                });
            }
        }
        if elapsed >= self.rules.load_deadline.as_secs_f64() {
            let reason = format!(
                "not ready after the {:?} load deadline; last: {last}",
                self.rules.load_deadline
            );
            let stage = if self.seen.opened.is_some() {
                "warmup"
            } else {
                "readiness"
            };
            return Next::Fail(Failed { stage, reason });
        }
        Next::Poll
    }

    /// The loaded server's sample: its memory plateau.
    pub fn plateau(&mut self, loaded: Result<&Sample, String>) -> Decision {
        let loaded = match loaded {
            Ok(sample) => sample,
            Err(reason) => return Decision::fail("memory", reason),
        };
        if let Some(reason) = judge::plateau_failure(loaded, &self.rules.policy) {
            return Decision::fail("memory", reason);
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
        let mut d = Decision::next(match self.rules.smoke {
            Some(_) => Next::Smoke,
            None => Next::Done,
        });
        d.pass("memory", plateau);
        d
    }

    /// What the smoke completion answered.
    pub fn smoke(&mut self, asked: Result<Answer, String>) -> Decision {
        let Some(smoke) = &self.rules.smoke else {
            unreachable!("a smoke answer without a smoke test");
        };
        let detail = match asked {
            Ok(answer) if answer.content.contains(&smoke.expect) => {
                format!("answered {:?}", answer.content)
            }
            Ok(answer)
                if answer
                    .reasoning
                    .as_deref()
                    .is_some_and(|r| r.contains(&smoke.expect)) =>
            {
                format!(
                    "the expected {:?} came in the model's thinking (reasoning_content); content {:?}",
                    smoke.expect, answer.content
                )
            }
            Ok(answer) => {
                let cut = if answer.finish_reason.as_deref() == Some("length") {
                    " (cut at max_tokens: raise verify.smoke.max_tokens)"
                } else {
                    ""
                };
                return Decision::fail(
                    "smoke",
                    format!(
                        "answered {:?}, which lacks {:?}{cut}",
                        answer.content, smoke.expect
                    ),
                );
            }
            Err(e) => return Decision::fail("smoke", e),
        };
        let mut d = Decision::next(Next::Done);
        d.pass("smoke", detail);
        d
    }

    /// The final steps broke off: systemd showed a crash or could not be asked (the loading
    /// failed after all), or verification was cancelled (during the smoke completion).
    pub fn final_broke_off(&self, elapsed: Duration, systemd: Systemd) -> Decision {
        let stage = match systemd {
            Systemd::Cancelled(_) => "smoke",
            _ => "loading",
        };
        Self::systemd_failed(stage, elapsed, systemd)
    }
}

/// `/v1/models` must name the expected model, with the expected context length: the identity
/// stage's detail, or why it fails.
fn identity(
    models: &Result<Vec<Model>, String>,
    model_id: &str,
    context_length: Option<u64>,
) -> Result<String, String> {
    let models = models.as_ref().map_err(String::clone)?;
    let Some(model) = models.iter().find(|m| m.id == model_id) else {
        let serving: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        return Err(format!(
            "/v1/models lists {serving:?}, not the expected `{model_id}`: wrong model"
        ));
    };
    if let (Some(want), Some(got)) = (context_length, model.max_model_len) {
        if want != got {
            return Err(format!(
                "max_model_len is {got}, the manifest sets context-length {want}"
            ));
        }
    }
    Ok(format!("/v1/models serves `{}`", model.id))
}

fn describe(health: &Health) -> String {
    match health {
        Health::Ready(took) => format!("/health answered 200 in {:.1}s", took.as_secs_f64()),
        Health::Warming(why) => format!("warming up ({why})"),
        Health::Closed(e) => format!("the port is not open yet ({e})"),
    }
}
