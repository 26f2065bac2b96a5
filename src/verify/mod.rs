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
//! The judges are pure (`reconcile_core::verify::judge`), and so is the stage machine (`stages`):
//! given the time since the restart and what systemd, the samples and the HTTP probe have shown,
//! it says which stages passed or failed and what to do next. This file is the driver that owns
//! the clock and does what the machine asks through `Probes` (`probes`: systemd, the samples, the
//! HTTP port, the smoke completion). Probes of the HTTP port run in a task of their own, one at a
//! time, so a slow `/health` never delays the crash polling; systemd is polled while a sample or
//! the smoke completion waits on a slow host.

mod probes;
mod progress;
mod reason;
mod stages;

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use progress::Progress;
pub use reason::Reason;
pub use reconcile_core::verify::judge::{
    self, bytes, crash_reason, sparkline, MemoryPolicy, Sample,
};
pub use reconcile_core::verify::Stage;

use crate::flags::flags;
use crate::manifest::VerifySpec;
use crate::observed::UnitState;
use crate::remote::{Endpoint, Host, RemoteError};
use crate::sglang::human_readable_int_value;
use crate::systemd::Systemd as _;
use crate::unit::UnitModel;
use probes::{HostProbes, Probes, Sampled};
use stages::{Decision, Findings, Next, Rules, Stages, Systemd, Took};

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
    /// A rank >= 1 of a server over several hosts (`--node-rank`): it serves no API. sglang
    /// 0.5.23 `entrypoints/engine.py`, `_launch_subprocesses`: "Non-zero-rank nodes do not run
    /// tokenizer processes"; once its schedulers are ready it opens only
    /// `launch_dummy_health_check_server` (`utils/common.py`: `/health` 200, no `/v1/models`).
    /// Its port opening is the sign its schedulers joined the group and loaded; identity and the
    /// smoke completion are rank 0's.
    pub follower: bool,
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
            follower: flags
                .get("node-rank")
                .and_then(|r| r.parse::<u32>().ok())
                .is_some_and(|r| r >= 1),
        }
    }
}

/// One stage's result.
#[derive(Debug, Clone, Serialize)]
pub struct StageResult {
    pub name: Stage,
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
    pub stages: Vec<StageResult>,
    pub samples: Vec<Sample>,
    /// Seconds from the restart to `/health` answering 200.
    pub load_seconds: Option<f64>,
    /// Seconds from the restart to the port answering (the start of warmup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_open_seconds: Option<f64>,
    /// The last sample once loaded.
    pub plateau: Option<Sample>,
    pub notes: Vec<String>,
    /// The unit's last good loads, from its deployment history, when it has any: compared with
    /// in the live display and the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_loads: Option<reconcile_core::learned::LoadHistory>,
}

impl Verification {
    /// A stage run after verification (the benchmark, quality), begun at `started`: its seconds
    /// count from the restart, as the earlier stages' do.
    pub fn push_after(
        &mut self,
        name: Stage,
        passed: bool,
        started: std::time::Instant,
        detail: &str,
    ) {
        let since_restart = self.stages.last().map_or(0.0, |s| s.seconds);
        self.stages.push(StageResult {
            name,
            passed,
            seconds: since_restart + started.elapsed().as_secs_f64(),
            at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            detail: detail.to_string(),
        });
    }

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
    pub stage: Stage,
    pub reason: Reason,
    /// Boxed: a `Failure` is the error of every verification's `Result`, kept small to move.
    pub verification: Box<Verification>,
}

/// Verifies a unit systemd has just (re)started. `cancel` being cancelled (Ctrl-C, a group's
/// failed rank) fails it.
pub async fn verify(
    host: &dyn Host,
    unit: &str,
    spec: &VerifySpec,
    expect: &Expect,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Verification, Failure> {
    let mut run = Run {
        started: Instant::now(),
        record: Verification::default(),
        progress,
    };
    let first = run.remote(Stage::CrashWindow, host.unit_state(unit).await)?;
    let server = run.remote(
        Stage::Readiness,
        host.server(&expect.endpoint, spec.url.as_deref()).await,
    )?;
    let every = spec
        .sample_interval
        .clamp(POLL_INTERVAL, Duration::from_secs(2));
    let probes = HostProbes::new(host, unit, expect, server, run.started, every);
    Driver {
        probes: &probes,
        run,
        stages: Stages::new(Rules::new(spec, expect)),
        now: first.clone(),
        first,
        cancel: cancel.clone(),
    }
    .run()
    .await
}

/// Does what the stage machine asks, and tells it what came of it.
struct Driver<'a, P> {
    probes: &'a P,
    run: Run<'a>,
    stages: Stages,
    /// systemd's view at the restart, and at the last poll.
    first: UnitState,
    now: UnitState,
    cancel: CancellationToken,
}

