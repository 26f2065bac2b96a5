//! `reconcile history` and `reconcile rollback`: the deployments each host keeps for a unit, and
//! putting one of them back.
//!
//! Every successful apply appends its record to `history.jsonl` and keeps the unit it installed as
//! `deployed/<N>.service`, N being the record's line (1 = oldest; see `apply::state`). History
//! lists those numbered deployments, marks the one running now, and lists the generations (units
//! an apply replaced) beside them, each tied to the deployment whose unit it is. Rollback restores
//! deployment N's kept unit through apply's own install, restart and staged verification.
//!
//! What is pure lives here (numbering, which deployment is current, which one a rollback takes,
//! the notes); `gather` reads a host; `rollback` runs the restore. The face's `report::history`
//! prints it.

mod gather;
pub mod rollback;

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

pub use gather::history_hosts;

use crate::digest::SHA_SHOWN;
use crate::state::{Generation, Record, RecordProblem};

/// A sha256 as shown: its first 12 characters. Records come from hosts: any text may be there.
fn short(sha: &str) -> &str {
    crate::digest::short(sha, SHA_SHOWN)
}

/// One line of `history.jsonl`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Deployment {
    /// The line number, 1 = oldest.
    pub n: usize,
    /// The record, unless its line could not be read.
    pub record: Option<Record>,
    /// Why the line is not a record, when it is not (written by a newer reconcile, damaged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// Its unit is saved under `deployed/`, so `rollback --to N` can restore it (JSON: `kept`).
    #[serde(rename = "kept")]
    pub saved: bool,
    /// The deployment the last apply recorded (`current.json`).
    pub current: bool,
}

/// A unit an apply replaced, saved to fall back on.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GenerationEntry {
    /// When the apply that replaced it saved it.
    #[serde(rename = "kept_at")]
    pub saved_at: String,
    pub unit_sha256: String,
    /// The newest deployment that installed this same unit, when one did.
    pub deployment: Option<usize>,
}

/// Files an apply moved out of systemd's way (`systemd.dropins: replace`), kept on the host.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MovedAside {
    /// When the apply moved them.
    pub moved_at: String,
    /// The record on the host that holds their text (a mask as the link it was).
    pub record: String,
    /// Where each one was.
    pub paths: Vec<String>,
}

/// A unit's history on one host.
#[derive(Debug, Clone, Serialize)]
pub struct HostHistory {
    pub host: String,
    pub unit: String,
    pub deployments: Vec<Deployment>,
    pub generations: Vec<GenerationEntry>,
    pub moved_aside: Vec<MovedAside>,
    pub notes: Vec<String>,
    pub error: Option<String>,
}

/// A server group's history, as one server: a note for every rank saying which deployments the
/// whole group shares (the same number on every rank, applied from the same manifest: what
/// `reconcile rollback` can take the group back to) and which it does not.
pub fn group_notes(histories: &mut [HostHistory]) {
    if histories.len() < 2 || histories.iter().any(|h| h.error.is_some()) {
        return;
    }
    let digest = |h: &HostHistory, n: usize| {
        h.deployments
            .iter()
            .find(|d| d.n == n)
            .and_then(|d| d.record.as_ref())
            .map(|r| r.manifest_sha256.clone())
    };
    let numbers: std::collections::BTreeSet<usize> = histories
        .iter()
        .flat_map(|h| h.deployments.iter().map(|d| d.n))
        .collect();
    let (mut shared, mut apart) = (Vec::new(), Vec::new());
    for n in numbers {
        let first = digest(&histories[0], n);
        let kept = histories
            .iter()
            .all(|h| h.deployments.iter().any(|d| d.n == n && d.saved));
        if first.is_some() && kept && histories.iter().all(|h| digest(h, n) == first) {
            shared.push(n.to_string());
        } else {
            apart.push(n.to_string());
        }
    }
    let hosts: Vec<&str> = histories.iter().map(|h| h.host.as_str()).collect();
    let mut note = format!(
        "one server over {} hosts ({}): deployments every rank shares, to roll the group back to: {}",
        hosts.len(),
        hosts.join(", "),
        if shared.is_empty() { "none".to_string() } else { shared.join(", ") }
    );
    if !apart.is_empty() {
        note.push_str(&format!(
            "; not the group's (missing, not kept or from another manifest on some rank): {}",
            apart.join(", ")
        ));
    }
    for h in histories.iter_mut() {
        h.notes.insert(0, note.clone());
    }
}

