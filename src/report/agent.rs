//! Showing `reconcile agent`'s rounds, for its journal: one line a round (the commit and every
//! unit's outcome), then the details of units that changed or failed, indented.

use std::fmt::Write;

use super::{render_apply, short, Format, SHA_SHOWN};
use crate::agent::Event;
use crate::apply::{Outcome, UnitReport};
use crate::remote::error_chain;

/// The lines `event` prints, each ending in a newline.
pub fn render(event: &Event<'_>) -> String {
    let mut out = String::new();
    match event {
        Event::Warning(w) => {
            let _ = writeln!(out, "  warning: {w}");
        }
        Event::SyncFailed { repo, error } => {
            let _ = writeln!(
                out,
                "round: updating the checkout from {repo} failed, nothing touched: {error}"
            );
        }
        Event::BadManifests { commit, errors } => {
            let _ = writeln!(out, "round {}: {errors}, nothing touched", sha(commit));
            for e in &errors.0 {
                let _ = writeln!(out, "  error: {}", error_chain(e));
            }
        }
        Event::NoUnits { commit, names } => {
            let _ = writeln!(
                out,
                "round {}: no unit for this host (host `{}` in the manifests)",
                sha(commit),
                names.join("`, `")
            );
        }
        Event::Coordination(text) => {
            let _ = writeln!(out, "  coordinator: {text}");
        }
        Event::Applied {
            commit,
            author,
            reports,
        } => applied(&mut out, sha(commit), author, reports),
    }
    super::terminal::text(out)
}

fn sha(commit: &str) -> &str {
    short(commit, SHA_SHOWN)
}

fn applied(out: &mut String, short: &str, author: &str, reports: &[UnitReport]) {
    let _ = writeln!(out, "{}", round_line(short, author, reports));
    let eventful: Vec<UnitReport> = reports
        .iter()
        .filter(|r| r.outcome != Outcome::Unchanged)
        .cloned()
        .collect();
    if !eventful.is_empty() {
        for line in render_apply(&eventful, Format::Text).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
}

fn round_line(short: &str, author: &str, reports: &[UnitReport]) -> String {
    let units: Vec<String> = reports
        .iter()
        .map(|r| format!("{} {} {}", r.host, r.unit, r.outcome.name()))
        .collect();
    format!("round {short} ({author}): {}", units.join("; "))
}
