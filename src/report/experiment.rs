//! Showing an experiment's results: the ranked table (text), the pull-request markdown with its
//! Mermaid chart, or JSON; with the winner's manifest change.

use super::{to_json, Format};
use crate::experiment::Done;

pub fn render(done: &Done, format: Format) -> String {
    if done.estimate_only {
        return match format {
            Format::Json => to_json(&serde_json::json!({
                "format_version": super::JSON_FORMAT_VERSION,
                "estimate": done.estimate,
            })),
            _ => super::terminal::text(format!("estimate: {}\n", done.estimate)),
        };
    }
    let mut out = match format {
        Format::Json => {
            let mut v = serde_json::to_value(done).unwrap_or_default();
            v["format_version"] = serde_json::json!(super::JSON_FORMAT_VERSION);
            return to_json(&v);
        }
        Format::Markdown => done.report.markdown(&done.levels),
        Format::Text => done.report.text(),
    };
    if let Some(why) = &done.needs_attention {
        out.push_str(&format!("NEEDS ATTENTION: {why}\n"));
    }
    if let Some(path) = &done.chart {
        out.push_str(&format!("\nchart: {path}\n"));
    }
    match (&done.manifest_diff, &done.written) {
        (Some(_), Some(path)) => out.push_str(&format!(
            "\n{path} now has the winner's change (review and commit it):\n"
        )),
        (Some(_), None) => out.push_str("\nthe winner's change (`--write` edits the manifest):\n"),
        _ => {}
    }
    if let Some(diff) = &done.manifest_diff {
        if format == Format::Markdown {
            out.push_str(&format!("\n```diff\n{diff}```\n"));
        } else {
            out.push_str(diff);
        }
    }
    super::terminal::text(out)
}
