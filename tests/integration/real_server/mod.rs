//! The real-SGLang tier: `reconcile` against the real, unmodified `sglang==0.5.23` on its CPU
//! engine, serving a tiny random Qwen2 (tests/hostlab/sglang-cpu/). `tests/run.sh` installs it,
//! binds it read-only into every test host at `/opt/sglang-cpu`, and runs these tests after the
//! stand-in's, three at a time (`RECONCILE_SGLANG_CPU` says the tier is there).
//!
//! One real server holds about 3.8 GB while it starts (1.8 GiB of its own once loaded), so at most
//! [`SLOTS_FREE`] start or serve a test at once on the lab's machine: every test takes its
//! servers' slots from [`slots`] first, and a test of two servers takes two. Every server runs
//! with `--sleep-on-idle`: an idle CPU scheduler otherwise polls a core (measured here: 101 % of a
//! core over 10 s idle, 1 % with the flag), which would starve the tests beside it.
//!
//! A restart happens only where it is the behaviour under test: tests that change a good server
//! and expect it back (a failed start rolled back, a change refused at plan time, `reconcile`
//! interrupted) share one ([`Shared`]), installed by whichever of them comes first.
//!
//! Verification settings are the real server's: it is ready in 15-40 s on these machines (almost
//! all of it Python imports), and its `/health` answers no sooner than a second. The deadlines
//! below are bounds from the real start-up (140 s was measured on a cold page cache under load),
//! not what makes a test pass.

mod compare;
mod experiment;
mod failures;
mod hardening;
mod lifecycle;
mod pinned;
mod quality;
mod rollout;
mod throughput;

use std::sync::{Condvar, Mutex};

use crate::lab::{lab, Manifest, Reconcile};

/// The two hosts of the tier; the router test also uses `crate::lab::ROUTER` in front of them.
pub const HOSTS: [&str; 2] = ["rl22", "rl23"];

/// Where the tier's folder is in a host (up.sh binds it there).
pub const ROOT: &str = "/opt/sglang-cpu";
/// What makes a test host a GPU-less machine running SGLang's CPU engine offline: the stub
/// libcuda.so.1 that lets sgl_kernel load (tests/hostlab/sglang-cpu/install.sh), and the caches
/// in the host's own /var/cache (the tier's folder is read-only). Every server of the tier, and
/// every script that imports its packages, starts with it.
pub const TIER_ENV: [(&str, &str); 9] = [
    ("LD_LIBRARY_PATH", "/opt/sglang-cpu/cudastub"),
    ("SGLANG_USE_CPU_ENGINE", "1"),
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("XDG_CACHE_HOME", "/var/cache/sglang-cpu"),
    ("HF_HOME", "/var/cache/sglang-cpu/hf"),
    ("TRITON_CACHE_DIR", "/var/cache/sglang-cpu/triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "/var/cache/sglang-cpu/inductor"),
    ("SGLANG_CACHE_DIR", "/var/cache/sglang-cpu/sglang"),
];

/// [`TIER_ENV`] as a shell's assignments, for `env` on a host.
pub fn tier_env_words() -> String {
    TIER_ENV.map(|(k, v)| format!("{k}={v}")).join(" ")
}

/// The tiny model's `max_position_embeddings` (make_model.py): the context length SGLang derives.
pub const MODEL_CONTEXT: u32 = 2048;

/// How many real servers may start or serve a test at once on this machine (24 GB, 2 cores).
pub const SLOTS_FREE: u32 = 3;

/// Slots for real servers.
pub struct Slots {
    free: Mutex<u32>,
    freed: Condvar,
}

pub struct Held<'a> {
    slots: &'a Slots,
    n: u32,
}

static SLOTS: Slots = Slots {
    free: Mutex::new(SLOTS_FREE),
    freed: Condvar::new(),
};

