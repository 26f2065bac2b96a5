//! Manifests: what an operator wants running, one SGLang service per YAML file.
//!
//! The binary's `load` reads the files, the only place that touches the disk; `parse` (YAML to typed
//! values), `validate` (rules a YAML schema cannot express) and [`check_all`] are pure and report
//! every problem they find, each with the file, line, column and field path, so a bad manifest is
//! caught before any host is contacted.

mod bearer;
pub(crate) mod error;
pub(crate) mod locate;
mod parse;
mod reference;
mod rollout;
mod router;
pub mod schema;
mod validate;

use std::collections::BTreeMap;
use std::time::Duration;

pub use bearer::{in_clear_off_host, is_loopback_host};
pub use error::{ManifestError, ManifestErrors, Position};
pub(crate) use parse::deserialize_located;
pub use parse::parse;
pub use reference::{RefTarget, Reference};
pub use rollout::RolloutSpec;
pub use router::{AdminKey, RouterSpec, UrlError};
#[cfg(test)]
pub(crate) use validate::group_flags;
pub use validate::{validate, validate_fleet};

/// Where a field (a path of keys, `["verify", "quality", "cases"]`) is in a manifest's text: for
/// errors found outside the manifest itself, such as a file it names that cannot be read.
pub fn field_position(text: &str, path: &[&str]) -> Option<Position> {
    let segs: Vec<locate::Seg> = path.iter().map(|k| locate::Seg::Key(k)).collect();
    locate::locate(text, &segs)
}

/// One service (one systemd unit) deployed to one or more hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Where the manifest came from, as shown to users and written into the unit's header.
    pub source: String,
    /// sha256 of the manifest's text, kept in deployment records.
    pub digest: String,
    /// The manifest's text, for positions in findings made after loading (preflight checks the
    /// flags against the SGLang version a host really has).
    pub text: String,
    /// The unit name without `.service`.
    pub service: String,
    pub description: Option<String>,
    /// Env names to redact in every output even when their names do not look secret.
    pub secret_env: Vec<String>,
    /// The hosts the unit goes to: `hosts:`, or `nodes:` in rank order (see [`Manifest::group`]).
    pub hosts: Vec<HostSpec>,
    /// `Some` for `nodes:`: one SGLang server spread over all of [`Manifest::hosts`].
    pub group: Option<NodeGroup>,
    pub sglang: SglangSpec,
    pub env: BTreeMap<String, String>,
    /// `{ from_env: VAR }` values of `env` and `flags` (service-wide and per host), not yet in
    /// those maps: the loader resolves them (`resolve_references`) before anything renders.
    pub references: Vec<Reference>,
    /// Extra unit settings (`User`, `Restart`, `LimitNOFILE`, `After`, ...).
    pub systemd: BTreeMap<String, String>,
    pub verify: VerifySpec,
    /// The sglang-router the replicas sit behind (`router:`), for rollouts that take each out.
    pub router: Option<RouterSpec>,
    /// How a change goes over the hosts (`rollout:`): canary, parallelism, failure budget.
    pub rollout: Option<RolloutSpec>,
    /// Wait for the server to finish its requests before a restart (`drain:`); `None`: restart at
    /// once, as before.
    pub drain: Option<DrainSpec>,
    /// What apply does with what systemd runs besides the manifest's unit (`systemd.dropins`).
    pub dropins: DropInPolicy,
    /// How apply changes a running server (`apply:`).
    pub apply: ApplySpec,
}

/// `apply:`: how apply may change a running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ApplySpec {
    /// Apply a change SGLang takes without a restart live (`reconcile_core::live`): another
    /// checkpoint of the same architecture, or a value `/set_internal_state` takes. Off by
    /// default: `/update_weights_from_disk` has had bugs with quantized checkpoints.
    pub live: bool,
}