/// Numbers the history's lines and marks the saved and the current ones. The current deployment
/// is the newest line equal to `current.json` (a later apply appends, so the last one normally).
pub fn deployments(
    history: Vec<Result<Record, RecordProblem>>,
    current: Option<&Record>,
    kept: &[usize],
) -> Vec<Deployment> {
    let is_current = |r: &Result<Record, RecordProblem>| matches!((r, current), (Ok(r), Some(c)) if r.applied_at == c.applied_at && r.unit_sha256 == c.unit_sha256);
    let current_n = history.iter().rposition(is_current).map(|i| i + 1);
    history
        .into_iter()
        .enumerate()
        .map(|(i, line)| {
            let (record, unreadable) = match line {
                // `reconcile bench` adds figures to `current.json` alone (history is append-only).
                Ok(mut record) if current_n == Some(i + 1) && record.benchmark.is_none() => {
                    record.benchmark = current.and_then(|c| c.benchmark.clone());
                    (Some(record), None)
                }
                Ok(record) => (Some(record), None),
                Err(problem) => (None, Some(problem.to_string())),
            };
            Deployment {
                n: i + 1,
                record,
                unreadable,
                saved: kept.contains(&(i + 1)),
                current: current_n == Some(i + 1),
            }
        })
        .collect()
}

/// Ties each generation to the newest deployment of the same unit.
pub fn generations(generations: &[Generation], deployments: &[Deployment]) -> Vec<GenerationEntry> {
    generations
        .iter()
        .map(|g| GenerationEntry {
            saved_at: humantime::format_rfc3339_seconds(
                UNIX_EPOCH + Duration::from_nanos(g.nanos.min(u64::MAX as u128) as u64),
            )
            .to_string(),
            unit_sha256: g.sha256.clone(),
            deployment: deployments
                .iter()
                .rev()
                .find(|d| d.record.as_ref().is_some_and(|r| r.unit_sha256 == g.sha256))
                .map(|d| d.n),
        })
        .collect()
}

