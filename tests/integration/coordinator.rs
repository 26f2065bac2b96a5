//! Pull agents that roll out together (issue 23): six real agents on six test hosts, each running
//! `reconcile agent --once --coordinator` against a real etcd (Debian's etcd-server, run by this
//! harness on its own test host) and pulling one git repository served by `git daemon` there. The
//! servers are the SGLang stand-in, loading in one second.
//!
//! What restarted when is read from systemd on the hosts: how many times it started the unit
//! (its "Started" messages, by invocation), when it began stopping the old server and when it
//! started the new one (its own CLOCK_MONOTONIC timestamps, one clock for every test host), and
//! how long the new server took to be ready after that, as the agent recorded it on the host. No
//! judgement rests on journald's timestamps (when journald read a line, seconds late on a loaded
//! machine), so these tests may run beside others.
//!
//! The tests share the seven hosts, so they take turns ([`turn`]); each has its own service, port
//! and key prefix in etcd, so nothing one leaves behind reaches another.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::builder::{yaml, STAND_IN_VERIFY};
use crate::lab::{assert_has, lab, stdout_of, Manifest, Ran, COORDINATOR, FLEET};

const BIN: &str = "/usr/local/bin/reconcile";
const ETCD_PORT: u16 = crate::lab::ETCD.ports.start;

/// One test at a time on the fleet's hosts.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    let guard = TURN.lock().unwrap_or_else(|p| p.into_inner());
    setup();
    guard
}

/// The coordinator's host runs etcd and a git daemon; every fleet host gets the binary under
/// test. Once per run.
fn setup() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        lab().copy_executable(&which("etcd"), COORDINATOR, "/usr/local/bin/etcd");
        lab().copy_executable(&which("etcdctl"), COORDINATOR, "/usr/local/bin/etcdctl");
        let ip = lab().address(COORDINATOR);
        lab().put(
            COORDINATOR,
            "/etc/systemd/system/lab-etcd.service",
            &format!(
                "[Service]\nExecStart=/usr/local/bin/etcd --name lab --data-dir /var/lib/lab-etcd \
                 --listen-client-urls http://0.0.0.0:{ETCD_PORT} --advertise-client-urls http://{ip}:{ETCD_PORT} \
                 --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
                 --initial-cluster lab=http://127.0.0.1:2380\n"
            ),
        );
        lab().put(
            COORDINATOR,
            "/etc/systemd/system/lab-git.service",
            "[Service]\nExecStart=/usr/bin/git daemon --reuseaddr --base-path=/srv/git --export-all /srv/git\n",
        );
        lab().sh(
            COORDINATOR,
            "rm -rf /var/lib/lab-etcd /srv/git && mkdir -p /srv/git && systemctl daemon-reload && systemctl restart lab-etcd lab-git",
        );
        // 30 s bounds an etcd or git daemon that never listens (they do within seconds).
        lab().wait_until(
            COORDINATOR,
            &format!("(exec 3<>/dev/tcp/127.0.0.1/{ETCD_PORT}) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/9418) 2>/dev/null"),
            Duration::from_secs(30),
        );
        for host in FLEET {
            lab().install_reconcile(host, BIN);
        }
    });
}

fn which(name: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .expect("sh runs");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !path.is_empty(),
        "{name} is not installed here (Debian: etcd-server, etcd-client); .ci/run installs them"
    );
    path
}

fn coordinator_url() -> String {
    format!("etcd://{}:{ETCD_PORT}", lab().address(COORDINATOR))
}

/// One test's service over the six hosts: its repository on the git daemon, its key prefix.
struct Fleet {
    service: &'static str,
    port: u16,
    /// `rollout:` of the manifest.
    rollout: &'static str,
}

impl Fleet {
    fn unit(&self) -> String {
        format!("{}.service", self.service)
    }

    fn prefix(&self) -> String {
        format!("/test/{}", self.service)
    }

    /// The manifest, with `context-length: context`.
    fn manifest(&self, context: u32) -> Manifest {
        crate::lab::manifest(self.service, &FLEET)
            .description("coordinated test service")
            .port(self.port)
            .flag("context-length", context)
            .env("FAKE_SGLANG_LOAD_SECONDS", "1")
            .verify_all(&STAND_IN_VERIFY)
            .section("rollout", yaml(self.rollout))
    }

