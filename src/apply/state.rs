//! What `reconcile` keeps on each host, per unit, under `/var/lib/reconcile/<unit>/` (0700):
//! the lock of the run working on it, the previous units (generations), and the deployment record.
//!
//! Two kinds of kept units, for two jobs:
//! - `generations/<unix nanos>.service`: the unit an apply *replaced*, written before the new one is
//!   installed, so an apply that fails can put it back (the newest 5);
//! - `deployed/<N>.service`: the unit a *successful* deployment installed, where N is the number of
//!   its line in `history.jsonl` (1 = oldest), so `reconcile rollback --to N` restores exactly what
//!   deployment N ran (the newest 10).

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::error::ApplyError;
use crate::remote::{error_chain, Host, RemoteError};

pub const STATE_DIR: &str = "/var/lib/reconcile";
/// Previous units kept per unit on a host.
const GENERATIONS_KEPT: usize = 5;
/// Units of successful deployments kept per unit on a host, for `reconcile rollback`.
pub const DEPLOYED_KEPT: usize = 10;

pub fn unit_dir(unit: &str) -> String {
    format!("{STATE_DIR}/{unit}")
}

/// Who is applying: written into the lock so a refused run can say who holds it.
#[derive(Debug, Clone)]
pub struct Owner {
    pub user: String,
    pub machine: String,
    pub pid: u32,
}

impl Owner {
    pub fn this_process() -> Owner {
        Owner {
            user: std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
            machine: std::fs::read_to_string("/etc/hostname")
                .unwrap_or_default()
                .trim()
                .to_string(),
            pid: std::process::id(),
        }
    }
}

/// How to treat a lock left by another run.
#[derive(Debug, Clone, Copy)]
pub struct LockPolicy {
    /// Break a lock older than `ttl` (a run that died on another machine).
    pub break_stale: bool,
    pub ttl: Duration,
}

/// Takes the unit's lock (`mkdir` is atomic: of two runs exactly one gets it). A lock whose owner
/// was a process on this machine that no longer exists is broken at once; an old lock from
/// elsewhere only with `--break-stale-lock`. Returns a note when a lock was broken.
pub async fn lock(
    host: &dyn Host,
    unit: &str,
    owner: &Owner,
    policy: LockPolicy,
) -> Result<Option<String>, ApplyError> {
    const TAKE: &str = "mkdir -p -m 0700 \"$1\" && mkdir -m 0700 \"$1/lock\" 2>/dev/null && printf '%s\\n' \"$2\" \"$3\" \"$4\" \"$5\" > \"$1/lock/owner\"";
    let dir = unit_dir(unit);
    let now = unix_now().to_string();
    let pid = owner.pid.to_string();
    let take = [
        "sh",
        "-c",
        TAKE,
        "sh",
        &dir,
        &owner.user,
        &owner.machine,
        &pid,
        &now,
    ];
    let mut note = None;
    for attempt in 0..2 {
        let failed = |e: RemoteError| ApplyError::LockFailed(error_chain(&e));
        let out = host.run(&take).await.map_err(failed)?;
        if out.status == 0 {
            return Ok(note);
        }
        let held = host
            .read_file(&format!("{dir}/lock/owner"))
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let fields: Vec<&str> = held.lines().collect();
        let (user, machine, pid, since) = match fields[..] {
            [u, m, p, t, ..] => (
                u,
                m,
                p.parse::<u32>().unwrap_or(0),
                t.parse::<u64>().unwrap_or(0),
            ),
            _ => ("?", "?", 0, 0),
        };
        let age = unix_now().saturating_sub(since);
        let holder = format!("{user}@{machine} pid {pid}, {age}s ago");
        let dead_here = machine == owner.machine
            && pid != 0
            && !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let stale = policy.break_stale && age > policy.ttl.as_secs();
        if attempt == 0 && (dead_here || stale) {
            host.run_ok(&["rm", "-rf", "--", &format!("{dir}/lock")])
                .await
                .map_err(failed)?;
            let why = if dead_here {
                "its process is gone"
            } else {
                "older than --lock-ttl"
            };
            note = Some(format!("broke a stale lock held by {holder} ({why})"));
            continue;
        }
        return Err(ApplyError::Locked {
            unit: unit.to_string(),
            host: host.name().to_string(),
            holder,
        });
    }
    Err(ApplyError::LockNotTaken {
        unit: unit.to_string(),
        host: host.name().to_string(),
    })
}

