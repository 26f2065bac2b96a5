//! The harness: the test hosts `tests/run.sh` booted, and a fluent runner for the binary.
//!
//! Hosts are shared by every test, so each test uses its own unit names; tests that count what
//! happens on a host (SSH logins) have a host of their own.

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub use crate::builder::Manifest;

/// What a test file holds on the test hosts, so that two files never collide: its hosts, the
/// ports its units listen on or its plans name (preflight fails a plan whose port another server
/// listens on), and the stand-in GPUs its servers run on (the stand-in's GPU memory is per GPU
/// and host-wide: another test's server on a shared GPU reads as progress, or leaving it as a
/// dead rank). `gpus` is empty when the file starts no server there. A file may hold several
/// leases; [`leases_never_overlap`] checks the table.
#[derive(Debug)]
pub struct Lease {
    /// The test file(s) holding it, and why when it is not obvious.
    pub user: &'static str,
    pub hosts: &'static [&'static str],
    pub ports: Range<u16>,
    pub gpus: Range<u32>,
}

/// A lease of ports only: its tests plan, or run servers that take no GPU.
const NO_GPUS: Range<u32> = 0..0;

impl Lease {
    /// The lease's first host.
    pub const fn host(&self) -> &'static str {
        self.hosts[0]
    }

    /// `CUDA_VISIBLE_DEVICES` for `port`'s server, where the lease hands out two GPUs a port in
    /// order: its first port gets the first two.
    pub fn gpu_pair(&self, port: u16) -> String {
        assert!(
            self.ports.contains(&port),
            "port {port} is outside {}'s lease {:?} on {:?}",
            self.user,
            self.ports,
            self.hosts
        );
        let first = self.gpus.start + 2 * u32::from(port - self.ports.start);
        assert!(
            first + 2 <= self.gpus.end,
            "{}'s lease {:?} on {:?} has no two GPUs for port {port}",
            self.user,
            self.gpus,
            self.hosts
        );
        format!("{first},{}", first + 1)
    }
}

/// The lease on `host` that holds `port`.
pub fn lease_of(host: &str, port: u16) -> &'static Lease {
    LEASES
        .iter()
        .find(|l| l.hosts.contains(&host) && l.ports.contains(&port))
        .unwrap_or_else(|| panic!("no lease on {host} holds port {port}: add one to lab::LEASES"))
}

