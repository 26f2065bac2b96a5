//! Showing what a command found: text for a terminal, markdown for a pull request comment, JSON
//! for tools. A plan (here), an apply's reports, a status (`status`), a history (`history`) and an
//! agent's rounds (`agent`): every format is built from the same redacted results, so none can
//! show a secret. No command's result is printed below the face (only live progress and signal
//! notices go to stderr from there).

pub mod agent;
pub mod bench;
pub mod coordinator;
pub mod experiment;
#[cfg(test)]
mod fleet_tests;
pub mod history;
mod markdown;
pub mod quality;
pub mod status;
pub use reconcile_core::terminal;
mod text;

use serde::Serialize;

use crate::dry_run::{PlanOutcome, Tally};
use crate::plan::Delta;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Markdown,
    Json,
}

pub use crate::digest::{short, COMMIT_SHOWN, SHA_SHOWN};

/// The JSON of a per-host command (`history`, `bench`, `quality`): its results under `"hosts"`.
fn hosts_json<T: Serialize>(hosts: &[T]) -> String {
    to_json(&serde_json::json!({ "format_version": JSON_FORMAT_VERSION, "hosts": hosts }))
}

/// A measuring command's report (`bench`, `quality`): JSON, or `host`'s lines for each host.
fn render_hosts<T: Serialize>(
    results: &[T],
    format: Format,
    mut host: impl FnMut(&mut String, &T),
) -> String {
    if format == Format::Json {
        return hosts_json(results);
    }
    let mut out = String::new();
    for r in results {
        host(&mut out, r);
    }
    terminal::text(out)
}

/// A measuring command's first line for one host: what became of it, how long it took, and the
/// error when there was one, else the figures' detail.
fn host_line(out: &mut String, host: &str, unit: &str, seconds: f64, what: &str, detail: &str) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "{host} {unit}: {what} in {seconds:.1}s: {detail}");
}

/// `value` as pretty JSON and a newline. serde_json fails only on a map with non-string keys or a
/// `Serialize` that errors, and no type shown has either (a float that is not finite becomes
/// `null`); should one ever, the output says so, as JSON, instead of the run panicking. Every
/// control character in its strings is a JSON escape ([`terminal::json_controls`]).
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    match serde_json::to_string_pretty(value) {
        Ok(mut s) => {
            s.push('\n');
            terminal::json_controls(s)
        }
        Err(e) => format!(
            "{{\"error\": {}}}\n",
            serde_json::Value::String(format!("the output could not be written as JSON: {e}"))
        ),
    }
}

pub fn render(outcomes: &[PlanOutcome], format: Format, color: bool) -> String {
    let tally = Tally::of(outcomes);
    match format {
        Format::Text => text::render(outcomes, &tally, color),
        Format::Markdown => terminal::text(markdown::render(outcomes, &tally)),
        Format::Json => json(outcomes, &tally),
    }
}

/// The summary `apply` prints: one block per unit, with its stages, memory trajectory, notes and
/// the journal of a failed start (host text, its controls escaped).
pub fn render_apply(reports: &[crate::apply::UnitReport], format: Format) -> String {
    if format == Format::Json {
        return to_json(
            &serde_json::json!({ "format_version": JSON_FORMAT_VERSION, "units": reports }),
        );
    }
    let mut out = String::new();
    for r in reports {
        let outcome = serde_json::to_value(r.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "{} {}: {} in {:.1}s: {}\n",
            r.host,
            r.unit,
            outcome.replace('_', " "),
            r.seconds,
            r.detail
        ));
        if let Some(d) = &r.diagnosis {
            out.push_str(&format!("  cause: {}\n  advice: {}\n", d.cause, d.advice));
        }
        for note in &r.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
        for (label, v) in [("new unit", &r.verification), ("rollback", &r.rollback)] {
            if let Some(v) = v {
                verification_lines(&mut out, label, v);
            }
        }
        if let Some(b) = &r.benchmark {
            bench::level_lines(&mut out, "  benchmark: ", &b.levels);
        }
        if let Some(journal) = r.journal.as_deref().filter(|j| !j.trim().is_empty()) {
            out.push_str("  journal of the failed start (last lines):\n");
            for line in journal.lines() {
                out.push_str(&format!("    {}\n", cut_line(line)));
            }
        }
    }
    terminal::text(out)
}

/// How much of one journal line a text report shows: two lines of a wide terminal. SGLang logs
/// its resolved arguments on one line (`server_args=ServerArgs(...)`, about 4,000 characters),
/// which would bury the lines around it; the JSON report keeps every line whole.
const JOURNAL_LINE_SHOWN: usize = 300;

