//! What a running server holds of what live changes told it, read back for `status`. After a live
//! apply the unit on disk has the new command line and the server still runs the earlier one, so
//! the command lines no longer say what it serves; the server does:
//!
//! - the checkpoint: `GET /model_info`'s `model_path` (`srt/entrypoints/http_server.py`
//!   `model_info`: `tokenizer_manager.model_path`, which a weight update moves;
//!   `/get_model_info` is its deprecated name, which logs a warning each call);
//! - the values: `GET /server_info`'s `internal_states`, one object per data-parallel rank, each
//!   the scheduler's resolved server args with the values `/set_internal_state` set laid over
//!   them, under their server-args keys (`pp_max_micro_batch_size`)
//!   (`srt/managers/scheduler_components/internal_state.py` `get_internal_state`,
//!   `srt/runtime_context.py` `resolved_server_args_dict`).
//!
//! Reading them is the binary's (`status::gather`); this module parses the answers, says what a
//! server must hold ([`must_hold`]) and compares ([`differences`]).

use serde_json::{Map, Value};

use super::{live_change, LiveChange, RestartNeeded};
use crate::record::{argv_sha256, LiveRecord};
use crate::sglang::Catalog;
use crate::unit::UnitModel;

/// What the server said it holds: only what was asked (the checkpoint when weights moved, the
/// values when some were set).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// `/model_info`'s `model_path`.
    pub model_path: Option<String>,
    /// `/server_info`'s `internal_states`, one per data-parallel rank.
    pub ranks: Vec<Map<String, Value>>,
}

/// Why an answer of the server says nothing of what it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldError {
    #[error("/model_info's answer has no `model_path` string: {0}")]
    ModelInfo(String),
    #[error("/server_info's answer has no `internal_states` list of objects: {0}")]
    ServerInfo(String),
}

/// Why a running command line and a unit differ in more than a live change applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotLive {
    #[error("SGLang {0} is not cataloged, so the command lines cannot be compared flag by flag")]
    Uncataloged(String),
    #[error(transparent)]
    Differs(RestartNeeded),
}

/// The start of an answer that is not what was expected, for the error.
fn start(text: &str) -> String {
    let cut: String = text.chars().take(120).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

/// `/model_info`'s `model_path`.
pub fn model_path(model_info: &str) -> Result<String, HeldError> {
    serde_json::from_str::<Value>(model_info)
        .ok()
        .and_then(|v| Some(v.get("model_path")?.as_str()?.to_string()))
        .ok_or_else(|| HeldError::ModelInfo(start(model_info)))
}

/// `/server_info`'s `internal_states`: at least one object, one per data-parallel rank.
pub fn internal_states(server_info: &str) -> Result<Vec<Map<String, Value>>, HeldError> {
    let ranks = serde_json::from_str::<Value>(server_info)
        .ok()
        .and_then(|v| match v.get("internal_states")? {
            Value::Array(ranks) => ranks
                .iter()
                .map(|r| r.as_object().cloned())
                .collect::<Option<Vec<_>>>(),
            _ => None,
        });
    match ranks {
        Some(ranks) if !ranks.is_empty() => Ok(ranks),
        _ => Err(HeldError::ServerInfo(start(server_info))),
    }
}

/// A process's argv as its unit's `ExecStart` reads: a script (`sglang serve`) runs under the
/// interpreter on its `#!` line, which the kernel puts first in the process's argv.
pub fn as_run<'a>(running: &'a [String], unit: &[String]) -> &'a [String] {
    match (running.get(1), unit.first()) {
        (Some(script), Some(first)) if script == first => &running[1..],
        _ => running,
    }
}

/// What a server running `running` (its argv) must hold to serve as `unit` would after a restart:
/// the live change from the one ([`as_run`]) to the other, as `parser` (the SGLang version's
/// catalog) reads their flags. `running` is compared with the unit's settings held equal, so only the command
/// lines count (the environment is the caller's to compare).
pub fn must_hold(
    running: &[String],
    unit: &UnitModel,
    parser: Option<&Catalog>,
    version: &str,
) -> Result<LiveChange, NotLive> {
    let parser = parser.ok_or_else(|| NotLive::Uncataloged(version.to_string()))?;
    let old = UnitModel {
        exec_start: as_run(running, &unit.exec_start).to_vec(),
        ..unit.clone()
    };
    live_change(&old, unit, parser).map_err(NotLive::Differs)
}

