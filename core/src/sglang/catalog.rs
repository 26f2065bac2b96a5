//! The `launch_server` flags (and environment variables) of each SGLang version we know, read from
//! tables built from that version's wheel by `tools/sglang-catalog/`. They are compiled in so a
//! check needs neither the network nor an SGLang install, and a manifest for an unknown version is
//! the only case we cannot check.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::env::EnvCatalog;

/// How a flag takes its values on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bare flag (`store_true`, `BooleanOptionalAction`, ...).
    Switch,
    Value,
    /// `nargs` `+` or `*`: one or more values after the flag.
    List,
}

/// The type argparse converts each value to (the table's `type` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Int,
    Float,
    Str,
    Bool,
    Json,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    /// The canonical name, without the leading `--`.
    pub name: &'static str,
    /// Other option strings for the same flag, without `--` (`tensor-parallel-size`, `no-...`).
    pub aliases: Vec<&'static str>,
    pub kind: Kind,
    pub value_type: ValueType,
    pub choices: Vec<&'static str>,
    /// argparse's `nargs` (`+`, `*`, `?`), empty when it takes exactly one value.
    pub nargs: &'static str,
    /// argparse's `type=` or `action=` when it is not the plain type (`human_readable_int`, ...).
    pub parser: &'static str,
    pub deprecated: Option<Deprecation>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Deprecation {
    /// What to use instead, as the table writes it (`--enable-amd-monokernel`), when it names one.
    pub replacement: Option<&'static str>,
}

#[derive(Debug)]
pub struct Catalog {
    pub version: &'static str,
    flags: Vec<Flag>,
    /// Every option string (canonical names and aliases, without `--`) to its flag's index.
    options: HashMap<&'static str, usize>,
    env: Option<EnvCatalog>,
}

/// (version, server-args table, env-vars table) for every version shipped.
const TABLES: [(&str, &str, Option<&str>); 3] = [
    (
        "0.4.10.post2",
        include_str!("catalogs/server-args-0.4.10.post2.tsv"),
        None,
    ),
    (
        "0.5.9",
        include_str!("catalogs/server-args-0.5.9.tsv"),
        None,
    ),
    (
        "0.5.23",
        include_str!("catalogs/server-args-0.5.23.tsv"),
        Some(include_str!("catalogs/env-vars-0.5.23.tsv")),
    ),
];

impl Catalog {
    /// The catalog of an SGLang version, parsed on first use; `None` for a version not shipped.
    pub fn for_version(version: &str) -> Option<&'static Catalog> {
        static ALL: OnceLock<Vec<Catalog>> = OnceLock::new();
        ALL.get_or_init(|| {
            TABLES
                .iter()
                .map(|(v, flags, env)| Catalog::parse(v, flags, *env))
                .collect()
        })
        .iter()
        .find(|c| c.version == version)
    }

    pub fn versions() -> impl Iterator<Item = &'static str> {
        TABLES.iter().map(|(v, _, _)| *v)
    }

    fn parse(version: &'static str, flags: &'static str, env: Option<&'static str>) -> Catalog {
        let flags: Vec<Flag> = flags
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("flag\t") && !l.is_empty())
            .map(parse_flag)
            .collect();
        let mut options = HashMap::new();
        for (i, flag) in flags.iter().enumerate() {
            for option in std::iter::once(&flag.name).chain(&flag.aliases) {
                options.entry(*option).or_insert(i);
            }
        }
        Catalog {
            version,
            flags,
            options,
            env: env.map(EnvCatalog::parse),
        }
    }

    #[cfg(test)]
    pub fn flags(&self) -> &[Flag] {
        &self.flags
    }

    /// The flag an option string (without `--`, canonical or alias) belongs to.
    pub fn option(&self, option: &str) -> Option<&Flag> {
        self.options.get(option).map(|&i| &self.flags[i])
    }

    /// Every option string argparse knows, as it matches abbreviations against all of them.
    pub fn option_strings(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.flags
            .iter()
            .flat_map(|f| std::iter::once(f.name).chain(f.aliases.iter().copied()))
    }

    pub fn env(&self) -> Option<&EnvCatalog> {
        self.env.as_ref()
    }
}

