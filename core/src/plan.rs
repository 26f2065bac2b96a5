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
use crate::live_change::LiveChange;
use crate::observed::{Observed, UnitState};
use crate::redact::{redact_text, Redactor, Secret, REDACTED, REDACTED_CHANGED};
use crate::sglang::meaning::as_parsed;
use crate::sglang::Catalog;
use crate::unit::{parse_unit, takes_effect_without_restart, Desired, UnitModel};
use crate::unit_files::Drift;

pub use crate::unit_files::UNIT_DIR;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    NoChange,
    /// `daemon-reload` only; the running server keeps serving.
    ReloadOnly,
    /// The running server takes the change without a restart (`apply.live`, `crate::live`): the
    /// unit file is written and loaded, and SGLang's own call moves its weights or values.
    Live,
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
            Verdict::Live => "live, no restart (the running server takes the change)",
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
    /// The file the old value comes from, when it is not the managed unit file (a drop-in, or a
    /// unit file that shadows it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
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
    /// How what systemd runs differs from the managed unit file alone, enabled (drop-ins, a mask,
    /// a unit file elsewhere, disabled); each makes the plan a change.
    pub drift: Vec<Drift>,
    /// Things worth knowing that do not change the verdict (the service is down, systemd has not
    /// reloaded the file on disk).
    pub notes: Vec<String>,
    /// What the host lacks for this unit to start (see `preflight`); an error here fails the plan.
    pub preflight: Vec<Finding>,
    /// What the running server is told, when the change is applied live ([`Verdict::Live`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveChange>,
    /// The pinned weights on the host (`sglang.model:`): verified, to fetch before the stop, or
    /// refused (also a preflight error then). Set by `dry_run`, which read the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<crate::pinned::CopyPlan>,
    /// Apply will judge this change on its answers (`verify.quality`): set by `dry_run`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub judged_on_quality: bool,
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
    let unit = &desired.unit;
    let current = observed.unit_text.as_deref();
    let unit_files = &observed.unit_files;
    let drift = unit_files.drifts(unit, current);
    // What systemd would run now: the managed file alone, or, when other files are in force, all
    // of them in systemd's order (the drop-ins' values win; a masked unit runs nothing).
    let overridden = drift.iter().any(|d| *d != Drift::Disabled);
    let running: Option<String> = if !overridden {
        current.map(str::to_string)
    } else {
        unit_files.effective(unit, current)
    };
    let old_model = if overridden {
        unit_files
            .effective_model(unit, current)
            .unwrap_or_default()
    } else {
        running.as_deref().map(parse_unit).unwrap_or_default()
    };
    let secrets = secrets(&old_model, &desired.model, redactor);
    let exists = current.is_some() || !unit_files.fragment.is_empty();
    let masked = drift.iter().any(|d| matches!(d, Drift::Masked { .. }));
    let verdict = match running.as_deref() {
        _ if !exists => Verdict::Install,
        // A masked unit does not run: starting it loads the model.
        _ if masked => Verdict::Restart,
        None => Verdict::Install,
        Some(text) if drift.is_empty() && text == desired.text => Verdict::NoChange,
        Some(_) if needs_restart(&old_model, &desired.model, parser(desired)) => Verdict::Restart,
        // Same meaning, but files to move aside or a unit to enable: apply has work.
        Some(_) => Verdict::ReloadOnly,
    };
    let summary = if verdict == Verdict::NoChange {
        Summary::default()
    } else {
        let mut summary = summarize(&old_model, &desired.model, &secrets);
        if overridden {
            attribute(&mut summary, observed, unit);
        }
        summary
    };
    let diff = if verdict == Verdict::NoChange {
        String::new()
    } else {
        let old = redact_text(running.as_deref().unwrap_or(""), &secrets);
        let new = redact_text(&desired.text, &secrets);
        let old_name = if !overridden {
            format!("{host}:{UNIT_DIR}/{unit}")
        } else {
            // The files in force, each under its `# <path>` line, as `systemctl cat` shows them.
            format!("{host}:systemctl cat {unit}")
        };
        TextDiff::from_lines(&old, &new)
            .unified_diff()
            .context_radius(3)
            .header(
                if running.is_some() {
                    &old_name
                } else {
                    "/dev/null"
                },
                source,
            )
            .to_string()
    };
    let mut notes = notes(verdict, observed, masked);
    for d in &drift {
        notes.push(format!(
            "{}; {}",
            d.describe(unit),
            d.apply_does(desired.dropins)
        ));
    }
    for d in unit_files.shared_drop_ins(unit) {
        notes.push(format!(
            "the drop-in {} applies to other units too; reconcile leaves it as it is",
            d.path
        ));
    }
    // The secrets file is named by what it holds: a name the host's unit does not give is a
    // secret that is new or changed, whose value no output shows.
    if let Some(file) = desired
        .secrets
        .as_ref()
        .filter(|_| verdict != Verdict::NoChange)
    {
        let named = old_model
            .settings
            .get("Service.EnvironmentFile")
            .is_some_and(|files| files.contains(&file.path));
        if !named {
            let names: Vec<&str> = file.env.keys().map(String::as_str).collect();
            notes.push(format!(
                "the secret environment ({}) goes to a new file only root reads ({}): new, \
                 changed, or moved out of the unit",
                names.join(", "),
                file.path
            ));
        }
    }
    UnitPlan {
        host: host.to_string(),
        unit: unit.clone(),
        source: source.to_string(),
        verdict,
        summary,
        diff,
        notes,
        state: observed.state.clone(),
        drift,
        preflight: Vec::new(),
        live: None,
        pinned: None,
        judged_on_quality: false,
        recorded: None,
    }
}

