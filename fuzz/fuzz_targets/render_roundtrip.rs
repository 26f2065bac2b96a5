//! For every manifest that parses and validates, the unit rendered for each of its hosts must read
//! back (the way systemd reads it) to exactly the model `render` meant: the same argv, environment
//! and settings. A difference means either systemd would run something other than the manifest
//! says, or `plan` would see a change on every run.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::manifest::{parse, validate, FlagValue};
use reconcile_fuzz::unit::{parse_unit, render};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = parse("fuzz.yaml", text) else {
        return;
    };
    if validate(&m, text).is_err() {
        return;
    }
    for host in &m.hosts {
        let desired = render(&m, host);
        let back = parse_unit(&desired.text);
        assert_eq!(
            back, desired.model,
            "unit for host {:?} reads back differently:\n{}",
            host.name, desired.text
        );

        // The model itself says what the manifest says.
        let argv = &desired.model.exec_start;
        assert_eq!(argv[0], m.sglang.python);
        assert_eq!(argv[1..3], ["-m", "sglang.launch_server"]);
        assert_eq!(argv.last().unwrap(), &m.sglang.port.to_string());
        let mut env = m.env.clone();
        env.extend(host.env.clone());
        assert_eq!(desired.model.env, env);
        let mut flags = m.sglang.flags.clone();
        flags.extend(host.flags.clone());
        for (name, value) in &flags {
            // Only one way round: a list value may itself look like `--other`.
            if matches!(value, FlagValue::Switch(false)) {
                continue;
            }
            let bare = format!("--{name}");
            let with_value = format!("--{name}=");
            assert!(
                argv.iter()
                    .any(|a| *a == bare || a.starts_with(&with_value)),
                "flag {name} = {value:?} missing from {argv:?}"
            );
        }
    }
});
