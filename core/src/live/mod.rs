//! Changes the running SGLang takes without a restart. A restart reloads the model (15 minutes on
//! the seed's 4-GPU host), and SGLang 0.5.23 changes two things in place:
//!
//! - the weights: `POST /update_weights_from_disk {"model_path": ...}` loads another checkpoint of
//!   the same architecture into the running model (`srt/entrypoints/http_server.py`
//!   `update_weights_from_disk`; `srt/managers/tokenizer_manager.py` `update_weights_from_disk`).
//!   A failed call is no proof the old weights serve: its own rollback, after a load that failed
//!   half-way, reads the new path again (`srt/model_executor/model_runner_components/
//!   weight_updater.py` `update_weights_from_disk` sets `model_config.model_path` before it
//!   loads), so the previous checkpoint is loaded back by name;
//! - a few scheduler values: `POST /set_internal_state {"server_args": {...}}`
//!   (`srt/managers/scheduler_components/internal_state.py`, `_update_handlers`): the pipeline
//!   micro-batch size and the speculative accept thresholds. It answers `{"updated": false}` and
//!   changes nothing when one of them is refused.
//!
//! This module decides, without a host, whether a change between two units is one of those
//! ([`live_change`]) and whether two checkpoints have one shape ([`same_shape`]). A live change
//! must leave the server as a restart with the new unit would: otherwise the next restart (a
//! reboot, a crash) would start something else than what was verified.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::flags::flags;
use crate::observed::Observed;
use crate::plan::{differing_keys, parser, restart_reason, UnitPlan, Verdict};
use crate::sglang::meaning::as_parsed;
use crate::sglang::Catalog;
use crate::unit::{parse_unit, Desired, UnitModel};

pub mod held;
mod restart;
pub use crate::live_change::{LiveChange, Move, SettingChange};
pub use restart::{RestartNeeded, ShapeError};

/// A flag `/set_internal_state` takes: its server-args key, whether its value is an integer, and
/// SGLang 0.5.23's default for it (`srt/server_args.py`), which a unit without the flag runs with.
struct Setting {
    flag: &'static str,
    key: &'static str,
    integer: bool,
    /// `None`: SGLang's default is `None`, which `/set_internal_state` cannot set back
    /// (`_validate_pp_micro_batch_size` compares it with numbers): the flag must be set on both
    /// sides.
    default: Option<f64>,
}

const SETTINGS: [Setting; 3] = [
    Setting {
        flag: "pp-max-micro-batch-size",
        key: "pp_max_micro_batch_size",
        integer: true,
        default: None,
    },
    Setting {
        flag: "speculative-accept-threshold-single",
        key: "speculative_accept_threshold_single",
        integer: false,
        default: Some(1.0),
    },
    Setting {
        flag: "speculative-accept-threshold-acc",
        key: "speculative_accept_threshold_acc",
        integer: false,
        default: Some(1.0),
    },
];