/// Takes `n` of the slots, waiting for them; they are given back when the guard drops.
pub fn slots(n: u32) -> Held<'static> {
    tier();
    let mut free = SLOTS.free.lock().unwrap_or_else(|p| p.into_inner());
    while *free < n {
        free = SLOTS.freed.wait(free).unwrap_or_else(|p| p.into_inner());
    }
    *free -= n;
    Held { slots: &SLOTS, n }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        *self.slots.free.lock().unwrap_or_else(|p| p.into_inner()) += self.n;
        self.slots.freed.notify_all();
    }
}

/// Panics unless the tier is there: these tests never pass by skipping.
fn tier() {
    let root = std::env::var("RECONCILE_SGLANG_CPU").expect(
        "RECONCILE_SGLANG_CPU is not set: the real-SGLang tests need the tier tests/run.sh installs and binds into the hosts",
    );
    assert_eq!(root, ROOT, "the tier is bound at {ROOT} in the hosts");
}

/// A real SGLang service on one of the tier's hosts: [`manifest`] with more flags, verification
/// settings and sections set on it.
pub struct Service<'a> {
    pub name: &'a str,
    pub host: &'a str,
    pub port: u16,
    manifest: Manifest,
}

/// The tier's manifest. The flags every CPU launch needs: the CPU device, its attention and
/// sampling backends, and a KV pool of 4096 tokens (without it the pool takes 15 GB of this
/// machine). The crash window is the stand-in tests' 3 s; the stall timeout is SGLang's own
/// `--watchdog-timeout` default (300 s); the load deadline bounds a start that took 140 s under
/// load here.
pub fn manifest(name: &str, hosts: &[&str], port: u16) -> Manifest {
    Manifest::new(name)
        .description(format!("real SGLang {name}"))
        .hosts(hosts)
        .python(format!("{ROOT}/bin/python3"))
        .model_path(format!("{ROOT}/tiny-model"))
        .served_model_name(format!("tiny-{name}"))
        .port(port)
        .without_flag("tp-size")
        .without_flag("context-length")
        .flag("device", "cpu")
        .flag("attention-backend", "torch_native")
        .flag("sampling-backend", "pytorch")
        .flag("max-total-tokens", 4096)
        .flag("sleep-on-idle", true)
        .without("env")
        .env("OMP_NUM_THREADS", "1")
        .env_all(&TIER_ENV)
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "300s"),
            ("load_deadline", "240s"),
        ])
}

impl<'a> Service<'a> {
    /// A second apply of the same manifest: unchanged, and the server not restarted.
    pub fn applies_as_a_no_op(&self) {
        let before = self.identity();
        let (code, again) = self.apply();
        assert_eq!(
            (code, &again["outcome"]),
            (0, &"unchanged".into()),
            "{again:#}"
        );
        assert_eq!(
            self.identity(),
            before,
            "a no-op apply restarted the real server"
        );
    }

