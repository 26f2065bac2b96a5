//! Preflight: what a host must have before a unit can start there, checked over the host's one SSH
//! connection by `plan` (shown per unit) and by `apply` (a unit with an error is refused before
//! its lock is taken or anything is changed).
//!
//! The offline checks judge a manifest against the SGLang version it names; they cannot see the
//! host. A venv upgraded by hand to another SGLang, a model folder not synced yet, fewer GPUs than
//! tp × dp × pp, a `CUDA_VISIBLE_DEVICES` index the machine lacks, a stray process on the port:
//! without preflight each shows only when the new unit fails its crash window, after the running
//! server was stopped and its model dropped (about 15 minutes to get back on a 4-GPU host).
//!
//! This is the pure part: [`judge`] takes what was observed, findings out, and the parsers read
//! the commands' output. `gather`, in the `reconcile` binary (`preflight::gather`), is the edge: a
//! few commands over the connection, never more than two at once per unit (with `dry_run`'s four
//! units at once, eight sessions, under sshd's default of ten per connection). [`gpu_conflicts`]
//! needs no host: two services on one host claiming the same GPU.

mod deep;
pub mod owners;
mod weights;

use std::collections::BTreeMap;

pub use crate::finding::{has_errors, strictly, Finding, Severity};
pub use crate::gpu_claims::{gpu_conflicts, split_devices};
pub use deep::{
    cached_answer, read_deep, Deep, DeepWhen, Refusal, ANSWER_PREFIX, DEEP_ASKED_LIMIT, DEEP_LIMIT,
};
pub use weights::{
    judge_weights, read_weights, WeightProblem, Weights, WeightsCheck, WeightsReadError,
};

use crate::flags::flags;
use crate::sglang::{self, Catalog};
use crate::targets::Target;

/// What the host has, as far as preflight needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub python: Python,
    pub model_path: Access,
    pub gpus: Gpus,
    pub port: Port,
    /// The unit's main process now (0: not running).
    pub main_pid: u32,
    /// The host's SGLang checking the unit's argv and its model's config (the deep check); `None`
    /// where it did not run (see [`DeepWhen`]).
    pub deep: Option<Deep>,
    /// The model's weights, checked for a unit whose change starts its server (new, or
    /// restarted); `None` where they were not.
    pub weights: Option<WeightsCheck>,
}

/// The unit's Python, and the SGLang installed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Python {
    /// No file at that path, or one that cannot be executed.
    NotExecutable,
    /// It runs, and has no `sglang` distribution.
    NoSglang,
    /// The version `importlib.metadata` reports.
    Sglang(String),
    /// It ran and failed some other way (the last line of its stderr).
    Failed(String),
    /// Root was not allowed to start it: a user other than root can write what it runs.
    Untrusted(Vec<owners::Writable>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Readable,
    Missing,
    Unreadable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// `nvidia-smi -L`'s GPUs.
    Listed(Vec<Gpu>),
    /// Why they could not be counted (no nvidia-smi, or it failed).
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    /// The processes listening on the port (none: it is free), and the host's ephemeral range
    /// when it could be read.
    Listeners {
        listeners: Vec<Listener>,
        ephemeral: Option<Ephemeral>,
    },
    /// Why it could not be checked (no `ss`).
    Unknown(String),
}

impl Port {
    /// A free port on a host whose ephemeral range is unknown.
    pub fn free() -> Port {
        Port::Listeners {
            listeners: Vec::new(),
            ephemeral: None,
        }
    }
}

/// The host's ephemeral port range (`net.ipv4.ip_local_port_range`: the source ports the kernel
/// gives outgoing connections) and the ports reserved from it (`ip_local_reserved_ports`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ephemeral {
    pub low: u16,
    pub high: u16,
    pub reserved: Vec<(u16, u16)>,
}

impl Ephemeral {
    /// Whether an outgoing connection may take `port` as its source port.
    pub fn may_take(&self, port: u16) -> bool {
        (self.low..=self.high).contains(&port)
            && !self.reserved.iter().any(|(a, b)| (*a..=*b).contains(&port))
    }
}

/// A process listening on the unit's port, as `ss -p` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// `None` when `ss` shows no process (not allowed to see it).
    pub pid: Option<u32>,
    pub comm: String,
    /// `/proc/<pid>/cgroup`, its lines joined by spaces.
    pub cgroup: String,
}

