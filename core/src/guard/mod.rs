//! The guard: a rollback the host itself carries out when the machine that ran `reconcile apply`
//! dies mid-change (deploy-rs's "magic rollback", made safe for a server that takes 15 minutes to
//! load).
//!
//! Before the old server stops, apply writes `guard.json` beside the unit's records and starts
//! the guard (the `reconcile-guard` program, copied to the host) as a unit of its own. While the
//! controller lives it renews a lease; the guard does nothing until the lease runs out. Then it
//! judges what it can see on the host ([`judge::judge`]):
//! - the new unit failed or is crash-looping, or is not active with `/health` 200 by the
//!   verification deadline: the previous unit goes back (as apply's rollback puts it back), and the
//!   guard waits for it to answer `/health`;
//! - the new unit active with `/health` 200 at the deadline: it is let stand and marked unconfirmed.
//!   A healthy server is never rolled back blind; the next apply verifies and confirms it.
//!
//! The controller's own rollback first `take`s the guard: the guard then finishes that rollback if
//! the controller dies during it. Both sides decide under one flock on one file, so exactly one of
//! them acts. This module is the pure half: the record, the deadline, the names, and every
//! decision the guard takes ([`judge`]). The host's program only reads facts, takes the lock and
//! carries a decision out; the model checker of `tests/protocol.rs` steps through the same
//! functions.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod judge;

pub use judge::{judge, Facts, Verdict};

/// How long after the controller's last word the guard acts on a unit, unless the manifest says
/// (`verify.guard_margin`). Covers a slow round trip and the stages after readiness (smoke,
/// benchmark, quality) without letting a crash loop run for long once nobody watches it.
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(120);

/// The shortest margin a manifest may set: renewals a second apart at least (the guard looks once
/// a second), so that a renewal in flight is not outrun by the guard.
pub const MIN_MARGIN: Duration = Duration::from_secs(4);

/// How often the controller renews its lease: a quarter of the margin, so three renewals can be
/// lost (a congested link) before the guard acts.
pub fn renew_every(margin: Duration) -> Duration {
    margin / 4
}

/// Where the guard stands, as `guard.json` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardState {
    /// Watching a new unit; the controller has not confirmed it yet.
    Armed,
    /// A rollback is under way (the controller's, or the guard's own).
    RollingBack,
    /// The controller finished: verified, or its rollback done. The guard did nothing.
    Disarmed,
    /// The guard found the new unit healthy at its deadline and let it stand; no apply confirmed it.
    Unconfirmed,
    /// The guard put the previous unit back (and it answers `/health` when it was to run).
    RolledBack,
    /// The guard's rollback failed, or the restored unit did not come up: the host needs attention.
    RollbackFailed,
    /// The unit file changed under the guard (another change): it left everything as it was.
    Left,
}

impl GuardState {
    /// Whether the guard is still at work on the host.
    pub fn active(self) -> bool {
        matches!(self, GuardState::Armed | GuardState::RollingBack)
    }

    /// Whether the guard, not the controller, settled the unit: status and plan say so.
    pub fn acted(self) -> bool {
        matches!(
            self,
            GuardState::Unconfirmed
                | GuardState::RolledBack
                | GuardState::RollbackFailed
                | GuardState::Left
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            GuardState::Armed => "armed",
            GuardState::RollingBack => "rolling_back",
            GuardState::Disarmed => "disarmed",
            GuardState::Unconfirmed => "unconfirmed",
            GuardState::RolledBack => "rolled_back",
            GuardState::RollbackFailed => "rollback_failed",
            GuardState::Left => "left",
        }
    }

    /// The state the guard printed (`take`, `disarm`, `renew`).
    pub fn parse(text: &str) -> Option<GuardState> {
        serde_json::from_value(serde_json::Value::String(text.trim().to_string())).ok()
    }
}

/// What to do after the previous unit is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Then {
    Restart,
    Stop,
}

/// How the change the guard watches reaches the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// The unit is restarted after arming: only a start after arming is the new unit's.
    #[default]
    Restart,
    /// The server is judged as it runs, and no start follows the arming: a live change, or a
    /// unit let stand unconfirmed that apply confirms.
    InPlace,
}

