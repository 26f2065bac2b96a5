//! Pure judges of a starting server: given what systemd and the memory samples say, is it still
//! healthy? The poller (the `reconcile` binary's `verify`) owns the clock; tests feed these directly.

use std::time::Duration;

use serde::Serialize;

use crate::observed::UnitState;

/// Why a started service is judged crashed, or `None` while it still looks healthy.
pub fn crash_reason(started: &UnitState, now: &UnitState) -> Option<String> {
    if now.n_restarts > started.n_restarts {
        return Some(format!(
            "systemd restarted it (NRestarts {} -> {}, last exit status {})",
            started.n_restarts, now.n_restarts, now.main_status
        ));
    }
    if !now.invocation_id.is_empty() && now.invocation_id != started.invocation_id {
        return Some("a new invocation started (the process was restarted)".into());
    }
    match (now.active_state.as_str(), now.sub_state.as_str()) {
        ("active", "running") | ("activating", "start") | ("activating", "start-pre") => None,
        ("activating", "auto-restart") => Some(format!(
            "it exited with status {} and waits to restart",
            now.main_status
        )),
        (state, sub) => Some(format!(
            "it is {state} ({sub}) with result {} and exit status {}",
            now.result, now.main_status
        )),
    }
}

/// One look at the server while it loads: its memory and its other signs of life.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Sample {
    /// Since the restart.
    pub seconds: f64,
    /// The unit's cgroup memory (`MemoryCurrent`), when systemd accounts it. It includes page
    /// cache, which the kernel may reclaim at any time.
    pub service_bytes: Option<u64>,
    /// memory.used of each GPU the service uses, in MiB; empty without GPU tooling.
    pub gpu_mib: Vec<u64>,
    /// The cgroup's anonymous memory: the processes' own, never reclaimed behind their back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anon_bytes: Option<u64>,
    /// CPU time of the cgroup's processes so far, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// Journal lines the invocation has written so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_lines: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// `sglang::scheduler*` processes: one per TP rank once they have started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedulers: Option<u32>,
    /// Whether something listens on the server's port, when the host can tell (`ss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listening: Option<bool>,
}

impl Sample {
    fn gpu_total(&self) -> u64 {
        self.gpu_mib.iter().sum()
    }

    /// The memory a drop or a ceiling is judged on: anonymous memory where the host reports it,
    /// since page cache falls whenever the kernel reclaims it.
    fn own_bytes(&self) -> Option<u64> {
        self.anon_bytes.or(self.service_bytes)
    }
}

/// Limits from the manifest's `verify` section.
#[derive(Debug, Clone)]
pub struct MemoryPolicy {
    pub stall_timeout: Duration,
    pub ceiling_bytes: Option<u64>,
    pub gpu_expected_mib: Option<u64>,
    pub gpu_tolerance_percent: f64,
}

/// Growth smaller than this is noise, not loading.
const GROWTH_BYTES: u64 = 1024 * 1024;
const GROWTH_MIB: u64 = 1;
/// CPU use that counts as work: a quarter of one core. A compiler, a graph capture or a weight
/// copy keeps at least one core busy; an idle or blocked Python process uses well under 1 %.
const BUSY_CORES: f64 = 0.25;
/// A GPU whose memory falls below this share of its peak has lost its process: the CUDA driver
/// frees a process's memory only when it exits, and PyTorch's caching allocator keeps the rest.
const GPU_DEAD_SHARE: f64 = 0.5;
/// Below this peak a GPU has not loaded anything worth judging.
const GPU_LOADED_MIB: u64 = 1024;

/// Judges memory at any time: over its ceiling, or dropped (the process died or restarted).
/// Both are judged on the processes' own memory, not page cache.
pub fn memory_failure(samples: &[Sample], policy: &MemoryPolicy) -> Option<String> {
    let last = samples.last()?;
    if let (Some(ceiling), Some(used)) = (policy.ceiling_bytes, last.own_bytes()) {
        if used > ceiling {
            return Some(format!(
                "service memory {} is over the ceiling of {}",
                bytes(used),
                bytes(ceiling)
            ));
        }
    }
    let peak = samples
        .iter()
        .filter_map(Sample::own_bytes)
        .max()
        .unwrap_or(0);
    let used = last.own_bytes()?;
    (peak > 64 * 1024 * 1024 && used < peak / 2).then(|| {
        format!(
            "service memory dropped from {} to {} (the process died or restarted)",
            bytes(peak),
            bytes(used)
        )
    })
}

