//! What each fuzz target checks, one module a target, each with its `run`. The fuzzer binaries
//! (`fuzz_targets/`) call `run` on inputs libFuzzer makes; `tests/fuzz_corpus.rs` of the main
//! crate includes this file and calls `run` on every input of the checked-in corpora, so a plain
//! `cargo test` replays them. Paths name the crates themselves (`reconcile`, `reconcile_core`),
//! which both builds link.

pub mod deployment_record {
    use reconcile_core::record::{parse_history, parse_record, record_json, RecordProblem};

    /// Any `current.json` or `history.jsonl` a host holds (damaged, truncated, hand-edited, written by
    /// a newer reconcile) must come back as records or as reasons, never a panic; `history.jsonl`
    /// keeps one entry per line, so deployment numbers stay right; and a record that reads writes
    /// back as one line that reads again as the same record.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let lines = parse_history(&text);
        assert_eq!(lines.len(), text.lines().count());
        for line in lines.iter().filter_map(|l| l.as_ref().err()) {
            let _ = line.to_string();
        }
        match parse_record(&text) {
            Ok(r) => {
                let json = record_json(&r).expect("a record that was read serializes");
                assert!(!json.contains('\n'), "{json}");
                let back = parse_record(&json).expect("a written record reads back");
                // serde_json (without its `float_roundtrip` feature) may read a float back a unit in
                // the last place off; that is not a record of something else.
                let close = match (r.load_seconds, back.load_seconds) {
                    (Some(a), Some(b)) => {
                        a == b
                            || (a.is_sign_negative() == b.is_sign_negative()
                                && a.to_bits().abs_diff(b.to_bits()) <= 2)
                    }
                    (a, b) => a == b,
                };
                assert!(close, "{:?} -> {:?}", r.load_seconds, back.load_seconds);
                let mut back = back;
                back.load_seconds = r.load_seconds;
                assert_eq!(back, r);
            }
            Err(RecordProblem::Unreadable(_)) => panic!("parsing never reports a read failure"),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

pub mod liveness {
    use reconcile::probe::liveness::Liveness;

    /// Any output of the liveness script (cgroup files, journal counts, a cursor) must parse into a
    /// reading without panicking; a cursor, when there is one, is never empty.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let l = Liveness::parse(&text);
        assert!(l.cursor.as_deref().is_none_or(|c| !c.is_empty()));
    }
}

pub mod manifest_parse {
    use reconcile::manifest::{parse, validate, validate_fleet};

    /// Any text, valid YAML or not, must come back from `parse` and `validate` as a manifest or as
    /// errors, never as a panic (or a hang, or unbounded memory: libFuzzer's -timeout / -rss_limit_mb).
    pub fn run(data: &[u8]) {
        let Ok(text) = std::str::from_utf8(data) else {
            return;
        };
        let manifest = match parse("fuzz.yaml", text) {
            Ok(m) => m,
            Err(errors) => {
                // Errors are shown to users: formatting them must not panic either.
                for e in &errors.0 {
                    let _ = e.to_string();
                }
                return;
            }
        };
        if let Err(errors) = validate(&manifest, text) {
            for e in &errors.0 {
                let _ = e.to_string();
            }
            return;
        }
        let _ = validate_fleet(&[(manifest, text.to_string())]);
    }
}

pub mod nvidia_smi_list {
    use reconcile::preflight::parse_gpu_list;

    /// Any `nvidia-smi -L` output must parse into GPUs without panicking: one per `GPU <n>:` line at
    /// most.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let gpus = parse_gpu_list(&text);
        assert!(gpus.len() <= text.lines().count());
    }
}

pub mod nvidia_smi_query {
    use reconcile::remote::gpu::parse_query;

    /// Any `nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`
    /// output must come back as GPUs or as a reason, never a panic; GPUs only when every non-blank
    /// line is one, and the reading prints back to the same GPUs.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        match parse_query(&text) {
            Ok(gpus) => {
                let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
                assert_eq!(gpus.len(), lines);
                let again: String = gpus
                    .iter()
                    .map(|g| format!("{}, {}, {}\n", g.index, g.used_mib, g.total_mib))
                    .collect();
                assert_eq!(parse_query(&again).as_ref(), Ok(&gpus));
            }
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}

pub mod render_roundtrip {
    use reconcile::manifest::{parse, validate, FlagValue};
    use reconcile::unit::{parse_unit, render};

    /// For every manifest that parses and validates, the unit rendered for each of its hosts must read
    /// back (the way systemd reads it) to exactly the model `render` meant: the same argv, environment
    /// and settings. A difference means either systemd would run something other than the manifest
    /// says, or `plan` would see a change on every run.
    pub fn run(data: &[u8]) {
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
    }
}

