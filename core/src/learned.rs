//! Learned load times: what the unit's last good loads (its deployment history) say about the
//! load now under way. Pure: apply reads the history on the host and passes the records in.
//!
//! The rules (docs/verification.md, Apply, "Learned load times"):
//!
//! - **History**: the newest [`LOADS_KEPT`] records of the unit whose outcome is `converged` and
//!   that have a load time; the newest of them gives the trajectory to compare with.
//! - **Progress**: the memory now over the last good load's plateau (the final point of its
//!   trajectory), capped at 100 %. GPU memory (summed over the unit's GPUs) when both loads have
//!   it, the service's memory otherwise.
//! - **ETA**: the last good load took `L`; it first reached the same share of its plateau at `t`;
//!   what is left is `L - t`, what that load needed from the same point on. Without a memory
//!   reading to place the load, it is `L - elapsed`. Never below zero.
//! - **Load deadline**, when the manifest does not set `verify.load_deadline`: the larger of the
//!   configured default and twice the slowest of the kept loads.
//! - **Stall timeout**: not learned. It stays the manifest's value or SGLang's watchdog default:
//!   a stall is every signal flat at once (memory, CPU, journal), and the trajectory keeps only
//!   memory, so a past load cannot tell how long a healthy one stays idle.

use std::time::Duration;

use serde::Serialize;

use crate::manifest::VerifySpec;
use crate::outcome::Outcome;
use crate::record::Record;
use crate::verify::judge::Sample;

/// Converged loads kept to learn from.
pub const LOADS_KEPT: usize = 3;
/// Points of a trajectory kept in a deployment record.
pub const TRAJECTORY_POINTS: usize = 64;
/// The learned load deadline is this many times the slowest kept load.
pub const DEADLINE_FACTOR: u32 = 2;

/// The record keeps the points; building one from a sample is the learning side's.
pub use crate::record::Point;

impl Point {
    pub fn of(sample: &Sample) -> Point {
        Point {
            seconds: sample.seconds,
            service_bytes: sample.service_bytes,
            gpu_mib: (!sample.gpu_mib.is_empty()).then(|| sample.gpu_mib.iter().sum()),
        }
    }
}

/// The samples as a trajectory of at most `TRAJECTORY_POINTS` points.
pub fn trajectory(samples: &[Sample]) -> Vec<Point> {
    downsample(
        &samples.iter().map(Point::of).collect::<Vec<_>>(),
        TRAJECTORY_POINTS,
    )
}

/// At most `max` of `points`, evenly spread by index, the first and the last always kept.
pub fn downsample(points: &[Point], max: usize) -> Vec<Point> {
    let n = points.len();
    if n <= max || max == 0 {
        return if max == 0 {
            Vec::new()
        } else {
            points.to_vec()
        };
    }
    if max == 1 {
        return vec![points[n - 1]];
    }
    (0..max)
        .map(|i| points[(i * (n - 1) + (max - 1) / 2) / (max - 1)])
        .collect()
}

/// Which memory of a point to judge on.
type Memory = fn(&Point) -> Option<u64>;
/// GPU memory first: the service's includes page cache, which the kernel may reclaim.
const GPU: Memory = |p| p.gpu_mib;
const SERVICE: Memory = |p| p.service_bytes;

/// What the unit's history says about its loads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadHistory {
    /// The load times of the last converged loads, newest first (at most [`LOADS_KEPT`]).
    pub load_seconds: Vec<f64>,
    /// The newest converged load's trajectory (empty when its record has none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trajectory: Vec<Point>,
}

