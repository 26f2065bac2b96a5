//! The experiment file: which service on which host, the variants (flag and env overlays, or a
//! grid of flag values), the benchmark, the objective, the constraints and the time budget.
//! Parsed like a manifest: every problem comes back with the file, line, column and field path,
//! before any host is contacted.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::edit::Section;
use crate::manifest::locate::{locate, Seg};
use crate::manifest::{
    deserialize_located, BenchmarkSpec, ManifestError, ManifestErrors, Position,
};

/// A parsed, valid experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Experiment {
    /// The file as shown in errors and reports.
    pub source: String,
    /// The manifest of the service, as written (relative to the experiment file's folder).
    pub manifest: String,
    /// The host the variants run on: one of the manifest's, a canary or a spare.
    pub host: String,
    pub benchmark: BenchmarkSpec,
    pub objective: Objective,
    pub constraints: Constraints,
    /// How far (percent of the objective) the baseline measured at the end may be from the one
    /// measured first before the ranking is called untrusted.
    pub noise_percent: f64,
    /// The run is refused when its estimate is over this.
    pub budget: Option<Duration>,
    pub variants: Vec<Variant>,
}

/// What the ranking maximises (or, for a latency, minimises) at one concurrency level.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Objective {
    pub metric: Metric,
    pub concurrency: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    OutputTokensPerS,
    RequestsPerS,
    TtftP99Ms,
    ItlP99Ms,
}

impl Metric {
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::OutputTokensPerS | Metric::RequestsPerS)
    }

    pub fn of(self, l: &crate::benchmark::Level) -> f64 {
        match self {
            Metric::OutputTokensPerS => l.output_tokens_per_s,
            Metric::RequestsPerS => l.requests_per_s,
            Metric::TtftP99Ms => l.ttft_p99_ms,
            Metric::ItlP99Ms => l.itl_p99_ms,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Metric::OutputTokensPerS => "output tok/s",
            Metric::RequestsPerS => "req/s",
            Metric::TtftP99Ms => "TTFT p99 ms",
            Metric::ItlP99Ms => "ITL p99 ms",
        }
    }
}

/// What every ranked variant must meet: latency limits at every benchmark level, or per level
/// (`levels`: an interactive level and a batch level rarely share a latency target).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct Constraints {
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_ms")]
    pub ttft_p99: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_ms")]
    pub itl_p99: Option<Duration>,
    /// Limits for one concurrency level, over the ones above for that level.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub levels: BTreeMap<u32, LevelLimits>,
    /// No request of the benchmark may fail.
    pub no_errors: bool,
    /// The quality gate runs on every variant and must pass (the manifest's `verify.quality`).
    pub quality: bool,
}

/// The latency limits at one concurrency level.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct LevelLimits {
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_ms")]
    pub ttft_p99: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none", with = "opt_ms")]
    pub itl_p99: Option<Duration>,
}

impl Constraints {
    /// The limits in force at `concurrency`: the level's own, else those of every level.
    pub fn at(&self, concurrency: u32) -> LevelLimits {
        let own = self.levels.get(&concurrency).copied().unwrap_or_default();
        LevelLimits {
            ttft_p99: own.ttft_p99.or(self.ttft_p99),
            itl_p99: own.itl_p99.or(self.itl_p99),
        }
    }
}

mod opt_ms {
    pub fn serialize<S: serde::Serializer>(
        d: &Option<std::time::Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64() * 1000.0),
            None => s.serialize_none(),
        }
    }
}

/// One variant: the baseline manifest with these keys set.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    pub name: String,
    pub changes: Vec<Change>,
}

/// One key a variant sets, as YAML text, and where the experiment file says so.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub section: Section,
    pub key: String,
    /// The value as it is written into the manifest (`true`, `3`, `"0.5"`, `[a, b]`).
    pub value: String,
    /// The experiment file's field (`variants[2].flags.enable-mixed-chunk`) and its position, for
    /// errors found in the variant's manifest.
    pub field: String,
    pub position: Option<Position>,
}