/// `guard.json`: what the controller writes when arming, and the guard's own fields beside it
/// ([`Watch`]). [`Settled`] is the part status and plan read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub state: GuardState,
    pub unit: String,
    pub unit_path: String,
    /// sha256 of the new unit's text: the guard leaves a unit file that is no longer it.
    pub new_sha256: String,
    /// The saved generation to restore; `None`: the unit was new (removed on a rollback) or the
    /// unit beneath comes back (`beneath`).
    pub previous: Option<String>,
    pub previous_sha256: Option<String>,
    pub beneath: bool,
    /// Disable the unit again after restoring (it was disabled before this apply).
    pub disable: bool,
    pub then: Then,
    /// The record of files moved aside, put back with the unit.
    pub aside: Option<String>,
    /// The unit's own `/health`, on the host (no API key: SGLang exempts `/health`).
    pub health_url: String,
    /// Restarts by systemd after which the new unit counts as crash-looping: 2 for a server of
    /// its own, 1 for a rank of a group (one that died takes its process group with it, and a
    /// restarted rank cannot rejoin it).
    pub crash_loop_restarts: u32,
    /// Seconds after arming that the new unit must be healthy by.
    pub judge_after: f64,
    /// Seconds the controller's lease lasts after each renewal.
    pub margin: f64,
    /// Who armed it, for status.
    pub armed_by: String,
    pub armed_at: String,
    /// The token of the run that armed it: renewals, take-overs and disarms from another run are
    /// refused, so a stale controller never acts on a newer run's guard.
    #[serde(default)]
    pub run: String,
    #[serde(default)]
    pub change: Change,
    /// This apply's write replaced another unit file: a server that started before the arming
    /// runs the previous unit. Not so (a run that finishes one that died, a rank restarted with
    /// its group), such a server may run the new file, unverified.
    #[serde(default)]
    pub replaces: bool,
    #[serde(flatten)]
    pub watch: Watch,
}

/// The guard's own part of its record: times on the host's monotonic clock (seconds), valid for
/// the boot named, and what it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Watch {
    /// The boot the times below belong to (`/proc/sys/kernel/random/boot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// When the guard began watching; a start of the unit after it is the new unit's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed_mono: Option<f64>,
    #[serde(default)]
    pub judge_at: f64,
    #[serde(default)]
    pub lease_until: f64,
    /// When the controller took the guard over for its own rollback, and the unit's restarts then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<f64>,
    #[serde(default)]
    pub taken_restarts: u32,
    /// The guard saw the new unit start after the arming: the restart took. A run after a dead
    /// one reads it to verify that start as it runs rather than restart it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_started: bool,
    /// The controller began telling the running server a live change (or telling it back): until
    /// it says the server took it whole (`new_started`), what the server serves is not known.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub telling: bool,
    /// The guard restored the previous unit itself.
    #[serde(default)]
    pub restored: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<f64>,
    /// When the restored unit last began to start, read once the guard's restart returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_entered: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_restarts: Option<u32>,
    /// When the guard let the unit stand (at its deadline; 0 once the host booted since): a group's
    /// rank started again after it is judged again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "kept_at")]
    pub stood_at: Option<f64>,
    /// Why the rollback began, and what the guard's restore did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub did: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<String>,
}

/// How long after arming the guard judges a unit that neither failed nor answered: the whole of
/// verification's own bounds (the crash window, the load deadline, the warmup), plus the margin.
pub fn judge_after(
    crash_window: Duration,
    load_deadline: Duration,
    warmup_timeout: Duration,
    margin: Duration,
) -> Duration {
    crash_window + load_deadline + warmup_timeout + margin
}

/// `guard.json` as the guard left it: what status, plan and the next apply read.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Settled {
    pub state: GuardState,
    pub new_sha256: String,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub settled_at: Option<String>,
    #[serde(default)]
    pub armed_by: String,
    #[serde(default)]
    pub armed_at: String,
    #[serde(default)]
    pub new_started: bool,
    #[serde(default)]
    pub change: Change,
    /// The guard restored the unit itself (a rollback it took over, or its own).
    #[serde(default)]
    pub restored: bool,
}