/// A worker process of a server whose main process still lives has died: SGLang 0.5.9 and older
/// have no watchdog, and a rank that dies at C level (an NCCL abort, a segfault) leaves the main
/// process alive and hung. Seen as a GPU of the unit falling far from its peak, fewer scheduler
/// processes than there were, or the cgroup's processes halved.
///
/// GPUs are judged only when the unit names its own (`CUDA_VISIBLE_DEVICES`): otherwise the
/// readings cover every GPU of the host, and another service's restart would look like a death.
pub fn dead_worker(samples: &[Sample], own_gpus: bool) -> Option<String> {
    let last = samples.last()?;
    let gpus = if own_gpus { &last.gpu_mib[..] } else { &[] };
    for (i, used) in gpus.iter().enumerate() {
        let readings: Vec<u64> = samples
            .iter()
            .filter_map(|s| s.gpu_mib.get(i).copied())
            .collect();
        let (low, peak) = largest_rise(&readings);
        let loaded = peak - low;
        if loaded >= GPU_LOADED_MIB && (*used as f64) < low as f64 + loaded as f64 * GPU_DEAD_SHARE
        {
            return Some(format!(
                "a worker process died: GPU #{i} of the unit fell from {peak} MiB to {used} MiB while the main process lives"
            ));
        }
    }
    if let (Some(now), Some(most)) = (last.schedulers, held_peak(samples, |s| s.schedulers)) {
        if now < most {
            return Some(format!(
                "a worker process died: {now} of {most} `sglang::scheduler` processes are left while the main process lives"
            ));
        }
    }
    if let (Some(now), Some(most)) = (last.processes, held_peak(samples, |s| s.processes)) {
        if most >= 3 && now <= most / 2 {
            return Some(format!(
                "a worker process died: the service's processes fell from {most} to {now} while the main process lives"
            ));
        }
    }
    None
}

/// The most of `count` (the cgroup's processes, its `sglang::scheduler` processes) held in two
/// looks in a row. A process's child lives under its parent's name until its `exec`: a start-up
/// script's command substitutions before a venv wrapper's `exec` (seen in the real SGLang tier, 3
/// processes at 0.2 s, 1 at 1 s), or a scheduler's `subprocess` call, briefly a second
/// `sglang::scheduler` (sglang 0.5.23 `srt/utils/common.py`, `parse_lscpu_topology`, runs `lscpu`
/// for the CPU engine; seen once in the real tier under load: "1 of 2" on a server with one). One look may catch such a child; that is no worker, and no death when it is gone.
/// Workers stay.
fn held_peak(samples: &[Sample], count: impl Fn(&Sample) -> Option<u32>) -> Option<u32> {
    samples
        .windows(2)
        .filter_map(|w| Some(count(&w[0])?.min(count(&w[1])?)))
        .max()
}

/// The largest rise in `readings` (its low, then its peak): what this invocation loaded onto a
/// GPU. A GPU may still hold the previous process's memory for a moment after a restart (the
/// driver frees it as that process's exit completes), so a fall from the first reading is not a
/// death; a fall from a rise this verification saw is.
fn largest_rise(readings: &[u64]) -> (u64, u64) {
    let (mut best_low, mut best_peak) = (0, 0);
    let mut low = u64::MAX;
    for &v in readings {
        low = low.min(v);
        if v - low > best_peak - best_low {
            (best_low, best_peak) = (low, v);
        }
    }
    (best_low, best_peak)
}

