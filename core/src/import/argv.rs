//! `ExecStart=` read back into the manifest's `sglang:` part: the Python, the fields it renders
//! itself (`--model-path`, `--served-model-name`, `--host`, `--port`) and every other flag, typed
//! with the catalog of the host's SGLang version as the manifest would write it.

use crate::redact::Redactor;
use crate::sglang::catalog::{Catalog, Kind, ValueType};

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
    pub model_path: String,
    pub served_model_name: Option<String>,
    pub host: Option<String>,
    pub port: u16,
    /// By name as written (without `--`), in argv order.
    pub flags: Vec<(String, Written)>,
}

/// Reads `argv` (ExecStart's, as systemd runs it) into a [`Command`]; every problem found is a
/// message for the ExecStart line.
pub fn read(
    argv: &[String],
    catalog: Option<&Catalog>,
    redactor: &Redactor,
) -> Result<Command, Vec<String>> {
    let mut problems = Vec::new();
    let (python, rest) = match argv {
        [python, m, module, rest @ ..] if m == "-m" && module == "sglang.launch_server" => {
            (python.clone(), rest)
        }
        _ => {
            return Err(vec![format!(
                "ExecStart runs `{}`, not `<python> -m sglang.launch_server ...`, the only command reconcile renders",
                argv.iter().take(3).cloned().collect::<Vec<_>>().join(" ")
            )])
        }
    };
    if !python.starts_with('/') {
        problems.push(format!(
            "ExecStart's Python `{python}` is not an absolute path, which a manifest's sglang.python must be"
        ));
    }
    let mut command = Command {
        python,
        ..Command::default()
    };
    let mut seen: Vec<String> = Vec::new();
    let mut port = None;
    for (name, values) in group(rest, &mut problems) {
        if seen.contains(&name) {
            problems.push(format!(
                "--{name} is given twice; a manifest sets each flag once (merge them in the unit first)"
            ));
            continue;
        }
        seen.push(name.clone());
        match name.as_str() {
            "model-path" => command.model_path = one(&name, &values, &mut problems),
            "served-model-name" => {
                command.served_model_name = Some(one(&name, &values, &mut problems))
            }
            "host" => command.host = Some(one(&name, &values, &mut problems)),
            "port" => port = Some(one(&name, &values, &mut problems)),
            "model" => problems.push(
                "--model is rendered as --model-path by reconcile, which the plan would count as a changed flag: write --model-path in the unit first".into(),
            ),
            _ => match flag(&name, &values, catalog, redactor) {
                Ok(written) => command.flags.push((name, written)),
                Err(problem) => problems.push(problem),
            },
        }
    }
    if command.model_path.is_empty() && !seen.iter().any(|n| n == "model") {
        problems.push("ExecStart has no --model-path, which every manifest renders".into());
    }
    match port {
        None => problems.push(
            "ExecStart has no --port, which every manifest renders: add SGLang's default, --port 30000, to the unit first".into(),
        ),
        Some(text) => match text.parse::<u16>() {
            Ok(p) if p > 0 && p.to_string() == text => command.port = p,
            _ => problems.push(format!(
                "--port `{text}` is not a port a manifest can write (1 to 65535, as digits)"
            )),
        },
    }
    if problems.is_empty() {
        Ok(command)
    } else {
        Err(problems)
    }
}

/// The flags with their values: `--name=value` (one value) or `--name v1 v2 ...`.
fn group(args: &[String], problems: &mut Vec<String>) -> Vec<(String, Vec<String>)> {
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
                Some((name, _)) => problems.push(format!(
                    "`{arg}` follows --{name}=..., so SGLang reads it as a positional argument, which a manifest cannot write"
                )),
                None => problems.push(format!(
                    "`{arg}` comes before any flag: a positional argument, which a manifest cannot write"
                )),
            }
        }
    }
    flags
}

fn one(name: &str, values: &[String], problems: &mut Vec<String>) -> String {
    match values {
        [v] => v.clone(),
        _ => {
            problems.push(format!(
                "--{name} takes one value here, and ExecStart gives it {}",
                values.len()
            ));
            String::new()
        }
    }
}

/// One flag, typed by the catalog's entry for it (or, without a catalog, by its shape).
fn flag(
    name: &str,
    values: &[String],
    catalog: Option<&Catalog>,
    redactor: &Redactor,
) -> Result<Written, String> {
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
            None => return Err(unknown(c, name)),
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
        (Kind::Switch, _) => Err(format!(
            "--{name} is a switch in this SGLang, yet ExecStart gives it `{}`",
            values.join(" ")
        )),
        (_, []) if matches!(nargs, "?" | "*") => Ok(Written::True),
        (_, []) => Err(format!("--{name} has no value, and SGLang needs one")),
        (Kind::Value, [v]) => Ok(Written::One(item(v))),
        (Kind::Value, _) => Err(format!(
            "--{name} takes one value, and ExecStart gives it {}: `{}`",
            values.len(),
            values.join(" ")
        )),
        (Kind::List, _) => Ok(Written::List(values.iter().map(item).collect())),
    }
}

/// Why a name is not one the catalog knows: an abbreviation argparse expands (which the manifest
/// would render in full: a changed flag to the plan), or no flag at all.
fn unknown(c: &Catalog, name: &str) -> String {
    let mut matches: Vec<&str> = c.option_strings().filter(|o| o.starts_with(name)).collect();
    matches.sort_unstable();
    match matches.as_slice() {
        [option] => format!(
            "--{name} is an abbreviation argparse expands to --{option}, which a manifest renders in full (a changed flag to the plan): write --{option} in the unit first"
        ),
        _ => format!(
            "SGLang {} has no flag --{name}, so a manifest for it cannot carry it",
            c.version
        ),
    }
}

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
    fn numbers_stay_text_unless_yaml_reads_them_back_the_same() {
        assert_eq!(typed("007", ValueType::Int), Item::Text("007".into()));
        assert_eq!(typed("1e-3", ValueType::Float), Item::Text("1e-3".into()));
        assert_eq!(typed("1.0", ValueType::Float), Item::Text("1.0".into()));
        assert_eq!(typed("-2", ValueType::Int), Item::Number("-2".into()));
        assert_eq!(typed("4", ValueType::Str), Item::Text("4".into()));
    }

    #[test]
    fn what_a_manifest_cannot_write_is_named() {
        let problems = |line: &str| read(&argv(line), catalog(), &Redactor::default()).unwrap_err();
        let p = problems("/bin/sh -c true");
        assert!(
            p[0].contains("not `<python> -m sglang.launch_server"),
            "{p:?}"
        );
        let p = problems("python3 -m sglang.launch_server --model-path /m --tp 2 --tp-size 1 --tp-size 2 --no-such 1 --enable-metrics yes");
        assert_eq!(p.len(), 6, "{p:#?}");
        assert!(p[0].contains("not an absolute path"));
        assert!(p[1].contains("--tp is an abbreviation argparse expands to --tp-size"));
        assert!(p[2].contains("--tp-size is given twice"));
        assert!(p[3].contains("SGLang 0.5.23 has no flag --no-such"));
        assert!(p[4].contains("--enable-metrics is a switch"));
        assert!(p[5].contains("no --port"));
    }
}
