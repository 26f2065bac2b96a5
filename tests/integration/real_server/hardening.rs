//! The real server under `systemd.hardening: standard` (docs/hardening.md): SGLang 0.5.23 on its
//! CPU engine converges and serves inside the sandbox, and systemd really put it there. The test
//! hosts have no /dev/nvidia* nodes, which `DevicePolicy=closed` does not mind: the GPUs' device
//! groups and NCCL's segments in /dev/shm are what only a GPU host can show. The preset's
//! `systemd-analyze security` score is tests/hardening.rs's.

use super::{slots, stage, Service, HOSTS};
use crate::lab::{assert_has, lab};

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_hardened_unit_converges_and_serves() {
    let _slot = slots(1);
    // Root, as the tier's servers run (no `User=`): the preset's hardest case, whose home must
    // stay writable while the rest of the OS is read-only.
    let s = Service::new("t-rs-hardened", HOSTS[1], 38006).systemd("hardening", "standard");
    let _stopped = s.fresh();
    let report = s.converge();
    let v = &report["verification"];
    let identity = stage(v, "identity")["detail"].as_str().unwrap();
    assert_has(identity, "`tiny-t-rs-hardened`");

    // The unit on the host carries the preset, and systemd runs the server under it.
    let unit = s.unit_file();
    for line in [
        "ProtectSystem=strict",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia* rw",
        "SystemCallFilter=@system-service",
    ] {
        assert!(
            unit.contains(&format!("\n{line}\n")),
            "no {line} in\n{unit}"
        );
    }
    let shown = lab().sh(
        s.host,
        &format!(
            "systemctl show -p ProtectSystem -p PrivateTmp -p DevicePolicy -p NoNewPrivileges {}",
            s.unit()
        ),
    );
    for property in [
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "NoNewPrivileges=yes",
    ] {
        assert!(
            shown.contains(property),
            "{property} not in force:\n{shown}"
        );
    }
    // In the kernel's own words, for the server's main process: no new privileges, a seccomp
    // filter, and no capability but CAP_IPC_LOCK (bit 14; the container's own bounding set may
    // lack even that one).
    let status = lab().sh(
        s.host,
        &format!(
            "grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/$(systemctl show -p MainPID --value {})/status",
            s.unit()
        ),
    );
    for field in ["NoNewPrivs:\t1", "Seccomp:\t2"] {
        assert!(status.contains(field), "no {field:?} in\n{status}");
    }
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no CapBnd in\n{status}"));
    assert_eq!(bounding & !(1 << 14), 0, "capabilities left: {bounding:#x}");

    // It answers: a real generation through the sandbox (ZeroMQ between its processes, /dev/shm,
    // its private /tmp), not only /health.
    let (code, body) = s.http(
        "POST",
        "/v1/completions",
        Some(r#"{"model": "tiny-t-rs-hardened", "prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": true}"#),
        None,
    );
    assert_eq!(code, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON answer");
    assert_eq!(
        body["usage"]["completion_tokens"], 8,
        "eight tokens generated: {body:#}"
    );

    // A second apply of the same manifest touches nothing: the host's unit reads back as the
    // rendered one, preset and all.
    s.applies_as_a_no_op();
    s.stop();
}