    pub fn new(name: &'a str, host: &'a str, port: u16) -> Service<'a> {
        Service {
            name,
            host,
            port,
            manifest: manifest(name, &[host], port),
        }
    }

    pub fn unit(&self) -> String {
        format!("{}.service", self.name)
    }

    /// Sets a `launch_server` flag.
    pub fn flag(mut self, name: &str, value: impl Into<serde_yaml::Value>) -> Self {
        self.manifest = self.manifest.flag(name, value);
        self
    }

    /// Serves the weights at `path` (on the host) instead of the tier's tiny model.
    pub fn model_path(mut self, path: &str) -> Self {
        self.manifest = self.manifest.model_path(path);
        self
    }

    /// Serves the weights `model` pins (`sglang.model:`) instead of the tier's tiny model.
    pub fn pinned(mut self, model: serde_yaml::Value) -> Self {
        self.manifest = self.manifest.pinned_model(model);
        self
    }

    /// Sets a verification setting.
    pub fn verify(mut self, name: &str, value: impl Into<serde_yaml::Value>) -> Self {
        self.manifest = self.manifest.verify(name, value);
        self
    }

    /// Sets a `systemd:` setting, or reconcile's own key there (`hardening`).
    pub fn systemd(mut self, name: &str, value: impl Into<serde_yaml::Value>) -> Self {
        self.manifest = self.manifest.systemd(name, value);
        self
    }

    /// Live changes asked for (`apply: { live: true }`), and no served name: after a weight
    /// update SGLang answers under the model path, so a served name keeps a move a restart.
    pub fn live(mut self) -> Self {
        self.manifest = self.manifest.without_served_model_name().live();
        self
    }

    /// Sets a top-level manifest section (`drain:`).
    pub fn section(mut self, name: &str, value: impl Into<serde_yaml::Value>) -> Self {
        self.manifest = self.manifest.section(name, value);
        self
    }

    /// The manifest.
    pub fn manifest(&self) -> Manifest {
        self.manifest.clone()
    }

    /// Removes what an earlier run left: the unit, its state and records. The guard stops the
    /// unit when the test ends, passed or failed: an idle real CPU scheduler polls a core.
    #[must_use]
    pub fn fresh(&self) -> Stopped {
        lab().remove_unit(self.host, &self.unit());
        stopped(self.host, &self.unit())
    }

    pub fn stop(&self) {
        crate::lab::sh_quietly(
            self.host,
            &format!("systemctl disable --now {}", self.unit()),
        );
    }

    /// `reconcile apply --format json` of this manifest: the exit code and the unit's report.
    pub fn apply(&self) -> (i32, serde_json::Value) {
        self.apply_text(&self.manifest())
    }

    pub fn apply_text(&self, text: &Manifest) -> (i32, serde_json::Value) {
        self.apply_with(text, &[])
    }

    /// `reconcile apply --format json ARGS` of `text`: the exit code and the unit's report.
    pub fn apply_with(&self, text: &Manifest, args: &[&str]) -> (i32, serde_json::Value) {
        let ran = Reconcile::new()
            .manifest("a.yaml", text)
            .args(&["apply", "--format", "json"])
            .args(args)
            .run();
        let json = ran.json();
        (ran.code, json["units"][0].clone())
    }

    /// Applies and asserts the unit converged.
    pub fn converge(&self) -> serde_json::Value {
        let (code, report) = self.apply();
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["outcome"], "converged", "{report:#}");
        report
    }

    /// The unit file on the host, as it is now.
    pub fn unit_file(&self) -> String {
        lab().sh(
            self.host,
            &format!("cat /etc/systemd/system/{}", self.unit()),
        )
    }

    /// `InvocationID NRestarts` of the unit: both stay when nothing restarted it.
    pub fn identity(&self) -> String {
        lab().sh(
            self.host,
            &format!(
                "systemctl show -p InvocationID -p NRestarts --value {} | paste -sd' '",
                self.unit()
            ),
        )
    }

    pub fn invocation(&self) -> String {
        lab().invocation(self.host, &self.unit())
    }

    /// The command lines of the unit's processes, one a line (SGLang titles its scheduler
    /// `sglang::scheduler...` and its detokenizer `sglang::detokenizer`).
    pub fn processes(&self) -> String {
        lab().sh(self.host, &format!("{}; for p in $(cat \"$procs\" 2>/dev/null); do tr '\\0' ' ' < /proc/$p/cmdline; echo; done", procs(&self.unit())))
    }

    /// One HTTP request made on the host to the server's loopback port (the hosts have python3,
    /// no curl): `STATUS BODY`.
    pub fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        key: Option<&str>,
    ) -> (u16, String) {
        http(self.host, self.port, method, path, body, key)
    }
}

/// A real server several tests change and expect back, each in its turn ([`Shared::take`]).
pub struct Shared {
    name: &'static str,
    host: &'static str,
    port: u16,
    /// How many tests take it: the last one to finish stops it.
    users: u32,
    state: Mutex<SharedState>,
}