/// A stall is no progress on every signal at once for the stall timeout: no growth of GPU,
/// service or anonymous memory, no CPU work, no new journal line. Judged only before the port
/// opens; warmup has its own deadline.
pub fn stall(samples: &[Sample], policy: &MemoryPolicy) -> Option<String> {
    let last = samples.last()?;
    let since = last_progress(samples);
    let still = last.seconds - since;
    if still < policy.stall_timeout.as_secs_f64() {
        return None;
    }
    let window: Vec<&Sample> = samples.iter().filter(|s| s.seconds >= since).collect();
    let mut flat = Vec::new();
    if !last.gpu_mib.is_empty() {
        flat.push(format!("GPU memory flat at {} MiB", last.gpu_total()));
    }
    if let Some(b) = last.service_bytes {
        flat.push(format!("service memory flat at {}", bytes(b)));
    }
    if let Some(b) = last.anon_bytes {
        flat.push(format!("anonymous memory flat at {}", bytes(b)));
    }
    if let (Some(a), Some(b)) = (window.first().and_then(|s| s.cpu_seconds), last.cpu_seconds) {
        let span = (last.seconds - since).max(f64::EPSILON);
        flat.push(format!(
            "CPU {:.0}% of a core",
            100.0 * (b - a).max(0.0) / span
        ));
    }
    if last.journal_lines.is_some() {
        flat.push("no new journal lines".into());
    }
    Some(format!(
        "no progress for {still:.0}s while loading: {}",
        flat.join(", ")
    ))
}

/// When any signal last showed progress.
fn last_progress(samples: &[Sample]) -> f64 {
    let Some(first) = samples.first() else {
        return 0.0;
    };
    let (mut top_service, mut top_anon, mut top_gpu, mut at) = (
        first.service_bytes.unwrap_or(0),
        first.anon_bytes.unwrap_or(0),
        first.gpu_total(),
        first.seconds,
    );
    for pair in samples.windows(2) {
        let (before, s) = (&pair[0], &pair[1]);
        let service = s.service_bytes.unwrap_or(0);
        let anon = s.anon_bytes.unwrap_or(0);
        let grew = service > top_service + GROWTH_BYTES
            || anon > top_anon + GROWTH_BYTES
            || s.gpu_total() > top_gpu + GROWTH_MIB;
        let busy = match (before.cpu_seconds, s.cpu_seconds) {
            (Some(a), Some(b)) => (b - a) >= BUSY_CORES * (s.seconds - before.seconds),
            _ => false,
        };
        let logged = match (before.journal_lines, s.journal_lines) {
            (Some(a), Some(b)) => b > a,
            (None, Some(b)) => b > 0,
            _ => false,
        };
        if grew || busy || logged {
            at = s.seconds;
        }
        top_service = top_service.max(service);
        top_anon = top_anon.max(anon);
        top_gpu = top_gpu.max(s.gpu_total());
    }
    at
}

/// Judges the loaded server's GPU memory against the expected plateau per GPU: far from it means
/// the wrong tensor parallelism or the wrong model.
pub fn plateau_failure(loaded: &Sample, policy: &MemoryPolicy) -> Option<String> {
    let expected = policy.gpu_expected_mib?;
    let tolerance = expected as f64 * policy.gpu_tolerance_percent / 100.0;
    let off: Vec<String> = loaded
        .gpu_mib
        .iter()
        .enumerate()
        .filter(|(_, used)| (**used as f64 - expected as f64).abs() > tolerance)
        .map(|(i, used)| format!("GPU {i}: {used} MiB"))
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "loaded GPU memory is far from the expected {expected} MiB ±{}% per GPU ({}): wrong tp or wrong model?",
            policy.gpu_tolerance_percent,
            off.join(", ")
        )
    })
}

/// `▁▂▄▇█`-style trend of values, for a live display and the report.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values
        .iter()
        .map(|v| BARS[((*v as f64 / max as f64) * 7.0).round() as usize])
        .collect()
}

