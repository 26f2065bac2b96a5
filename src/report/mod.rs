//! Showing a plan: text for a terminal, markdown for a pull request comment, JSON for tools.
//! Every format is built from the same redacted plans, so none can show a secret.

mod markdown;
mod text;

use serde::Serialize;

use crate::dry_run::{Outcome, Tally};
use crate::plan::Delta;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Markdown,
    Json,
}

pub fn render(outcomes: &[Outcome], format: Format, color: bool) -> String {
    let tally = Tally::of(outcomes);
    match format {
        Format::Text => text::render(outcomes, &tally, color),
        Format::Markdown => markdown::render(outcomes, &tally),
        Format::Json => json(outcomes, &tally),
    }
}

/// The summary `apply` prints: one line per unit, then the journal of any that failed.
pub fn render_apply(reports: &[crate::apply::UnitReport], format: Format) -> String {
    if format == Format::Json {
        let mut s = serde_json::to_string_pretty(&serde_json::json!({ "units": reports }))
            .expect("reports serialize");
        s.push('\n');
        return s;
    }
    let mut out = String::new();
    for r in reports {
        let outcome = serde_json::to_value(r.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "{} {}: {} ({:.1}s): {}\n",
            r.host,
            r.unit,
            outcome.replace('_', " "),
            r.seconds,
            r.detail
        ));
        if let Some(journal) = r.journal.as_deref().filter(|j| !j.trim().is_empty()) {
            out.push_str("  journal since the failed start:\n");
            for line in journal.lines() {
                out.push_str(&format!("    {line}\n"));
            }
        }
    }
    out
}

fn json(outcomes: &[Outcome], tally: &Tally) -> String {
    #[derive(Serialize)]
    struct Document<'a> {
        units: &'a [Outcome],
        tally: &'a Tally,
    }
    let mut s = serde_json::to_string_pretty(&Document {
        units: outcomes,
        tally,
    })
    .expect("plans serialize");
    s.push('\n');
    s
}

/// `+ name value`, `- name value` or `~ name old -> new`.
fn delta_line(d: &Delta) -> String {
    let value = |v: &Option<String>| match v.as_deref() {
        Some("") | None => String::new(),
        Some(v) => format!(" {v}"),
    };
    match (&d.old, &d.new) {
        (None, _) => format!("+ {}{}", d.name, value(&d.new)),
        (_, None) => format!("- {}{}", d.name, value(&d.old)),
        (Some(o), Some(n)) => format!("~ {} {} -> {}", d.name, shown(o), shown(n)),
    }
}

fn shown(v: &str) -> &str {
    if v.is_empty() {
        "(on)"
    } else {
        v
    }
}

fn tally_line(t: &Tally) -> String {
    format!(
        "{} to install, {} to restart, {} reload only, {} unchanged, {} failed to plan",
        t.install, t.restart, t.reload_only, t.unchanged, t.errors
    )
}