struct SharedState {
    installed: bool,
    done: u32,
}

/// A test's turn with a shared server, which runs its good unit ([`Turn::service`]).
pub struct Turn {
    shared: &'static Shared,
    state: std::sync::MutexGuard<'static, SharedState>,
    service: Service<'static>,
    _slot: Held<'static>,
}

impl Shared {
    pub const fn new(name: &'static str, host: &'static str, port: u16, users: u32) -> Shared {
        Shared {
            name,
            host,
            port,
            users,
            state: Mutex::new(SharedState {
                installed: false,
                done: 0,
            }),
        }
    }

    /// The server's good manifest: the tier's, nothing more.
    pub fn good(&self) -> Service<'static> {
        Service::new(self.name, self.host, self.port)
    }

    /// Waits for the server and a slot, and returns it running its good unit: the first turn
    /// installs it from nothing; a later one applies the good manifest again, a no-op unless the
    /// test before it failed half-way and left it elsewhere.
    pub fn take(&'static self) -> Turn {
        // The server before a slot: a test holding a slot never waits for a server.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots(1);
        let service = self.good();
        if !state.installed {
            lab().remove_unit(self.host, &service.unit());
            service.converge();
            state.installed = true;
        } else {
            let (code, report) = service.apply();
            assert!(
                code == 0
                    && ["unchanged", "converged"]
                        .contains(&report["outcome"].as_str().unwrap_or("")),
                "the shared {} is back on its good unit: {report:#}",
                self.name
            );
        }
        Turn {
            shared: self,
            state,
            service,
            _slot: slot,
        }
    }
}

impl Turn {
    pub fn service(&self) -> &Service<'static> {
        &self.service
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.state.done += 1;
        if self.state.done == self.shared.users {
            self.service.stop();
        }
    }
}

/// Stops a unit when dropped.
pub struct Stopped {
    host: String,
    unit: String,
}

/// A guard that stops `unit` on `host` when dropped.
#[must_use]
pub fn stopped(host: &str, unit: &str) -> Stopped {
    Stopped {
        host: host.to_string(),
        unit: unit.to_string(),
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        crate::lab::sh_quietly(
            &self.host,
            &format!("systemctl disable --now {}", self.unit),
        );
    }
}

/// How long a real server's apply may take to restart it: it runs the deep check first (the
/// host's SGLang resolves the arguments: seconds of imports, 25-30 s measured under load).
pub const RESTART_WITHIN: std::time::Duration = std::time::Duration::from_secs(240);

/// A shell assignment of `procs` to the unit's `cgroup.procs` file (the hosts' cgroup v2 tree is
/// mounted at /sys/fs/cgroup/unified).
pub fn procs(unit: &str) -> String {
    format!(
        "procs=/sys/fs/cgroup/unified$(systemctl show -p ControlGroup --value {unit})/cgroup.procs"
    )
}

/// One HTTP request on `host` to its loopback `port`: the status and the body.
pub fn http(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> (u16, String) {
    let script = format!(
        r#"python3 - <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=60)
h = {{"Content-Type": "application/json"}}
key = {key:?}
if key:
    h["Authorization"] = "Bearer " + key
body = {body:?}
c.request({method:?}, {path:?}, body=body.encode() if body else None, headers=h)
r = c.getresponse()
sys.stdout.write("%d\n" % r.status)
sys.stdout.write(r.read().decode("utf-8", "replace"))
PY"#,
        key = key.unwrap_or(""),
        body = body.unwrap_or(""),
    );
    let out = lab().sh(host, &script);
    let (status, rest) = out.split_once('\n').unwrap_or((&out, ""));
    (
        status.trim().parse().expect("an HTTP status"),
        rest.to_string(),
    )
}

/// The stage of a verification by name.
pub fn stage<'v>(verification: &'v serde_json::Value, name: &str) -> &'v serde_json::Value {
    verification["stages"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no stage {name} in {verification:#}"))
}
