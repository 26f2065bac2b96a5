//! Plan files: `reconcile plan --out plan.json` records what a reviewer saw, and
//! `reconcile apply plan.json` applies exactly that, or refuses a host where it no longer holds.
//!
//! A plan holds for a unit while three things are as they were when it was made: the unit the
//! manifests render (its sha256), the unit file on the host (its sha256, or its absence), and the
//! SGLang version installed for the unit's Python. Any other difference is a stale plan: applying
//! it would change something nobody reviewed. The file holds hashes and the redacted diff, never a
//! unit's text, so it can be attached to a pull request like the plan's report.
//!
//! The model, its JSON and the comparison are pure, here; writing and finding plan files and
//! reading the clock are the binary's `plan_file`, and apply does the checking on the host, under
//! the unit's lock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::digest::{sha256, short as short_digest};
use crate::dry_run::PlanOutcome;
pub use crate::plan::PlannedState;
use crate::plan::Verdict;
use crate::targets::Target;

/// The top-level `format` of every plan file: how `apply` tells a plan from a manifest.
pub const FORMAT: &str = "reconcile-plan";
/// Bumped when an older reconcile could misread a newer file.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    pub format: String,
    pub format_version: u32,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub reconcile_version: String,
    /// The commit of the manifests' git work tree, when they are in one.
    pub git_commit: Option<String>,
    /// The manifest files and folders as given to `plan`, relative to its working directory;
    /// `apply` loads these again.
    pub manifests: Vec<String>,
    pub targets: Vec<PlannedTarget>,
}

/// One unit on one host, as planned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedTarget {
    pub host: String,
    pub unit: String,
    /// The manifest file the unit is rendered from, relative to `plan`'s working directory.
    pub source: String,
    #[serde(flatten)]
    pub status: Status,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Status {
    Planned {
        verdict: Verdict,
        #[serde(flatten)]
        state: PlannedState,
        /// The reviewed change, secrets redacted (as every report shows it).
        diff: String,
    },
    /// The host could not be planned; such a unit is refused by `apply`.
    Failed { error: String },
}

/// A planned unit `apply` cannot apply, found before any host is contacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub host: String,
    pub unit: String,
    pub source: String,
    pub why: Stale,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write the plan file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the plan file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is a plan file but cannot be read as one")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} is a plan file of format version {found}; this reconcile reads version {FORMAT_VERSION} at most: apply it with the reconcile that made it, or plan again")]
    Version { path: PathBuf, found: u64 },
    #[error("a plan file is applied on its own: {path} names its manifests; give no other paths")]
    NotAlone { path: PathBuf },
}

/// Why a planned unit is not applied. Every variant leaves the host untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("the manifests changed since the plan was made: {unit} on {host} renders differently now ({} -> {}); plan again", short(Some(.planned)), short(Some(.now)))]
    Manifests {
        host: String,
        unit: String,
        planned: String,
        now: String,
    },
    #[error("the manifests changed since the plan was made: {unit} on {host} is not in them any more; plan again")]
    Gone { host: String, unit: String },
    #[error("stale plan: the unit on {host} changed since the plan ({} -> {}); plan again", short(.planned.as_deref()), short(.now.as_deref()))]
    Unit {
        host: String,
        planned: Option<String>,
        now: Option<String>,
    },
    #[error("stale plan: SGLang on {host} was {} when planned, is {} now; plan again", version(.planned), version(.now))]
    Sglang {
        host: String,
        planned: Option<String>,
        now: Option<String>,
    },
    #[error("{unit} on {host} could not be planned ({error}); plan again")]
    NotPlanned {
        host: String,
        unit: String,
        error: String,
    },
}

/// The first 8 hex digits of a sha256, or `absent` for a file that was not there.
fn short(sha: Option<&str>) -> &str {
    sha.map_or("absent", |s| short_digest(s, 8))
}

fn version(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("not installed")
}