impl<P: Probes> Driver<'_, P> {
    async fn run(mut self) -> Result<Verification, Failure> {
        let mut decision = self.poll().await;
        loop {
            decision = match self.run.apply(decision) {
                Next::Poll => {
                    let slept = tokio::time::sleep(POLL_INTERVAL);
                    self.cancel.run_until_cancelled(slept).await;
                    self.poll().await
                }
                Next::Sample => self.sample().await,
                Next::Confirm => self.confirm().await,
                Next::Smoke => unreachable!("the smoke completion runs within the final steps"),
                Next::Plateau => {
                    let finished = race(
                        final_steps(
                            self.probes,
                            &mut self.run,
                            &mut self.stages,
                            &self.first,
                            &self.now,
                        ),
                        self.probes,
                        &self.first,
                        &self.cancel,
                    )
                    .await;
                    finished.unwrap_or_else(|broke| {
                        self.stages.final_broke_off(self.run.since(), broke)
                    })
                }
                Next::Done => return Ok(std::mem::take(&mut self.run.record)),
                Next::Fail(f) => return Err(self.run.fail(f.stage, f.reason)),
            }
        }
    }

    /// Asks systemd, unless cancelled first or meanwhile.
    async fn poll(&mut self) -> Decision {
        let asked = if self.cancel.is_cancelled() {
            None
        } else {
            self.cancel
                .run_until_cancelled(self.probes.unit_state())
                .await
        };
        let systemd = match asked {
            None => Systemd::Cancelled(crate::signals::interrupted()),
            Some(asked) => {
                let (systemd, state) = judged(&self.first, asked);
                if let Some(state) = state {
                    self.now = state;
                }
                systemd
            }
        };
        let seen = self.probes.seen();
        self.stages.polled(self.run.since(), systemd, &seen)
    }

    /// One more look at systemd about a suspected death, then a poll interval unless it showed
    /// the crash: a worker's death takes its main process down within a second or two.
    async fn confirm(&mut self) -> Decision {
        let systemd = judged(&self.first, self.probes.unit_state().await).0;
        if matches!(systemd, Systemd::Healthy) {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        self.stages.confirmed(self.run.since(), systemd)
    }

    /// A sample can wait on a slow host (a hung nvidia-smi, up to the command timeout): systemd
    /// is still polled meanwhile, so a crash is not reported late.
    async fn sample(&mut self) -> Decision {
        let sampled = race(
            take_sample(self.probes, &mut self.run, &self.first, &self.now),
            self.probes,
            &self.first,
            &self.cancel,
        )
        .await;
        let took = match sampled {
            Err(broke) => Took::BrokeOff(broke),
            Ok(Err(e)) => Took::Failed(e),
            Ok(Ok(sample)) => {
                self.probes.listening(sample.listening);
                let (phase, run) = (self.stages.phase(), &self.run);
                run.progress
                    .update(phase, run.elapsed(), &sample, &run.record);
                Took::Done(Findings::judge(&run.record.samples, self.stages.rules()))
            }
        };
        self.stages.sampled(self.run.since(), took)
    }
}

/// The plateau sample, then the smoke completion when asked for: the last decision.
async fn final_steps<P: Probes>(
    probes: &P,
    run: &mut Run<'_>,
    stages: &mut Stages,
    first: &UnitState,
    now: &UnitState,
) -> Decision {
    let (decision, loaded) = match take_sample(probes, run, first, now).await {
        Ok(sample) => (stages.plateau(Ok(&sample)), Some(sample)),
        Err(e) => (stages.plateau(Err(e)), None),
    };
    if !matches!(decision.next, Next::Fail(_)) {
        run.record.plateau = loaded;
    }
    if !matches!(decision.next, Next::Smoke) {
        return decision;
    }
    // The memory stage is recorded as it passes, before the smoke completion takes its time.
    run.apply(decision);
    let smoke = stages.rules().smoke.clone().expect("a smoke test to run");
    stages.smoke(probes.smoke(&smoke).await)
}

