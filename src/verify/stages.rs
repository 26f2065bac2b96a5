//! The stage machine: what verification has established so far, and given the latest facts (time
//! since the restart, what systemd says, what the HTTP probe and the samples have seen), what to
//! do next. No clock, no I/O: the driver in `mod.rs` asks, does, and reports back, so every branch
//! is tested here with plain values.

use std::time::Duration;

use std::sync::Arc;

use super::judge::{self, bytes, Sample};
use super::reason::Reason;
use super::CONFIRM_POLLS;
use super::{MemoryPolicy, Stage};
use crate::manifest::{Smoke, VerifySpec};
use crate::remote::http::{Answer, ApiError};
use crate::remote::{Health, Model, RemoteError};

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
    /// A rank >= 1 of a server group (`Expect::follower`): no identity stage, no smoke.
    pub follower: bool,
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
            smoke: spec.smoke.clone().filter(|_| !expect.follower),
            follower: expect.follower,
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
    /// Shared: every poll gets a copy of what the probe task saw.
    pub models: Option<Result<Vec<Model>, Arc<ApiError>>>,
}

/// What systemd said when asked, judged by `crash_reason` against the state at the restart; or
/// why it could not tell.
#[derive(Debug)]
pub enum Systemd {
    Healthy,
    /// `crash_reason`'s verdict, in its words.
    Crashed(String),
    /// It could not be asked.
    Unreachable(RemoteError),
    /// Verification was cancelled (Ctrl-C) before or while asking; the reason to report.
    Cancelled(String),
}

/// How a step that takes a while (a sample, the final steps) ended.
#[derive(Debug)]
pub enum Took<T> {
    Done(T),
    /// The step itself failed.
    Failed(RemoteError),
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
    pub stage: Stage,
    pub detail: String,
}

#[derive(Debug)]
pub struct Failed {
    pub stage: Stage,
    pub reason: Reason,
}

/// Tests compare failures by what the report shows.
#[cfg(test)]
impl PartialEq for Failed {
    fn eq(&self, other: &Failed) -> bool {
        self.stage == other.stage && self.reason.to_string() == other.reason.to_string()
    }
}

/// `/health` answered 200: the times for the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub load_seconds: f64,
    pub port_open_seconds: Option<f64>,
}

/// What to do next.
#[derive(Debug)]
#[cfg_attr(test, derive(PartialEq))]
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
    /// The smoke completion, report with `smoke`. Only ever within the final steps, under the
    /// same polling of systemd as the plateau sample.
    Smoke,
    /// Verified.
    Done,
    Fail(Failed),
}

/// Stages passed (in the order to record them), then what to do next.
#[derive(Debug)]
#[cfg_attr(test, derive(PartialEq))]
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

    fn fail(stage: Stage, reason: Reason) -> Decision {
        Decision::next(Next::Fail(Failed { stage, reason }))
    }

    fn pass(&mut self, stage: Stage, detail: String) {
        self.passed.push(Passed { stage, detail });
    }
}

/// What verification has established so far.
#[derive(Debug)]
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
    round: Stage,
    /// Confirmation polls of systemd done, and the failure to report if none shows a crash.
    suspect: Option<(u32, Failed)>,
}