/// A journal line as a text report shows it: cut at [`JOURNAL_LINE_SHOWN`] characters, with a
/// marker that says how much was left out and where it is whole.
fn cut_line(line: &str) -> std::borrow::Cow<'_, str> {
    match line.char_indices().nth(JOURNAL_LINE_SHOWN) {
        None => std::borrow::Cow::Borrowed(line),
        Some((at, _)) => {
            let left = line[at..].chars().count();
            std::borrow::Cow::Owned(format!(
                "{} [... {left} more characters; --format json has the whole line]",
                &line[..at]
            ))
        }
    }
}

fn verification_lines(out: &mut String, label: &str, v: &crate::verify::Verification) {
    for stage in &v.stages {
        let mark = if stage.passed { "ok  " } else { "FAIL" };
        out.push_str(&format!(
            "  {label}: {mark} {:<12} {:>6.1}s  {}\n",
            stage.name, stage.seconds, stage.detail
        ));
    }
    if let (Some(first), Some(last)) = (v.samples.first(), v.samples.last()) {
        let mem =
            |s: &crate::verify::Sample| s.service_bytes.map_or("?".into(), crate::verify::bytes);
        let gpus = if last.gpu_mib.is_empty() {
            String::new()
        } else {
            format!("; GPUs {:?} MiB", last.gpu_mib)
        };
        out.push_str(&format!(
            "  {label}: memory {} -> {} over {} samples {}{gpus}\n",
            mem(first),
            mem(last),
            v.samples.len(),
            v.sparkline()
        ));
    }
    learned_lines(out, label, v);
    for note in &v.notes {
        out.push_str(&format!("  {label}: note: {note}\n"));
    }
}

/// This load against the unit's last good one: its time, and both memory trajectories on one
/// time axis ("this load" and "last load", aligned).
fn learned_lines(out: &mut String, label: &str, v: &crate::verify::Verification) {
    let Some(h) = &v.previous_loads else { return };
    if let Some(load) = v.load_seconds {
        out.push_str(&format!(
            "  {label}: ready after {load:.1}s (last good load {:.1}s)\n",
            h.last()
        ));
    }
    let now = reconcile_core::learned::trajectory(&v.samples);
    if let Some((this, last)) = h.sparklines(&now, SPARK_COLUMNS) {
        out.push_str(&format!(
            "  {label}: this load {this}\n  {label}: last load {last}\n"
        ));
    }
}

/// Columns of the aligned sparklines.
const SPARK_COLUMNS: usize = 32;

/// The version of every JSON document reconcile prints (`--format json` of plan, apply, status,
/// history and bench); it goes up when a field changes meaning or goes away, not when one is added.
pub const JSON_FORMAT_VERSION: u32 = 1;

fn json(outcomes: &[PlanOutcome], tally: &Tally) -> String {
    #[derive(Serialize)]
    struct Document<'a> {
        format_version: u32,
        units: &'a [PlanOutcome],
        tally: &'a Tally,
        groups: Vec<SharedChangeJson<'a>>,
    }
    /// The same change on many hosts, as text and markdown show it once: its `unit` on each of
    /// `hosts` names an entry of `units`. `outcome` and `verdict` are those of the entries.
    #[derive(Serialize)]
    struct SharedChangeJson<'a> {
        unit: &'a str,
        outcome: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        verdict: Option<crate::plan::Verdict>,
        hosts: Vec<&'a str>,
        hosts_shown: String,
    }
    let groups = reconcile_core::shared_change::shared_changes(outcomes)
        .into_iter()
        .map(|g| {
            let (unit, outcome, verdict) = match g.outcome {
                PlanOutcome::Planned(p) => (p.unit.as_str(), "planned", Some(p.verdict)),
                PlanOutcome::Error { unit, .. } => (unit.as_str(), "error", None),
            };
            SharedChangeJson {
                unit,
                outcome,
                verdict,
                hosts_shown: g.hosts_shown(),
                hosts: g.hosts,
            }
        })
        .collect();
    to_json(&Document {
        format_version: JSON_FORMAT_VERSION,
        units: outcomes,
        tally,
        groups,
    })
}