impl LoadHistory {
    /// From the unit's records, oldest first (as `history.jsonl` holds them); `None` without a
    /// converged load that has a load time.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a Record>) -> Option<LoadHistory> {
        let mut good: Vec<&Record> = records
            .into_iter()
            .filter(|r| {
                r.outcome == Outcome::Converged.name() && r.load_seconds.is_some_and(|s| s >= 0.0)
            })
            .collect();
        good.reverse();
        good.truncate(LOADS_KEPT);
        let newest = good.first()?;
        Some(LoadHistory {
            load_seconds: good.iter().filter_map(|r| r.load_seconds).collect(),
            trajectory: newest.trajectory.clone(),
        })
    }

    /// The newest converged load's time.
    pub fn last(&self) -> f64 {
        self.load_seconds[0]
    }

    pub fn slowest(&self) -> f64 {
        self.load_seconds.iter().copied().fold(0.0, f64::max)
    }

    /// How far the load under way is against the last good one, `elapsed` after the restart
    /// with `now` its latest sample.
    pub fn progress(&self, elapsed: f64, now: &Point) -> Against {
        let placed = self.share(now).map(|(share, memory)| {
            let reached = self
                .trajectory
                .iter()
                .find(|p| memory(p).is_some_and(|v| v as f64 >= share * self.plateau(memory)))
                .map_or(self.last(), |p| p.seconds);
            (share, reached)
        });
        let remaining = match placed {
            Some((_, reached)) => self.last() - reached,
            None => self.last() - elapsed,
        };
        Against {
            percent: placed.map(|(share, _)| (share * 100.0).floor() as u32),
            remaining_seconds: remaining.max(0.0),
            last_seconds: self.last(),
        }
    }

    /// The share of the last plateau that `now` has, and which memory it is judged on.
    fn share(&self, now: &Point) -> Option<(f64, Memory)> {
        [GPU, SERVICE].into_iter().find_map(|memory| {
            let plateau = self.plateau(memory);
            let value = memory(now)?;
            (plateau > 0.0).then(|| ((value as f64 / plateau).min(1.0), memory))
        })
    }

    /// The final value of a memory in the last trajectory, 0 when it has none.
    fn plateau(&self, memory: Memory) -> f64 {
        self.trajectory
            .last()
            .and_then(memory)
            .map_or(0.0, |v| v as f64)
    }

    /// The last trajectory and `now`'s, side by side on one time axis and one scale.
    pub fn sparklines(&self, now: &[Point], width: usize) -> Option<(String, String)> {
        aligned_sparklines(now, &self.trajectory, width)
    }
}

/// A load against the last good one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Against {
    /// Of the last load's plateau; `None` without memory readings to compare.
    pub percent: Option<u32>,
    pub remaining_seconds: f64,
    pub last_seconds: f64,
}

impl Against {
    /// "62% of the last load's plateau, ~3m10s left (last good load 9m12s)".
    pub fn line(&self) -> String {
        let percent = self.percent.map_or(String::new(), |p| {
            format!("{p}% of the last load's plateau, ")
        });
        format!(
            "{percent}~{} left (last good load {})",
            human(self.remaining_seconds),
            human(self.last_seconds)
        )
    }
}

/// Two sparklines of the same width: `now` and `last`, on a time axis as long as the longer of
/// the two and on the scale of the larger. GPU memory when both have it, else the service's.
pub fn aligned_sparklines(now: &[Point], last: &[Point], width: usize) -> Option<(String, String)> {
    let has = |pts: &[Point], m: Memory| pts.iter().any(|p| m(p).is_some());
    let memory = [GPU, SERVICE]
        .into_iter()
        .find(|m| has(now, *m) && has(last, *m))?;
    let end = now
        .iter()
        .chain(last)
        .map(|p| p.seconds)
        .fold(0.0, f64::max);
    let width = width.max(1);
    // The value at each column's time: the latest point at or before it, 0 before the first.
    let columns = |pts: &[Point]| -> Vec<u64> {
        let Some(stop) = pts.last().map(|p| p.seconds) else {
            return Vec::new();
        };
        // Up to the first column at or after this trajectory's end.
        let shown = if end > 0.0 {
            ((stop / end * width as f64).ceil() as usize).clamp(1, width)
        } else {
            width
        };
        (0..shown)
            .map(|i| end * (i + 1) as f64 / width as f64)
            .map(|t| {
                pts.iter()
                    .take_while(|p| p.seconds <= t)
                    .last()
                    .and_then(memory)
                    .unwrap_or(0)
            })
            .collect()
    };
    let (a, b) = (columns(now), columns(last));
    let max = a.iter().chain(&b).copied().max().unwrap_or(0).max(1);
    let spark = |values: &[u64]| -> String {
        const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        values
            .iter()
            .map(|v| BARS[((*v as f64 / max as f64) * 7.0).round() as usize])
            .collect()
    };
    Some((spark(&a), spark(&b)))
}

