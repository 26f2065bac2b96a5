//! A command line's flags as SGLang's parser reads them, so that a plan compares what the server
//! would run rather than how the unit spells it: `--tp 4` (a unique prefix), `--tensor-parallel-size
//! 4` (an alias) and `--tp-size 4` are one setting; `--mem-fraction-static 0.80` and `0.8` are one
//! float. Each name is resolved as argparse resolves it (`resolve`), each value converted by the
//! flag's type as argparse's `type=` would (`int`, `float`, JSON), and the result written back in
//! one spelling. What the catalog does not know, or cannot convert, stays as written: two spellings
//! that cannot be shown equal count as different, and a difference only ever costs a restart.

use std::collections::BTreeMap;

use super::catalog::{Catalog, Flag, Kind, ValueType};
use super::python::{python_float, python_int};
use super::resolve::{resolve, Resolved};

/// `flags` (name without `--` to its values as written, space-separated, as `flags::flags` reads
/// an ExecStart) as `catalog`'s parser reads them: canonical names, values in one spelling. When
/// two spellings name one flag, argparse keeps the last; `flags` has lost the order, so the one
/// written canonically wins, as it does in every unit reconcile renders.
pub fn as_parsed(catalog: &Catalog, flags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut parsed = BTreeMap::new();
    let mut canonical_written = Vec::new();
    for (name, value) in flags {
        let (flag, negated) = match resolve(catalog, name) {
            Resolved::Exact(flag) => (flag, false),
            Resolved::Alias(flag) => (flag, is_negation(flag, name)),
            Resolved::Prefix { flag, option } => (flag, is_negation(flag, option)),
            Resolved::Ambiguous(_) | Resolved::Unknown => {
                parsed.insert(name.clone(), value.clone());
                continue;
            }
        };
        let key = flag.name.to_string();
        if canonical_written.contains(&key) {
            continue;
        }
        if name == flag.name {
            canonical_written.push(key.clone());
        }
        parsed.insert(key, normalised(flag, value, negated));
    }
    parsed
}

/// A `BooleanOptionalAction` flag's `--no-...` option string.
fn is_negation(flag: &Flag, option: &str) -> bool {
    flag.kind == Kind::Switch && option.starts_with("no-") && !flag.name.starts_with("no-")
}