/// Whether the change from `old` to `new` is one SGLang takes live, as `parser` (the SGLang
/// version's catalog) reads their flags: only the model path and [`SETTINGS`] differ, nothing
/// else a restart would apply. `Err` says why not, naming what needs the restart.
pub fn live_change(
    old: &UnitModel,
    new: &UnitModel,
    parser: &Catalog,
) -> Result<LiveChange, RestartNeeded> {
    // The environment and the unit's settings, compared with the flags held equal.
    let same_command = UnitModel {
        exec_start: old.exec_start.clone(),
        ..new.clone()
    };
    if let Some(reason) = restart_reason(old, &same_command, Some(parser)) {
        return Err(RestartNeeded::Unit { reason });
    }
    let (old_cmd, old_flags) = flags(&old.exec_start);
    let (new_cmd, new_flags) = flags(&new.exec_start);
    if old_cmd != new_cmd {
        return Err(RestartNeeded::Command);
    }
    let (old_flags, new_flags) = (as_parsed(parser, &old_flags), as_parsed(parser, &new_flags));
    if new_flags
        .get("nnodes")
        .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 1))
    {
        return Err(RestartNeeded::Group);
    }
    let mut change = LiveChange {
        weights: None,
        settings: Vec::new(),
    };
    let names: BTreeSet<&String> = differing_keys(&old_flags, &new_flags).collect();
    for name in names {
        let (before, after) = (old_flags.get(name), new_flags.get(name));
        if name == "model-path" {
            let (Some(from), Some(to)) = (before, after) else {
                return Err(RestartNeeded::NoModelPath);
            };
            change.weights = Some(Move {
                from: from.clone(),
                to: to.clone(),
                tokenizer_follows: !new_flags.contains_key("tokenizer-path"),
            });
        } else if let Some(setting) = SETTINGS.iter().find(|s| s.flag == name) {
            change
                .settings
                .push(setting_change(setting, before, after)?);
        } else {
            return Err(RestartNeeded::Flag { name: name.clone() });
        }
    }
    if change.weights.is_some() {
        // After a weight update SGLang answers under the model path
        // (`tokenizer_manager.py` `_update_model_path_info` sets `served_model_name` to it),
        // where a restart would answer under --served-model-name: clients would see another name.
        if let Some(name) = new_flags.get("served-model-name") {
            return Err(RestartNeeded::ServedModelName { name: name.clone() });
        }
    }
    if change.weights.is_none() && change.settings.is_empty() {
        return Err(RestartNeeded::Nothing);
    }
    Ok(change)
}

fn setting_change(
    setting: &Setting,
    before: Option<&String>,
    after: Option<&String>,
) -> Result<SettingChange, RestartNeeded> {
    let flag = setting.flag;
    let value = |text: Option<&String>| -> Result<Value, RestartNeeded> {
        let number = match text {
            Some(t) => t
                .parse::<f64>()
                .map_err(|source| RestartNeeded::NotANumber {
                    flag,
                    value: t.clone(),
                    source,
                })?,
            None => setting.default.ok_or(RestartNeeded::NoDefault { flag })?,
        };
        Ok(if setting.integer {
            Value::from(number as i64)
        } else {
            Value::from(number)
        })
    };
    Ok(SettingChange {
        flag: setting.flag.to_string(),
        key: setting.key.to_string(),
        from: value(before)?,
        to: value(after)?,
    })
}

/// Whether the restart `plan` asks for may be applied live: `None` when the manifest does not
/// ask for live changes (`apply.live`) or the plan is no restart; `Err` says why it restarts.
/// A weight move is live only once the checkpoints agree too ([`checkpoints_agree`]), which
/// the caller reads from the host.
pub fn candidate(
    plan: &UnitPlan,
    observed: &Observed,
    desired: &Desired,
) -> Option<Result<LiveChange, RestartNeeded>> {
    if !desired.live || plan.verdict != Verdict::Restart {
        return None;
    }
    Some(live_candidate(plan, observed, desired))
}

fn live_candidate(
    plan: &UnitPlan,
    observed: &Observed,
    desired: &Desired,
) -> Result<LiveChange, RestartNeeded> {
    if !plan.drift.is_empty() {
        return Err(RestartNeeded::Drift);
    }
    if observed.state.active_state != "active" {
        return Err(RestartNeeded::NotRunning {
            state: observed.state.active_state.clone(),
        });
    }
    let Some(current) = observed.unit_text.as_deref() else {
        return Err(RestartNeeded::NoUnitFile);
    };
    let parser = parser(desired).ok_or_else(|| RestartNeeded::Uncataloged {
        version: desired.sglang_version.clone(),
    })?;
    live_change(&parse_unit(current), &desired.model, parser)
}

/// A checkpoint's files a restart reads besides its weights, which a weight update does not
/// read again: the tokenizer's (when it follows the model path) and the default sampling
/// parameters (`generation_config.json`, read once at start-up by `model_config.py`
/// `get_default_sampling_params`).
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
];
pub const SAMPLING_FILE: &str = "generation_config.json";