/// The verification spec with what history teaches, and the notes saying so. Only what the
/// manifest leaves unset is learned (`spec.explicit`); without history the spec is unchanged.
pub fn learned_spec(spec: &VerifySpec, history: Option<&LoadHistory>) -> (VerifySpec, Vec<String>) {
    let mut spec = spec.clone();
    let mut notes = Vec::new();
    let Some(h) = history else {
        return (spec, notes);
    };
    notes.push(format!(
        "last good load {} ({} in history)",
        human(h.last()),
        loads(h.load_seconds.len())
    ));
    if !spec.explicit.load_deadline {
        let (deadline, note) = load_deadline(spec.load_deadline, h);
        spec.load_deadline = deadline;
        notes.push(note);
    }
    (spec, notes)
}

/// The learned load deadline over `default`, and its note.
pub fn load_deadline(default: Duration, h: &LoadHistory) -> (Duration, String) {
    let slowest = h.slowest();
    let learned = Duration::from_secs_f64((slowest * f64::from(DEADLINE_FACTOR)).ceil());
    let of = format!(
        "{DEADLINE_FACTOR} × {}, the slowest of {}",
        human(slowest),
        last_loads(h.load_seconds.len())
    );
    if learned > default {
        let note = format!(
            "load deadline {} from history: {of}",
            human(learned.as_secs_f64())
        );
        (learned, note)
    } else {
        let note = format!(
            "load deadline {}, the default: more than learned from history ({of})",
            human(default.as_secs_f64())
        );
        (default, note)
    }
}

fn loads(n: usize) -> String {
    if n == 1 {
        "1 converged load".into()
    } else {
        format!("{n} converged loads")
    }
}

fn last_loads(n: usize) -> String {
    if n == 1 {
        "the last load".into()
    } else {
        format!("the last {n} loads")
    }
}

