//! Showing status: a line per unit for a terminal, a table for a pull request or a wiki, JSON for
//! tools. Details never hold secret values (see `status::classify`).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{short, to_json, Format, COMMIT_SHOWN};
use crate::status::{exit_code, Class, UnitStatus};

pub fn render(statuses: &[UnitStatus], format: Format) -> String {
    match format {
        Format::Text => super::terminal::text(text(statuses)),
        Format::Markdown => super::terminal::text(markdown(statuses)),
        Format::Json => json(statuses),
    }
}

fn classes(s: &UnitStatus) -> String {
    if s.error.is_some() {
        return "error".into();
    }
    let names: Vec<&str> = s.classes.iter().map(|c| c.name()).collect();
    names.join(",")
}

/// `abc1234 applied 2026-...` from the record, or `no deployment record`.
fn deployed(s: &UnitStatus) -> String {
    match &s.applied_at {
        Some(at) => {
            let commit = s
                .git_commit
                .as_deref()
                .map_or("no commit", |c| short(c, COMMIT_SHOWN));
            format!("{commit} applied {at}")
        }
        None if s.classes.contains(&Class::RecordUnreadable) => {
            "deployment record unreadable".into()
        }
        None => "no deployment record".into(),
    }
}

/// `active (running) pid 42 since ...`, and the model it serves.
fn running(s: &UnitStatus) -> String {
    let d = &s.systemd;
    if d.load_state != "loaded" && !d.load_state.is_empty() {
        return d.load_state.clone();
    }
    let mut line = format!("{} ({})", d.active_state, d.sub_state);
    if d.active_state == "active" {
        let _ = write!(line, " pid {}", d.main_pid);
        if !d.started_at.is_empty() {
            let _ = write!(line, " since {}", d.started_at);
        }
        if let Some(models) = &s.served_models {
            let _ = write!(line, ", serves {}", models.join(", "));
        }
    }
    line
}

fn text(statuses: &[UnitStatus]) -> String {
    let mut out = String::new();
    for s in statuses {
        match &s.error {
            Some(e) => {
                let _ = writeln!(out, "{} {}: error: {e}", s.host, s.unit);
            }
            None => {
                let _ = writeln!(
                    out,
                    "{} {}: {}  {}; {}",
                    s.host,
                    s.unit,
                    classes(s),
                    deployed(s),
                    running(s)
                );
                for d in &s.details {
                    let _ = writeln!(out, "  {d}");
                }
            }
        }
    }
    let _ = writeln!(out, "Status: {}", tally_line(statuses));
    out
}

fn markdown(statuses: &[UnitStatus]) -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::from(
        "| host | unit | status | deployed | running | details |\n|---|---|---|---|---|---|\n",
    );
    for s in statuses {
        let details = match &s.error {
            Some(e) => e.clone(),
            None => s.details.join("; "),
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | **{}** | {} | {} | {} |",
            cell(&s.host),
            cell(&s.unit),
            classes(s),
            cell(&deployed(s)),
            cell(&running(s)),
            cell(&details)
        );
    }
    let _ = writeln!(out, "\n{}", tally_line(statuses));
    out
}

fn json(statuses: &[UnitStatus]) -> String {
    to_json(&serde_json::json!({
        "format_version": super::JSON_FORMAT_VERSION,
        "units": statuses,
        "tally": tally(statuses),
        "in_sync": exit_code(statuses) == 0,
    }))
}

/// Units per class (a unit counts once in each of its classes), and errors.
fn tally(statuses: &[UnitStatus]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for s in statuses {
        if s.error.is_some() {
            *counts.entry("error").or_default() += 1;
        }
        for c in &s.classes {
            *counts.entry(c.name()).or_default() += 1;
        }
    }
    counts
}

fn tally_line(statuses: &[UnitStatus]) -> String {
    let synced = statuses.iter().filter(|s| s.in_sync()).count();
    let counts = tally(statuses);
    let others: Vec<String> = counts
        .iter()
        .filter(|(k, _)| **k != Class::InSync.name())
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    let mut line = format!("{synced} of {} units in sync", statuses.len());
    if !others.is_empty() {
        let _ = write!(line, "; {}", others.join(", "));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Systemd;

    fn status(classes: Vec<Class>) -> UnitStatus {
        UnitStatus {
            host: "gpu-a".into(),
            unit: "s.service".into(),
            source: "manifests/s.yaml".into(),
            classes,
            details: vec!["the service is inactive (dead)".into()],
            git_commit: Some("0123456789abcdef".into()),
            applied_at: Some("2026-01-01T00:00:00Z".into()),
            applied_by: None,
            systemd: Systemd {
                load_state: "loaded".into(),
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                ..Systemd::default()
            },
            served_models: None,
            record: None,
            error: None,
        }
    }

    #[test]
    fn text_gives_a_line_per_unit_with_its_classes_commit_and_details() {
        let out = render(&[status(vec![Class::Down])], Format::Text);
        assert_eq!(
            out,
            "gpu-a s.service: down  0123456 applied 2026-01-01T00:00:00Z; inactive (dead)\n  the service is inactive (dead)\nStatus: 0 of 1 units in sync; 1 down\n"
        );
    }

    #[test]
    fn markdown_is_a_table_and_json_carries_the_classes() {
        let md = render(&[status(vec![Class::Down])], Format::Markdown);
        assert!(md.contains("| gpu-a | `s.service` | **down** |"), "{md}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&[status(vec![Class::Down])], Format::Json)).unwrap();
        assert_eq!(json["units"][0]["classes"], serde_json::json!(["down"]));
        assert_eq!(json["format_version"], super::super::JSON_FORMAT_VERSION);
        assert_eq!(json["tally"]["down"], 1);
        assert_eq!(json["in_sync"], false);
    }

    #[test]
    fn an_unreadable_record_is_shown_with_its_reason_and_a_commit_need_not_be_ascii() {
        let mut s = status(vec![Class::RecordUnreadable]);
        s.applied_at = None;
        s.details = vec!["the deployment record /var/lib/reconcile/s.service/current.json on gpu-a does not parse: EOF while parsing".into()];
        let out = render(std::slice::from_ref(&s), Format::Text);
        assert!(
            out.starts_with("gpu-a s.service: record_unreadable  deployment record unreadable; inactive (dead)\n  the deployment record /var/lib/reconcile/s.service/current.json on gpu-a does not parse"),
            "{out}"
        );
        assert!(
            out.ends_with("Status: 0 of 1 units in sync; 1 record_unreadable\n"),
            "{out}"
        );
        let json: serde_json::Value = serde_json::from_str(&render(&[s], Format::Json)).unwrap();
        assert_eq!(
            json["units"][0]["classes"],
            serde_json::json!(["record_unreadable"])
        );

        let mut s = status(vec![Class::Down]);
        s.git_commit = Some("ééééééééé".into());
        let out = render(&[s], Format::Text);
        assert!(out.contains("down  ééééééé applied"), "{out}");
    }
}
