//! Security: secrets never leave reconcile, and manifest values with shell metacharacters are
//! data, never code, on the host.

use crate::lab::{
    assert_has, lab, manifest, run_on, Manifest, Reconcile, APPLY, BAD_KEY, NEW_KEY, SECURITY,
};

const CANARIES: [&str; 3] = [
    "hf_canary_7f3a91c2",
    "creds-canary-55e0b1",
    "sk-canary-flag-0c4d",
];

/// A secret with what a shell or systemd would read as syntax: quotes, a backslash, a variable,
/// a command, spaces.
const TRICKY: &str = "p\"a\\ss $HOME `id` 'q' x";

/// A service carrying three secrets: a name that looks secret, one declared in `secret_env`, and
/// SGLang's `--api-key` flag (which SGLang itself logs in its resolved arguments).
fn secret_service(port: u16) -> Manifest {
    manifest("t-sec-canary", &[APPLY])
        .flag("api-key", CANARIES[2])
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", SECURITY.gpu_pair(port))
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("HF_TOKEN", CANARIES[0])
        .env("MY_CREDS", CANARIES[1])
        .env("DB_PASSWORD", TRICKY)
        .section("secret_env", vec!["MY_CREDS"])
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "5s"),
            ("load_deadline", "20s"),
        ])
}

