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