pub async fn unlock(host: &dyn Host, unit: &str) -> Result<(), RemoteError> {
    host.run_ok(&["rm", "-rf", "--", &format!("{}/lock", unit_dir(unit))])
        .await
        .map(|_| ())
}

/// Copies a unit's text into the generations, keeping the newest few; returns the copy's path.
pub async fn keep_generation(
    host: &dyn Host,
    unit: &str,
    text: &str,
) -> Result<String, RemoteError> {
    let dir = format!("{}/generations", unit_dir(unit));
    host.run_ok(&["mkdir", "-p", "-m", "0700", "--", &dir])
        .await?;
    let path = format!("{dir}/{}.service", unix_nanos());
    host.write_file(&path, text, "0600").await?;
    const PRUNE: &str = "cd \"$1\" && ls -1 | sort -n | head -n -\"$2\" | xargs -r rm -f --";
    host.run_ok(&["sh", "-c", PRUNE, "sh", &dir, &GENERATIONS_KEPT.to_string()])
        .await?;
    Ok(path)
}

/// The newest kept generation's text.
pub async fn newest_generation(host: &dyn Host, unit: &str) -> Result<Option<String>, RemoteError> {
    const NEWEST: &str = "cd \"$1\" 2>/dev/null || exit 0; f=$(ls -1 | sort -n | tail -n 1); [ -n \"$f\" ] && cat -- \"$f\"";
    let dir = format!("{}/generations", unit_dir(unit));
    let out = host.run(&["sh", "-c", NEWEST, "sh", &dir]).await?;
    Ok((out.status == 0 && !out.stdout.is_empty()).then_some(out.stdout))
}

/// The format of the deployment records this reconcile writes, and the newest it reads. Records
/// carry it as `"format"`; one without the field was written before it existed, as format 1.
/// Raise it when a record changes so that an older reconcile would misread it: an older one
/// refuses a newer format by name instead of guessing.
pub const RECORD_FORMAT: u64 = 1;

/// What was deployed, when and from which commit, and how verification went. On the host it is
/// written with its format (`write_record`); shown (`history --format json`) without it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Set by `reconcile rollback`: the deployment (history line) whose unit this one restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<usize>,
}

/// Writes `current.json`, keeps the deployed unit as `deployed/<N>.service` and appends the record
/// to `history.jsonl` as its line N. The copy goes first: a run cut off between the two leaves a
/// copy no line points at, which the next deployment (same N) overwrites, never a line without its
/// unit. The caller holds the unit's lock, so N cannot be taken by another run meanwhile.
pub async fn write_record(
    host: &dyn Host,
    record: &Record,
    unit_text: &str,
) -> Result<(), RemoteError> {
    let dir = unit_dir(&record.unit);
    let json = record_json(record).map_err(|e| RemoteError::Transport {
        host: host.name().to_string(),
        command: "write the deployment record".into(),
        source: Box::new(e),
    })?;
    host.write_file(&format!("{dir}/current.json"), &format!("{json}\n"), "0600")
        .await?;
    const LINES: &str = "[ -f \"$1\" ] && wc -l < \"$1\" || echo 0";
    let history = format!("{dir}/history.jsonl");
    let lines = host.run_ok(&["sh", "-c", LINES, "sh", &history]).await?;
    let n = lines.trim().parse::<usize>().unwrap_or(0) + 1;
    let deployed = format!("{dir}/deployed");
    host.run_ok(&["mkdir", "-p", "-m", "0700", "--", &deployed])
        .await?;
    host.write_file(&format!("{deployed}/{n}.service"), unit_text, "0600")
        .await?;
    const APPEND: &str = "umask 077; printf '%s\\n' \"$2\" >> \"$1\"";
    host.run_ok(&["sh", "-c", APPEND, "sh", &history, &json])
        .await?;
    const PRUNE: &str = "cd \"$1\" && ls -1 | sort -n | head -n -\"$2\" | xargs -r rm -f --";
    host.run_ok(&[
        "sh",
        "-c",
        PRUNE,
        "sh",
        &deployed,
        &DEPLOYED_KEPT.to_string(),
    ])
    .await?;
    Ok(())
}