impl PlanFile {
    /// The plan of a `plan` run: every unit it planned, failed ones included, made at
    /// `created_at` by reconcile `reconcile_version`.
    pub fn new(
        manifests: &[PathBuf],
        git_commit: Option<String>,
        outcomes: &[PlanOutcome],
        created_at: SystemTime,
        reconcile_version: &str,
    ) -> Self {
        let targets = outcomes
            .iter()
            .map(|o| match o {
                PlanOutcome::Planned(p) => {
                    let state = p.recorded.clone().unwrap_or(PlannedState {
                        desired_sha256: String::new(),
                        current_sha256: None,
                        sglang_version: None,
                    });
                    PlannedTarget {
                        host: p.host.clone(),
                        unit: p.unit.clone(),
                        source: p.source.clone(),
                        status: Status::Planned {
                            verdict: p.verdict,
                            state,
                            diff: p.diff.clone(),
                        },
                    }
                }
                PlanOutcome::Error {
                    host,
                    unit,
                    source,
                    error,
                } => PlannedTarget {
                    host: host.clone(),
                    unit: unit.clone(),
                    source: source.clone(),
                    status: Status::Failed {
                        error: error.clone(),
                    },
                },
            })
            .collect();
        PlanFile {
            format: FORMAT.to_string(),
            format_version: FORMAT_VERSION,
            created_at: humantime::format_rfc3339_seconds(created_at).to_string(),
            reconcile_version: reconcile_version.to_string(),
            git_commit,
            manifests: manifests.iter().map(|p| p.display().to_string()).collect(),
            targets,
        }
    }

