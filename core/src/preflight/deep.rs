//! The deep check, its pure part: when it runs ([`DeepWhen`]), what the host's SGLang answered
//! ([`read_deep`]), and the finding that answer makes, placed at the manifest field it is about.
//!
//! The check itself is a fixed script (`src/preflight/deep.py` in the `reconcile` binary): the
//! host's own SGLang parses the unit's arguments, resolves them, and builds the model's config
//! (`ModelConfig.from_server_args`: config.json, dtype, context length, quantization) and checks
//! `--chat-template`, as a launch would before it loads any weights. A unit SGLang would refuse is
//! refused in the plan, while the running server still serves.

use std::time::Duration;

use serde::Deserialize;

use super::last_line;
use super::{Finding, Want};
use crate::manifest::locate::{locate, Seg};
use crate::plan::Verdict;
use crate::sglang::Catalog;
use crate::targets::Target;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deep {
    Accepted,
    /// SGLang refused the unit (its own reason).
    Refused(Refusal),
    /// The check itself could not run (no `sglang.srt.server_args` to import).
    Unavailable(String),
    /// argparse accepted the arguments; `resolve_once()` needs a GPU, which the running server
    /// holds, so the resolved checks were not run (SGLang's message). The model's config and the
    /// chat template were still checked.
    ParsedOnly(String),
    /// The check ran past its limit (run by default; `--deep` makes that an error of the unit).
    TimedOut(Duration),
}

/// What SGLang refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What SGLang was doing: `arguments` (argparse, or 0.5.9's `__post_init__`), `resolve`
    /// (`resolve_once`), `model-config` (`ModelConfig.from_server_args`), `chat-template`.
    pub stage: String,
    /// The SGLang flag the refusal is about (`context-length`, `model-path`), when known.
    pub flag: Option<String>,
    /// SGLang's own reason: the exception's first line, or argparse's message.
    pub reason: String,
}

impl Refusal {
    pub fn new(stage: &str, flag: Option<&str>, reason: &str) -> Refusal {
        Refusal {
            stage: stage.to_string(),
            flag: flag.map(str::to_string),
            reason: reason.to_string(),
        }
    }
}

/// When preflight runs the deep check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeepWhen {
    /// `--no-deep`.
    Never,
    /// By default: for a unit whose change starts its server (new, or restarted), never for a
    /// reload-only or unchanged one (its server keeps running its arguments). Only a refusal, or
    /// a check that ran past its limit, is shown; what it could not check is logged (`-v`).
    #[default]
    Restarts,
    /// `--deep`: for every unit that changes, and it also warns of what it could not check.
    Asked,
}

/// The deep check's limit when it runs by default. Measured on the 2-core CPU tier (real SGLang
/// 0.5.23, docs/verification.md, "The deep check"): 7-13 s at a load of 2-3, 25-30 s at a load of 8-10, nearly
/// all of it imports (torch, transformers, `sglang.srt.server_args`, then
/// `sglang.srt.configs.model_config`); a launch, whose imports these are a part of, took 140 s on
/// a cold page cache under heavy load. Past it the unit gets a warning, not a refusal: the check
/// could not say.
pub const DEEP_LIMIT: Duration = Duration::from_secs(120);

/// With `--deep`: as before, 5 minutes, and running past it fails the unit's preflight.
pub const DEEP_ASKED_LIMIT: Duration = Duration::from_secs(5 * 60);

impl DeepWhen {
    /// From `--deep` and `--no-deep` (clap keeps them apart).
    pub fn from_flags(deep: bool, no_deep: bool) -> DeepWhen {
        match (deep, no_deep) {
            (_, true) => DeepWhen::Never,
            (true, false) => DeepWhen::Asked,
            (false, false) => DeepWhen::Restarts,
        }
    }

    /// Whether a unit planned as `verdict` gets the deep check.
    pub fn runs(self, verdict: Verdict) -> bool {
        match self {
            DeepWhen::Never => false,
            // A live weight move loads a checkpoint too.
            DeepWhen::Restarts => {
                matches!(verdict, Verdict::Restart | Verdict::Install | Verdict::Live)
            }
            DeepWhen::Asked => verdict != Verdict::NoChange,
        }
    }

    pub fn limit(self) -> Duration {
        match self {
            DeepWhen::Asked => DEEP_ASKED_LIMIT,
            _ => DEEP_LIMIT,
        }
    }