/// `systemd.dropins`: what apply does when systemd would not run the manifest's unit as rendered:
/// a drop-in the manifest does not own, a mask, or a unit file elsewhere that systemd loads
/// instead (see `reconcile_core::unit_files`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DropInPolicy {
    /// Refuse, touching nothing: someone changed the unit on the host on purpose, and a manifest
    /// that silently undid it would surprise them.
    #[default]
    Refuse,
    /// Move those files aside into the unit's generations (restorable) and install the
    /// manifest's unit alone.
    Replace,
}

impl DropInPolicy {
    pub fn parse(text: &str) -> Option<DropInPolicy> {
        match text {
            "refuse" => Some(DropInPolicy::Refuse),
            "replace" => Some(DropInPolicy::Replace),
            _ => None,
        }
    }
}

/// `systemd.hardening`: a sandbox preset rendered into the unit (`crate::unit::hardening`). Like
/// `dropins`, reconcile's own key, lower case so it cannot clash with a systemd setting; the
/// manifest's explicit `systemd:` settings override the preset's, one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hardening {
    /// No sandbox beyond what the manifest sets itself, as before the preset existed.
    #[default]
    None,
    /// The sandbox SGLang keeps working under on NVIDIA GPUs (docs/hardening.md).
    Standard,
}

impl Hardening {
    /// The values `systemd.hardening` takes, as written.
    pub const NAMES: [&'static str; 2] = ["none", "standard"];

    pub fn parse(text: &str) -> Option<Hardening> {
        match text {
            "none" => Some(Hardening::None),
            "standard" => Some(Hardening::Standard),
            _ => None,
        }
    }
}

/// `drain:`: before a restart, wait until the running server has no running or queued requests
/// (SGLang's `/metrics`, served with `--enable-metrics`), for at most `timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainSpec {
    pub timeout: Duration,
    pub on_timeout: OnTimeout,
}

/// What a drain that did not see the server idle in time does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Restart anyway: the requests still in flight are cut off.
    Restart,
    /// Leave the old unit and server as they are and report the unit as refused.
    Refuse,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            // The OpenAI clients most SGLang callers use give up on a request after 600 s
            // (openai-python's DEFAULT_TIMEOUT); waiting longer keeps nothing alive that they
            // still wait for.
            timeout: Duration::from_secs(600),
            // Cutting requests off is the operator's call, never the default.
            on_timeout: OnTimeout::Refuse,
        }
    }
}

/// `nodes:`: one SGLang server over these hosts (rank = position in `Manifest::hosts`). Each host
/// runs `launch_server --nnodes N --node-rank i --dist-init-addr ADDR:PORT`, rendered from this
/// (sglang 0.5.23's multi-node flags); the manifest never sets those flags itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroup {
    /// Each rank's address as the other ranks reach it, in rank order: a node's `address:`, or
    /// the host part of its `name` (without `user@` and `:port`). IPv6 addresses are kept without
    /// brackets.
    pub addresses: Vec<String>,
    /// The rendezvous port on rank 0 (`sglang.dist_init_port`).
    pub dist_init_port: u16,
}

impl NodeGroup {
    /// `sglang.dist_init_port` when the manifest leaves it out: 20000, the port of SGLang's own
    /// multi-node examples (`--dist-init-addr 10.0.0.1:20000`, docs `multi_node_deployment`).
    pub const DEFAULT_DIST_INIT_PORT: u16 = 20000;

    /// `--dist-init-addr`: rank 0's address and the rendezvous port, an IPv6 address in brackets
    /// (`[fd00::1]:20000`), as SGLang splits it into host and port.
    pub fn dist_init_addr(&self) -> String {
        let host = self.addresses.first().map_or("", String::as_str);
        if host.contains(':') {
            format!("[{host}]:{}", self.dist_init_port)
        } else {
            format!("{host}:{}", self.dist_init_port)
        }
    }

    /// The number of ranks (`--nnodes`).
    pub fn nnodes(&self) -> usize {
        self.addresses.len()
    }
}