/// What preflight expects of the host for one unit, read from its rendered unit and manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub unit: String,
    pub python: String,
    pub version: String,
    pub model_path: String,
    pub port: u16,
    /// GPUs the server uses on this host (see [`gpus_needed`]).
    pub gpus: u32,
    /// How the GPU count was worked out, for messages: `tp-size 2 × dp-size 1 × pp-size 1`.
    pub gpus_why: String,
    /// `CUDA_VISIBLE_DEVICES` as the unit sets it, split on commas.
    pub visible: Option<Vec<String>>,
}

impl Want {
    pub fn of(t: &Target) -> Want {
        let m = &t.manifest;
        let (_, flags) = flags(&t.desired.model.exec_start);
        let (gpus, gpus_why) = gpus_needed(&flags);
        Want {
            unit: t.desired.unit.clone(),
            // A console script's interpreter is the manifest's python, not ExecStart's program.
            python: match &m.sglang.console_script {
                Some(_) => m.sglang.python.clone(),
                None => t
                    .desired
                    .model
                    .exec_start
                    .first()
                    .cloned()
                    .unwrap_or_else(|| m.sglang.python.clone()),
            },
            version: m.sglang.version.clone(),
            model_path: m.sglang.model_path.clone(),
            port: m.sglang.port,
            gpus,
            gpus_why,
            visible: t
                .desired
                .model
                .env
                .get("CUDA_VISIBLE_DEVICES")
                .map(|v| split_devices(v)),
        }
    }
}

/// GPUs one host gives the server, as SGLang lays them out: tp × pp model replicas' ranks, times
/// dp replicas (unless `--enable-dp-attention`, where dp runs inside the tp group), spread over
/// `--nnodes` hosts. Flags are read under their 0.5.x names and aliases; an unreadable number
/// counts as 1 (the catalog check reports it).
pub fn gpus_needed(flags: &BTreeMap<String, String>) -> (u32, String) {
    let size = |names: &[&str]| -> u32 {
        names
            .iter()
            .find_map(|n| flags.get(*n))
            .and_then(|v| v.trim().parse().ok())
            .filter(|n: &u32| *n > 0)
            .unwrap_or(1)
    };
    let tp = size(&["tp-size", "tensor-parallel-size", "tp"]);
    let dp = size(&["dp-size", "data-parallel-size", "dp"]);
    let pp = size(&["pp-size", "pipeline-parallel-size", "pp"]);
    let nnodes = size(&["nnodes"]);
    let dp_attention = flags.contains_key("enable-dp-attention");
    let replicas = if dp_attention { 1 } else { dp };
    let total = tp.saturating_mul(pp).saturating_mul(replicas);
    let mut why = format!("tp-size {tp} × dp-size {dp} × pp-size {pp}");
    if dp_attention {
        why = format!(
            "tp-size {tp} × pp-size {pp} (dp-size {dp} runs inside tp with --enable-dp-attention)"
        );
    }
    if nnodes > 1 {
        why.push_str(&format!(" over {nnodes} nodes"));
    }
    (total.div_ceil(nnodes), why)
}

/// Judges what was observed for one unit; the fleet's GPU conflicts (`t.conflicts`) come along.
pub fn judge(t: &Target, facts: &Facts) -> Vec<Finding> {
    let want = Want::of(t);
    let mut findings = python(t, &want, &facts.python);
    // A pinned copy not fetched yet is apply's to fetch, verified, before the old server stops;
    // its files (and the deep check, which reads the model's config) are judged then.
    let fetched_later = t.manifest.sglang.pinned.is_some() && facts.model_path == Access::Missing;
    if !fetched_later {
        findings.extend(model_path(&want, facts.model_path));
    }
    findings.extend(gpus(&want, &facts.gpus));
    findings.extend(port(&want.unit, want.port, &facts.port, facts.main_pid));
    findings.extend(ephemeral_port(want.port, &facts.port));
    if !fetched_later {
        findings.extend(
            facts
                .deep
                .as_ref()
                .map(|d| deep::judge_deep(t, &want, d))
                .into_iter()
                .flatten(),
        );
        if let Some(w) = &facts.weights {
            let at = deep::written_at(t, "model-path");
            findings.extend(w.judge(&want.model_path, at.as_deref()));
        }
    }
    findings.extend(verifiable(t));
    findings.extend(t.conflicts.iter().cloned());
    findings
}

