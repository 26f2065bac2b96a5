//! SGLang's environment variables. A misspelt `SGLANG_*` name is silently ignored by SGLang, and a
//! value its parser rejects only logs a warning and falls back to the default, so both are easy to
//! ship without noticing.
//!
//! The table has three parts: typed variables (`name type default`), variables SGLang no longer
//! reads or reads as a deprecated alias (`name message`, the alias message starting with `->`), and
//! variables read raw from `os.environ` (`name source-locations`).

use std::collections::BTreeMap;

use super::python::{python_float, python_int};
use super::suggest::did_you_mean;

#[derive(Debug, Clone, PartialEq)]
pub enum EnvVar {
    Typed {
        ty: &'static str,
        default: &'static str,
    },
    /// Deprecated in favour of another variable, still read when that one is unset.
    Alias { replacement: &'static str },
    /// No longer read; the message says what to do instead (may be empty).
    Retired { message: &'static str },
    /// Read with `os.environ`, with no conversion we can check.
    Raw,
}

#[derive(Debug)]
pub struct EnvCatalog {
    vars: BTreeMap<&'static str, EnvVar>,
}

/// What a value or name problem amounts to: `Err` stops SGLang from doing what was meant. A
/// warning (`Ok(Some(_))`) is only ever shown, so it stays a message.
pub type Verdict = Result<Option<String>, EnvValueError>;

/// A typed variable's value SGLang's parser refuses: it falls back to the default silently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not {expected}; SGLang would ignore it and use the default for {name} ({default})")]
pub struct EnvValueError {
    pub name: String,
    pub value: String,
    /// What the parser takes: `an integer`.
    pub expected: &'static str,
    /// SGLang's default, as its table writes it.
    pub default: &'static str,
}

impl EnvCatalog {
    pub fn parse(text: &'static str) -> EnvCatalog {
        let vars = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|line| {
                let mut cols = line.split('\t');
                let name = cols.next()?;
                Some((name, var(cols.next().unwrap_or(""), cols.next())))
            })
            .collect();
        EnvCatalog { vars }
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&EnvVar> {
        self.vars.get(name)
    }

    /// `Ok(None)`: fine; `Ok(Some(warning))`; `Err(error)`.
    pub fn check(&self, name: &str, value: &str) -> Verdict {
        match self.vars.get(name) {
            None if name.starts_with("SGLANG_") => Ok(Some(self.unknown(name))),
            None | Some(EnvVar::Raw) => Ok(None),
            Some(EnvVar::Alias { replacement }) => Ok(Some(format!(
                "{name} is a deprecated alias of {replacement}; set {replacement} instead"
            ))),
            Some(EnvVar::Retired { message }) => {
                let why = if message.is_empty() { "" } else { ": " };
                Ok(Some(format!("SGLang no longer reads {name}{why}{message}")))
            }
            Some(EnvVar::Typed { ty, default }) => typed(name, ty, default, value).map(|()| None),
        }
    }

    fn unknown(&self, name: &str) -> String {
        let known = self
            .vars
            .keys()
            .copied()
            .filter(|k| k.starts_with("SGLANG_"));
        let near = did_you_mean(name, known);
        let mut message = format!("SGLang does not read {name}");
        if !near.is_empty() {
            message.push_str(&format!("; did you mean {}?", near.join(" or ")));
        }
        message
    }
}

fn var(second: &'static str, third: Option<&'static str>) -> EnvVar {
    if let Some(default) = third {
        return EnvVar::Typed {
            ty: second,
            default,
        };
    }
    if let Some(rest) = second.strip_prefix("-> ") {
        let replacement = rest.split_whitespace().next().unwrap_or(rest);
        return EnvVar::Alias { replacement };
    }
    if second.starts_with("sglang/") {
        EnvVar::Raw
    } else {
        EnvVar::Retired { message: second }
    }
}

/// SGLang's `EnvBool`/`EnvInt`/`EnvFloat` parsers; a rejected value falls back to the default.
fn typed(name: &str, ty: &str, default: &'static str, value: &str) -> Result<(), EnvValueError> {
    let (ok, expected) = match ty {
        "bool" => (
            matches!(
                value.to_lowercase().as_str(),
                "1" | "true" | "yes" | "y" | "0" | "false" | "no" | "n"
            ),
            "a boolean: 1, true, yes, y or 0, false, no, n",
        ),
        "int" => (python_int(value).is_some(), "an integer"),
        "float" => (python_float(value).is_some(), "a number"),
        _ => (true, ""),
    };
    if ok {
        return Ok(());
    }
    Err(EnvValueError {
        name: name.to_string(),
        value: value.to_string(),
        expected,
        default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::Catalog;

    fn env() -> &'static EnvCatalog {
        Catalog::for_version("0.5.23").unwrap().env().unwrap()
    }

    #[test]
    fn the_three_parts_of_the_table() {
        assert!(matches!(
            env().get("SGLANG_ENABLE_TORCH_INFERENCE_MODE"),
            Some(EnvVar::Typed { ty: "bool", .. })
        ));
        assert_eq!(
            env().get("SGLANG_USE_TRITON_ROUTER_SUM"),
            Some(&EnvVar::Alias {
                replacement: "SGLANG_USE_CUSTOM_ROUTER_SUM"
            })
        );
        assert!(matches!(
            env().get("SGLANG_ENABLE_CP_V2"),
            Some(EnvVar::Retired { .. })
        ));
        assert_eq!(env().get("SGLANG_NSYS_PROFILING"), Some(&EnvVar::Raw));
    }

    #[test]
    fn values_and_names() {
        let e = env();
        assert_eq!(
            e.check("SGLANG_ENABLE_TORCH_INFERENCE_MODE", "YES"),
            Ok(None)
        );
        let refused = e
            .check("SGLANG_ENABLE_TORCH_INFERENCE_MODE", "on")
            .unwrap_err();
        assert_eq!(refused.value, "on");
        assert!(
            refused
                .to_string()
                .starts_with("`on` is not a boolean: 1, true, yes, y or 0, false, no, n; SGLang would ignore it and use the default for SGLANG_ENABLE_TORCH_INFERENCE_MODE ("),
            "{refused}"
        );
        assert!(e.check("CUDA_VISIBLE_DEVICES", "0,1").unwrap().is_none());
        let unknown = e
            .check("SGLANG_ENABLE_TORCH_INFERENCE_MOD", "1")
            .unwrap()
            .unwrap();
        assert!(
            unknown.contains("did you mean SGLANG_ENABLE_TORCH_INFERENCE_MODE"),
            "{unknown}"
        );
    }
}
