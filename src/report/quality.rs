//! Showing the quality gate's figures: `reconcile quality`'s per-host results (apply's `quality`
//! stage shows as a stage, its figures in the JSON report).

use std::fmt::Write;

use super::Format;
use crate::quality::hosts::HostQuality;

pub fn render(results: &[HostQuality], format: Format) -> String {
    super::render_hosts(results, format, |out, r| {
        let what = match (&r.error, &r.stored) {
            (Some(_), _) => "error",
            (None, Some(_)) => "reference kept",
            (None, None) => "measured",
        };
        let detail = r.quality.as_ref().map(|q| q.detail.as_str());
        let detail = r.error.as_deref().or(detail).unwrap_or_default();
        super::host_line(out, &r.host, &r.unit, r.seconds, what, detail);
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
    })
}