/// The address the other ranks reach a host at when its `nodes:` entry gives no `address:`: the
/// host part of an ssh destination. `root@gpu-a:2222` -> `gpu-a`, `[fd00::1]:22` -> `fd00::1`,
/// `fd00::1` (bare IPv6, no port possible) stays.
pub fn host_address(destination: &str) -> String {
    let host = destination
        .rsplit_once('@')
        .map_or(destination, |(_, host)| host);
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((inside, _)) = rest.split_once(']') {
            return inside.to_string();
        }
    }
    match host.split_once(':') {
        // One colon: `host:port`. More: a bare IPv6 address, which has no port.
        Some((name, port)) if !port.contains(':') => name.to_string(),
        _ => host.to_string(),
    }
}

/// A host entry, with what it overrides of the service-wide settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostSpec {
    /// An ssh destination (a `~/.ssh/config` name, `user@host`, `user@host:port`) or `local`.
    pub name: String,
    pub env: BTreeMap<String, String>,
    pub flags: BTreeMap<String, FlagValue>,
    pub systemd: BTreeMap<String, String>,
    /// Labels for `--selector` (the service's, overridden by the host's own).
    pub labels: BTreeMap<String, String>,
    /// The sandbox preset of this host's unit: its own `systemd.hardening`, else the service's.
    pub hardening: Hardening,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SglangSpec {
    pub python: String,
    /// `Some`: ExecStart runs `<console_script> serve` (SGLang's `sglang` console script) rather
    /// than `<python> -m sglang.launch_server`; the same server either way.
    pub console_script: Option<String>,
    pub version: String,
    /// The folder (or hub id) SGLang loads; a pinned model's pinned copy.
    pub model_path: String,
    pub served_model_name: Option<String>,
    /// `model:`: the weights pinned by revision, which `model_path` is the pinned copy of.
    pub pinned: Option<crate::pinned::PinnedModel>,
    pub host: Option<String>,
    pub port: u16,
    /// `launch_server` flags by name, without the leading `--`.
    pub flags: BTreeMap<String, FlagValue>,
}

/// A flag's value as written in the manifest.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagValue {
    /// `true` renders the bare flag, `false` leaves it out.
    Switch(bool),
    Value(String),
    List(Vec<String>),
}

/// How `apply` judges a restarted server.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifySpec {
    pub crash_window: Duration,
    pub load_deadline: Duration,
    /// No progress on any sign of life (memory, CPU, journal) for this long before the port
    /// opens is a stall.
    pub stall_timeout: Duration,
    /// Port open but `/health` still 503 (SGLang's warmup request) for this long fails.
    pub warmup_timeout: Duration,
    /// How long the host's guard waits after the controller's last word before it acts on a
    /// failed or crash-looping unit, and beyond verification's own bounds before it judges one
    /// that never answered (`crate::guard`).
    pub guard_margin: Duration,
    pub sample_interval: Duration,
    /// The service's memory (its cgroup) must stay below this many bytes.
    pub memory_ceiling: Option<u64>,
    /// Expected GPU memory per GPU once loaded, in MiB, and the tolerance in percent.
    pub gpu_memory_per_gpu: Option<u64>,
    pub gpu_memory_tolerance: f64,
    /// Reach the server at this URL instead of through an SSH port forward to its port.
    pub url: Option<String>,
    pub smoke: Option<Smoke>,
    /// Which of the values above the manifest set; the others may be learned from the unit's
    /// past loads (`learned::learned_spec`).
    pub explicit: Explicit,
    /// The throughput gate run after every other stage passed (`verify.benchmark`).
    pub benchmark: Option<BenchmarkSpec>,
    /// The quality gate, after the benchmark (`verify.quality`).
    pub quality: Option<crate::quality::QualitySpec>,
    /// Behind a router: the canary judged on live traffic against the stable replicas once it is
    /// back in (`verify.bake`).
    pub bake: Option<BakeSpec>,
}

