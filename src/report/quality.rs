//! Showing the quality gate's figures: `reconcile quality`'s per-host results (apply's `quality`
//! stage shows as a stage, its figures in the JSON report).

use std::fmt::Write;

use super::{to_json, Format};
use crate::quality::hosts::HostQuality;

pub fn render(results: &[HostQuality], format: Format) -> String {
    if format == Format::Json {
        return to_json(
            &serde_json::json!({ "format_version": super::JSON_FORMAT_VERSION, "hosts": results }),
        );
    }
    let mut out = String::new();
    for r in results {
        let what = match (&r.error, &r.stored) {
            (Some(_), _) => "error",
            (None, Some(_)) => "reference kept",
            (None, None) => "measured",
        };
        let detail = match (&r.error, &r.quality) {
            (Some(e), _) => e.clone(),
            (None, Some(q)) => q.detail.clone(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "{} {}: {what} in {:.1}s: {detail}",
            r.host, r.unit, r.seconds
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