impl Stages {
    pub fn new(rules: Rules) -> Stages {
        Stages {
            // A rank >= 1 of a group has nothing to identify: rank 0 serves the model.
            identified: rules.follower,
            rules,
            crash_passed: false,
            ready: false,
            seen: Seen::default(),
            next_sample: Duration::ZERO,
            round: Stage::CrashWindow,
            suspect: None,
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The stage a crash, a cancel or an unreachable systemd fails.
    fn stage(&self) -> Stage {
        if self.crash_passed {
            Stage::Loading
        } else {
            Stage::CrashWindow
        }
    }

    /// What the live display shows during this round.
    pub fn phase(&self) -> &'static str {
        match (self.ready, self.seen.opened) {
            (true, _) => "loaded",
            (false, Some(_)) => "warmup",
            (false, None) => self.round.name(),
        }
    }

    /// A failure of `stage` on what systemd said.
    fn systemd_failed(stage: Stage, elapsed: Duration, systemd: Systemd) -> Decision {
        let reason = match systemd {
            Systemd::Healthy => unreachable!("a healthy unit fails nothing"),
            Systemd::Crashed(crash) => Reason::Crashed {
                after: elapsed,
                crash,
            },
            Systemd::Unreachable(e) => Reason::Unreachable(e),
            Systemd::Cancelled(why) => Reason::Cancelled(why),
        };
        Decision::fail(stage, reason)
    }

    /// systemd was polled `elapsed` after the restart, and the probe has `seen` this.
    pub fn polled(&mut self, elapsed: Duration, systemd: Systemd, seen: &Seen) -> Decision {
        self.round = self.stage();
        if !matches!(systemd, Systemd::Healthy) {
            return Self::systemd_failed(self.round, elapsed, systemd);
        }
        let mut d = Decision::next(Next::Poll);
        if !self.crash_passed && elapsed >= self.rules.crash_window {
            self.crash_passed = true;
            d.pass(
                Stage::CrashWindow,
                format!(
                    "no crash, restart or new invocation in {:?}",
                    self.rules.crash_window
                ),
            );
        }
        self.seen = seen.clone();
        if let (false, Some(models)) = (self.identified, &self.seen.models) {
            match identity(models, &self.rules.model_id, self.rules.context_length) {
                Ok(detail) => d.pass(Stage::Identity, detail),
                Err(reason) => {
                    d.next = Next::Fail(Failed {
                        stage: Stage::Identity,
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
            if self.rules.follower {
                // SGLang opens a rank >= 1's dummy health server only once its schedulers
                // joined the group and loaded (engine.py, `_launch_subprocesses`): no warmup.
                d.pass(
                    Stage::Readiness,
                    format!("the rank joined its group and loaded: its health port answered 200 after {now:.1}s (a rank >= 1 serves no API)"),
                );
                return self.after_ready(elapsed, d);
            }
            d.pass(
                Stage::Warmup,
                format!(
                    "the port opened after {opened:.1}s; warmup ended {:.1}s later",
                    (now - opened).max(0.0)
                ),
            );
            d.pass(
                Stage::Readiness,
                format!(
                    "/health answered 200 after {now:.1}s (the probe took {:.1}s)",
                    took.as_secs_f64()
                ),
            );
        }
        self.after_ready(elapsed, d)
    }

    /// The rest of a poll: a sample when one is due, else what the deadlines say.
    fn after_ready(&mut self, elapsed: Duration, mut d: Decision) -> Decision {
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
            Took::Failed(e) => return Decision::fail(Stage::Memory, Reason::Sample(e)),
            Took::BrokeOff(systemd) => return Self::systemd_failed(stage, elapsed, systemd),
        };
        let suspect = match (findings.memory, findings.dead_worker) {
            (Some(reason), _) => Some(Failed {
                stage: Stage::Memory,
                reason: Reason::Judged(reason),
            }),
            (None, Some(reason)) => Some(Failed {
                stage,
                reason: Reason::Judged(reason),
            }),
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
            return Decision::fail(Stage::Loading, Reason::Judged(reason));
        }
        Decision::next(self.deadlines(elapsed))
    }

    /// systemd asked again about a suspected death.
    pub fn confirmed(&mut self, elapsed: Duration, systemd: Systemd) -> Decision {
        let Some((polls, failed)) = self.suspect.take() else {
            unreachable!("confirmed without a suspect");
        };
        if !matches!(systemd, Systemd::Healthy) {
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
                let reason = Reason::WarmupTimeout {
                    warming,
                    timeout: self.rules.warmup_timeout,
                    last,
                };
                return Next::Fail(Failed {
                    stage: Stage::Warmup,
                    reason,
                });
            }
        }
        // A server ready and identified has met the load deadline: what is left is the crash
        // window, which the next poll of systemd settles (a verifier held up past the deadline
        // under load, its last poll before the window's end, is no failure of the server's).
        if elapsed >= self.rules.load_deadline.as_secs_f64() && !(self.ready && self.identified) {
            let reason = Reason::LoadDeadline {
                deadline: self.rules.load_deadline,
                last,
            };
            let stage = if self.seen.opened.is_some() {
                Stage::Warmup
            } else {
                Stage::Readiness
            };
            return Next::Fail(Failed { stage, reason });
        }
        Next::Poll
    }

    /// The loaded server's sample: its memory plateau.
    pub fn plateau(&mut self, loaded: Result<&Sample, RemoteError>) -> Decision {
        let loaded = match loaded {
            Ok(sample) => sample,
            Err(e) => return Decision::fail(Stage::Memory, Reason::Sample(e)),
        };
        if let Some(reason) = judge::plateau_failure(loaded, &self.rules.policy) {
            return Decision::fail(Stage::Memory, Reason::Judged(reason));
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
        d.pass(Stage::Memory, plateau);
        d
    }

    /// What the smoke completion answered.
    pub fn smoke(&mut self, asked: Result<Answer, ApiError>) -> Decision {
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
                let reason = Reason::SmokeLacks {
                    cut: answer.finish_reason.as_deref() == Some("length"),
                    content: answer.content,
                    expect: smoke.expect.clone(),
                };
                return Decision::fail(Stage::Smoke, reason);
            }
            Err(e) => return Decision::fail(Stage::Smoke, Reason::Smoke(e)),
        };
        let mut d = Decision::next(Next::Done);
        d.pass(Stage::Smoke, detail);
        d
    }

    /// The final steps broke off: systemd showed a crash or could not be asked (the loading
    /// failed after all), or verification was cancelled (during the smoke completion).
    pub fn final_broke_off(&self, elapsed: Duration, systemd: Systemd) -> Decision {
        let stage = match systemd {
            Systemd::Cancelled(_) => Stage::Smoke,
            _ => Stage::Loading,
        };
        Self::systemd_failed(stage, elapsed, systemd)
    }
}

/// `/v1/models` must name the expected model, with the expected context length: the identity
/// stage's detail, or why it fails.
fn identity(
    models: &Result<Vec<Model>, Arc<ApiError>>,
    model_id: &str,
    context_length: Option<u64>,
) -> Result<String, Reason> {
    let models = models.as_ref().map_err(|e| Reason::Models(e.clone()))?;
    let Some(model) = models.iter().find(|m| m.id == model_id) else {
        return Err(Reason::WrongModel {
            serving: models.iter().map(|m| m.id.clone()).collect(),
            expected: model_id.to_string(),
        });
    };
    if let (Some(want), Some(got)) = (context_length, model.max_model_len) {
        if want != got {
            return Err(Reason::ContextLength { got, want });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            crash_window: Duration::from_secs(10),
            load_deadline: Duration::from_secs(600),
            warmup_timeout: Duration::from_secs(60),
            sample_interval: Duration::from_secs(1),
            policy: MemoryPolicy {
                stall_timeout: Duration::from_secs(30),
                ceiling_bytes: None,
                gpu_expected_mib: None,
                gpu_tolerance_percent: 10.0,
            },
            own_gpus: true,
            model_id: "qwen".into(),
            context_length: Some(1000),
            smoke: Some(Smoke {
                prompt: "The capital of France?".into(),
                expect: "Paris".into(),
                max_tokens: None,
            }),
            follower: false,
        }
    }

    fn at(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    fn closed() -> Seen {
        Seen {
            health: Some(Health::Closed("connection refused".into())),
            ..Seen::default()
        }
    }

    fn serving(id: &str, max_model_len: u64) -> Option<Result<Vec<Model>, Arc<ApiError>>> {
        Some(Ok(vec![Model {
            id: id.into(),
            max_model_len: Some(max_model_len),
        }]))
    }

    fn warming(opened: f64) -> Seen {
        Seen {
            health: Some(Health::Warming("/ready answered 503".into())),
            opened: Some(opened),
            models: serving("qwen", 1000),
        }
    }

    fn ready(opened: f64) -> Seen {
        Seen {
            health: Some(Health::Ready(Duration::from_millis(1500))),
            ..warming(opened)
        }
    }

    /// The stage named `name` in reports.
    fn named(name: &str) -> Stage {
        Stage::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .expect("a stage of that name")
    }

    /// A failure of the stage named `name`, its reason reading `reason` in the report.
    fn fail(stage: &str, reason: &str) -> Next {
        Next::Fail(Failed {
            stage: named(stage),
            reason: Reason::Judged(reason.into()),
        })
    }

    /// The connection to the host broke.
    fn gone() -> RemoteError {
        RemoteError::Transport {
            host: "gpu1".into(),
            command: "systemctl show".into(),
            source: "broken pipe".into(),
        }
    }

    const GONE: &str = "gpu1: `systemctl show` could not run: broken pipe";

    fn names(d: &Decision) -> Vec<&'static str> {
        d.passed.iter().map(|p| p.stage.name()).collect()
    }

    fn crashed() -> Systemd {
        Systemd::Crashed("it is failed (failed) with result exit-code and exit status 1".into())
    }

    /// A poll at `t` with nothing amiss, and its sample when one is due.
    fn round(s: &mut Stages, t: f64, seen: &Seen) -> Next {
        match s.polled(at(t), Systemd::Healthy, seen).next {
            Next::Sample => s.sampled(at(t), Took::Done(Findings::default())).next,
            next => next,
        }
    }

    /// Past the crash window with its sample taken, port closed: polling "loading".
    fn loading() -> Stages {
        let mut s = Stages::new(rules());
        assert_eq!(
            s.polled(at(0.0), Systemd::Healthy, &closed()).next,
            Next::Sample
        );
        s.sampled(at(0.1), Took::Done(Findings::default()));
        let d = s.polled(at(10.0), Systemd::Healthy, &closed());
        assert_eq!(names(&d), ["crash window"]);
        assert_eq!(d.next, Next::Sample);
        assert_eq!(
            s.sampled(at(10.1), Took::Done(Findings::default())).next,
            Next::Poll
        );
        s
    }

    #[test]
    fn a_server_ready_before_the_load_deadline_is_not_failed_by_a_late_sample() {
        // Crash window 15 s, load deadline 20 s (the guard tests'): ready at 3 s, then the
        // verifier is held up under load and its next sample comes at 30 s, before any poll
        // past the crash window. Not a load-deadline failure: the next poll settles the window.
        let mut s = Stages::new(Rules {
            crash_window: Duration::from_secs(15),
            load_deadline: Duration::from_secs(20),
            ..rules()
        });
        round(&mut s, 0.0, &closed());
        let d = s.polled(at(3.0), Systemd::Healthy, &ready(2.8));
        assert!(d.next != Next::Plateau, "the crash window has not passed");
        let late = s.sampled(at(30.0), Took::Done(Findings::default()));
        assert!(
            !matches!(late.next, Next::Fail(_)),
            "failed a server ready at 3 s: {late:?}"
        );
        let d = s.polled(at(30.1), Systemd::Healthy, &ready(2.8));
        assert_eq!(names(&d), ["crash window"]);
        let next = match d.next {
            Next::Sample => s.sampled(at(30.1), Took::Done(Findings::default())).next,
            next => next,
        };
        assert_eq!(next, Next::Plateau);
    }

    #[test]
    fn a_rank_that_serves_no_api_is_ready_when_its_health_port_answers_without_identity() {
        // A rank >= 1 of a group: no /v1/models (its port is SGLang's dummy health server).
        let follower = Rules {
            follower: true,
            smoke: None,
            ..rules()
        };
        let mut s = Stages::new(follower);
        round(&mut s, 0.0, &closed());
        let d = s.polled(at(10.0), Systemd::Healthy, &closed());
        assert_eq!(names(&d), ["crash window"]);
        s.sampled(at(10.0), Took::Done(Findings::default()));
        let health = Seen {
            health: Some(Health::Ready(Duration::from_millis(3))),
            opened: Some(11.0),
            models: None,
        };
        let d = s.polled(at(11.0), Systemd::Healthy, &health);
        assert_eq!(names(&d), ["readiness"], "no identity, no warmup");
        assert!(
            d.passed[0].detail.contains("serves no API"),
            "{:?}",
            d.passed
        );
        assert_eq!(d.loaded.map(|l| l.load_seconds), Some(11.0));
        // A rank that dies still fails at once, as any server.
        let mut s = Stages::new(Rules {
            follower: true,
            ..rules()
        });
        assert_eq!(
            s.polled(at(1.0), crashed(), &closed()).next,
            fail(
                "crash window",
                "crashed 1.0s after the restart: it is failed (failed) with result exit-code and exit status 1"
            )
        );
    }

    #[test]
    fn a_crash_inside_the_window_fails_it() {
        let mut s = Stages::new(rules());
        let d = s.polled(at(2.04), crashed(), &closed());
        assert_eq!(d.passed, []);
        assert_eq!(
            d.next,
            fail(
                "crash window",
                "crashed 2.0s after the restart: it is failed (failed) with result exit-code and exit status 1"
            )
        );
    }

    #[test]
    fn a_crash_after_the_window_fails_loading() {
        let mut s = loading();
        let d = s.polled(at(42.0), crashed(), &closed());
        assert_eq!(
            d.next,
            fail(
                "loading",
                "crashed 42.0s after the restart: it is failed (failed) with result exit-code and exit status 1"
            )
        );
    }

    #[test]
    fn the_crash_window_passes_once_and_its_round_still_fails_it() {
        let mut s = Stages::new(rules());
        s.polled(at(0.0), Systemd::Healthy, &closed());
        s.sampled(at(0.1), Took::Done(Findings::default()));
        assert_eq!(s.phase(), "crash window");
        let d = s.polled(at(9.9), Systemd::Healthy, &closed());
        assert_eq!(d.passed, []);
        let d = s.polled(at(10.0), Systemd::Healthy, &closed());
        assert_eq!(
            d.passed,
            [Passed {
                stage: named("crash window"),
                detail: "no crash, restart or new invocation in 10s".into()
            }]
        );
        // The sample of the round in which the window passed still belongs to it.
        assert_eq!(s.phase(), "crash window");
        let d = s.sampled(at(10.3), Took::BrokeOff(crashed()));
        assert!(
            matches!(&d.next, Next::Fail(f) if f.stage.name() == "crash window" && f.reason.to_string().starts_with("crashed 10.3s")),
            "{d:?}"
        );
        let d = s.polled(at(10.5), Systemd::Healthy, &closed());
        assert_eq!(d.passed, [], "passed once");
        assert_eq!(s.phase(), "loading");
    }

    #[test]
    fn systemd_unreachable_or_a_cancel_fails_the_current_stage_as_told() {
        let told = [
            (Stages::new(rules()), 1.0, Systemd::Unreachable(gone())),
            (
                loading(),
                11.0,
                Systemd::Cancelled("interrupted (SIGINT)".into()),
            ),
        ];
        let failed = [
            fail("crash window", GONE),
            fail("loading", "interrupted (SIGINT)"),
        ];
        for ((mut s, polled, systemd), failed) in told.into_iter().zip(failed) {
            assert_eq!(s.polled(at(polled), systemd, &closed()).next, failed);
        }
        let mut s = loading();
        s.polled(at(11.0), Systemd::Healthy, &closed());
        let d = s.sampled(
            at(11.2),
            Took::BrokeOff(Systemd::Cancelled("interrupted (cancelled)".into())),
        );
        assert_eq!(d.next, fail("loading", "interrupted (cancelled)"));
    }

    #[test]
    fn samples_are_due_every_sample_interval() {
        let mut s = Stages::new(rules());
        let due: Vec<bool> = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 2.5, 2.75, 3.0]
            .into_iter()
            .map(|t| {
                let next = s.polled(at(t), Systemd::Healthy, &closed()).next;
                if next == Next::Sample {
                    s.sampled(at(t), Took::Done(Findings::default()));
                }
                next == Next::Sample
            })
            .collect();
        assert_eq!(
            due,
            [true, false, false, false, true, false, true, false, true]
        );
    }

    #[test]
    fn a_failed_sample_fails_memory() {
        let mut s = loading();
        s.polled(at(11.0), Systemd::Healthy, &closed());
        let d = s.sampled(at(11.1), Took::Failed(gone()));
        assert_eq!(d.next, fail("memory", GONE));
    }

    #[test]
    fn a_stall_is_judged_only_while_the_port_is_closed() {
        let stalled = || Findings {
            stall: Some("no progress for 30s while loading: no new journal lines".into()),
            ..Findings::default()
        };
        let mut s = loading();
        s.polled(at(40.0), Systemd::Healthy, &closed());
        assert_eq!(
            s.sampled(at(40.1), Took::Done(stalled())).next,
            fail(
                "loading",
                "no progress for 30s while loading: no new journal lines"
            )
        );
        let mut s = loading();
        s.polled(at(40.0), Systemd::Healthy, &warming(39.0));
        assert_eq!(s.sampled(at(40.1), Took::Done(stalled())).next, Next::Poll);
    }

    /// Loading, with a dead worker found at 20.1s: asked to confirm it.
    fn dead_worker_found() -> Stages {
        let mut s = loading();
        s.polled(at(20.0), Systemd::Healthy, &closed());
        let dead = Findings {
            dead_worker: Some("a worker process died: 3 of 4".into()),
            ..Findings::default()
        };
        assert_eq!(s.sampled(at(20.1), Took::Done(dead)).next, Next::Confirm);
        s
    }

    #[test]
    fn a_dead_worker_that_systemd_then_sees_exit_is_a_crash() {
        let mut s = dead_worker_found();
        assert_eq!(s.confirmed(at(20.2), Systemd::Healthy).next, Next::Confirm);
        let d = s.confirmed(at(20.5), crashed());
        assert!(
            matches!(&d.next, Next::Fail(f) if f.stage.name() == "loading" && f.reason.to_string().starts_with("crashed 20.5s after the restart: it is failed")),
            "{d:?}"
        );
    }

    #[test]
    fn a_dead_worker_is_reported_after_confirm_polls_without_a_crash() {
        let mut s = dead_worker_found();
        let nexts: Vec<Next> = (0..CONFIRM_POLLS)
            .map(|i| {
                s.confirmed(at(20.1 + 0.25 * i as f64), Systemd::Healthy)
                    .next
            })
            .collect();
        let mut want: Vec<Next> = (1..CONFIRM_POLLS).map(|_| Next::Confirm).collect();
        want.push(fail("loading", "a worker process died: 3 of 4"));
        assert_eq!(nexts, want);
    }

    #[test]
    fn a_memory_failure_outranks_a_dead_worker_and_is_confirmed_too() {
        let mut s = Stages::new(rules());
        s.polled(at(0.0), Systemd::Healthy, &closed());
        let both = Findings {
            memory: Some("service memory dropped from 2.0 GiB to 10 MiB".into()),
            dead_worker: Some("a worker process died".into()),
            stall: Some("stalled".into()),
        };
        assert_eq!(s.sampled(at(0.1), Took::Done(both)).next, Next::Confirm);
        for _ in 1..CONFIRM_POLLS {
            assert_eq!(s.confirmed(at(0.5), Systemd::Healthy).next, Next::Confirm);
        }
        assert_eq!(
            s.confirmed(at(1.1), Systemd::Healthy).next,
            fail("memory", "service memory dropped from 2.0 GiB to 10 MiB")
        );
        // Within the crash window, a dead worker fails that stage.
        let mut s = Stages::new(rules());
        s.polled(at(0.0), Systemd::Healthy, &closed());
        let dead = Findings {
            dead_worker: Some("a worker process died".into()),
            ..Findings::default()
        };
        s.sampled(at(0.1), Took::Done(dead));
        for _ in 1..CONFIRM_POLLS {
            s.confirmed(at(0.5), Systemd::Healthy);
        }
        assert_eq!(
            s.confirmed(at(1.1), Systemd::Healthy).next,
            fail("crash window", "a worker process died")
        );
    }

    #[test]
    fn identity_is_checked_during_warmup() {
        let mut s = Stages::new(rules());
        let wrong = Seen {
            models: serving("llama", 1000),
            ..warming(3.0)
        };
        assert_eq!(
            s.polled(at(3.0), Systemd::Healthy, &wrong).next,
            fail(
                "identity",
                "/v1/models lists [\"llama\"], not the expected `qwen`: wrong model"
            )
        );
        let mut s = loading();
        let short = Seen {
            models: serving("qwen", 512),
            ..warming(11.0)
        };
        let d = s.polled(at(12.0), Systemd::Healthy, &short);
        assert_eq!(
            d.next,
            fail(
                "identity",
                "max_model_len is 512, the manifest sets context-length 1000"
            )
        );
        let mut s = loading();
        let broken = Seen {
            models: Some(Err(Arc::new(ApiError::Status {
                path: "/v1/models".into(),
                status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            }))),
            ..warming(11.0)
        };
        let d = s.polled(at(12.0), Systemd::Healthy, &broken);
        assert_eq!(
            d.next,
            fail("identity", "/v1/models answered 500 Internal Server Error")
        );
        // Passed once, while still warming up.
        let mut s = loading();
        let d = s.polled(at(12.0), Systemd::Healthy, &warming(11.0));
        assert_eq!(
            d.passed,
            [Passed {
                stage: named("identity"),
                detail: "/v1/models serves `qwen`".into()
            }]
        );
        assert_eq!(s.phase(), "warmup");
        assert_eq!(
            names(&s.polled(at(12.25), Systemd::Healthy, &warming(11.0))),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn warmup_has_its_own_timeout() {
        let mut s = loading();
        assert_eq!(round(&mut s, 70.75, &warming(11.0)), Next::Poll);
        assert_eq!(
            round(&mut s, 71.0, &warming(11.0)),
            fail(
                "warmup",
                "still warming up 60s after the port opened (warmup timeout 60s); last: warming up (/ready answered 503)"
            )
        );
    }

    #[test]
    fn the_load_deadline_fails_readiness_while_closed_and_warmup_once_open() {
        let mut s = loading();
        let d = s.polled(at(600.0), Systemd::Healthy, &closed());
        assert_eq!(d.next, Next::Sample);
        assert_eq!(
            s.sampled(at(600.1), Took::Done(Findings::default())).next,
            fail(
                "readiness",
                "not ready after the 600s load deadline; last: the port is not open yet (connection refused)"
            )
        );
        let mut s = Stages::new(Rules {
            warmup_timeout: Duration::from_secs(3600),
            ..rules()
        });
        s.polled(at(0.0), Systemd::Healthy, &Seen::default());
        assert_eq!(
            s.sampled(at(0.1), Took::Done(Findings::default())).next,
            Next::Poll
        );
        s.polled(at(10.0), Systemd::Healthy, &warming(5.0));
        let d = s.sampled(at(600.0), Took::Done(Findings::default()));
        assert_eq!(
            d.next,
            fail(
                "warmup",
                "not ready after the 600s load deadline; last: warming up (/ready answered 503)"
            )
        );
        let mut s = Stages::new(rules());
        s.polled(at(0.0), Systemd::Healthy, &Seen::default());
        assert_eq!(
            s.sampled(at(601.0), Took::Done(Findings::default())).next,
            fail(
                "readiness",
                "not ready after the 600s load deadline; last: not asked yet"
            )
        );
    }

    #[test]
    fn the_happy_path_passes_every_stage_in_order() {
        let mut s = Stages::new(rules());
        let mut order = Vec::new();
        let mut loaded = None;
        let mut step = |d: Decision, order: &mut Vec<&'static str>| {
            order.extend(names(&d));
            loaded = loaded.clone().or(d.loaded.clone());
            d.next
        };
        // Each poll and the sample after it. The port opens before the crash window passes:
        // identity first, then the window.
        for (polled, sampled, seen) in [
            (0.0, 0.1, closed()),
            (8.0, 8.1, warming(7.5)),
            (10.0, 10.1, warming(7.5)),
        ] {
            assert_eq!(
                step(s.polled(at(polled), Systemd::Healthy, &seen), &mut order),
                Next::Sample
            );
            assert_eq!(
                step(
                    s.sampled(at(sampled), Took::Done(Findings::default())),
                    &mut order
                ),
                Next::Poll
            );
        }
        let d = s.polled(at(20.0), Systemd::Healthy, &ready(7.5));
        assert_eq!(
            d.passed,
            [
                Passed {
                    stage: named("warmup"),
                    detail: "the port opened after 7.5s; warmup ended 12.5s later".into()
                },
                Passed {
                    stage: named("readiness"),
                    detail: "/health answered 200 after 20.0s (the probe took 1.5s)".into()
                }
            ]
        );
        assert_eq!(step(d, &mut order), Next::Sample);
        assert_eq!(s.phase(), "loaded");
        assert_eq!(
            step(
                s.sampled(at(20.1), Took::Done(Findings::default())),
                &mut order
            ),
            Next::Plateau
        );
        let plateau = Sample {
            service_bytes: Some(3 << 30),
            gpu_mib: vec![70000, 70000],
            ..Sample::default()
        };
        let d = s.plateau(Ok(&plateau));
        assert_eq!(
            d.passed[0].detail,
            "plateau: service 3.0 GiB, GPUs [70000, 70000] MiB"
        );
        assert_eq!(step(d, &mut order), Next::Smoke);
        let answer = Answer {
            content: "Paris.".into(),
            reasoning: None,
            finish_reason: Some("stop".into()),
        };
        let d = s.smoke(Ok(answer));
        assert_eq!(d.passed[0].detail, "answered \"Paris.\"");
        assert_eq!(step(d, &mut order), Next::Done);
        assert_eq!(
            order,
            [
                "identity",
                "crash window",
                "warmup",
                "readiness",
                "memory",
                "smoke"
            ]
        );
        assert_eq!(
            loaded,
            Some(Loaded {
                load_seconds: 20.0,
                port_open_seconds: Some(7.5)
            })
        );
    }

    #[test]
    fn ready_in_the_crash_window_waits_for_it_to_pass() {
        let mut s = Stages::new(rules());
        s.polled(at(0.0), Systemd::Healthy, &ready(0.0));
        assert_eq!(
            s.sampled(at(0.1), Took::Done(Findings::default())).next,
            Next::Poll
        );
        let d = s.polled(at(10.0), Systemd::Healthy, &ready(0.0));
        assert_eq!(names(&d), ["crash window"]);
        assert_eq!(d.next, Next::Sample);
    }

    #[test]
    fn the_plateau_and_the_smoke_can_fail() {
        let mut s = Stages::new(Rules {
            policy: MemoryPolicy {
                gpu_expected_mib: Some(75000),
                ..rules().policy
            },
            smoke: None,
            ..rules()
        });
        let wrong_tp = Sample {
            gpu_mib: vec![37000],
            ..Sample::default()
        };
        assert!(
            matches!(s.plateau(Ok(&wrong_tp)).next, Next::Fail(f) if f.stage.name() == "memory" && f.reason.to_string().contains("wrong tp"))
        );
        assert_eq!(s.plateau(Err(gone())).next, fail("memory", GONE));
        let right = Sample {
            gpu_mib: vec![75500],
            ..Sample::default()
        };
        let d = s.plateau(Ok(&right));
        assert_eq!(d.passed[0].detail, "plateau: service ?, GPUs [75500] MiB");
        assert_eq!(d.next, Next::Done, "no smoke asked for");

        let mut s = Stages::new(rules());
        let answer = |content: &str, reasoning: Option<&str>, finish: &str| {
            Ok(Answer {
                content: content.into(),
                reasoning: reasoning.map(str::to_string),
                finish_reason: Some(finish.into()),
            })
        };
        assert_eq!(
            s.smoke(answer("Lyon", None, "stop")).next,
            fail("smoke", "answered \"Lyon\", which lacks \"Paris\"")
        );
        assert_eq!(
            s.smoke(answer("Let me", None, "length")).next,
            fail(
                "smoke",
                "answered \"Let me\", which lacks \"Paris\" (cut at max_tokens: raise verify.smoke.max_tokens)"
            )
        );
        let d = s.smoke(answer("", Some("It is Paris"), "stop"));
        assert_eq!(
            d.passed[0].detail,
            "the expected \"Paris\" came in the model's thinking (reasoning_content); content \"\""
        );
        assert_eq!(
            s.smoke(Err(ApiError::Refused {
                what: "chat completion".into(),
                status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
                start: "{}".into(),
            }))
            .next,
            fail(
                "smoke",
                "chat completion answered 500 Internal Server Error: {}"
            )
        );
    }

    #[test]
    fn the_final_steps_break_off_as_loading_or_smoke() {
        let s = Stages::new(rules());
        assert!(matches!(
            s.final_broke_off(at(30.0), crashed()).next,
            Next::Fail(f) if f.stage.name() == "loading" && f.reason.to_string().starts_with("crashed 30.0s after the restart")
        ));
        assert_eq!(
            s.final_broke_off(at(30.0), Systemd::Unreachable(gone()))
                .next,
            fail("loading", GONE)
        );
        assert_eq!(
            s.final_broke_off(at(30.0), Systemd::Cancelled("interrupted (SIGTERM)".into()))
                .next,
            fail("smoke", "interrupted (SIGTERM)")
        );
    }
}
