//! Whether argparse would accept a flag's value as the unit renders it: `true` renders the bare
//! flag, a value renders one argument, a list one argument per item. Each value goes through the
//! flag's converter (`int`, `float`, `human_readable_int`, `json.loads`, ...) and then its choices,
//! in argparse's order, so the message is the problem SGLang would stop on.

use super::catalog::{Flag, Kind, ValueType};
use super::python::{python_float, python_int};
use crate::manifest::FlagValue;

/// Why SGLang's argparse would refuse a flag's value as the unit renders it; the message is the
/// manifest field's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagValueError {
    /// A switch given a value.
    #[error("--{name} is a switch and takes no value (got `{value}`): write true to set it, false to leave it out")]
    SwitchGivenValue { name: &'static str, value: String },
    /// A switch given a list.
    #[error(
        "--{name} is a switch and takes no values: write true to set it, false to leave it out"
    )]
    SwitchGivenList { name: &'static str },
    /// `true` for a flag whose value is not optional.
    #[error("--{name} needs {needs}; true would render the flag without one")]
    NoValue {
        name: &'static str,
        /// What it takes: `an integer`, `one of a, b`.
        needs: String,
    },
    /// A list for a one-value flag.
    #[error("--{name} takes one value, not a list")]
    NotAList { name: &'static str },
    /// An empty list for a flag that needs one item at least (`nargs="+"`).
    #[error("--{name} needs at least one value")]
    EmptyList { name: &'static str },
    /// A value this SGLang no longer takes.
    #[error("--{name}: {value} was removed; use {instead}")]
    Removed {
        name: &'static str,
        value: String,
        instead: String,
    },
    /// The flag's converter refuses the value.
    #[error("--{name} needs {needs}, not `{value}`")]
    Unconverted {
        name: &'static str,
        needs: String,
        value: String,
    },
    /// Not one of the flag's choices.
    #[error("`{value}` is not a choice of --{name}: {}", .choices.join(", "))]
    NotAChoice {
        name: &'static str,
        value: String,
        choices: Vec<&'static str>,
    },
}

/// The problem with `value` for `flag`, if SGLang would refuse it.
pub fn check_value(flag: &Flag, value: &FlagValue) -> Result<(), FlagValueError> {
    let name = flag.name;
    match (flag.kind, value) {
        (_, FlagValue::Switch(false)) | (Kind::Switch, FlagValue::Switch(true)) => Ok(()),
        (Kind::Switch, FlagValue::Value(v)) => Err(FlagValueError::SwitchGivenValue {
            name,
            value: v.clone(),
        }),
        (Kind::Switch, FlagValue::List(_)) => Err(FlagValueError::SwitchGivenList { name }),
        // A bare flag is fine when the value is optional (`?`) or the list may be empty (`*`).
        (_, FlagValue::Switch(true)) if matches!(flag.nargs, "?" | "*") => Ok(()),
        (_, FlagValue::Switch(true)) => Err(FlagValueError::NoValue {
            name,
            needs: what(flag),
        }),
        (Kind::Value, FlagValue::List(_)) => Err(FlagValueError::NotAList { name }),
        (Kind::List, FlagValue::List(items)) if items.is_empty() && flag.nargs == "+" => {
            Err(FlagValueError::EmptyList { name })
        }
        (_, FlagValue::Value(v)) => check_item(flag, v),
        (Kind::List, FlagValue::List(items)) => items.iter().try_for_each(|v| check_item(flag, v)),
    }
}

fn what(flag: &Flag) -> String {
    let noun = match flag.value_type {
        ValueType::Int => "an integer",
        ValueType::Float => "a number",
        ValueType::Json => "a JSON value",
        ValueType::Str | ValueType::Bool => "a value",
    };
    if flag.choices.is_empty() {
        noun.to_string()
    } else {
        format!("one of {}", flag.choices.join(", "))
    }
}

fn check_item(flag: &Flag, value: &str) -> Result<(), FlagValueError> {
    let name = flag.name;
    let converted = match (flag.parser, flag.value_type) {
        ("human_readable_int", _) => human_readable_int(value),
        ("nullable_str" | "LoRAPathAction", _) => true,
        ("parse_cuda_graph_config_arg", _) => {
            matches!(
                serde_json::from_str(value),
                Ok(serde_json::Value::Object(_))
            )
        }
        ("parse_cuda_graph_backend_arg", _) if value == "tc_piecewise" => {
            return Err(FlagValueError::Removed {
                name,
                value: value.to_string(),
                instead: flag.choices.join(", "),
            });
        }
        (_, ValueType::Json) => serde_json::from_str::<serde_json::Value>(value).is_ok(),
        (_, ValueType::Int) => python_int(value).is_some(),
        (_, ValueType::Float) => python_float(value).is_some(),
        (_, ValueType::Str | ValueType::Bool) => true,
    };
    if !converted {
        return Err(FlagValueError::Unconverted {
            name,
            needs: what(flag),
            value: value.to_string(),
        });
    }
    if !flag.choices.is_empty() && !in_choices(flag, value) {
        return Err(FlagValueError::NotAChoice {
            name,
            value: value.to_string(),
            choices: flag.choices.clone(),
        });
    }
    Ok(())
}

/// argparse compares the converted value, so `08` is the int choice `8`.
fn in_choices(flag: &Flag, value: &str) -> bool {
    match flag.value_type {
        ValueType::Int => flag
            .choices
            .iter()
            .any(|c| python_int(c).is_some() && python_int(c) == python_int(value)),
        _ => flag.choices.contains(&value),
    }
}

/// The value of SGLang's `human_readable_int` (`sglang/srt/utils/common.py`): `256k` is 256000,
/// `25.6k` is 25600, `128Ki` is 131072; `None` where SGLang would refuse the text.
pub fn human_readable_int_value(text: &str) -> Option<u64> {
    let t = text.trim();
    let iec = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    for (suffix, factor) in iec {
        if let Some(number) = t.strip_suffix(suffix) {
            if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            return number.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    let si = [("k", 3u32), ("M", 6), ("G", 9), ("T", 12)];
    for (suffix, exponent) in si {
        if let Some(number) = t.strip_suffix(suffix) {
            let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
            let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
            if whole.is_empty() || !digits(whole) || !digits(fraction) || number.ends_with('.') {
                return None;
            }
            // Exact decimal arithmetic, like Python's `Decimal`: shift the point, then truncate.
            let scale = exponent as usize;
            let mut shifted = fraction.to_string();
            shifted.truncate(scale);
            while shifted.len() < scale {
                shifted.push('0');
            }
            return format!("{whole}{shifted}").parse().ok();
        }
    }
    u64::try_from(python_int(t)?).ok()
}

/// SGLang's `human_readable_int`: an int, or digits with an SI suffix (`128k`, `1.5M`, decimals
/// allowed) or an IEC suffix (`128Ki`, whole numbers only). Suffixes are case-sensitive.
fn human_readable_int(text: &str) -> bool {
    let t = text.trim();
    let iec = ["Ki", "Mi", "Gi", "Ti"]
        .iter()
        .find_map(|s| t.strip_suffix(s));
    if let Some(number) = iec {
        return !number.is_empty() && number.chars().all(|c| c.is_ascii_digit());
    }
    let si = ["k", "M", "G", "T"].iter().find_map(|s| t.strip_suffix(s));
    if let Some(number) = si {
        let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        return match number.split_once('.') {
            Some((whole, fraction)) => digits(whole) && digits(fraction),
            None => digits(number),
        };
    }
    python_int(t).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_value_says_its_kind_and_what_sglang_would_stop_on() {
        let c = crate::sglang::Catalog::for_version("0.5.23").unwrap();
        let length = c.option("context-length").unwrap();
        let e = check_value(length, &FlagValue::Value("lots".into())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--context-length needs an integer, not `lots`"
        );
        assert!(matches!(e, FlagValueError::Unconverted { .. }));
        let metrics = c.option("enable-metrics").unwrap();
        assert_eq!(
            check_value(metrics, &FlagValue::List(vec![])),
            Err(FlagValueError::SwitchGivenList {
                name: "enable-metrics"
            })
        );
    }

    #[test]
    fn python_numbers() {
        assert_eq!(python_int(" +1_000 "), Some(1000));
        assert_eq!(python_int("007"), Some(7));
        for bad in ["1.0", "1__0", "_1", "", "4k", "0x10"] {
            assert_eq!(python_int(bad), None, "{bad}");
        }
        assert_eq!(python_float("1e-3"), Some(0.001));
        assert_eq!(python_float(".5"), Some(0.5));
        assert!(python_float("inf").is_some());
        assert_eq!(python_float("1_0.5"), Some(10.5));
        assert_eq!(python_float("0.8x"), None);
    }

    #[test]
    fn human_readable_int_values_as_sglang_computes_them() {
        for (text, value) in [
            ("262144", 262144),
            ("256k", 256_000),
            ("25.6k", 25_600),
            ("1.5M", 1_500_000),
            ("128Ki", 131_072),
            (" 4Gi ", 4 << 30),
            ("1.0005k", 1000),
        ] {
            assert_eq!(human_readable_int_value(text), Some(value), "{text}");
        }
        for bad in ["1.5Ki", "256K", "k", "1.k", "-5", "x"] {
            assert_eq!(human_readable_int_value(bad), None, "{bad}");
        }
    }

    #[test]
    fn human_readable_ints() {
        for good in ["262144", "256k", "25.6k", "1M", "128Ki", " 4Gi "] {
            assert!(human_readable_int(good), "{good}");
        }
        for bad in ["1.5Ki", "256K", "k", "1.k", "256kb", "1e5"] {
            assert!(!human_readable_int(bad), "{bad}");
        }
    }
}
