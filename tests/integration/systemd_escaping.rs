//! What systemd executes is exactly what the manifest says: hostile values go through a rendered
//! unit, a real daemon-reload and a real start, and come back from the running process.

use crate::lab::{assert_has, lab, manifest, Reconcile, ESCAPING};

const HOSTILE: [&str; 16] = [
    "two words",
    "tab\there",
    "double \"quoted\"",
    "it's",
    "back\\slash and trailing\\",
    "$HOME and ${PATH}",
    "$$ twice",
    "100% and %n%i%%",
    "; rm -rf /",
    "--not-a-flag",
    "ünïcödé ✓ 模型",
    "",
    "  padded  ",
    "{\"json\": [1, 2]}",
    "`backticks` $(subshell) | pipe & amp > redirect",
    "\\x41 \\n literal escapes",
];

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn hostile_values_reach_the_process_exactly() {
    // Each value is passed as --speculative-algorithm (a free string in SGLang 0.5.23) and as an
    // env var, one unit per value, all started at once.
    for (i, value) in HOSTILE.iter().enumerate() {
        let service = format!("t-hostile-{i}");
        let text = manifest(&service, &[ESCAPING])
            .flag("speculative-algorithm", *value)
            .port(31000 + i)
            .without_env("NCCL_P2P_DISABLE")
            .env("HOSTILE", *value);
        let run = Reconcile::new().manifest("a.yaml", &text);
        lab().put(
            ESCAPING,
            &format!("/etc/systemd/system/{service}.service"),
            &run.rendered(ESCAPING),
        );
    }
    let units: Vec<String> = (0..HOSTILE.len())
        .map(|i| format!("t-hostile-{i}.service"))
        .collect();
    lab().sh(
        ESCAPING,
        &format!(
            "systemctl daemon-reload && systemctl start {}",
            units.join(" ")
        ),
    );
    for (i, value) in HOSTILE.iter().enumerate() {
        let unit = &units[i];
        let pid = lab()
            .sh(
                ESCAPING,
                &format!("systemctl show -p MainPID --value {unit}"),
            )
            .trim()
            .to_string();
        assert_ne!(
            pid,
            "0",
            "{unit} is not running: {}",
            lab().sh(
                ESCAPING,
                &format!("journalctl -u {unit} -n 5 --no-pager || true")
            )
        );
        let argv: Vec<String> = lab()
            .sh(ESCAPING, &format!("cat /proc/{pid}/cmdline"))
            .split('\0')
            .map(str::to_string)
            .collect();
        let expected_flag = if value.starts_with('-') {
            vec![format!("--speculative-algorithm={value}")]
        } else {
            vec!["--speculative-algorithm".to_string(), value.to_string()]
        };
        let at = argv
            .iter()
            .position(|a| a.starts_with("--speculative-algorithm"))
            .expect("flag present");
        assert_eq!(
            argv[at..at + expected_flag.len()],
            expected_flag[..],
            "argv of {unit}: {argv:?}"
        );
        let environ = lab().sh(ESCAPING, &format!("cat /proc/{pid}/environ"));
        let hostile_env = environ
            .split('\0')
            .find_map(|kv| kv.strip_prefix("HOSTILE="))
            .expect("HOSTILE set");
        assert_eq!(hostile_env, *value, "env of {unit}");
        let shown = lab().sh(
            ESCAPING,
            &format!("systemctl show -p Environment --value {unit}"),
        );
        assert_has(&shown, "CUDA_VISIBLE_DEVICES=0,1");
    }
    lab().sh(ESCAPING, &format!("systemctl stop {}", units.join(" ")));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_specifiers_a_unit_is_read_with_are_what_systemd_resolves() {
    // Every specifier plan and import resolve without the host, run through a real systemd.
    use reconcile_core::unit::specifier::fixed;
    let letters: Vec<char> = "hugUGtSCLETV".chars().collect();
    let written: Vec<String> = letters.iter().map(|c| format!("%{c}")).collect();
    let unit = "t-esc-specifiers.service";
    let out = "/run/t-esc-specifiers.out";
    lab().put(
        ESCAPING,
        &format!("/etc/systemd/system/{unit}"),
        &format!(
            "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'printf \"%%s\\\\n\" \"$$@\" > {out}' sh {}\n",
            written.join(" ")
        ),
    );
    let resolved = lab().sh(
        ESCAPING,
        &format!("systemctl daemon-reload && systemctl start {unit} && cat {out}; rm -f {out} /etc/systemd/system/{unit}; systemctl daemon-reload"),
    );
    let expected: Vec<&str> = letters.iter().map(|&c| fixed(c).unwrap()).collect();
    assert_eq!(resolved.lines().collect::<Vec<_>>(), expected);
}
