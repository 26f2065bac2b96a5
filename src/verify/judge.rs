//! Pure judges of a starting server: given what systemd and the memory samples say, is it still
//! healthy? The poller in `mod.rs` owns the clock; tests feed these directly.

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

/// One look at the server's memory while it loads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Since the restart.
    pub seconds: f64,
    /// The unit's cgroup memory (`MemoryCurrent`), when systemd accounts it.
    pub service_bytes: Option<u64>,
    /// memory.used of each GPU the service uses, in MiB; empty without GPU tooling.
    pub gpu_mib: Vec<u64>,
}

impl Sample {
    fn gpu_total(&self) -> u64 {
        self.gpu_mib.iter().sum()
    }
}

/// Limits on memory from the manifest's `verify` section.
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

/// Judges the memory samples so far: over its ceiling or dropped (the process died or restarted)
/// at any time; stalled (no growth for the stall timeout) only while the server is not ready.
pub fn memory_failure(samples: &[Sample], policy: &MemoryPolicy, ready: bool) -> Option<String> {
    let last = samples.last()?;
    if let (Some(ceiling), Some(used)) = (policy.ceiling_bytes, last.service_bytes) {
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
        .filter_map(|s| s.service_bytes)
        .max()
        .unwrap_or(0);
    if let Some(used) = last.service_bytes {
        if peak > 64 * 1024 * 1024 && used < peak / 2 {
            return Some(format!(
                "service memory dropped from {} to {} (the process died or restarted)",
                bytes(peak),
                bytes(used)
            ));
        }
    }
    if ready {
        return None;
    }
    let grew_at = last_growth(samples);
    let still = last.seconds - grew_at;
    (still >= policy.stall_timeout.as_secs_f64()).then(|| {
        format!(
            "memory has not grown for {still:.0}s while the server is not ready (stalled at {}{})",
            last.service_bytes.map_or("?".into(), bytes),
            if last.gpu_mib.is_empty() {
                String::new()
            } else {
                format!(", GPUs {} MiB", last.gpu_total())
            }
        )
    })
}

/// When service or GPU memory last rose above everything before it.
fn last_growth(samples: &[Sample]) -> f64 {
    let (mut top_service, mut top_gpu, mut at) =
        (0u64, 0u64, samples.first().map_or(0.0, |s| s.seconds));
    for s in samples {
        let service = s.service_bytes.unwrap_or(0);
        if service > top_service + GROWTH_BYTES || s.gpu_total() > top_gpu + GROWTH_MIB {
            at = s.seconds;
        }
        top_service = top_service.max(service);
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
        assert_eq!(memory_failure(&samples, &policy(), false), None);
    }

    #[test]
    fn flat_memory_past_the_stall_timeout_is_a_stall() {
        let mut samples: Vec<Sample> = (0..5)
            .map(|i| sample(i as f64, 100 + 20 * i, &[]))
            .collect();
        samples.extend((5..16).map(|i| sample(i as f64, 180, &[])));
        let reason = memory_failure(&samples, &policy(), false).unwrap();
        assert!(reason.contains("has not grown for 11s"), "{reason}");
        assert!(
            memory_failure(&samples[..14], &policy(), false).is_none(),
            "9 s flat is under the timeout"
        );
    }

    #[test]
    fn gpu_growth_alone_is_progress() {
        let samples: Vec<Sample> = (0..30).map(|i| sample(i as f64, 180, &[500 * i])).collect();
        assert_eq!(memory_failure(&samples, &policy(), false), None);
    }

    #[test]
    fn a_ceiling_and_a_drop_fail() {
        assert!(memory_failure(&[sample(1.0, 2000, &[])], &policy(), true)
            .unwrap()
            .contains("over the ceiling"));
        let dropped = [sample(1.0, 500, &[]), sample(2.0, 20, &[])];
        assert!(memory_failure(&dropped, &policy(), true)
            .unwrap()
            .contains("dropped from 500 MiB to 20 MiB"));
    }

    #[test]
    fn the_plateau_must_be_near_the_expected_memory_per_gpu() {
        assert_eq!(
            plateau_failure(&sample(9.0, 500, &[74000, 76000]), &policy()),
            None
        );
        let wrong_tp = plateau_failure(&sample(9.0, 500, &[37000, 37000]), &policy()).unwrap();
        assert!(
            wrong_tp.contains("GPU 0: 37000 MiB, GPU 1: 37000 MiB"),
            "{wrong_tp}"
        );
    }

    #[test]
    fn sparklines_scale_to_the_peak() {
        assert_eq!(sparkline(&[0, 50, 100]), "▁▅█");
    }
}