    /// Removes what an earlier run left: the units, their records, the agents' checkouts, the
    /// repository; then a repository with nothing in it.
    fn fresh(&self) {
        for host in FLEET {
            lab().remove_unit(host, &self.unit());
            lab().sh(
                host,
                &format!("rm -rf /var/lib/reconcile/agent-{}", self.service),
            );
        }
        lab().sh(
            COORDINATOR,
            &format!(
                "rm -rf /srv/git/{s}.git /root/work-{s} && git init -q --bare -b main /srv/git/{s}.git && \
                 git clone -q /srv/git/{s}.git /root/work-{s} 2>/dev/null && mkdir -p /root/work-{s}/manifests",
                s = self.service
            ),
        );
    }

    /// Commits `manifest` and pushes it; returns the commit.
    fn commit(&self, manifest: &Manifest, message: &str) -> String {
        lab().put(
            COORDINATOR,
            &format!(
                "/root/work-{}/manifests/{}.yaml",
                self.service, self.service
            ),
            &manifest.to_yaml(),
        );
        lab().sh(
            COORDINATOR,
            &format!(
                "cd /root/work-{} && git add -A && git -c user.name='Test Author' -c user.email=author@example.com commit -q -m '{message}' && git push -q origin main && git rev-parse HEAD",
                self.service
            ),
        )
        .trim()
        .to_string()
    }

    /// One agent round on each of `hosts`, all at once.
    fn rounds(&self, hosts: &[&str]) -> BTreeMap<String, Ran> {
        finish(
            hosts
                .iter()
                .map(|h| (h.to_string(), self.spawn_round(h)))
                .collect(),
        )
    }

    /// An agent round on `host`: a 5 s lease, and long enough a wait for any turn of these tests.
    fn spawn_round(&self, host: &str) -> std::process::Child {
        self.spawn_round_with(
            host,
            "--lease-ttl 5s --coordinator-poll 300ms --coordinator-wait 150s",
        )
    }