/// Whether two numbers a server holds are the same value (`8` and `8.0`; floats read back).
fn same_number(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Where `held` differs from what `change` leaves the server with, one line each (`the server's
/// weights are /a, the live apply told it /b`); empty when it holds all of it.
pub fn differences(change: &LiveChange, held: &Held) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(m) = &change.weights {
        match &held.model_path {
            Some(path) if same_path(path, &m.to) => {}
            Some(path) => out.push(format!(
                "the server's weights are {path}, the live apply told it {}",
                m.to
            )),
            None => out.push(format!(
                "the server did not say its weights; the live apply told it {}",
                m.to
            )),
        }
    }
    if change.settings.is_empty() {
        return out;
    }
    if held.ranks.is_empty() {
        out.push("the server did not say its values".to_string());
        return out;
    }
    for s in &change.settings {
        for (i, rank) in held.ranks.iter().enumerate() {
            let on = if held.ranks.len() == 1 {
                "on the server".to_string()
            } else {
                format!("on data-parallel rank {i}")
            };
            let value = rank.get(&s.key);
            let same = match (value.and_then(Value::as_f64), s.to.as_f64()) {
                (Some(a), Some(b)) => same_number(a, b),
                _ => value == Some(&s.to),
            };
            if !same {
                let shown = value.map_or("not set".to_string(), Value::to_string);
                out.push(format!(
                    "--{} is {shown} {on}, the live apply set {}",
                    s.flag, s.to
                ));
            }
        }
    }
    out
}

/// What a live change left the server with, as status says it: `weights from /models/b,
/// --pp-max-micro-batch-size 8 set`.
pub fn summary(change: &LiveChange) -> String {
    let mut parts = Vec::new();
    if let Some(m) = &change.weights {
        parts.push(format!("weights from {}", m.to));
    }
    if !change.settings.is_empty() {
        parts.push(settings_set(&change.settings));
    }
    parts.join(", ")
}

/// The values a live change sets, as its summary and the apply's account name them:
/// `--pp-max-micro-batch-size 8 set`.
pub fn settings_set(settings: &[super::SettingChange]) -> String {
    let values: Vec<String> = settings
        .iter()
        .map(|s| format!("--{} {}", s.flag, s.to))
        .collect();
    format!("{} set", values.join(", "))
}