    /// What of the check's answer preflight judges: all of it when asked for; by default, a
    /// refusal or a timeout only (a check that could not run, or needed a GPU, says nothing).
    pub fn shown(self, deep: Deep) -> Deep {
        match (self, deep) {
            (DeepWhen::Asked, deep) => deep,
            (_, Deep::Unavailable(_) | Deep::ParsedOnly(_)) => Deep::Accepted,
            (_, deep) => deep,
        }
    }
}

/// `--deep` alone, as the agent's options carry it: `true` asks for it, `false` is the default.
impl From<bool> for DeepWhen {
    fn from(deep: bool) -> DeepWhen {
        DeepWhen::from_flags(deep, false)
    }
}

/// The script's answer line: `#reconcile-deep {json}`, the last of its stdout.
pub const ANSWER_PREFIX: &str = "#reconcile-deep ";

#[derive(Deserialize)]
struct Answer {
    verdict: String,
    #[serde(default)]
    stage: Option<String>,
    #[serde(default)]
    flag: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    unchecked: Vec<String>,
}

/// The deep check's verdict cached on the host for its inputs, as the answer line a later plan of
/// the same inputs reads instead of running the check (`None`: nothing to cache). Only SGLang's own
/// answers are cached: a check that could not run, or ran past its limit, said nothing about the
/// inputs. A refusal's reason is cached as `redact` leaves it (a secret value never reaches the
/// host's disk).
pub fn cached_answer(
    deep: &Deep,
    unchecked: &[String],
    redact: impl Fn(&str) -> String,
) -> Option<String> {
    let answer = match deep {
        Deep::Accepted => serde_json::json!({ "verdict": "accepted", "unchecked": unchecked }),
        Deep::ParsedOnly(why) => serde_json::json!({
            "verdict": "gpu", "reason": redact(why), "unchecked": unchecked
        }),
        Deep::Refused(r) => serde_json::json!({
            "verdict": "refused", "stage": r.stage, "flag": r.flag, "reason": redact(&r.reason),
            "unchecked": unchecked
        }),
        Deep::Unavailable(_) | Deep::TimedOut(_) => return None,
    };
    Some(format!("{ANSWER_PREFIX}{answer}\n"))
}

/// Reads the deep check's output: what SGLang answered, and what it could not check (and why).
/// Without an answer line (the interpreter died, or an older script), the exit status decides as
/// it used to: 0 accepted, 3 needs a GPU, anything else refused with stderr's last line.
pub fn read_deep(status: i32, stdout: &str, stderr: &str) -> (Deep, Vec<String>) {
    let answer = stdout
        .lines()
        .rev()
        .find_map(|l| l.trim_end().strip_prefix(ANSWER_PREFIX))
        .and_then(|json| serde_json::from_str::<Answer>(json).ok());
    let last = last_line(stderr);
    let Some(a) = answer else {
        let deep = match status {
            status if super::owners::untrusted(status, stderr) => Deep::Unavailable(
                "the server runs as root, and another user can write what SGLang imports \
                     (see the owner warning), so root did not start it"
                    .into(),
            ),
            _ if stderr.contains("No module named 'sglang.srt") => Deep::Unavailable(format!(
                "this SGLang has no sglang.srt.server_args to parse arguments with ({last})"
            )),
            0 => Deep::Unavailable("the check printed no answer".into()),
            3 => Deep::ParsedOnly(last),
            _ if last.is_empty() => Deep::Refused(Refusal::new(
                "arguments",
                None,
                &format!("exit status {status}"),
            )),
            _ => Deep::Refused(Refusal::new("arguments", None, &last)),
        };
        return (deep, Vec::new());
    };
    let reason = a
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| last.clone());
    let deep = match a.verdict.as_str() {
        "accepted" => Deep::Accepted,
        "gpu" => Deep::ParsedOnly(reason),
        "unavailable" => Deep::Unavailable(format!(
            "this SGLang has no sglang.srt.server_args to parse arguments with ({reason})"
        )),
        _ => Deep::Refused(Refusal {
            stage: a.stage.unwrap_or_else(|| "arguments".into()),
            flag: a.flag.filter(|f| !f.is_empty()),
            reason,
        }),
    };
    (deep, a.unchecked)
}

