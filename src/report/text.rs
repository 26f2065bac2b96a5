//! The terminal view: a heading per unit, the change in operator terms, then the diff.

use std::fmt::Write;

use super::{delta_line, preflight_line, tally_line};
use crate::dry_run::{PlanOutcome, Tally};
use crate::plan::{Delta, UnitPlan, Verdict};

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

pub fn render(outcomes: &[PlanOutcome], tally: &Tally, color: bool) -> String {
    let paint = |code: &str, text: &str| {
        if color {
            format!("{code}{text}{RESET}")
        } else {
            text.to_string()
        }
    };
    let mut out = String::new();
    for o in outcomes {
        match o {
            PlanOutcome::Planned(p) => unit(&mut out, p, &paint),
            PlanOutcome::Error {
                host,
                unit,
                source,
                error,
            } => {
                let _ = writeln!(
                    out,
                    "{} {unit} ({source}): {}",
                    paint(BOLD, host),
                    paint(RED, &format!("error: {error}"))
                );
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out, "Plan: {}", tally_line(tally));
    out
}

fn unit(out: &mut String, p: &UnitPlan, paint: &dyn Fn(&str, &str) -> String) {
    let verdict_color = match p.verdict {
        Verdict::NoChange => GREEN,
        Verdict::ReloadOnly => CYAN,
        Verdict::Restart | Verdict::Install => YELLOW,
    };
    let _ = writeln!(
        out,
        "{} {}: {}",
        paint(BOLD, &p.host),
        p.unit,
        paint(verdict_color, p.verdict.describe())
    );
    let state = if p.state.is_loaded() {
        p.state.summary()
    } else {
        "not installed".into()
    };
    let _ = writeln!(out, "  from {}; on the host now: {state}", p.source);
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
    for note in &p.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    for f in &p.preflight {
        let code = match f.severity {
            crate::preflight::Severity::Error => RED,
            crate::preflight::Severity::Warning => YELLOW,
        };
        let _ = writeln!(out, "  preflight: {}", paint(code, &preflight_line(f)));
    }
    if !p.diff.is_empty() {
        out.push('\n');
        for line in p.diff.lines() {
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
                    line.to_string()
                } else {
                    paint(code, line)
                }
            );
        }
    }
}

fn section<'a>(out: &mut String, title: &str, deltas: impl Iterator<Item = &'a Delta>) {
    for (i, d) in deltas.enumerate() {
        let label = if i == 0 {
            format!("{title}:")
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {label:<9}{}", delta_line(d));
    }
}
