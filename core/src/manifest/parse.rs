//! YAML to typed manifest. This is the only place that knows the YAML library; structural problems
//! (syntax, types, unknown or missing fields) come back with serde_yaml's position and the field path.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::error::{ManifestError, ManifestErrors, Position};
use super::locate::Seg;
use super::{
    BenchmarkSpec, DrainSpec, Explicit, FlagValue, Hardening, HostSpec, Manifest, NodeGroup,
    OnTimeout, RefTarget, Reference, SglangSpec, Smoke, VerifySpec,
};

const MIB: u64 = 1024 * 1024;

fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// Parses `300GiB`, `75000 MiB`, `80GB`, `1024` (bytes).
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (
        text[..split].trim().parse::<f64>().ok()?,
        text[split..].trim(),
    );
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024f64.powi(2),
        "gib" | "g" => 1024f64.powi(3),
        "tib" | "t" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    (number >= 0.0).then_some((number * scale) as u64)
}

/// Parses one manifest. `source` is the name shown in errors and in the unit header.
pub fn parse(source: &str, text: &str) -> Result<Manifest, ManifestErrors> {
    let raw: RawManifest = deserialize_located(source, text)?;
    let mut errors = raw.structure(source, text);
    if let Some(value) = raw.systemd.get("dropins") {
        if super::DropInPolicy::parse(&value.0).is_none() {
            errors.push(super::validate::invalid(
                source,
                text,
                &[Seg::Key("systemd"), Seg::Key("dropins")],
                "systemd.dropins",
                format!(
                    "`{}` is not a drop-in policy: `refuse` (the default: apply refuses a unit that has drop-ins, a mask or a unit file elsewhere it does not own) or `replace` (apply moves them aside into the unit's generations)",
                    value.0
                ),
            ));
        }
    }
    errors.extend(raw.hardening_errors(source, text));
    if !errors.is_empty() {
        return Err(ManifestErrors(errors));
    }
    Ok(raw.into_manifest(source, text))
}

/// `text` (the YAML file `source`) read into `T`; a type error, a missing or unknown field, or bad
/// YAML is one error with the line, column and field path. Manifests and experiment files are
/// both read this way.
pub(crate) fn deserialize_located<T: serde::de::DeserializeOwned>(
    source: &str,
    text: &str,
) -> Result<T, ManifestError> {
    let deserializer = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let position = e.inner().location().map(|l| Position {
            line: l.line(),
            column: l.column(),
        });
        let field = match e.path().to_string() {
            p if p == "." => "(document)".to_string(),
            p => p,
        };
        let message = plain_message(&e.inner().to_string(), &field);
        ManifestError::Invalid {
            file: source.to_string(),
            position,
            field,
            message,
        }
    })
}

/// serde_yaml's message without the path and position it repeats (both are shown already).
fn plain_message(message: &str, field: &str) -> String {
    let message = message
        .strip_prefix(&format!("{field}: "))
        .unwrap_or(message);
    match message.rfind(" at line ") {
        Some(at) if message[at..].contains(" column ") => message[..at].to_string(),
        _ => message.to_string(),
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawManifest {
    service: String,
    description: Option<String>,
    /// One server per host. Exclusive with `nodes`; one of them is required (see
    /// [`RawManifest::structure`]).
    hosts: Option<Vec<RawHost>>,
    /// One server over several hosts, in rank order (`NodeGroup`).
    nodes: Option<Vec<RawHost>>,
    sglang: RawSglang,
    #[serde(default)]
    env: BTreeMap<String, RawEnv>,
    #[serde(default)]
    #[schemars(schema_with = "systemd_schema")]
    systemd: BTreeMap<String, Scalar>,
    #[serde(default)]
    verify: RawVerify,
    drain: Option<RawDrain>,
    /// Labels every host of this service carries, for `--selector`.
    #[serde(default)]
    labels: BTreeMap<String, Scalar>,
    /// Env names whose values are secret whatever they are called.
    #[serde(default)]
    secret_env: Vec<String>,
    router: Option<RawRouter>,
    rollout: Option<RawRollout>,
    /// How apply changes a running server.
    apply: Option<RawApply>,
}

/// `apply:`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawApply {
    /// Apply a change SGLang 0.5.23 takes without a restart live: `model_path` moved to a
    /// checkpoint of the same architecture (`/update_weights_from_disk`), or the values
    /// `/set_internal_state` takes (`pp-max-micro-batch-size`, the speculative accept
    /// thresholds). The same gates judge the server, and a failed gate puts the previous
    /// weights or values back live. Off by default; `reconcile apply --restart` restarts anyway.
    #[serde(default)]
    live: bool,
}

/// `rollout:` (`RolloutSpec`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRollout {
    canary: Option<String>,
    max_parallel: Option<usize>,
    max_failures: Option<usize>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSglang {
    python: String,
    /// SGLang's `sglang` console script (`<venv>/bin/sglang`): the unit runs `<console_script>
    /// serve ...`, 0.5.23's entry point, instead of `<python> -m sglang.launch_server ...`.
    /// `python` is still the interpreter the checks run (the script's own, on its `#!` line).
    console_script: Option<String>,
    version: Scalar,
    /// The model's folder (or hub id) as SGLang takes it. Give `model:` instead to pin the
    /// weights by revision.
    model_path: Option<String>,
    /// The weights pinned by revision: fetched to every host and verified before the old server
    /// stops, the unit pointing at the pinned copy (`reconcile_core::weights`).
    model: Option<RawModel>,
    served_model_name: Option<String>,
    host: Option<String>,
    #[schemars(range(min = 1, max = 65535))]
    port: i64,
    /// `nodes:` only: the rendezvous port on rank 0 (`NodeGroup::dist_init_port`).
    #[schemars(range(min = 1, max = 65535))]
    dist_init_port: Option<i64>,
    #[serde(default)]
    flags: BTreeMap<String, RawFlag>,
}

/// `sglang.model:` (`PinnedModel`): a hub repository at a commit, or a store folder at a
/// revision the lock file names the files of.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawModel {
    /// A hub repository, `org/name`.
    hub: Option<String>,
    /// A folder every host reaches under this path (a network share).
    store: Option<String>,
    /// The hub commit (40 hex digits), or the store revision's name.
    revision: Scalar,
    /// A server that speaks the hub's API (a mirror or proxy, as `HF_ENDPOINT`); the hub itself
    /// by default.
    endpoint: Option<String>,
    /// Revisions kept on each host, the running one counted (2: the one before stays to roll
    /// back to).
    #[schemars(range(min = 1))]
    keep: Option<i64>,
    /// Glob patterns of the files to fetch (`*.safetensors`, `original/`); all by default.
    include: Option<Vec<String>>,
    /// Where the pinned copies live on each host (`/var/lib/reconcile-weights`).
    root: Option<String>,
    /// Hosts that fetch at once (4).
    #[schemars(range(min = 1))]
    at_once: Option<i64>,
    /// Bytes a second each host may fetch (`100MB`); unlimited by default.
    rate: Option<Size>,
    /// Hosts that hold the revision serve it to the others while the rollout fetches, on this
    /// port (plain HTTP, read-only, while the fetch lasts): the hub serves it once. Off by
    /// default.
    peers: Option<RawPeers>,
}