/// One sample, stamped with the time and recorded with its notes.
async fn take_sample<P: Probes>(
    probes: &P,
    run: &mut Run<'_>,
    first: &UnitState,
    now: &UnitState,
) -> Result<Sample, RemoteError> {
    let Sampled { notes, sample } = probes.sample(first, now).await;
    for note in notes {
        run.note(note);
    }
    let mut sample = sample?;
    sample.seconds = run.elapsed();
    run.record.samples.push(sample.clone());
    Ok(sample)
}

/// systemd's answer judged against the state at the restart, and the state when there is one.
fn judged(
    first: &UnitState,
    asked: Result<UnitState, RemoteError>,
) -> (Systemd, Option<UnitState>) {
    match asked {
        Err(e) => (Systemd::Unreachable(e), None),
        Ok(state) => {
            let systemd = crash_reason(first, &state).map_or(Systemd::Healthy, Systemd::Crashed);
            (systemd, Some(state))
        }
    }
}

/// Runs a long step (a sample, the smoke completion) while polling systemd, and breaks it off
/// on a crash, on systemd not answering, or on a cancel.
async fn race<T, P: Probes>(
    step: impl std::future::Future<Output = T>,
    probes: &P,
    first: &UnitState,
    cancel: &CancellationToken,
) -> Result<T, Systemd> {
    tokio::select! {
        done = step => Ok(done),
        broke = crash_meanwhile(probes, first) => Err(broke),
        _ = cancel.cancelled() => Err(Systemd::Cancelled(crate::signals::interrupted())),
    }
}

/// Polls systemd until the unit shows a crash or cannot be asked; never resolves while the unit
/// is healthy. Its first look comes a poll interval in, so a quick step never pays for one.
async fn crash_meanwhile<P: Probes>(probes: &P, first: &UnitState) -> Systemd {
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        match judged(first, probes.unit_state().await).0 {
            Systemd::Healthy => {}
            broke => return broke,
        }
    }
}

/// The record of one verification, and its live display.
struct Run<'a> {
    started: Instant,
    record: Verification,
    progress: &'a Progress,
}

