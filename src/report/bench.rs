//! Showing the throughput benchmark's figures: `reconcile bench`'s per-host results, and the
//! per-level lines of apply's `benchmark` stage.

use std::fmt::Write;

use super::Format;
use crate::bench::hosts::HostBench;
use crate::benchmark::{thousands, Level};

pub fn render(results: &[HostBench], format: Format) -> String {
    super::render_hosts(results, format, |out, r| {
        let what = match (&r.error, r.stored) {
            (Some(_), _) => "error",
            (None, true) => "baseline stored",
            (None, false) => "measured",
        };
        let detail = r.benchmark.as_ref().map(|b| b.detail.as_str());
        let detail = r.error.as_deref().or(detail).unwrap_or_default();
        super::host_line(out, &r.host, &r.unit, r.seconds, what, detail);
        for note in &r.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        if let Some(b) = &r.benchmark {
            level_lines(out, "  ", &b.levels);
        }
    })
}

/// A table of the levels' figures, each line starting with `prefix`.
pub fn level_lines(out: &mut String, prefix: &str, levels: &[Level]) {
    if levels.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{prefix}{:>5}  {:>9}  {:>7}  {:>9}  {:>9}  {:>8}  {:>8}  errors",
        "conc", "tok/s", "req/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"
    );
    for l in levels {
        let _ = writeln!(
            out,
            "{prefix}{:>5}  {:>9}  {:>7.2}  {:>7.0}ms  {:>7.0}ms  {:>6.1}ms  {:>6.1}ms  {}",
            l.concurrency,
            thousands(l.output_tokens_per_s),
            l.requests_per_s,
            l.ttft_p50_ms,
            l.ttft_p99_ms,
            l.itl_p50_ms,
            l.itl_p99_ms,
            l.errors
        );
    }
}
