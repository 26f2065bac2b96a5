//! What a host has for one unit, as read by the remote layer; parsing `systemctl show` is pure and
//! lives here ([`Show`], for `observe` and `status` alike) so the plan and its tests never need a
//! host.

use std::collections::BTreeMap;

use serde::Serialize;

/// Properties asked of `systemctl show`.
pub const SHOW_PROPERTIES: &str =
    "LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload,InvocationID,NRestarts,ExecMainPID,ExecMainStatus,Result,MemoryCurrent,FragmentPath,DropInPaths";

#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The unit file's text; `None` when the host has no such file.
    pub unit_text: Option<String>,
    pub state: UnitState,
    /// What systemd runs besides that file: drop-ins, a mask, a unit file elsewhere.
    pub unit_files: crate::unit_files::UnitFiles,
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

/// `systemctl show -p ...` output (`Key=Value` lines), read once for whatever properties the
/// caller asked: the one reader of that output, for `observe` and for `status` alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Show<'a> {
    props: BTreeMap<&'a str, &'a str>,
}

impl<'a> Show<'a> {
    pub fn parse(output: &'a str) -> Show<'a> {
        Show {
            props: output.lines().filter_map(|l| l.split_once('=')).collect(),
        }
    }

    /// The property's value; empty when systemd did not give it.
    pub fn text(&self, key: &str) -> String {
        self.props.get(key).copied().unwrap_or_default().to_string()
    }

    /// Whether the property is `yes`.
    pub fn yes(&self, key: &str) -> bool {
        self.props.get(key) == Some(&"yes")
    }

    /// The property as a number; `None` when absent or not one (`[not set]`).
    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.props.get(key).and_then(|v| v.parse().ok())
    }
}

impl UnitState {
    /// Parses `systemctl show -p ...` output (`Key=Value` lines).
    pub fn from_show(output: &str) -> UnitState {
        let show = Show::parse(output);
        UnitState {
            load_state: show.text("LoadState"),
            active_state: show.text("ActiveState"),
            sub_state: show.text("SubState"),
            unit_file_state: show.text("UnitFileState"),
            need_daemon_reload: show.yes("NeedDaemonReload"),
            invocation_id: show.text("InvocationID"),
            n_restarts: show.number("NRestarts").unwrap_or(0),
            main_pid: show.number("ExecMainPID").unwrap_or(0),
            main_status: show.number("ExecMainStatus").unwrap_or(0),
            result: show.text("Result"),
            memory_current: show.number("MemoryCurrent"),
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

/// `/proc/<pid>/cmdline` or `environ`: NUL-terminated strings.
pub fn split_nul(raw: &str) -> Vec<String> {
    let mut parts: Vec<String> = raw.split('\0').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_strings_split_on_nul() {
        assert_eq!(split_nul("a\0b c\0\0"), ["a", "b c", ""]);
        assert_eq!(split_nul(""), Vec::<String>::new());
    }

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
    fn show_reads_any_property_asked() {
        let show = Show::parse(
            "ExecMainPID=7\nExecMainStartTimestamp=Mon 2025-01-06 10:00:00 UTC\nNeedDaemonReload=yes\n",
        );
        assert_eq!(show.number::<u32>("ExecMainPID"), Some(7));
        assert_eq!(
            show.text("ExecMainStartTimestamp"),
            "Mon 2025-01-06 10:00:00 UTC"
        );
        assert!(show.yes("NeedDaemonReload") && !show.yes("Missing"));
        assert_eq!(show.text("Missing"), "");
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