pub mod sglang_answer {
    use reconcile::remote::http::parse_answer;

    /// Any chat completion body must come back as an answer or as a reason, never a panic; the
    /// smoke check's comparisons on it must not panic either.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        match parse_answer(&text) {
            Ok(a) => {
                let _ = a.content.contains("Paris")
                    || a.reasoning.as_deref().is_some_and(|r| r.contains("Paris"));
                let _ = a.content.chars().take(200).collect::<String>();
            }
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}

pub mod sglang_metrics {
    use reconcile_core::drain::parse_metrics;

    /// Any `/metrics` body (another exporter on the port, a proxy's page, a truncated answer, hostile
    /// label values) must come back as running and queued requests or as a reason, never a panic; and
    /// other metrics and comments around the gauges never change what they say, since a drain decides
    /// on that whether to restart a busy server.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let read = parse_metrics(&text);
        match &read {
            Ok(_) => {
                let padded = format!("# HELP other x\nother_total{{a=\"b\"}} 7\n{text}\n# EOF\n");
                assert_eq!(parse_metrics(&padded), read, "{padded:?}");
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

pub mod sglang_models {
    use reconcile::remote::http::parse_models;

    /// Any `/v1/models` body (another server on the port, a proxy's error page, a truncated answer)
    /// must come back as models or as a reason, never a panic.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        match parse_models(&text) {
            Ok(models) => {
                for m in &models {
                    let _ = format!("{m:?}");
                }
            }
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}

pub mod ss_listeners {
    use reconcile::preflight::parse_listeners;

    /// Any output of preflight's port script (`ss -Htlnp`, a `#cgroups` line, `<pid> <cgroup>` lines)
    /// must parse into listeners without panicking: a pid at most once, and a cgroup only for a pid.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let listeners = parse_listeners(&text);
        let mut pids: Vec<u32> = listeners.iter().filter_map(|l| l.pid).collect();
        let all = pids.len();
        pids.sort_unstable();
        pids.dedup();
        assert_eq!(pids.len(), all, "a pid listed twice: {listeners:?}");
        for l in &listeners {
            if l.pid.is_none() {
                assert!(l.comm.is_empty() && l.cgroup.is_empty(), "{l:?}");
            }
        }
    }
}

pub mod survey {
    use reconcile_core::survey::{self, Sections};

    /// Any output of the survey script (one command per host: `== <key> <status> <sizes>`
    /// headers, `== end 0`, one base64 body) must read into sections or a reason, never panic;
    /// every fact read from a section must read without panicking; and sections written out again
    /// read back the same.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let Ok(sections) = Sections::parse(&text) else {
            return;
        };
        for (_, s) in sections.iter() {
            let _ = survey::file(s, "/p");
            let _ = survey::show(s, "u.service");
            let _ = survey::python(s);
            let _ = survey::access(s, "/m");
            let _ = survey::gpus(s);
            let _ = survey::listeners(s, 30000);
        }
        let reread = Sections::parse(&sections.render()).expect("written sections read back");
        assert_eq!(reread, sections);
    }
}

pub mod systemctl_show {
    use reconcile::observed::UnitState;

    /// Any `systemctl show` output (a broken or hostile host, a systemd of another version) must
    /// parse into a unit state, never panic, and its summary must be printable. Values without line
    /// breaks read back exactly when written out again as `Key=Value` lines.
    pub fn run(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let state = UnitState::from_show(&text);
        let _ = state.summary();
        let _ = state.is_loaded();

        let line_safe = |v: &str| !v.contains(['\n', '\r']);
        let texts = [
            &state.load_state,
            &state.active_state,
            &state.sub_state,
            &state.unit_file_state,
            &state.invocation_id,
            &state.result,
        ];
        if texts.iter().all(|v| line_safe(v)) {
            let mut again = format!(
                "LoadState={}\nActiveState={}\nSubState={}\nUnitFileState={}\nNeedDaemonReload={}\nInvocationID={}\nNRestarts={}\nExecMainPID={}\nExecMainStatus={}\nResult={}\n",
                state.load_state,
                state.active_state,
                state.sub_state,
                state.unit_file_state,
                if state.need_daemon_reload { "yes" } else { "no" },
                state.invocation_id,
                state.n_restarts,
                state.main_pid,
                state.main_status,
                state.result,
            );
            match state.memory_current {
                Some(m) => again.push_str(&format!("MemoryCurrent={m}\n")),
                None => again.push_str("MemoryCurrent=[not set]\n"),
            }
            assert_eq!(UnitState::from_show(&again), state, "{again:?}");
        }
    }
}