/// Plans only, at the builder's default port (30000): dry_run.rs and security.rs, on the shared
/// host, the counted host and five of the fleet's.
pub const DEFAULT_PORT_PLANS: Lease = Lease {
    user: "dry_run.rs, security.rs (plans only, the builder's default port)",
    hosts: &["rl1", "rl2", "rl5", "rl6", "rl7", "rl8", "rl9"],
    ports: 30000..30001,
    gpus: NO_GPUS,
};
/// The shared host's leases: `reconcile status`, `history` and `rollback` (status.rs).
pub const STATUS: Lease = Lease {
    user: "status.rs",
    hosts: &["rl1"],
    ports: 35000..35006,
    gpus: 10..20,
};
/// The guide's lab blocks (docs_guide.rs runs docs/guide.md's `t-docs-*` units).
pub const DOCS_GUIDE: Lease = Lease {
    user: "docs_guide.rs (docs/guide.md's units)",
    hosts: &["rl1"],
    ports: 37601..37610,
    gpus: 44..46,
};
/// Plan files (plan_file.rs): servers on the apply host (one also on the shared host) at 39101-39103,
/// two GPUs each; 39104-39105 plan and refuse, starting nothing.
pub const PLAN_FILE: Lease = Lease {
    user: "plan_file.rs",
    hosts: &["rl4", "rl1"],
    ports: 39101..39106,
    gpus: 58..64,
};
/// Host for tests that do not care which.
pub const SHARED: &str = DEFAULT_PORT_PLANS.hosts[0];
/// Host whose sshd log one test counts logins in; nothing else may connect to it.
pub const COUNTED: &str = DEFAULT_PORT_PLANS.hosts[1];
/// Host for the escaping round trip through systemd (systemd_escaping.rs: sixteen servers on
/// ports 31000-31015, all on GPUs 0-1), and preflight.rs's plans.
pub const ESCAPING_LEASE: Lease = Lease {
    user: "systemd_escaping.rs",
    hosts: &["rl3"],
    ports: 31000..31016,
    gpus: 0..2,
};
pub const ESCAPING: &str = ESCAPING_LEASE.host();
/// Apply tests on the apply host: apply.rs's `service` (also real_sglang.rs's) takes each
/// port's two GPUs from these ([`lease_of`], [`Lease::gpu_pair`]), in blocks around the ports no
/// test uses (32009-32010, 32026, 32029), so that security.rs and plan_file.rs have GPUs too.
pub const APPLY_1: Lease = Lease {
    user: "apply.rs, real_sglang.rs (apply::service)",
    hosts: &["rl4"],
    ports: 32001..32009,
    gpus: 0..16,
};
pub const APPLY_2: Lease = Lease {
    user: "apply.rs, real_sglang.rs (apply::service)",
    hosts: &["rl4"],
    ports: 32011..32026,
    gpus: 16..46,
};
pub const APPLY_3: Lease = Lease {
    user: "real_sglang.rs (apply::service)",
    hosts: &["rl4"],
    ports: 32027..32029,
    gpus: 46..50,
};
pub const APPLY_4: Lease = Lease {
    user: "real_sglang.rs (apply::service)",
    hosts: &["rl4"],
    ports: 32030..32032,
    gpus: 50..54,
};
/// Host where apply tests start and roll back services.
pub const APPLY: &str = APPLY_1.host();
/// Secrets and metacharacters (security.rs) on the apply host.
pub const SECURITY: Lease = Lease {
    user: "security.rs",
    hosts: &["rl4"],
    ports: 38001..38007,
    gpus: 54..58,
};
/// Fleets (fleet.rs): rolling apply over six hosts of their own.
pub const FLEET_LEASE: Lease = Lease {
    user: "fleet.rs",
    hosts: &["rl10", "rl5", "rl6", "rl7", "rl8", "rl9"],
    ports: 34001..34005,
    gpus: 0..8,
};
/// Faults in the host under an apply (faults.rs): a host to break, and the host the reboot fault
/// reboots (tests/hostlab/reboot.sh); nothing else may use either.
pub const FAULTS: Lease = Lease {
    user: "faults.rs",
    hosts: &["rl11"],
    ports: 37001..37005,
    gpus: 0..2,
};
pub const REBOOT_LEASE: Lease = Lease {
    user: "faults.rs (the reboot)",
    hosts: &["rl12"],
    ports: 37101..37103,
    gpus: 0..2,
};
pub const REBOOT: &str = REBOOT_LEASE.host();
/// Host where `reconcile agent` runs on the host itself, pulling from a git repository there.
pub const AGENT_LEASE: Lease = Lease {
    user: "agent.rs",
    hosts: &["rl13"],
    ports: 33001..33002,
    gpus: 0..2,
};
pub const AGENT: &str = AGENT_LEASE.host();
/// Host whose nvidia-smi and systemctl the hang tests wedge on purpose; nothing else may use it.
pub const HANGS_LEASE: Lease = Lease {
    user: "hangs.rs",
    hosts: &["rl14"],
    ports: 36001..36007,
    gpus: 0..12,
};
pub const HANGS: &str = HANGS_LEASE.host();
/// The throughput gate, learned load times and failure diagnoses (issue 14), on one host.
pub const DIAGNOSIS: Lease = Lease {
    user: "diagnosis.rs",
    hosts: &["rl15"],
    ports: 37001..37010,
    gpus: 0..10,
};
pub const BENCHMARK: Lease = Lease {
    user: "benchmark.rs",
    hosts: &["rl15"],
    ports: 37011..37020,
    gpus: 10..30,
};
pub const LEARNED: Lease = Lease {
    user: "learned.rs",
    hosts: &["rl15"],
    ports: 37021..37030,
    gpus: 30..40,
};
pub const THROUGHPUT: &str = BENCHMARK.host();
/// `reconcile apply` on a real terminal (pty.rs).
pub const PTY_LEASE: Lease = Lease {
    user: "pty.rs",
    hosts: &["rl16"],
    ports: 37031..37040,
    gpus: 0..10,
};
pub const PTY: &str = PTY_LEASE.host();
/// Drain before a restart (issue 16): drain.rs's port `p` runs on GPUs `2 (p - 37101)` and one up.
pub const DRAIN_LEASE: Lease = Lease {
    user: "drain.rs",
    hosts: &["rl17"],
    ports: 37101..37110,
    gpus: 0..18,
};
pub const DRAIN: &str = DRAIN_LEASE.host();
/// Zero-downtime rollouts (issue 16): the host running the real sglang-router (a systemd unit the
/// router tests start), and the three replica hosts behind it. The lab must be booted with
/// `ROUTE=1` (tests/hostlab/up.sh) so the router host reaches the replicas. The router's users
/// take turns (`router::TURN`).
pub const ROUTER_LEASE: Lease = Lease {
    user: "router.rs, group.rs, real_server/rollout.rs (the router, taking turns)",
    hosts: &["rl18"],
    ports: 30100..30101,
    gpus: NO_GPUS,
};
pub const REPLICAS_LEASE: Lease = Lease {
    user: "router.rs (the replicas)",
    hosts: &["rl19", "rl20", "rl21"],
    ports: 30000..30001,
    gpus: 0..2,
};
pub const ROUTER: &str = ROUTER_LEASE.host();
pub const REPLICAS: [&str; 3] = [
    REPLICAS_LEASE.hosts[0],
    REPLICAS_LEASE.hosts[1],
    REPLICAS_LEASE.hosts[2],
];
/// Server groups (group.rs): one server over these two hosts, rank 0 first (server port, then the
/// rendezvous port one above; GPU `(port - 37501) / 2`). The lab must be booted with `ROUTE=1` so
/// the ranks reach each other.
pub const GROUP_LEASE: Lease = Lease {
    user: "group.rs",
    hosts: &["rl22", "rl23"],
    ports: 37501..37527,
    gpus: 0..14,
};
/// The host's guard (guard.rs): its tests kill the controller; a host of their own.
pub const GUARD: Lease = Lease {
    user: "guard.rs",
    hosts: &["rl35"],
    ports: 37601..37607,
    gpus: 0..12,
};
/// The crash matrix (crash.rs): each cell reboots its host or cuts its link, so it has one to
/// itself (a group's cell two); `tests/run.sh` boots these six for it. A group's ranks meet at
/// the port above the server's.
pub const CRASH: Lease = Lease {
    user: "crash.rs",
    hosts: &["rl36", "rl37", "rl38", "rl39", "rl40", "rl41"],
    ports: 37801..37803,
    gpus: 0..2,
};
pub const GROUP: [&str; 2] = [GROUP_LEASE.hosts[0], GROUP_LEASE.hosts[1]];
/// The real-SGLang tier's hosts (real_server/ keeps its own constants: these are data, for the
/// check): its servers run on the CPU, and its rollout is `router::SERVICE` on port 30000.
pub const REAL_SERVER: Lease = Lease {
    user: "real_server/ (CPU servers)",
    hosts: &["rl22", "rl23"],
    ports: 38001..38031,
    gpus: NO_GPUS,
};
pub const REAL_SERVER_ROLLOUT: Lease = Lease {
    user: "real_server/rollout.rs (router::SERVICE, CPU servers)",
    hosts: &["rl22", "rl23"],
    ports: 30000..30001,
    gpus: NO_GPUS,
};
/// The quality gate (quality.rs) and what systemd really runs (systemd_unit_files.rs), on one host.
pub const QUALITY: Lease = Lease {
    user: "quality.rs",
    hosts: &["rl24"],
    ports: 37311..37320,
    gpus: 52..57,
};
pub const SYSTEMD_UNIT_FILES: Lease = Lease {
    user: "systemd_unit_files.rs",
    hosts: &["rl24"],
    ports: 37301..37310,
    gpus: 57..64,
};
/// `reconcile import` (import.rs): hand-written units adopted.
pub const IMPORT_LEASE: Lease = Lease {
    user: "import.rs",
    hosts: &["rl25"],
    ports: 37201..37210,
    gpus: 40..58,
};
pub const IMPORT: &str = IMPORT_LEASE.host();
/// The Debian package installed, run and removed (package.rs): its unit's port, GPUs 60-61, the
/// package's own files in /usr and /lib.
pub const PACKAGE_LEASE: Lease = Lease {
    user: "package.rs",
    hosts: &["rl25"],
    ports: 37701..37702,
    gpus: 60..62,
};
/// node_exporter, run by package.rs on 127.0.0.1.
pub const PACKAGE_EXPORTER: Lease = Lease {
    user: "package.rs (node_exporter)",
    hosts: &["rl25"],
    ports: 39100..39101,
    gpus: NO_GPUS,
};
pub const PACKAGE: &str = PACKAGE_LEASE.host();
/// Pull agents rolling out together (coordinator.rs): the host running etcd (2379-2380; a copy
/// of its data on 2479-2480) and the git daemon (9418) the agents pull from, and the six hosts
/// whose agents coordinate through it (the tests take turns).
pub const ETCD: Lease = Lease {
    user: "coordinator.rs (etcd)",
    hosts: &["rl26"],
    ports: 2379..2381,
    gpus: NO_GPUS,
};
pub const ETCD_COPY: Lease = Lease {
    user: "coordinator.rs (the copy of etcd's data)",
    hosts: &["rl26"],
    ports: 2479..2481,
    gpus: NO_GPUS,
};
pub const GIT_DAEMON: Lease = Lease {
    user: "coordinator.rs (git daemon)",
    hosts: &["rl26"],
    ports: 9418..9419,
    gpus: NO_GPUS,
};
pub const FLEET_AGENTS: Lease = Lease {
    user: "coordinator.rs (the agents)",
    hosts: &["rl27", "rl28", "rl29", "rl30", "rl31", "rl32"],
    ports: 37401..37410,
    gpus: 0..2,
};
pub const COORDINATOR: &str = ETCD.host();
pub const FLEET: [&str; 6] = [
    FLEET_AGENTS.hosts[0],
    FLEET_AGENTS.hosts[1],
    FLEET_AGENTS.hosts[2],
    FLEET_AGENTS.hosts[3],
    FLEET_AGENTS.hosts[4],
    FLEET_AGENTS.hosts[5],
];
/// Experiments (experiment.rs): the host whose service an experiment's variants run on, and the
/// host of its real-SGLang variant set (real_server/experiment.rs, data here).
pub const EXPERIMENT_LEASE: Lease = Lease {
    user: "experiment.rs",
    hosts: &["rl33"],
    ports: 37511..37512,
    gpus: 0..1,
};
pub const EXPERIMENT_REAL_LEASE: Lease = Lease {
    user: "real_server/experiment.rs (CPU server)",
    hosts: &["rl34"],
    ports: 38051..38052,
    gpus: NO_GPUS,
};
pub const EXPERIMENT: &str = EXPERIMENT_LEASE.host();
/// Changes applied live (live.rs), on the experiments' host.
pub const LIVE: Lease = Lease {
    user: "live.rs",
    hosts: &["rl33"],
    ports: 37531..37532,
    gpus: 2..4,
};
/// The lab's hub (hub.rs: olah in rl42's network namespace, reached by every host that routes
/// the lab's subnet) and the pinned-weights tests' hosts (pinned.rs), a service a host.
pub const HUB_LEASE: Lease = Lease {
    user: "hub.rs (the lab's hub, olah)",
    hosts: &["rl42"],
    ports: 8090..8091,
    gpus: NO_GPUS,
};
pub const PINNED: Lease = Lease {
    user: "pinned.rs",
    hosts: &["rl43", "rl44", "rl45"],
    // 39201-39205 servers (a GPU pair each), 39209 the peers' serving port.
    ports: 39201..39210,
    gpus: 0..10,
};
pub const EXPERIMENT_REAL: &str = EXPERIMENT_REAL_LEASE.host();