/// Whether apply can verify the server at all: its HTTP checks speak plain HTTP, through a port
/// forward to the address the server binds. A server with `--ssl-certfile` serves HTTPS only, so
/// every restart would fail readiness and be rolled back: refuse it before the restart instead.
fn verifiable(t: &Target) -> Option<Finding> {
    let (_, flags) = flags(&t.desired.model.exec_start);
    flags.contains_key("ssl-certfile").then(|| {
        Finding::error(
            "verify",
            "the server serves HTTPS (--ssl-certfile) and reconcile verifies over plain HTTP only: \
             apply cannot verify it, so it would roll every restart back; serve plain HTTP on \
             loopback, or leave this unit out of reconcile apply for now"
                .to_string(),
        )
    })
}

/// The findings for a unit with nothing to change: its Python and SGLang version, and the claims
/// the manifests make on its host's GPUs and port (found offline).
pub fn judge_unchanged(t: &Target, installed: &Python) -> Vec<Finding> {
    let mut findings = python(t, &Want::of(t), installed);
    findings.extend(t.conflicts.iter().cloned());
    findings
}

fn python(t: &Target, want: &Want, python: &Python) -> Vec<Finding> {
    let py = &want.python;
    match python {
        Python::NotExecutable => vec![Finding::error(
            "python",
            format!("{py} does not exist on the host or is not executable"),
        )],
        Python::NoSglang => vec![Finding::error(
            "sglang-version",
            format!(
                "SGLang is not installed for {py} (the manifest says {})",
                want.version
            ),
        )],
        Python::Failed(why) => vec![Finding::error(
            "sglang-version",
            format!("cannot read the SGLang version of {py}: {why}"),
        )],
        // The trust check's own warning ([`owners::judge_owners`]) names the paths.
        Python::Untrusted(_) => vec![Finding::warning(
            "sglang-version",
            format!(
                "reconcile did not start {py} as root, since another user can change what it \
                 runs: its SGLang version and flags are unchecked on this host"
            ),
        )],
        Python::Sglang(installed) if installed.trim() == want.version.trim() => Vec::new(),
        Python::Sglang(installed) => {
            let mut findings = vec![Finding::error(
                "sglang-version",
                format!(
                    "the manifest says SGLang {} but {py} on the host has SGLang {installed}",
                    want.version
                ),
            )];
            findings.extend(flags_against(t, installed));
            findings
        }
    }
}

/// The manifest's flags and env against the catalog of the version the host really has, kept to
/// what this host runs (service-wide fields and this host's overrides).
fn flags_against(t: &Target, installed: &str) -> Vec<Finding> {
    let m = &t.manifest;
    let Some(catalog) = Catalog::for_version(installed) else {
        return vec![Finding::warning(
            "flags",
            format!(
                "no catalog of SGLang {installed}'s flags (known: {}), so the flags were not checked against the installed version (--deep asks the host's SGLang)",
                Catalog::versions().collect::<Vec<_>>().join(", ")
            ),
        )];
    };
    // `hosts[i].` (`nodes[i].` for a server group): the host entries' fields.
    let key = m.hosts_key();
    let own = m
        .hosts
        .iter()
        .position(|h| h.name == t.host)
        .map(|i| format!("{key}[{i}]."));
    let any_host = format!("{key}[");
    sglang::check(m, &m.text, catalog)
        .findings
        .into_iter()
        .filter(|f| {
            !f.field.starts_with(&any_host) || own.as_ref().is_some_and(|o| f.field.starts_with(o))
        })
        .map(|f| {
            let severity = match f.severity {
                sglang::Severity::Error => Severity::Error,
                sglang::Severity::Warning => Severity::Warning,
            };
            let at = f.position.map_or(String::new(), |p| {
                format!(" ({}:{}:{})", f.file, p.line, p.column)
            });
            Finding {
                severity,
                check: "flags",
                message: format!(
                    "installed SGLang {installed}: {}{at}: {}",
                    f.field, f.message
                ),
            }
        })
        .collect()
}

fn model_path(want: &Want, access: Access) -> Option<Finding> {
    let path = &want.model_path;
    match access {
        Access::Readable => None,
        Access::Missing => Some(Finding::error(
            "model-path",
            format!("the model path {path} does not exist on the host"),
        )),
        Access::Unreadable => Some(Finding::error(
            "model-path",
            format!("the model path {path} exists but cannot be read"),
        )),
    }
}