/// `verify.bake`: how long the canary replica serves live traffic before it is judged, and how
/// much worse than the stable replicas it may be (`crate::bake`).
#[derive(Debug, Clone, PartialEq)]
pub struct BakeSpec {
    /// Served before the first look, not judged: a restarted canary's prefix cache starts empty
    /// where the stable replicas' is warm (Argo Rollouts' `initialDelay`; 0 s by default, as its).
    pub warmup: Duration,
    pub duration: Duration,
    /// Fewer requests than this on either side, and nothing shown worse: inconclusive.
    pub min_requests: u32,
    /// Aborted requests may exceed the stable replicas' share by this many percentage points.
    pub max_error_rate_increase: f64,
    /// TTFT and inter-token latency quantiles may be this many times the stable replicas'.
    pub max_latency_ratio: f64,
    /// Output tokens per second per running request may be this many times lower.
    pub max_throughput_ratio: f64,
    /// How sure the bake must be that a difference is not chance before it fails the canary.
    pub confidence: f64,
}

impl BakeSpec {
    /// A bake of `duration` with the default thresholds.
    pub fn lasting(duration: Duration) -> BakeSpec {
        BakeSpec {
            warmup: Duration::ZERO,
            duration,
            // A p95 read from fewer observations than this stands on one or two requests: too
            // few to show the canary no worse (a difference the ranks show is judged on fewer).
            min_requests: 100,
            max_error_rate_increase: 1.0,
            // SGLang's latency buckets step by 1.25x to 2x (TTFT 0.6, 0.8, 1, 2, 4 s:
            // `metrics_collector.py`); a quantile is interpolated within its bucket, so a ratio
            // under 1.5 is within what the bucket edges alone can make of one distribution.
            max_latency_ratio: 1.5,
            // A ratio of two sums (tokens over request-seconds), with no bucket edges in it.
            max_throughput_ratio: 1.5,
            // One-sided 0.99: Kayenta's two-sided 98 % interval (`crate::bake::Limits`).
            confidence: 0.99,
        }
    }

    pub fn limits(&self) -> crate::bake::Limits {
        crate::bake::Limits {
            min_requests: f64::from(self.min_requests),
            error_rate_above: self.max_error_rate_increase / 100.0,
            latency_ratio: self.max_latency_ratio,
            throughput_ratio: self.max_throughput_ratio,
            confidence: self.confidence,
        }
    }
}

/// The verification values a manifest set itself, rather than left to their defaults: a load
/// deadline the manifest leaves to its default is learned from past loads (`learned.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explicit {
    pub load_deadline: bool,
}

/// A fixed, reproducible load test: streamed chat completions at each concurrency level in turn.
/// Its figures are kept in the deployment record and compared with the previous deployment's.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchmarkSpec {
    /// Concurrency levels, run one after another.
    pub levels: Vec<u32>,
    /// Words in the (seeded, deterministic) prompt.
    pub prompt_tokens: u32,
    /// `max_tokens` of each request, with `ignore_eos`, so every request generates exactly this.
    pub output_tokens: u32,
    /// Requests per level; `None`: [`BenchmarkSpec::requests_at`]'s default (4 x level, at
    /// least 8). Exclusive with `duration`.
    pub requests: Option<u32>,
    /// Run each level this long instead of a number of requests.
    pub duration: Option<Duration>,
    /// A drop in output tokens/s beyond this many percent at any level is a regression.
    pub max_regression: f64,
    /// A regression fails the stage (and rolls back); `false`: it is reported only.
    pub gate: bool,
}

impl Default for BenchmarkSpec {
    fn default() -> Self {
        BenchmarkSpec {
            levels: vec![1, 16, 64],
            prompt_tokens: 128,
            output_tokens: 128,
            requests: None,
            duration: None,
            max_regression: 10.0,
            gate: true,
        }
    }
}

impl BenchmarkSpec {
    /// Requests run at `level` when the spec counts requests (not a duration).
    pub fn requests_at(&self, level: u32) -> u32 {
        self.requests
            .unwrap_or_else(|| level.saturating_mul(4).max(8))
    }
}

