//! `ExecStart=` read back into the manifest's `sglang:` part: the Python, the fields it renders
//! itself (`--model-path`, `--served-model-name`, `--host`, `--port`) and every other flag, typed
//! with the catalog of the host's SGLang version as the manifest would write it.

use crate::redact::Redactor;
use crate::sglang::catalog::{Catalog, Kind, ValueType};
use crate::sglang::resolve::{resolve, Resolved};

/// One value as the manifest writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A number written bare (`4`, `0.85`), whose YAML text reads back exactly as the argument.
    Number(String),
    Text(String),
}

/// A flag's value as the manifest writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// `true`: the bare flag.
    True,
    One(Item),
    List(Vec<Item>),
    /// A secret: `{ from_env: VAR }`, with the value it stands for (never written).
    FromEnv {
        var: String,
        value: String,
    },
}

/// What the manifest's `sglang:` holds, read from an argv.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Command {
    pub python: String,
    /// ExecStart's `sglang` console script, run as `<script> serve ...`.
    pub console_script: Option<String>,
    pub model_path: String,
    pub served_model_name: Option<String>,
    pub host: Option<String>,
    pub port: u16,
    /// By name as written (without `--`), in argv order; an abbreviation by the flag's name.
    pub flags: Vec<(String, Written)>,
    /// Names the manifest spells otherwise than the unit: each a text change the plan shows
    /// and reads as the same setting (a reload, no restart).
    pub notes: Vec<String>,
}

/// Reads `argv` (ExecStart's, as systemd runs it) into a [`Command`]; every problem found is a
/// message for the ExecStart line. `interpreter` is the Python on the `#!` line of a console
/// script ExecStart runs (`<script> serve ...`).
pub fn read(
    argv: &[String],
    interpreter: Option<&str>,
    catalog: Option<&Catalog>,
    redactor: &Redactor,
) -> Result<Command, Vec<ExecStartProblem>> {
    let mut problems = Vec::new();
    let mut command = Command::default();
    let rest = match argv {
        [python, m, module, rest @ ..] if m == "-m" && module == "sglang.launch_server" => {
            command.python = python.clone();
            rest
        }
        [script, serve, rest @ ..] if serve == "serve" && is_console_script(script) => {
            if !script.starts_with('/') {
                problems.push(ExecStartProblem::ScriptNotAbsolute {
                    script: script.clone(),
                });
            }
            match interpreter {
                Some(python) => command.python = python.to_string(),
                None => problems.push(ExecStartProblem::NoInterpreter {
                    script: script.clone(),
                }),
            }
            command.console_script = Some(script.clone());
            rest
        }
        _ => return Err(vec![not_sglang(argv)]),
    };
    let python = &command.python;
    if !python.is_empty() && !python.starts_with('/') {
        problems.push(ExecStartProblem::PythonNotAbsolute {
            python: python.clone(),
        });
    }
    // By the flag each name means, with the name written first, to tell a repeat.
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut port = None;
    for (written, values) in group(rest, &mut problems) {
        let (name, canonical) = match spelled(catalog, &written) {
            Ok(Spelled {
                name,
                canonical,
                note,
            }) => {
                command.notes.extend(note);
                (name, canonical)
            }
            Err(problem) => {
                problems.push(problem.into());
                continue;
            }
        };
        if let Some((_, first)) = seen.iter().find(|(c, _)| *c == canonical) {
            problems.push(ExecStartProblem::Twice {
                canonical,
                first: first.clone(),
                written,
            });
            continue;
        }
        seen.push((canonical, written.clone()));
        match name.as_str() {
            "model-path" => command.model_path = one(&written, &values, &mut problems),
            "served-model-name" => {
                command.served_model_name = Some(one(&written, &values, &mut problems))
            }
            "host" => command.host = Some(one(&written, &values, &mut problems)),
            "port" => port = Some(one(&written, &values, &mut problems)),
            _ => match flag(&name, &values, catalog, redactor) {
                Ok(value) => command.flags.push((name, value)),
                Err(problem) => problems.push(problem.into()),
            },
        }
    }
    if command.model_path.is_empty() && !seen.iter().any(|(n, _)| n == "model-path") {
        problems.push(ExecStartProblem::NoModelPath);
    }
    match port {
        None => problems.push(ExecStartProblem::NoPort),
        Some(text) => match text.parse::<u16>() {
            Ok(p) if p > 0 && p.to_string() == text => command.port = p,
            _ => problems.push(ExecStartProblem::BadPort { text }),
        },
    }
    if problems.is_empty() {
        Ok(command)
    } else {
        Err(problems)
    }
}