/// Every record of `history.jsonl`, oldest first; line N is deployment N. A line that does not
/// parse (written by a newer reconcile, or damaged) is kept as the reason, so the numbers stay
/// right.
pub async fn read_history(
    host: &dyn Host,
    unit: &str,
) -> Result<Vec<Result<Record, RecordProblem>>, RemoteError> {
    let text = host
        .read_file(&format!("{}/history.jsonl", unit_dir(unit)))
        .await?
        .unwrap_or_default();
    Ok(parse_history(&text))
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

/// The deployments whose unit is kept under `deployed/`, ascending.
pub async fn deployed_numbers(host: &dyn Host, unit: &str) -> Result<Vec<usize>, RemoteError> {
    const LIST: &str = "cd \"$1\" 2>/dev/null || exit 0; ls -1";
    let dir = format!("{}/deployed", unit_dir(unit));
    let out = host.run_ok(&["sh", "-c", LIST, "sh", &dir]).await?;
    let mut numbers: Vec<usize> = out
        .lines()
        .filter_map(|l| l.strip_suffix(".service")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// The unit deployment `n` installed, when it is kept.
pub async fn read_deployed(
    host: &dyn Host,
    unit: &str,
    n: usize,
) -> Result<Option<String>, RemoteError> {
    host.read_file(&format!("{}/deployed/{n}.service", unit_dir(unit)))
        .await
}

/// A unit an apply replaced: when it was kept (unix nanos, its file name) and its sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub nanos: u128,
    pub sha256: String,
}

/// The kept generations, oldest first.
pub async fn generations(host: &dyn Host, unit: &str) -> Result<Vec<Generation>, RemoteError> {
    const LIST: &str = "cd \"$1\" 2>/dev/null || exit 0; for f in $(ls -1 | sort -n); do printf '%s %s\\n' \"$f\" \"$(sha256sum < \"$f\" | cut -d' ' -f1)\"; done";
    let dir = format!("{}/generations", unit_dir(unit));
    let out = host.run_ok(&["sh", "-c", LIST, "sh", &dir]).await?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (name, sha) = l.split_once(' ')?;
            Some(Generation {
                nanos: name.strip_suffix(".service")?.parse().ok()?,
                sha256: sha.to_string(),
            })
        })
        .collect())
}

/// The unit's last deployment record (`current.json`): `None` when there is none, an error when
/// there is one that cannot be read or parsed (see [`RecordError`]).
pub async fn read_record(host: &dyn Host, unit: &str) -> Result<Option<Record>, RecordError> {
    let path = format!("{}/current.json", unit_dir(unit));
    let read = host.read_file(&path).await;
    let error = |problem| RecordError {
        host: host.name().to_string(),
        path: path.clone(),
        problem,
    };
    match read {
        Ok(None) => Ok(None),
        Ok(Some(text)) => parse_record(&text).map(Some).map_err(error),
        Err(e) => Err(error(RecordProblem::Unreadable(error_chain(&e)))),
    }
}

pub fn sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// Generation names sort by time even when two applies fall in one second.
fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos()
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
            restored_from: Some(2),
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
        // And a field this version does not know, in a record of a format it does.
        let extra = OLD.replacen('{', r#"{"format":1,"note":"from a patch release","#, 1);
        assert!(parse_record(&extra).is_ok());
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
