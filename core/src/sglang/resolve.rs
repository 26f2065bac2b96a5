//! Which flag a manifest name means, the way argparse decides it: an exact option string first,
//! then (argparse's `allow_abbrev`, on by default) any unique prefix of an option string. The prefix
//! is matched against every option string, aliases included, so `tensor` means
//! `--tensor-parallel-size`, and a prefix two option strings share is ambiguous even when both belong
//! to the same flag (Python 3.11's rule).

use super::catalog::{Catalog, Flag};

#[derive(Debug, PartialEq)]
pub enum Resolved<'c> {
    /// The canonical name.
    Exact(&'c Flag),
    /// Another option string of the flag, as written.
    Alias(&'c Flag),
    /// A unique prefix of `option`, which is what the rendered unit must say instead.
    Prefix {
        flag: &'c Flag,
        option: &'static str,
    },
    /// A prefix of several option strings: argparse stops with "ambiguous option".
    Ambiguous(Vec<&'static str>),
    Unknown,
}

pub fn resolve<'c>(catalog: &'c Catalog, name: &str) -> Resolved<'c> {
    if let Some(flag) = catalog.option(name) {
        return if flag.name == name {
            Resolved::Exact(flag)
        } else {
            Resolved::Alias(flag)
        };
    }
    let mut matches: Vec<&'static str> = catalog
        .option_strings()
        .filter(|o| o.starts_with(name))
        .collect();
    match matches.len() {
        0 => Resolved::Unknown,
        1 => {
            let option = matches[0];
            // The option strings are the catalog's own, so it always has this one.
            match catalog.option(option) {
                Some(flag) => Resolved::Prefix { flag, option },
                None => Resolved::Unknown,
            }
        }
        _ => {
            matches.sort_unstable();
            Resolved::Ambiguous(matches)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::suggest::did_you_mean;

    fn at(version: &str, name: &str) -> Resolved<'static> {
        resolve(Catalog::for_version(version).unwrap(), name)
    }

    #[test]
    fn exact_names_and_aliases() {
        assert!(matches!(at("0.5.23", "tp-size"), Resolved::Exact(f) if f.name == "tp-size"));
        assert!(
            matches!(at("0.5.23", "tensor-parallel-size"), Resolved::Alias(f) if f.name == "tp-size")
        );
    }

    #[test]
    fn a_unique_prefix_names_its_option() {
        let Resolved::Prefix { flag, option } = at("0.5.23", "tp") else {
            panic!("tp should be a prefix")
        };
        assert_eq!((flag.name, option), ("tp-size", "tp-size"));
        let Resolved::Prefix { flag, option } = at("0.5.23", "tensor-par") else {
            panic!("tensor-par should be a prefix")
        };
        assert_eq!((flag.name, option), ("tp-size", "tensor-parallel-size"));
    }

    #[test]
    fn cuda_graph_max_bs_is_exact_in_0_5_9_and_ambiguous_in_0_5_23() {
        assert!(matches!(
            at("0.5.9", "cuda-graph-max-bs"),
            Resolved::Exact(_)
        ));
        assert_eq!(
            at("0.5.23", "cuda-graph-max-bs"),
            Resolved::Ambiguous(vec![
                "cuda-graph-max-bs-decode",
                "cuda-graph-max-bs-prefill"
            ])
        );
    }

    #[test]
    fn unknown_names_get_near_suggestions() {
        let c = Catalog::for_version("0.5.23").unwrap();
        assert_eq!(
            at("0.5.23", "enable-fused-moe-sum-allreduce"),
            Resolved::Unknown
        );
        let near = did_you_mean("enable-fused-moe-sum-allreduce", c.option_strings());
        assert_eq!(near[0], "enable-fused-moe-sum-all-reduce");
        assert!(did_you_mean("zzzzzzzz-qqqq", c.option_strings()).is_empty());
    }
}