/// Seconds as people read them: `9.8s`, `9m12s`, `19m`, `1h5m`.
pub fn human(seconds: f64) -> String {
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    let s = seconds.round() as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, s) {
        (0, 0) => format!("{m}m"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn point(seconds: f64, gib: u64, gpu: Option<u64>) -> Point {
        Point {
            seconds,
            service_bytes: Some(gib * GIB),
            gpu_mib: gpu,
        }
    }

    fn record(outcome: &str, load: Option<f64>, trajectory: Vec<Point>) -> Record {
        Record {
            unit: "s.service".into(),
            manifest: "m.yaml".into(),
            manifest_sha256: "m".into(),
            unit_sha256: "u".into(),
            git_commit: None,
            git_author: None,
            applied_at: "t".into(),
            applied_by: "me".into(),
            outcome: outcome.into(),
            load_seconds: load,
            plateau_service_bytes: None,
            plateau_gpu_mib: Vec::new(),
            trajectory,
            restored_from: None,
            benchmark: None,
            quality: None,
            live: None,
        }
    }

    /// A last good load of 100 s: GPU memory 0, 40, 80, 80 GiB-ish at 0, 25, 50, 100 s.
    fn history() -> LoadHistory {
        LoadHistory {
            load_seconds: vec![100.0],
            trajectory: vec![
                point(0.0, 1, Some(0)),
                point(25.0, 20, Some(40_000)),
                point(50.0, 40, Some(80_000)),
                point(100.0, 40, Some(80_000)),
            ],
        }
    }

    #[test]
    fn history_keeps_the_last_three_converged_loads_newest_first_and_the_newest_trajectory() {
        let newest = vec![point(9.0, 3, None)];
        let records = [
            record("converged", Some(1.0), vec![point(1.0, 1, None)]),
            record("converged", Some(2.0), Vec::new()),
            record("reloaded", None, Vec::new()),
            record("converged", Some(3.0), Vec::new()),
            record("converged", None, Vec::new()),
            record("converged", Some(4.0), newest.clone()),
            record("rolled_back", Some(50.0), Vec::new()),
        ];
        let h = LoadHistory::from_records(&records).unwrap();
        assert_eq!(h.load_seconds, [4.0, 3.0, 2.0]);
        assert_eq!(h.trajectory, newest);
        assert_eq!((h.last(), h.slowest()), (4.0, 4.0));
        assert_eq!(LoadHistory::from_records(&records[2..3]), None);
        assert_eq!(LoadHistory::from_records(&[]), None);
    }

    #[test]
    fn records_keep_the_trajectory_and_records_without_one_read_and_write_as_before() {
        use crate::record::{parse_record, record_json};
        let with = record("converged", Some(2.0), vec![point(0.5, 1, Some(7))]);
        let json = record_json(&with).unwrap();
        assert!(
            json.contains(
                r#""trajectory":[{"seconds":0.5,"service_bytes":1073741824,"gpu_mib":7}]"#
            ),
            "{json}"
        );
        assert_eq!(parse_record(&json), Ok(with));
        let without = record("converged", Some(2.0), Vec::new());
        let json = record_json(&without).unwrap();
        assert!(!json.contains("trajectory"), "{json}");
        assert_eq!(parse_record(&json), Ok(without));
    }

    #[test]
    fn downsampling_keeps_at_most_the_limit_with_the_first_and_last_points() {
        let points: Vec<Point> = (0..1000).map(|i| point(f64::from(i), 1, None)).collect();
        let d = downsample(&points, 64);
        assert_eq!(d.len(), 64);
        assert_eq!((d[0].seconds, d[63].seconds), (0.0, 999.0));
        assert!(d.windows(2).all(|w| w[0].seconds < w[1].seconds));
        assert_eq!(downsample(&points[..10], 64), &points[..10]);
        assert_eq!(downsample(&points[..65], 64).len(), 64);
        assert_eq!(downsample(&points, 1), [points[999]]);
        assert!(downsample(&points, 0).is_empty());
    }

    #[test]
    fn a_trajectory_sums_the_gpus_and_is_absent_without_them() {
        let s = Sample {
            seconds: 3.0,
            service_bytes: Some(5),
            gpu_mib: vec![100, 200],
            ..Sample::default()
        };
        assert_eq!(
            trajectory(std::slice::from_ref(&s)),
            [Point {
                seconds: 3.0,
                service_bytes: Some(5),
                gpu_mib: Some(300)
            }]
        );
        let none = Sample {
            gpu_mib: Vec::new(),
            ..s
        };
        assert_eq!(trajectory(&[none])[0].gpu_mib, None);
    }

    #[test]
    fn progress_is_the_share_of_the_last_plateau_and_the_eta_what_that_load_took_from_there() {
        let h = history();
        // Half the GPU plateau: the last load was there at 25 s, and took 75 s more.
        let a = h.progress(10.0, &point(10.0, 20, Some(40_000)));
        assert_eq!((a.percent, a.remaining_seconds), (Some(50), 75.0));
        assert_eq!(
            a.line(),
            "50% of the last load's plateau, ~1m15s left (last good load 1m40s)"
        );
        // A slower load at the same point still has what the last one needed from there.
        assert_eq!(
            h.progress(60.0, &point(60.0, 20, Some(40_000)))
                .remaining_seconds,
            75.0
        );
        // At the plateau: what the last load spent after reaching it (CUDA graphs, warmup).
        let full = h.progress(55.0, &point(55.0, 40, Some(90_000)));
        assert_eq!((full.percent, full.remaining_seconds), (Some(100), 50.0));
        // No GPU reading now: judged on the service's memory (20 of 40 GiB, reached at 25 s).
        let service = h.progress(10.0, &point(10.0, 20, None));
        assert_eq!(
            (service.percent, service.remaining_seconds),
            (Some(50), 75.0)
        );
        // No memory reading at all: the last load's time less what has passed, never negative.
        let blind = Point {
            seconds: 30.0,
            service_bytes: None,
            gpu_mib: None,
        };
        let a = h.progress(30.0, &blind);
        assert_eq!((a.percent, a.remaining_seconds), (None, 70.0));
        assert_eq!(a.line(), "~1m10s left (last good load 1m40s)");
        assert_eq!(h.progress(130.0, &blind).remaining_seconds, 0.0);
        // A last load without a trajectory places nothing.
        let bare = LoadHistory {
            load_seconds: vec![100.0],
            trajectory: Vec::new(),
        };
        assert_eq!(bare.progress(40.0, &point(40.0, 20, Some(1))).percent, None);
    }

    #[test]
    fn the_load_deadline_is_twice_the_slowest_load_but_never_below_the_default() {
        let default = VerifySpec::default();
        let slow = LoadHistory {
            load_seconds: vec![540.0, 570.0, 500.0],
            trajectory: Vec::new(),
        };
        let (deadline, note) = load_deadline(Duration::from_secs(10 * 60), &slow);
        assert_eq!(deadline, Duration::from_secs(1140));
        assert_eq!(
            note,
            "load deadline 19m from history: 2 × 9m30s, the slowest of the last 3 loads"
        );
        let (spec, notes) = learned_spec(&default, Some(&history()));
        assert_eq!(spec.load_deadline, default.load_deadline);
        assert_eq!(
            notes,
            [
                "last good load 1m40s (1 converged load in history)",
                "load deadline 30m, the default: more than learned from history (2 × 1m40s, the slowest of the last load)"
            ]
        );
        let long = LoadHistory {
            load_seconds: vec![1000.0, 1234.5],
            trajectory: Vec::new(),
        };
        let (spec, _) = learned_spec(&default, Some(&long));
        assert_eq!(spec.load_deadline, Duration::from_secs(2469));
        assert_eq!(spec.stall_timeout, default.stall_timeout, "never learned");
        // Set in the manifest: kept, whatever history says.
        let mut set = VerifySpec {
            load_deadline: Duration::from_secs(60),
            ..default.clone()
        };
        set.explicit.load_deadline = true;
        let (spec, notes) = learned_spec(&set, Some(&long));
        assert_eq!(spec, set);
        assert_eq!(notes.len(), 1);
        // No history: nothing changes, nothing is noted.
        assert_eq!(learned_spec(&default, None), (default, Vec::new()));
    }

    #[test]
    fn sparklines_share_one_time_axis_and_one_scale() {
        let last = history().trajectory;
        let now = vec![point(0.0, 1, Some(0)), point(25.0, 20, Some(80_000))];
        let (a, b) = aligned_sparklines(&now, &last, 4).unwrap();
        // Columns end at 25, 50, 75 and 100 s; this load has reached 25 s only.
        assert_eq!((a.as_str(), b.as_str()), ("█", "▅███"));
        let no_gpu = [point(0.0, 1, None)];
        let (a, b) = aligned_sparklines(&no_gpu, &last, 2).unwrap();
        assert_eq!((a.chars().count(), b.chars().count()), (1, 2));
        assert_eq!(aligned_sparklines(&now, &[], 4), None);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(9.84), "9.8s");
        assert_eq!(human(552.0), "9m12s");
        assert_eq!(human(1140.0), "19m");
        assert_eq!(human(3900.0), "1h5m");
    }
}