/// One row: flag aliases kind type choices default nargs parser required fallback dest deprecated
/// origin. The tables are built by our own script, so a malformed row is a bug worth a panic in tests.
fn parse_flag(line: &'static str) -> Flag {
    let cols: Vec<&'static str> = line.split('\t').collect();
    let col = |i: usize| cols.get(i).copied().unwrap_or("");
    let list = |text: &'static str| -> Vec<&'static str> {
        text.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_start_matches('-'))
            .collect()
    };
    Flag {
        name: col(0).trim_start_matches('-'),
        aliases: list(col(1)),
        kind: match col(2) {
            "bool" => Kind::Switch,
            "list" => Kind::List,
            _ => Kind::Value,
        },
        value_type: match col(3) {
            "int" => ValueType::Int,
            "float" => ValueType::Float,
            "bool" => ValueType::Bool,
            "json" => ValueType::Json,
            _ => ValueType::Str,
        },
        // Choices are comma-separated and never contain commas themselves.
        choices: col(4).split(',').filter(|s| !s.is_empty()).collect(),
        nargs: col(6),
        parser: col(7),
        deprecated: deprecation(col(11)),
    }
}

/// The `deprecated` column: empty, `yes (per help text)`, or `use <replacement>`.
fn deprecation(text: &'static str) -> Option<Deprecation> {
    if text.is_empty() {
        return None;
    }
    let replacement = text.strip_prefix("use ").map(str::trim);
    Some(Deprecation { replacement })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(version: &str) -> &'static Catalog {
        Catalog::for_version(version).unwrap()
    }

    /// Rows in the reference tables, which the shipped catalogs must match one for one.
    fn reference_rows(version: &str) -> usize {
        let path = format!(
            "{}/../fixtures/sglang/server-args-{version}.tsv",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().filter(|l| l.starts_with("--")).count()
    }

    #[test]
    fn every_version_has_as_many_flags_as_its_reference_table() {
        for version in Catalog::versions() {
            assert_eq!(
                catalog(version).flags().len(),
                reference_rows(version),
                "{version}"
            );
        }
        assert_eq!(catalog("0.5.23").flags().len(), 531);
        assert!(Catalog::for_version("0.3.0").is_none());
    }

    #[test]
    fn a_flag_new_in_0_5_23() {
        let name = "enable-fused-moe-sum-all-reduce";
        assert!(catalog("0.5.23").option(name).is_some());
        assert!(catalog("0.5.9").option(name).is_none());
        assert!(catalog("0.4.10.post2").option(name).is_none());
    }

    #[test]
    fn columns_are_read() {
        let c = catalog("0.5.23");
        let tp = c.option("tensor-parallel-size").unwrap();
        assert_eq!(tp.name, "tp-size");
        assert_eq!((tp.kind, tp.value_type), (Kind::Value, ValueType::Int));
        let ep = c.option("ep").unwrap();
        assert_eq!(ep.aliases, ["expert-parallel-size", "ep"]);
        let tokenizer = c.option("tokenizer-mode").unwrap();
        assert_eq!(tokenizer.choices, ["auto", "slow"]);
        let numa = c.option("numa-node").unwrap();
        assert_eq!((numa.kind, numa.nargs), (Kind::List, "+"));
        assert_eq!(
            c.option("context-length").unwrap().parser,
            "human_readable_int"
        );
        assert_eq!(c.option("enable-metrics").unwrap().kind, Kind::Switch);
    }

    #[test]
    fn deprecations_and_their_replacements() {
        let c = catalog("0.5.23");
        let fusion = c.option("enable-flashinfer-allreduce-fusion").unwrap();
        assert_eq!(fusion.deprecated, Some(Deprecation { replacement: None }));
        let mono = c.option("monokernel-backend").unwrap();
        assert_eq!(
            mono.deprecated.as_ref().unwrap().replacement,
            Some("--enable-amd-monokernel")
        );
        assert_eq!(c.option("tp-size").unwrap().deprecated, None);
    }

    #[test]
    fn only_0_5_23_has_an_env_catalog() {
        assert!(catalog("0.5.23").env().is_some());
        assert!(catalog("0.5.9").env().is_none());
    }
}
