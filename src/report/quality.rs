//! Showing the quality gate's figures: `reconcile quality`'s per-host results (apply's `quality`
//! stage shows as a stage, its figures in the JSON report).

use std::fmt::Write;

use super::Format;
use crate::quality::hosts::HostQuality;

pub fn render(results: &[HostQuality], format: Format) -> String {
    if format == Format::Json {
        return super::hosts_json(results);
    }
    let mut out = String::new();
    for r in results {
        let what = match (&r.error, &r.stored) {
            (Some(_), _) => "error",
            (None, Some(_)) => "reference kept",
            (None, None) => "measured",
        };
        let detail = r.quality.as_ref().map(|q| q.detail.as_str());
        super::host_line(
            &mut out,
            &r.host,
            &r.unit,
            r.seconds,
            what,
            r.error.as_deref(),
            detail,
        );
        if let Some(path) = &r.stored {
            let _ = writeln!(out, "  reference: {path}");
        }
        for note in r
            .notes
            .iter()
            .chain(r.quality.iter().flat_map(|q| &q.notes))
        {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    super::terminal::text(out)
}
