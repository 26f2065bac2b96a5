//! Any `systemctl show` output (a broken or hostile host, a systemd of another version) must
//! parse into a unit state, never panic, and its summary must be printable. Values without line
//! breaks read back exactly when written out again as `Key=Value` lines.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::observed::UnitState;

fuzz_target!(|data: &[u8]| {
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
});