impl Settled {
    pub fn parse(text: &str) -> Result<Settled, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Whether the guard restored the unit itself or settled it: a controller that took it over
    /// and lost the host for longer than its lease restores no more (a second full load).
    pub fn acted_itself(&self) -> bool {
        self.restored || self.state.acted()
    }

    /// One line for status and plan, when the guard acted.
    pub fn summary(&self) -> Option<String> {
        let when = self.settled_at.as_deref().unwrap_or("?");
        let what = match self.state {
            GuardState::Unconfirmed => "the host's guard kept the new unit, unconfirmed",
            GuardState::RolledBack => "the host's guard rolled back to the previous unit",
            GuardState::RollbackFailed => "the host's guard could not roll back",
            GuardState::Left => "the host's guard left the unit as it found it",
            _ => return None,
        };
        Some(format!(
            "{what} at {when} ({}; applied by {} at {})",
            self.detail, self.armed_by, self.armed_at
        ))
    }

    /// What `plan` says of a unit from its guard's record, given the unit on the host and the
    /// one the manifest asks for (their sha256): a unit let stand unconfirmed is confirmed without a
    /// restart; a change the guard rolled back is the one asked for again. `None`: nothing to say.
    pub fn plan_note(&self, current_sha256: Option<&str>, desired_sha256: &str) -> Option<String> {
        let summary = self.summary()?;
        match self.state {
            GuardState::Unconfirmed
                if current_sha256 == Some(self.new_sha256.as_str()) && self.live_unseen() =>
            {
                Some(format!(
                    "{summary}; whether the server took the live change is not known, so apply restarts it and verifies it"
                ))
            }
            GuardState::Unconfirmed if current_sha256 == Some(self.new_sha256.as_str()) => {
                Some(format!(
                    "{summary}; apply verifies it as it runs, without a restart, and confirms it"
                ))
            }
            GuardState::RolledBack | GuardState::RollbackFailed
                if desired_sha256 == self.new_sha256 =>
            {
                Some(format!("{summary}; this plan asks for that change again"))
            }
            _ => None,
        }
    }

    /// Whether the unit on the host is the one the guard let stand unconfirmed.
    pub fn unconfirmed(&self, unit_sha256: &str) -> bool {
        self.state == GuardState::Unconfirmed && self.new_sha256 == unit_sha256
    }

    /// Whether the unit on the host runs a start of the change this guard watches, so that an
    /// apply after the one that died verifies it as it runs instead of restarting it: kept
    /// unconfirmed, or still armed (the dead run's lease not yet out) with its start seen.
    ///
    /// Not a live change's: the guard sees the server healthy, not whether it took the change
    /// (the run may have died before telling it, or between the weights and the values), so
    /// confirming it could record values the server does not run. (A confirm's record counts:
    /// its start was seen when it was armed.)
    pub fn confirmable(&self, unit_sha256: &str) -> bool {
        let started = match self.state {
            GuardState::Unconfirmed => true,
            GuardState::Armed => self.new_started,
            _ => false,
        };
        let seen = self.change == Change::Restart || self.new_started;
        started && seen && self.new_sha256 == unit_sha256
    }

    /// A live change kept healthy, whose taking nobody saw.
    pub fn live_unseen(&self) -> bool {
        self.change == Change::InPlace && !self.new_started
    }
}