fn assert_no_canary(what: &str, text: &str) {
    for canary in CANARIES {
        assert!(
            !text.contains(canary),
            "{what} shows the secret {canary}:\n{text}"
        );
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_planted_secret_appears_in_no_output_log_error_or_record() {
    let unit = "t-sec-canary.service";
    lab().sh(APPLY, &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"));
    let good = secret_service(38001);
    let crashing = good
        .clone()
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "2");
    let mut runs = Vec::new();
    for format in ["text", "markdown", "json"] {
        runs.push((
            format!("plan --format {format}"),
            Reconcile::new()
                .manifest("a.yaml", &good)
                .env("RECONCILE_LOG", "trace")
                .args(&["plan", "--format", format])
                .run(),
        ));
    }
    runs.push(("render".into(), run_on(&good, &["render"])));
    // While the applies run, a local user reads every command line: no secret of the
    // environment is on any (the server's own carries its --api-key, as SGLang reads it).
    let ((), seen) = scanning(APPLY, "canary", &CANARIES[..2], || {
        for format in ["json", "text"] {
            let text = if format == "json" { &good } else { &crashing };
            runs.push((
                format!("apply --format {format}"),
                Reconcile::new()
                    .manifest("a.yaml", text)
                    .env("RECONCILE_LOG", "trace")
                    .args(&["apply", "--format", format])
                    .run(),
            ));
        }
    });
    assert_eq!(
        seen, "",
        "a local user read a secret on a command line during apply"
    );
    let (_, converged) = &runs[4];
    converged.assert_code(0);
    let (_, rolled_back) = &runs[5];
    rolled_back.assert_code(3);
    assert!(
        rolled_back.stdout.contains("api_key='<redacted>'"),
        "the failed start's journal is shown, redacted:\n{}",
        rolled_back.stdout
    );
    assert!(rolled_back.stderr.len() > 1000, "trace logging was on");
    for (what, ran) in &runs {
        assert_no_canary(&format!("{what} stdout"), &ran.stdout);
        assert_no_canary(&format!("{what} stderr"), &ran.stderr);
    }
    // A bad secret value: the error names the field, not the value.
    let bad = good
        .clone()
        .env("MY_CREDS", format!("{}\nsecond line", CANARIES[1]));
    let ran = run_on(&bad, &["plan"]);
    assert_eq!(ran.code, 1);
    assert_has(&ran.stderr, "env.MY_CREDS: the value holds a newline");
    assert_no_canary("a validation error", &ran.stderr);
    // The host keeps what it must (the unit, its generations: 0600 root) and no record holds a secret.
    let records = lab().sh(
        APPLY,
        &format!(
            "cat /var/lib/reconcile/{unit}/current.json /var/lib/reconcile/{unit}/history.jsonl"
        ),
    );
    assert_has(&records, "manifest_sha256");
    assert_no_canary("the deployment record", &records);
    let modes = lab().sh(
        APPLY,
        &format!("stat -c '%a %U' /var/lib/reconcile/{unit}/generations/* | sort -u"),
    );
    assert_eq!(modes.trim(), "600 root");

    // A secret reaches only the server: another local user reads none in the unit file or
    // through systemd's D-Bus API, which shows any user an inline Environment=.
    let seen_by_nobody = lab().sh(
        APPLY,
        &format!("su nobody -s /bin/sh -c 'systemctl show -p Environment -p EnvironmentFiles {unit}; cat /etc/systemd/system/{unit}; cat /var/lib/reconcile/secrets/* 2>&1; true'"),
    );
    // Not the --api-key, which SGLang reads from its command line only (docs/guarantees.md).
    for canary in &CANARIES[..2] {
        assert!(
            !seen_by_nobody.contains(canary),
            "another local user reads {canary}:\n{seen_by_nobody}"
        );
    }
    assert_has(
        &seen_by_nobody,
        "EnvironmentFiles=/var/lib/reconcile/secrets/t-sec-canary.service-",
    );
    assert_has(&seen_by_nobody, "Permission denied");
    // Root's alone, in folders root's alone; and the server got every value exactly.
    let modes = lab().sh(
        APPLY,
        "stat -c '%a %U %n' /var/lib/reconcile /var/lib/reconcile/secrets /var/lib/reconcile/secrets/t-sec-canary.service-*",
    );
    for line in modes.lines() {
        assert!(
            line.starts_with("700 root ") || line.starts_with("600 root "),
            "{modes}"
        );
    }
    let environ = lab().sh(
        APPLY,
        &format!("tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value {unit})/environ"),
    );
    for want in [
        format!("HF_TOKEN={}", CANARIES[0]),
        format!("MY_CREDS={}", CANARIES[1]),
        format!("DB_PASSWORD={TRICKY}"),
    ] {
        assert!(
            environ.lines().any(|l| l == want),
            "the server lacks {want}"
        );
    }
    lab().sh(APPLY, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn shell_metacharacters_in_manifest_values_stay_data_on_the_host() {
    let unit = "t-sec-meta.service";
    let model =
        "/models/it's $(touch /tmp/pwned-model) `touch /tmp/pwned-tick`; touch /tmp/pwned-semi";
    lab().sh(APPLY, &format!("rm -f /tmp/pwned-*; systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}"));
    // The harness creates the oddly named model folder with the name as an argument, not as code.
    let out = std::process::Command::new("ssh")
        .args([
            "-F",
            &lab().ssh_config().display().to_string(),
            APPLY,
            "sh",
            "-c",
            "'mkdir -p -- \"$1\"'",
            "sh",
        ])
        .arg(format!("'{}'", model.replace('\'', "'\\''")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = manifest("t-sec-meta", &[APPLY])
        .flag("speculative-algorithm", "; touch /tmp/pwned-flag")
        .model_path(model)
        .served_model_name("$(touch /tmp/pwned-name)")
        .port(38002)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", SECURITY.gpu_pair(38002))
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("ODD", "`touch /tmp/pwned-env` && $(touch /tmp/pwned-env2)")
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "5s"),
            ("load_deadline", "20s"),
        ]);
    let plan = run_on(&text, &["plan", "--format", "json"]);
    plan.assert_code(2);
    assert!(
        plan.json()["units"][0]["preflight"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{}",
        plan.stdout
    );
    let (code, report) = {
        let ran = run_on(&text, &["apply", "--format", "json"]);
        (ran.code, ran.json()["units"][0].clone())
    };
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["outcome"], "converged");
    let pwned = lab().sh(APPLY, "ls /tmp | grep -c pwned || true");
    assert_eq!(
        pwned.trim(),
        "0",
        "a manifest value ran as code on the host"
    );
    let pid = lab().sh(APPLY, &format!("systemctl show -p MainPID --value {unit}"));
    let argv = lab().sh(
        APPLY,
        &format!("tr '\\0' '\\n' < /proc/{}/cmdline", pid.trim()),
    );
    assert!(
        argv.lines().any(|a| a == model),
        "the server got the model path as one argument:\n{argv}"
    );
    assert!(
        argv.lines().any(|a| a == "$(touch /tmp/pwned-name)"),
        "{argv}"
    );
    lab().sh(APPLY, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_new_host_key_is_recorded_only_when_asked_and_a_changed_one_never_is() {
    let known = lab().file("known_hosts_new");
    std::fs::write(&known, "").unwrap();
    let text = manifest("t-sec-newkey", &[NEW_KEY]);
    let ran = run_on(&text, &["plan"]);
    ran.assert_code(1);
    assert_has(&ran.stdout, "Host key verification failed");
    assert_eq!(
        std::fs::read_to_string(&known).unwrap(),
        "",
        "nothing recorded without the flag"
    );
    let ran = run_on(&text, &["plan", "--accept-new-host-keys"]);
    ran.assert_code(2);
    assert!(
        std::fs::read_to_string(&known)
            .unwrap()
            .starts_with(NEW_KEY),
        "the new key is recorded"
    );
    let changed = manifest("t-sec-newkey", &[BAD_KEY]);
    let ran = run_on(&changed, &["plan", "--accept-new-host-keys"]);
    assert_eq!(
        ran.code, 1,
        "a changed key is refused even with the flag: {}",
        ran.stdout
    );
    assert_has(&ran.stdout, "REMOTE HOST IDENTIFICATION HAS CHANGED");
}

/// Runs `run` while a local user (`nobody`) reads every command line on `host` over and over,
/// and returns what it found of `secrets`. Each pattern ends in a bracket expression, so that
/// the scan's own command line does not match it.
fn scanning<T>(host: &str, tag: &str, secrets: &[&str], run: impl FnOnce() -> T) -> (T, String) {
    let scan = format!("/tmp/t-sec-scan-{tag}");
    let patterns: Vec<String> = secrets
        .iter()
        .map(|s| {
            let (head, last) = s.split_at(s.len() - 1);
            format!("-e {head}[{last}]")
        })
        .collect();
    lab().sh(
        host,
        &format!(
            "rm -f {scan} {scan}.stop {scan}.done; setsid su nobody -s /bin/sh -c 'while [ ! -e {scan}.stop ]; do cat /proc/[0-9]*/cmdline 2>/dev/null | tr \"\\0\" \" \" | grep -o {}; done >> {scan}; touch {scan}.done' >/dev/null 2>&1 </dev/null &",
            patterns.join(" ")
        ),
    );
    let out = run();
    lab().sh(host, &format!("touch {scan}.stop"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while lab()
        .sh(host, &format!("test -e {scan}.done && echo done; true"))
        .trim()
        != "done"
    {
        assert!(std::time::Instant::now() < deadline, "the scan never ended");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let seen = lab().sh(
        host,
        &format!("cat {scan}; rm -f {scan} {scan}.stop {scan}.done"),
    );
    (out, seen.trim().to_string())
}

/// The preflight findings of a plan's only unit: (check, message).
fn preflight_of(ran: &crate::lab::Ran) -> Vec<(String, String)> {
    let json = ran.json();
    json["units"][0]["preflight"]
        .as_array()
        .unwrap_or_else(|| panic!("no preflight in {json:#}"))
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("check"), s("message"))
        })
        .collect()
}

/// Where planted code leaves a marker for each uid that ran it: one prefix a test, as they run
/// at once on one host.
const PLANTED_MARKERS: &str = "/tmp/t-sec-planted-ran-as";
const PTH_MARKERS: &str = "/tmp/t-sec-pth-ran-as";

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn code_the_service_user_planted_never_runs_as_root_in_plan_or_apply() {
    let host = SECURITY.host();
    // The unit runs as `nobody` in a folder of theirs holding a `sglang` package of their own,
    // as the server would import it first (`python -m` puts the working directory first).
    lab().sh(
        host,
        &format!(
            r#"rm -rf /srv/t-sec-hs {PLANTED_MARKERS}.* /var/lib/reconcile/deep-check; mkdir -p /srv/t-sec-hs/sglang
cat > /srv/t-sec-hs/sglang/__init__.py <<'EOF'
import os
open("{PLANTED_MARKERS}.%d" % os.getuid(), "w")
raise ImportError("planted")
EOF
cp /srv/t-sec-hs/sglang/__init__.py /srv/t-sec-hs/sitecustomize.py
chown -R nobody /srv/t-sec-hs"#
        ),
    );
    let planted = manifest("t-sec-planted", &[host])
        .port(38003)
        .systemd("User", "nobody")
        .systemd("WorkingDirectory", "/srv/t-sec-hs");
    for args in [
        &["plan", "--format", "json", "--deep"][..],
        &["apply", "--format", "json"][..],
    ] {
        let ran = Reconcile::new()
            .manifest("a.yaml", &planted)
            .args(args)
            .run();
        assert_ne!(
            ran.code, 0,
            "{args:?}: the planted package breaks the check:\n{}{}",
            ran.stdout, ran.stderr
        );
        let ran_as = lab().sh(host, &format!("ls {PLANTED_MARKERS}.* 2>/dev/null; true"));
        assert!(
            !ran_as.contains(&format!("{PLANTED_MARKERS}.0")),
            "{args:?} ran the service user's code as root: {ran_as}"
        );
    }
    // It ran as the unit's user, as the server would: its refusal is the plan's.
    assert!(lab()
        .sh(host, &format!("ls {PLANTED_MARKERS}.*"))
        .contains(&format!("{PLANTED_MARKERS}.65534")));
    lab().sh(host, &format!("rm -rf /srv/t-sec-hs {PLANTED_MARKERS}.*; systemctl disable --now t-sec-planted 2>/dev/null; rm -f /etc/systemd/system/t-sec-planted.service; systemctl daemon-reload"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_venv_another_user_can_write_is_named_and_root_runs_none_of_it() {
    let host = SECURITY.host();
    let venv = "/opt/t-sec-venv";
    // A venv of the system's SGLang (the stand-in), whose site folder `nobody` owns, with a
    // `.pth` whose `import` line is code.
    lab().sh(
        host,
        &format!(
            r#"{script}rm -f {PTH_MARKERS}.*
echo 'import os; open("{PTH_MARKERS}.%d" % os.getuid(), "w")' > "$site/t-sec.pth"
chown -R nobody "$site""#,
            script = crate::lab::venv_script(venv, None)
        ),
    );
    let root_unit = manifest("t-sec-venv", &[host])
        .port(38004)
        .python(format!("{venv}/bin/python3").as_str());
    let ran = run_on(&root_unit, &["plan", "--format", "json", "--deep"]);
    let found = preflight_of(&ran);
    let owner: Vec<&String> = found
        .iter()
        .filter(|(c, _)| c == "owner")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(owner.len(), 1, "{found:?}");
    assert_has(owner[0], "site-packages (writable by its owner, uid 65534)");
    assert_has(owner[0], "runs as root");
    assert!(
        found
            .iter()
            .any(|(c, m)| c == "deep" && m.contains("root did not start it")),
        "the check that imports SGLang did not start as root: {found:?}"
    );
    assert_eq!(
        ran.code, 2,
        "a warning; the plan goes on:\n{}{}",
        ran.stdout, ran.stderr
    );
    // `--strict` refuses it, in plan and in apply, touching nothing.
    for args in [&["plan", "--strict"][..], &["apply", "--strict"][..]] {
        let ran = Reconcile::new()
            .manifest("a.yaml", &root_unit)
            .args(args)
            .run();
        assert_eq!(ran.code, 1, "{args:?}:\n{}{}", ran.stdout, ran.stderr);
    }
    assert_eq!(
        lab()
            .sh(
                host,
                "test -e /etc/systemd/system/t-sec-venv.service && echo there; true"
            )
            .trim(),
        ""
    );
    // The version was still read, by root's interpreter alone, and no `.pth` code ran as root.
    assert!(
        !found.iter().any(|(c, _)| c == "sglang-version"),
        "{found:?}"
    );
    let ran_as = lab().sh(host, &format!("ls {PTH_MARKERS}.* 2>/dev/null; true"));
    assert!(
        !ran_as.contains(&format!("{PTH_MARKERS}.0")),
        "root ran the .pth: {ran_as}"
    );
    // The `.pth` is live code: any start of that Python runs it, as `nobody`'s here.
    lab().sh(
        host,
        &format!("su nobody -s /bin/sh -c '{venv}/bin/python3 -c pass'"),
    );
    let ran_as = lab().sh(host, &format!("ls {PTH_MARKERS}.*"));
    assert_has(&ran_as, &format!("{PTH_MARKERS}.65534"));
    lab().sh(host, &format!("rm -rf {venv} {PTH_MARKERS}.*"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn no_process_of_reconcile_on_the_host_carries_a_secret_on_its_command_line() {
    let host = SECURITY.host();
    let canary = "sk-canary-argv-7d1e";
    let unit = manifest("t-sec-argv", &[host])
        .port(38005)
        .flag("api-key", canary)
        .env("HF_TOKEN", "hf_canary_argv_90ab");
    // A local user reads every command line on the host while plan checks the unit deeply (no
    // verdict kept from an earlier run, which would spare the check).
    lab().sh(host, "rm -rf /var/lib/reconcile/deep-check");
    let (ran, seen) = scanning(
        host,
        "argv",
        &["sk-canary-argv-7d1e", "hf_canary_argv_90ab"],
        || {
            run_on(
                &unit,
                &["plan", "--format", "json", "--deep", "--trace-remote"],
            )
        },
    );
    assert!(
        ran.stderr.contains("command=\"deep check\""),
        "the deep check ran while the scan did:\n{}",
        ran.stderr
    );
    assert_eq!(seen, "", "a local user read a secret on a command line");
    assert!(!ran.stdout.contains(canary));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_host_that_floods_its_answer_is_one_failed_host() {
    // A unit file of 80 MiB on one host: the survey reads it whole with `cat`, past the 64 MiB
    // reconcile reads of a command's output. Another host is planned as usual.
    let flooded = SECURITY.host();
    let path = "/etc/systemd/system/t-sec-flood.service";
    lab().sh(
        flooded,
        &format!("head -c 83886080 /dev/zero | tr '\\0' x > {path}"),
    );
    let ran = Reconcile::new()
        .manifest("a.yaml", manifest("t-sec-flood", &[flooded]).port(38003))
        .manifest("b.yaml", manifest("t-sec-calm", &[crate::lab::SHARED]))
        .args(&["plan", "--format", "json", "--no-deep"])
        .run();
    lab().sh(flooded, &format!("rm -f {path}"));
    let json = ran.json();
    let units = json["units"].as_array().unwrap();
    let of = |unit: &str| {
        units
            .iter()
            .find(|u| u["unit"] == unit)
            .unwrap_or_else(|| panic!("no {unit} in {json:#}"))
    };
    let error = of("t-sec-flood.service")["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("printed more than 64 MiB on its stdout"),
        "{json:#}"
    );
    assert_eq!(of("t-sec-calm.service")["verdict"], "install", "{json:#}");
    assert_eq!(ran.code, 1, "{}", ran.stderr);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_journal_full_of_escape_sequences_is_shown_not_acted_on() {
    let host = SECURITY.host();
    let unit = "t-sec-escape.service";
    // A Python that is the host's own for reconcile's checks (`-c`), and a server that writes
    // what would retitle the terminal, clear it and move the cursor, then a 20,000-character
    // line, and exits 1: its journal is what the failed start's report shows.
    let python = "/usr/local/bin/t-sec-escape-python";
    lab().put(
        host,
        python,
        "#!/bin/sh\nfor a; do [ \"$a\" = -c ] && exec /usr/bin/python3 \"$@\"; done\nprintf '\\033]0;owned\\007title set\\n\\033[2Jscreen cleared\\n\\033[1Aup\\n' >&2\nhead -c 20000 /dev/zero | tr '\\0' y >&2; echo >&2\nexit 1\n",
    );
    lab().sh(host, &format!("chmod 755 {python}"));
    let text = manifest("t-sec-escape", &[host])
        .port(38006)
        .python(python)
        .verify_all(&[("crash_window", "3s"), ("load_deadline", "20s")]);
    let ran = run_on(&text, &["apply", "--no-deep"]);
    ran.assert_code(3);
    assert_has(&ran.stdout, "\\x1b]0;owned\\x07title set");
    assert_has(&ran.stdout, "\\x1b[2Jscreen cleared");
    assert!(
        !ran.stdout.contains('\u{1b}'),
        "an escape reached the terminal"
    );
    assert_has(
        &ran.stdout,
        "more characters; --format json has the whole line]",
    );
    let json = run_on(&text, &["apply", "--no-deep", "--format", "json"]).json();
    let journal = json["units"][0]["journal"].as_str().unwrap_or_default();
    assert!(journal.contains("\u{1b}]0;owned\u{7}"), "{json:#}");
    // The long line is `tr`'s, a child that has often died by the time journald reads it.
    assert!(
        journal.contains(&"y".repeat(20000)),
        "JSON keeps the line whole: {:?}",
        journal.replace(&"y".repeat(100), "y…")
    );
    lab().sh(
        host,
        &format!("rm -f {python} /etc/systemd/system/{unit}; systemctl daemon-reload"),
    );
}