/// Every lease; [`leases_never_overlap`] checks that no two on one host share a port or a GPU.
pub const LEASES: &[Lease] = &[
    DEFAULT_PORT_PLANS,
    Lease {
        user: "dry_run.rs (plans only)",
        hosts: &["rl2"],
        ports: 30001..30003,
        gpus: NO_GPUS,
    },
    Lease {
        user: "dry_run.rs (plans only)",
        hosts: &["rl1"],
        ports: 30411..30414,
        gpus: NO_GPUS,
    },
    STATUS,
    DOCS_GUIDE,
    PLAN_FILE,
    ESCAPING_LEASE,
    Lease {
        user: "preflight.rs (plans only)",
        hosts: &["rl3"],
        ports: 33000..33011,
        gpus: NO_GPUS,
    },
    Lease {
        user: "preflight.rs (the weights check's running server)",
        hosts: &["rl3"],
        ports: 33011..33012,
        gpus: 2..4,
    },
    Lease {
        user: "preflight.rs (plans only: the answers the host keeps)",
        hosts: &["rl3"],
        ports: 33012..33013,
        gpus: NO_GPUS,
    },
    APPLY_1,
    APPLY_2,
    APPLY_3,
    APPLY_4,
    SECURITY,
    FLEET_LEASE,
    FAULTS,
    REBOOT_LEASE,
    AGENT_LEASE,
    HANGS_LEASE,
    DIAGNOSIS,
    BENCHMARK,
    LEARNED,
    PTY_LEASE,
    DRAIN_LEASE,
    ROUTER_LEASE,
    REPLICAS_LEASE,
    GROUP_LEASE,
    GUARD,
    CRASH,
    REAL_SERVER,
    REAL_SERVER_ROLLOUT,
    QUALITY,
    SYSTEMD_UNIT_FILES,
    IMPORT_LEASE,
    PACKAGE_LEASE,
    PACKAGE_EXPORTER,
    ETCD,
    ETCD_COPY,
    GIT_DAEMON,
    FLEET_AGENTS,
    EXPERIMENT_LEASE,
    EXPERIMENT_REAL_LEASE,
    LIVE,
    HUB_LEASE,
    PINNED,
];