/// `sglang.model.peers:`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPeers {
    #[schemars(range(min = 1, max = 65535))]
    port: i64,
}

impl RawModel {
    fn into_spec(self) -> crate::pinned::PinnedModel {
        use crate::pinned::{self, Source};
        let source = match (self.hub, self.store) {
            (Some(repo), _) => Source::Hub {
                repo,
                endpoint: self.endpoint.unwrap_or_else(|| pinned::HUB.to_string()),
            },
            (None, Some(path)) => Source::Store { path },
            // `structure` refuses this, with its position.
            (None, None) => Source::Store {
                path: String::new(),
            },
        };
        pinned::PinnedModel {
            source,
            revision: self.revision.0,
            // Out-of-range values are `validate`'s errors, with their position.
            keep: self
                .keep
                .map_or(pinned::DEFAULT_KEEP, |k| u32::try_from(k).unwrap_or(0)),
            include: self.include.unwrap_or_default(),
            root: self
                .root
                .unwrap_or_else(|| pinned::DEFAULT_ROOT.to_string()),
            at_once: self
                .at_once
                .map_or(pinned::DEFAULT_AT_ONCE, |n| usize::try_from(n).unwrap_or(0)),
            rate: self.rate.map(|r| r.0),
            // Out-of-range ports are `validate`'s errors, with their position; 0 never validates.
            peers: self.peers.map(|p| pinned::Peers {
                port: u16::try_from(p.port).unwrap_or(0),
            }),
            locked: None,
        }
    }
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawVerify {
    crash_window: Option<HumanDuration>,
    load_deadline: Option<HumanDuration>,
    stall_timeout: Option<HumanDuration>,
    warmup_timeout: Option<HumanDuration>,
    guard_margin: Option<HumanDuration>,
    sample_interval: Option<HumanDuration>,
    memory_ceiling: Option<Size>,
    gpu_memory_per_gpu: Option<Size>,
    gpu_memory_tolerance: Option<f64>,
    url: Option<String>,
    smoke: Option<RawSmoke>,
    benchmark: Option<RawBenchmark>,
    quality: Option<RawQuality>,
    /// Behind a router: after the canary replica passed its gates and is back in, its SGLang
    /// `/metrics` (TTFT, inter-token latency, aborted requests) over `duration` against the
    /// stable replicas' over the same window; worse beyond the limits rolls the canary back and
    /// stops the rollout. Needs `router:` and `enable-metrics: true`.
    bake: Option<RawBake>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawBake {
    /// Served before the first look and not judged: a restarted canary's prefix cache starts
    /// empty (0s).
    warmup: Option<HumanDuration>,
    /// How long the canary serves live traffic before it is judged (`10m`).
    duration: HumanDuration,
    /// Fewer requests than this on either side, and nothing shown worse: inconclusive, the
    /// canary stays and the rollout pauses (100).
    min_requests: Option<u32>,
    /// Percentage points of aborted requests above the stable replicas' that fail it, when a
    /// test is sure of it (1).
    max_error_rate_increase: Option<f64>,
    /// How many times the stable replicas' TTFT or inter-token latency p50 or p95 fails it,
    /// when the rank test is sure the canary is slower (1.5).
    max_latency_ratio: Option<f64>,
    /// How many times lower than the stable replicas' output tokens per second per running
    /// request fails it (1.5).
    max_throughput_ratio: Option<f64>,
    /// How sure a test must be that a difference is not chance (0.99, one-sided).
    confidence: Option<f64>,
}

impl RawBake {
    fn into_spec(self) -> super::BakeSpec {
        let d = super::BakeSpec::lasting(self.duration.0);
        super::BakeSpec {
            warmup: self.warmup.map_or(d.warmup, |w| w.0),
            min_requests: self.min_requests.unwrap_or(d.min_requests),
            max_error_rate_increase: self
                .max_error_rate_increase
                .unwrap_or(d.max_error_rate_increase),
            max_latency_ratio: self.max_latency_ratio.unwrap_or(d.max_latency_ratio),
            max_throughput_ratio: self.max_throughput_ratio.unwrap_or(d.max_throughput_ratio),
            confidence: self.confidence.unwrap_or(d.confidence),
            ..d
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawBenchmark {
    levels: Option<Vec<u32>>,
    prompt_tokens: Option<u32>,
    output_tokens: Option<u32>,
    requests: Option<u32>,
    duration: Option<HumanDuration>,
    max_regression: Option<f64>,
    gate: Option<bool>,
}

impl RawBenchmark {
    fn into_spec(self) -> BenchmarkSpec {
        let d = BenchmarkSpec::default();
        BenchmarkSpec {
            levels: self.levels.unwrap_or(d.levels),
            prompt_tokens: self.prompt_tokens.unwrap_or(d.prompt_tokens),
            output_tokens: self.output_tokens.unwrap_or(d.output_tokens),
            requests: self.requests,
            duration: self.duration.map(|d| d.0),
            max_regression: self.max_regression.unwrap_or(d.max_regression),
            gate: self.gate.unwrap_or(d.gate),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawQuality {
    prompts: Option<u32>,
    prompts_file: Option<String>,
    max_new_tokens: Option<u32>,
    texts: Option<bool>,
    texts_file: Option<String>,
    top_logprobs: Option<u32>,
    factor: Option<f64>,
    min_kl: Option<f64>,
    needle: Option<RawNeedle>,
    long_context: Option<RawLongContext>,
    cases: Option<String>,
    max_pass_drop: Option<f64>,
    gate: Option<bool>,
}

/// `needle: true` (the defaults), `false`, or its settings.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum RawNeedle {
    On(bool),
    Settings(RawNeedleSettings),
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawNeedleSettings {
    lengths: Option<Vec<u32>>,
    depths: Option<Vec<f64>>,
}

/// `long_context: true` (the defaults), `false`, or its settings.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum RawLongContext {
    On(bool),
    Settings(RawLongContextSettings),
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawLongContextSettings {
    lengths: Option<Vec<u32>>,
    tasks: Option<Vec<RawLongTask>>,
    samples: Option<u32>,
}

#[derive(Deserialize, JsonSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawLongTask {
    MultiKey,
    VariableTracking,
    CommonWords,
}

impl From<RawLongTask> for crate::quality::LongTask {
    fn from(t: RawLongTask) -> Self {
        match t {
            RawLongTask::MultiKey => Self::MultiKey,
            RawLongTask::VariableTracking => Self::VariableTracking,
            RawLongTask::CommonWords => Self::CommonWords,
        }
    }
}

impl RawQuality {
    /// The spec, its files named but not read: the binary's loader reads them.
    fn into_spec(self) -> crate::quality::QualitySpec {
        use crate::quality::{LoadedFile, LongContextSpec, NeedleSpec, QualitySpec};
        let d = QualitySpec::default();
        fn unread<T>(path: String) -> LoadedFile<Vec<T>> {
            LoadedFile {
                path,
                content: Vec::new(),
            }
        }
        QualitySpec {
            prompts: self.prompts.unwrap_or(d.prompts),
            prompts_file: self.prompts_file.map(unread),
            max_new_tokens: self.max_new_tokens.unwrap_or(d.max_new_tokens),
            texts: self.texts.unwrap_or(d.texts),
            texts_file: self.texts_file.map(unread),
            top_logprobs: self.top_logprobs.unwrap_or(d.top_logprobs),
            factor: self.factor.unwrap_or(d.factor),
            min_kl: self.min_kl.unwrap_or(d.min_kl),
            needle: match self.needle {
                None | Some(RawNeedle::On(false)) => None,
                Some(RawNeedle::On(true)) => Some(NeedleSpec::default()),
                Some(RawNeedle::Settings(s)) => {
                    let n = NeedleSpec::default();
                    Some(NeedleSpec {
                        lengths: s.lengths.unwrap_or(n.lengths),
                        depths: s.depths.unwrap_or(n.depths),
                    })
                }
            },
            long_context: match self.long_context {
                None | Some(RawLongContext::On(false)) => None,
                Some(RawLongContext::On(true)) => Some(LongContextSpec::default()),
                Some(RawLongContext::Settings(s)) => {
                    let l = LongContextSpec::default();
                    Some(LongContextSpec {
                        lengths: s.lengths.unwrap_or(l.lengths),
                        tasks: s
                            .tasks
                            .map_or(l.tasks, |t| t.into_iter().map(Into::into).collect()),
                        samples: s.samples.unwrap_or(l.samples),
                    })
                }
            },
            cases: self.cases.map(unread),
            max_pass_drop: self.max_pass_drop.unwrap_or(d.max_pass_drop),
            gate: self.gate.unwrap_or(d.gate),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawDrain {
    timeout: Option<HumanDuration>,
    on_timeout: Option<RawOnTimeout>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum RawOnTimeout {
    Restart,
    Refuse,
}

impl RawDrain {
    fn into_spec(self) -> DrainSpec {
        let d = DrainSpec::default();
        DrainSpec {
            timeout: self.timeout.map_or(d.timeout, |t| t.0),
            on_timeout: match self.on_timeout {
                None => d.on_timeout,
                Some(RawOnTimeout::Restart) => OnTimeout::Restart,
                Some(RawOnTimeout::Refuse) => OnTimeout::Refuse,
            },
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSmoke {
    prompt: String,
    expect: String,
    max_tokens: Option<u32>,
}

/// A size in bytes, written like `300GiB`, `75000 MiB` or `80GB`.
struct Size(u64);

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawHostEntry {
    name: String,
    /// `nodes:` only: the address the other ranks reach this host at.
    address: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, Scalar>,
    #[serde(default)]
    env: BTreeMap<String, RawEnv>,
    #[serde(default)]
    flags: BTreeMap<String, RawFlag>,
    #[serde(default)]
    #[schemars(schema_with = "systemd_schema")]
    systemd: BTreeMap<String, Scalar>,
}

/// A host is either a bare destination or a map with overrides.
struct RawHost(RawHostEntry);

/// A string, number or bool, kept as the text the unit will hold.
struct Scalar(String);

/// A value as written: the value itself, or `{ from_env: VAR }` (see `reference.rs`).
enum Raw<T> {
    Value(T),
    FromEnv(String),
}

/// A flag as written.
type RawFlag = Raw<FlagValue>;

/// An env value as written: a scalar, kept as its text.
type RawEnv = Raw<String>;

/// `{ from_env: VAR }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFromEnv {
    from_env: String,
}

struct HumanDuration(Duration);

/// `router:` (`RouterSpec`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRouter {
    url: String,
    via: Option<String>,
    admin_key_env: Option<String>,
    admin_key_file: Option<String>,
    #[serde(default)]
    workers: BTreeMap<String, String>,
    min_available: Option<usize>,
    drain_timeout: Option<HumanDuration>,
    healthy_timeout: Option<HumanDuration>,
}

impl RawRouter {
    /// Both key sources given is reported by [`check`]; the file wins here.
    fn into_spec(self) -> super::RouterSpec {
        let admin_key = match (self.admin_key_file, self.admin_key_env) {
            (Some(path), _) => Some(super::AdminKey::File(path)),
            (None, Some(name)) => Some(super::AdminKey::Env(name)),
            (None, None) => None,
        };
        super::RouterSpec {
            url: self.url.trim_end_matches('/').to_string(),
            via: self.via,
            admin_key,
            workers: self.workers,
            min_available: self.min_available.unwrap_or(1),
            drain_timeout: self
                .drain_timeout
                .map_or(super::RouterSpec::DRAIN_TIMEOUT, |d| d.0),
            healthy_timeout: self
                .healthy_timeout
                .map_or(super::RouterSpec::HEALTHY_TIMEOUT, |d| d.0),
        }
    }
}

impl RawManifest {
    /// What the types cannot say about `hosts:` and `nodes:`: exactly one of them, `address:` only
    /// on nodes, `sglang.dist_init_port` only with nodes.
    fn structure(&self, source: &str, text: &str) -> Vec<ManifestError> {
        let mut errors = Vec::new();
        let at = |path: &[Seg], field: String, message: &str| {
            super::validate::invalid(source, text, path, &field, message.to_string())
        };
        match (&self.hosts, &self.nodes) {
            (Some(_), Some(_)) => errors.push(at(
                &[Seg::Key("nodes")],
                "nodes".into(),
                "give `hosts:` (one server per host) or `nodes:` (one server over several hosts), not both",
            )),
            // Where serde_yaml puts a missing field of the document.
            (None, None) => errors.push(ManifestError::Invalid {
                file: source.to_string(),
                position: Some(Position { line: 1, column: 1 }),
                field: "(document)".into(),
                message: "missing field `hosts` (or `nodes`, for one server over several hosts)"
                    .into(),
            }),
            _ => {}
        }
        match (&self.sglang.model_path, &self.sglang.model) {
            (Some(_), Some(_)) => errors.push(at(
                &[Seg::Key("sglang"), Seg::Key("model")],
                "sglang.model".into(),
                "give `model_path:` (a folder or hub id as SGLang takes it) or `model:` (the weights pinned by revision), not both",
            )),
            (None, None) => errors.push(at(
                &[Seg::Key("sglang")],
                "sglang".into(),
                "missing field `model_path` (or `model:`, the weights pinned by revision)",
            )),
            (None, Some(model)) if model.hub.is_some() == model.store.is_some() => errors.push(at(
                &[Seg::Key("sglang"), Seg::Key("model")],
                "sglang.model".into(),
                "give `hub:` (a hub repository at a commit) or `store:` (a folder every host reaches), one of them",
            )),
            (None, Some(model)) if model.store.is_some() && model.endpoint.is_some() => errors.push(at(
                &[Seg::Key("sglang"), Seg::Key("model"), Seg::Key("endpoint")],
                "sglang.model.endpoint".into(),
                "`endpoint:` is the hub server a `hub:` model comes from; a `store:` is a folder",
            )),
            _ => {}
        }
        if let Some(hosts) = &self.hosts {
            for (i, h) in hosts.iter().enumerate() {
                if h.0.address.is_some() {
                    errors.push(at(
                        &[Seg::Key("hosts"), Seg::Index(i), Seg::Key("address")],
                        format!("hosts[{i}].address"),
                        "`address` is how the other ranks of a server group reach a node: it belongs to `nodes:` entries",
                    ));
                }
            }
            if self.sglang.dist_init_port.is_some() {
                errors.push(at(
                    &[Seg::Key("sglang"), Seg::Key("dist_init_port")],
                    "sglang.dist_init_port".into(),
                    "dist_init_port is the rendezvous port of a server group: it needs `nodes:` instead of `hosts:`",
                ));
            }
        }
        errors
    }

    /// `systemd.hardening` values that name no preset, service-wide and per host. Refused here,
    /// with their position, like `dropins`: a misspelt preset must not render an unhardened unit.
    fn hardening_errors(&self, source: &str, text: &str) -> Vec<ManifestError> {
        let mut errors = Vec::new();
        let mut check = |value: Option<&Scalar>, path: &[Seg], field: String| {
            let Some(value) = value.filter(|v| Hardening::parse(&v.0).is_none()) else {
                return;
            };
            errors.push(super::validate::invalid(
                source,
                text,
                path,
                &field,
                format!(
                    "`{}` is not a hardening preset: `standard` (a sandbox SGLang keeps working under on NVIDIA GPUs; docs/hardening.md) or `none` (the default)",
                    value.0
                ),
            ));
        };
        check(
            self.systemd.get("hardening"),
            &[Seg::Key("systemd"), Seg::Key("hardening")],
            "systemd.hardening".into(),
        );
        for (list, entries) in [("hosts", &self.hosts), ("nodes", &self.nodes)] {
            for (i, h) in entries.iter().flatten().enumerate() {
                check(
                    h.0.systemd.get("hardening"),
                    &[
                        Seg::Key(list),
                        Seg::Index(i),
                        Seg::Key("systemd"),
                        Seg::Key("hardening"),
                    ],
                    format!("{list}[{i}].systemd.hardening"),
                );
            }
        }
        errors
    }

    fn into_manifest(self, source: &str, text: &str) -> Manifest {
        let service = self
            .service
            .strip_suffix(".service")
            .unwrap_or(&self.service)
            .to_string();
        let defaults = VerifySpec::default();
        let v = self.verify;
        let explicit = Explicit {
            load_deadline: v.load_deadline.is_some(),
        };
        let labels = strings(self.labels);
        let mut references = Vec::new();
        let env = written(self.env, RefTarget::Env, None, text, &mut references);
        let sglang_flags = written(
            self.sglang.flags,
            RefTarget::Flag,
            None,
            text,
            &mut references,
        );
        // `structure` has refused both or neither.
        let (list, entries) = match (self.hosts, self.nodes) {
            (_, Some(nodes)) => ("nodes", nodes),
            (hosts, None) => ("hosts", hosts.unwrap_or_default()),
        };
        let addresses: Vec<String> = entries
            .iter()
            .map(|h| {
                h.0.address.as_deref().map_or_else(
                    || super::host_address(&h.0.name),
                    |a| {
                        // `[fd00::1]` written as its URL form means the address inside.
                        let a = a.trim();
                        a.strip_prefix('[')
                            .and_then(|a| a.strip_suffix(']'))
                            .unwrap_or(a)
                            .to_string()
                    },
                )
            })
            .collect();
        let group = (list == "nodes").then(|| NodeGroup {
            addresses,
            // Out of range is `validate`'s error, with its position; 0 never validates.
            dist_init_port: self
                .sglang
                .dist_init_port
                .map_or(NodeGroup::DEFAULT_DIST_INIT_PORT, |p| {
                    u16::try_from(p).unwrap_or(0)
                }),
        });
        // A value `hardening_errors` did not refuse names a preset.
        let hardening = self
            .systemd
            .get("hardening")
            .and_then(|v| Hardening::parse(&v.0))
            .unwrap_or_default();
        let hosts: Vec<HostSpec> = entries
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.0.into_spec(&labels, hardening, (list, i), text, &mut references)
            })
            .collect();
        let systemd = strings(self.systemd);
        let pinned = self.sglang.model.map(RawModel::into_spec);
        Manifest {
            source: source.to_string(),
            digest: digest(text),
            text: text.to_string(),
            service,
            description: self.description,
            secret_env: self.secret_env,
            hosts,
            group,
            sglang: SglangSpec {
                python: self.sglang.python,
                console_script: self.sglang.console_script,
                version: self.sglang.version.0,
                // A pinned model runs from its pinned copy, under the name it had before.
                model_path: pinned.as_ref().map_or_else(
                    || self.sglang.model_path.unwrap_or_default(),
                    |w| w.pinned_dir(),
                ),
                served_model_name: self
                    .sglang
                    .served_model_name
                    .or_else(|| pinned.as_ref().map(|w| w.served_name())),
                pinned,
                host: self.sglang.host,
                // Out-of-range ports are reported by `validate`, with their position; 0 never validates.
                port: u16::try_from(self.sglang.port).unwrap_or(0),
                flags: sglang_flags,
            },
            env,
            references,
            // `dropins` is reconcile's own setting, not systemd's: lower case, so it cannot clash
            // with one. A value it does not know is `validate`'s error, with its position.
            // `hardening` is too; each host carries it (`HostSpec::hardening`).
            dropins: systemd
                .get("dropins")
                .and_then(|v| super::DropInPolicy::parse(v))
                .unwrap_or_default(),
            systemd: systemd
                .into_iter()
                .filter(|(k, _)| k != "dropins" && k != "hardening")
                .collect(),
            verify: VerifySpec {
                crash_window: v.crash_window.map_or(defaults.crash_window, |d| d.0),
                load_deadline: v.load_deadline.map_or(defaults.load_deadline, |d| d.0),
                stall_timeout: v.stall_timeout.map_or(defaults.stall_timeout, |d| d.0),
                warmup_timeout: v.warmup_timeout.map_or(defaults.warmup_timeout, |d| d.0),
                guard_margin: v.guard_margin.map_or(defaults.guard_margin, |d| d.0),
                sample_interval: v.sample_interval.map_or(defaults.sample_interval, |d| d.0),
                memory_ceiling: v.memory_ceiling.map(|s| s.0),
                gpu_memory_per_gpu: v.gpu_memory_per_gpu.map(|s| s.0 / MIB),
                gpu_memory_tolerance: v
                    .gpu_memory_tolerance
                    .unwrap_or(defaults.gpu_memory_tolerance),
                url: v.url,
                smoke: v.smoke.map(|s| Smoke {
                    prompt: s.prompt,
                    expect: s.expect,
                    max_tokens: s.max_tokens,
                }),
                explicit,
                benchmark: v.benchmark.map(RawBenchmark::into_spec),
                quality: v.quality.map(RawQuality::into_spec),
                bake: v.bake.map(RawBake::into_spec),
            },
            router: self.router.map(RawRouter::into_spec),
            rollout: self.rollout.map(|r| super::RolloutSpec {
                canary: r.canary,
                max_parallel: r.max_parallel,
                max_failures: r.max_failures,
            }),
            drain: self.drain.map(RawDrain::into_spec),
            apply: super::ApplySpec {
                live: self.apply.is_some_and(|a| a.live),
            },
        }
    }
}

impl RawHostEntry {
    /// The host's spec; `at`: the list (`hosts` or `nodes`) and index of its entry.
    fn into_spec(
        self,
        service_labels: &BTreeMap<String, String>,
        service_hardening: Hardening,
        at: (&'static str, usize),
        text: &str,
        references: &mut Vec<Reference>,
    ) -> HostSpec {
        let mut labels = service_labels.clone();
        labels.extend(strings(self.labels));
        let mut systemd = strings(self.systemd);
        // The host's own preset, else the service's; not a systemd setting (see `dropins`).
        let hardening = systemd
            .remove("hardening")
            .and_then(|v| Hardening::parse(&v))
            .unwrap_or(service_hardening);
        HostSpec {
            name: self.name,
            labels,
            env: written(self.env, RefTarget::Env, Some(at), text, references),
            flags: written(self.flags, RefTarget::Flag, Some(at), text, references),
            systemd,
            hardening,
        }
    }
}

fn strings(map: BTreeMap<String, Scalar>) -> BTreeMap<String, String> {
    map.into_iter().map(|(k, v)| (k, v.0)).collect()
}

/// The values of `map` (flags or env) written in place; each `{ from_env }` goes to `references`
/// instead, as a `target`. `host`: the list (`hosts` or `nodes`) and index of the host entry they
/// are written in, if any.
fn written<T>(
    map: BTreeMap<String, Raw<T>>,
    target: fn(String) -> RefTarget,
    host: Option<(&'static str, usize)>,
    text: &str,
    references: &mut Vec<Reference>,
) -> BTreeMap<String, T> {
    let mut values = BTreeMap::new();
    for (name, value) in map {
        match value {
            Raw::Value(v) => {
                values.insert(name, v);
            }
            Raw::FromEnv(var) => references.push(reference(target(name), host, var, text)),
        }
    }
    values
}

fn reference(
    target: RefTarget,
    host: Option<(&'static str, usize)>,
    var: String,
    text: &str,
) -> Reference {
    let (map, name) = match &target {
        RefTarget::Env(name) => ("env", name.as_str()),
        RefTarget::Flag(name) => ("flags", name.as_str()),
    };
    let (path, field) = match (host, &target) {
        (None, RefTarget::Env(_)) => (vec![Seg::Key("env"), Seg::Key(name)], format!("env.{name}")),
        (None, RefTarget::Flag(_)) => (
            vec![Seg::Key("sglang"), Seg::Key("flags"), Seg::Key(name)],
            format!("sglang.flags.{name}"),
        ),
        (Some((list, i)), _) => (
            vec![Seg::Key(list), Seg::Index(i), Seg::Key(map), Seg::Key(name)],
            format!("{list}[{i}].{map}.{name}"),
        ),
    };
    Reference {
        position: super::locate::locate(text, &path),
        target,
        host: host.map(|(_, i)| i),
        var,
        field,
    }
}

impl<'de> Deserialize<'de> for RawHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct HostVisitor;
        impl<'de> Visitor<'de> for HostVisitor {
            type Value = RawHost;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a host name, or a map with `name` and optional `labels`, `env`, `flags`, `systemd` (and `address` under `nodes`)",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawHost, E> {
                let entry = RawHostEntry {
                    name: v.to_string(),
                    address: None,
                    labels: BTreeMap::new(),
                    env: BTreeMap::new(),
                    flags: BTreeMap::new(),
                    systemd: BTreeMap::new(),
                };
                Ok(RawHost(entry))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawHost, A::Error> {
                RawHostEntry::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawHost)
            }
        }
        d.deserialize_any(HostVisitor)
    }
}

/// Accepts the YAML scalars a unit can hold as text; `1`, `"1"` and `1.5` all become their text.
struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, number or boolean")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor).map(Scalar)
    }
}

impl<'de> Deserialize<'de> for RawFlag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl<'de> Visitor<'de> for FlagVisitor {
            type Value = RawFlag;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "true or false (a switch), a string or number (a value), a list of them, or { from_env: VAR }",
                )
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawFlag, E> {
                Ok(RawFlag::Value(FlagValue::Switch(v)))
            }
            /// `~`/`null`, typically in a host override, turns a service-wide flag off.
            fn visit_unit<E: de::Error>(self) -> Result<RawFlag, E> {
                Ok(RawFlag::Value(FlagValue::Switch(false)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawFlag, E> {
                ScalarVisitor
                    .visit_str(v)
                    .map(|v| RawFlag::Value(FlagValue::Value(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawFlag, E> {
                ScalarVisitor
                    .visit_i64(v)
                    .map(|v| RawFlag::Value(FlagValue::Value(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawFlag, E> {
                ScalarVisitor
                    .visit_u64(v)
                    .map(|v| RawFlag::Value(FlagValue::Value(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawFlag, E> {
                ScalarVisitor
                    .visit_f64(v)
                    .map(|v| RawFlag::Value(FlagValue::Value(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawFlag, A::Error> {
                let mut items = Vec::new();
                while let Some(Scalar(item)) = seq.next_element()? {
                    items.push(item);
                }
                Ok(RawFlag::Value(FlagValue::List(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawFlag, A::Error> {
                from_env(map).map(RawFlag::FromEnv)
            }
        }
        d.deserialize_any(FlagVisitor)
    }
}

impl<'de> Deserialize<'de> for RawEnv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EnvVisitor;
        impl<'de> Visitor<'de> for EnvVisitor {
            type Value = RawEnv;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, number or boolean, or { from_env: VAR }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawEnv, E> {
                ScalarVisitor.visit_str(v).map(RawEnv::Value)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawEnv, E> {
                ScalarVisitor.visit_bool(v).map(RawEnv::Value)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawEnv, E> {
                ScalarVisitor.visit_i64(v).map(RawEnv::Value)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawEnv, E> {
                ScalarVisitor.visit_u64(v).map(RawEnv::Value)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawEnv, E> {
                ScalarVisitor.visit_f64(v).map(RawEnv::Value)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawEnv, A::Error> {
                from_env(map).map(RawEnv::FromEnv)
            }
        }
        d.deserialize_any(EnvVisitor)
    }
}

/// `{ from_env: VAR }`, the only map a value may be.
fn from_env<'de, A: MapAccess<'de>>(map: A) -> Result<String, A::Error> {
    RawFromEnv::deserialize(de::value::MapAccessDeserializer::new(map)).map(|r| r.from_env)
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = d.deserialize_any(ScalarVisitor)?;
        parse_size(&text).map(Size).ok_or_else(|| {
            de::Error::custom(format!("`{text}` is not a size like 300GiB or 75000 MiB"))
        })
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map(HumanDuration)
            .map_err(|e| {
                de::Error::custom(format!(
                    "`{text}` is not a duration like 10s, 90s or 30m ({e})"
                ))
            })
    }
}

// The schemas of the types whose `Deserialize` is written by hand above: what each visitor
// accepts, said as JSON Schema (`schema::manifest` builds the manifest's from these and the
// derived ones).

impl JsonSchema for RawHost {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Host".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let entry = generator.subschema_for::<RawHostEntry>();
        schemars::json_schema!({
            "description": "A host: an ssh destination (`gpu-a`, `root@gpu-a:2222`), or a map with `name` and per-host overrides",
            "anyOf": [{ "type": "string", "minLength": 1 }, entry]
        })
    }
}

/// `systemd:`, service-wide or per host: unit settings by name, and `hardening`, reconcile's own
/// key, whose presets an editor can offer.
fn systemd_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let scalar = generator.subschema_for::<Scalar>();
    schemars::json_schema!({
        "description": "Unit settings by name (User, Restart, LimitNOFILE, After, ...), written verbatim in systemd syntax",
        "type": "object",
        "properties": {
            "hardening": {
                "description": "reconcile's sandbox preset (docs/hardening.md): `standard`, one SGLang keeps working under on NVIDIA GPUs, or `none` (the default); the settings given here override the preset's",
                "enum": Hardening::NAMES
            }
        },
        "additionalProperties": scalar
    })
}

impl JsonSchema for Scalar {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Scalar".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A string, number or boolean, written into the unit as its text",
            "type": ["string", "number", "boolean"]
        })
    }
}

impl JsonSchema for RawFromEnv {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FromEnv".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The value of an environment variable of the machine running reconcile, read at apply time and never written into plans or logs",
            "type": "object",
            "properties": { "from_env": { "type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" } },
            "required": ["from_env"],
            "additionalProperties": false
        })
    }
}

impl JsonSchema for RawFlag {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Flag".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let from_env = generator.subschema_for::<RawFromEnv>();
        schemars::json_schema!({
            "description": "true: the bare flag; false or null: left out; a string or number: its value; a list: several values; or { from_env: VAR }",
            "anyOf": [
                { "type": ["boolean", "null", "string", "number"] },
                { "type": "array", "items": { "type": ["string", "number", "boolean"] } },
                from_env
            ]
        })
    }
}

impl JsonSchema for RawEnv {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EnvValue".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let from_env = generator.subschema_for::<RawFromEnv>();
        schemars::json_schema!({
            "description": "A string, number or boolean, or { from_env: VAR }",
            "anyOf": [{ "type": ["string", "number", "boolean"] }, from_env]
        })
    }
}

impl JsonSchema for Size {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A size: bytes, or a number with a unit, like 300GiB, 75000 MiB or 80GB",
            "anyOf": [
                { "type": "number", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9]*\\.?[0-9]+\\s*([kKmMgGtT]([iI]?[bB])?|[bB])?\\s*$" }
            ]
        })
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration like 10s, 90s, 500ms or 30m",
            "type": "string",
            "pattern": "^\\s*([0-9]+\\s*[a-zA-Zµ]+\\s*)+$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::NodeGroup;
    use crate::testing::{assert_holds, assert_starts};

    const MINIMAL: &str = "service: s\nhosts: [a]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";

    fn error_of(text: &str) -> (Option<Position>, String, String) {
        match parse("m.yaml", text).unwrap_err().0.remove(0) {
            ManifestError::Invalid {
                position,
                field,
                message,
                ..
            } => (position, field, message),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn minimal_manifest_gets_defaults() {
        let m = parse("m.yaml", MINIMAL).unwrap();
        assert_eq!(m.unit_name(), "s.service");
        assert_eq!(m.sglang.version, "0.5.23");
        assert_eq!(m.verify.crash_window, Duration::from_secs(10));
        assert_eq!(m.hosts[0].name, "a");
        assert_eq!(m.model_id(), "/m");
    }

    #[test]
    fn scalars_become_text_and_flags_keep_their_kind() {
        let text = format!(
            "{MINIMAL}  flags: {{ tp-size: 4, mem-fraction-static: 0.85, enable-x: true, off: false, gone: ~, l: [a, 1] }}\nenv: {{ A: 1, B: \"x y\" }}\n"
        );
        let m = parse("m.yaml", &text).unwrap();
        assert_eq!(m.sglang.flags["tp-size"], FlagValue::Value("4".into()));
        assert_eq!(
            m.sglang.flags["mem-fraction-static"],
            FlagValue::Value("0.85".into())
        );
        assert_eq!(m.sglang.flags["enable-x"], FlagValue::Switch(true));
        assert_eq!(m.sglang.flags["off"], FlagValue::Switch(false));
        assert_eq!(m.sglang.flags["gone"], FlagValue::Switch(false));
        assert_eq!(
            m.sglang.flags["l"],
            FlagValue::List(vec!["a".into(), "1".into()])
        );
        assert_eq!(m.env["A"], "1");
    }

    #[test]
    fn host_entries_are_names_or_maps() {
        let text = MINIMAL.replace(
            "hosts: [a]",
            "hosts:\n  - a\n  - name: b\n    env: { X: \"1\" }",
        );
        let m = parse("m.yaml", &text).unwrap();
        assert_eq!(m.hosts[1].name, "b");
        assert_eq!(m.hosts[1].env["X"], "1");
    }

    const NODES: &str = "service: s\nnodes:\n  - root@gpu-a:2222\n  - name: gpu-b\n    address: 10.0.0.12\n    env: { TOKEN: { from_env: B_TOKEN } }\n  - \"[fd00::3]:22\"\n  - fd00::4\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";

    #[test]
    fn nodes_are_the_hosts_in_rank_order_with_their_addresses() {
        let m = parse("m.yaml", NODES).unwrap();
        let names: Vec<&str> = m.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["root@gpu-a:2222", "gpu-b", "[fd00::3]:22", "fd00::4"]
        );
        let group = m.group.as_ref().unwrap();
        assert_eq!(
            group,
            &NodeGroup {
                addresses: vec![
                    "gpu-a".into(),
                    "10.0.0.12".into(),
                    "fd00::3".into(),
                    "fd00::4".into()
                ],
                dist_init_port: 20000,
            }
        );
        assert_eq!(group.dist_init_addr(), "gpu-a:20000");
        assert_eq!(group.nnodes(), 4);
        assert_eq!(m.hosts_key(), "nodes");
        // A node's `{ from_env }` is named by its place under `nodes`.
        assert_eq!(m.references[0].field, "nodes[1].env.TOKEN");
        assert_eq!(m.references[0].host, Some(1));
        assert_eq!(
            m.references[0].position,
            Some(Position {
                line: 6,
                column: 12
            })
        );
        let m = parse("m.yaml", MINIMAL).unwrap();
        assert_eq!((&m.group, m.hosts_key()), (&None, "hosts"));
    }

    #[test]
    fn a_written_dist_init_port_and_an_ipv6_rank_zero() {
        let text = NODES.replace("  - root@gpu-a:2222\n", "").replace(
            "  port: 30000\n",
            "  port: 30000\n  dist_init_port: 29500\n",
        );
        let m = parse("m.yaml", &text).unwrap();
        let group = m.group.unwrap();
        assert_eq!(group.dist_init_port, 29500);
        assert_eq!(group.addresses[0], "10.0.0.12");
        let text = text.replace("    address: 10.0.0.12\n", "    address: \"[fd00::2]\"\n");
        let group = parse("m.yaml", &text).unwrap().group.unwrap();
        assert_eq!(group.addresses[0], "fd00::2");
        assert_eq!(group.dist_init_addr(), "[fd00::2]:29500");
    }

    #[test]
    fn the_address_of_a_destination_is_its_host_part() {
        use crate::manifest::host_address;
        assert_eq!(host_address("gpu-a"), "gpu-a");
        assert_eq!(host_address("root@gpu-a"), "gpu-a");
        assert_eq!(host_address("root@10.0.0.1:2222"), "10.0.0.1");
        assert_eq!(host_address("root@[fd00::1]:22"), "fd00::1");
        assert_eq!(host_address("[fd00::1]"), "fd00::1");
        assert_eq!(host_address("fd00::1"), "fd00::1");
        assert_eq!(host_address("local"), "local");
    }

    #[test]
    fn hosts_and_nodes_are_one_or_the_other() {
        let both = MINIMAL.replace("hosts: [a]\n", "hosts: [a]\nnodes: [b, c]\n");
        let (position, field, message) = error_of(&both);
        assert_eq!(
            (position.unwrap(), field.as_str()),
            (Position { line: 3, column: 8 }, "nodes")
        );
        assert_holds(&message, "not both");
        let neither = MINIMAL.replace("hosts: [a]\n", "");
        let e = parse("m.yaml", &neither).unwrap_err().0[0].to_string();
        assert_eq!(
            e,
            "m.yaml:1:1: (document): missing field `hosts` (or `nodes`, for one server over several hosts)"
        );
    }

    #[test]
    fn address_and_dist_init_port_belong_to_nodes() {
        let text = MINIMAL
            .replace("hosts: [a]", "hosts:\n  - name: a\n    address: 10.0.0.1")
            .replace(
                "  port: 30000\n",
                "  port: 30000\n  dist_init_port: 20000\n",
            );
        let e: Vec<String> = parse("m.yaml", &text)
            .unwrap_err()
            .0
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_starts(
            &e,
            &[
                "m.yaml:4:5: hosts[0].address: `address` is how the other ranks",
                "m.yaml:10:3: sglang.dist_init_port: dist_init_port is the rendezvous port of a server group: it needs `nodes:`",
            ],
        );
    }

    #[test]
    fn unknown_field_names_its_path_and_line() {
        let text = format!("{MINIMAL}  flgs: {{}}\n");
        let (position, field, message) = error_of(&text);
        assert_eq!(position.unwrap().line, 8);
        assert_eq!(field, "sglang.flgs");
        assert_holds(&message, "unknown field `flgs`");
    }

    #[test]
    fn wrong_type_names_its_path_and_line() {
        let (position, field, message) = error_of(&MINIMAL.replace("port: 30000", "port: high"));
        assert_eq!(position.unwrap(), Position { line: 7, column: 9 });
        assert_eq!(field, "sglang.port");
        assert_holds(&message, "invalid type");
    }

    #[test]
    fn missing_field_is_named() {
        let (_, _, message) = error_of(&MINIMAL.replace("  port: 30000\n", ""));
        assert_holds(&message, "missing field `port`");
    }

    #[test]
    fn yaml_syntax_error_has_a_position() {
        let (position, _, _) = error_of("service: [unclosed\nhosts: a\n");
        assert!(position.is_some());
    }

    #[test]
    fn verification_settings_parse() {
        let text = format!("{MINIMAL}verify: {{ memory_ceiling: 300GiB, gpu_memory_per_gpu: 75000 MiB, smoke: {{ prompt: hi, expect: OK }} }}\n");
        let v = parse("m.yaml", &text).unwrap().verify;
        assert_eq!(v.memory_ceiling, Some(300 * 1024 * MIB));
        assert_eq!(v.gpu_memory_per_gpu, Some(75000));
        assert_eq!(v.smoke.unwrap().max_tokens(false), 16);
        assert_eq!(parse_size("80GB"), Some(80_000_000_000));
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn bad_duration_says_what_is_expected() {
        let (_, field, message) = error_of(&format!("{MINIMAL}verify: {{ crash_window: soon }}\n"));
        assert_eq!(field, "verify.crash_window");
        assert_holds(&message, "not a duration");
    }

    #[test]
    fn drain_parses_with_its_defaults_and_names_bad_values() {
        assert_eq!(parse("m.yaml", MINIMAL).unwrap().drain, None);
        let d = parse("m.yaml", &format!("{MINIMAL}drain: {{}}\n"))
            .unwrap()
            .drain
            .unwrap();
        assert_eq!(
            (d.timeout, d.on_timeout),
            (Duration::from_secs(600), OnTimeout::Refuse)
        );
        let d = parse(
            "m.yaml",
            &format!("{MINIMAL}drain:\n  timeout: 90s\n  on_timeout: restart\n"),
        )
        .unwrap()
        .drain
        .unwrap();
        assert_eq!(
            (d.timeout, d.on_timeout),
            (Duration::from_secs(90), OnTimeout::Restart)
        );
        let (position, field, message) =
            error_of(&format!("{MINIMAL}drain:\n  on_timeout: wait\n"));
        assert_eq!(
            (position.unwrap().line, field.as_str()),
            (9, "drain.on_timeout")
        );
        assert_holds(&message, "unknown variant `wait`");
        let (_, field, message) = error_of(&format!("{MINIMAL}drain: {{ timeout: later }}\n"));
        assert_eq!(field, "drain.timeout");
        assert_holds(&message, "not a duration");
        let (_, field, _) = error_of(&format!("{MINIMAL}drain: {{ timout: 1m }}\n"));
        assert_eq!(field, "drain.timout");
    }

    #[test]
    fn benchmark_settings_parse_with_their_defaults() {
        let text = format!("{MINIMAL}verify: {{ benchmark: {{}} }}\n");
        let b = parse("m.yaml", &text).unwrap().verify.benchmark.unwrap();
        assert_eq!(b, BenchmarkSpec::default());
        assert_eq!((b.requests_at(1), b.requests_at(16)), (8, 64));
        let text = format!("{MINIMAL}verify:\n  benchmark: {{ levels: [1, 4], output_tokens: 16, requests: 8, gate: false, max_regression: 5 }}\n");
        let b = parse("m.yaml", &text).unwrap().verify.benchmark.unwrap();
        assert_eq!(
            (
                b.levels.clone(),
                b.output_tokens,
                b.requests_at(4),
                b.gate,
                b.max_regression
            ),
            (vec![1, 4], 16, 8, false, 5.0)
        );
        assert!(parse(
            "m.yaml",
            &format!("{MINIMAL}verify: {{ benchmark: {{ lvls: [1] }} }}\n")
        )
        .is_err());
        let (_, field, _) = error_of(&format!(
            "{MINIMAL}verify:\n  benchmark:\n    levels: [one]\n"
        ));
        assert_eq!(field, "verify.benchmark.levels[0]");
    }
}