/// The name of the unit that runs `unit`'s guard: `reconcile-guard-<unit>`, with `.service` left
/// off the managed unit's name.
pub fn unit_name(unit: &str) -> String {
    let stem = unit.strip_suffix(".service").unwrap_or(unit);
    format!("reconcile-guard-{stem}.service")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_as_guard_py_prints_it() {
        for s in [
            GuardState::Armed,
            GuardState::RollingBack,
            GuardState::Disarmed,
            GuardState::Unconfirmed,
            GuardState::RolledBack,
            GuardState::RollbackFailed,
            GuardState::Left,
        ] {
            assert_eq!(GuardState::parse(&format!("{}\n", s.name())), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
            assert!(!(s.active() && s.acted()), "{s:?}");
        }
        assert_eq!(GuardState::parse("Traceback"), None);
    }

    #[test]
    fn the_deadline_covers_every_bound_of_verification_and_the_margin() {
        let s = Duration::from_secs;
        assert_eq!(judge_after(s(10), s(1800), s(660), s(120)), s(2590));
        assert_eq!(renew_every(DEFAULT_MARGIN), s(30));
    }

    #[test]
    fn only_the_guards_own_acts_are_summarised() {
        let text = r#"{"state":"unconfirmed","new_sha256":"ab","detail":"active and /health 200 at the deadline, but no apply confirmed it","settled_at":"2026-12-04T10:00:00Z","armed_by":"ci@box pid 7","armed_at":"2026-12-04T09:40:00Z","judge_at":123.5}"#;
        let s = Settled::parse(text).unwrap();
        assert!(s.unconfirmed("ab") && !s.unconfirmed("cd"));
        assert_eq!(
            s.summary().unwrap(),
            "the host's guard kept the new unit, unconfirmed at 2026-12-04T10:00:00Z (active and /health 200 at the deadline, but no apply confirmed it; applied by ci@box pid 7 at 2026-12-04T09:40:00Z)"
        );
        let disarmed = Settled {
            state: GuardState::Disarmed,
            ..s
        };
        assert_eq!(disarmed.summary(), None);
    }

    #[test]
    fn a_start_is_confirmable_once_kept_or_seen_by_a_guard_still_armed() {
        let read = |state: &str, started: bool| {
            Settled::parse(&format!(
                r#"{{"state":"{state}","new_sha256":"new","new_started":{started}}}"#
            ))
            .unwrap()
        };
        assert!(read("unconfirmed", false).confirmable("new"));
        assert!(read("armed", true).confirmable("new"));
        // Armed with no start seen: the dead run may have died before its restart, and what runs
        // is the old server under the new file.
        assert!(!read("armed", false).confirmable("new"));
        assert!(!read("armed", true).confirmable("other"));
        for settled in ["rolling_back", "rolled_back", "disarmed", "left"] {
            assert!(!read(settled, true).confirmable("new"), "{settled}");
        }
        // A live change kept healthy: nobody saw the server take it. A confirm's record (its
        // start seen at arming) is confirmable again.
        let live = |started: bool| {
            Settled::parse(&format!(
                r#"{{"state":"unconfirmed","new_sha256":"new","change":"in_place","new_started":{started}}}"#
            ))
            .unwrap()
        };
        assert!(!live(false).confirmable("new"));
        assert!(live(false)
            .plan_note(Some("new"), "new")
            .unwrap()
            .contains("whether the server took the live change is not known"));
        assert!(live(true).confirmable("new"));
    }

    #[test]
    fn plan_tells_a_kept_unit_from_a_change_the_guard_rolled_back() {
        let settled = |state| Settled {
            state,
            new_sha256: "new".into(),
            detail: "why".into(),
            settled_at: Some("t1".into()),
            armed_by: "ci".into(),
            armed_at: "t0".into(),
            new_started: false,
            change: Change::Restart,
            restored: false,
        };
        let kept = settled(GuardState::Unconfirmed);
        assert!(kept
            .plan_note(Some("new"), "new")
            .unwrap()
            .ends_with("; apply verifies it as it runs, without a restart, and confirms it"));
        // The unit changed since (edited by hand, applied again): the record is history.
        assert_eq!(kept.plan_note(Some("other"), "new"), None);
        let back = settled(GuardState::RolledBack);
        assert_eq!(
            back.plan_note(Some("old"), "new").unwrap(),
            "the host's guard rolled back to the previous unit at t1 (why; applied by ci at t0); this plan asks for that change again"
        );
        assert_eq!(back.plan_note(Some("old"), "newer"), None);
        assert_eq!(
            settled(GuardState::Disarmed).plan_note(Some("new"), "new"),
            None
        );
    }

    #[test]
    fn the_guards_unit_is_named_after_the_managed_one() {
        assert_eq!(unit_name("qwen.service"), "reconcile-guard-qwen.service");
    }
}