/// SGLang's console script, by its name (`sglang`, as its package installs it).
pub fn is_console_script(program: &str) -> bool {
    program.rsplit('/').next() == Some("sglang")
}

/// Why an ExecStart is not one a manifest renders; a container runtime is named as such, since
/// the SGLang inside it (its image, its Python) is out of reconcile's reach.
fn not_sglang(argv: &[String]) -> ExecStartProblem {
    let shown = argv.iter().take(3).cloned().collect::<Vec<_>>().join(" ");
    let program = argv
        .first()
        .map_or("", |p| p.rsplit('/').next().unwrap_or(p));
    if CONTAINER_RUNTIMES.contains(&program) {
        return ExecStartProblem::Container { shown };
    }
    ExecStartProblem::NotSglang { shown }
}

/// What keeps an ExecStart from being written as a manifest's `sglang:`; each is one message
/// for the ExecStart line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecStartProblem {
    /// A container runtime runs the server.
    #[error("ExecStart runs a container (`{shown} ...`), not SGLang itself: reconcile renders `<python> -m sglang.launch_server` run on the host, so a containerised server cannot be adopted (install SGLang on the host, or keep this unit out of reconcile)")]
    Container {
        /// ExecStart's first three words.
        shown: String,
    },
    /// Some other program than the two commands reconcile renders.
    #[error("ExecStart runs `{shown}`, not `<python> -m sglang.launch_server ...` or `<venv>/bin/sglang serve ...`, the commands reconcile renders")]
    NotSglang { shown: String },
    /// A console script named by a relative path.
    #[error("ExecStart's `{script}` is not an absolute path, which a manifest's sglang.console_script must be")]
    ScriptNotAbsolute { script: String },
    /// The console script's `#!` line did not read.
    #[error("the Python of `{script}` (its `#!` line) could not be read, and a manifest names it as sglang.python")]
    NoInterpreter { script: String },
    /// A Python named by a relative path.
    #[error("ExecStart's Python `{python}` is not an absolute path, which a manifest's sglang.python must be")]
    PythonNotAbsolute { python: String },
    /// One flag given twice, perhaps under two of its names.
    #[error(
        "--{canonical} is given twice{}; a manifest sets each flag once (merge them in the unit first)",
        as_what(.first, .written)
    )]
    Twice {
        canonical: String,
        /// The name it was written under first, and the second time.
        first: String,
        written: String,
    },
    /// No `--model-path`.
    #[error("ExecStart has no --model-path, which every manifest renders")]
    NoModelPath,
    /// No `--port`.
    #[error("ExecStart has no --port, which every manifest renders: add SGLang's default, --port 30000, to the unit first")]
    NoPort,
    /// A `--port` that is not 1 to 65535 written as plain digits.
    #[error("--port `{text}` is not a port a manifest can write (1 to 65535, as digits)")]
    BadPort { text: String },
    /// A word after `--name=value`, which argparse takes as positional.
    #[error("`{arg}` follows --{name}=..., so SGLang reads it as a positional argument, which a manifest cannot write")]
    AfterJoined { arg: String, name: String },
    /// A word before the first flag.
    #[error("`{arg}` comes before any flag: a positional argument, which a manifest cannot write")]
    Positional { arg: String },
    /// A field the manifest renders itself given other than one value.
    #[error("--{name} takes one value here, and ExecStart gives it {count}")]
    NotOne { name: String, count: usize },
    /// A flag the host's SGLang would not read so.
    #[error(transparent)]
    Flag(#[from] FlagProblem),
}

fn as_what(first: &str, written: &str) -> String {
    if first == written {
        String::new()
    } else {
        format!(" (as --{first} and --{written})")
    }
}

/// Programs that run a server inside a container image.
const CONTAINER_RUNTIMES: [&str; 6] = [
    "docker",
    "podman",
    "nerdctl",
    "ctr",
    "apptainer",
    "singularity",
];

/// The flags with their values: `--name=value` (one value) or `--name v1 v2 ...`.
fn group(args: &[String], problems: &mut Vec<ExecStartProblem>) -> Vec<(String, Vec<String>)> {
    let mut flags: Vec<(String, Vec<String>)> = Vec::new();
    let mut joined = false;
    for arg in args {
        if let Some(flag) = arg.strip_prefix("--").filter(|f| !f.is_empty()) {
            joined = flag.contains('=');
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name, vec![value.to_string()]),
                None => (flag, Vec::new()),
            };
            flags.push((name.to_string(), value));
        } else {
            match flags.last_mut() {
                Some((_, values)) if !joined => values.push(arg.clone()),
                Some((name, _)) => problems.push(ExecStartProblem::AfterJoined {
                    arg: arg.clone(),
                    name: name.clone(),
                }),
                None => problems.push(ExecStartProblem::Positional { arg: arg.clone() }),
            }
        }
    }
    flags
}