/// The deployment record's account of `change`, told to the process whose command line is
/// `argv`.
pub fn record(change: &LiveChange, argv: &[String]) -> LiveRecord {
    LiveRecord {
        argv_sha256: argv_sha256(argv),
        weights: change.weights.as_ref().map(|m| m.to.clone()),
        values: change
            .settings
            .iter()
            .map(|s| (s.flag.clone(), s.to.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::{Move, SettingChange};
    use crate::unit::parse_unit;

    /// A process's command line, as `/proc/<pid>/cmdline` reads, from its words with single spaces.
    fn argv(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    fn change() -> LiveChange {
        LiveChange {
            weights: Some(Move {
                from: "/models/a".into(),
                to: "/models/b".into(),
                tokenizer_follows: true,
            }),
            settings: vec![
                SettingChange {
                    flag: "pp-max-micro-batch-size".into(),
                    key: "pp_max_micro_batch_size".into(),
                    from: 4.into(),
                    to: 8.into(),
                },
                SettingChange {
                    flag: "speculative-accept-threshold-single".into(),
                    key: "speculative_accept_threshold_single".into(),
                    from: 1.0.into(),
                    to: 0.5.into(),
                },
            ],
        }
    }

    /// `/server_info` as SGLang 0.5.23 answers it, trimmed: the startup fields, and per rank the
    /// resolved args with what `/set_internal_state` set.
    fn server_info(ranks: &[(u32, f64)]) -> String {
        let ranks: Vec<Value> = ranks
            .iter()
            .map(|(size, threshold)| {
                serde_json::json!({
                    "model_path": "/models/a",
                    "pp_max_micro_batch_size": size,
                    "speculative_accept_threshold_single": threshold,
                    "effective_max_running_requests_per_dp": 16,
                })
            })
            .collect();
        serde_json::json!({
            "model_path": "/models/a",
            "pp_max_micro_batch_size": 4,
            "internal_states": ranks,
            "version": "0.5.23",
        })
        .to_string()
    }

    #[test]
    fn the_answers_read_and_what_is_not_an_answer_is_named() {
        assert_eq!(
            model_path(r#"{"model_path": "/models/b", "is_generation": true}"#),
            Ok("/models/b".into())
        );
        assert!(matches!(
            model_path(r#"{"detail": "Not Found"}"#),
            Err(HeldError::ModelInfo(s)) if s.contains("Not Found")
        ));
        let ranks = internal_states(&server_info(&[(8, 0.5), (8, 0.5)])).unwrap();
        assert_eq!(ranks.len(), 2);
        assert_eq!(ranks[1]["pp_max_micro_batch_size"], 8);
        for bad in [
            r#"{"internal_states": []}"#,
            r#"{"internal_states": [1]}"#,
            "{}",
            "not json",
        ] {
            assert!(
                matches!(internal_states(bad), Err(HeldError::ServerInfo(_))),
                "{bad}"
            );
        }
        let long = "x".repeat(500);
        assert!(model_path(&long).unwrap_err().to_string().ends_with("x..."));
    }

    #[test]
    fn a_server_that_holds_what_it_was_told_differs_in_nothing() {
        let held = Held {
            model_path: Some("/models/b/".into()),
            ranks: internal_states(&server_info(&[(8, 0.5)])).unwrap(),
        };
        assert_eq!(differences(&change(), &held), Vec::<String>::new());
        // 8.0 is 8: a float read back for an integer is the same value.
        let mut as_float = held.clone();
        as_float.ranks[0].insert("pp_max_micro_batch_size".into(), 8.0.into());
        assert_eq!(differences(&change(), &as_float), Vec::<String>::new());
        assert_eq!(
            summary(&change()),
            "weights from /models/b, --pp-max-micro-batch-size 8, --speculative-accept-threshold-single 0.5 set"
        );
    }

    #[test]
    fn what_the_server_holds_otherwise_is_named_with_what_it_was_told() {
        let held = Held {
            model_path: Some("/models/a".into()),
            ranks: internal_states(&server_info(&[(8, 0.5), (4, 0.5)])).unwrap(),
        };
        assert_eq!(
            differences(&change(), &held),
            [
                "the server's weights are /models/a, the live apply told it /models/b",
                "--pp-max-micro-batch-size is 4 on data-parallel rank 1, the live apply set 8",
            ]
        );
        let mut one = Held {
            model_path: Some("/models/b".into()),
            ranks: internal_states(&server_info(&[(4, 1.0)])).unwrap(),
        };
        one.ranks[0].remove("speculative_accept_threshold_single");
        assert_eq!(
            differences(&change(), &one),
            [
                "--pp-max-micro-batch-size is 4 on the server, the live apply set 8",
                "--speculative-accept-threshold-single is not set on the server, the live apply set 0.5",
            ]
        );
        // Nothing read where something was told is no agreement.
        assert_eq!(
            differences(&change(), &Held::default()),
            [
                "the server did not say its weights; the live apply told it /models/b",
                "the server did not say its values",
            ]
        );
    }

    #[test]
    fn what_a_server_must_hold_is_the_live_change_from_its_command_line_to_the_unit() {
        let parser = Catalog::for_version("0.5.23");
        let unit = parse_unit(
            "[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path /models/b --port 30000 --pp-max-micro-batch-size 8\n",
        );
        // Two live applies since it started: the weights by one, the value by the other.
        let running = argv("/venv/bin/python3 -m sglang.launch_server --model-path /models/a --port 30000 --pp-max-micro-batch-size 4");
        let held = must_hold(&running, &unit, parser, "0.5.23").unwrap();
        assert_eq!(held.weights.unwrap().to, "/models/b");
        assert_eq!(held.settings[0].to, Value::from(8));
        // A difference no live change applies is named.
        let other: Vec<String> = running
            .iter()
            .map(|a| {
                if a == "30000" {
                    "30001".into()
                } else {
                    a.clone()
                }
            })
            .collect();
        assert_eq!(
            must_hold(&other, &unit, parser, "0.5.23"),
            Err(NotLive::Differs(RestartNeeded::Flag {
                name: "port".into()
            }))
        );
        // A console script runs under its interpreter.
        let script = parse_unit(
            "[Service]\nExecStart=/venv/bin/sglang serve --model-path /models/b --port 30000\n",
        );
        let under =
            argv("/venv/bin/python3 /venv/bin/sglang serve --model-path /models/a --port 30000");
        assert_eq!(as_run(&under, &script.exec_start), &under[1..]);
        assert_eq!(
            must_hold(&under, &script, parser, "0.5.23")
                .unwrap()
                .weights
                .unwrap()
                .to,
            "/models/b"
        );
        assert_eq!(
            must_hold(&running, &unit, None, "9.9")
                .unwrap_err()
                .to_string(),
            "SGLang 9.9 is not cataloged, so the command lines cannot be compared flag by flag"
        );
    }

    #[test]
    fn the_record_of_a_live_apply_names_the_process_and_what_it_was_told() {
        let argv = vec!["/venv/bin/python3".to_string(), "-m".into()];
        let r = record(&change(), &argv);
        assert_eq!(r.argv_sha256, argv_sha256(&argv));
        assert_eq!(r.weights.as_deref(), Some("/models/b"));
        assert_eq!(
            serde_json::to_value(&r.values).unwrap(),
            serde_json::json!({"pp-max-micro-batch-size": 8, "speculative-accept-threshold-single": 0.5})
        );
    }
}
