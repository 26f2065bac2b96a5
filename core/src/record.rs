//! Deployment records: what was deployed, when and from which commit, and how verification went,
//! as kept on each host in `current.json` and `history.jsonl`. The model and its pure parsing and
//! formatting; reading and writing them on a host is `apply::state`, in the `reconcile` binary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The format of the deployment records this reconcile writes, and the newest it reads. Records
/// carry it as `"format"`; one without the field was written before it existed, as format 1.
/// Raise it when a record changes so that an older reconcile would misread it: an older one
/// refuses a newer format by name instead of guessing.
pub const RECORD_FORMAT: u64 = 1;

/// What was deployed, when and from which commit, and how verification went. On the host it is
/// written with its format (`write_record`); shown (`history --format json`) without it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub unit: String,
    pub manifest: String,
    pub manifest_sha256: String,
    pub unit_sha256: String,
    pub git_commit: Option<String>,
    pub git_author: Option<String>,
    pub applied_at: String,
    pub applied_by: String,
    pub outcome: String,
    pub load_seconds: Option<f64>,
    pub plateau_service_bytes: Option<u64>,
    pub plateau_gpu_mib: Vec<u64>,
    /// The load's memory over time, at most 64 points (`learned::TRAJECTORY_POINTS`), for the
    /// next load to compare with. Absent in records from before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trajectory: Vec<Point>,
    /// Set by `reconcile rollback`: the deployment (history line) whose unit this one restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<usize>,
    /// The throughput gate's figures (`verify.benchmark`, or `reconcile bench`), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<crate::benchmark::BenchmarkRecord>,
    /// The quality gate's figures (`verify.quality`, or `reconcile quality`), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::quality::QualityFigures>,
    /// Set when the unit was applied live (`apply: { live: true }`): the running server was told
    /// the change and kept its earlier command line, which `status` then reads back. Absent in
    /// records from before it existed, which an older reconcile reads without it (unknown fields
    /// are ignored), so the format stays 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveRecord>,
}

/// What a live apply told the running server, and which process it told.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveRecord {
    /// [`argv_sha256`] of the told process's command line (`/proc/<pid>/cmdline`): its digest,
    /// not the argv itself, which may hold a secret.
    pub argv_sha256: String,
    /// The checkpoint the server was told to load (`/update_weights_from_disk`), when the weights
    /// moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// The values set (`/set_internal_state`), by flag name (`pp-max-micro-batch-size`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, serde_json::Value>,
}

/// The digest of a process's command line as [`LiveRecord::argv_sha256`] keeps it: the sha256 of
/// its arguments joined by NUL, as `/proc/<pid>/cmdline` holds them (less the last NUL).
pub fn argv_sha256(argv: &[String]) -> String {
    crate::digest::sha256(&argv.join("\0"))
}

/// One point of a load's memory trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Since the restart.
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_bytes: Option<u64>,
    /// The sum over the unit's GPUs, in MiB; absent without GPU tooling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_mib: Option<u64>,
}

/// The lines of `history.jsonl`, each a record or why it is not one.
pub fn parse_history(text: &str) -> Vec<Result<Record, RecordProblem>> {
    text.lines().map(parse_record).collect()
}

/// A record as written on the host: its format first, then its fields.
pub fn record_json(record: &Record) -> Result<String, serde_json::Error> {
    #[derive(Serialize)]
    struct Written<'a> {
        format: u64,
        #[serde(flatten)]
        record: &'a Record,
    }
    serde_json::to_string(&Written {
        format: RECORD_FORMAT,
        record,
    })
}

/// Why a deployment record (`current.json`, or a line of `history.jsonl`) is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordProblem {
    /// The host could not be asked for it (the connection, permissions).
    #[error("could not be read: {0}")]
    Unreadable(String),
    /// Damaged, or not a record at all.
    #[error("does not parse: {0}")]
    Unparsable(String),
    /// Written by a reconcile whose records this one does not know.
    #[error("was written by a newer reconcile (format {0}); upgrade reconcile")]
    Newer(u64),
}

/// A unit's deployment record that exists but cannot be used. Never to be taken for a missing
/// record: that would make apply restart a healthy server to "finish" an apply that did finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the deployment record {path} on {host} {problem}")]
pub struct RecordError {
    pub host: String,
    pub path: String,
    pub problem: RecordProblem,
}

