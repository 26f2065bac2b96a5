//! Security: secrets never leave reconcile, and manifest values with shell metacharacters are
//! data, never code, on the host.

use crate::lab::{lab, manifest, Manifest, Reconcile, APPLY, BAD_KEY, NEW_KEY, SECURITY};

const CANARIES: [&str; 3] = [
    "hf_canary_7f3a91c2",
    "creds-canary-55e0b1",
    "sk-canary-flag-0c4d",
];

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
    runs.push((
        "render".into(),
        Reconcile::new()
            .manifest("a.yaml", &good)
            .args(&["render"])
            .run(),
    ));
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
    let (_, converged) = &runs[4];
    assert_eq!(
        converged.code, 0,
        "{}{}",
        converged.stdout, converged.stderr
    );
    let (_, rolled_back) = &runs[5];
    assert_eq!(
        rolled_back.code, 3,
        "{}{}",
        rolled_back.stdout, rolled_back.stderr
    );
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
    let ran = Reconcile::new()
        .manifest("a.yaml", &bad)
        .args(&["plan"])
        .run();
    assert_eq!(ran.code, 1);
    assert!(
        ran.stderr
            .contains("env.MY_CREDS: the value holds a newline"),
        "{}",
        ran.stderr
    );
    assert_no_canary("a validation error", &ran.stderr);
    // The host keeps what it must (the unit, its generations: 0600 root) and no record holds a secret.
    let records = lab().sh(
        APPLY,
        &format!(
            "cat /var/lib/reconcile/{unit}/current.json /var/lib/reconcile/{unit}/history.jsonl"
        ),
    );
    assert!(records.contains("manifest_sha256"), "{records}");
    assert_no_canary("the deployment record", &records);
    let modes = lab().sh(
        APPLY,
        &format!("stat -c '%a %U' /var/lib/reconcile/{unit}/generations/* | sort -u"),
    );
    assert_eq!(modes.trim(), "600 root");
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
    let plan = Reconcile::new()
        .manifest("a.yaml", &text)
        .args(&["plan", "--format", "json"])
        .run();
    assert_eq!(plan.code, 2, "{}{}", plan.stdout, plan.stderr);
    assert!(
        plan.json()["units"][0]["preflight"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{}",
        plan.stdout
    );
    let (code, report) = {
        let ran = Reconcile::new()
            .manifest("a.yaml", &text)
            .args(&["apply", "--format", "json"])
            .run();
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
    let ran = Reconcile::new()
        .manifest("a.yaml", &text)
        .args(&["plan"])
        .run();
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("Host key verification failed"),
        "{}",
        ran.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&known).unwrap(),
        "",
        "nothing recorded without the flag"
    );
    let ran = Reconcile::new()
        .manifest("a.yaml", &text)
        .args(&["plan", "--accept-new-host-keys"])
        .run();
    assert_eq!(ran.code, 2, "{}{}", ran.stdout, ran.stderr);
    assert!(
        std::fs::read_to_string(&known)
            .unwrap()
            .starts_with(NEW_KEY),
        "the new key is recorded"
    );
    let changed = manifest("t-sec-newkey", &[BAD_KEY]);
    let ran = Reconcile::new()
        .manifest("a.yaml", &changed)
        .args(&["plan", "--accept-new-host-keys"])
        .run();
    assert_eq!(
        ran.code, 1,
        "a changed key is refused even with the flag: {}",
        ran.stdout
    );
    assert!(
        ran.stdout
            .contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{}",
        ran.stdout
    );
}
