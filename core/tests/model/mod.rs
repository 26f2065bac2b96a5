//! What the apply protocol's models share (`protocol.rs`, a single server; `group_protocol.rs`,
//! a group of ranks): the clock's bounds, which unit a file or a process is, and the guard's
//! record as apply arms it.

use reconcile_core::guard::{Change, GuardState, Record, Then, Watch};

/// Verification's (learned) load deadline, counted from the restart, in ticks.
pub const DEADLINE: u32 = 3;
/// The controller's lease after each renewal.
pub const MARGIN: u32 = 2;
/// The previous unit loads in this many ticks.
pub const PREVIOUS_LOAD: u32 = 1;
/// A host's monotonic clock reads this at boot (it never starts at 0).
pub const BOOT_MONO: u32 = 10;

/// Which unit a file says, or a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Def {
    Previous,
    New,
}

/// The guard's record as apply arms it for `run` (src/apply/guard.rs): a `change` restarted or
/// told live, a rank of a group broken at its first restart (`crash_loop_restarts` 1) or a
/// single server at its second, judged by verification's own deadline plus the margin.
pub fn arming(run: &str, change: Change, crash_loop_restarts: u32) -> Record {
    Record {
        format: 2,
        state: GuardState::Armed,
        unit: "qwen.service".into(),
        unit_path: "/etc/systemd/system/qwen.service".into(),
        new_sha256: "new".into(),
        previous: Some("/var/lib/reconcile/qwen.service/generations/1.service".into()),
        previous_sha256: Some("old".into()),
        beneath: false,
        disable: false,
        then: Then::Restart,
        aside: None,
        health_url: "http://127.0.0.1:30000/health".into(),
        crash_loop_restarts,
        judge_after: f64::from(DEADLINE + MARGIN),
        margin: f64::from(MARGIN),
        armed_by: "ci@box pid 7".into(),
        armed_at: "t0".into(),
        run: run.into(),
        replaces: false,
        change,
        watch: Watch::default(),
    }
}

/// A unit's file mtime or start, (tick, event in it), on its host's monotonic clock: 0 for one
/// before the host's last boot (systemd's timestamps are of this boot).
pub fn on_clock((at, micro): (u32, u32), boot_at: u32) -> f64 {
    if at >= boot_at {
        f64::from(BOOT_MONO + at - boot_at) + f64::from(micro) / 100.0
    } else {
        0.0
    }
}