fn one(name: &str, values: &[String], problems: &mut Vec<ExecStartProblem>) -> String {
    match values {
        [v] => v.clone(),
        _ => {
            problems.push(ExecStartProblem::NotOne {
                name: name.to_string(),
                count: values.len(),
            });
            String::new()
        }
    }
}

/// Why one flag of ExecStart cannot be written in a manifest; the message is one of the
/// ExecStart line's problems.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagProblem {
    /// The host's SGLang has no such flag (nor one it abbreviates).
    #[error("SGLang {version} has no flag --{name}, so a manifest for it cannot carry it")]
    Unknown { version: &'static str, name: String },
    /// An abbreviation of more than one flag: argparse refuses it.
    #[error(
        "--{written} is ambiguous in SGLang {version}: argparse stops, since it could mean --{}",
        .options.join(", --")
    )]
    Ambiguous {
        written: String,
        version: &'static str,
        /// The option strings it could mean, sorted.
        options: Vec<&'static str>,
    },
    /// A switch given values.
    #[error("--{name} is a switch in this SGLang, yet ExecStart gives it `{}`", .values.join(" "))]
    SwitchGiven { name: String, values: Vec<String> },
    /// A flag that needs a value given none.
    #[error("--{name} has no value, and SGLang needs one")]
    NoValue { name: String },
    /// A one-value flag given several.
    #[error(
        "--{name} takes one value, and ExecStart gives it {}: `{}`",
        .values.len(),
        .values.join(" ")
    )]
    NotOneValue { name: String, values: Vec<String> },
}

/// One flag, typed by the catalog's entry for it (or, without a catalog, by its shape).
fn flag(
    name: &str,
    values: &[String],
    catalog: Option<&Catalog>,
    redactor: &Redactor,
) -> Result<Written, FlagProblem> {
    let (kind, value_type, nargs) = match catalog {
        None => {
            let kind = match values.len() {
                0 => Kind::Switch,
                1 => Kind::Value,
                _ => Kind::List,
            };
            (kind, ValueType::Str, "")
        }
        Some(c) => match c.option(name) {
            Some(f) => (f.kind, f.value_type, f.nargs),
            None => {
                return Err(FlagProblem::Unknown {
                    version: c.version,
                    name: name.to_string(),
                })
            }
        },
    };
    // A secret is one text value (`--api-key`): a count or a list of numbers whose name has a
    // secret-looking word (`--bucket-time-to-first-token`) is none.
    let secret = redactor.is_secret(name)
        && kind == Kind::Value
        && matches!(value_type, ValueType::Str | ValueType::Json);
    if let (true, [value]) = (secret, values) {
        return Ok(Written::FromEnv {
            var: format!("SGLANG_{}", name.to_ascii_uppercase().replace('-', "_")),
            value: value.clone(),
        });
    }
    let item = |v: &String| typed(v, value_type);
    match (kind, values) {
        (Kind::Switch, []) => Ok(Written::True),
        (Kind::Switch, _) => Err(FlagProblem::SwitchGiven {
            name: name.to_string(),
            values: values.to_vec(),
        }),
        (_, []) if matches!(nargs, "?" | "*") => Ok(Written::True),
        (_, []) => Err(FlagProblem::NoValue {
            name: name.to_string(),
        }),
        (Kind::Value, [v]) => Ok(Written::One(item(v))),
        (Kind::Value, _) => Err(FlagProblem::NotOneValue {
            name: name.to_string(),
            values: values.to_vec(),
        }),
        (Kind::List, _) => Ok(Written::List(values.iter().map(item).collect())),
    }
}

/// The name a manifest gives a flag written `--{written}`, as the host's SGLang reads it.
struct Spelled {
    name: String,
    /// The flag's canonical name, to tell a flag given twice under two names.
    canonical: String,
    note: Option<String>,
}