fn gpus(want: &Want, gpus: &Gpus) -> Vec<Finding> {
    let need = want.gpus;
    let why = &want.gpus_why;
    let mut findings = Vec::new();
    let listed = match gpus {
        Gpus::Listed(listed) => Some(listed),
        Gpus::Unknown(reason) => {
            findings.push(Finding::warning(
                "gpus",
                format!("cannot count GPUs: {reason}"),
            ));
            None
        }
    };
    if let Some(listed) = listed.filter(|l| (l.len() as u32) < need) {
        findings.push(Finding::error(
            "gpus",
            format!(
                "{why} needs {need} GPUs but the host has {} (nvidia-smi -L)",
                listed.len()
            ),
        ));
    }
    let Some(visible) = &want.visible else {
        return findings;
    };
    let shown = visible.join(",");
    if (visible.len() as u32) < need {
        findings.push(Finding::error(
            "cuda-visible-devices",
            format!(
                "CUDA_VISIBLE_DEVICES=\"{shown}\" lists {} devices but {why} needs {need}",
                visible.len()
            ),
        ));
    }
    if let Some(listed) = listed {
        // CUDA stops reading the list at the first entry it cannot find.
        if let Some(missing) = visible.iter().find(|d| !exists(d, listed)) {
            let have = match listed.len() {
                0 => "no GPUs".to_string(),
                n => format!("GPUs 0-{}", n - 1),
            };
            findings.push(Finding::error(
                "cuda-visible-devices",
                format!("CUDA_VISIBLE_DEVICES=\"{shown}\" names GPU {missing}, which the host does not have (it has {have}); CUDA ignores it and every entry after it"),
            ));
        }
    }
    findings
}

/// An index, a GPU UUID (or a unique prefix of one, as CUDA accepts), or a MIG device (not
/// listed by `nvidia-smi -L` as such, so taken on trust).
fn exists(device: &str, gpus: &[Gpu]) -> bool {
    if let Ok(index) = device.parse::<u32>() {
        return gpus.iter().any(|g| g.index == index);
    }
    if device.starts_with("MIG-") {
        return true;
    }
    device.starts_with("GPU-") && gpus.iter().filter(|g| g.uuid.starts_with(device)).count() == 1
}

/// Whether port `number` is free for `unit`: a listener outside the unit's cgroup is an error (a
/// warning when `ss` cannot name it). The server's own port, and a server group's rendezvous port
/// on rank 0 ([`rendezvous_port`]).
fn port(unit: &str, number: u16, port: &Port, main_pid: u32) -> Vec<Finding> {
    let listeners = match port {
        Port::Listeners { listeners, .. } => listeners,
        Port::Unknown(reason) => {
            return vec![Finding::warning(
                "port",
                format!("cannot check whether port {} is free: {reason}", number),
            )]
        }
    };
    let mut findings = Vec::new();
    for l in listeners.iter().filter(|l| !belongs(l, unit, main_pid)) {
        findings.push(match l.pid {
            Some(pid) => Finding::error(
                "port",
                format!(
                    "port {} is already taken by {} (pid {pid}), which is not {}",
                    number, l.comm, unit
                ),
            ),
            None => Finding::warning(
                "port",
                format!(
                    "port {} is in use by a process ss does not name (not root?), maybe not {}",
                    number, unit
                ),
            ),
        });
    }
    findings
}

/// A server port the kernel may hand to an outgoing connection as its source port: whatever
/// connection on the host holds it when the server starts (or a probe of the closed port that
/// connects to itself) fails the start with `Address already in use`, after the old server
/// stopped. A warning: it fails rarely, and the cure is the host's (a reserved port).
fn ephemeral_port(number: u16, port: &Port) -> Option<Finding> {
    let Port::Listeners {
        ephemeral: Some(e), ..
    } = port
    else {
        return None;
    };
    e.may_take(number).then(|| {
        Finding::warning(
            "port",
            format!(
                "port {number} is inside the host's ephemeral port range ({}-{}) and not reserved: an outgoing connection may take it as its source port, and the server then fails to start with 'Address already in use'; reserve it (net.ipv4.ip_local_reserved_ports, in /etc/sysctl.d) or use a port below {}",
                e.low, e.high, e.low
            ),
        )
    })
}

/// Rank 0 of a server group: the rendezvous port (`--dist-init-addr`'s, where rank 0's torch
/// `TCPStore` listens) must be free, or every rank fails its distributed init. A listener of the
/// unit itself (the running group) is fine: it goes away with the restart.
pub fn rendezvous_port(unit: &str, number: u16, listeners: &Port, main_pid: u32) -> Vec<Finding> {
    port(unit, number, listeners, main_pid)
        .into_iter()
        .map(|f| Finding {
            message: format!(
                "{} (the server group's rendezvous, sglang.dist_init_port)",
                f.message
            ),
            ..f
        })
        .collect()
}

