//! The imported manifest's text: the parts read from the unit, in the order a manifest is read,
//! with the comments that say where a value came from and why a value is a reference.

use std::collections::BTreeMap;

use super::argv::{self, Written};
use super::yaml::{self, Out};
use super::{Request, UnitFile};
use crate::plan::UNIT_DIR;

/// An env var or setting as written: name, value, and the comment saying where it came from.
pub type Entry<V> = (String, V, Option<String>);

/// The manifest's parts, as read.
pub struct Parts {
    pub command: argv::Command,
    /// Where ExecStart comes from, when a drop-in set it.
    pub command_origin: Option<String>,
    pub description: Option<String>,
    pub env: Vec<Entry<Written>>,
    pub systemd: Vec<Entry<String>>,
}

/// Drop-ins of the unit's own, or a unit file elsewhere than the one reconcile manages, that
/// apply must move aside for the manifest's unit to be what systemd runs.
pub fn moved_aside<'a>(unit: &str, own: &'a [UnitFile]) -> Vec<&'a str> {
    let managed = format!("{UNIT_DIR}/{unit}");
    own.iter()
        .enumerate()
        .filter(|(i, f)| *i > 0 || f.path != managed)
        .map(|(_, f)| f.path.as_str())
        .collect()
}

/// The manifest's text, the variables it reads and their values (for [`check`] only).
pub fn manifest(
    r: &Request,
    own: &[UnitFile],
    service: &str,
    parts: &Parts,
) -> (String, Vec<(String, String)>, BTreeMap<String, String>) {
    let c = &parts.command;
    let mut out = Out::default();
    out.comment(
        0,
        &format!(
            "Imported by `reconcile import {} {}` from what systemd runs there:",
            r.host, r.unit
        ),
    );
    for f in own {
        out.comment(0, &format!("  {}", f.path));
    }
    let inline_secrets = parts
        .env
        .iter()
        .any(|(_, value, _)| matches!(value, Written::FromEnv { .. }));
    out.comment(0, if inline_secrets {
        "A plan of this manifest against that host restarts nothing but to move the unit's secret\nenvironment into a file only root reads (docs/guarantees.md). Values written as\n`{ from_env: VAR }` are read from reconcile's environment (see docs/adopting.md)."
    } else {
        "A plan of this manifest against that host restarts nothing. Values written as\n`{ from_env: VAR }` are read from reconcile's environment (see docs/adopting.md)."
    });
    out.entry(0, "service", &yaml::text(service), None);
    if let Some(d) = &parts.description {
        out.entry(0, "description", &yaml::text(d), None);
    }
    out.entry(0, "hosts", "", None);
    out.line(2, &format!("- {}", yaml::text(r.host)));
    out.entry(0, "sglang", "", None);
    out.entry(
        2,
        "python",
        &yaml::text(&c.python),
        parts.command_origin.as_deref(),
    );
    if let Some(script) = &c.console_script {
        out.entry(
            2,
            "console_script",
            &yaml::text(script),
            Some("ExecStart runs `sglang serve`; python is its #! interpreter"),
        );
    }
    out.entry(
        2,
        "version",
        &format!("\"{}\"", r.version.escape_default()),
        Some("the SGLang the unit's Python has"),
    );
    out.entry(2, "model_path", &yaml::text(&c.model_path), None);
    if let Some(name) = &c.served_model_name {
        out.entry(2, "served_model_name", &yaml::text(name), None);
    }
    if let Some(host) = &c.host {
        out.entry(2, "host", &yaml::text(host), None);
    }
    out.entry(2, "port", &c.port.to_string(), None);
    let mut exports = Vec::new();
    let mut secrets = BTreeMap::new();
    let mut secret = |var: &str, value: &str, what: String| -> &'static str {
        exports.push((var.to_string(), what));
        secrets.insert(var.to_string(), value.to_string());
        "secret: not copied from the unit; export it before plan or apply"
    };
    if !c.flags.is_empty() {
        out.entry(2, "flags", "", None);
        for (name, w) in &c.flags {
            let comment = match w {
                Written::FromEnv { var, value } => Some(secret(var, value, format!("--{name}"))),
                _ => None,
            };
            out.entry(4, name, &yaml::written(w), comment);
        }
    }
    if !parts.env.is_empty() {
        out.entry(0, "env", "", None);
        for (name, w, origin) in &parts.env {
            let comment = match w {
                Written::FromEnv { var, value } => {
                    Some(secret(var, value, format!("env {name}")).to_string())
                }
                _ => origin.clone(),
            };
            out.entry(2, name, &yaml::written(w), comment.as_deref());
        }
    }
    let declared: Vec<&String> = r
        .secret_env
        .iter()
        .filter(|n| parts.env.iter().any(|(e, _, _)| e == *n))
        .collect();
    if !declared.is_empty() {
        let names: Vec<String> = declared.iter().map(|n| yaml::text(n)).collect();
        out.entry(0, "secret_env", &format!("[{}]", names.join(", ")), None);
    }
    let moved = moved_aside(r.unit, own);
    if !parts.systemd.is_empty() || !moved.is_empty() {
        out.entry(0, "systemd", "", None);
        for (key, value, comment) in &parts.systemd {
            let value = if value.is_empty() {
                "\"\"".to_string()
            } else {
                yaml::setting(value)
            };
            out.entry(2, key, &value, comment.as_deref());
        }
        if !moved.is_empty() {
            let mut comment = String::from("Folded in above, the values of:");
            for path in &moved {
                comment.push_str(&format!("\n  {path}"));
            }
            comment.push_str("\napply moves them aside into the unit's generations (restorable) and\ninstalls this manifest's unit alone.");
            out.comment(2, &comment);
            out.entry(2, "dropins", "replace", None);
        }
    }
    (out.into_text(), exports, secrets)
}