/// The finding a deep check's answer makes, if any.
pub(super) fn judge_deep(t: &Target, want: &Want, deep: &Deep) -> Option<Finding> {
    let unit = &want.unit;
    match deep {
        Deep::Accepted => None,
        Deep::Refused(r) => {
            let text = format!(
                "the host's SGLang refuses {unit}'s arguments: {}",
                r.reason
            );
            let at = r
                .flag
                .clone()
                .or_else(|| argparse_flag(&r.reason))
                .and_then(|flag| written_at(t, &flag));
            Some(Finding::error(
                "deep",
                at.map_or(text.clone(), |at| format!("{at}: {text}")),
            ))
        }
        Deep::Unavailable(why) => Some(Finding::warning(
            "deep",
            format!("the deep check could not run: {why}"),
        )),
        Deep::ParsedOnly(why) => Some(Finding::warning(
            "deep",
            format!(
                "the host's SGLang parsed {unit}'s arguments, but its resolve_once() checks need a GPU and were not run ({why})"
            ),
        )),
        Deep::TimedOut(after) => Some(Finding::warning(
            "deep",
            format!(
                "the deep check did not finish in {} s, so SGLang's own checks of {unit}'s arguments and model config were not run (importing torch from a cold page cache can take that long; --deep waits 5 minutes)",
                after.as_secs()
            ),
        )),
    }
}

/// The option an argparse message is about: `argument --tp-size/--tp: invalid int value: 'x'`,
/// `unrecognized arguments: --tp-sizee 2` (the first one), without its dashes.
fn argparse_flag(reason: &str) -> Option<String> {
    let rest = reason
        .split_once("unrecognized arguments: ")
        .or_else(|| reason.split_once("argument "))?
        .1;
    let option = rest.split_whitespace().next()?.strip_prefix("--")?;
    let option = option.split(['/', ':', '=']).next()?;
    (!option.is_empty()).then(|| option.to_string())
}