    /// `None` when the text is not a plan file (no format marker); `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Option<PlanFile>, Error> {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
            return Ok(None);
        };
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Ok(None);
        }
        let found = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if found > u64::from(FORMAT_VERSION) {
            return Err(Error::Version {
                path: path.to_path_buf(),
                found,
            });
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|source| Error::Parse {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The manifest paths to load again.
    pub fn manifest_paths(&self) -> Vec<PathBuf> {
        self.manifests.iter().map(PathBuf::from).collect()
    }

    /// Keeps exactly the planned units of `targets`, each carrying what its plan expects; the
    /// planned units that cannot be applied (planning failed, gone from the manifests, rendered
    /// differently now) come back as refusals, with the manifest they came from.
    pub fn select(&self, targets: Vec<Target>) -> (Vec<Target>, Vec<Refusal>) {
        let mut by_key: HashMap<(String, String), Target> = targets
            .into_iter()
            .map(|t| ((t.host.clone(), t.desired.unit.clone()), t))
            .collect();
        let mut selected = Vec::new();
        let mut refused = Vec::new();
        for p in &self.targets {
            let target = by_key.remove(&(p.host.clone(), p.unit.clone()));
            let expected = match &p.status {
                Status::Failed { error } => {
                    refused.push(p.refusal(
                        p.source.clone(),
                        Stale::NotPlanned {
                            host: p.host.clone(),
                            unit: p.unit.clone(),
                            error: error.clone(),
                        },
                    ));
                    continue;
                }
                Status::Planned { state, .. } => state.clone(),
            };
            let Some(mut target) = target else {
                refused.push(p.refusal(
                    p.source.clone(),
                    Stale::Gone {
                        host: p.host.clone(),
                        unit: p.unit.clone(),
                    },
                ));
                continue;
            };
            let now = sha256(&target.desired.text);
            if now != expected.desired_sha256 {
                refused.push(p.refusal(
                    target.source,
                    Stale::Manifests {
                        host: p.host.clone(),
                        unit: p.unit.clone(),
                        planned: expected.desired_sha256,
                        now,
                    },
                ));
                continue;
            }
            target.expected = Some(expected);
            selected.push(target);
        }
        // The same order as any run: by host, then unit.
        selected.sort_by(|a, b| (&a.host, &a.desired.unit).cmp(&(&b.host, &b.desired.unit)));
        (selected, refused)
    }
}

impl PlannedTarget {
    fn refusal(&self, source: String, why: Stale) -> Refusal {
        Refusal {
            host: self.host.clone(),
            unit: self.unit.clone(),
            source,
            why,
        }
    }
}

/// The unit file differs from the one planned against (changed, appeared or disappeared).
pub fn unit_staleness(
    host: &str,
    planned: &PlannedState,
    current_sha256: Option<&str>,
) -> Option<Stale> {
    (planned.current_sha256.as_deref() != current_sha256).then(|| Stale::Unit {
        host: host.to_string(),
        planned: planned.current_sha256.clone(),
        now: current_sha256.map(str::to_string),
    })
}

/// Everything that makes a plan stale on a host, read under the unit's lock: the rendered unit,
/// the unit file, the installed SGLang.
pub fn staleness(host: &str, unit: &str, planned: &PlannedState, now: &PlannedState) -> Vec<Stale> {
    let mut stale = Vec::new();
    if planned.desired_sha256 != now.desired_sha256 {
        stale.push(Stale::Manifests {
            host: host.to_string(),
            unit: unit.to_string(),
            planned: planned.desired_sha256.clone(),
            now: now.desired_sha256.clone(),
        });
    }
    stale.extend(unit_staleness(host, planned, now.current_sha256.as_deref()));
    if planned.sglang_version != now.sglang_version {
        stale.push(Stale::Sglang {
            host: host.to_string(),
            planned: planned.sglang_version.clone(),
            now: now.sglang_version.clone(),
        });
    }
    stale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::testing::{assert_any, assert_holds};

    const A: &str = "service: s\nhosts: [h1, h2]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\nenv: { HF_TOKEN: hf_plan_secret_1 }\n";

    fn targets(text: &str) -> Vec<Target> {
        let m = parse("m.yaml", text).unwrap();
        crate::targets::targets(&[m], &Default::default()).unwrap()
    }

    fn state(desired: &str, current: Option<&str>, sglang: Option<&str>) -> PlannedState {
        PlannedState {
            desired_sha256: desired.into(),
            current_sha256: current.map(Into::into),
            sglang_version: sglang.map(Into::into),
        }
    }

    fn planned(t: &Target, current: Option<&str>) -> PlannedTarget {
        PlannedTarget {
            host: t.host.clone(),
            unit: t.desired.unit.clone(),
            source: t.source.clone(),
            status: Status::Planned {
                verdict: Verdict::Restart,
                state: state(&sha256(&t.desired.text), current, Some("0.5.23")),
                diff: String::new(),
            },
        }
    }

    fn plan_of(targets: Vec<PlannedTarget>) -> PlanFile {
        PlanFile {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            created_at: "2025-01-01T00:00:00Z".into(),
            reconcile_version: "0.1.0".into(),
            git_commit: None,
            manifests: vec!["manifests".into()],
            targets,
        }
    }

    #[test]
    fn a_plan_round_trips_through_json_and_is_told_from_a_manifest() {
        let ts = targets(A);
        let plan = plan_of(vec![
            planned(&ts[0], None),
            PlannedTarget {
                host: "h2".into(),
                unit: "s.service".into(),
                source: "m.yaml".into(),
                status: Status::Failed {
                    error: "unreachable".into(),
                },
            },
        ]);
        let text = serde_json::to_string(&plan).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["targets"][0]["status"], "planned");
        assert_eq!(value["targets"][0]["verdict"], "restart");
        assert!(value["targets"][0]["current_sha256"].is_null());
        assert_eq!(value["targets"][1]["status"], "failed");
        let read = PlanFile::parse(Path::new("p.json"), &text).unwrap();
        assert_eq!(read, Some(plan));
        let not_a_plan = PlanFile::parse(Path::new("m.json"), r#"{"service": "s"}"#).unwrap();
        assert_eq!(not_a_plan, None);
    }

    #[test]
    fn a_newer_format_is_refused_not_misread() {
        let text = format!(r#"{{"format": "{FORMAT}", "format_version": 99, "targets": []}}"#);
        let e = PlanFile::parse(Path::new("p.json"), &text).unwrap_err();
        assert!(matches!(e, Error::Version { found: 99, .. }), "{e}");
    }

    #[test]
    fn nothing_of_a_secret_reaches_the_file() {
        let ts = targets(A);
        let old = targets(&A.replace("hf_plan_secret_1", "hf_plan_secret_2"));
        let observed = crate::observed::Observed {
            unit_text: Some(old[0].desired.text.clone()),
            state: Default::default(),
            unit_files: Default::default(),
        };
        let mut planned = crate::plan::plan(
            "h1",
            "m.yaml",
            &ts[0].desired,
            &observed,
            &crate::redact::Redactor::default(),
        );
        assert_any(&planned.notes, "HF_TOKEN");
        planned.recorded = Some(state("d", Some("c"), Some("0.5.23")));
        let plan = PlanFile::new(
            &[PathBuf::from("manifests")],
            None,
            &[PlanOutcome::Planned(Box::new(planned))],
            SystemTime::UNIX_EPOCH,
            "0.1.0",
        );
        let text = serde_json::to_string(&plan).unwrap();
        assert!(!text.contains("hf_plan_secret"), "{text}");
        assert_holds(
            &text,
            "+EnvironmentFile=/var/lib/reconcile/secrets/s.service-",
        );
    }

    #[test]
    fn only_planned_units_are_selected_and_carry_what_was_planned() {
        let ts = targets(A);
        let plan = plan_of(vec![planned(&ts[0], Some("abc"))]);
        let (selected, refused) = plan.select(ts);
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(selected.len(), 1);
        assert_eq!(selected[0].host, "h1");
        let expected = selected[0].expected.as_ref().unwrap();
        assert_eq!(expected.current_sha256.as_deref(), Some("abc"));
    }

    #[test]
    fn changed_gone_and_failed_units_are_refused() {
        let ts = targets(A);
        let mut failed = planned(&ts[1], None);
        failed.status = Status::Failed {
            error: "connection refused".into(),
        };
        let mut gone = planned(&ts[0], None);
        gone.unit = "other.service".into();
        let plan = plan_of(vec![planned(&ts[0], None), failed, gone]);
        let (selected, refused) = plan.select(targets(&A.replace("/m\n", "/m2\n")));
        assert!(selected.is_empty());
        let messages: Vec<String> = refused.iter().map(|r| r.why.to_string()).collect();
        assert!(
            messages[0].starts_with(
                "the manifests changed since the plan was made: s.service on h1 renders differently now"
            ),
            "{messages:?}"
        );
        assert_eq!(
            messages[1],
            "s.service on h2 could not be planned (connection refused); plan again"
        );
        assert!(
            messages[2].contains("other.service on h1 is not in them any more"),
            "{messages:?}"
        );
    }

    #[test]
    fn a_plan_holds_only_while_unit_file_and_sglang_are_as_planned() {
        let planned = state("d", Some("a1b2c3d4e5"), Some("0.5.23"));
        assert!(staleness("rl4", "u", &planned, &planned).is_empty());
        let edited = state("d", Some("9f8e7d6c5b"), Some("0.5.23"));
        let stale = staleness("rl4", "u", &planned, &edited);
        assert_eq!(
            stale[0].to_string(),
            "stale plan: the unit on rl4 changed since the plan (a1b2c3d4 -> 9f8e7d6c); plan again"
        );
        let gone = state("d", None, Some("0.5.23"));
        assert!(staleness("rl4", "u", &planned, &gone)[0]
            .to_string()
            .contains("(a1b2c3d4 -> absent)"));
        let appeared = unit_staleness("rl4", &state("d", None, None), Some("9f8e7d6c5b"));
        assert!(appeared
            .unwrap()
            .to_string()
            .contains("(absent -> 9f8e7d6c)"));
        let downgraded = state("d", Some("a1b2c3d4e5"), Some("0.5.9"));
        assert_eq!(
            staleness("rl4", "u", &planned, &downgraded)[0].to_string(),
            "stale plan: SGLang on rl4 was 0.5.23 when planned, is 0.5.9 now; plan again"
        );
        let everything = state("e", None, None);
        assert_eq!(staleness("rl4", "u", &planned, &everything).len(), 3);
    }
}