impl UnitPlan {
    /// The restart this plan asked for is applied live instead, as `change` says.
    pub fn go_live(&mut self, change: LiveChange) {
        debug_assert_eq!(self.verdict, Verdict::Restart);
        self.verdict = Verdict::Live;
        self.notes
            .push(format!("applied live: {}", change.describe()));
        self.live = Some(change);
    }

    /// The manifest asks for live changes, and this one is not: the plan says why it restarts.
    pub fn not_live(&mut self, why: impl std::fmt::Display) {
        self.notes
            .push(format!("not applied live ({why}): the server restarts"));
    }
}

/// Names, on each difference, the file its old value comes from when that is not the managed
/// unit file: the drop-in that set a flag, the `/run` unit that set an environment variable.
fn attribute(summary: &mut Summary, observed: &Observed, unit: &str) {
    let current = observed.unit_text.as_deref();
    let origin = |name: &str| observed.unit_files.origin_of(unit, current, name);
    let exec = origin("ExecStart");
    if let Some(command) = &mut summary.command {
        command.from = exec.clone();
    }
    for d in &mut summary.flags {
        d.from = exec.clone();
    }
    for d in &mut summary.env {
        d.from = origin(&format!("env:{}", d.name)).or_else(|| origin("env:*"));
    }
    for d in &mut summary.settings {
        d.from = origin(&d.name);
    }
}

fn needs_restart(old: &UnitModel, new: &UnitModel, parser: Option<&Catalog>) -> bool {
    restart_reason(old, new, parser).is_some()
}

/// The parser a plan compares `desired`'s flags as: its SGLang version's, when cataloged.
pub fn parser(desired: &Desired) -> Option<&'static Catalog> {
    Catalog::for_version(&desired.sglang_version)
}

