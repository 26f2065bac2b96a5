//! Prometheus metrics of the units reconcile manages, in the text exposition format (0.0.4): what
//! `reconcile status --format prometheus` prints for push mode, and what `reconcile agent
//! --metrics-file` writes after every round for node_exporter's textfile collector. Pure: the
//! caller gathers the figures (a unit's status and its last deployment record) and the time.
//!
//! Naming follows Prometheus' conventions: a `reconcile_` prefix, base units in the name
//! (`_seconds`, `_timestamp_seconds`), one metric per meaning, and labels for what varies
//! (`service`, `unit`, `host`; `outcome` as a state set: every known outcome is a series, the
//! current one 1, the others 0, so a dashboard can alert on `reconcile_last_outcome{outcome=
//! "rolled_back"} == 1` without the series coming and going).

use std::fmt::Write;

use crate::outcome::Outcome;

/// One unit on one host, as far as it is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitMetrics {
    pub service: String,
    pub unit: String,
    pub host: String,
    /// Manifest, record, unit on disk and running process agree (`None`: it could not be read).
    pub in_sync: Option<bool>,
    /// When the last deployment was recorded, seconds since the Unix epoch.
    pub last_apply_unix: Option<f64>,
    /// The last apply's outcome: every [`Outcome`] is a series of its state set.
    pub outcome: Option<Outcome>,
    /// Seconds from the last restart to the server ready (`/health` 200), as verification saw it.
    pub verification_seconds: Option<f64>,
    /// The last benchmark's output tokens per second, per concurrency level.
    pub benchmark: Vec<(u32, f64)>,
}

struct Family {
    name: &'static str,
    help: &'static str,
}

const IN_SYNC: Family = Family {
    name: "reconcile_unit_in_sync",
    help: "1 when the manifest, the last deployment, the unit on disk and the running process agree, 0 when not",
};
const READABLE: Family = Family {
    name: "reconcile_unit_readable",
    help: "1 when the host and the unit could be read, 0 when not (the other series of the unit are then absent)",
};
const LAST_APPLY: Family = Family {
    name: "reconcile_last_apply_timestamp_seconds",
    help: "When the unit's last deployment was recorded, in seconds since the Unix epoch",
};
const OUTCOME: Family = Family {
    name: "reconcile_last_outcome",
    help:
        "The unit's last apply outcome, as a state set: 1 for the outcome it had, 0 for the others",
};
const VERIFICATION: Family = Family {
    name: "reconcile_verification_seconds",
    help: "Seconds from the unit's last restart to its server answering /health 200, as verification measured them",
};
const BENCHMARK: Family = Family {
    name: "reconcile_benchmark_output_tokens_per_second",
    help: "Output tokens per second of the unit's last benchmark, per concurrency level",
};

/// The exposition text for `units`: each family's HELP and TYPE (all gauges) once, then its
/// series, in the units' order. Families with no series are left out.
pub fn render(units: &[UnitMetrics]) -> String {
    let mut out = String::new();
    family(&mut out, &READABLE, units, |u, put| {
        put(&[], if u.in_sync.is_some() { 1.0 } else { 0.0 })
    });
    family(&mut out, &IN_SYNC, units, |u, put| {
        if let Some(in_sync) = u.in_sync {
            put(&[], f64::from(u8::from(in_sync)));
        }
    });
    family(&mut out, &LAST_APPLY, units, |u, put| {
        if let Some(at) = u.last_apply_unix {
            put(&[], at);
        }
    });
    family(&mut out, &OUTCOME, units, |u, put| {
        if let Some(outcome) = u.outcome {
            for known in Outcome::ALL {
                put(
                    &[("outcome", known.name())],
                    f64::from(u8::from(known == outcome)),
                );
            }
        }
    });
    family(&mut out, &VERIFICATION, units, |u, put| {
        if let Some(seconds) = u.verification_seconds {
            put(&[], seconds);
        }
    });
    family(&mut out, &BENCHMARK, units, |u, put| {
        for (concurrency, tps) in &u.benchmark {
            put(&[("concurrency", &concurrency.to_string())], *tps);
        }
    });
    out
}

/// One family: its series from `series(unit, put)`, where `put(extra labels, value)` adds one.
fn family(
    out: &mut String,
    f: &Family,
    units: &[UnitMetrics],
    series: impl Fn(&UnitMetrics, &mut dyn FnMut(&[(&str, &str)], f64)),
) {
    let mut lines = String::new();
    for u in units {
        series(u, &mut |extra, value| {
            let mut labels = vec![
                ("service", u.service.as_str()),
                ("unit", u.unit.as_str()),
                ("host", u.host.as_str()),
            ];
            labels.extend_from_slice(extra);
            let labels: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = writeln!(
                lines,
                "{}{{{}}} {}",
                f.name,
                labels.join(","),
                number(value)
            );
        });
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
    let _ = writeln!(out, "# TYPE {} gauge", f.name);
    out.push_str(&lines);
}

/// A label value as the format wants it: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers without a fraction, others as Rust prints them (shortest exact).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(host: &str) -> UnitMetrics {
        UnitMetrics {
            service: "sglang-qwen".into(),
            unit: "sglang-qwen.service".into(),
            host: host.into(),
            in_sync: Some(true),
            last_apply_unix: Some(1_764_700_000.0),
            outcome: Some(Outcome::Converged),
            verification_seconds: Some(12.5),
            benchmark: vec![(1, 40.25), (64, 1800.0)],
        }
    }

    #[test]
    fn every_family_is_declared_once_and_labels_each_series() {
        let text = render(&[unit("gpu-a"), unit("gpu-b")]);
        assert_eq!(
            text.matches("# TYPE reconcile_unit_in_sync gauge").count(),
            1
        );
        assert!(text.contains(
            "reconcile_unit_in_sync{service=\"sglang-qwen\",unit=\"sglang-qwen.service\",host=\"gpu-b\"} 1\n"
        ));
        assert!(text.contains("reconcile_last_apply_timestamp_seconds{service=\"sglang-qwen\",unit=\"sglang-qwen.service\",host=\"gpu-a\"} 1764700000\n"));
        assert!(text.contains("reconcile_verification_seconds{service=\"sglang-qwen\",unit=\"sglang-qwen.service\",host=\"gpu-a\"} 12.5\n"));
        assert!(text.contains("reconcile_benchmark_output_tokens_per_second{service=\"sglang-qwen\",unit=\"sglang-qwen.service\",host=\"gpu-a\",concurrency=\"64\"} 1800\n"));
        // The outcome is a state set: one series per known outcome, the current one 1.
        let outcome: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("reconcile_last_outcome{") && l.contains("gpu-a"))
            .collect();
        assert_eq!(outcome.len(), Outcome::ALL.len());
        assert_eq!(outcome.iter().filter(|l| l.ends_with(" 1")).count(), 1);
        assert!(outcome
            .iter()
            .any(|l| l.contains("outcome=\"converged\"} 1")));
    }

    #[test]
    fn an_unreadable_unit_has_only_its_readable_series_and_values_are_escaped() {
        let gone = UnitMetrics {
            service: "s".into(),
            unit: "s.service".into(),
            host: "a\"b\\c".into(),
            ..Default::default()
        };
        let text = render(&[gone]);
        assert_eq!(
            text,
            "# HELP reconcile_unit_readable 1 when the host and the unit could be read, 0 when not (the other series of the unit are then absent)\n# TYPE reconcile_unit_readable gauge\nreconcile_unit_readable{service=\"s\",unit=\"s.service\",host=\"a\\\"b\\\\c\"} 0\n"
        );
    }
}
