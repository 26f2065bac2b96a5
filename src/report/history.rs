//! Showing `reconcile history`: per host the numbered deployments (the current one marked), the
//! generations an apply kept, and notes; or JSON for tools (markdown prints the text).

use std::fmt::Write;

use super::{short, Format, COMMIT_SHOWN, SHA_SHOWN};
use crate::history::{Deployment, GenerationEntry, HostHistory};
use crate::state::Record;

pub fn render(histories: &[HostHistory], format: Format) -> String {
    if format == Format::Json {
        return super::hosts_json(histories);
    }
    let mut out = String::new();
    for h in histories {
        if let Some(e) = &h.error {
            let _ = writeln!(out, "{} {}: error: {e}", h.host, h.unit);
            continue;
        }
        heading(&mut out, h);
        for d in &h.deployments {
            deployment_line(&mut out, d);
        }
        generation_lines(&mut out, &h.generations);
        if !h.moved_aside.is_empty() {
            let _ = writeln!(
                out,
                "  moved aside (files an apply took out of systemd's way; a failed apply put them back, or restore them from the record):"
            );
            for m in &h.moved_aside {
                let _ = writeln!(
                    out,
                    "    {}  {}  {}",
                    m.moved_at,
                    m.paths.join(", "),
                    m.record
                );
            }
        }
        for note in &h.notes {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    super::terminal::text(out)
}

/// `gpu-a s.service: 3 deployments, current: 3`, and the table's header when there is a table.
fn heading(out: &mut String, h: &HostHistory) {
    let current = h
        .deployments
        .iter()
        .find(|d| d.current)
        .map_or("none".to_string(), |d| d.n.to_string());
    let _ = writeln!(
        out,
        "{} {}: {} deployment{}, current: {current}",
        h.host,
        h.unit,
        h.deployments.len(),
        if h.deployments.len() == 1 { "" } else { "s" }
    );
    if !h.deployments.is_empty() {
        let _ = writeln!(
            out,
            "     {:>3}  {:<20}  {:<7}  {:<12}  {:<12}  {:>6}  {:<4}  outcome",
            "N", "applied at", "commit", "manifest", "unit", "load", "kept"
        );
    }
}

/// A sha256 as shown. Records come from hosts: any text may be there.
fn sha(sha: &str) -> &str {
    short(sha, SHA_SHOWN)
}

fn deployment_line(out: &mut String, d: &Deployment) {
    let mark = if d.current { "*" } else { " " };
    let Some(r) = &d.record else {
        let why = d.unreadable.as_deref().unwrap_or("unknown reason");
        let _ = writeln!(out, "   {mark} {:>3}  (unreadable record: {why})", d.n);
        return;
    };
    let commit = r
        .git_commit
        .as_deref()
        .map_or("-", |c| short(c, COMMIT_SHOWN));
    let load = r
        .load_seconds
        .map_or("-".to_string(), |s| format!("{s:.1}s"));
    let _ = writeln!(
        out,
        "   {mark} {:>3}  {:<20}  {:<7}  {:<12}  {:<12}  {:>6}  {:<4}  {}",
        d.n,
        r.applied_at,
        commit,
        sha(&r.manifest_sha256),
        sha(&r.unit_sha256),
        load,
        if d.saved { "yes" } else { "no" },
        outcome(r)
    );
}

fn generation_lines(out: &mut String, generations: &[GenerationEntry]) {
    if generations.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  generations (units an apply replaced, kept to fall back on):"
    );
    for g in generations {
        let from = g
            .deployment
            .map_or("not from a recorded deployment".to_string(), |n| {
                format!("deployment {n}'s unit")
            });
        let _ = writeln!(
            out,
            "    {}  unit {}  {from}",
            g.saved_at,
            sha(&g.unit_sha256)
        );
    }
}

/// `converged`, or `rollback to 2 (converged)`; then the output tokens/s at the benchmark's
/// highest level when it ran (`converged  64: 1,540 tok/s`).
fn outcome(r: &Record) -> String {
    let outcome = match r.restored_from {
        Some(n) => format!("rollback to {n} ({})", r.outcome),
        None => r.outcome.clone(),
    };
    let outcome = match r.benchmark.as_ref().and_then(|b| b.highest()) {
        Some(l) => format!(
            "{outcome}  {}: {} tok/s",
            l.concurrency,
            crate::benchmark::thousands(l.output_tokens_per_s)
        ),
        None => outcome,
    };
    // The quality stage's KL against the reference, and the needle's pass rate.
    let Some(q) = &r.quality else {
        return outcome;
    };
    let mut shown = format!("{outcome}  quality {}", q.verdict);
    if let Some(kl) = q.kl_mean {
        shown.push_str(&format!(", KL {kl:.4}"));
    }
    if let Some(kl) = q.text_kl_mean {
        shown.push_str(&format!(", text KL {kl:.4}"));
    }
    if let (Some(passed), Some(total)) = (q.needle_passed, q.needle_total) {
        shown.push_str(&format!(", needle {passed}/{total}"));
    }
    shown
}