/// One value in one spelling: a switch as whether it is on, a number as Python reads it, JSON
/// re-serialised (keys sorted), a list item by item. A value the type refuses stays as written
/// (the manifest check reports it).
fn normalised(flag: &Flag, value: &str, negated: bool) -> String {
    if flag.kind == Kind::Switch {
        // A bare switch is on; `--no-x` turns it off.
        return if negated { "off" } else { "on" }.to_string();
    }
    // A converter of its own (`human_readable_int`, `json_list_type`, an action): compared as
    // written. The plain ones are the type's own.
    if !matches!(flag.parser, "" | "int" | "float" | "str" | "json.loads") {
        return value.to_string();
    }
    let one = |v: &str| -> String {
        match flag.value_type {
            ValueType::Int => python_int(v).map_or_else(|| v.to_string(), |n| n.to_string()),
            ValueType::Float => python_float(v).map_or_else(|| v.to_string(), |f| format!("{f:?}")),
            ValueType::Json => serde_json::from_str::<serde_json::Value>(v)
                .map_or_else(|_| v.to_string(), |j| j.to_string()),
            ValueType::Bool => v.trim().to_ascii_lowercase(),
            ValueType::Str => v.to_string(),
        }
    };
    match flag.kind {
        Kind::List => value
            .split_whitespace()
            .map(one)
            .collect::<Vec<_>>()
            .join(" "),
        // A JSON value may hold spaces: it is one argument, whatever `flags` joined.
        _ => one(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(catalog: &Catalog, pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let flags = pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        as_parsed(catalog, &flags)
    }

    /// The first flag of `catalog` that `pick` takes, for a test that needs a flag of a kind.
    fn flag_where(catalog: &Catalog, pick: impl Fn(&Flag) -> bool) -> Option<&Flag> {
        catalog.flags().iter().find(|f| pick(f))
    }

    fn every_catalog() -> impl Iterator<Item = &'static Catalog> {
        Catalog::versions().map(|v| Catalog::for_version(v).expect("a shipped catalog"))
    }

    #[test]
    fn a_prefix_an_alias_and_the_canonical_name_are_one_flag_in_every_catalog() {
        for c in every_catalog() {
            let canonical = read(c, &[("tp-size", "4"), ("model-path", "/m")]);
            assert_eq!(
                read(c, &[("tp", "4"), ("model-path", "/m")]),
                canonical,
                "{}",
                c.version
            );
            assert_eq!(
                read(c, &[("tensor-parallel-size", "4"), ("model", "/m")]),
                canonical,
                "{}",
                c.version
            );
            assert_ne!(read(c, &[("tp", "2"), ("model-path", "/m")]), canonical);
        }
    }

    #[test]
    fn numbers_are_compared_as_python_reads_them() {
        for c in every_catalog() {
            assert_eq!(
                read(c, &[("mem-fraction-static", "0.80")]),
                read(c, &[("mem-fraction-static", "0.8")]),
                "{}",
                c.version
            );
            assert_eq!(
                read(c, &[("mem-fraction-static", "1")]),
                read(c, &[("mem-fraction-static", "1.0")])
            );
            assert_ne!(
                read(c, &[("mem-fraction-static", "0.85")]),
                read(c, &[("mem-fraction-static", "0.8")])
            );
            assert_eq!(
                read(c, &[("tp-size", "04")]),
                read(c, &[("tp-size", "4")]),
                "{}",
                c.version
            );
        }
    }

    #[test]
    fn json_is_compared_as_data_and_unknown_flags_as_written() {
        let c = Catalog::for_version("0.5.23").unwrap();
        assert_eq!(
            read(
                c,
                &[("default-chat-template-kwargs", r#"{"a": 1, "b": [2]}"#)]
            ),
            read(c, &[("default-chat-template-kwargs", r#"{"b":[2],"a":1}"#)])
        );
        assert_ne!(
            read(c, &[("default-chat-template-kwargs", r#"{"a": 1}"#)]),
            read(c, &[("default-chat-template-kwargs", r#"{"a": 2}"#)])
        );
        // Not SGLang's: left as it is, so any difference still counts.
        assert_eq!(
            read(c, &[("not-a-flag", "0.80")]),
            BTreeMap::from([("not-a-flag".to_string(), "0.80".to_string())])
        );
        assert_ne!(
            read(c, &[("not-a-flag", "0.80")]),
            read(c, &[("not-a-flag", "0.8")])
        );
    }

    #[test]
    fn a_switch_is_on_and_its_negation_off() {
        let c = Catalog::for_version("0.5.23").unwrap();
        let negatable = flag_where(c, |f| {
            f.kind == Kind::Switch && f.aliases.iter().any(|a| a.starts_with("no-"))
        });
        if let Some(flag) = negatable {
            let no = flag.aliases.iter().find(|a| a.starts_with("no-")).unwrap();
            assert_ne!(read(c, &[(flag.name, "")]), read(c, &[(no, "")]));
        }
        assert_eq!(
            read(c, &[("enable-metrics", "")]),
            BTreeMap::from([("enable-metrics".to_string(), "on".to_string())])
        );
    }

    #[test]
    fn lists_keep_their_order_and_compare_item_by_item() {
        let c = Catalog::for_version("0.5.23").unwrap();
        let list = flag_where(c, |f| {
            f.kind == Kind::List && f.value_type == ValueType::Int && f.parser.is_empty()
        })
        .expect("an int list flag");
        assert_eq!(
            read(c, &[(list.name, "1 02 4")]),
            read(c, &[(list.name, "1 2 4")])
        );
        assert_ne!(
            read(c, &[(list.name, "4 2 1")]),
            read(c, &[(list.name, "1 2 4")])
        );
    }
}