/// Entries of the lab's ssh_config that must fail.
pub const BAD_KEY: &str = "rl-badkey";
pub const UNREACHABLE: &str = "rl-unreachable";
/// Host 1 again, under a name whose known_hosts file starts empty.
pub const NEW_KEY: &str = "rl-newkey";

pub struct Lab {
    state: PathBuf,
    counted: Mutex<()>,
}

/// Why a lab test cannot run here, or `None` when the hosts are up.
fn missing() -> Option<String> {
    match std::env::var_os("RECONCILE_LAB") {
        None => Some("RECONCILE_LAB is not set: these tests need the throwaway test hosts; run them with `tests/run.sh` (as root)".to_string()),
        Some(state) if !PathBuf::from(&state).join("ssh_config").exists() => Some(format!(
            "no ssh_config in {}: are the test hosts up? `tests/run.sh` boots them",
            PathBuf::from(state).display()
        )),
        Some(_) => None,
    }
}

/// The lab; panics, saying how to run the test, when the hosts are not up.
pub fn lab() -> &'static Lab {
    lab_if_up().unwrap_or_else(|| panic!("{}", missing().unwrap_or_default()))
}

/// The lab when its hosts are up. For clean-ups in `Drop`: a second panic while a test unwinds
/// would abort every test after it.
pub fn lab_if_up() -> Option<&'static Lab> {
    static LAB: OnceLock<Option<Lab>> = OnceLock::new();
    LAB.get_or_init(|| {
        missing().is_none().then(|| Lab {
            state: PathBuf::from(std::env::var_os("RECONCILE_LAB").unwrap_or_default()),
            counted: Mutex::new(()),
        })
    })
    .as_ref()
}

impl Lab {
    pub fn ssh_config(&self) -> PathBuf {
        self.state.join("ssh_config")
    }

