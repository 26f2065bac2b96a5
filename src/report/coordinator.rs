//! Showing the fleet as the pull agents' coordinator holds it: `reconcile status --coordinator`
//! (every host's last word on each service) and `reconcile rollout status` (one change's
//! progress). Entries are written by agents that redact what they write; nothing here adds a
//! value from a host.

use std::fmt::Write;

use super::{short, to_json, Format, COMMIT_SHOWN};
use crate::rollout::overview::{RolloutView, Row};

/// `now`: unix seconds, for "12s ago".
pub fn render_fleet(rows: &[Row], format: Format, now: u64) -> String {
    match format {
        Format::Json => to_json(rows),
        // An agent writes its entry from its host: its text is escaped like any host's.
        Format::Text => super::terminal::text(fleet_text(rows, now)),
        Format::Markdown => super::terminal::text(fleet_markdown(rows, now)),
    }
}

fn state(r: &Row) -> &'static str {
    match (r.state, r.restarting) {
        (None, _) => "unreported",
        (Some(_), true) => "restarting",
        (Some(s), false) => s.name(),
    }
}

fn commit(r: &Row) -> &str {
    r.commit.as_deref().map_or("-", |c| short(c, COMMIT_SHOWN))
}

fn age(at: Option<u64>, now: u64) -> String {
    match at {
        None => "-".into(),
        Some(at) => {
            let s = now.saturating_sub(at);
            match s {
                0..120 => format!("{s}s ago"),
                120..7200 => format!("{}m ago", s / 60),
                _ => format!("{}h ago", s / 3600),
            }
        }
    }
}

fn behind(r: &Row) -> &'static str {
    match r.on_newest {
        Some(false) => " (behind the manifests)",
        _ => "",
    }
}

fn fleet_text(rows: &[Row], now: u64) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("the coordinator has no entry yet and the manifests list no host\n");
        return out;
    }
    let mut service = "";
    for r in rows {
        if r.service != service {
            service = &r.service;
            let _ = writeln!(out, "{service}.service");
        }
        let _ = write!(
            out,
            "  {:<16} {:<11} {:<8} {:>8}{}",
            r.host,
            state(r),
            commit(r),
            age(r.at, now),
            behind(r)
        );
        if let Some(d) = &r.detail {
            let _ = write!(out, ": {d}");
        }
        out.push('\n');
    }
    let synced = rows.iter().filter(|r| r.in_sync()).count();
    let _ = writeln!(out, "{synced} of {} in sync", rows.len());
    out
}

fn fleet_markdown(rows: &[Row], now: u64) -> String {
    let mut out = String::from(
        "| service | host | state | commit | when | detail |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {}{} | `{}` | {} | {} |",
            r.service,
            r.host,
            state(r),
            behind(r),
            commit(r),
            age(r.at, now),
            r.detail
                .as_deref()
                .unwrap_or("")
                .replace('|', "\\|")
                .replace('\n', " ")
        );
    }
    out
}

pub fn render_rollout(v: &RolloutView, format: Format) -> String {
    let p = &v.progress;
    let lists = [
        ("succeeded", &p.succeeded),
        ("in flight", &p.in_flight),
        ("failed", &p.failed),
        ("waiting", &p.waiting),
        ("held", &p.held),
        ("not reported", &p.unreported),
        ("up to date", &p.up_to_date),
    ];
    let headline = format!(
        "{}.service, change {}: {}",
        v.service,
        v.revision,
        match v.exit_code() {
            0 => "done",
            3 => "stopped",
            _ => "under way",
        }
    );
    let text = match format {
        Format::Json => return to_json(v),
        Format::Text => {
            let mut out = format!("{headline}\n");
            let _ = writeln!(
                out,
                "  canary        {}",
                p.canary.as_deref().unwrap_or("-")
            );
            for (name, hosts) in lists {
                if !hosts.is_empty() {
                    let _ = writeln!(out, "  {name:<13} {}", hosts.join(", "));
                }
            }
            out
        }
        Format::Markdown => {
            let mut out = format!("**{headline}**\n\n| | hosts |\n|---|---|\n");
            let _ = writeln!(out, "| canary | {} |", p.canary.as_deref().unwrap_or("-"));
            for (name, hosts) in lists {
                if !hosts.is_empty() {
                    let _ = writeln!(out, "| {name} | {} |", hosts.join(", "));
                }
            }
            out
        }
    };
    super::terminal::text(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::ledger::State;
    use crate::rollout::turn::Progress;

    fn row(host: &str, state: Option<State>, restarting: bool, on_newest: Option<bool>) -> Row {
        Row {
            service: "sglang-qwen".into(),
            host: host.into(),
            state,
            revision: state.map(|_| "r".into()),
            commit: state.map(|_| "0123456789abcdef".into()),
            at: state.map(|_| 100),
            detail: (state == Some(State::Failed)).then(|| "crash window: exited".into()),
            restarting,
            on_newest,
        }
    }

    #[test]
    fn fleet_text_has_a_line_per_host_and_the_tally() {
        let rows = [
            row("gpu-a", Some(State::Succeeded), false, Some(true)),
            row("gpu-b", Some(State::Started), true, Some(true)),
            row("gpu-c", Some(State::Failed), false, Some(true)),
            row("gpu-d", None, false, Some(false)),
        ];
        let text = render_fleet(&rows, Format::Text, 130);
        assert!(text.starts_with("sglang-qwen.service\n"), "{text}");
        assert!(
            text.contains("gpu-a            succeeded   0123456   30s ago"),
            "{text}"
        );
        assert!(text.contains("gpu-b            restarting"), "{text}");
        assert!(
            text.contains("failed") && text.contains(": crash window: exited"),
            "{text}"
        );
        assert!(
            text.contains("gpu-d            unreported") && text.contains("(behind the manifests)"),
            "{text}"
        );
        assert!(text.ends_with("1 of 4 in sync\n"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render_fleet(&rows, Format::Json, 130)).unwrap();
        assert_eq!(json[1]["state"], "started");
        assert_eq!(json[1]["restarting"], true);
        let md = render_fleet(&rows, Format::Markdown, 130);
        assert_eq!(md.lines().count(), 6, "{md}");
    }

    #[test]
    fn a_rollout_lists_only_the_headings_with_hosts() {
        let v = RolloutView {
            service: "s".into(),
            revision: "abc".into(),
            progress: Progress {
                canary: Some("h1".into()),
                succeeded: vec!["h1".into()],
                in_flight: vec!["h2".into(), "h3".into()],
                waiting: vec!["h4".into()],
                ..Progress::default()
            },
            finished: false,
        };
        let text = render_rollout(&v, Format::Text);
        assert_eq!(
            text,
            "s.service, change abc: under way\n  canary        h1\n  succeeded     h1\n  in flight     h2, h3\n  waiting       h4\n"
        );
    }
}