/// The records of files moved aside, by when (their names are the nanoseconds of the move).
pub fn moved_aside(records: &[crate::apply::aside::Aside]) -> Vec<MovedAside> {
    records
        .iter()
        .map(|a| {
            let nanos: u128 = a
                .record
                .rsplit('/')
                .next()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            MovedAside {
                moved_at: humantime::format_rfc3339_seconds(
                    UNIX_EPOCH + Duration::from_nanos(nanos.min(u64::MAX as u128) as u64),
                )
                .to_string(),
                record: a.record.clone(),
                paths: a
                    .files
                    .iter()
                    .map(|f| {
                        if f.mask {
                            format!("{} (mask)", f.path)
                        } else {
                            f.path.clone()
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// Notes about the unit on disk against the history: hand edits show here too.
pub fn disk_notes(deployments: &[Deployment], disk_sha: Option<&str>) -> Vec<String> {
    let current = deployments.iter().find(|d| d.current);
    let current_sha = current
        .and_then(|d| d.record.as_ref())
        .map(|r| r.unit_sha256.as_str());
    match (disk_sha, current_sha) {
        (None, _) => vec!["the host has no unit file for it now".into()],
        (Some(disk), Some(sha)) if disk == sha => Vec::new(),
        (Some(disk), _) => {
            let same = deployments
                .iter()
                .rev()
                .find(|d| d.record.as_ref().is_some_and(|r| r.unit_sha256 == disk));
            vec![match same {
                Some(d) => format!(
                    "the unit on disk ({}) is deployment {}'s, not the current one's",
                    short(disk),
                    d.n
                ),
                None => format!(
                    "the unit on disk ({}) is none of these deployments (edited on the host?)",
                    short(disk)
                ),
            }]
        }
    }
}

/// The deployment a rollback restores, and how many unreadable lines of `history.jsonl` the
/// default choice passed over to find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub n: usize,
    pub skipped: usize,
}

/// `skipped 2 unreadable lines of history.jsonl`.
pub fn skipped_lines(n: usize) -> String {
    let lines = if n == 1 { "line" } else { "lines" };
    format!("skipped {n} unreadable {lines} of history.jsonl")
}

/// The deployments a rollback can restore (kept, their record readable), as an error names them:
/// `kept: 1, 2` or `none is kept`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available(pub Vec<usize>);

impl std::fmt::Display for Available {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none is kept");
        }
        let kept: Vec<String> = self.0.iter().map(usize::to_string).collect();
        write!(f, "kept: {}", kept.join(", "))
    }
}

/// Why no deployment can be chosen for a rollback; each names the deployments that can be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChooseError {
    /// `--to N` names no deployment of the `recorded` ones.
    #[error("there is no deployment {n} ({recorded} recorded; {available})")]
    NoSuch {
        n: usize,
        recorded: usize,
        available: Available,
    },
    /// `--to N`'s line of `history.jsonl` cannot be used; `why` completes "it ...".
    #[error("deployment {n}'s line of history.jsonl cannot be used: it {why} ({available})")]
    Unreadable {
        n: usize,
        why: String,
        available: Available,
    },
    /// `--to N`'s unit is no longer kept.
    #[error(
        "deployment {n}'s unit is not kept (the newest {} are; {available})",
        crate::state::DEPLOYED_SAVED
    )]
    NotSaved { n: usize, available: Available },
    /// No `--to N`, and no deployment is marked current to go back from.
    #[error("no current deployment is recorded; say which with --to N ({available})")]
    NoCurrent { available: Available },
    /// No `--to N`, and every kept deployment before the current one installed the same unit;
    /// `skipped` unreadable lines were passed over.
    #[error("no deployment before the current one ({current}) installed another unit ({available}){}", if *.skipped > 0 { format!("; {}", skipped_lines(*.skipped)) } else { String::new() })]
    NoOther {
        current: usize,
        available: Available,
        skipped: usize,
    },
}

/// Which deployment a rollback restores: `to` when it is saved; by default the newest deployment
/// before the current one that installed a different unit (restoring the same unit would change
/// nothing), passing over lines that cannot be read. The error names the deployments that can be
/// restored.
pub fn choose(deployments: &[Deployment], to: Option<usize>) -> Result<Choice, ChooseError> {
    let available = Available(
        deployments
            .iter()
            .filter(|d| d.saved && d.record.is_some())
            .map(|d| d.n)
            .collect(),
    );
    if let Some(n) = to {
        return match deployments.iter().find(|d| d.n == n) {
            None => Err(ChooseError::NoSuch {
                n,
                recorded: deployments.len(),
                available,
            }),
            Some(d) if d.record.is_none() => Err(ChooseError::Unreadable {
                n,
                why: d
                    .unreadable
                    .clone()
                    .unwrap_or_else(|| "is unreadable".into()),
                available,
            }),
            Some(d) if !d.saved => Err(ChooseError::NotSaved { n, available }),
            Some(_) => Ok(Choice { n, skipped: 0 }),
        };
    }
    let Some(current) = deployments.iter().find(|d| d.current) else {
        return Err(ChooseError::NoCurrent { available });
    };
    let current_sha = current.record.as_ref().map(|r| r.unit_sha256.as_str());
    let mut skipped = 0;
    for d in deployments
        .iter()
        .rev()
        .filter(|d| d.n < current.n && d.saved)
    {
        match &d.record {
            None => skipped += 1,
            Some(r) if Some(r.unit_sha256.as_str()) != current_sha => {
                return Ok(Choice { n: d.n, skipped })
            }
            Some(_) => {}
        }
    }
    Err(ChooseError::NoOther {
        current: current.n,
        available,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{history::render, Format};

    fn record(unit_sha: &str, at: &str) -> Record {
        Record {
            unit: "s.service".into(),
            manifest: "manifests/s.yaml".into(),
            manifest_sha256: "feedbeef".repeat(8),
            unit_sha256: unit_sha.into(),
            git_commit: Some("0123456789abcdef".into()),
            applied_at: at.into(),
            applied_by: "me".into(),
            outcome: "converged".into(),
            load_seconds: Some(1.25),
            ..Default::default()
        }
    }

    fn three() -> Vec<Deployment> {
        let history = vec![
            Ok(record("aaa", "t1")),
            Ok(record("bbb", "t2")),
            Ok(record("bbb", "t3")),
        ];
        deployments(history, Some(&record("bbb", "t3")), &[1, 2, 3])
    }

    #[test]
    fn lines_are_numbered_from_the_oldest_and_the_current_one_is_marked() {
        let d = three();
        assert_eq!(d.iter().map(|d| d.n).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            d.iter().map(|d| d.current).collect::<Vec<_>>(),
            [false, false, true]
        );
    }

    #[test]
    fn the_default_rollback_skips_deployments_of_the_same_unit() {
        assert_eq!(choose(&three(), None), Ok(Choice { n: 1, skipped: 0 }));
        assert_eq!(choose(&three(), Some(2)).map(|c| c.n), Ok(2));
    }

    #[test]
    fn a_missing_or_unkept_deployment_is_refused_naming_the_kept_ones() {
        let err = choose(&three(), Some(7)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "there is no deployment 7 (3 recorded; kept: 1, 2, 3)"
        );
        let history = vec![Ok(record("aaa", "t1")), Ok(record("bbb", "t2"))];
        let d = deployments(history, Some(&record("bbb", "t2")), &[2]);
        let err = choose(&d, Some(1)).unwrap_err();
        assert!(
            err.to_string().contains("deployment 1's unit is not kept"),
            "{err}"
        );
        assert!(err.to_string().contains("kept: 2"), "{err}");
        let err = choose(&d, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("no deployment before the current one (2)"),
            "{err}"
        );
    }

    #[test]
    fn without_a_current_record_a_rollback_must_say_which() {
        let d = deployments(vec![Ok(record("aaa", "t1"))], None, &[1]);
        assert!(choose(&d, None).unwrap_err().to_string().contains("--to N"));
        assert_eq!(choose(&d, Some(1)).map(|c| c.n), Ok(1));
    }

    #[test]
    fn generations_point_at_the_deployment_of_the_same_unit() {
        let g = generations(
            &[
                Generation {
                    nanos: 1_700_000_000_000_000_000,
                    sha256: "aaa".into(),
                },
                Generation {
                    nanos: 1_700_000_001_000_000_000,
                    sha256: "zzz".into(),
                },
            ],
            &three(),
        );
        assert_eq!(g[0].deployment, Some(1));
        assert_eq!(g[0].saved_at, "2023-11-14T22:13:20Z");
        assert_eq!(g[1].deployment, None);
    }

    #[test]
    fn a_hand_edited_unit_is_noted() {
        assert!(disk_notes(&three(), Some("bbb")).is_empty());
        assert_eq!(
            disk_notes(&three(), Some("aaa")),
            ["the unit on disk (aaa) is deployment 1's, not the current one's"]
        );
        assert!(disk_notes(&three(), Some("ccc"))[0].contains("edited on the host"));
    }

    #[test]
    fn text_marks_the_current_deployment() {
        let h = HostHistory {
            host: "gpu-a".into(),
            unit: "s.service".into(),
            deployments: three(),
            generations: Vec::new(),
            moved_aside: Vec::new(),
            notes: Vec::new(),
            error: None,
        };
        let out = render(&[h], Format::Text);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "gpu-a s.service: 3 deployments, current: 3");
        assert!(lines[4].starts_with("   *   3  t3"), "{out}");
        assert!(lines[2].contains("0123456  feedbeeffeed  aaa"), "{out}");
        assert!(lines[2].ends_with("1.2s  yes   converged"), "{out}");
    }

    fn newer() -> RecordProblem {
        RecordProblem::Newer(2)
    }

    #[test]
    fn the_default_rollback_passes_over_unreadable_lines_and_counts_them() {
        // 1 installed another unit; 2 and 3 cannot be read; 4 is current.
        let history = vec![
            Ok(record("aaa", "t1")),
            Err(newer()),
            Err(RecordProblem::Unparsable("EOF while parsing".into())),
            Ok(record("bbb", "t4")),
        ];
        let d = deployments(history, Some(&record("bbb", "t4")), &[1, 2, 3, 4]);
        assert_eq!(choose(&d, None), Ok(Choice { n: 1, skipped: 2 }));
        assert_eq!(
            skipped_lines(2),
            "skipped 2 unreadable lines of history.jsonl"
        );
        assert_eq!(
            skipped_lines(1),
            "skipped 1 unreadable line of history.jsonl"
        );
        // Nothing readable before the current one: refused, never a panic, and saying why.
        let history = vec![Err(newer()), Ok(record("bbb", "t2"))];
        let d = deployments(history, Some(&record("bbb", "t2")), &[1, 2]);
        let err = choose(&d, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("skipped 1 unreadable line of history.jsonl"),
            "{err}"
        );
        // Asked for by number: refused with the line's reason.
        let err = choose(&d, Some(1)).unwrap_err();
        assert!(
            err.to_string().contains("deployment 1's line of history.jsonl cannot be used: it was written by a newer reconcile (format 2); upgrade reconcile"),
            "{err}"
        );
        assert!(err.to_string().contains("kept: 2"), "{err}");
    }

    #[test]
    fn unreadable_lines_show_why_in_text_and_json() {
        let history = vec![Err(newer()), Ok(record("bbb", "t2"))];
        let h = HostHistory {
            host: "gpu-a".into(),
            unit: "s.service".into(),
            deployments: deployments(history, Some(&record("bbb", "t2")), &[1, 2]),
            generations: Vec::new(),
            moved_aside: Vec::new(),
            notes: Vec::new(),
            error: None,
        };
        let out = render(std::slice::from_ref(&h), Format::Text);
        assert!(
            out.contains("     1  (unreadable record: was written by a newer reconcile (format 2); upgrade reconcile)"),
            "{out}"
        );
        let json: serde_json::Value = serde_json::from_str(&render(&[h], Format::Json)).unwrap();
        let lines = &json["hosts"][0]["deployments"];
        assert_eq!(lines[0]["record"], serde_json::Value::Null);
        assert!(lines[0]["unreadable"]
            .as_str()
            .unwrap()
            .contains("format 2"));
        // A readable line's JSON is as before: no `unreadable` key, no `format`.
        assert!(lines[1].get("unreadable").is_none());
        assert!(lines[1]["record"].get("format").is_none());
    }

    #[test]
    fn non_ascii_shas_and_commits_from_a_host_do_not_panic() {
        let mut r = record("ééééééééééééé", "t1");
        r.git_commit = Some("日本語のコミット番号".into());
        r.manifest_sha256 = "🦀".repeat(20);
        let d = deployments(vec![Ok(r)], None, &[1]);
        let h = HostHistory {
            host: "gpu-a".into(),
            unit: "s.service".into(),
            deployments: d.clone(),
            generations: generations(
                &[Generation {
                    nanos: 1,
                    sha256: "ü".repeat(30),
                }],
                &d,
            ),
            moved_aside: moved_aside(&[crate::apply::aside::Aside {
                record: "/var/lib/reconcile/s.service/aside/1700000000000000000.json".into(),
                files: vec![crate::unit_files::Moved {
                    path: "/etc/systemd/system/s.service.d/über.conf".into(),
                    mask: false,
                    text: String::new(),
                    mode: None,
                }],
            }]),
            notes: disk_notes(&d, Some("ñññññññññññññññ")),
            error: None,
        };
        let out = render(&[h], Format::Text);
        assert!(
            out.contains("2023-11-14T22:13:20Z  /etc/systemd/system/s.service.d/über.conf"),
            "{out}"
        );
        assert!(out.contains("日本語のコミッ  "), "{out}");
        assert!(out.contains(&"🦀".repeat(12)), "{out}");
        assert!(out.contains(&format!("unit {}", "ü".repeat(12))), "{out}");
        assert!(out.contains("(ññññññññññññ)"), "{out}");
    }
}