impl Change {
    /// `flags.enable-mixed-chunk: true`.
    pub fn text(&self) -> String {
        let section = match self.section {
            Section::Flags => "flags",
            Section::Env => "env",
        };
        format!("{section}.{}: {}", self.key, self.value)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    manifest: String,
    host: String,
    benchmark: RawBenchmark,
    objective: RawObjective,
    #[serde(default)]
    constraints: RawConstraints,
    #[serde(default)]
    noise_percent: Option<f64>,
    #[serde(default)]
    budget: Option<String>,
    #[serde(default)]
    variants: Vec<RawVariant>,
    /// Every combination of these flag values is a variant.
    #[serde(default)]
    grid: BTreeMap<String, Vec<serde_yaml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBenchmark {
    levels: Vec<u32>,
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    output_tokens: Option<u32>,
    #[serde(default)]
    requests: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawObjective {
    metric: Metric,
    concurrency: u32,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConstraints {
    ttft_p99: Option<String>,
    itl_p99: Option<String>,
    #[serde(default)]
    no_errors: bool,
    #[serde(default)]
    quality: bool,
    /// Per concurrency level: `{ 1: { ttft_p99: 300ms }, 64: { ttft_p99: 5s } }`.
    #[serde(default)]
    levels: BTreeMap<u32, RawLevelLimits>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLevelLimits {
    ttft_p99: Option<String>,
    itl_p99: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    name: String,
    #[serde(default)]
    flags: BTreeMap<String, serde_yaml::Value>,
    #[serde(default)]
    env: BTreeMap<String, serde_yaml::Value>,
}

/// The default drift tolerance: two runs of the same benchmark on the stand-in and on a real
/// server differ by a few percent (the quality gate's noise floor has the same origin: batching
/// order); 5 % keeps a real regression of 10 % (the throughput gate's default) visible.
pub const DEFAULT_NOISE_PERCENT: f64 = 5.0;

pub fn parse(source: &str, text: &str) -> Result<Experiment, ManifestErrors> {
    let raw: Raw = deserialize_located(source, text).map_err(|e| ManifestErrors(vec![e]))?;
    let mut errors = Vec::new();
    let err = |errors: &mut Vec<ManifestError>, path: &[Seg], field: String, message: String| {
        errors.push(ManifestError::Invalid {
            file: source.to_string(),
            position: locate(text, path),
            field,
            message,
        })
    };
    let duration = |errors: &mut Vec<ManifestError>, key: &str, value: &Option<String>| {
        let value = value.as_ref()?;
        match humantime::parse_duration(value) {
            Ok(d) if !d.is_zero() => Some(d),
            _ => {
                let path = [Seg::Key("constraints"), Seg::Key(key)];
                let (path, field): (&[Seg], String) = if key == "budget" {
                    (&path[1..], "budget".into())
                } else {
                    (&path, format!("constraints.{key}"))
                };
                err(
                    errors,
                    path,
                    field,
                    format!("`{value}` is not a duration above zero (`2s`, `1h 30m`)"),
                );
                None
            }
        }
    };
    let ttft_p99 = duration(&mut errors, "ttft_p99", &raw.constraints.ttft_p99);
    let itl_p99 = duration(&mut errors, "itl_p99", &raw.constraints.itl_p99);
    let budget = duration(&mut errors, "budget", &raw.budget);

    let b = &raw.benchmark;
    let mut levels = BTreeMap::new();
    for (level, limits) in &raw.constraints.levels {
        let key = level.to_string();
        fn at<'a>(key: &'a str, name: &'a str) -> [Seg<'a>; 4] {
            [
                Seg::Key("constraints"),
                Seg::Key("levels"),
                Seg::Key(key),
                Seg::Key(name),
            ]
        }
        if !b.levels.contains(level) {
            err(
                &mut errors,
                &at(&key, "")[..3],
                format!("constraints.levels.{level}"),
                format!(
                    "{level} is not one of benchmark.levels ({:?}): a level's limits hold at a level the benchmark runs",
                    b.levels
                ),
            );
        }
        let mut limit = |name: &str, value: &Option<String>| {
            let value = value.as_ref()?;
            match humantime::parse_duration(value) {
                Ok(d) if !d.is_zero() => Some(d),
                _ => {
                    err(
                        &mut errors,
                        &at(&key, name),
                        format!("constraints.levels.{level}.{name}"),
                        format!("`{value}` is not a duration above zero (`300ms`, `2s`)"),
                    );
                    None
                }
            }
        };
        let parsed = LevelLimits {
            ttft_p99: limit("ttft_p99", &limits.ttft_p99),
            itl_p99: limit("itl_p99", &limits.itl_p99),
        };
        levels.insert(*level, parsed);
    }
    if b.levels.is_empty() || b.levels.contains(&0) {
        err(
            &mut errors,
            &[Seg::Key("benchmark"), Seg::Key("levels")],
            "benchmark.levels".into(),
            "at least one concurrency level, each above zero".into(),
        );
    }
    if !b.levels.contains(&raw.objective.concurrency) {
        err(
            &mut errors,
            &[Seg::Key("objective"), Seg::Key("concurrency")],
            "objective.concurrency".into(),
            format!(
                "{} is not one of benchmark.levels ({:?}): the objective is read at a level the benchmark runs",
                raw.objective.concurrency, b.levels
            ),
        );
    }
    let noise_percent = raw.noise_percent.unwrap_or(DEFAULT_NOISE_PERCENT);
    if !(0.0..100.0).contains(&noise_percent) {
        err(
            &mut errors,
            &[Seg::Key("noise_percent")],
            "noise_percent".into(),
            "a percentage from 0 to below 100".into(),
        );
    }

    let mut variants = Vec::new();
    for (i, v) in raw.variants.iter().enumerate() {
        let mut changes = Vec::new();
        for (section, key, map) in [
            (Section::Flags, "flags", &v.flags),
            (Section::Env, "env", &v.env),
        ] {
            for (name, value) in map {
                let path = [Seg::Index(i), Seg::Key(key), Seg::Key(name)];
                let mut full = vec![Seg::Key("variants")];
                full.extend_from_slice(&path);
                let field = format!("variants[{i}].{key}.{name}");
                match yaml_text(value, section) {
                    Ok(value) => changes.push(Change {
                        section,
                        key: name.clone(),
                        value,
                        position: locate(text, &full),
                        field,
                    }),
                    Err(why) => err(&mut errors, &full, field, why.to_string()),
                }
            }
        }
        if changes.is_empty() {
            err(
                &mut errors,
                &[Seg::Key("variants"), Seg::Index(i)],
                format!("variants[{i}]"),
                format!(
                    "variant `{}` changes nothing: give it `flags:` or `env:`",
                    v.name
                ),
            );
        }
        variants.push(Variant {
            name: v.name.clone(),
            changes,
        });
    }
    // The grid: every combination of the listed values, in the order written.
    let mut combos: Vec<Vec<Change>> = if raw.grid.is_empty() {
        Vec::new()
    } else {
        vec![Vec::new()]
    };
    for (name, values) in &raw.grid {
        let path = [Seg::Key("grid"), Seg::Key(name)];
        if values.is_empty() {
            err(
                &mut errors,
                &path,
                format!("grid.{name}"),
                "at least one value".into(),
            );
        }
        let mut next = Vec::new();
        for combo in &combos {
            for value in values {
                match yaml_text(value, Section::Flags) {
                    Ok(value) => {
                        let mut c = combo.clone();
                        c.push(Change {
                            section: Section::Flags,
                            key: name.clone(),
                            value,
                            field: format!("grid.{name}"),
                            position: locate(text, &path),
                        });
                        next.push(c);
                    }
                    Err(why) => err(&mut errors, &path, format!("grid.{name}"), why.to_string()),
                }
            }
        }
        combos = next;
    }
    for changes in combos {
        let name = changes
            .iter()
            .map(|c| format!("{}={}", c.key, c.value))
            .collect::<Vec<_>>()
            .join(" ");
        variants.push(Variant { name, changes });
    }
    if variants.is_empty() {
        err(
            &mut errors,
            &[],
            "variants".into(),
            "no variants: give `variants:` or `grid:`".into(),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, v) in variants.iter().enumerate() {
        if v.name.trim().is_empty() || v.name == "baseline" || !seen.insert(v.name.clone()) {
            err(
                &mut errors,
                &[Seg::Key("variants"), Seg::Index(i), Seg::Key("name")],
                format!("variants[{i}].name"),
                format!(
                    "`{}`: each variant needs a name of its own, not empty and not `baseline`",
                    v.name
                ),
            );
        }
    }
    if !errors.is_empty() {
        return Err(ManifestErrors(errors));
    }
    Ok(Experiment {
        source: source.to_string(),
        manifest: raw.manifest,
        host: raw.host,
        benchmark: BenchmarkSpec {
            levels: b.levels.clone(),
            prompt_tokens: b.prompt_tokens.unwrap_or(128),
            output_tokens: b.output_tokens.unwrap_or(128),
            requests: b.requests,
            duration: None,
            // The variants are ranked, not gated: a slower variant is measured and listed, not
            // rolled back as a regression against the one before it.
            max_regression: 100.0,
            gate: false,
        },
        objective: Objective {
            metric: raw.objective.metric,
            concurrency: raw.objective.concurrency,
        },
        constraints: Constraints {
            ttft_p99,
            itl_p99,
            levels,
            no_errors: raw.constraints.no_errors,
            quality: raw.constraints.quality,
        },
        noise_percent,
        budget,
        variants,
    })
}

/// A variant's or the grid's value that cannot be written on one manifest line; the message
/// becomes the field's [`ManifestError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueShape {
    /// A flag's value is a map, a null, or a list holding one.
    #[error("a flag value is a scalar or a list of scalars")]
    FlagNotScalar,
    /// An env value is not a scalar.
    #[error("an env value is a scalar")]
    EnvNotScalar,
}

/// A YAML value as the one-line text written into the manifest. Env values are strings in
/// systemd, so they are always written quoted.
fn yaml_text(value: &serde_yaml::Value, section: Section) -> Result<String, ValueShape> {
    use serde_yaml::Value;
    let scalar = |v: &Value| -> Result<String, ValueShape> {
        match v {
            Value::Bool(b) => Ok(b.to_string()),
            Value::Number(n) => Ok(n.to_string()),
            Value::String(s) => Ok(serde_json::to_string(s).expect("a string serialises")),
            _ => Err(ValueShape::FlagNotScalar),
        }
    };
    match (value, section) {
        (Value::Sequence(items), Section::Flags) => Ok(format!(
            "[{}]",
            items
                .iter()
                .map(scalar)
                .collect::<Result<Vec<_>, _>>()?
                .join(", ")
        )),
        (Value::String(_), _) | (_, Section::Flags) => scalar(value),
        (Value::Bool(_) | Value::Number(_), Section::Env) => {
            Ok(serde_json::to_string(&scalar(value)?).expect("a string serialises"))
        }
        _ => Err(ValueShape::EnvNotScalar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_is_no_scalar_is_named_by_its_section() {
        let map: serde_yaml::Value = serde_yaml::from_str("{ a: 1 }").unwrap();
        let e = yaml_text(&map, Section::Env).unwrap_err();
        assert_eq!(e, ValueShape::EnvNotScalar);
        assert_eq!(e.to_string(), "an env value is a scalar");
        let list: serde_yaml::Value = serde_yaml::from_str("[1, [2]]").unwrap();
        assert_eq!(
            yaml_text(&list, Section::Flags),
            Err(ValueShape::FlagNotScalar)
        );
    }

    const GOOD: &str = "manifest: svc.yaml\nhost: gpu-7\nbenchmark: { levels: [1, 4], output_tokens: 16, requests: 8 }\nobjective: { metric: output_tokens_per_s, concurrency: 4 }\nconstraints: { ttft_p99: 2s, quality: true }\nbudget: 2h\nvariants:\n  - name: mixed\n    flags: { enable-mixed-chunk: true }\n  - name: env\n    env: { SGLANG_X: 1 }\ngrid:\n  speculative-num-steps: [2, 3]\n";

    #[test]
    fn a_good_file_gives_variants_and_grid_in_order() {
        let e = parse("e.yaml", GOOD).unwrap();
        let names: Vec<_> = e.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mixed",
                "env",
                "speculative-num-steps=2",
                "speculative-num-steps=3"
            ]
        );
        assert_eq!(e.variants[1].changes[0].value, "\"1\"");
        assert_eq!(
            e.variants[0].changes[0].text(),
            "flags.enable-mixed-chunk: true"
        );
        assert_eq!(e.variants[0].changes[0].position.unwrap().line, 9);
        assert_eq!(e.constraints.ttft_p99, Some(Duration::from_secs(2)));
        assert!(!e.benchmark.gate);
        assert_eq!(e.budget, Some(Duration::from_secs(7200)));
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let bad = GOOD.replace("concurrency: 4", "concurrency: 64");
        let e = parse("e.yaml", &bad).unwrap_err();
        let text = e.0[0].to_string();
        assert!(text.starts_with("e.yaml:4:"), "{text}");
        assert!(text.contains("objective.concurrency"), "{text}");

        let bad = GOOD.replace("    flags: { enable-mixed-chunk: true }\n", "");
        let e = parse("e.yaml", &bad).unwrap_err();
        assert!(e.0[0].to_string().contains("changes nothing"), "{}", e.0[0]);

        let bad = GOOD.replace("metric: output_tokens_per_s", "metric: speed");
        let e = parse("e.yaml", &bad).unwrap_err();
        assert!(e.0[0].to_string().starts_with("e.yaml:4:"), "{}", e.0[0]);

        let bad = GOOD.replace("ttft_p99: 2s", "ttft_p99: soon");
        let e = parse("e.yaml", &bad).unwrap_err();
        assert!(
            e.0[0].to_string().contains("constraints.ttft_p99"),
            "{}",
            e.0[0]
        );

        let bad = GOOD.replace("name: env", "name: mixed");
        let e = parse("e.yaml", &bad).unwrap_err();
        assert!(e.0[0].to_string().starts_with("e.yaml:10:"), "{}", e.0[0]);
    }
}