impl Run<'_> {
    fn since(&self) -> Duration {
        self.started.elapsed()
    }

    fn elapsed(&self) -> f64 {
        self.since().as_secs_f64()
    }

    /// Records what a decision passed, and returns what to do next.
    fn apply(&mut self, decision: Decision) -> Next {
        if let Some(loaded) = decision.loaded {
            self.record.load_seconds = Some(loaded.load_seconds);
            self.record.port_open_seconds = loaded.port_open_seconds;
        }
        for passed in decision.passed {
            self.pass(passed.stage, passed.detail);
        }
        decision.next
    }

    fn pass(&mut self, name: Stage, detail: String) {
        self.ended(name, true, detail);
    }

    fn fail(&mut self, name: Stage, reason: Reason) -> Failure {
        self.ended(name, false, reason.to_string());
        Failure {
            stage: name,
            reason,
            verification: Box::new(std::mem::take(&mut self.record)),
        }
    }

    /// A stage's end, shown and kept in the record.
    fn ended(&mut self, name: Stage, passed: bool, detail: String) {
        self.progress.stage(name, passed, &detail);
        self.record.stages.push(StageResult {
            name,
            passed,
            seconds: self.elapsed(),
            at_unix: unix_now(),
            detail,
        });
    }

    fn remote<T>(&mut self, stage: Stage, r: Result<T, RemoteError>) -> Result<T, Failure> {
        r.map_err(|e| self.fail(stage, Reason::Start(e)))
    }

    fn note(&mut self, note: String) {
        if !self.record.notes.contains(&note) {
            self.record.notes.push(note);
        }
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
    use crate::manifest::Smoke;
    use crate::remote::http::{Answer, ApiError};
    use crate::remote::{Health, Model};
    use crate::unit::parse_unit;
    use stages::Seen;
    use std::cell::{Cell, RefCell};

    /// A server scripted by the time since the restart, on tokio's paused clock.
    struct Fake {
        started: Instant,
        /// systemd shows the unit failed from then on.
        crash_at: Option<f64>,
        open_at: f64,
        ready_at: f64,
        /// How long a sample takes (a hung nvidia-smi).
        sample_takes: Duration,
        /// The scheduler processes at a time.
        schedulers: fn(f64) -> u32,
        polls: Cell<u32>,
        told: RefCell<Vec<Option<bool>>>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                started: Instant::now(),
                crash_at: None,
                open_at: 20.0,
                ready_at: 30.0,
                sample_takes: Duration::ZERO,
                schedulers: |_| 2,
                polls: Cell::new(0),
                told: RefCell::default(),
            }
        }

        fn t(&self) -> f64 {
            self.started.elapsed().as_secs_f64()
        }
    }

    impl Probes for Fake {
        async fn unit_state(&self) -> Result<UnitState, RemoteError> {
            self.polls.set(self.polls.get() + 1);
            let crashed = self.crash_at.is_some_and(|c| self.t() >= c);
            let (active, sub) = if crashed {
                ("failed", "failed")
            } else {
                ("active", "running")
            };
            Ok(UnitState {
                active_state: active.into(),
                sub_state: sub.into(),
                invocation_id: "a".into(),
                result: if crashed { "exit-code" } else { "success" }.into(),
                main_status: if crashed { 1 } else { 0 },
                memory_current: Some((1 << 30) + (self.t() as u64) * (1 << 20)),
                ..UnitState::default()
            })
        }

        async fn sample(&self, _first: &UnitState, now: &UnitState) -> Sampled {
            tokio::time::sleep(self.sample_takes).await;
            let t = self.t();
            Sampled {
                notes: vec!["no GPU tooling on the host (fake); judged without GPU memory".into()],
                sample: Ok(Sample {
                    service_bytes: now.memory_current,
                    schedulers: Some((self.schedulers)(t)),
                    processes: Some(4),
                    listening: Some(t >= self.open_at),
                    ..Sample::default()
                }),
            }
        }

        fn seen(&self) -> Seen {
            let t = self.t();
            let opened = (t >= self.open_at).then_some(self.open_at);
            Seen {
                health: Some(if t >= self.ready_at {
                    Health::Ready(Duration::from_secs(1))
                } else if opened.is_some() {
                    Health::Warming("/ready answered 503".into())
                } else {
                    Health::Closed("connection refused".into())
                }),
                opened,
                models: opened.map(|_| {
                    Ok(vec![Model {
                        id: "qwen".into(),
                        max_model_len: None,
                    }])
                }),
            }
        }

        fn listening(&self, open: Option<bool>) {
            self.told.borrow_mut().push(open);
        }

        async fn smoke(&self, smoke: &Smoke) -> Result<Answer, ApiError> {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(Answer {
                content: format!("{}.", smoke.expect),
                reasoning: None,
                finish_reason: Some("stop".into()),
            })
        }
    }

    fn spec() -> VerifySpec {
        VerifySpec {
            crash_window: Duration::from_secs(5),
            load_deadline: Duration::from_secs(120),
            sample_interval: Duration::from_secs(1),
            stall_timeout: Duration::from_secs(60),
            smoke: Some(Smoke {
                prompt: "The capital of France?".into(),
                expect: "Paris".into(),
                max_tokens: None,
            }),
            ..VerifySpec::default()
        }
    }

    async fn drive(
        fake: &Fake,
        spec: &VerifySpec,
        cancel: CancellationToken,
    ) -> Result<Verification, Failure> {
        let progress = Progress::new(String::new(), None);
        let expect = Expect::from_unit(&parse_unit(UNIT));
        let first = fake.unit_state().await.expect("the fake answers");
        let run = Run {
            started: fake.started,
            record: Verification::default(),
            progress: &progress,
        };
        Driver {
            probes: fake,
            run,
            stages: Stages::new(Rules::new(spec, &expect)),
            now: first.clone(),
            first,
            cancel,
        }
        .run()
        .await
    }

    fn names(v: &Verification) -> Vec<(&'static str, bool)> {
        v.stages.iter().map(|s| (s.name.name(), s.passed)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_records_every_stage_of_a_good_start_in_order() {
        let fake = Fake::new();
        let never = CancellationToken::new();
        let v = drive(&fake, &spec(), never).await.expect("verified");
        assert_eq!(
            names(&v),
            [
                ("crash window", true),
                ("identity", true),
                ("warmup", true),
                ("readiness", true),
                ("memory", true),
                ("smoke", true)
            ]
        );
        assert_eq!(v.port_open_seconds, Some(20.0));
        let load = v.load_seconds.expect("loaded");
        assert!((30.0..30.3).contains(&load), "{load}");
        assert_eq!(v.stages[5].detail, "answered \"Paris.\"");
        assert!(v.stages[5].seconds >= load + 2.0, "the smoke took 2 s");
        assert_eq!(v.plateau.as_ref(), v.samples.last());
        // One sample a second, and the plateau.
        assert!((31..=33).contains(&v.samples.len()), "{}", v.samples.len());
        assert_eq!(v.notes.len(), 1, "notes are kept once: {:?}", v.notes);
        assert_eq!(fake.told.borrow()[0], Some(false));
        assert_eq!(fake.told.borrow().last(), Some(&Some(true)));
        // Polled every 250 ms, and while the smoke ran.
        assert!(fake.polls.get() >= 4 * 30, "{}", fake.polls.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_crash_while_a_sample_hangs_is_reported_on_time() {
        let fake = Fake {
            crash_at: Some(3.0),
            sample_takes: Duration::from_secs(60),
            ..Fake::new()
        };
        let never = CancellationToken::new();
        let f = drive(&fake, &spec(), never).await.expect_err("crashed");
        assert_eq!(f.stage.name(), "crash window");
        assert!(
            f.reason.to_string().starts_with("crashed 3.")
                && f.reason.to_string().contains("it is failed (failed)"),
            "{}",
            f.reason
        );
        assert_eq!(names(&f.verification), [("crash window", false)]);
        assert!(f.verification.samples.is_empty(), "the sample never came");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_worker_is_confirmed_against_systemd() {
        // A scheduler dies at 12 s; systemd sees the exit 0.4 s later: a crash.
        let fake = Fake {
            crash_at: Some(12.4),
            schedulers: |t| if t < 12.0 { 2 } else { 1 },
            ..Fake::new()
        };
        let never = CancellationToken::new();
        let f = drive(&fake, &spec(), never).await.expect_err("crashed");
        assert_eq!(f.stage.name(), "loading");
        assert!(
            f.reason.to_string().starts_with("crashed 12.5s"),
            "{}",
            f.reason
        );
        // Without an exit, the worker's death is reported after CONFIRM_POLLS polls.
        let fake = Fake {
            schedulers: |t| if t < 12.0 { 2 } else { 1 },
            ..Fake::new()
        };
        let never = CancellationToken::new();
        let f = drive(&fake, &spec(), never).await.expect_err("dead worker");
        assert_eq!(f.stage.name(), "loading");
        assert_eq!(
            f.reason.to_string(),
            "a worker process died: 1 of 2 `sglang::scheduler` processes are left while the main process lives"
        );
        let at = f.verification.stages[1].seconds;
        assert!((13.0..13.1).contains(&at), "12 s, then 4 polls: {at}");
        assert_eq!(
            names(&f.verification),
            [("crash window", true), ("loading", false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_fails_the_current_stage_at_once() {
        let fake = Fake::new();
        let cancel = CancellationToken::new();
        let cancelling = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(7100)).await;
            cancelling.cancel();
        });
        let f = drive(&fake, &spec(), cancel).await.expect_err("cancelled");
        assert_eq!(
            (f.stage.name(), f.reason.to_string().as_str()),
            ("loading", "interrupted (cancelled)")
        );
        let at = f.verification.stages[1].seconds;
        assert!((7.1..7.15).contains(&at), "{at}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_port_that_never_opens_fails_readiness_at_the_load_deadline() {
        let fake = Fake {
            open_at: f64::INFINITY,
            ready_at: f64::INFINITY,
            ..Fake::new()
        };
        let never = CancellationToken::new();
        let spec = VerifySpec {
            stall_timeout: Duration::from_secs(600),
            ..spec()
        };
        let f = drive(&fake, &spec, never).await.expect_err("not ready");
        assert_eq!(f.stage.name(), "readiness");
        assert_eq!(
            f.reason.to_string(),
            "not ready after the 120s load deadline; last: the port is not open yet (connection refused)"
        );
    }

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
