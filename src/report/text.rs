//! The terminal view: a heading per change (a unit, on one host or on every host it is the same
//! change on), the change in operator terms, then the diff.
//!
//! Host text (the unit file on the host, its state, errors, preflight findings) is escaped piece
//! by piece before it is painted: escaping the whole would escape the colours too.

use std::fmt::Write;

use super::terminal::escape_controls as esc;
use super::{delta_line, preflight_line, tally_line};
use crate::dry_run::{PlanOutcome, Tally};
use crate::plan::{Delta, UnitPlan, Verdict};
use reconcile_core::shared_change::{shared_changes, SharedChange};

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

pub fn render(outcomes: &[PlanOutcome], tally: &Tally, color: bool) -> String {
    let paint = |code: &str, text: &str| {
        if color {
            format!("{code}{}{RESET}", esc(text))
        } else {
            esc(text).into_owned()
        }
    };
    let mut out = String::new();
    for g in shared_changes(outcomes) {
        match g.outcome {
            PlanOutcome::Planned(p) => unit(&mut out, &g, p, &paint),
            PlanOutcome::Error {
                host,
                unit,
                source,
                error,
            } => {
                let error = paint(RED, &format!("error: {error}"));
                let (unit, source) = (esc(unit), esc(source));
                if g.hosts.len() == 1 {
                    let _ = writeln!(out, "{} {unit} ({source}): {error}", paint(BOLD, host));
                } else {
                    let _ = writeln!(out, "{} ({source}): {error}", paint(BOLD, &unit));
                    let _ = writeln!(out, "  {}", esc(&hosts_line("same error", &g)));
                }
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out, "Plan: {}", tally_line(tally));
    // Without colours nothing here is ours to keep: the whole is escaped once more, which changes
    // nothing the pieces' escaping did.
    if color {
        out
    } else {
        super::terminal::text(out)
    }
}

/// `same change on 16 hosts: gpu-01..gpu-16`.
fn hosts_line(what: &str, g: &SharedChange<'_>) -> String {
    format!("{what} on {} hosts: {}", g.hosts.len(), g.hosts_shown())
}

fn unit(
    out: &mut String,
    g: &SharedChange<'_>,
    p: &UnitPlan,
    paint: &dyn Fn(&str, &str) -> String,
) {
    let verdict_color = match p.verdict {
        Verdict::NoChange => GREEN,
        Verdict::ReloadOnly | Verdict::Live => CYAN,
        Verdict::Restart | Verdict::Install => YELLOW,
    };
    let verdict = paint(verdict_color, p.verdict.describe());
    if g.hosts.len() == 1 {
        let _ = writeln!(out, "{} {}: {verdict}", paint(BOLD, &p.host), esc(&p.unit));
    } else {
        let _ = writeln!(out, "{}: {verdict}", paint(BOLD, &p.unit));
        let what = if p.verdict == Verdict::NoChange {
            "the same"
        } else {
            "same change"
        };
        let _ = writeln!(out, "  {}", esc(&hosts_line(what, g)));
    }
    let state = if p.state.is_loaded() {
        p.state.summary()
    } else {
        "not installed".into()
    };
    let _ = writeln!(
        out,
        "  from {}; on the host now: {}",
        esc(&p.source),
        esc(&state)
    );
    let s = &p.summary;
    if p.verdict == Verdict::Install {
        let _ = writeln!(
            out,
            "  {} flags, {} env, {} other settings",
            s.flags.len(),
            s.env.len(),
            s.settings.len()
        );
    } else {
        section(out, "command", s.command.iter());
        section(out, "flags", s.flags.iter());
        section(out, "env", s.env.iter());
        section(out, "systemd", s.settings.iter());
    }
    if let Some(w) = &p.pinned {
        let _ = writeln!(out, "  weights: {}", esc(&w.line()));
    }
    for note in &p.notes {
        let _ = writeln!(out, "  note: {}", esc(note));
    }
    for f in &p.preflight {
        let code = match f.severity {
            crate::preflight::Severity::Error => RED,
            crate::preflight::Severity::Warning => YELLOW,
        };
        let _ = writeln!(out, "  preflight: {}", paint(code, &preflight_line(f)));
    }
    diff_lines(out, &g.diff(), paint);
}

fn diff_lines(out: &mut String, diff: &str, paint: &dyn Fn(&str, &str) -> String) {
    if diff.is_empty() {
        return;
    }
    out.push('\n');
    for line in diff.lines() {
        let code = match line.as_bytes().first() {
            _ if line.starts_with("+++") || line.starts_with("---") => BOLD,
            Some(b'+') => GREEN,
            Some(b'-') => RED,
            Some(b'@') => CYAN,
            _ => "",
        };
        let _ = writeln!(
            out,
            "    {}",
            if code.is_empty() {
                esc(line).into_owned()
            } else {
                paint(code, line)
            }
        );
    }
}

fn section<'a>(out: &mut String, title: &str, deltas: impl Iterator<Item = &'a Delta>) {
    for (i, d) in deltas.enumerate() {
        let label = if i == 0 {
            format!("{title}:")
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {label:<9}{}", esc(&delta_line(d)));
    }
}