    /// A file of the lab's state folder (known_hosts files, keys).
    pub fn file(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// A host's address on its veth (`hosts.tsv`, written by up.sh).
    pub fn address(&self, host: &str) -> String {
        let tsv = std::fs::read_to_string(self.state.join("hosts.tsv")).expect("hosts.tsv");
        tsv.lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&host))
            .and_then(|f| f.get(1).map(|a| a.to_string()))
            .unwrap_or_else(|| panic!("{host} is not in hosts.tsv: boot more test hosts"))
    }

    /// Holds the counted host for one test at a time.
    pub fn exclusive(&self, host: &str) -> MutexGuard<'_, ()> {
        assert_eq!(
            host, COUNTED,
            "only the counted host is handed out exclusively"
        );
        self.counted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a shell script on a host as root; panics when it fails.
    pub fn sh(&self, host: &str, script: &str) -> String {
        let out = self.ssh(host, script, None);
        assert!(
            out.status.success(),
            "on {host}: {script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// Waits, on the host itself, until `condition` (a shell test) holds; panics after `within`.
    /// Tests wait for what they need to see rather than sleep a fixed time, which a loaded machine
    /// (a 2-core CI runner building while it tests) can outlast.
    pub fn wait_until(&self, host: &str, condition: &str, within: std::time::Duration) {
        let tries = (within.as_millis() / 100).max(1);
        let script = format!(
            "for i in $(seq {tries}); do if {condition}; then exit 0; fi; sleep 0.1; done; exit 1"
        );
        let out = self.ssh(host, &script, None);
        assert!(
            out.status.success(),
            "on {host}: `{condition}` did not hold within {within:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts one chat completion on `host`, to the server on its loopback `port` (its metrics on),
    /// in the background; `result` gets `STATUS MONOTONIC_END_SECONDS` (or `error ...`) when it
    /// ends. Waits until the server counts it. Every stream of the background job is redirected,
    /// or ssh would wait for it to end.
    pub fn slow_request(&self, host: &str, port: u16, result: &str) {
        let script = format!(
            r#"rm -f {result}; ( python3 -c '
import http.client, json, time
try:
    c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps({{"model": "test-model", "messages": [{{"role": "user", "content": "hi"}}]}}), headers={{"Content-Type": "application/json"}})
    r = c.getresponse()
    r.read()
    out = "%d %.3f" % (r.status, time.monotonic())
except Exception as e:
    out = "error %s %.3f" % (type(e).__name__, time.monotonic())
open("{result}.tmp", "w").write(out)
' && mv {result}.tmp {result} ) </dev/null >/dev/null 2>&1 &"#
        );
        self.sh(host, &script);
        let running = format!(
            r#"python3 -c 'import sys, urllib.request; b = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode(); sys.exit(0 if any(l.startswith("sglang:num_running_reqs") and not l.endswith(" 0.0") for l in b.splitlines()) else 1)' 2>/dev/null"#
        );
        // 30 s bounds a request that never reaches the server (it does within a second).
        self.wait_until(host, &running, std::time::Duration::from_secs(30));
    }

    /// The slow request's result, once it has ended: its status (or `error`) and when it ended.
    pub fn request_result(&self, host: &str, result: &str) -> (String, f64) {
        // 60 s bounds a request that never ends: the longest lasts 20 s.
        self.wait_until(
            host,
            &format!("[ -s {result} ]"),
            std::time::Duration::from_secs(60),
        );
        let text = self.sh(host, &format!("cat {result}"));
        let fields: Vec<&str> = text.split_whitespace().collect();
        let end = fields
            .last()
            .and_then(|t| t.parse().ok())
            .unwrap_or(f64::NAN);
        (fields[0].to_string(), end)
    }

    /// systemd's invocation ID of a unit: it changes with every start.
    pub fn invocation(&self, host: &str, unit: &str) -> String {
        self.sh(
            host,
            &format!("systemctl show -p InvocationID --value {unit}"),
        )
        .trim()
        .to_string()
    }

    /// systemd's properties of a unit (`systemctl show -p ...`), by name.
    pub fn show(
        &self,
        host: &str,
        unit: &str,
        properties: &[&str],
    ) -> std::collections::BTreeMap<String, String> {
        let out = self.sh(
            host,
            &format!("systemctl show -p {} {unit}", properties.join(",")),
        );
        out.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// One of systemd's `*TimestampMonotonic` properties of a unit, in seconds of CLOCK_MONOTONIC:
    /// when systemd itself saw it happen. The test hosts are containers of one kernel, without
    /// time namespaces, so these compare across hosts (and with [`Lab::clock`]); journald's
    /// timestamps do not: they are when journald read a line, seconds late on a loaded machine.
    pub fn monotonic(&self, host: &str, unit: &str, property: &str) -> f64 {
        let shown = self.show(host, unit, &[property]);
        let us: u64 = shown
            .get(property)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {property} of {unit} on {host}: {shown:?}"));
        us as f64 / 1e6
    }

    /// CLOCK_MONOTONIC on a host now, in seconds: the clock of [`Lab::monotonic`].
    pub fn clock(&self, host: &str) -> f64 {
        let out = self.sh(host, "python3 -c 'import time; print(time.monotonic())'");
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("CLOCK_MONOTONIC on {host}: {out}"))
    }

    /// How many times systemd started `unit` since its invocation `before` (its InvocationID
    /// then), counted from systemd's own "Started" messages (each names the invocation it
    /// started, `INVOCATION_ID`) in the order PID 1 wrote them, never from their timestamps.
    /// journald takes those in when it gets to them: this first waits until the message of the
    /// invocation running now is in.
    pub fn starts_after(&self, host: &str, unit: &str, before: &str) -> usize {
        let now = self.invocation(host, unit);
        let started = Self::started_messages(unit);
        if !now.is_empty() {
            // Bounds a journald that never catches up; it lags seconds at most, under full load.
            self.wait_until(
                host,
                &format!("{started} | grep -q '\"{now}\"'"),
                std::time::Duration::from_secs(30),
            );
        }
        let ids: Vec<String> = self
            .sh(host, &started)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|e| e["INVOCATION_ID"].as_str().map(str::to_string))
            .collect();
        let from = ids.iter().rposition(|id| id == before).unwrap_or_else(|| {
            panic!("on {host}: no start of {unit} as invocation {before:?} in its journal: {ids:?}")
        });
        let mut after: Vec<&String> = ids[from + 1..].iter().collect();
        after.dedup();
        after.len()
    }

    /// The shell command listing systemd's "Started" messages of `unit`, oldest first, as JSON
    /// lines (`MESSAGE_ID` SD_MESSAGE_UNIT_STARTED, written by PID 1; `INVOCATION_ID`, and
    /// `_SOURCE_REALTIME_TIMESTAMP`: when PID 1 logged it, not when journald read it).
    pub fn started_messages(unit: &str) -> String {
        format!(
            "journalctl UNIT={unit} _PID=1 MESSAGE_ID=39f53479d3a045ac8e11786248231fbf -o json \
             --output-fields=INVOCATION_ID,_SOURCE_REALTIME_TIMESTAMP --no-pager"
        )
    }

    /// The journal's cursor on a host now: what is written after it is read with
    /// [`Lab::journal_after`].
    pub fn cursor(&self, host: &str) -> String {
        let out = self.sh(host, "journalctl -n 0 --show-cursor -q");
        out.trim()
            .strip_prefix("-- cursor: ")
            .unwrap_or_else(|| panic!("no journal cursor on {host}: {out}"))
            .to_string()
    }

    /// `unit`'s lines (`-o cat`) written after `cursor`, once they hold every one of `needles`:
    /// journald takes in a process's lines when it gets to them, which on a loaded machine can be
    /// seconds after the process ended. Panics after `within`, showing what they held then.
    pub fn journal_after(
        &self,
        host: &str,
        unit: &str,
        cursor: &str,
        needles: &[&str],
        within: std::time::Duration,
    ) -> String {
        let read = format!("journalctl --no-pager -o cat -u {unit} --after-cursor='{cursor}'");
        let began = std::time::Instant::now();
        loop {
            let journal = self.sh(host, &read);
            if needles.iter().all(|n| journal.contains(n)) {
                return journal;
            }
            assert!(
                began.elapsed() < within,
                "on {host}: {unit}'s journal did not show {needles:?} within {within:?}:\n{journal}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Waits until the unit has been started again since it had invocation `before`: a restart
    /// happened and its verification is under way.
    pub fn wait_for_restart(&self, host: &str, unit: &str, before: &str) {
        self.wait_for_restart_within(host, unit, before, std::time::Duration::from_secs(60));
    }

    /// [`Lab::wait_for_restart`], bounded by `within` (a real server's apply runs the deep
    /// check, seconds of imports, before it restarts).
    pub fn wait_for_restart_within(
        &self,
        host: &str,
        unit: &str,
        before: &str,
        within: std::time::Duration,
    ) {
        self.wait_until(
            host,
            &format!("[ \"$(systemctl show -p InvocationID --value {unit})\" != '{before}' ]"),
            within,
        );
    }

    /// Removes a unit, its state folder and its deployment records from a host: what an earlier
    /// run of the same test left.
    pub fn remove_unit(&self, host: &str, unit: &str) {
        self.sh(
            host,
            &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"),
        );
    }

    /// Copies an executable of this machine to a host (its /usr is an overlay: the write stays
    /// its own), whole and then renamed.
    pub fn copy_executable(&self, local: &str, host: &str, remote: &str) {
        let status = Command::new("scp")
            .arg("-F")
            .arg(self.ssh_config())
            .arg("-q")
            .arg(local)
            .arg(format!("{host}:{remote}.new"))
            .status()
            .expect("scp runs");
        assert!(status.success(), "copying {local} to {host}");
        self.sh(
            host,
            &format!("chmod 755 {remote}.new && mv -f {remote}.new {remote}"),
        );
    }

    /// Installs the reconcile under test on a host as `bin`, with the host's guard beside it,
    /// where apply finds it (`bin`-guard).
    pub fn install_reconcile(&self, host: &str, bin: &str) {
        self.copy_executable(env!("CARGO_BIN_EXE_reconcile"), host, bin);
        self.copy_executable(
            env!("CARGO_BIN_EXE_reconcile-guard"),
            host,
            &format!("{bin}-guard"),
        );
    }

    /// Writes a file on a host.
    pub fn put(&self, host: &str, path: &str, content: &str) {
        let out = self.ssh(host, &format!("cat > '{path}'"), Some(content.as_bytes()));
        assert!(
            out.status.success(),
            "writing {path} on {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ssh(&self, host: &str, script: &str, stdin: Option<&[u8]>) -> std::process::Output {
        let mut ssh = Command::new("ssh");
        ssh.arg("-F").arg(self.ssh_config());
        if host != COUNTED {
            // The harness's own commands share one connection per host; the counted host sees
            // exactly one login per command, so its counts stay exact.
            let socket = self.state.join(format!("harness-{host}"));
            ssh.args(["-o", "ControlMaster=auto", "-o", "ControlPersist=120", "-o"]);
            ssh.arg(format!("ControlPath={}", socket.display()));
        }
        let mut child = ssh
            .arg(host)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ssh runs");
        let mut input = child.stdin.take().expect("stdin");
        if let Some(bytes) = stdin {
            input.write_all(bytes).expect("write stdin");
        }
        drop(input);
        child.wait_with_output().expect("ssh finishes")
    }
}

/// Undoes a break a test made on a shared host when dropped, so a failing assertion (a panic)
/// cannot leave the host broken for the tests after it. `undo()` runs it at a chosen point.
pub struct Undo {
    host: &'static str,
    script: &'static str,
    done: bool,
}

impl Undo {
    pub fn new(host: &'static str, script: &'static str) -> Undo {
        Undo {
            host,
            script,
            done: false,
        }
    }

    pub fn undo(mut self) {
        self.done = true;
        lab().sh(self.host, self.script);
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.done {
            sh_quietly(self.host, self.script);
        }
    }
}

/// Starts `run`, an apply that restarts `unit` on `host`; once the restarted unit has been
/// verifying for `settle` (its restart seen within `within`), sends `signal` (`-TERM`, `-INT`) to
/// the run and returns what it reported. `run` must outlive the child: it holds its manifests.
///
/// `settle` is an input of the fault, not a wait for something to happen: where in the
/// verification the signal lands. Every caller's server loads for far longer than `settle` plus
/// the harness's lag (seconds: a load of 6 s or more against a settle of 2 s at most), so however
/// late the restart is seen, the signal lands while it is verified.
pub fn signalled(
    run: &Reconcile,
    (host, unit): (&str, &str),
    signal: &str,
    within: std::time::Duration,
    settle: std::time::Duration,
) -> (Ran, serde_json::Value) {
    let before = lab().invocation(host, unit);
    let child = run.spawn(&[]);
    lab().wait_for_restart_within(host, unit, &before, within);
    std::thread::sleep(settle);
    send_signal(&child, signal);
    let ran = Ran::from(child.wait_with_output().expect("the run ends"));
    let json = ran.json();
    (ran, json)
}

/// The `name` of each entry of `list` (an experiment's variants, its ranking), in order.
pub fn names_in(list: &serde_json::Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["name"].as_str().unwrap())
        .collect()
}

/// The seconds the readiness probe took, from its stage's `detail` (`... the probe took 1.2s)`).
#[track_caller]
pub fn probe_seconds(detail: &str) -> f64 {
    detail
        .split("the probe took ")
        .nth(1)
        .and_then(|t| t.trim_end_matches("s)").parse().ok())
        .unwrap_or_else(|| panic!("no probe time in {detail}"))
}

/// Sends `signal` (`-TERM`, `-INT`) to `child` with kill(1).
pub fn send_signal(child: &std::process::Child, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
}

/// Runs `command` to its end and returns what it wrote; panics naming `what`, with what it wrote
/// on stderr, when it fails.
#[track_caller]
pub fn stdout_of(command: &mut Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Installs the unit `run` renders for `host` as `unit`, enabled as an apply leaves it (a disabled
/// unit is a change of its own), and started where `start`: a unit as a past apply left it.
pub fn install_rendered(run: &Reconcile, host: &str, unit: &str, start: bool) {
    lab().put(
        host,
        &format!("/etc/systemd/system/{unit}"),
        &run.rendered(host),
    );
    let now = if start { " --now" } else { "" };
    lab().sh(
        host,
        &format!("systemctl daemon-reload && systemctl enable{now} {unit}"),
    );
}

/// Reboots `host` (`tests/hostlab/reboot.sh`), back up when this returns.
pub fn reboot(host: &str) {
    stdout_of(
        Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/hostlab/reboot.sh"
        ))
        .arg(host)
        .env("STATE", lab().file("")),
        &format!("reboot.sh {host}"),
    );
}

/// Runs a shell script on a host as root, ignoring how it ends, and nothing when the lab is not
/// up: for clean-ups in `Drop`, where a panic while a failing test unwinds would abort the run.
pub fn sh_quietly(host: &str, script: &str) {
    if let Some(lab) = lab_if_up() {
        let _ = lab.ssh(host, script, None);
    }
}

/// The stand-in tests' base manifest on `hosts` (see [`Manifest::new`]): `/usr/bin/python3` on
/// the hosts runs the SGLang stand-in.
pub fn manifest(service: &str, hosts: &[&str]) -> Manifest {
    Manifest::new(service).hosts(hosts)
}

/// [`manifest`] for a test server of its own: on `hosts` at `port`, on the stand-in GPUs `gpus`
/// (`"0,1"`) alone, with NCCL's P2P left as the host has it.
pub fn stand_in(
    service: &str,
    hosts: &[&str],
    port: u16,
    gpus: impl Into<serde_yaml::Value>,
) -> Manifest {
    manifest(service, hosts)
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpus)
}

/// Sequential round trips to `host` after connecting, from `--trace-remote`'s lines on stderr:
/// each connection's longest chain (`rounds=`), added up over the connections the run made.
pub fn round_trips(stderr: &str, host: &str) -> u32 {
    let mut total = 0;
    let mut current = 0;
    let prefix = format!("trace-remote host={host} ");
    for line in stderr.lines().filter(|l| l.starts_with(&prefix)) {
        if line.contains("command=\"connect\"") {
            total += current;
            current = 0;
        } else if let Some(rounds) = line.rsplit_once(" rounds=") {
            current = current.max(rounds.1.trim().parse().unwrap_or(0));
        }
    }
    total + current
}

/// Runs the binary with `args` in a folder of its own, `manifest` its only manifest (`a.yaml`).
pub fn run_on(manifest: &Manifest, args: &[&str]) -> Ran {
    Reconcile::new()
        .manifest("a.yaml", manifest)
        .args(args)
        .run()
}

/// The `classes` that `reconcile status --format json` gives `unit` (one of its `units`).
#[track_caller]
pub fn classes_of(unit: &serde_json::Value) -> Vec<String> {
    unit["classes"]
        .as_array()
        .unwrap_or_else(|| panic!("status has no classes: {unit:#}"))
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

/// `reconcile apply --format json` of `manifest`: the exit code and the first unit's report.
pub fn apply_first_unit(manifest: &Manifest) -> (i32, serde_json::Value) {
    let ran = run_on(manifest, &["apply", "--format", "json"]);
    (ran.code, ran.json()["units"][0].clone())
}

/// `reconcile apply --format json` of one manifest with one unit: the exit code and that unit's
/// report.
pub fn apply_one_unit(manifest: &Manifest) -> (i32, serde_json::Value) {
    let ran = run_on(manifest, &["apply", "--format", "json"]);
    let json = ran.json();
    assert_eq!(
        json["units"].as_array().map(Vec::len),
        Some(1),
        "{}",
        ran.stdout
    );
    (ran.code, json["units"][0].clone())
}

/// Asserts that `text` (a run's output, a report's detail) holds `needle`, showing the whole text
/// when it does not: the check most tests make, in one place.
#[track_caller]
pub fn assert_has(text: &str, needle: &str) {
    assert!(text.contains(needle), "{text}");
}

/// Asserts that `text` begins with `prefix`, showing the whole text when it does not.
#[track_caller]
pub fn assert_starts_with(text: &str, prefix: &str) {
    assert!(text.starts_with(prefix), "{text}");
}

/// Asserts an apply's exit code and its unit's `outcome` together, showing the report otherwise.
#[track_caller]
pub fn assert_outcome(code: i32, report: &serde_json::Value, want: i32, outcome: &str) {
    assert_eq!(
        (code, report["outcome"].as_str()),
        (want, Some(outcome)),
        "{report:#}"
    );
}

/// Asserts that the string at `key` of `report` holds `needle`, showing the whole report when it
/// does not (or when `key` holds no string).
#[track_caller]
pub fn assert_field_has(report: &serde_json::Value, key: &str, needle: &str) {
    let text = report[key].as_str().unwrap_or_default();
    assert!(text.contains(needle), "{report:#}");
}

/// The figures at concurrency `level` in a benchmark's `levels`: a record's, a report's, or the
/// report's `comparison`.
pub fn level_at(figures: &serde_json::Value, level: u64) -> &serde_json::Value {
    figures["levels"]
        .as_array()
        .and_then(|levels| levels.iter().find(|l| l["concurrency"] == level))
        .unwrap_or_else(|| panic!("no figures at {level}: {figures:#}"))
}

/// Output tokens/s at concurrency `level` in a record's (or a report's) figures.
pub fn tokens_at(benchmark: &serde_json::Value, level: u64) -> f64 {
    level_at(benchmark, level)["output_tokens_per_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no output tokens/s at {level}: {benchmark:#}"))
}

/// One run of the binary in a folder of its own.
pub struct Reconcile {
    dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// An ssh_config of the test's own in place of the lab's.
    ssh_config: Option<PathBuf>,
}

#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Reconcile {
    pub fn new() -> Reconcile {
        Reconcile {
            dir: tempfile::tempdir().expect("temp dir"),
            args: Vec::new(),
            env: Vec::new(),
            ssh_config: None,
        }
    }

    /// Writes `text` as the run's ssh_config, used instead of the lab's (which it may `Include`).
    pub fn ssh_config(mut self, text: &str) -> Reconcile {
        let path = self.dir.path().join("ssh_config");
        std::fs::write(&path, text).unwrap();
        self.ssh_config = Some(path);
        self
    }

    fn ssh_config_path(&self) -> PathBuf {
        self.ssh_config
            .clone()
            .unwrap_or_else(|| lab().ssh_config())
    }

    /// Writes `text` (a [`Manifest`], or any other file's text) as `manifests/NAME`.
    pub fn manifest(self, name: &str, text: impl std::fmt::Display) -> Reconcile {
        let path = self.dir.path().join("manifests").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text.to_string()).unwrap();
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Reconcile {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    pub fn args(mut self, args: &[&str]) -> Reconcile {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    pub fn run(&self) -> Ran {
        Ran::from(self.command().output().expect("reconcile runs"))
    }

    /// Starts the run without waiting for it, with extra environment (e.g. its own TMPDIR, where
    /// its SSH control socket lives).
    pub fn spawn(&self, env: &[(&str, &str)]) -> std::process::Child {
        let mut command = self.command();
        command
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("reconcile starts")
    }

    fn command(&self) -> Command {
        self.command_with(&self.args)
    }

    /// The binary in the run's folder with `args`, its environment and the ssh_config.
    fn command_with<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_reconcile"));
        command
            .args(args)
            .arg("--ssh-config")
            .arg(self.ssh_config_path())
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The run's folder: its `manifests/` and any file a run writes there (a plan file).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Runs the binary in the same folder with other arguments (a plan, then its apply).
    pub fn run_args(&self, args: &[&str]) -> Ran {
        Ran::from(self.command_with(args).output().expect("reconcile runs"))
    }

    /// Runs the binary in the same folder for a command that reaches no host (`validate`, which
    /// takes no SSH options).
    pub fn run_offline(&self, args: &[&str]) -> Ran {
        let mut command = Command::new(env!("CARGO_BIN_EXE_reconcile"));
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        Ran::from(command.output().expect("reconcile runs"))
    }

    /// The unit text `reconcile render` gives for a host (tests' manifests hold no secrets).
    pub fn rendered(&self, host: &str) -> String {
        stdout_of(
            Command::new(env!("CARGO_BIN_EXE_reconcile"))
                .args(["render", "--host", host])
                .current_dir(self.dir.path()),
            "reconcile render",
        )
    }
}

impl From<std::process::Output> for Ran {
    fn from(out: std::process::Output) -> Ran {
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Ran {
    /// Asserts the run exited with `code`, showing all it wrote when it did not.
    #[track_caller]
    pub fn assert_code(&self, code: i32) {
        assert_eq!(self.code, code, "{}{}", self.stdout, self.stderr);
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", self.stdout))
    }
}

/// No two leases on one host share a port or a GPU, and every GPU is one of the stand-in's 64
/// (`/etc/fake-sglang/gpu_count` on the test hosts): two test files never collide by accident.
/// Needs no test host.
#[test]
fn leases_never_overlap() {
    fn overlap<T: Ord + Copy>(a: &Range<T>, b: &Range<T>) -> bool {
        a.start < a.end && b.start < b.end && a.start < b.end && b.start < a.end
    }
    let mut problems = Vec::new();
    for (i, a) in LEASES.iter().enumerate() {
        if a.ports.is_empty() || a.hosts.is_empty() {
            problems.push(format!("{} holds no port or no host: {a:?}", a.user));
        }
        if a.gpus.end > 64 {
            problems.push(format!(
                "{} holds GPUs past the stand-in's 64: {a:?}",
                a.user
            ));
        }
        for b in &LEASES[i + 1..] {
            for host in a.hosts.iter().filter(|h| b.hosts.contains(h)) {
                if overlap(&a.ports, &b.ports) {
                    problems.push(format!(
                        "on {host}: ports {:?} of {} and {:?} of {}",
                        a.ports, a.user, b.ports, b.user
                    ));
                }
                if overlap(&a.gpus, &b.gpus) {
                    problems.push(format!(
                        "on {host}: GPUs {:?} of {} and {:?} of {}",
                        a.gpus, a.user, b.gpus, b.user
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "leases collide:\n{}",
        problems.join("\n")
    );
}

/// A lease's two GPUs a port are its own, and a port outside it is refused.
#[test]
fn a_lease_hands_out_two_gpus_a_port() {
    assert_eq!(lease_of(APPLY, 32001).gpu_pair(32001), "0,1");
    assert_eq!(lease_of(APPLY, 32025).gpu_pair(32025), "44,45");
    assert_eq!(lease_of(APPLY, 32031).gpu_pair(32031), "52,53");
    assert_eq!(DRAIN_LEASE.gpu_pair(37109), "16,17");
    assert!(std::panic::catch_unwind(|| APPLY_1.gpu_pair(32009)).is_err());
}

/// A shell script that makes `dir` a venv as `python3 -m venv --system-site-packages` lays it out,
/// its interpreter the host's `/usr/bin/python3`, holding the dist-info of SGLang `version` alone
/// (`None`: the system's SGLang, the stand-in, shows through). reconcile starts a host's Python
/// isolated (`-I`), so a wrapper setting `PYTHONPATH` would not do.
pub fn venv_script(dir: &str, version: Option<&str>) -> String {
    let mut script = format!(
        r#"set -e
d={dir}
site=$d/lib/$(/usr/bin/python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/site-packages
rm -rf "$site" && mkdir -p "$site" "$d/bin"
printf 'home = /usr/bin\ninclude-system-site-packages = true\n' > "$d/pyvenv.cfg"
ln -sfn /usr/bin/python3 "$d/bin/python3"
"#
    );
    if let Some(v) = version {
        script.push_str(&format!(
            "mkdir -p \"$site/sglang-{v}.dist-info\"\nprintf 'Metadata-Version: 2.1\\nName: sglang\\nVersion: {v}\\n' > \"$site/sglang-{v}.dist-info/METADATA\"\n"
        ));
    }
    script
}