/// Where the manifest writes SGLang's flag `flag` for this target: `file:line:column: field`
/// (`manifests/a.yaml:10:5: sglang.flags.context-length`), the host's own override first, as
/// the unit is rendered. `model-path` is `sglang.model_path`. `None` when the manifest does not
/// write it (a default SGLang refused for this model).
pub(super) fn written_at(t: &Target, flag: &str) -> Option<String> {
    let m = &t.manifest;
    let catalog = Catalog::for_version(&m.sglang.version);
    // The key itself, an alias of the flag, or an abbreviation argparse expands to it.
    let names = |key: &&String| {
        key.as_str() == flag
            || catalog.is_some_and(|c| match c.option(key) {
                Some(f) => f.name == flag,
                None => {
                    let mut owners: Vec<&str> = c
                        .option_strings()
                        .filter(|o| o.starts_with(key.as_str()))
                        .filter_map(|o| c.option(o).map(|f| f.name))
                        .collect();
                    owners.dedup();
                    owners == [flag]
                }
            })
    };
    let own = m.hosts.iter().position(|h| h.name == t.host);
    let (path, field) = if flag == "model-path" {
        (
            vec![Seg::Key("sglang"), Seg::Key("model_path")],
            "sglang.model_path".to_string(),
        )
    } else if let Some((i, key)) =
        own.and_then(|i| m.hosts[i].flags.keys().find(names).map(|k| (i, k)))
    {
        (
            vec![
                Seg::Key(m.hosts_key()),
                Seg::Index(i),
                Seg::Key("flags"),
                Seg::Key(key),
            ],
            format!("{}[{i}].flags.{key}", m.hosts_key()),
        )
    } else {
        let key = m.sglang.flags.keys().find(names)?;
        (
            vec![Seg::Key("sglang"), Seg::Key("flags"), Seg::Key(key)],
            format!("sglang.flags.{key}"),
        )
    };
    Some(match locate(&m.text, &path) {
        Some(p) => format!("{}:{}:{}: {field}", m.source, p.line, p.column),
        None => format!("{}: {field}", m.source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::tests::{healthy, manifest, messages, targets};
    use crate::preflight::{judge, Severity};

    fn answer(json: &str) -> String {
        format!("some output\n{ANSWER_PREFIX}{json}\n")
    }

    #[test]
    fn a_kept_verdict_reads_back_as_the_one_kept_and_without_its_secret() {
        let unchecked = vec!["chat template: no tokenizer".to_string()];
        let no_secret = |text: &str| text.replace("sk-1", "<redacted>");
        for deep in [
            Deep::Accepted,
            Deep::ParsedOnly("needs a GPU".into()),
            Deep::Refused(Refusal::new(
                "arguments",
                Some("api-key"),
                "argument --api-key: invalid value 'sk-1'",
            )),
        ] {
            let kept = cached_answer(&deep, &unchecked, no_secret).unwrap();
            assert!(!kept.contains("sk-1"), "{kept}");
            let (read, read_unchecked) = read_deep(0, &kept, "");
            assert_eq!(read, no_secret_in(deep));
            assert_eq!(read_unchecked, unchecked);
        }
        // What says nothing about the inputs is not cached.
        assert_eq!(
            cached_answer(&Deep::Unavailable("no sglang.srt".into()), &[], no_secret),
            None
        );
        assert_eq!(
            cached_answer(&Deep::TimedOut(DEEP_LIMIT), &[], no_secret),
            None
        );
    }

    fn no_secret_in(deep: Deep) -> Deep {
        match deep {
            Deep::Refused(mut r) => {
                r.reason = r.reason.replace("sk-1", "<redacted>");
                Deep::Refused(r)
            }
            deep => deep,
        }
    }

    #[test]
    fn reads_each_verdict_of_the_script() {
        let (deep, unchecked) = read_deep(
            0,
            &answer(
                r#"{"verdict": "accepted", "unchecked": ["model config: ModuleNotFoundError: No module named 'sglang.srt.configs'"]}"#,
            ),
            "",
        );
        assert_eq!(deep, Deep::Accepted);
        assert_eq!(
            unchecked,
            ["model config: ModuleNotFoundError: No module named 'sglang.srt.configs'"]
        );
        let (deep, _) = read_deep(
            1,
            &answer(
                r#"{"verdict": "refused", "stage": "model-config", "flag": "context-length", "reason": "ValueError: Warning: User-specified context_length (1000000) is greater than the derived context_length (2048).", "unchecked": []}"#,
            ),
            "Traceback ...\nValueError: ...\n",
        );
        assert_eq!(
            deep,
            Deep::Refused(Refusal::new(
                "model-config",
                Some("context-length"),
                "ValueError: Warning: User-specified context_length (1000000) is greater than the derived context_length (2048)."
            ))
        );
        let (deep, _) = read_deep(
            3,
            &answer(
                r#"{"verdict": "gpu", "reason": "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.", "unchecked": []}"#,
            ),
            "",
        );
        assert!(
            matches!(deep, Deep::ParsedOnly(why) if why.starts_with("RuntimeError: No accelerator"))
        );
        let (deep, _) = read_deep(
            4,
            &answer(
                r#"{"verdict": "unavailable", "reason": "ModuleNotFoundError: No module named 'sglang.srt'", "unchecked": []}"#,
            ),
            "",
        );
        assert!(matches!(deep, Deep::Unavailable(_)));
    }

    #[test]
    fn without_an_answer_line_the_exit_status_decides() {
        let usage =
            "usage: sglang serve [-h] ...\nsglang serve: error: unrecognized arguments: --x\n";
        assert_eq!(
            read_deep(2, "", usage).0,
            Deep::Refused(Refusal::new(
                "arguments",
                None,
                "sglang serve: error: unrecognized arguments: --x"
            ))
        );
        assert!(matches!(
            read_deep(1, "", "ModuleNotFoundError: No module named 'sglang.srt'\n").0,
            Deep::Unavailable(_)
        ));
        assert!(matches!(
            read_deep(3, "", "no GPU\n").0,
            Deep::ParsedOnly(_)
        ));
        assert!(matches!(read_deep(0, "", "").0, Deep::Unavailable(_)));
        // A mangled answer line is no answer.
        assert_eq!(
            read_deep(139, &format!("{ANSWER_PREFIX}{{\"verdict\""), "").0,
            Deep::Refused(Refusal::new("arguments", None, "exit status 139"))
        );
    }

    #[test]
    fn runs_by_default_for_a_unit_that_restarts_never_for_a_reload() {
        use Verdict::*;
        let runs = |when: DeepWhen| {
            [NoChange, ReloadOnly, Restart, Install]
                .into_iter()
                .filter(|v| when.runs(*v))
                .collect::<Vec<_>>()
        };
        assert_eq!(DeepWhen::default(), DeepWhen::Restarts);
        assert_eq!(runs(DeepWhen::Restarts), [Restart, Install]);
        assert_eq!(runs(DeepWhen::Asked), [ReloadOnly, Restart, Install]);
        assert_eq!(runs(DeepWhen::Never), []);
        assert_eq!(DeepWhen::from_flags(false, false), DeepWhen::Restarts);
        assert_eq!(DeepWhen::from_flags(true, false), DeepWhen::Asked);
        assert_eq!(DeepWhen::from_flags(false, true), DeepWhen::Never);
        assert_eq!(DeepWhen::from(true), DeepWhen::Asked);
        assert!(DeepWhen::Restarts.limit() < DeepWhen::Asked.limit());
        // By default only a refusal or a timeout is shown.
        let gpu = Deep::ParsedOnly("RuntimeError: No accelerator".into());
        assert_eq!(DeepWhen::Restarts.shown(gpu.clone()), Deep::Accepted);
        assert_eq!(DeepWhen::Asked.shown(gpu.clone()), gpu);
        let refused = Deep::Refused(Refusal::new("resolve", None, "ValueError: x"));
        assert_eq!(DeepWhen::Restarts.shown(refused.clone()), refused);
    }

    /// [`judged`] with the deep check refusing at `stage`, naming `flag`, for `reason`.
    fn refused(text: &str, stage: &str, flag: Option<&str>, reason: &str) -> Vec<Finding> {
        judged(text, Deep::Refused(Refusal::new(stage, flag, reason)))
    }

    fn judged(text: &str, deep: Deep) -> Vec<Finding> {
        let t = targets(&[("manifests/a.yaml", text)]).remove(0);
        judge(
            &t,
            &crate::preflight::Facts {
                deep: Some(deep),
                ..healthy()
            },
        )
    }

    #[test]
    fn a_context_length_refusal_names_the_flag_where_the_manifest_writes_it() {
        let text = manifest("s", "h", "    context-length: 1000000\n");
        let reason = "ValueError: Warning: User-specified context_length (1000000) is greater than the derived context_length (2048). This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ from max_position_embeddings in the model's config. To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1";
        let findings = refused(&text, "model-config", Some("context-length"), reason);
        assert_eq!(
            messages(&findings, "deep"),
            [format!("manifests/a.yaml:10:5: sglang.flags.context-length: the host's SGLang refuses s.service's arguments: {reason}")]
        );
        assert_eq!(findings[0].severity, Severity::Error);
    }

    #[test]
    fn a_model_folder_without_config_json_names_the_model_path() {
        let text = manifest("s", "h", "");
        let reason = "ValueError: Unrecognized model in /models/m. Should have a `model_type` key in its config.json.";
        let findings = refused(&text, "resolve", Some("model-path"), reason);
        assert_eq!(
            messages(&findings, "deep"),
            [format!("manifests/a.yaml:6:3: sglang.model_path: the host's SGLang refuses s.service's arguments: {reason}")]
        );
    }

    #[test]
    fn a_host_override_an_alias_or_an_argparse_message_is_placed_too() {
        // The host's own flags win, as the unit is rendered; `tp` is an alias of --tp-size.
        let text = "service: s\nhosts:\n  - name: h\n    flags: { chat-template: /etc/t.jinja }\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 30000\n  flags:\n    chat-template: /etc/other.jinja\n    tp: 2\n";
        let reason = "RuntimeError: Chat template /etc/t.jinja is not a built-in template name or a valid chat template file path.";
        let findings = refused(text, "chat-template", Some("chat-template"), reason);
        assert!(
            messages(&findings, "deep")[0].starts_with(
                "manifests/a.yaml:4:14: hosts[0].flags.chat-template: the host's SGLang refuses"
            ),
            "{findings:?}"
        );
        let argparse = "sglang serve: error: argument --tp-size/--tp: invalid int value: 'x'";
        let findings = refused(text, "arguments", None, argparse);
        assert_eq!(
            messages(&findings, "deep"),
            [format!("manifests/a.yaml:12:5: sglang.flags.tp: the host's SGLang refuses s.service's arguments: {argparse}")]
        );
        // A flag the manifest does not write (a default refused for this model): no place.
        let findings = refused(text, "model-config", Some("dtype"), "ValueError: x");
        assert_eq!(
            messages(&findings, "deep"),
            ["the host's SGLang refuses s.service's arguments: ValueError: x"]
        );
    }

    #[test]
    fn argparse_messages_name_their_option() {
        assert_eq!(
            argparse_flag("sglang serve: error: unrecognized arguments: --tp-sizee 2 --x")
                .as_deref(),
            Some("tp-sizee")
        );
        assert_eq!(
            argparse_flag("launch_server.py: error: argument --dtype: invalid choice: 'f8'")
                .as_deref(),
            Some("dtype")
        );
        assert_eq!(
            argparse_flag("error: unrecognized arguments: --x=1").as_deref(),
            Some("x")
        );
        assert_eq!(argparse_flag("ValueError: nothing here"), None);
    }

    #[test]
    fn a_timeout_by_default_is_a_warning() {
        let findings = judged(&manifest("s", "h", ""), Deep::TimedOut(DEEP_LIMIT));
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Warning);
        assert!(findings[0]
            .message
            .starts_with("the deep check did not finish in 120 s"));
    }
}