    fn spawn_round_with(&self, host: &str, flags: &str) -> std::process::Child {
        let command = format!(
            "exec {BIN} agent --once --repo git://{git}/{s}.git --checkout /var/lib/reconcile/agent-{s}/repo \
             --as {host} --coordinator {url} --coordinator-prefix {prefix} {flags}",
            git = lab().address(COORDINATOR),
            s = self.service,
            url = coordinator_url(),
            prefix = self.prefix(),
        );
        Command::new("ssh")
            .arg("-F")
            .arg(lab().ssh_config())
            .arg(host)
            .arg(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ssh runs")
    }

    /// `reconcile rollout status --format json` from this machine, and its exit code.
    fn rollout_status(&self, manifest: &Manifest) -> (i32, serde_json::Value) {
        let run =
            crate::lab::Reconcile::new().manifest(&format!("{}.yaml", self.service), manifest);
        let ran = run.run_offline(&[
            "rollout",
            "status",
            self.service,
            "manifests",
            "--coordinator",
            &coordinator_url(),
            "--coordinator-prefix",
            &self.prefix(),
            "--format",
            "json",
        ]);
        assert!(
            [0, 2, 3].contains(&ran.code) && ran.stderr.is_empty(),
            "rollout status failed: {}{}",
            ran.stdout,
            ran.stderr
        );
        (ran.code, ran.json())
    }

    /// Waits until `reconcile rollout status` shows `host` under `heading`.
    fn wait_for(&self, manifest: &Manifest, heading: &str, host: &str, within: Duration) {
        let began = Instant::now();
        loop {
            let (_, v) = self.rollout_status(manifest);
            if v[heading]
                .as_array()
                .is_some_and(|a| a.iter().any(|h| h == host))
            {
                return;
            }
            assert!(
                began.elapsed() < within,
                "{host} never showed as {heading} within {within:?}: {v}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Each host's restart of the unit since it ran invocation `before[host]`, from systemd: how
    /// many starts (each window says), from systemd stopping the old server
    /// (`ActiveExitTimestampMonotonic`) to the new one ready: systemd's start of its main process
    /// (`ExecMainStartTimestampMonotonic`) plus the load time the agent's verification recorded
    /// in the deployment record (`load_seconds`, counted from just after the restart, so no
    /// later than the agent saw it ready, and so inside its slot). A host that did not restart has
    /// no window.
    fn restarts(&self, before: &BTreeMap<String, String>) -> Vec<Window> {
        let unit = self.unit();
        let mut windows = Vec::new();
        for host in FLEET {
            let starts = lab().starts_after(host, &unit, &before[host]);
            if starts == 0 {
                continue;
            }
            let t = lab().show(
                host,
                &unit,
                &[
                    "ActiveExitTimestampMonotonic",
                    "ExecMainStartTimestampMonotonic",
                ],
            );
            let seconds = |p: &str| -> f64 {
                t[p].parse::<f64>()
                    .unwrap_or_else(|_| panic!("{host}: {p} of {unit}: {t:?}"))
                    / 1e6
            };
            // The record is this restart's when it is of the unit file systemd runs now.
            let record = lab().sh(
                host,
                &format!(
                    "cat /var/lib/reconcile/{unit}/current.json; echo; sha256sum < /etc/systemd/system/{unit}"
                ),
            );
            let (json, sha) = record
                .trim()
                .rsplit_once('\n')
                .expect("record and checksum");
            let record: serde_json::Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("{host}: current.json ({e}): {json}"));
            let ready = match record["load_seconds"].as_f64() {
                Some(load) if sha.starts_with(record["unit_sha256"].as_str().unwrap_or("-")) => {
                    seconds("ExecMainStartTimestampMonotonic") + load
                }
                // Never ready (or no record of this restart): it ran until now.
                _ => f64::MAX,
            };
            windows.push(Window {
                host: host.to_string(),
                starts,
                began: seconds("ActiveExitTimestampMonotonic"),
                ended: ready,
            });
        }
        windows
    }
}

/// Waits for every round and prints what each said.
fn finish(children: Vec<(String, std::process::Child)>) -> BTreeMap<String, Ran> {
    children
        .into_iter()
        .map(|(h, child)| {
            let ran = Ran::from(child.wait_with_output().expect("the round ends"));
            eprintln!(
                "agent round on {h}, exit {}:\n{}{}",
                ran.code, ran.stdout, ran.stderr
            );
            (h, ran)
        })
        .collect()
}

/// A host's restart, in seconds of CLOCK_MONOTONIC (the test hosts' one clock).
#[derive(Debug, Clone)]
struct Window {
    host: String,
    /// How many times systemd started the unit since the invocation before.
    starts: usize,
    began: f64,
    ended: f64,
}

/// The most windows open at one instant.
fn most_at_once(windows: &[Window]) -> usize {
    let mut edges: Vec<(f64, i32)> = windows
        .iter()
        .flat_map(|w| [(w.began, 1), (w.ended, -1)])
        .collect();
    // An end and a start at the same instant do not overlap.
    edges.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

fn invocations(unit: &str) -> BTreeMap<String, String> {
    FLEET
        .iter()
        .map(|h| (h.to_string(), lab().invocation(h, unit)))
        .collect()
}

/// Deploys the first version on every host (itself a coordinated rollout) and checks it landed.
fn deploy_base(fleet: &Fleet) -> Manifest {
    fleet.fresh();
    let base = fleet.manifest(8192);
    fleet.commit(&base, "base");
    let ran = fleet.rounds(&FLEET);
    for (host, r) in &ran {
        assert_eq!(r.code, 0, "{host}: {}{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("converged"), "{host}: {}", r.stdout);
    }
    base
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn six_agents_restart_at_most_two_at_a_time_after_the_canary() {
    let _turn = turn();
    let fleet = Fleet {
        service: "t-coord-par",
        port: 37401,
        rollout: "{ max_parallel: 2, max_failures: 1 }",
    };
    deploy_base(&fleet);
    let before = invocations(&fleet.unit());
    let changed = fleet.manifest(4096);
    let commit = fleet.commit(&changed, "shorter context");
    // `rollout status --watch` follows the rollout live, from this machine, until it is done.
    let watching =
        crate::lab::Reconcile::new().manifest(&format!("{}.yaml", fleet.service), &changed);
    let watch = Command::new(env!("CARGO_BIN_EXE_reconcile"))
        .args(["rollout", "status", fleet.service, "manifests", "--watch"])
        .args([
            "--coordinator",
            &coordinator_url(),
            "--coordinator-prefix",
            &fleet.prefix(),
        ])
        .current_dir(watching.dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("reconcile starts");
    let ran = fleet.rounds(&FLEET);
    for (host, r) in &ran {
        assert_eq!(r.code, 0, "{host}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stdout
                .contains(&format!("{host} {} converged", fleet.unit())),
            "{host}: {}",
            r.stdout
        );
    }
    let watched = Ran::from(watch.wait_with_output().expect("the watch ends"));
    watched.assert_code(0);
    let blocks = watched.stdout.matches(".service, change ").count();
    assert!(
        blocks >= 3,
        "the watch did not follow the rollout: {}",
        watched.stdout
    );
    assert_has(&watched.stdout, "in flight");
    assert!(
        watched
            .stdout
            .trim_end()
            .ends_with(&format!("succeeded     {}", FLEET.join(", "))),
        "{}",
        watched.stdout
    );
    let after = invocations(&fleet.unit());
    for host in FLEET {
        assert_ne!(before[host], after[host], "{host} was not restarted");
    }
    let windows = fleet.restarts(&before);
    eprintln!("restart windows from systemd: {windows:#?}");
    assert!(
        windows.len() == FLEET.len() && windows.iter().all(|w| w.starts == 1),
        "one restart a host: {windows:#?}"
    );
    assert!(
        most_at_once(&windows) <= 2,
        "more than max_parallel 2 restarting at once: {windows:#?}"
    );
    let canary = windows
        .iter()
        .find(|w| w.host == FLEET[0])
        .expect("the canary restarted");
    for w in windows.iter().filter(|w| w.host != FLEET[0]) {
        assert!(
            w.began > canary.ended,
            "{} began restarting before the canary {} was ready: {windows:#?}",
            w.host,
            FLEET[0]
        );
    }
    // The waiting hosts said what they waited for.
    assert!(
        ran[FLEET[5]].stdout.contains("coordinator: ")
            && ran[FLEET[5]].stdout.contains("waiting for"),
        "{}",
        ran[FLEET[5]].stdout
    );

    // The fleet's state from the coordinator alone: every host succeeded on this commit.
    let (code, rollout) = fleet.rollout_status(&changed);
    assert_eq!(code, 0, "{rollout}");
    assert_eq!(
        rollout["succeeded"].as_array().map(Vec::len),
        Some(6),
        "{rollout}"
    );
    assert_eq!(rollout["canary"], FLEET[0]);
    let run = crate::lab::Reconcile::new().manifest(&format!("{}.yaml", fleet.service), &changed);
    let status = run.run_args(&[
        "status",
        "manifests",
        "--coordinator",
        &coordinator_url(),
        "--coordinator-prefix",
        &fleet.prefix(),
        "--format",
        "json",
    ]);
    status.assert_code(0);
    let rows = status.json();
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 6);
    for row in rows {
        assert_eq!(row["state"], "succeeded", "{row}");
        assert_eq!(row["commit"], commit.as_str(), "{row}");
        assert_eq!(row["on_newest"], true, "{row}");
    }
    let text = run.run_args(&[
        "status",
        "manifests",
        "--coordinator",
        &coordinator_url(),
        "--coordinator-prefix",
        &fleet.prefix(),
    ]);
    assert_has(&text.stdout, "6 of 6 in sync");

    // A round with nothing to do restarts nothing and reports up to date: run by the example
    // service, which takes the coordinator from /etc/reconcile/agent.env.
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systemd");
    let service = std::fs::read_to_string(examples.join("reconcile-agent.service")).unwrap();
    let env = std::fs::read_to_string(examples.join("agent.env")).unwrap();
    assert!(
        env.contains("RECONCILE_COORDINATOR=etcd://"),
        "the example no longer sets the coordinator"
    );
    let repo = format!("git://{}/{}.git", lab().address(COORDINATOR), fleet.service);
    for host in FLEET {
        lab().put(
            host,
            "/etc/systemd/system/reconcile-agent.service",
            &service.replace("https://git.example.com/infra/llm-manifests.git", &repo),
        );
        lab().sh(
            host,
            "mkdir -p -m 0700 /etc/reconcile && rm -rf /var/lib/reconcile/agent",
        );
        lab().put(
            host,
            "/etc/reconcile/agent.env",
            &format!(
                "RECONCILE_COORDINATOR={}\nRECONCILE_COORDINATOR_PREFIX={}\n",
                coordinator_url(),
                fleet.prefix()
            ),
        );
        let cursor = lab().cursor(host);
        lab().sh(
            host,
            "systemctl daemon-reload && systemctl start reconcile-agent.service; \
             rm -f /etc/systemd/system/reconcile-agent.service /etc/reconcile/agent.env; systemctl daemon-reload",
        );
        // Waits for the line: journald takes in the round's output when it gets to it.
        lab().journal_after(
            host,
            "reconcile-agent.service",
            &cursor,
            &[&format!("{host} {} unchanged", fleet.unit())],
            Duration::from_secs(30),
        );
    }
    assert_eq!(
        invocations(&fleet.unit()),
        after,
        "a quiet round restarted a server"
    );
    let (_, rollout) = fleet.rollout_status(&changed);
    assert_eq!(
        rollout["succeeded"].as_array().map(Vec::len),
        Some(6),
        "{rollout}"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_failed_canary_stops_every_other_host_and_each_says_why() {
    let _turn = turn();
    let fleet = Fleet {
        service: "t-coord-canary",
        port: 37402,
        rollout: "{ max_parallel: 3, max_failures: 3 }",
    };
    deploy_base(&fleet);
    let before = invocations(&fleet.unit());
    let crashing = fleet
        .manifest(8192)
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "1");
    fleet.commit(&crashing, "crashes while loading");
    let ran = fleet.rounds(&FLEET);
    let canary = &ran[FLEET[0]];
    assert_eq!(canary.code, 3, "the canary rolls back: {}", canary.stdout);
    assert_has(&canary.stdout, "rolled_back");
    let after = invocations(&fleet.unit());
    for host in &FLEET[1..] {
        let r = &ran[*host];
        assert_eq!(r.code, 1, "{host}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains(&format!(
                "the canary {} failed this change, so the rollout stopped",
                FLEET[0]
            )),
            "{host}: {}",
            r.stdout
        );
        assert!(
            r.stdout.contains("the running server was left as it is"),
            "{host}: {}",
            r.stdout
        );
        assert_eq!(
            before[*host], after[*host],
            "{host} was restarted after the canary failed"
        );
    }
    let (code, rollout) = fleet.rollout_status(&crashing);
    assert_eq!(code, 3, "{rollout}");
    assert_eq!(
        rollout["failed"],
        serde_json::json!([FLEET[0]]),
        "{rollout}"
    );
    assert_eq!(
        rollout["held"].as_array().map(Vec::len),
        Some(5),
        "{rollout}"
    );

    // The canary does not try the same change again on its next round; a fixed commit goes on.
    let again = fleet.rounds(&FLEET[..1]);
    assert_eq!(again[FLEET[0]].code, 1);
    assert!(
        again[FLEET[0]]
            .stdout
            .contains("failed this change already"),
        "{}",
        again[FLEET[0]].stdout
    );
    let fixed = fleet.manifest(2048);
    fleet.commit(&fixed, "fixed");
    let ran = fleet.rounds(&FLEET);
    for (host, r) in &ran {
        assert_eq!(r.code, 0, "{host}: {}{}", r.stdout, r.stderr);
    }
    assert_eq!(fleet.rollout_status(&fixed).0, 0);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_killed_agent_frees_its_slot_counts_against_the_budget_and_finishes_next_round() {
    let _turn = turn();
    let fleet = Fleet {
        service: "t-coord-kill",
        port: 37403,
        rollout: "{ max_parallel: 2, max_failures: 1 }",
    };
    deploy_base(&fleet);
    let changed = fleet.manifest(4096);
    fleet.commit(&changed, "shorter context");
    // The canary and the victim first: the victim takes a slot as soon as the canary succeeded,
    // and the other four start while it holds it.
    let victim = FLEET[1];
    let canary = fleet.spawn_round(FLEET[0]);
    let before = lab().invocation(victim, &fleet.unit());
    let victim_round = fleet.spawn_round(victim);
    // 90 s bounds a rollout that never gets there: the canary's restart and verification take
    // seconds (a 1 s load, a 3 s crash window).
    fleet.wait_for(&changed, "in_flight", victim, Duration::from_secs(90));
    let others: Vec<&str> = FLEET[2..].to_vec();
    let mut children: Vec<(String, std::process::Child)> = others
        .iter()
        .map(|h| (h.to_string(), fleet.spawn_round(h)))
        .collect();
    children.push((FLEET[0].to_string(), canary));
    // Mid-verification: killed on the host itself as soon as its restart is seen (polled every
    // 100 ms for 30 s, far longer than a restart takes), so the kill lands inside the verification
    // (its crash window alone is 3 s) however late this machine would see the restart. The kill's
    // moment is the host's CLOCK_MONOTONIC. `[/]` keeps pkill's pattern from matching this
    // script's own shell.
    let killed_at: f64 = lab()
        .sh(
            victim,
            &format!(
                "for i in $(seq 300); do \
                   if [ \"$(systemctl show -p InvocationID --value {unit})\" != '{before}' ]; then \
                     pkill -KILL -f 'agent-{service}[/]repo' && exec python3 -c 'import time; print(time.monotonic())'; exit 1; \
                   fi; sleep 0.1; \
                 done; exit 1",
                unit = fleet.unit(),
                service = fleet.service
            ),
        )
        .trim()
        .parse()
        .expect("the moment of the kill");
    let killed = Ran::from(victim_round.wait_with_output().expect("ssh ends"));
    assert_ne!(
        killed.code, 0,
        "the agent was not killed: {}",
        killed.stdout
    );
    eprintln!("killed on {victim} (invocation {before})");
    // The lease (5 s) runs out: the slot is free and the abandoned attempt counts as failed.
    // 30 s bounds a lease that never runs out (it does 3.3-5.5 s after the kill).
    fleet.wait_for(&changed, "failed", victim, Duration::from_secs(30));
    // No sooner than the lease allows: renewed every third of its TTL, it runs out 3.3 s to 5 s
    // after the kill (later when etcd is slow to look), measured 4.0-5.1 s here under full load
    // (the moment it shows is read after the fact, so never early). A slot the kill itself freed
    // shows at once. The bound is a third of the least it can be, so a late renewal before the
    // kill cannot fail it.
    let freed = lab().clock(COORDINATOR) - killed_at;
    eprintln!("the slot showed free {freed:.2}s after the kill");
    assert!(
        freed >= 1.1,
        "the slot freed {freed:.2}s after the kill, before its lease could run out"
    );
    let ran = finish(children);
    // max_failures 1: the hosts that had not started are held, their servers as they were.
    let held: Vec<&String> = ran
        .iter()
        .filter(|(_, r)| r.stdout.contains("max_failures 1), so the rollout stopped"))
        .map(|(h, _)| h)
        .collect();
    assert!(!held.is_empty(), "no host was held by the budget: {ran:#?}");
    for h in &held {
        assert!(
            ran[*h].stdout.contains(victim),
            "{h} does not name the failed host: {}",
            ran[*h].stdout
        );
    }

    // The killed host's next round finishes its attempt (restart, verification) and succeeds;
    // the budget is then free again and the held hosts go on.
    let resumed = fleet.rounds(&[victim]);
    assert_eq!(resumed[victim].code, 0, "{}", resumed[victim].stdout);
    assert!(
        resumed[victim].stdout.contains("finish the attempt"),
        "{}",
        resumed[victim].stdout
    );
    assert!(
        resumed[victim].stdout.contains("converged"),
        "{}",
        resumed[victim].stdout
    );
    let held: Vec<&str> = held.iter().map(|h| h.as_str()).collect();
    let rest = fleet.rounds(&held);
    for (host, r) in &rest {
        assert_eq!(r.code, 0, "{host}: {}", r.stdout);
    }
    let (code, rollout) = fleet.rollout_status(&changed);
    assert_eq!(code, 0, "{rollout}");
    assert_eq!(
        rollout["succeeded"].as_array().map(Vec::len),
        Some(6),
        "{rollout}"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn while_etcd_is_down_no_agent_restarts_and_the_rollout_completes_after() {
    let _turn = turn();
    let fleet = Fleet {
        service: "t-coord-down",
        port: 37404,
        rollout: "{ max_parallel: 2, max_failures: 1 }",
    };
    deploy_base(&fleet);
    let before = invocations(&fleet.unit());
    let changed = fleet.manifest(4096);
    fleet.commit(&changed, "shorter context");
    let children: Vec<(String, std::process::Child)> = FLEET
        .iter()
        .map(|h| (h.to_string(), fleet.spawn_round(h)))
        .collect();
    // 90 s bounds a canary that never succeeds (it does in seconds: a 1 s load, a 3 s window).
    fleet.wait_for(&changed, "succeeded", FLEET[0], Duration::from_secs(90));
    // Killed at once. The slots it held then are the only restarts that may go on while it is
    // down (they were granted before): read from a copy of its data, served by a second etcd on
    // the coordinator's own loopback, which no agent can reach (its health is polled for 30 s,
    // far longer than etcd takes to start).
    let restart_etcd = crate::lab::Undo::new(COORDINATOR, "systemctl start lab-etcd");
    let held = lab().sh(
        COORDINATOR,
        &format!(
            "systemctl kill -s KILL lab-etcd && systemctl reset-failed lab-etcd-copy 2>/dev/null; rm -rf /var/lib/lab-etcd-copy && cp -a /var/lib/lab-etcd /var/lib/lab-etcd-copy && \
             systemd-run --quiet --unit lab-etcd-copy /usr/local/bin/etcd --name lab --data-dir /var/lib/lab-etcd-copy --force-new-cluster \
               --listen-client-urls http://127.0.0.1:2479 --advertise-client-urls http://127.0.0.1:2479 \
               --listen-peer-urls http://127.0.0.1:2480 --initial-advertise-peer-urls http://127.0.0.1:2480 && \
             ok=; for i in $(seq 300); do ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:2479 endpoint health >/dev/null 2>&1 && {{ ok=1; break; }}; sleep 0.1; done; \
             [ -n \"$ok\" ] && ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:2479 get --prefix {}/services/{}/slots/ --keys-only; \
             s=$?; systemctl stop lab-etcd-copy; exit $s",
            fleet.prefix(),
            fleet.service
        ),
    );
    // When systemd saw etcd die (a restart that began after it had no slot to be granted).
    lab().wait_until(
        COORDINATOR,
        "! systemctl -q is-active lab-etcd",
        Duration::from_secs(30),
    );
    let down = lab().monotonic(COORDINATOR, "lab-etcd", "ActiveExitTimestampMonotonic");
    // An input of the fault, not a wait: etcd stays down longer than the slots' lease TTL (5 s),
    // and a lease must not run out while the cluster is down.
    std::thread::sleep(Duration::from_secs(8));
    restart_etcd.undo();
    let up = lab().monotonic(COORDINATOR, "lab-etcd", "ExecMainStartTimestampMonotonic");
    let ran = finish(children);
    for (host, r) in &ran {
        assert_eq!(r.code, 0, "{host}: {}{}", r.stdout, r.stderr);
    }
    let held: Vec<&str> = held
        .lines()
        .filter_map(|k| k.rsplit('/').next())
        .filter(|h| !h.is_empty())
        .collect();
    let windows = fleet.restarts(&before);
    eprintln!(
        "etcd down {down:.3}..{up:.3}, slots held then: {held:?}; restart windows: {windows:#?}"
    );
    assert!(
        windows.len() == FLEET.len() && windows.iter().all(|w| w.starts == 1),
        "one restart a host: {windows:#?}"
    );
    for w in &windows {
        assert!(
            !(w.began > down && w.began < up) || held.contains(&w.host.as_str()),
            "{} began restarting while etcd was down without a slot granted before: {windows:#?}",
            w.host
        );
    }
    assert!(most_at_once(&windows) <= 2, "{windows:#?}");
    let waited = ran
        .values()
        .any(|r| r.stdout.contains("the coordinator cannot be reached"));
    assert!(
        waited,
        "no agent said it waited for the coordinator: {ran:#?}"
    );
    assert_eq!(fleet.rollout_status(&changed).0, 0);

    // With etcd down: a change that only reloads goes through; one that restarts waits out
    // --coordinator-wait and changes nothing.
    lab().sh(COORDINATOR, "systemctl kill -s KILL lab-etcd");
    let _restart_etcd = crate::lab::Undo::new(COORDINATOR, "systemctl start lab-etcd");
    let host = FLEET[2];
    let before = lab().invocation(host, &fleet.unit());
    let renamed = changed.clone().description("renamed service");
    fleet.commit(&renamed, "renamed");
    let bounded = |h: &str| {
        let child = fleet.spawn_round_with(h, "--coordinator-poll 300ms --coordinator-wait 3s");
        finish(vec![(h.to_string(), child)])
            .remove(h)
            .expect("its round")
    };
    let reload = bounded(host);
    reload.assert_code(0);
    assert!(
        reload
            .stdout
            .contains(&format!("{host} {} reloaded", fleet.unit())),
        "{}",
        reload.stdout
    );
    assert_has(&reload.stdout, "the coordinator was not told");
    let restart = renamed.clone().flag("context-length", 2048);
    fleet.commit(&restart, "restart while etcd is down");
    let held = bounded(host);
    held.assert_code(1);
    assert!(
        held.stdout.contains("the coordinator cannot be reached")
            && held.stdout.contains("nothing was changed"),
        "{}",
        held.stdout
    );
    assert_eq!(
        lab().invocation(host, &fleet.unit()),
        before,
        "a restart happened without the coordinator"
    );
    assert!(!lab()
        .sh(host, &format!("cat /etc/systemd/system/{}", fleet.unit()))
        .contains("2048"));
}

/// An etcd on this machine's loopback with TLS, client certificates and a user: `reconcile status
/// --coordinator` reads it with the CA, the client certificate and the password from a file; a
/// wrong password is refused by etcd and shown nowhere; a plain connection to it fails clearly.
/// Needs no test host.
#[test]
#[ignore = "needs etcd: run by `tests/run.sh`"]
fn tls_client_certificates_and_a_password_reach_a_guarded_etcd_and_the_password_never_shows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sh = |script: &str| {
        stdout_of(
            Command::new("sh").arg("-c").arg(script).current_dir(d),
            script,
        )
    };
    // A CA, a server certificate for 127.0.0.1 and a client certificate, as an operator's PKI
    // would issue them.
    sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -subj /CN=test-ca -days 1 2>/dev/null && \
        printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > server.ext && \
        printf 'extendedKeyUsage=clientAuth\\n' > client.ext && \
        for n in server client; do \
          openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key -out $n.csr -subj /CN=reconcile-$n 2>/dev/null && \
          openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 1 -extfile $n.ext 2>/dev/null; \
        done");
    let port = 23850 + (std::process::id() % 100) as u16;
    let url = format!("https://127.0.0.1:{port}");
    let mut etcd = Command::new(which("etcd"))
        .args(["--name", "tls", "--data-dir"])
        .arg(d.join("data"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{}", port + 100),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{}", port + 100),
            "--initial-cluster",
            &format!("tls=http://127.0.0.1:{}", port + 100),
            "--cert-file",
            "server.pem",
            "--key-file",
            "server.key",
            "--trusted-ca-file",
            "ca.pem",
            "--client-cert-auth",
        ])
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd starts");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _etcd = Kill(&mut etcd);
    let ctl = format!(
        "ETCDCTL_API=3 etcdctl --endpoints {url} --cacert ca.pem --cert client.pem --key client.key"
    );
    let began = Instant::now();
    while Command::new("sh")
        .arg("-c")
        .arg(format!("{ctl} endpoint health"))
        .current_dir(d)
        .output()
        .map_or(true, |o| !o.status.success())
    {
        // 20 s bounds an etcd that never starts (it answers within a second or two).
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the TLS etcd did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    const PASSWORD: &str = "s3cret-agent-password";
    sh(&format!(
        "{ctl} user add root --new-user-password {PASSWORD} >/dev/null && {ctl} auth enable >/dev/null && \
         {ctl} --user root:{PASSWORD} put /tls/services/s/hosts/h1 '{{\"revision\":\"r\",\"commit\":\"c0ffee\",\"unit_sha256\":\"u\",\"state\":\"succeeded\",\"at\":1}}' >/dev/null"
    ));
    std::fs::write(d.join("password"), format!("{PASSWORD}\n")).unwrap();
    let status = |extra: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_reconcile"))
            .args([
                "status",
                "--coordinator",
                &format!("etcd://127.0.0.1:{port}"),
            ])
            .args(["--coordinator-prefix", "/tls", "--format", "json"])
            .args(extra)
            .envs(env.iter().copied())
            .current_dir(d)
            .output()
            .expect("reconcile runs");
        Ran::from(out)
    };
    let tls = [
        "--coordinator-ca",
        "ca.pem",
        "--coordinator-cert",
        "client.pem",
        "--coordinator-key",
        "client.key",
        "--coordinator-user",
        "root",
    ];
    let mut with_file: Vec<&str> = tls.to_vec();
    with_file.extend(["--coordinator-password-file", "password"]);
    let ran = status(&with_file, &[]);
    ran.assert_code(0);
    let rows = ran.json();
    assert_eq!(rows[0]["host"], "h1", "{rows}");
    assert_eq!(rows[0]["state"], "succeeded", "{rows}");

    let wrong = status(
        &tls,
        &[("RECONCILE_COORDINATOR_PASSWORD", "wrong-password-9f3k")],
    );
    wrong.assert_code(1);
    assert_has(&wrong.stderr, "cannot reach etcd");
    assert!(
        !wrong.stderr.contains("wrong-password-9f3k")
            && !wrong.stdout.contains("wrong-password-9f3k"),
        "the password was shown: {}{}",
        wrong.stdout,
        wrong.stderr
    );
    eprintln!("wrong password: {}", wrong.stderr);
    let plain = status(&[], &[]);
    eprintln!("no TLS: {}", plain.stderr);
    plain.assert_code(1);
    assert_has(&plain.stderr, "--coordinator-ca");
}