/// What differs between two units that restarts the server, named (`the flag --tp-size`), or
/// `None` when a reload applies every difference. argparse does not care about the order of
/// distinct flags, so neither does this; a setting left out counts as systemd's default for it.
/// With the SGLang version's `parser`, flags are compared as it reads them (an alias, a prefix, a
/// number spelled otherwise is the same setting: `sglang::meaning`); without, as written.
pub fn restart_reason(
    old: &UnitModel,
    new: &UnitModel,
    parser: Option<&Catalog>,
) -> Option<String> {
    let (old_cmd, old_flags) = flags(&old.exec_start);
    let (new_cmd, new_flags) = flags(&new.exec_start);
    let (old_flags, new_flags) = match parser {
        Some(c) => (as_parsed(c, &old_flags), as_parsed(c, &new_flags)),
        None => (old_flags, new_flags),
    };
    if old_cmd != new_cmd {
        return Some(format!(
            "the command: `{}` against `{}`",
            old_cmd.join(" "),
            new_cmd.join(" ")
        ));
    }
    if let Some(name) = differing(&old_flags, &new_flags) {
        return Some(format!("the flag --{name}"));
    }
    if let Some(name) = differing(&old.env, &new.env) {
        return Some(format!("the environment variable {name}"));
    }
    differing(&runtime(old), &runtime(new)).map(|name| format!("the setting {name}"))
}

/// The settings a restart applies, with systemd's defaults for those a unit may leave out: a
/// hand-written unit without `Type=` runs as `Type=simple`, which every rendered unit says.
fn runtime(m: &UnitModel) -> BTreeMap<String, Vec<String>> {
    let mut settings: BTreeMap<String, Vec<String>> = m
        .settings
        .iter()
        .filter(|(k, _)| !takes_effect_without_restart(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    settings
        .entry("Service.Type".into())
        .or_insert_with(|| vec!["simple".into()]);
    settings
}

fn differing<V: PartialEq>(a: &BTreeMap<String, V>, b: &BTreeMap<String, V>) -> Option<String> {
    differing_keys(a, b).next().cloned()
}

/// The keys whose values differ between `a` and `b` (absent counts as a value): `a`'s in order,
/// then `b`'s; a key of both comes twice.
pub(crate) fn differing_keys<'a, V: PartialEq>(
    a: &'a BTreeMap<String, V>,
    b: &'a BTreeMap<String, V>,
) -> impl Iterator<Item = &'a String> + 'a {
    a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k))
}