/// Parses one record. The format is judged first: a newer record may not have the fields this
/// reconcile knows, and must be refused as newer, not as damaged. Unknown fields of a record of a
/// known format are ignored.
pub fn parse_record(text: &str) -> Result<Record, RecordProblem> {
    let unparsable = |e: &dyn std::fmt::Display| RecordProblem::Unparsable(e.to_string());
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| unparsable(&e))?;
    let format = match value.get("format") {
        None => 1,
        Some(f) => f
            .as_u64()
            .filter(|f| *f >= 1)
            .ok_or_else(|| unparsable(&format_args!("its `format` is {f}, not a format number")))?,
    };
    if format > RECORD_FORMAT {
        return Err(RecordProblem::Newer(format));
    }
    serde_json::from_value(value).map_err(|e| unparsable(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> Record {
        Record {
            unit: "s.service".into(),
            manifest: "manifests/s.yaml".into(),
            manifest_sha256: "m".into(),
            unit_sha256: "u".into(),
            git_commit: Some("0123456".into()),
            git_author: Some("Zoë <z@example.com>".into()),
            applied_at: "2026-01-01T00:00:00Z".into(),
            applied_by: "me@box pid 1".into(),
            outcome: "converged".into(),
            load_seconds: Some(1.5),
            plateau_service_bytes: None,
            plateau_gpu_mib: vec![75000],
            trajectory: Vec::new(),
            restored_from: Some(2),
            benchmark: None,
            quality: None,
            live: None,
        }
    }

    /// A record as reconcile wrote it before records had a format.
    const OLD: &str = r#"{"unit":"s.service","manifest":"manifests/s.yaml","manifest_sha256":"m","unit_sha256":"u","git_commit":null,"git_author":null,"applied_at":"t","applied_by":"me","outcome":"converged","load_seconds":null,"plateau_service_bytes":null,"plateau_gpu_mib":[]}"#;

    #[test]
    fn records_are_written_with_their_format_first_and_read_back() {
        let json = record_json(&record()).unwrap();
        assert!(
            json.starts_with(r#"{"format":1,"unit":"s.service","#),
            "{json}"
        );
        assert_eq!(parse_record(&json), Ok(record()));
        assert_eq!(parse_history(&format!("{json}\n{json}\n")).len(), 2);
    }

    #[test]
    fn records_from_before_the_format_field_still_read() {
        let r = parse_record(OLD).unwrap();
        assert_eq!((r.unit.as_str(), r.restored_from), ("s.service", None));
        assert_eq!(r.benchmark, None);
        assert!(!record_json(&r).unwrap().contains("benchmark"));
        // And a field this version does not know, in a record of a format it does.
        let extra = OLD.replacen('{', r#"{"format":1,"note":"from a patch release","#, 1);
        assert!(parse_record(&extra).is_ok());
    }

    #[test]
    fn a_live_apply_is_recorded_and_read_back_and_absent_when_none() {
        let argv: Vec<String> = ["/venv/bin/python3", "-m", "sglang.launch_server"]
            .map(String::from)
            .to_vec();
        let live = LiveRecord {
            argv_sha256: argv_sha256(&argv),
            weights: Some("/models/b".into()),
            values: [("pp-max-micro-batch-size".to_string(), 8.into())].into(),
        };
        let r = Record {
            live: Some(live.clone()),
            ..record()
        };
        let json = record_json(&r).unwrap();
        assert!(
            json.ends_with(&format!(
                r#","live":{{"argv_sha256":"{}","weights":"/models/b","values":{{"pp-max-micro-batch-size":8}}}}}}"#,
                live.argv_sha256
            )),
            "{json}"
        );
        assert_eq!(parse_record(&json), Ok(r));
        // The digest is of the arguments as the kernel keeps them, NUL between them.
        assert_eq!(
            argv_sha256(&argv),
            crate::digest::sha256("/venv/bin/python3\0-m\0sglang.launch_server")
        );
        // A record of no live apply says nothing of it.
        assert!(!record_json(&record()).unwrap().contains("live"));
        assert_eq!(parse_record(OLD).unwrap().live, None);
    }

    #[test]
    fn a_record_of_a_newer_format_is_refused_by_name_even_when_its_fields_changed() {
        let newer = r#"{"format":2,"deployment":{"unit":"s.service"}}"#;
        assert_eq!(parse_record(newer), Err(RecordProblem::Newer(2)));
        assert_eq!(
            RecordProblem::Newer(2).to_string(),
            "was written by a newer reconcile (format 2); upgrade reconcile"
        );
        let e = RecordError {
            host: "gpu-a".into(),
            path: "/var/lib/reconcile/s.service/current.json".into(),
            problem: RecordProblem::Newer(7),
        };
        assert_eq!(
            e.to_string(),
            "the deployment record /var/lib/reconcile/s.service/current.json on gpu-a was written by a newer reconcile (format 7); upgrade reconcile"
        );
    }

    #[test]
    fn damaged_records_are_errors_not_missing_records() {
        for bad in [
            "",
            "{",
            "[]",
            "null",
            "\u{feff}{}",
            r#"{"format":"2"}"#,
            r#"{"format":0}"#,
            r#"{"format":-1}"#,
            r#"{"format":1.5}"#,
            r#"{"unit":"s.service"}"#,
            &OLD[..OLD.len() - 1],
        ] {
            assert!(
                matches!(parse_record(bad), Err(RecordProblem::Unparsable(_))),
                "{bad:?}: {:?}",
                parse_record(bad)
            );
        }
        let huge = r#"{"format":18446744073709551615}"#;
        assert_eq!(parse_record(huge), Err(RecordProblem::Newer(u64::MAX)));
    }

    proptest! {
        #[test]
        fn any_text_is_a_record_or_a_reason_never_a_panic(text in any::<String>()) {
            let _ = parse_record(&text).map_err(|e| e.to_string());
            let _ = parse_history(&text);
        }

        #[test]
        fn any_record_reads_back_as_written(
            unit in any::<String>(),
            commit in proptest::option::of(any::<String>()),
            // Tenths, as verification measures them: serde_json reads these back exactly.
            load in proptest::option::of((0u32..10_000_000).prop_map(|t| f64::from(t) / 10.0)),
            gpus in proptest::collection::vec(any::<u64>(), 0..4),
        ) {
            let r = Record {
                unit,
                git_commit: commit,
                load_seconds: load,
                plateau_gpu_mib: gpus,
                ..record()
            };
            let json = record_json(&r).unwrap();
            // One line of history.jsonl each.
            prop_assert!(!json.contains('\n'));
            prop_assert_eq!(parse_record(&json), Ok(r));
        }
    }
}
