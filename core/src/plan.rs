//! Desired against observed: what changes on a host and whether the server must restart.
//!
//! A restart reloads the model (about 15 minutes on a 4-GPU host), so the verdict compares what
//! the units mean, not their text: a reworded Description needs only `daemon-reload`.

use std::collections::BTreeMap;

use serde::Serialize;
use similar::TextDiff;

use serde::Deserialize;

use crate::finding::Finding;
use crate::flags::flags;
use crate::observed::{Observed, UnitState};
use crate::redact::{redact_text, Redactor, Secret, REDACTED, REDACTED_CHANGED};
use crate::unit::{parse_unit, takes_effect_without_restart, Desired, UnitModel};

/// Where units live on a host.
pub const UNIT_DIR: &str = "/etc/systemd/system";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    NoChange,
    /// `daemon-reload` only; the running server keeps serving.
    ReloadOnly,
    /// The server restarts and reloads its model.
    Restart,
    /// A unit the host does not have yet: install, enable and start it.
    Install,
}

impl Verdict {
    pub fn describe(self) -> &'static str {
        match self {
            Verdict::NoChange => "no change",
            Verdict::ReloadOnly => "reload only (daemon-reload, no restart)",
            Verdict::Restart => "restart required (the model reloads)",
            Verdict::Install => "new unit (install, enable, start)",
        }
    }
}

/// One named value that differs; `old` is absent when added, `new` when removed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delta {
    pub name: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

/// The change at the level an operator thinks in.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The program and module before the flags (python path, `-m sglang.launch_server`).
    pub command: Option<Delta>,
    pub flags: Vec<Delta>,
    pub env: Vec<Delta>,
    pub settings: Vec<Delta>,
}

impl Summary {
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.command.is_none()
            && self.flags.is_empty()
            && self.env.is_empty()
            && self.settings.is_empty()
    }
}

/// The plan for one unit on one host.
#[derive(Debug, Clone, Serialize)]
pub struct UnitPlan {
    pub host: String,
    pub unit: String,
    /// The manifest the unit is rendered from.
    pub source: String,
    pub verdict: Verdict,
    pub summary: Summary,
    /// Unified diff from the host's unit to the rendered one, secrets redacted; empty when equal.
    pub diff: String,
    pub state: UnitState,
    /// Things worth knowing that do not change the verdict (the service is down, systemd has not
    /// reloaded the file on disk).
    pub notes: Vec<String>,
    /// What the host lacks for this unit to start (see `preflight`); an error here fails the plan.
    pub preflight: Vec<Finding>,
    /// What a plan file records for this unit (hashes, the installed SGLang); filled in by
    /// `dry_run`, which read the host. Not part of any report.
    #[serde(skip)]
    pub recorded: Option<PlannedState>,
}

/// What must still be true on a host for its planned change to be applied. Here rather than in
/// `plan_file`, which records it, because `targets` carries it too and `plan_file` needs both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedState {
    /// sha256 of the rendered unit.
    pub desired_sha256: String,
    /// sha256 of the unit file on the host; null when it had none.
    pub current_sha256: Option<String>,
    /// The SGLang version installed for the unit's Python, as preflight found it; null when it
    /// found none.
    pub sglang_version: Option<String>,
}

/// The plan for `desired` on a host that has `observed`; `redactor` hides the secrets of both
/// units in the diff and the summary.
pub fn plan(
    host: &str,
    source: &str,
    desired: &Desired,
    observed: &Observed,
    redactor: &Redactor,
) -> UnitPlan {
    let current = observed.unit_text.as_deref();
    let old_model = current.map(parse_unit).unwrap_or_default();
    let secrets = secrets(&old_model, &desired.model, redactor);
    let verdict = match current {
        None => Verdict::Install,
        Some(text) if text == desired.text => Verdict::NoChange,
        Some(_) if needs_restart(&old_model, &desired.model) => Verdict::Restart,
        Some(_) => Verdict::ReloadOnly,
    };
    let summary = if verdict == Verdict::NoChange {
        Summary::default()
    } else {
        summarize(&old_model, &desired.model, &secrets)
    };
    let diff = if verdict == Verdict::NoChange {
        String::new()
    } else {
        let old = redact_text(current.unwrap_or(""), &secrets);
        let new = redact_text(&desired.text, &secrets);
        let old_name = format!("{host}:{UNIT_DIR}/{}", desired.unit);
        TextDiff::from_lines(&old, &new)
            .unified_diff()
            .context_radius(3)
            .header(
                if current.is_some() {
                    &old_name
                } else {
                    "/dev/null"
                },
                source,
            )
            .to_string()
    };
    UnitPlan {
        host: host.to_string(),
        unit: desired.unit.clone(),
        source: source.to_string(),
        verdict,
        summary,
        diff,
        notes: notes(verdict, observed),
        state: observed.state.clone(),
        preflight: Vec::new(),
        recorded: None,
    }
}