fn notes(verdict: Verdict, observed: &Observed, masked: bool) -> Vec<String> {
    let state = &observed.state;
    let mut notes = Vec::new();
    if verdict != Verdict::Install && state.is_loaded() && state.active_state != "active" {
        notes.push(format!("the service is {} now", state.summary()));
    }
    if state.need_daemon_reload {
        notes.push("the unit file on the host changed after systemd last loaded it (daemon-reload pending)".into());
    }
    if observed.unit_text.is_some()
        && !masked
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
            from: None,
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
            from: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::testing::{assert_any, assert_holds};
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
            unit_files: Default::default(),
        }
    }

    /// The plan from the host's unit text (`None`: no unit) to the manifest `new`.
    fn plan_onto(new: &str, host: Option<&str>) -> UnitPlan {
        plan(
            "h",
            "m.yaml",
            &desired(new),
            &observed(host),
            &Redactor::default(),
        )
    }

    fn plan_between(old: &str, new: &str) -> UnitPlan {
        plan_onto(new, Some(&desired(old).text))
    }

    /// BASE with its flags as `flags` (a YAML map's body).
    fn with_flags(flags: &str) -> String {
        let base = "flags: { tp-size: 4, context-length: 8192, trust-remote-code: true }";
        assert!(BASE.contains(base));
        BASE.replace(base, &format!("flags: {{ {flags} }}"))
    }

    #[test]
    fn a_command_line_sglang_reads_the_same_way_reloads_and_shows_its_text() {
        // As an operator wrote it: a prefix, an alias and a float spelled otherwise.
        let host = with_flags(
            "tp: 4, context-len: 8192, trust-remote-code: true, mem-fraction-static: \"0.80\"",
        );
        let manifest = with_flags(
            "tp-size: 4, context-length: 8192, trust-remote-code: true, mem-fraction-static: 0.8",
        );
        let p = plan_between(&host, &manifest);
        assert_eq!(p.verdict, Verdict::ReloadOnly, "{}", p.diff);
        assert!(
            p.diff.contains("--tp 4") && p.diff.contains("--tp-size 4"),
            "{}",
            p.diff
        );
        // A value that differs in meaning still restarts, named as SGLang knows it.
        let other = with_flags(
            "tp: 2, context-len: 8192, trust-remote-code: true, mem-fraction-static: \"0.80\"",
        );
        let p = plan_between(&other, &manifest);
        assert_eq!(p.verdict, Verdict::Restart);
        assert_eq!(
            restart_reason(
                &desired(&other).model,
                &desired(&manifest).model,
                parser(&desired(&manifest))
            )
            .as_deref(),
            Some("the flag --tp-size")
        );
        // A version with no catalog compares the text, as before.
        let unknown = manifest.replace("version: 0.5.23", "version: 9.9.9");
        assert_eq!(
            plan_between(&host.replace("version: 0.5.23", "version: 9.9.9"), &unknown).verdict,
            Verdict::Restart
        );
    }

    #[test]
    fn identical_units_need_nothing() {
        let p = plan_between(BASE, BASE);
        assert_eq!(p.verdict, Verdict::NoChange);
        assert!(p.diff.is_empty() && p.summary.is_empty());
    }

    #[test]
    fn a_missing_unit_is_installed() {
        let p = plan_onto(BASE, None);
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

    /// [`BASE`] without its secret: a hand-written unit has it inline, reconcile's in a file.
    fn plain() -> String {
        BASE.replace("HF_TOKEN: hf_supersecret_1, ", "")
    }

    #[test]
    fn a_hand_written_unit_without_type_runs_as_simple_and_only_reloads() {
        let hand = "[Service]\nEnvironment=A=1\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 --context-length 8192 --tp-size 4 --trust-remote-code\n";
        let p = plan_onto(&plain(), Some(hand));
        assert_eq!(p.verdict, Verdict::ReloadOnly, "{:#?}", p.summary);
        let forking = hand.replace("[Service]\n", "[Service]\nType=forking\n");
        let p = plan_onto(&plain(), Some(&forking));
        assert_eq!(p.verdict, Verdict::Restart);
        assert_eq!(
            restart_reason(&parse_unit(&forking), &desired(&plain()).model, None).as_deref(),
            Some("the setting Service.Type")
        );
    }

    #[test]
    fn a_hand_written_unit_with_the_same_meaning_only_reloads() {
        let hand = "[Unit]\nDescription=first\nAfter=network-online.target\nWants=network-online.target\n[Service]\nType=simple\nEnvironment=A=1\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 --context-length 8192 --tp-size 4 --trust-remote-code\n[Install]\nWantedBy=multi-user.target\n";
        let p = plan_onto(&plain(), Some(hand));
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
        let shown = format!("{}{:?}{:?}", p.diff, p.summary, p.notes);
        assert!(!shown.contains("hf_supersecret"), "{shown}");
        assert!(
            p.diff
                .contains("-EnvironmentFile=/var/lib/reconcile/secrets/s.service-")
                && p.diff
                    .contains("+EnvironmentFile=/var/lib/reconcile/secrets/s.service-"),
            "{}",
            p.diff
        );
        assert_any(&p.notes, "secret environment (HF_TOKEN)");
        // A unit that had it inline moves it, its value shown nowhere.
        let hand = desired(BASE).inline_model();
        let inline = format!(
            "[Service]\nEnvironment=\"A=1\" \"HF_TOKEN={}\"\nExecStart={}\n",
            hand.env["HF_TOKEN"],
            hand.exec_start.join(" ")
        );
        let p = plan_onto(BASE, Some(&inline));
        assert!(
            !format!("{}{:?}", p.diff, p.summary).contains("hf_supersecret"),
            "{}",
            p.diff
        );
        assert_holds(&p.diff, "-Environment=\"A=1\" \"HF_TOKEN=<redacted>\"");
    }
}