/// `+ name value`, `- name value` or `~ name old -> new`.
fn delta_line(d: &Delta) -> String {
    let value = |v: &Option<String>| match v.as_deref() {
        Some("") | None => String::new(),
        Some(v) => format!(" {v}"),
    };
    let line = match (&d.old, &d.new) {
        (None, _) => format!("+ {}{}", d.name, value(&d.new)),
        (_, None) => format!("- {}{}", d.name, value(&d.old)),
        (Some(o), Some(n)) => format!("~ {} {} -> {}", d.name, shown(o), shown(n)),
    };
    match &d.from {
        // The old value is a drop-in's (or another file's), not the managed unit's.
        Some(file) if d.old.is_some() => format!("{line}  (now from {file})"),
        _ => line,
    }
}

fn shown(v: &str) -> &str {
    if v.is_empty() {
        "(on)"
    } else {
        v
    }
}

fn tally_line(t: &Tally) -> String {
    let mut line = format!("{} to install, {} to restart, ", t.install, t.restart);
    // Only where the manifests ask for live changes: the line stays as it was elsewhere.
    if t.live > 0 {
        line.push_str(&format!("{} live (no restart), ", t.live));
    }
    line.push_str(&format!(
        "{} reload only, {} unchanged, {} failed to plan",
        t.reload_only, t.unchanged, t.errors
    ));
    if t.preflight_errors > 0 {
        line.push_str(&format!(", {} failed preflight", t.preflight_errors));
    }
    // Only where the manifests pin weights that hosts lack: the line stays as it was elsewhere.
    if t.fetching > 0 {
        line.push_str(&format!(
            "; {} of pinned weights to fetch first ({} unit{})",
            reconcile_core::pinned::human_bytes(t.fetch_bytes),
            t.fetching,
            if t.fetching == 1 { "" } else { "s" }
        ));
    }
    line
}