/// What the host holds of one checkpoint: its `config.json` (`None` when it has none: a hub id,
/// a missing folder) and the sha256 of each of [`TOKENIZER_FILES`] and [`SAMPLING_FILE`] it has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub config: Option<String>,
    pub hashes: BTreeMap<String, String>,
}

/// Whether a weight update from `old` to `new` leaves the server as a restart with the new unit
/// would build it: one model shape, and the files the update does not read again the same.
pub fn checkpoints_agree(
    m: &Move,
    old: &Checkpoint,
    new: &Checkpoint,
) -> Result<(), RestartNeeded> {
    let config = |c: &Checkpoint, path: &str| {
        c.config
            .clone()
            .ok_or_else(|| RestartNeeded::NoConfig { path: path.into() })
    };
    same_shape(&config(old, &m.from)?, &config(new, &m.to)?)?;
    let mut files = vec![SAMPLING_FILE];
    if m.tokenizer_follows {
        files.extend(TOKENIZER_FILES);
    }
    for file in files {
        if old.hashes.get(file) != new.hashes.get(file) {
            return Err(RestartNeeded::FileDiffers { file });
        }
    }
    Ok(())
}

/// `config.json`'s fields that do not shape the model: where it was saved from, with which
/// library. Every other field must be equal for a weight update to load the new checkpoint into
/// the running model as a restart would build it.
const NOT_SHAPE: [&str; 3] = ["_name_or_path", "transformers_version", "_commit_hash"];