/// The unit's main process, or any process in its cgroup (SGLang's workers are its children).
fn belongs(l: &Listener, unit: &str, main_pid: u32) -> bool {
    if main_pid != 0 && l.pid == Some(main_pid) {
        return true;
    }
    let marker = format!("/system.slice/{unit}");
    l.cgroup.match_indices(&marker).any(|(at, _)| {
        let rest = &l.cgroup[at + marker.len()..];
        rest.is_empty() || rest.starts_with('/') || rest.starts_with(char::is_whitespace)
    })
}

/// `nvidia-smi -L`: `GPU 0: NAME (UUID: GPU-...)` lines; other lines (MIG devices) are skipped.
pub fn parse_gpu_list(output: &str) -> Vec<Gpu> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(':')?;
            let uuid = rest
                .rsplit_once("(UUID: ")
                .map_or("", |(_, u)| u.trim_end().trim_end_matches(')'));
            Some(Gpu {
                index: index.trim().parse().ok()?,
                uuid: uuid.to_string(),
            })
        })
        .collect()
}

/// The gatherer's port script output: `ss -Htlnp` lines, a `#cgroups` line, then
/// `<pid> <cgroup lines joined>` per listening pid.
pub fn parse_listeners(output: &str) -> Vec<Listener> {
    let (ss, cgroups) = output.split_once("#cgroups\n").unwrap_or((output, ""));
    let cgroups: BTreeMap<u32, &str> = cgroups
        .lines()
        .filter_map(|l| {
            let (pid, cgroup) = l.split_once(' ').unwrap_or((l, ""));
            Some((pid.parse().ok()?, cgroup.trim()))
        })
        .collect();
    let mut listeners: Vec<Listener> = Vec::new();
    for line in ss.lines().filter(|l| !l.trim().is_empty()) {
        let processes = users(line);
        if processes.is_empty() {
            listeners.push(Listener {
                pid: None,
                comm: String::new(),
                cgroup: String::new(),
            });
        }
        for (comm, pid) in processes {
            if listeners.iter().any(|l| l.pid == Some(pid)) {
                continue; // the same process on 0.0.0.0 and [::]
            }
            listeners.push(Listener {
                pid: Some(pid),
                comm,
                cgroup: cgroups.get(&pid).unwrap_or(&"").to_string(),
            });
        }
    }
    listeners
}

/// The ephemeral range the listeners script prints after its cgroups: a `#ephemeral` line, then
/// the sysctls' own text, `LOW<tab>HIGH` and the reserved ports (`30000-39999,8080`, empty for
/// none).
pub fn parse_ephemeral(output: &str) -> Option<Ephemeral> {
    let (_, after) = output.split_once("#ephemeral\n")?;
    let mut lines = after.lines();
    let mut range = lines.next()?.split_whitespace().map(|w| w.parse::<u16>());
    let (Some(Ok(low)), Some(Ok(high))) = (range.next(), range.next()) else {
        return None;
    };
    let mut reserved = Vec::new();
    for item in lines
        .next()
        .unwrap_or("")
        .trim()
        .split(',')
        .filter(|i| !i.is_empty())
    {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        if let (Ok(a), Ok(b)) = (a.trim().parse(), b.trim().parse()) {
            reserved.push((a, b));
        }
    }
    Some(Ephemeral {
        low,
        high,
        reserved,
    })
}

/// `users:(("python3",pid=12,fd=3),("x",pid=13,fd=3))` -> [("python3", 12), ("x", 13)].
fn users(line: &str) -> Vec<(String, u32)> {
    let Some((_, users)) = line.split_once("users:(") else {
        return Vec::new();
    };
    users
        .split("(\"")
        .filter_map(|part| {
            let (comm, rest) = part.split_once("\",pid=")?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            Some((comm.to_string(), digits.parse().ok()?))
        })
        .collect()
}