/// An alias stays as written (the manifest renders it so); an abbreviation argparse expands
/// becomes the option it stands for, and `--model` the manifest's `model_path` (rendered
/// `--model-path`): text the plan shows, a setting it reads as the same. Without a catalog,
/// every name stays as written.
fn spelled(catalog: Option<&Catalog>, written: &str) -> Result<Spelled, FlagProblem> {
    let as_written = |canonical: &str| Spelled {
        name: written.to_string(),
        canonical: canonical.to_string(),
        note: None,
    };
    let Some(c) = catalog else {
        return Ok(as_written(written));
    };
    let renamed = |name: &str, canonical: &str| {
        let note = format!(
            "--{written} is SGLang {}'s --{name}; the manifest writes {name}, and its unit says --{name} (a text change the plan reads as the same flag: a reload, no restart)",
            c.version
        );
        Spelled {
            name: name.to_string(),
            canonical: canonical.to_string(),
            note: Some(note),
        }
    };
    match resolve(c, written) {
        Resolved::Exact(flag) => Ok(as_written(flag.name)),
        Resolved::Alias(flag) if RENDERED.contains(&flag.name) => Ok(renamed(flag.name, flag.name)),
        Resolved::Alias(flag) => Ok(as_written(flag.name)),
        Resolved::Prefix { flag, .. } if RENDERED.contains(&flag.name) => {
            Ok(renamed(flag.name, flag.name))
        }
        // The option string it abbreviates (an alias stays one), written in full.
        Resolved::Prefix { flag, option } => Ok(renamed(option, flag.name)),
        Resolved::Ambiguous(mut options) => {
            options.sort_unstable();
            Err(FlagProblem::Ambiguous {
                written: written.to_string(),
                version: c.version,
                options,
            })
        }
        Resolved::Unknown => Err(FlagProblem::Unknown {
            version: c.version,
            name: written.to_string(),
        }),
    }
}

/// The flags a manifest renders from fields of its own, by their canonical names.
const RENDERED: [&str; 4] = ["model-path", "served-model-name", "host", "port"];

