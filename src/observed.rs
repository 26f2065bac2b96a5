//! What a host has for one unit, as read by the remote layer; parsing `systemctl show` is pure and
//! lives here so the plan and its tests never need a host.

use std::collections::BTreeMap;

use serde::Serialize;

/// Properties asked of `systemctl show`.
pub const SHOW_PROPERTIES: &str =
    "LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload,InvocationID,NRestarts,ExecMainPID,ExecMainStatus,Result,MemoryCurrent,FragmentPath";

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The unit file's text; `None` when the host has no such file.
    pub unit_text: Option<String>,
    pub state: UnitState,
}

/// systemd's view of a unit.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct UnitState {
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub unit_file_state: String,
    pub need_daemon_reload: bool,
    pub invocation_id: String,
    pub n_restarts: u32,
    pub main_pid: u32,
    pub main_status: i32,
    pub result: String,
    /// Bytes in the unit's cgroup, when systemd accounts memory for it.
    pub memory_current: Option<u64>,
}

impl UnitState {
    /// Parses `systemctl show -p ...` output (`Key=Value` lines).
    pub fn from_show(output: &str) -> UnitState {
        let props: BTreeMap<&str, &str> =
            output.lines().filter_map(|l| l.split_once('=')).collect();
        let text = |k: &str| props.get(k).copied().unwrap_or_default().to_string();
        fn number<T: std::str::FromStr>(props: &BTreeMap<&str, &str>, k: &str) -> Option<T> {
            props.get(k).and_then(|v| v.parse().ok())
        }
        UnitState {
            load_state: text("LoadState"),
            active_state: text("ActiveState"),
            sub_state: text("SubState"),
            unit_file_state: text("UnitFileState"),
            need_daemon_reload: props.get("NeedDaemonReload") == Some(&"yes"),
            invocation_id: text("InvocationID"),
            n_restarts: number(&props, "NRestarts").unwrap_or(0),
            main_pid: number(&props, "ExecMainPID").unwrap_or(0),
            main_status: number(&props, "ExecMainStatus").unwrap_or(0),
            result: text("Result"),
            memory_current: number(&props, "MemoryCurrent"),
        }
    }

    /// systemd knows a unit it can load (`show` of an unknown unit still succeeds, with `not-found`).
    pub fn is_loaded(&self) -> bool {
        self.load_state == "loaded"
    }

    /// A one-line description such as `active (running)`.
    pub fn summary(&self) -> String {
        if !self.is_loaded() {
            return self.load_state.clone();
        }
        let mut s = format!("{} ({})", self.active_state, self.sub_state);
        if self.need_daemon_reload {
            s.push_str(", unit file changed on disk since the last daemon-reload");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_systemctl_show() {
        let s = UnitState::from_show(
            "LoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=2\nExecMainPID=41\nMemoryCurrent=[not set]\nNeedDaemonReload=no\n",
        );
        assert!(s.is_loaded());
        assert_eq!((s.n_restarts, s.main_pid, s.memory_current), (2, 41, None));
        assert_eq!(s.summary(), "active (running)");
    }

    #[test]
    fn unknown_units_are_not_loaded() {
        let s = UnitState::from_show(
            "LoadState=not-found\nActiveState=inactive\nMemoryCurrent=[not set]\n",
        );
        assert!(!s.is_loaded());
        assert_eq!(s.summary(), "not-found");
    }
}