/// The last line of a command's stderr with text on it: a host script's own words for why it
/// failed, read by the survey and the checks alike.
pub fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::testing::assert_starts;

    pub(crate) fn manifest(service: &str, host: &str, extra: &str) -> String {
        format!(
            "service: {service}\nhosts: [{host}]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 30000\n  flags:\n    tp-size: 2\n{extra}"
        )
    }

    pub(crate) fn targets(texts: &[(&str, &str)]) -> Vec<Target> {
        let manifests: Vec<_> = texts
            .iter()
            .map(|(name, text)| parse(name, text).unwrap())
            .collect();
        crate::targets::targets(&manifests, &Default::default()).unwrap()
    }

    fn target(text: &str) -> Target {
        targets(&[("m.yaml", text)]).remove(0)
    }

    fn gpus(n: u32) -> Gpus {
        Gpus::Listed(
            (0..n)
                .map(|index| Gpu {
                    index,
                    uuid: format!("GPU-0000-{index:04}"),
                })
                .collect(),
        )
    }

    pub(crate) fn healthy() -> Facts {
        Facts {
            python: Python::Sglang("0.5.23".into()),
            model_path: Access::Readable,
            gpus: gpus(8),
            port: Port::free(),
            main_pid: 0,
            deep: None,
            weights: None,
        }
    }

    /// What the preflight finds for service `s` on host `h` with `flags`, given `facts`.
    fn judged(flags: &str, facts: Facts) -> Vec<Finding> {
        judge(&target(&manifest("s", "h", flags)), &facts)
    }

    /// [`healthy`], with SGLang `version` installed.
    fn with_sglang(version: &str) -> Facts {
        Facts {
            python: Python::Sglang(version.into()),
            ..healthy()
        }
    }

    pub(crate) fn messages(findings: &[Finding], check: &str) -> Vec<String> {
        findings
            .iter()
            .filter(|f| f.check == check)
            .map(|f| f.message.clone())
            .collect()
    }

    #[test]
    fn a_healthy_host_has_nothing_to_say() {
        assert_eq!(
            judged("env: { CUDA_VISIBLE_DEVICES: \"0,1\" }\n", healthy()),
            []
        );
    }

    #[test]
    fn an_https_server_is_refused_because_apply_could_not_verify_it() {
        let findings = judged(
            "    ssl-certfile: /etc/ssl/s.pem\n    ssl-keyfile: /etc/ssl/s.key\n",
            healthy(),
        );
        let verify = messages(&findings, "verify");
        assert_eq!(verify.len(), 1, "{findings:?}");
        assert!(verify[0].contains("--ssl-certfile"), "{verify:?}");
        assert!(has_errors(&findings));
    }

    #[test]
    fn a_version_mismatch_names_both_and_checks_the_flags_against_the_installed_one() {
        // --enable-tf32-matmul is new in 0.5.23; 0.5.9 would refuse it.
        let findings = judged("    enable-tf32-matmul: true\n", with_sglang("0.5.9"));
        assert_eq!(
            messages(&findings, "sglang-version"),
            ["the manifest says SGLang 0.5.23 but /venv/bin/python3 on the host has SGLang 0.5.9"]
        );
        let flags = messages(&findings, "flags");
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(
            flags[0].starts_with("installed SGLang 0.5.9: sglang.flags.enable-tf32-matmul (m.yaml:10:5): SGLang 0.5.9 has no flag --enable-tf32-matmul"),
            "{}",
            flags[0]
        );
        assert!(has_errors(&findings));
    }

    #[test]
    fn an_installed_version_without_a_catalog_is_a_warning() {
        let findings = judged("", with_sglang("0.7.0"));
        let flags: Vec<&Finding> = findings.iter().filter(|f| f.check == "flags").collect();
        assert_eq!(flags.len(), 1);
        assert_eq!(flags[0].severity, Severity::Warning);
        assert!(flags[0]
            .message
            .starts_with("no catalog of SGLang 0.7.0's flags"));
    }

    #[test]
    fn no_python_or_no_sglang_is_an_error() {
        for (python, expected) in [
            (
                Python::NotExecutable,
                "/venv/bin/python3 does not exist on the host or is not executable",
            ),
            (
                Python::NoSglang,
                "SGLang is not installed for /venv/bin/python3 (the manifest says 0.5.23)",
            ),
        ] {
            let findings = judged(
                "",
                Facts {
                    python,
                    ..healthy()
                },
            );
            assert_eq!(findings.len(), 1);
            assert_eq!(findings[0].severity, Severity::Error);
            assert_eq!(findings[0].message, expected);
        }
    }

    #[test]
    fn a_truncated_shard_of_a_restarting_unit_is_an_error_at_its_model_path() {
        let t = target(&manifest("s", "gpu-a", ""));
        let weights = read_weights(r#"{"files": ["model-00002-of-00002.safetensors"], "bytes": 10, "problems": [{"file": "model-00002-of-00002.safetensors", "problem": "is missing"}]}"#).unwrap();
        let facts = Facts {
            weights: Some(WeightsCheck::Read(weights)),
            ..healthy()
        };
        let findings = judge(&t, &facts);
        let errors = messages(&findings, "weights");
        assert_eq!(errors.len(), 1, "{findings:?}");
        assert!(
            errors[0].starts_with("m.yaml:6:3: sglang.model_path: the model's weights would not load: /models/m/model-00002-of-00002.safetensors is missing"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_missing_model_path_is_an_error() {
        let findings = judged(
            "",
            Facts {
                model_path: Access::Missing,
                ..healthy()
            },
        );
        assert_eq!(
            messages(&findings, "model-path"),
            ["the model path /models/m does not exist on the host"]
        );
    }

    #[test]
    fn too_few_gpus_for_tp_times_dp_times_pp() {
        let t = target(&manifest("s", "h", "    dp-size: 2\n    pp-size: 2\n"));
        let findings = judge(
            &t,
            &Facts {
                gpus: gpus(4),
                ..healthy()
            },
        );
        assert_eq!(
            messages(&findings, "gpus"),
            ["tp-size 2 × dp-size 2 × pp-size 2 needs 8 GPUs but the host has 4 (nvidia-smi -L)"]
        );
        assert!(judge(&t, &healthy()).is_empty());
    }

    #[test]
    fn dp_attention_and_nodes_change_the_count() {
        let flags = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(gpus_needed(&flags(&[])).0, 1);
        assert_eq!(
            gpus_needed(&flags(&[("tensor-parallel-size", "4"), ("dp", "2")])).0,
            8
        );
        assert_eq!(
            gpus_needed(&flags(&[
                ("tp-size", "8"),
                ("dp-size", "8"),
                ("enable-dp-attention", "")
            ]))
            .0,
            8
        );
        assert_eq!(
            gpus_needed(&flags(&[("tp-size", "16"), ("nnodes", "2")])).0,
            8
        );
        assert_eq!(gpus_needed(&flags(&[("tp-size", "x")])).0, 1);
    }

    #[test]
    fn no_nvidia_smi_is_a_warning() {
        let findings = judged(
            "",
            Facts {
                gpus: Gpus::Unknown("nvidia-smi is not installed".into()),
                ..healthy()
            },
        );
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].severity, Severity::Warning);
        assert_eq!(
            findings[0].message,
            "cannot count GPUs: nvidia-smi is not installed"
        );
    }

    #[test]
    fn cuda_visible_devices_too_short_or_naming_a_missing_gpu() {
        let findings = judged(
            "    tp-size: 4\nenv: { CUDA_VISIBLE_DEVICES: \"6,7,8\" }\n",
            healthy(),
        );
        assert_eq!(
            messages(&findings, "cuda-visible-devices"),
            [
                "CUDA_VISIBLE_DEVICES=\"6,7,8\" lists 3 devices but tp-size 4 × dp-size 1 × pp-size 1 needs 4",
                "CUDA_VISIBLE_DEVICES=\"6,7,8\" names GPU 8, which the host does not have (it has GPUs 0-7); CUDA ignores it and every entry after it",
            ]
        );
        let empty = target(&manifest("s", "h", "env: { CUDA_VISIBLE_DEVICES: \"\" }\n"));
        assert_eq!(
            messages(&judge(&empty, &healthy()), "cuda-visible-devices").len(),
            1
        );
    }

    #[test]
    fn gpu_uuids_are_found_by_prefix() {
        let findings = judged(
            "env: { CUDA_VISIBLE_DEVICES: \"GPU-0000-0003,GPU-0000-00\" }\n",
            healthy(),
        );
        // The second is a prefix of every UUID: ambiguous, so CUDA cannot use it.
        assert_eq!(messages(&findings, "cuda-visible-devices").len(), 1);
        assert!(
            findings[0].message.contains("names GPU GPU-0000-00,"),
            "{findings:?}"
        );
    }

    fn listener(pid: u32, comm: &str, cgroup: &str) -> Listener {
        Listener {
            pid: Some(pid),
            comm: comm.into(),
            cgroup: cgroup.into(),
        }
    }

    #[test]
    fn a_port_the_kernel_may_give_an_outgoing_connection_is_a_warning_until_reserved() {
        // The manifest's port: 30000.
        let port = 30000;
        let on = |listed: &str| {
            let facts = Facts {
                port: Port::Listeners {
                    listeners: Vec::new(),
                    ephemeral: parse_ephemeral(listed),
                },
                ..healthy()
            };
            judged("", facts)
                .into_iter()
                .filter(|f| f.check == "port")
                .map(|f| f.message)
                .collect::<Vec<_>>()
        };
        let range = |low: u16| format!("#cgroups\n#ephemeral\n{low}\t60999\n\n");
        let warned = on(&range(port));
        assert_starts(&warned, &[&format!(
                "port {port} is inside the host's ephemeral port range ({port}-60999) and not reserved"
            )]);
        // Reserved (a range, or the port alone), below the range, or a range that cannot be
        // read: nothing to say.
        let reserved = format!("#ephemeral\n{port} 60999\n8080,{}-{}\n", port - 1, port + 1);
        assert!(on(&reserved).is_empty());
        let alone = format!("#ephemeral\n{port} 60999\n{port}\n");
        assert!(on(&alone).is_empty());
        assert!(on(&range(port + 1)).is_empty());
        assert!(on("#cgroups\n").is_empty());
        assert!(on("#ephemeral\nx 60999\n").is_empty());
    }

    #[test]
    fn a_port_held_by_another_process_is_an_error_and_by_this_unit_is_not() {
        let held = |l: Listener, main_pid: u32| {
            judged(
                "",
                Facts {
                    port: Port::Listeners {
                        listeners: vec![l],
                        ephemeral: None,
                    },
                    main_pid,
                    ..healthy()
                },
            )
        };
        let other = held(
            listener(77, "python3", "0::/system.slice/t-pre-squatter.service"),
            0,
        );
        assert_eq!(
            messages(&other, "port"),
            ["port 30000 is already taken by python3 (pid 77), which is not s.service"]
        );
        // The unit's main process, or a child in its cgroup (behind a container's prefix).
        assert!(held(listener(12, "python3", ""), 12).is_empty());
        assert!(held(
            listener(13, "python3", "0::/hostlab/rl3/system.slice/s.service"),
            12
        )
        .is_empty());
        // A unit whose name only starts the same is someone else.
        assert_eq!(
            messages(
                &held(listener(14, "x", "0::/system.slice/s.service2"), 0),
                "port"
            )
            .len(),
            1
        );
        let unknown = held(
            Listener {
                pid: None,
                comm: String::new(),
                cgroup: String::new(),
            },
            0,
        );
        assert_eq!(unknown[0].severity, Severity::Warning);
    }

    #[test]
    fn the_deep_check_refusing_is_an_error() {
        let refused = Deep::Refused(Refusal::new(
            "arguments",
            None,
            "launch_server.py: error: unrecognized arguments: --x",
        ));
        let findings = judged(
            "",
            Facts {
                deep: Some(refused),
                ..healthy()
            },
        );
        assert_eq!(
            messages(&findings, "deep"),
            ["the host's SGLang refuses s.service's arguments: launch_server.py: error: unrecognized arguments: --x"]
        );
    }

    #[test]
    fn reads_nvidia_smi_list_and_ss_output() {
        let gpus = parse_gpu_list("GPU 0: NVIDIA H100 (UUID: GPU-aaaa)\n  MIG 1g.10gb Device 0: (UUID: MIG-bbbb)\nGPU 1: NVIDIA H100 (UUID: GPU-cccc)\n");
        assert_eq!(
            gpus,
            [
                Gpu {
                    index: 0,
                    uuid: "GPU-aaaa".into()
                },
                Gpu {
                    index: 1,
                    uuid: "GPU-cccc".into()
                }
            ]
        );
        let ss = "LISTEN 0 5 127.0.0.1:33000 0.0.0.0:* users:((\"python3\",pid=812,fd=3))\n\
                  LISTEN 0 5 [::]:33000 [::]:* users:((\"python3\",pid=812,fd=4),(\"worker\",pid=813,fd=4))\n\
                  #cgroups\n812 0::/system.slice/t-pre-squatter.service\n813 0::/user.slice\n";
        assert_eq!(
            parse_listeners(ss),
            [
                listener(812, "python3", "0::/system.slice/t-pre-squatter.service"),
                listener(813, "worker", "0::/user.slice"),
            ]
        );
        assert_eq!(parse_listeners("#cgroups\n"), []);
        assert_eq!(
            parse_listeners("LISTEN 0 5 *:1 *:*\n#cgroups\n")[0].pid,
            None
        );
    }
}