/// One chat completion that a loaded server must answer sensibly.
#[derive(Debug, Clone, PartialEq)]
pub struct Smoke {
    pub prompt: String,
    /// A substring the answer must contain.
    pub expect: String,
    /// `None`: [`Smoke::DEFAULT_MAX_TOKENS`], or more for a reasoning model.
    pub max_tokens: Option<u32>,
}

impl Smoke {
    pub const DEFAULT_MAX_TOKENS: u32 = 16;
    /// A reasoning model asked not to think may think anyway (not every chat template reads
    /// `enable_thinking`), and its thinking counts against `max_tokens`.
    pub const REASONING_MAX_TOKENS: u32 = 1024;

    pub fn max_tokens(&self, reasoning: bool) -> u32 {
        self.max_tokens.unwrap_or(if reasoning {
            Self::REASONING_MAX_TOKENS
        } else {
            Self::DEFAULT_MAX_TOKENS
        })
    }
}

impl Default for VerifySpec {
    fn default() -> Self {
        VerifySpec {
            crash_window: Duration::from_secs(10),
            load_deadline: Duration::from_secs(30 * 60),
            // SGLang's own limit for "no progress": `--watchdog-timeout` (300 s, server_args.py).
            stall_timeout: Duration::from_secs(300),
            // `SGLANG_WARMUP_TIMEOUT` unset: the warmup request waits 600 s
            // (http_server.py, `_wait_and_warmup`), plus a minute for its log line and `/health`.
            warmup_timeout: Duration::from_secs(660),
            guard_margin: crate::guard::DEFAULT_MARGIN,
            sample_interval: Duration::from_secs(2),
            memory_ceiling: None,
            gpu_memory_per_gpu: None,
            gpu_memory_tolerance: 10.0,
            url: None,
            smoke: None,
            explicit: Explicit::default(),
            benchmark: None,
            quality: None,
            bake: None,
        }
    }
}

impl Manifest {
    pub fn unit_name(&self) -> String {
        format!("{}.service", self.service)
    }

    /// The key the hosts are listed under in the manifest's text, for field paths
    /// (`nodes[1].flags.x`): `nodes` for a server group, else `hosts`.
    pub fn hosts_key(&self) -> &'static str {
        if self.group.is_some() {
            "nodes"
        } else {
            "hosts"
        }
    }

    /// The name clients must ask for: SGLang serves the model path when no name is given.
    pub fn model_id(&self) -> &str {
        self.sglang
            .served_model_name
            .as_deref()
            .unwrap_or(&self.sglang.model_path)
    }
}

/// Parses and validates every manifest read (each the path it is shown as and its text, or the
/// error reading it), running `check` on each valid one (it may rewrite the manifest, e.g. expand
/// flag abbreviations, and returns the errors it finds), then the fleet's rules. Returns all
/// manifests, or every error found in any of them, in the order of `read`. Reading the files is
/// the caller's (the binary's `load`).
pub fn check_all(
    read: impl IntoIterator<Item = Result<(String, String), ManifestError>>,
    mut check: impl FnMut(&mut Manifest, &str) -> Vec<ManifestError>,
) -> Result<Vec<Manifest>, ManifestErrors> {
    let mut errors = Vec::new();
    let mut manifests = Vec::new();
    for file in read {
        match file {
            Ok((shown, text)) => {
                match parse(&shown, &text).and_then(|m| validate(&m, &text).map(|()| m)) {
                    Ok(mut m) => {
                        errors.extend(check(&mut m, &text));
                        manifests.push((m, text));
                    }
                    Err(mut e) => errors.append(&mut e.0),
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if let Err(mut e) = validate_fleet(&manifests) {
        errors.append(&mut e.0);
    }
    if errors.is_empty() {
        Ok(manifests.into_iter().map(|(m, _)| m).collect())
    } else {
        Err(ManifestErrors(errors))
    }
}
