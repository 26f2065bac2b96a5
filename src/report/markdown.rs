//! A pull request comment: a summary table, then each distinct change's diff folded away, the
//! same change on many hosts once. It stays within GitHub's size limit for a comment.

use std::fmt::Write;

use super::{delta_line, preflight_line, tally_line};
use crate::dry_run::{PlanOutcome, Tally};
use crate::plan::{UnitPlan, Verdict};
use crate::preflight::Severity;
use reconcile_core::shared_change::{shared_changes, SharedChange};

/// GitHub refuses a comment body over 65,536 characters (its REST API answers 422, "body is too
/// long (maximum is 65536 characters)"), which a plan of a few dozen hosts passed when every host
/// had its own copy of the same diff.
const GITHUB_COMMENT_LIMIT: usize = 65_536;

/// Room left for what a workflow wraps around the plan: the example workflow adds a marker and a
/// heading line (under 100 characters) and a folded stderr, which is short unless a run fails.
const WRAPPER_ROOM: usize = 1_536;

/// The most a plan in markdown takes, in bytes: a byte is at least one character however GitHub
/// counts (UTF-16 code units or code points), so the comment is never over the limit.
pub const BUDGET: usize = GITHUB_COMMENT_LIMIT - WRAPPER_ROOM;

/// Room kept at the end, past the budget's cut, for the line that says what was left out.
const LEFT_OUT_ROOM: usize = 400;

pub(super) const HEAD: &str =
    "### reconcile plan\n\n| hosts | unit | verdict | changes |\n|---|---|---|---|\n";

pub fn render(outcomes: &[PlanOutcome], tally: &Tally) -> String {
    let changes = shared_changes(outcomes);
    let rows: Vec<String> = changes.iter().map(row).collect();
    let diffs: Vec<String> = changes.iter().filter_map(details).collect();
    let tally = format!("\n{}\n\n", tally_line(tally));
    let whole = HEAD.len()
        + rows.iter().map(String::len).sum::<usize>()
        + tally.len()
        + diffs.iter().map(String::len).sum::<usize>();
    if whole <= BUDGET {
        return [HEAD.to_string(), rows.concat(), tally, diffs.concat()].concat();
    }
    within_budget(&rows, &tally, &diffs)
}

/// The table and the diffs, as many of each as fit in [`BUDGET`] (the table first), and a line
/// that says what was left out and where the whole plan is.
fn within_budget(rows: &[String], tally: &str, diffs: &[String]) -> String {
    let limit = BUDGET - LEFT_OUT_ROOM;
    let mut out = String::from(HEAD);
    let fit = |out: &str, more: usize| out.len() + more <= limit;
    let rows_shown = rows
        .iter()
        .take_while(|r| {
            let room = fit(&out, r.len() + tally.len());
            if room {
                out.push_str(r);
            }
            room
        })
        .count();
    out.push_str(tally);
    let diffs_shown = diffs
        .iter()
        .take_while(|d| {
            let room = fit(&out, d.len());
            if room {
                out.push_str(d);
            }
            room
        })
        .count();
    let mut left_out = Vec::new();
    if rows_shown < rows.len() {
        left_out.push(format!(
            "the last {} of the table's {} rows",
            rows.len() - rows_shown,
            rows.len()
        ));
    }
    if diffs_shown < diffs.len() {
        left_out.push(format!(
            "the last {} of {} diffs",
            diffs.len() - diffs_shown,
            diffs.len()
        ));
    }
    let _ = writeln!(
        out,
        "**Left out**, to keep this under GitHub's limit of {GITHUB_COMMENT_LIMIT} characters for a \
         comment: {}. The tally above counts every unit; `reconcile plan --out plan.json` writes the \
         whole plan, every unit's diff included.",
        left_out.join(" and ")
    );
    out
}

/// One row of the summary table: a change, with every host it is on.
pub(super) fn row(g: &SharedChange<'_>) -> String {
    let (unit, verdict, changes) = match g.outcome {
        PlanOutcome::Planned(p) => (&p.unit, verdict_cell(p.verdict), changes_cell(p)),
        PlanOutcome::Error { unit, error, .. } => (unit, "**error**".to_string(), cell(error)),
    };
    format!(
        "| {} | {} | {verdict} | {changes} |\n",
        cell(&hosts_cell(g)),
        cell(unit)
    )
}

/// `gpu-a`, or `gpu-01..gpu-16 (16 hosts)`.
fn hosts_cell(g: &SharedChange<'_>) -> String {
    match g.hosts.len() {
        1 => g.hosts_shown(),
        n => format!("{} ({n} hosts)", g.hosts_shown()),
    }
}

/// A change's diff, folded away; none for an error or a unit that does not change.
pub(super) fn details(g: &SharedChange<'_>) -> Option<String> {
    let PlanOutcome::Planned(p) = g.outcome else {
        return None;
    };
    let diff = g.diff();
    if diff.is_empty() {
        return None;
    }
    let fence = if diff.contains("```") { "~~~~" } else { "```" };
    Some(format!(
        "<details><summary>{} · {} · {}</summary>\n\n{fence}diff\n{diff}{fence}\n\n</details>\n\n",
        html(&hosts_cell(g)),
        html(&p.unit),
        p.verdict.describe(),
    ))
}

fn verdict_cell(v: Verdict) -> String {
    match v {
        Verdict::NoChange => "no change".into(),
        Verdict::ReloadOnly => "reload only".into(),
        Verdict::Live => "live, no restart".into(),
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
    // What systemd runs besides the managed file, before the values it changes.
    let drift = p.drift.iter().map(|d| match d.path() {
        Some(path) => format!("**{}** `{}`", d.kind(), html(path)),
        None => format!("**{}**", d.kind()),
    });
    lines.splice(0..0, drift);
    if let Some(w) = &p.pinned {
        lines.push(format!("weights: {}", html(&w.line())));
    }
    if p.judged_on_quality {
        lines.push("judged on quality (`verify.quality`)".into());
    }
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
