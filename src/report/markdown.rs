//! A pull request comment: a summary table, then each changed unit's diff folded away.

use std::fmt::Write;

use super::{delta_line, preflight_line, tally_line};
use crate::dry_run::{PlanOutcome, Tally};
use crate::plan::{UnitPlan, Verdict};
use crate::preflight::Severity;

pub fn render(outcomes: &[PlanOutcome], tally: &Tally) -> String {
    let mut out = String::from(
        "### reconcile plan\n\n| host | unit | verdict | changes |\n|---|---|---|---|\n",
    );
    for o in outcomes {
        let (host, unit, verdict, changes) = match o {
            PlanOutcome::Planned(p) => (&p.host, &p.unit, verdict_cell(p.verdict), changes_cell(p)),
            PlanOutcome::Error {
                host, unit, error, ..
            } => (host, unit, "**error**".to_string(), cell(error)),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {verdict} | {changes} |",
            cell(host),
            cell(unit)
        );
    }
    let _ = writeln!(out, "\n{}\n", tally_line(tally));
    for p in outcomes.iter().filter_map(|o| match o {
        PlanOutcome::Planned(p) if !p.diff.is_empty() => Some(p),
        _ => None,
    }) {
        let fence = if p.diff.contains("```") {
            "~~~~"
        } else {
            "```"
        };
        let _ = writeln!(
            out,
            "<details><summary>{} · {} · {}</summary>\n\n{fence}diff\n{}{fence}\n\n</details>\n",
            html(&p.host),
            html(&p.unit),
            p.verdict.describe(),
            p.diff
        );
    }
    out
}

fn verdict_cell(v: Verdict) -> String {
    match v {
        Verdict::NoChange => "no change".into(),
        Verdict::ReloadOnly => "reload only".into(),
        Verdict::Restart => "**restart**".into(),
        Verdict::Install => "**install**".into(),
    }
}

fn changes_cell(p: &UnitPlan) -> String {
    let s = &p.summary;
    let mut lines: Vec<String> = if p.verdict == Verdict::Install {
        vec![format!(
            "new unit: {} flags, {} env",
            s.flags.len(),
            s.env.len()
        )]
    } else {
        s.command
            .iter()
            .chain(&s.flags)
            .chain(&s.env)
            .chain(&s.settings)
            .map(|d| format!("`{}`", delta_line(d)))
            .collect()
    };
    // Preflight first: a unit its host cannot run matters more than what changes in it.
    let preflight = p.preflight.iter().map(|f| match f.severity {
        Severity::Error => format!("**preflight {}**", html(&preflight_line(f))),
        Severity::Warning => format!("preflight {}", html(&preflight_line(f))),
    });
    lines.splice(0..0, preflight);
    cell(&lines.join("<br>"))
}

/// Table cells cannot hold `|` or newlines.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