fn needs_restart(old: &UnitModel, new: &UnitModel) -> bool {
    let runtime = |m: &UnitModel| -> BTreeMap<String, Vec<String>> {
        m.settings
            .iter()
            .filter(|(k, _)| !takes_effect_without_restart(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    // argparse does not care about the order of distinct flags, so neither does the verdict.
    flags(&old.exec_start) != flags(&new.exec_start)
        || old.env != new.env
        || runtime(old) != runtime(new)
}

fn notes(verdict: Verdict, observed: &Observed) -> Vec<String> {
    let state = &observed.state;
    let mut notes = Vec::new();
    if verdict != Verdict::Install && state.is_loaded() && state.active_state != "active" {
        notes.push(format!("the service is {} now", state.summary()));
    }
    if state.need_daemon_reload {
        notes.push("the unit file on the host changed after systemd last loaded it (daemon-reload pending)".into());
    }
    if observed.unit_text.is_some()
        && !observed
            .unit_text
            .as_deref()
            .unwrap_or("")
            .starts_with("# Managed by reconcile")
    {
        notes.push("the host's unit was not written by reconcile; apply will replace it (the old one is kept)".into());
    }
    notes
}

/// Secret values of both units, the new one marked when it differs from the old.
fn secrets(old: &UnitModel, new: &UnitModel, redactor: &Redactor) -> Vec<Secret> {
    let old_values = redactor.secret_values(old);
    let new_values = redactor.secret_values(new);
    let mut secrets: Vec<Secret> = old_values
        .iter()
        .map(|(name, value)| Secret {
            name: name.clone(),
            value: value.clone(),
            placeholder: REDACTED,
        })
        .collect();
    for (name, value) in new_values {
        let changed = old_values.get(&name).is_some_and(|old| *old != value);
        let placeholder = if changed { REDACTED_CHANGED } else { REDACTED };
        secrets.push(Secret {
            name,
            value,
            placeholder,
        });
    }
    secrets
}

fn summarize(old: &UnitModel, new: &UnitModel, secrets: &[Secret]) -> Summary {
    let (old_cmd, old_flags) = flags(&old.exec_start);
    let (new_cmd, new_flags) = flags(&new.exec_start);
    let hide = |name: &str, value: &str| -> String {
        let found = secrets
            .iter()
            .rev()
            .find(|s| (s.name == name || s.name == format!("--{name}")) && s.value == value);
        found.map_or(value.to_string(), |s| s.placeholder.to_string())
    };
    let joined = |s: &BTreeMap<String, Vec<String>>| -> BTreeMap<String, String> {
        s.iter().map(|(k, v)| (k.clone(), v.join(" "))).collect()
    };
    Summary {
        command: (old_cmd != new_cmd).then(|| Delta {
            name: "command".into(),
            old: (!old_cmd.is_empty()).then(|| old_cmd.join(" ")),
            new: Some(new_cmd.join(" ")),
        }),
        flags: deltas(&old_flags, &new_flags, hide),
        env: deltas(&old.env, &new.env, hide),
        settings: deltas(&joined(&old.settings), &joined(&new.settings), |_, v| {
            v.to_string()
        }),
    }
}

fn deltas(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    shown: impl Fn(&str, &str) -> String,
) -> Vec<Delta> {
    let names: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    names
        .into_iter()
        .filter(|n| old.get(*n) != new.get(*n))
        .map(|n| Delta {
            name: n.clone(),
            old: old.get(n).map(|v| shown(n, v)),
            new: new.get(n).map(|v| shown(n, v)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::unit::render;

    const BASE: &str = "service: s\nhosts: [h]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags: { tp-size: 4, context-length: 8192, trust-remote-code: true }\nenv: { HF_TOKEN: hf_supersecret_1, A: \"1\" }\ndescription: first\n";

    fn desired(text: &str) -> Desired {
        let m = parse("m.yaml", text).unwrap();
        render(&m, &m.hosts[0])
    }

    fn observed(text: Option<&str>) -> Observed {
        let state = UnitState {
            load_state: "loaded".into(),
            active_state: "active".into(),
            ..Default::default()
        };
        Observed {
            unit_text: text.map(str::to_string),
            state,
        }
    }

    fn plan_between(old: &str, new: &str) -> UnitPlan {
        plan(
            "h",
            "m.yaml",
            &desired(new),
            &observed(Some(&desired(old).text)),
            &Redactor::default(),
        )
    }

    #[test]
    fn identical_units_need_nothing() {
        let p = plan_between(BASE, BASE);
        assert_eq!(p.verdict, Verdict::NoChange);
        assert!(p.diff.is_empty() && p.summary.is_empty());
    }

    #[test]
    fn a_missing_unit_is_installed() {
        let p = plan(
            "h",
            "m.yaml",
            &desired(BASE),
            &observed(None),
            &Redactor::default(),
        );
        assert_eq!(p.verdict, Verdict::Install);
        assert!(
            p.diff.starts_with("--- /dev/null\n+++ m.yaml\n"),
            "{}",
            p.diff
        );
    }

    #[test]
    fn two_changed_flags_change_two_lines_and_restart() {
        let new = BASE
            .replace("tp-size: 4", "tp-size: 8")
            .replace("context-length: 8192", "context-length: 16384");
        let p = plan_between(BASE, &new);
        assert_eq!(p.verdict, Verdict::Restart);
        let changed: Vec<&str> = p
            .diff
            .lines()
            .filter(|l| {
                (l.starts_with('+') || l.starts_with('-'))
                    && !l.starts_with("+++")
                    && !l.starts_with("---")
            })
            .collect();
        assert_eq!(
            changed,
            [
                "-\t--context-length 8192 \\",
                "-\t--tp-size 4 \\",
                "+\t--context-length 16384 \\",
                "+\t--tp-size 8 \\"
            ]
        );
        let flags: Vec<_> = p
            .summary
            .flags
            .iter()
            .map(|d| (d.name.as_str(), d.old.as_deref(), d.new.as_deref()))
            .collect();
        assert_eq!(
            flags,
            [
                ("context-length", Some("8192"), Some("16384")),
                ("tp-size", Some("4"), Some("8"))
            ]
        );
    }

    #[test]
    fn a_new_description_only_reloads() {
        let p = plan_between(
            BASE,
            &BASE.replace("description: first", "description: second"),
        );
        assert_eq!(p.verdict, Verdict::ReloadOnly);
        assert_eq!(p.summary.settings[0].name, "Unit.Description");
    }

    #[test]
    fn a_changed_restart_policy_only_reloads_but_a_new_user_restarts() {
        let p = plan_between(BASE, &format!("{BASE}systemd: {{ RestartSec: 30 }}\n"));
        assert_eq!(p.verdict, Verdict::ReloadOnly);
        let p = plan_between(BASE, &format!("{BASE}systemd: {{ User: sglang }}\n"));
        assert_eq!(p.verdict, Verdict::Restart);
    }

    #[test]
    fn a_hand_written_unit_with_the_same_meaning_only_reloads() {
        let hand = "[Unit]\nDescription=first\nAfter=network-online.target\nWants=network-online.target\n[Service]\nType=simple\nEnvironment=A=1 HF_TOKEN=hf_supersecret_1\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 --context-length 8192 --tp-size 4 --trust-remote-code\n[Install]\nWantedBy=multi-user.target\n";
        let p = plan(
            "h",
            "m.yaml",
            &desired(BASE),
            &observed(Some(hand)),
            &Redactor::default(),
        );
        assert_eq!(p.verdict, Verdict::ReloadOnly, "{:#?}", p.summary);
        assert!(p
            .notes
            .iter()
            .any(|n| n.contains("not written by reconcile")));
    }

    #[test]
    fn secrets_are_redacted_and_changes_still_show() {
        let p = plan_between(BASE, &BASE.replace("hf_supersecret_1", "hf_supersecret_2"));
        assert_eq!(p.verdict, Verdict::Restart);
        let shown = format!("{}{:?}", p.diff, p.summary);
        assert!(!shown.contains("hf_supersecret"), "{shown}");
        assert!(
            p.diff.contains("-Environment=\"HF_TOKEN=<redacted>\""),
            "{}",
            p.diff
        );
        assert!(
            p.diff
                .contains("+Environment=\"HF_TOKEN=<redacted, changed>\""),
            "{}",
            p.diff
        );
        assert_eq!(p.summary.env[0].new.as_deref(), Some(REDACTED_CHANGED));
    }
}