pub fn bytes(n: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    if n as f64 >= GIB {
        format!("{:.1} GiB", n as f64 / GIB)
    } else {
        format!("{:.0} MiB", n as f64 / 1024.0 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    const MIB: u64 = 1024 * 1024;

    fn state(active: &str, sub: &str, restarts: u32, invocation: &str) -> UnitState {
        UnitState {
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: sub.into(),
            n_restarts: restarts,
            invocation_id: invocation.into(),
            result: "success".into(),
            ..Default::default()
        }
    }

    fn policy() -> MemoryPolicy {
        MemoryPolicy {
            stall_timeout: Duration::from_secs(10),
            ceiling_bytes: Some(1024 * MIB),
            gpu_expected_mib: Some(75000),
            gpu_tolerance_percent: 10.0,
        }
    }

    fn sample(seconds: f64, mib: u64, gpu: &[u64]) -> Sample {
        Sample {
            seconds,
            service_bytes: Some(mib * MIB),
            gpu_mib: gpu.to_vec(),
            ..Sample::default()
        }
    }

    #[test]
    fn a_running_service_is_healthy() {
        let s = state("active", "running", 0, "a");
        assert_eq!(crash_reason(&s, &s), None);
    }

    #[test]
    fn restarts_new_invocations_and_failures_are_crashes() {
        let started = state("active", "running", 0, "a");
        assert!(crash_reason(&started, &state("active", "running", 1, "b"))
            .unwrap()
            .contains("NRestarts 0 -> 1"));
        assert!(crash_reason(&started, &state("active", "running", 0, "b"))
            .unwrap()
            .contains("new invocation"));
        assert!(crash_reason(&started, &state("failed", "failed", 0, "a"))
            .unwrap()
            .contains("failed"));
        assert!(
            crash_reason(&started, &state("activating", "auto-restart", 0, "a"))
                .unwrap()
                .contains("waits to restart")
        );
        assert!(crash_reason(&started, &state("inactive", "dead", 0, "a")).is_some());
    }

    #[test]
    fn growing_memory_is_loading() {
        let samples: Vec<Sample> = (0..20)
            .map(|i| sample(i as f64, 100 + 20 * i, &[1000 * i]))
            .collect();
        assert_eq!(stall(&samples, &policy()), None);
        assert_eq!(memory_failure(&samples, &policy()), None);
        assert_eq!(dead_worker(&samples, true), None);
    }

    #[test]
    fn flat_and_idle_past_the_stall_timeout_is_a_stall() {
        let mut samples: Vec<Sample> = (0..5)
            .map(|i| sample(i as f64, 100 + 20 * i, &[]))
            .collect();
        samples.extend((5..16).map(|i| sample(i as f64, 180, &[])));
        let reason = stall(&samples, &policy()).unwrap();
        assert_holds(&reason, "no progress for 11s");
        assert_holds(&reason, "service memory flat at 180 MiB");
        assert!(
            stall(&samples[..14], &policy()).is_none(),
            "9 s flat is under the timeout"
        );
    }

    fn busy(seconds: f64, cores: f64, lines: u64) -> Sample {
        Sample {
            cpu_seconds: Some(seconds * cores),
            journal_lines: Some(lines),
            anon_bytes: Some(500 * MIB),
            ..sample(seconds, 600, &[70000, 70000])
        }
    }

    #[test]
    fn a_flat_phase_with_a_busy_cpu_is_not_a_stall() {
        // DeepGEMM's JIT: memory exactly flat for minutes, one core compiling, nothing logged.
        let samples: Vec<Sample> = (0..60).map(|i| busy(i as f64, 1.0, 7)).collect();
        assert_eq!(stall(&samples, &policy()), None);
        // The same with an idle CPU is a stall, and the reason names every flat signal.
        let idle: Vec<Sample> = (0..60).map(|i| busy(i as f64, 0.01, 7)).collect();
        let reason = stall(&idle, &policy()).unwrap();
        for part in [
            "no progress for 59s",
            "GPU memory flat at 140000 MiB",
            "anonymous memory flat at 500 MiB",
            "CPU 1% of a core",
            "no new journal lines",
        ] {
            assert!(reason.contains(part), "{part:?} in {reason}");
        }
    }

    #[test]
    fn gpu_growth_alone_is_progress() {
        let samples: Vec<Sample> = (0..30).map(|i| sample(i as f64, 180, &[500 * i])).collect();
        assert_eq!(stall(&samples, &policy()), None);
    }

    #[test]
    fn new_journal_lines_are_progress() {
        let samples: Vec<Sample> = (0..60).map(|i| busy(i as f64, 0.0, i / 5)).collect();
        assert_eq!(stall(&samples, &policy()), None);
    }

    #[test]
    fn a_ceiling_and_a_drop_fail() {
        assert!(memory_failure(&[sample(1.0, 2000, &[])], &policy())
            .unwrap()
            .contains("over the ceiling"));
        let dropped = [sample(1.0, 500, &[]), sample(2.0, 20, &[])];
        assert!(memory_failure(&dropped, &policy())
            .unwrap()
            .contains("dropped from 500 MiB to 20 MiB"));
    }

    #[test]
    fn reclaimed_page_cache_is_not_a_drop() {
        // MemoryCurrent falls from 900 to 300 MiB as the kernel drops the safetensors' cache,
        // while the processes' own memory stays.
        let at = |seconds, service, anon| Sample {
            anon_bytes: Some(anon * MIB),
            ..sample(seconds, service, &[])
        };
        let samples = [at(1.0, 900, 250), at(2.0, 300, 250)];
        assert_eq!(memory_failure(&samples, &policy()), None);
        let really = [at(1.0, 900, 250), at(2.0, 300, 20)];
        assert!(memory_failure(&really, &policy()).is_some());
    }

    #[test]
    fn a_dead_rank_is_a_gpu_falling_or_a_scheduler_gone() {
        let gpus = [
            sample(0.5, 100, &[0, 0]),
            sample(1.0, 500, &[70000, 70000]),
            sample(2.0, 500, &[70000, 0]),
        ];
        let reason = dead_worker(&gpus, true).unwrap();
        assert_holds(&reason, "GPU #1 of the unit fell from 70000 MiB to 0 MiB");
        let with = |seconds, schedulers, processes| Sample {
            schedulers: Some(schedulers),
            processes: Some(processes),
            ..sample(seconds, 500, &[])
        };
        let died = [with(1.0, 4, 6), with(1.5, 4, 6), with(2.0, 3, 5)];
        let reason = dead_worker(&died, true).unwrap();
        assert_holds(&reason, "3 of 4 `sglang::scheduler`");
        // A scheduler's child before its `exec` (the CPU engine's `lscpu`), seen in one look, is
        // no second scheduler.
        let forked = [with(1.0, 1, 3), with(1.5, 2, 4), with(2.0, 1, 3)];
        assert_eq!(dead_worker(&forked, true), None);
        assert!(
            dead_worker(&[with(1.0, 0, 8), with(2.0, 0, 8), with(3.0, 0, 4)], true)
                .unwrap()
                .contains("fell from 8 to 4")
        );
        // A wrapper's children before its `exec`, seen in one look, are not workers.
        let wrapper = [with(0.2, 0, 3), with(1.0, 0, 1), with(2.0, 0, 1)];
        assert_eq!(dead_worker(&wrapper, true), None);
        // Compile workers come and go: one process fewer is not a death.
        assert_eq!(dead_worker(&[with(1.0, 4, 9), with(2.0, 4, 6)], true), None);
        // A GPU that never loaded much is not judged.
        assert_eq!(
            dead_worker(&[sample(1.0, 1, &[900]), sample(2.0, 1, &[0])], true),
            None
        );
        // Memory a GPU still held from the previous process at the restart is not this
        // invocation's: its falling is not a death, a fall from what this one loaded is.
        let stale = [
            sample(1.0, 1, &[75000]),
            sample(2.0, 1, &[0]),
            sample(3.0, 1, &[36000]),
        ];
        assert_eq!(dead_worker(&stale, true), None);
        let mut died = stale.to_vec();
        died.push(sample(4.0, 1, &[75000]));
        died.push(sample(5.0, 1, &[20000]));
        assert!(dead_worker(&died, true)
            .unwrap()
            .contains("fell from 75000 MiB to 20000 MiB"));
        // GPUs the unit does not claim as its own are not judged.
        assert_eq!(dead_worker(&gpus, false), None);
    }

    #[test]
    fn the_plateau_must_be_near_the_expected_memory_per_gpu() {
        assert_eq!(
            plateau_failure(&sample(9.0, 500, &[74000, 76000]), &policy()),
            None
        );
        let wrong_tp = plateau_failure(&sample(9.0, 500, &[37000, 37000]), &policy()).unwrap();
        assert_holds(&wrong_tp, "GPU 0: 37000 MiB, GPU 1: 37000 MiB");
    }

    #[test]
    fn sparklines_scale_to_the_peak() {
        assert_eq!(sparkline(&[0, 50, 100]), "▁▅█");
    }
}