/// `error: ...` or `warning: ...`, for a preflight finding.
fn preflight_line(f: &crate::preflight::Finding) -> String {
    let severity = match f.severity {
        crate::preflight::Severity::Error => "error",
        crate::preflight::Severity::Warning => "warning",
    };
    format!("{severity}: {}", f.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_verification_shows_the_last_good_load_beside_its_own() {
        use reconcile_core::learned::{LoadHistory, Point};
        let point = |seconds: f64, gpu: u64| Point {
            seconds,
            service_bytes: None,
            gpu_mib: Some(gpu),
        };
        let sample = |seconds: f64, gpu: u64| crate::verify::Sample {
            seconds,
            gpu_mib: vec![gpu],
            ..Default::default()
        };
        let mut v = crate::verify::Verification {
            load_seconds: Some(9.4),
            samples: vec![sample(0.0, 0), sample(4.0, 50), sample(9.4, 100)],
            ..Default::default()
        };
        let mut without = String::new();
        verification_lines(&mut without, "new unit", &v);
        assert!(!without.contains("last"), "{without}");
        v.previous_loads = Some(LoadHistory {
            load_seconds: vec![9.8],
            trajectory: vec![point(0.0, 0), point(8.0, 100), point(9.8, 100)],
        });
        let mut out = String::new();
        verification_lines(&mut out, "new unit", &v);
        assert!(
            out.contains("  new unit: ready after 9.4s (last good load 9.8s)\n"),
            "{out}"
        );
        let this = out.lines().find(|l| l.contains("this load")).unwrap();
        let last = out.lines().find(|l| l.contains("last load")).unwrap();
        assert!(this.starts_with("  new unit: this load ▁"), "{out}");
        assert!(last.starts_with("  new unit: last load ▁"), "{out}");
        // One time axis: the slower last load runs one column longer.
        assert_eq!(this.chars().count() + 1, last.chars().count(), "{out}");
    }

    #[test]
    fn short_cuts_on_characters_not_bytes() {
        assert_eq!(short("0123456789abcdef", COMMIT_SHOWN), "0123456");
        assert_eq!(short("abc", SHA_SHOWN), "abc");
        assert_eq!(short("", 7), "");
        // A byte slice `[..7]` of these panics: the 7th byte falls inside a character.
        assert_eq!(short("ééééééééé", 7), "ééééééé");
        assert_eq!(short("日本語のコミット番号", 7), "日本語のコミッ");
        assert_eq!(short("a🦀b", 2), "a🦀");
        assert_eq!(short("🦀", 0), "");
    }

    #[test]
    fn json_output_ends_with_a_newline() {
        assert_eq!(to_json(&serde_json::json!({"a": 1})), "{\n  \"a\": 1\n}\n");
        // A float that is not finite is `null`, not an error.
        assert_eq!(to_json(&f64::NAN), "null\n");
    }

    #[test]
    fn a_diagnosis_is_two_lines_under_its_unit_and_absent_from_json_without_one() {
        use crate::apply::{refused, Outcome};
        let mut report = refused("h", "s.service", "a.yaml", Outcome::RolledBack, "d".into());
        let json = render_apply(std::slice::from_ref(&report), Format::Json);
        assert!(!json.contains("diagnosis"), "{json}");
        report.diagnosis = Some(reconcile_core::diagnose::Diagnosis {
            cause: "CUDA out of memory".into(),
            advice: "lower --mem-fraction-static".into(),
        });
        let text = render_apply(std::slice::from_ref(&report), Format::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("h s.service: rolled back in "),
            "{text}"
        );
        assert_eq!(lines[1], "  cause: CUDA out of memory");
        assert_eq!(lines[2], "  advice: lower --mem-fraction-static");
        let json: serde_json::Value =
            serde_json::from_str(&render_apply(std::slice::from_ref(&report), Format::Json))
                .unwrap();
        assert_eq!(
            json["units"][0]["diagnosis"],
            serde_json::json!({"cause": "CUDA out of memory", "advice": "lower --mem-fraction-static"})
        );
    }

    #[test]
    fn a_journal_line_too_long_to_read_is_cut_in_text_and_kept_whole_in_json() {
        use crate::apply::{refused, Outcome};
        let mut report = refused("h", "s.service", "a.yaml", Outcome::RolledBack, "d".into());
        let args = format!(
            "server_args=ServerArgs({})",
            "model_path='/m', ".repeat(300)
        );
        report.journal = Some(format!("loading\n{args}\nTraceback\n"));
        let text = render_apply(std::slice::from_ref(&report), Format::Text);
        let shown = text.lines().find(|l| l.contains("server_args=")).unwrap();
        assert!(shown.chars().count() < JOURNAL_LINE_SHOWN + 80, "{shown}");
        assert!(
            shown.ends_with(&format!(
                "[... {} more characters; --format json has the whole line]",
                args.chars().count() - JOURNAL_LINE_SHOWN
            )),
            "{shown}"
        );
        assert!(
            text.contains("    loading\n") && text.contains("    Traceback\n"),
            "{text}"
        );
        let json = render_apply(std::slice::from_ref(&report), Format::Json);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(value["units"][0]["journal"]
            .as_str()
            .unwrap()
            .contains(&args));
    }

    #[test]
    fn a_journal_line_that_drives_a_terminal_is_shown_escaped_and_kept_whole_in_json() {
        use crate::apply::{refused, Outcome};
        let mut report = refused("h", "s.service", "a.yaml", Outcome::RolledBack, "d".into());
        let journal = "loading\n\x1b]0;owned\x07title set\n\x1b[2Jscreen cleared\n";
        report.journal = Some(journal.into());
        report.notes = vec!["guard: \u{9b}31mred".into()];
        let text = render_apply(std::slice::from_ref(&report), Format::Text);
        assert!(
            text.contains("    \\x1b]0;owned\\x07title set\n    \\x1b[2Jscreen cleared\n"),
            "{text}"
        );
        assert!(text.contains("  note: guard: \\u{9b}31mred\n"), "{text}");
        assert!(
            !text.contains('\x1b') && !text.contains('\u{9b}'),
            "{text:?}"
        );
        let json = render_apply(std::slice::from_ref(&report), Format::Json);
        assert!(!json.contains('\x1b') && !json.contains('\u{9b}'), "{json}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["units"][0]["journal"], journal);
        assert_eq!(value["units"][0]["notes"][0], "guard: \u{9b}31mred");
    }

    #[test]
    fn live_changes_are_counted_apart_only_when_there_are_some() {
        let mut t = Tally {
            restart: 2,
            unchanged: 1,
            ..Tally::default()
        };
        assert_eq!(
            tally_line(&t),
            "0 to install, 2 to restart, 0 reload only, 1 unchanged, 0 failed to plan"
        );
        t.live = 3;
        assert_eq!(
            tally_line(&t),
            "0 to install, 2 to restart, 3 live (no restart), 0 reload only, 1 unchanged, 0 failed to plan"
        );
        assert_eq!(t.changes(), 5);
    }

    proptest! {
        #[test]
        fn short_is_a_prefix_of_at_most_n_characters(s in any::<String>(), n in 0usize..40) {
            let cut = short(&s, n);
            prop_assert!(s.starts_with(cut));
            prop_assert_eq!(cut.chars().count(), s.chars().count().min(n));
        }
    }
}