/// Whether two checkpoints' `config.json` describe one model shape; `Err` names the first field
/// that differs (`hidden_size: 4096 -> 5120`).
pub fn same_shape(old_config: &str, new_config: &str) -> Result<(), ShapeError> {
    let read =
        |text: &str, which: &'static str| -> Result<serde_json::Map<String, Value>, ShapeError> {
            match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => Ok(map),
                _ => Err(ShapeError::Unreadable { which }),
            }
        };
    let (old, new) = (read(old_config, "old")?, read(new_config, "new")?);
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys
        .into_iter()
        .filter(|k| !NOT_SHAPE.contains(&k.as_str()))
    {
        let (a, b) = (old.get(key), new.get(key));
        if a != b {
            let show = |v: Option<&Value>| v.map_or("(none)".to_string(), Value::to_string);
            return Err(ShapeError::Differs {
                key: key.clone(),
                old: show(a),
                new: show(b),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::parse_unit;

    fn unit(flags: &str, env: &str) -> UnitModel {
        parse_unit(&format!(
            "[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path /models/a --port 30000 {flags}\n{env}"
        ))
    }

    fn parser() -> &'static Catalog {
        Catalog::for_version("0.5.23").unwrap()
    }

    #[test]
    fn another_checkpoint_and_the_live_settings_are_live_and_reverse() {
        let old = unit("--pp-max-micro-batch-size 4", "");
        let new = parse_unit(
            "[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path /models/b --port 30000 --pp-max-micro-batch-size 8 --speculative-accept-threshold-single 0.5\n",
        );
        let change = live_change(&old, &new, parser()).unwrap();
        assert_eq!(
            change.weights,
            Some(Move {
                from: "/models/a".into(),
                to: "/models/b".into(),
                tokenizer_follows: true,
            })
        );
        assert_eq!(
            change.settings_body().unwrap(),
            serde_json::json!({"server_args": {
                "pp_max_micro_batch_size": 8,
                "speculative_accept_threshold_single": 0.5,
            }})
        );
        assert_eq!(
            change.weights_body().unwrap()["model_path"],
            serde_json::json!("/models/b")
        );
        // Back: the old checkpoint, the old size, and SGLang's default threshold.
        let back = change.reverse();
        assert_eq!(back.weights.as_ref().unwrap().to, "/models/a");
        assert_eq!(
            back.settings_body().unwrap(),
            serde_json::json!({"server_args": {
                "pp_max_micro_batch_size": 4,
                "speculative_accept_threshold_single": 1.0,
            }})
        );
        assert_eq!(
            change.describe(),
            "the weights move to /models/b (same architecture; /update_weights_from_disk); --pp-max-micro-batch-size 4 -> 8 (/set_internal_state); --speculative-accept-threshold-single 1.0 -> 0.5 (/set_internal_state)"
        );
    }

    #[test]
    fn anything_else_a_restart_applies_is_not_live_and_says_what() {
        let old = unit("", "");
        let why = |new: UnitModel| live_change(&old, &new, parser()).unwrap_err().to_string();
        assert_eq!(
            why(unit("--mem-fraction-static 0.8", "")),
            "the flag --mem-fraction-static changes, which only a restart applies"
        );
        assert_eq!(
            why(unit("", "Environment=NCCL_DEBUG=INFO")),
            "the environment variable NCCL_DEBUG changes, which only a restart applies"
        );
        // An equal command line spelled otherwise is no change at all.
        assert_eq!(
            why(unit("--port=30000", "")),
            "nothing SGLang takes live changes"
        );
        // A value SGLang's default cannot be set back to, and a name a weight update drops.
        assert!(
            why(unit("--pp-max-micro-batch-size 8", "")).contains("must be set before and after")
        );
        let named = |path: &str| {
            parse_unit(&format!(
                "[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path {path} --port 30000 --served-model-name q\n"
            ))
        };
        let e = live_change(&named("/models/a"), &named("/models/b"), parser()).unwrap_err();
        assert!(
            e.to_string().contains("not under --served-model-name q"),
            "{e}"
        );
        assert_eq!(e, RestartNeeded::ServedModelName { name: "q".into() });
        assert_eq!(
            live_change(&old, &unit("--mem-fraction-static 0.8", ""), parser()),
            Err(RestartNeeded::Flag {
                name: "mem-fraction-static".into()
            })
        );
    }

    #[test]
    fn a_tokenizer_path_of_its_own_keeps_the_tokenizer_out_of_it() {
        let with_tokenizer = |path: &str| {
            parse_unit(&format!(
                "[Service]\nExecStart=/venv/bin/python3 -m sglang.launch_server --model-path {path} --tokenizer-path /models/tok\n"
            ))
        };
        let change = live_change(
            &with_tokenizer("/models/a"),
            &with_tokenizer("/models/b"),
            parser(),
        )
        .unwrap();
        assert!(!change.weights.unwrap().tokenizer_follows);
    }

    #[test]
    fn checkpoints_of_one_shape_differ_only_in_where_they_came_from() {
        let config = |hidden: u32, name: &str| {
            format!(
                r#"{{"architectures": ["Qwen3ForCausalLM"], "hidden_size": {hidden}, "num_hidden_layers": 2, "_name_or_path": "{name}", "transformers_version": "4.57.1"}}"#
            )
        };
        assert_eq!(same_shape(&config(64, "a"), &config(64, "b")), Ok(()));
        assert_eq!(
            same_shape(&config(64, "a"), &config(128, "a")),
            Err(ShapeError::Differs {
                key: "hidden_size".into(),
                old: "64".into(),
                new: "128".into()
            })
        );
        assert_eq!(
            same_shape(&config(64, "a"), &config(128, "a"))
                .unwrap_err()
                .to_string(),
            "config.json's hidden_size differs: 64 -> 128"
        );
        assert_eq!(
            same_shape("{}", r#"{"quantization_config": {"quant_method": "fp8"}}"#)
                .unwrap_err()
                .to_string(),
            r#"config.json's quantization_config differs: (none) -> {"quant_method":"fp8"}"#
        );
        let unread = same_shape("not json", "{}").unwrap_err();
        assert!(unread.to_string().contains("old checkpoint"), "{unread}");
        assert_eq!(unread, ShapeError::Unreadable { which: "old" });
    }
    /// A manifest of one server on `h` with `model` and `flags` (a YAML map's body), live
    /// changes asked for when `live`.
    fn desired(model: &str, flags: &str, live: bool) -> Desired {
        let text = format!(
            "service: s\nhosts: [h]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: {model}\n  port: 30000\n  flags: {{ {flags} }}\napply: {{ live: {live} }}\n"
        );
        let m = crate::manifest::parse("m.yaml", &text).unwrap();
        crate::unit::render(&m, &m.hosts[0])
    }

    fn running(d: &Desired, active: &str) -> Observed {
        Observed {
            unit_text: Some(d.text.clone()),
            state: crate::observed::UnitState {
                load_state: "loaded".into(),
                active_state: active.into(),
                ..Default::default()
            },
            unit_files: Default::default(),
        }
    }

    fn candidate_of(
        old: &Desired,
        new: &Desired,
        active: &str,
    ) -> Option<Result<LiveChange, RestartNeeded>> {
        let observed = running(old, active);
        let plan = crate::plan::plan("h", "m.yaml", new, &observed, &Default::default());
        candidate(&plan, &observed, new)
    }

    #[test]
    fn only_a_restart_the_manifest_lets_go_live_is_a_candidate() {
        let old = desired("/models/a", "pp-max-micro-batch-size: 4", true);
        let moved = desired("/models/b", "pp-max-micro-batch-size: 8", true);
        let change = candidate_of(&old, &moved, "active").unwrap().unwrap();
        assert_eq!(change.weights.unwrap().to, "/models/b");
        assert_eq!(change.settings[0].to, Value::from(8));
        // Not asked for: the plan restarts as it always did.
        let unasked = desired("/models/b", "pp-max-micro-batch-size: 8", false);
        assert_eq!(candidate_of(&old, &unasked, "active"), None);
        // No restart to save.
        assert_eq!(candidate_of(&old, &old, "active"), None);
        // A server that does not run has nothing to take the change.
        assert_eq!(
            candidate_of(&old, &moved, "failed"),
            Some(Err(RestartNeeded::NotRunning {
                state: "failed".into()
            }))
        );
        // Anything else a restart applies keeps it a restart, named.
        let more = desired("/models/b", "pp-max-micro-batch-size: 8, tp-size: 2", true);
        let why = candidate_of(&old, &more, "active").unwrap().unwrap_err();
        assert!(why.to_string().contains("tp-size"), "{why}");
    }

    #[test]
    fn a_weight_move_needs_one_shape_and_the_files_a_restart_would_read_again() {
        let m = Move {
            from: "/models/a".into(),
            to: "/models/b".into(),
            tokenizer_follows: true,
        };
        let checkpoint = |hidden: u32, tokenizer: &str| Checkpoint {
            config: Some(format!(r#"{{"hidden_size": {hidden}}}"#)),
            hashes: [("tokenizer.json".to_string(), tokenizer.to_string())].into(),
        };
        assert_eq!(
            checkpoints_agree(&m, &checkpoint(64, "t1"), &checkpoint(64, "t1")),
            Ok(())
        );
        let why = checkpoints_agree(&m, &checkpoint(64, "t1"), &checkpoint(128, "t1")).unwrap_err();
        assert!(why.to_string().contains("hidden_size"), "{why}");
        assert!(matches!(
            why,
            RestartNeeded::Shape(ShapeError::Differs { .. })
        ));
        let why = checkpoints_agree(&m, &checkpoint(64, "t1"), &checkpoint(64, "t2")).unwrap_err();
        assert_eq!(
            why.to_string(),
            "tokenizer.json differs between the checkpoints (the tokenizer is read at start-up only)"
        );
        assert_eq!(
            why,
            RestartNeeded::FileDiffers {
                file: "tokenizer.json"
            }
        );
        // With a --tokenizer-path of its own, the tokenizer stays where it is.
        let own = Move {
            tokenizer_follows: false,
            ..m.clone()
        };
        assert_eq!(
            checkpoints_agree(&own, &checkpoint(64, "t1"), &checkpoint(64, "t2")),
            Ok(())
        );
        // A hub id is no local checkpoint to load.
        let hub = Checkpoint::default();
        let why = checkpoints_agree(&m, &checkpoint(64, "t1"), &hub).unwrap_err();
        assert!(
            why.to_string().starts_with("/models/b has no config.json"),
            "{why}"
        );
    }
}