/// A number bare when YAML reads it back as the very same text; anything else as text.
fn typed(value: &str, value_type: ValueType) -> Item {
    let canonical_int = || {
        let digits = value.strip_prefix('-').unwrap_or(value);
        !digits.is_empty()
            && digits.chars().all(|c| c.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && value.parse::<i64>().is_ok()
            && value != "-0"
    };
    let canonical_float = || {
        value.contains('.')
            && value
                .parse::<f64>()
                .is_ok_and(|f| f.is_finite() && f.to_string() == value)
    };
    let number = match value_type {
        ValueType::Int => canonical_int(),
        ValueType::Float => canonical_int() || canonical_float(),
        _ => false,
    };
    if number {
        Item::Number(value.to_string())
    } else {
        Item::Text(value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    fn catalog() -> Option<&'static Catalog> {
        Catalog::for_version("0.5.23")
    }

    #[test]
    fn flags_are_typed_by_the_catalog() {
        let c = read(
            &argv("/usr/bin/python3 -m sglang.launch_server --model-path /m --tp-size 4 --mem-fraction-static 0.85 --enable-metrics --numa-node 0 1 --context-length 128k --port 30000 --api-key sk-1"),
            None,
            catalog(),
            &Redactor::default(),
        )
        .unwrap();
        assert_eq!((c.model_path.as_str(), c.port), ("/m", 30000));
        let flags: Vec<(&str, &Written)> = c.flags.iter().map(|(n, w)| (n.as_str(), w)).collect();
        assert_eq!(
            flags,
            [
                ("tp-size", &Written::One(Item::Number("4".into()))),
                (
                    "mem-fraction-static",
                    &Written::One(Item::Number("0.85".into()))
                ),
                ("enable-metrics", &Written::True),
                (
                    "numa-node",
                    &Written::List(vec![Item::Number("0".into()), Item::Number("1".into())])
                ),
                ("context-length", &Written::One(Item::Text("128k".into()))),
                (
                    "api-key",
                    &Written::FromEnv {
                        var: "SGLANG_API_KEY".into(),
                        value: "sk-1".into()
                    }
                ),
            ]
        );
    }

    #[test]
    fn aliases_stay_as_written_and_abbreviations_are_written_in_full() {
        let c = read(
            &argv("/v/bin/python -m sglang.launch_server --model /m --tp 4 --tensor-parallel-size 4 --port 30000 --served 'q'"),
            None,
            catalog(),
            &Redactor::default(),
        );
        // --tp and --tensor-parallel-size are one flag: argparse keeps the last, a manifest one.
        let twice = &c.unwrap_err()[0];
        assert!(twice
            .to_string()
            .contains("--tp-size is given twice (as --tp and --tensor-parallel-size)"));
        assert!(
            matches!(twice, ExecStartProblem::Twice { canonical, .. } if canonical == "tp-size")
        );
        let c = read(
            &argv("/v/bin/python -m sglang.launch_server --model /m --tp 4 --dp-size 2 --data-parallel 1 --served q --port 30000"),
            None,
            catalog(),
            &Redactor::default(),
        );
        assert!(c.unwrap_err()[0]
            .to_string()
            .contains("--dp-size is given twice"));
        let c = read(
            &argv("/v/bin/python -m sglang.launch_server --model /m --tp 4 --data-parallel-size 2 --served q --port 30000"),
            None,
            catalog(),
            &Redactor::default(),
        )
        .unwrap();
        assert_eq!(
            (c.model_path.as_str(), c.served_model_name.as_deref()),
            ("/m", Some("q"))
        );
        let names: Vec<&str> = c.flags.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["tp-size", "data-parallel-size"]);
        assert_eq!(c.notes.len(), 3, "{:#?}", c.notes);
        assert!(
            c.notes[0].starts_with(
                "--model is SGLang 0.5.23's --model-path; the manifest writes model-path"
            ),
            "{}",
            c.notes[0]
        );
        assert!(
            c.notes[1].starts_with("--tp is SGLang 0.5.23's --tp-size"),
            "{}",
            c.notes[1]
        );
        assert!(
            c.notes[2].starts_with("--served is SGLang 0.5.23's --served-model-name"),
            "{}",
            c.notes[2]
        );
    }

    #[test]
    fn numbers_stay_text_unless_yaml_reads_them_back_the_same() {
        assert_eq!(typed("007", ValueType::Int), Item::Text("007".into()));
        assert_eq!(typed("1e-3", ValueType::Float), Item::Text("1e-3".into()));
        assert_eq!(typed("1.0", ValueType::Float), Item::Text("1.0".into()));
        assert_eq!(typed("-2", ValueType::Int), Item::Number("-2".into()));
        assert_eq!(typed("4", ValueType::Str), Item::Text("4".into()));
    }

    #[test]
    fn what_a_manifest_cannot_write_is_named() {
        let problems = |line: &str| -> Vec<String> {
            read(&argv(line), None, catalog(), &Redactor::default())
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        let p = problems("/bin/sh -c true");
        assert!(
            p[0].contains("not `<python> -m sglang.launch_server"),
            "{p:?}"
        );
        let p = problems("/usr/local/bin/docker run --gpus all lmsysorg/sglang python3 -m sglang.launch_server --model-path /m --port 30000");
        assert!(
            p[0].starts_with("ExecStart runs a container (`/usr/local/bin/docker run --gpus ...`), not SGLang itself"),
            "{p:?}"
        );
        let p = problems("python3 -m sglang.launch_server --model-path /m --tp 2 --tp-size 1 --enable 1 --no-such 1 --enable-metrics yes");
        assert_eq!(p.len(), 6, "{p:#?}");
        assert!(p[0].contains("not an absolute path"));
        assert!(p[1].contains("--tp-size is given twice (as --tp and --tp-size)"));
        assert!(p[2].starts_with("--enable is ambiguous in SGLang 0.5.23: argparse stops, since it could mean --enable-"), "{}", p[2]);
        assert!(p[3].contains("SGLang 0.5.23 has no flag --no-such"));
        assert!(p[4].contains("--enable-metrics is a switch"));
        assert!(p[5].contains("no --port"));
        let kinds = read(
            &argv("python3 -m sglang.launch_server --model-path /m --tp 2 --tp-size 1 --enable 1 --no-such 1 --enable-metrics yes"),
            None,
            catalog(),
            &Redactor::default(),
        )
        .unwrap_err();
        assert_eq!(kinds[5], ExecStartProblem::NoPort);
        assert!(matches!(
            kinds[3],
            ExecStartProblem::Flag(FlagProblem::Unknown { .. })
        ));
        // The same problems, by kind.
        assert!(matches!(
            spelled(catalog(), "enable"),
            Err(FlagProblem::Ambiguous { .. })
        ));
        let r = Redactor::default();
        assert_eq!(
            flag("enable-metrics", &["yes".into()], catalog(), &r).unwrap_err(),
            FlagProblem::SwitchGiven {
                name: "enable-metrics".into(),
                values: vec!["yes".into()]
            }
        );
        assert!(matches!(
            flag("no-such", &[], catalog(), &r),
            Err(FlagProblem::Unknown { .. })
        ));
    }
}
