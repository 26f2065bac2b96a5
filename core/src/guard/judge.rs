//! Every decision the host's guard takes, as pure functions of its record, what it sees of the
//! unit and the host's monotonic clock: the one implementation that both the `reconcile-guard`
//! program on the host and the protocol's model checker (`tests/protocol.rs`) run.
//!
//! The program reads the facts ([`Facts`]) and `/health`, takes the lock, calls these and carries
//! out what they say; it decides nothing itself.

use super::{Change, GuardState, Record, Then};

/// A unit that systemd restarted this often since the new invocation began is crash-looping. A
/// rank of a server group is broken at its first restart: its process group cannot be rejoined
/// (the record's `crash_loop_restarts` says 1 then).
pub const CRASH_LOOP_RESTARTS: u32 = 2;

/// What the guard sees of the managed unit, read by the host's program.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// sha256 of the unit file on disk; `None` when there is none.
    pub sha256: Option<String>,
    /// systemd's `ActiveState` and `SubState`.
    pub active: String,
    pub sub: String,
    /// systemd's `NRestarts`.
    pub restarts: u32,
    /// When the unit last began to start (`InactiveExitTimestampMonotonic`), in seconds on the
    /// clock the guard reads too.
    pub entered: f64,
    /// systemd still runs an older definition than the file on disk (no `daemon-reload` yet).
    pub stale: bool,
    /// When the unit file on disk was written (its mtime), on the same clock as `entered`: a
    /// start before it ran the file before. `None`: unknown.
    pub written: Option<f64>,
}

impl Facts {
    fn running(&self) -> String {
        format!("{}/{}", self.active, self.sub)
    }
}

/// The guard's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do yet.
    Wait,
    /// The new unit is healthy at its deadline: let stand, unconfirmed.
    Keep,
    /// The previous unit back, restarted (or left stopped) as it was.
    Restore,
    /// The new unit never started and the previous server still runs: its file goes back and
    /// systemd reloads; the server is not touched.
    PutBack,
    /// Not the guard's to act on (the file changed, the guard settled): left as it is.
    Leave,
    /// The rollback finished.
    Done,
    /// The rollback did not bring the previous unit back.
    Failed,
}

impl Verdict {
    /// The state a verdict settles the guard in; `None` for a verdict that does not settle it.
    pub fn settles(self) -> Option<GuardState> {
        match self {
            Verdict::Keep => Some(GuardState::Unconfirmed),
            Verdict::Leave => Some(GuardState::Left),
            Verdict::Done => Some(GuardState::RolledBack),
            Verdict::Failed => Some(GuardState::RollbackFailed),
            Verdict::Wait | Verdict::Restore | Verdict::PutBack => None,
        }
    }
}

/// The guard's decision from what it saw at `at`; `health` (a `/health` request: its status, or
/// `None` when nothing answered) is called only when the decision needs it.
pub fn judge(
    guard: &Record,
    f: &Facts,
    at: f64,
    health: impl FnOnce() -> Option<u16>,
) -> (Verdict, String) {
    let w = &guard.watch;
    // `/health` is read at most once a judgement, and only where it decides.
    let mut health = Some(health);
    let mut answered = None;
    let mut health = move || *answered.get_or_insert_with(|| health.take().and_then(|h| h()));
    // The lease holds the guard off acting, not off finishing what it began: a controller that
    // renews without knowing the guard restored would otherwise keep it waiting for good.
    if at < w.lease_until && !w.restored {
        return (Verdict::Wait, "the controller renewed its lease".into());
    }
    let crash_loop = guard.crash_loop_restarts;
    match guard.state {
        GuardState::Armed => {
            if f.sha256.as_deref() != Some(guard.new_sha256.as_str()) {
                // Armed before the write: the previous file still there means the controller
                // stopped before (or while) it wrote, perhaps with files moved aside already.
                // Not for a confirm, whose new file was there at arming: someone changed it.
                let confirming = guard.change == Change::InPlace && w.new_started;
                let started = f.entered > w.armed_mono.unwrap_or(0.0);
                if f.sha256 == guard.previous_sha256 && !confirming && started {
                    // The server started since the arming (a reboot, say) and its file is the
                    // previous one again: it may run the new file's definition, unverified.
                    return (
                        Verdict::Restore,
                        "the server started since the arming and its file is the previous one again: what runs may be the new unit".into(),
                    );
                }
                if f.sha256 == guard.previous_sha256 && !confirming {
                    return (
                        Verdict::PutBack,
                        "the new file was never written (the controller stopped before its write)"
                            .into(),
                    );
                }
                return (
                    Verdict::Leave,
                    "the unit file changed since the guard was armed; left as it is".into(),
                );
            }
            // Only the new invocation counts: the old one's state and restarts say nothing of it.
            let started = guard.started_new(f).unwrap_or(true);
            if started && f.active == "failed" {
                return (Verdict::Restore, "the new unit failed".into());
            }
            // A group's rank restarted once is broken when it cannot rejoin its group; one that
            // answers again met its peers afresh (they restarted with it: a host's reboot, a
            // peer's), and is judged as any start (the group model found a healthy group sent
            // back after one host rebooted).
            if started
                && f.restarts >= crash_loop
                && !(f.restarts < CRASH_LOOP_RESTARTS && health() == Some(200))
            {
                let n = f.restarts;
                let s = if n == 1 { "" } else { "s" };
                return (
                    Verdict::Restore,
                    format!("the new unit is crash-looping ({n} restart{s})"),
                );
            }
            if !started && guard.change == Change::Restart {
                return not_started(guard, f, at);
            }
            if at < w.judge_at {
                return (Verdict::Wait, "before the deadline".into());
            }
            // A live change nobody saw told whole (the controller tells the guard right after
            // the server took it). Cut short in the telling (a value refused after the weights
            // moved, a controller dead before it told the change back), the server may serve
            // part of it: the previous unit is restarted, whole. Never begun: the server serves
            // what it served, and its previous file goes back around it. (The crash matrix found
            // both kept as the new unit, and the next apply restarting a server that had taken
            // the change.)
            let untold = guard.change == Change::InPlace && !w.new_started && !started;
            if untold && w.telling {
                return (
                    Verdict::Restore,
                    "the live change was cut short while the server was told it: what it serves is not known".into(),
                );
            }
            let code = health();
            if f.active == "active" && code == Some(200) && untold {
                return (
                    Verdict::PutBack,
                    "the live change was never told to the server (the controller stopped before it)"
                        .into(),
                );
            }
            if f.active == "active" && code == Some(200) {
                return (
                    Verdict::Keep,
                    "active and /health 200 at the deadline, but no apply confirmed it".into(),
                );
            }
            let code = code.map_or("no answer".to_string(), |c| c.to_string());
            (
                Verdict::Restore,
                format!(
                    "not healthy by the deadline ({}, /health {code})",
                    f.running()
                ),
            )
        }
        GuardState::RollingBack => rolling_back(guard, f, at, health),
        GuardState::Unconfirmed if guard.group_rank() => stood_rank(guard, f, at, health),
        other => (Verdict::Leave, format!("the guard is {}", other.name())),
    }
}

/// A group's rank the guard let stand, watched on: its peers may go back after the keep (a rollback
/// the controller began on them, finished by their guards, while this host was out of its
/// reach), and a rank left on the new unit then cannot rejoin its group. Restored once it started
/// again since the keep and does not answer by its deadline, counted from that start; one that
/// answers stays kept. (The group model found the group split otherwise: one rank back, its peer
/// kept, neither serving.)
fn stood_rank(
    guard: &Record,
    f: &Facts,
    at: f64,
    health: impl FnOnce() -> Option<u16>,
) -> (Verdict, String) {
    let since = guard.watch.stood_at.unwrap_or(f64::INFINITY);
    if f.entered <= since || at < f.entered + guard.judge_after {
        return (
            Verdict::Wait,
            "kept; watched while its group may go back".into(),
        );
    }
    if health() == Some(200) {
        return (Verdict::Wait, "kept; it answers again".into());
    }
    (
        Verdict::Restore,
        format!(
            "kept, then started again and not healthy by its deadline ({}): its group went back or broke",
            f.running()
        ),
    )
}

/// The lease ran out on a change to be restarted, and the new unit never started: the controller
/// stopped before its restart took. The previous server, still running, is left to run with its
/// own file back; a server stopped and never started again is restored, and so is one that may
/// run the new file unverified (this apply did not replace the file it started from). A stop
/// under way is waited for (systemd bounds it by `TimeoutStopSec`), up to the deadline.
fn not_started(guard: &Record, f: &Facts, at: f64) -> (Verdict, String) {
    match f.active.as_str() {
        "active" | "reloading" if guard.replaces => (
            Verdict::PutBack,
            "the new unit never started (the controller stopped before its restart)".into(),
        ),
        "active" | "reloading" => (
            Verdict::Restore,
            "the controller stopped before its restart, and the server that runs started before the arming, perhaps from the new file, unverified".into(),
        ),
        "deactivating" if at < guard.watch.judge_at => {
            (Verdict::Wait, "the old server is stopping".into())
        }
        _ => (
            Verdict::Restore,
            format!(
                "the server was stopped and the new unit never started ({})",
                f.running()
            ),
        ),
    }
}

fn rolling_back(
    guard: &Record,
    f: &Facts,
    at: f64,
    health: impl FnOnce() -> Option<u16>,
) -> (Verdict, String) {
    let w = &guard.watch;
    let removal = guard.previous.is_none() && !guard.beneath;
    if removal || guard.then != Then::Restart {
        if w.restored {
            return (Verdict::Done, "the rollback finished".into());
        }
        return (
            Verdict::Restore,
            "the controller's rollback did not finish".into(),
        );
    }
    // Restarted since the rollback began, from the previous unit's file as systemd loaded it,
    // and not crash-looping since: wait for it to load, rather than restart a previous unit
    // that may already serve. A file put back without the reload still runs the new definition.
    // After the guard's own restore, its start is the one read once its restart returned: that
    // restart may have joined a start already under way (a dead controller's). Once the guard
    // restored the unit itself, its restarts do not judge it: a group's rank restarts while its
    // peers come back, so the restored unit has until its deadline to answer /health.
    // A previous unit is judged crash-looping by the single server's bound even on a group's
    // rank: a rank restarts once when a peer does (a reboot, a peer's restore), and that says
    // nothing of its unit (the group model found a guard restoring a rank the controller had
    // restored, a second full load, after its peer's host rebooted).
    let (started, steady) = if w.restored {
        let since = w.restored_entered.or(w.restored_at).unwrap_or(0.0);
        (f.entered >= since, true)
    } else {
        let crash_loop = guard.crash_loop_restarts.max(CRASH_LOOP_RESTARTS);
        (
            f.entered > w.taken_at.unwrap_or(0.0),
            f.restarts.saturating_sub(w.taken_restarts) < crash_loop,
        )
    };
    let back = f.sha256 == guard.previous_sha256 && !f.stale && started && steady;
    if back && (f.active == "active" || f.active == "activating") {
        if health() == Some(200) {
            return (
                Verdict::Done,
                "the previous unit runs again and answers /health 200".into(),
            );
        }
        if at < w.judge_at {
            return (Verdict::Wait, "the restored unit is loading".into());
        }
        return (
            Verdict::Failed,
            format!(
                "the restored unit was not healthy by its deadline ({})",
                f.running()
            ),
        );
    }
    if w.restored {
        return (
            Verdict::Failed,
            format!(
                "the restored unit did not start or did not stay up ({})",
                f.running()
            ),
        );
    }
    (
        Verdict::Restore,
        "the controller's rollback did not finish".into(),
    )
}

/// A command from a run that did not arm this guard: refused, and the record left as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the host's guard belongs to another run ({armed_by})")]
pub struct OtherRun {
    pub armed_by: String,
}

impl Record {
    fn owned_by(&self, run: &str) -> Result<(), OtherRun> {
        // A record from before runs had tokens answers any run.
        if self.run.is_empty() || self.run == run {
            Ok(())
        } else {
            Err(OtherRun {
                armed_by: self.armed_by.clone(),
            })
        }
    }

    /// The guard starts watching at `now`, in the boot `boot_id`, the unit file's sha256 being
    /// `on_disk`. Its first start sets its times; a start in the same boot (the guard itself
    /// restarted) keeps them; a start after a reboot counts from the boot: no controller's lease
    /// outlives the boot, the deadline counts from now, and, when the new file is on disk, every
    /// start of the unit since the boot is the new unit's. When it is not (the controller had
    /// not written it yet), only a start from now on is: the boot started the previous file
    /// (the model found the boot's start of the previous file taken for the new unit's).
    pub fn start_watch(&mut self, now: f64, boot_id: &str, on_disk: Option<&str>) {
        let w = &mut self.watch;
        let same_boot = w.boot_id.as_deref() == Some(boot_id);
        if same_boot && w.armed_mono.is_some() {
            return;
        }
        let first = w.armed_mono.is_none() && w.boot_id.is_none();
        w.boot_id = Some(boot_id.to_string());
        w.judge_at = now + self.judge_after;
        if first {
            w.armed_mono = Some(now);
            w.lease_until = now + self.margin;
            return;
        }
        let booted_new = on_disk == Some(self.new_sha256.as_str());
        w.armed_mono = Some(if booted_new { 0.0 } else { now });
        w.lease_until = 0.0;
        w.taken_at = w.taken_at.map(|_| 0.0);
        w.taken_restarts = 0;
        w.restored_at = w.restored_at.map(|_| 0.0);
        w.restored_entered = w.restored_entered.map(|_| 0.0);
        w.restored_restarts = w.restored_restarts.map(|_| 0);
        w.stood_at = w.stood_at.map(|_| 0.0);
        // The boot started the unit afresh from its file: a change judged as it ran is now a
        // start like a restart's. A live change kept without anyone seeing it taken was never
        // started from its file before: that start is judged (the model found a reboot starting
        // it, hung, under a guard that had settled).
        if self.change == Change::InPlace && booted_new {
            if self.state == GuardState::Unconfirmed && !w.new_started {
                self.state = GuardState::Armed;
            }
            self.change = Change::Restart;
        }
    }

    /// What the guard saw: a start of the new file after the arming is the new unit's, once and
    /// for all (a run after a dead one reads it). Only a change that restarts starts anything.
    pub fn saw(&mut self, f: &Facts) {
        if self.change == Change::Restart && self.started_new(f) == Some(true) {
            self.watch.new_started = true;
        }
    }

    /// Whether what runs began to start after the arming and after its file was written (`None`
    /// before the arming). A start between the arming and the write ran the file before: a
    /// group's rank restarted by its peer's reboot, say (the group model found it taken for the
    /// new unit's start).
    pub fn started_new(&self, f: &Facts) -> Option<bool> {
        let armed = self.watch.armed_mono?;
        Some(f.entered > f.written.map_or(armed, |w| w.max(armed)))
    }

    /// A controller's command reached the guard in the boot `boot_id`: the record's times are
    /// brought into that boot first, as the watch does when it starts. After a reboot a command
    /// can come before the guard's own start: a take's times, set on the new boot's clock, would
    /// otherwise be voided by that start as the old boot's (the lab caught the guard finishing a
    /// rollback the controller was still verifying). Another run's command changes nothing.
    pub fn command_in_boot(
        &mut self,
        run: &str,
        now: f64,
        boot_id: &str,
        on_disk: Option<&str>,
    ) -> Result<(), OtherRun> {
        self.owned_by(run)?;
        self.start_watch(now, boot_id, on_disk);
        Ok(())
    }

    /// The controller told the running server the live change, and it took it: the change is
    /// the server's from now, as a restart's start is (a run after a dead one confirms it as it
    /// runs). Returns the state found.
    pub fn told(&mut self, run: &str) -> Result<GuardState, OtherRun> {
        self.owned_by(run)?;
        if self.state.active() && self.change == Change::InPlace {
            self.watch.new_started = true;
        }
        Ok(self.state)
    }

    /// The controller is about to tell the running server a live change, or to tell it back:
    /// until it says the server took it whole, the guard does not know what the server serves.
    /// Returns the state found.
    pub fn telling(&mut self, run: &str) -> Result<GuardState, OtherRun> {
        self.owned_by(run)?;
        if self.state.active() && self.change == Change::InPlace {
            self.watch.telling = true;
            self.watch.new_started = false;
        }
        Ok(self.state)
    }

    /// The controller is alive: the lease pushed out by the margin. Returns the state found.
    pub fn renew(&mut self, run: &str, now: f64) -> Result<GuardState, OtherRun> {
        self.owned_by(run)?;
        if self.state.active() {
            self.watch.lease_until = now + self.margin;
        }
        Ok(self.state)
    }

    /// The controller begins its own rollback; the guard finishes it should the controller die.
    /// `restarts`: the unit's restarts now (`None`: systemd did not answer; none counted, so the
    /// guard finishes the rollback as the controller meant to). Returns the state found: anything
    /// but `armed` means the guard acted first, and the controller must not.
    pub fn take(
        &mut self,
        run: &str,
        now: f64,
        restarts: Option<u32>,
    ) -> Result<GuardState, OtherRun> {
        self.owned_by(run)?;
        let found = self.state;
        if found == GuardState::Armed {
            self.state = GuardState::RollingBack;
            let w = &mut self.watch;
            w.why = Some("the controller's verification failed".into());
            w.taken_at = Some(now);
            w.taken_restarts = restarts.unwrap_or(0);
            w.lease_until = now + self.margin;
            w.judge_at = now + self.judge_after;
        }
        Ok(found)
    }

    /// The controller is done with the unit. The guard stands down unless it acted: a guard in the
    /// middle of its own restore stays at it, and the controller is told `rolling_back`. Returns the
    /// state found.
    pub fn disarm(&mut self, run: &str, at_utc: &str) -> Result<GuardState, OtherRun> {
        self.owned_by(run)?;
        let found = self.state;
        let guards_own = found == GuardState::RollingBack && self.watch.restored;
        if found.active() && !guards_own {
            self.settle(GuardState::Disarmed, "the controller finished", at_utc);
        }
        Ok(found)
    }

    /// The guard settles in `state`.
    pub fn settle(&mut self, state: GuardState, detail: &str, at_utc: &str) {
        self.state = state;
        self.watch.detail = detail.to_string();
        self.watch.settled_at = Some(at_utc.to_string());
    }

    /// A verdict that settles the guard, recorded: what it did, after why the rollback began.
    pub fn settle_on(&mut self, verdict: Verdict, why: &str, at_utc: &str) {
        let Some(state) = verdict.settles() else {
            return;
        };
        let detail = match (verdict, self.watch.why.as_deref()) {
            (Verdict::Done | Verdict::Failed, Some(began)) => format!("{began}; {why}"),
            _ => why.to_string(),
        };
        self.settle(state, detail.trim_matches(|c| c == ';' || c == ' '), at_utc);
        if verdict == Verdict::Keep {
            self.watch.stood_at = Some(self.watch.judge_at);
        }
    }

    /// A rank of a server group (broken at its first restart): its guard watches on after
    /// keeping it ([`Record::watching`]).
    pub fn group_rank(&self) -> bool {
        self.crash_loop_restarts < CRASH_LOOP_RESTARTS
    }

    /// Whether the guard's program goes on watching: while it is at work, and on a group's rank
    /// it kept.
    pub fn watching(&self) -> bool {
        self.state.active() || self.state == GuardState::Unconfirmed && self.group_rank()
    }

    /// The guard's own restore begins at `now`: it owns the rollback from here, and the restored
    /// unit has a deadline of its own.
    pub fn begin_restore(&mut self, why: &str, now: f64) {
        self.state = GuardState::RollingBack;
        let w = &mut self.watch;
        w.why.get_or_insert_with(|| why.to_string());
        w.restored = true;
        w.restored_at = Some(now);
        w.judge_at = now + self.judge_after;
    }

    /// The guard's restore returned: `did` says what it did; `after` is the unit as systemd
    /// shows it then (`None`: unread), whose start is the restored unit's.
    pub fn restore_returned(&mut self, did: &str, after: Option<&Facts>) {
        let w = &mut self.watch;
        if let Some(f) = after {
            w.restored_entered = Some(f.entered);
            w.restored_restarts = Some(f.restarts);
        }
        w.did = Some(did.to_string());
        w.detail = format!("{}; {did}", w.why.as_deref().unwrap_or(""));
    }

    /// The guard put the previous file back around a server that never left it: settled as
    /// rolled back, nothing restarted.
    pub fn put_back(&mut self, why: &str, did: &str, at_utc: &str) {
        self.watch.why.get_or_insert_with(|| why.to_string());
        self.watch.did = Some(did.to_string());
        self.settle(GuardState::RolledBack, &format!("{why}; {did}"), at_utc);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Change, Record, Watch};
    use super::*;

    /// A guard armed at 100 s on the host's clock, judging at 200 s, its lease out at 110 s.
    fn armed() -> Record {
        Record {
            format: 2,
            state: GuardState::Armed,
            unit: "qwen.service".into(),
            unit_path: "/etc/systemd/system/qwen.service".into(),
            new_sha256: "new".into(),
            previous: Some("/gen/1.service".into()),
            previous_sha256: Some("old".into()),
            beneath: false,
            disable: false,
            then: Then::Restart,
            aside: None,
            health_url: "http://127.0.0.1:30000/health".into(),
            crash_loop_restarts: CRASH_LOOP_RESTARTS,
            judge_after: 100.0,
            margin: 10.0,
            armed_by: "ci@box pid 7".into(),
            armed_at: "t0".into(),
            run: "run-1".into(),
            change: Change::Restart,
            replaces: true,
            watch: Watch {
                boot_id: Some("boot-1".into()),
                armed_mono: Some(100.0),
                judge_at: 200.0,
                lease_until: 110.0,
                ..Watch::default()
            },
        }
    }

    fn facts(sha: &str, active: &str, sub: &str, restarts: u32, entered: f64) -> Facts {
        Facts {
            sha256: Some(sha.into()),
            active: active.into(),
            sub: sub.into(),
            restarts,
            entered,
            stale: false,
            written: None,
        }
    }

    /// `/health` for a case: a status, no answer, or never asked (the guard must not ask).
    #[derive(Clone, Copy)]
    enum Health {
        Code(u16),
        Silent,
        Unasked,
    }

    fn assert_judged(cases: Vec<(Record, Facts, f64, Health)>, expected: &[(Verdict, &str)]) {
        assert_eq!(cases.len(), expected.len());
        for (i, ((guard, f, at, h), want)) in cases.into_iter().zip(expected).enumerate() {
            let got = judge(&guard, &f, at, || match h {
                Health::Code(c) => Some(c),
                Health::Silent => None,
                Health::Unasked => panic!("case {i}: the guard asked /health where it must not"),
            });
            assert_eq!((got.0, got.1.as_str()), *want, "case {i}");
        }
    }

    /// [`armed`] for a live change.
    fn armed_live() -> Record {
        Record {
            change: Change::InPlace,
            ..armed()
        }
    }

    /// A case judging [`armed`], as most are.
    fn case(f: Facts, at: f64, h: Health) -> (Record, Facts, f64, Health) {
        (armed(), f, at, h)
    }

    use Health::{Code, Silent, Unasked};
    use Verdict::*;

    #[test]
    fn the_guard_restores_only_what_is_broken_and_keeps_a_healthy_unit() {
        let group = Record {
            crash_loop_restarts: 1,
            ..armed()
        };
        let cases = vec![
            // The controller's lease holds: nothing, whatever the unit does.
            case(facts("new", "failed", "failed", 0, 101.0), 105.0, Unasked),
            // Another change replaced the unit file: left alone.
            case(facts("other", "failed", "failed", 0, 101.0), 150.0, Unasked),
            // The new invocation failed, or systemd restarted it twice: restored before the deadline.
            case(facts("new", "failed", "failed", 0, 101.0), 150.0, Unasked),
            case(
                facts("new", "activating", "auto-restart", 2, 130.0),
                150.0,
                Unasked,
            ),
            // A group's rank is broken at its first restart when it cannot rejoin its process
            // group; one that answers met its peers afresh (they restarted with it), and waits.
            (
                group.clone(),
                facts("new", "activating", "auto-restart", 1, 130.0),
                150.0,
                Silent,
            ),
            (
                group,
                facts("new", "active", "running", 1, 130.0),
                150.0,
                Code(200),
            ),
            case(
                facts("new", "activating", "auto-restart", 1, 130.0),
                150.0,
                Unasked,
            ),
            // Loading, before the deadline: /health is not even asked.
            case(
                facts("new", "activating", "start", 0, 101.0),
                150.0,
                Unasked,
            ),
            // At the deadline: healthy is let stand, anything else restored.
            case(
                facts("new", "active", "running", 0, 101.0),
                200.0,
                Code(200),
            ),
            case(
                facts("new", "active", "running", 0, 101.0),
                200.0,
                Code(503),
            ),
            case(facts("new", "activating", "start", 0, 101.0), 200.0, Silent),
        ];
        let expected = [
            (Wait, "the controller renewed its lease"),
            (
                Leave,
                "the unit file changed since the guard was armed; left as it is",
            ),
            (Restore, "the new unit failed"),
            (Restore, "the new unit is crash-looping (2 restarts)"),
            (Restore, "the new unit is crash-looping (1 restart)"),
            (Wait, "before the deadline"),
            (Wait, "before the deadline"),
            (Wait, "before the deadline"),
            (
                Keep,
                "active and /health 200 at the deadline, but no apply confirmed it",
            ),
            (
                Restore,
                "not healthy by the deadline (active/running, /health 503)",
            ),
            (
                Restore,
                "not healthy by the deadline (activating/start, /health no answer)",
            ),
        ];
        assert_judged(cases, &expected);
    }

    #[test]
    fn a_file_never_written_under_an_armed_guard_is_put_back_but_a_confirms_is_left() {
        // Armed before the write: the controller died before its write took (or mid-write,
        // files moved aside already). Put back, server untouched; for a restart, a live change
        // and a unit that was new alike.
        let live = armed_live();
        let new_unit = Record {
            previous: None,
            previous_sha256: None,
            ..armed()
        };
        let no_file = Facts {
            sha256: None,
            ..facts("", "inactive", "dead", 0, 0.0)
        };
        // A confirm's file was the new one at arming: the previous one there now is someone
        // else's change.
        let confirm = Record {
            change: Change::InPlace,
            watch: Watch {
                new_started: true,
                ..armed().watch
            },
            ..armed()
        };
        let cases = vec![
            case(facts("old", "active", "running", 0, 90.0), 105.0, Unasked),
            case(facts("old", "active", "running", 0, 90.0), 150.0, Unasked),
            (
                live,
                facts("old", "active", "running", 0, 90.0),
                150.0,
                Unasked,
            ),
            (new_unit, no_file, 150.0, Unasked),
            (
                confirm,
                facts("old", "active", "running", 0, 90.0),
                150.0,
                Unasked,
            ),
            // Started since the arming with the previous file on disk: restored, not trusted.
            case(facts("old", "active", "running", 0, 120.0), 150.0, Unasked),
        ];
        let never = "the new file was never written (the controller stopped before its write)";
        let expected = [
            (Wait, "the controller renewed its lease"),
            (PutBack, never),
            (PutBack, never),
            (PutBack, never),
            (
                Leave,
                "the unit file changed since the guard was armed; left as it is",
            ),
            (
                Restore,
                "the server started since the arming and its file is the previous one again: what runs may be the new unit",
            ),
        ];
        assert_judged(cases, &expected);
    }

    #[test]
    fn a_new_unit_that_never_started_is_never_kept_as_if_it_ran() {
        // The controller died after arming and before its restart: the old server still runs,
        // healthy. Keeping it "unconfirmed" would let the next apply record a change never made.
        let live = armed_live();
        let cases = vec![
            case(facts("new", "active", "running", 0, 90.0), 150.0, Unasked),
            case(facts("new", "active", "running", 0, 90.0), 250.0, Unasked),
            // Stopped by the controller, never started: the previous unit restored.
            case(facts("new", "inactive", "dead", 0, 90.0), 150.0, Unasked),
            // The old server still stopping: waited for, up to the deadline.
            case(
                facts("new", "deactivating", "stop-sigterm", 0, 90.0),
                150.0,
                Unasked,
            ),
            case(
                facts("new", "deactivating", "stop-sigterm", 0, 90.0),
                250.0,
                Unasked,
            ),
            // The old invocation's state says nothing of the new one.
            case(facts("new", "failed", "failed", 5, 90.0), 150.0, Unasked),
            // The file was the new one already (a run finishing a dead one): what runs may be
            // the new unit, unverified, so it is restored rather than left under the old file.
            (
                Record {
                    replaces: false,
                    ..armed()
                },
                facts("new", "active", "running", 0, 90.0),
                150.0,
                Unasked,
            ),
            // A live change starts nothing: judged at its deadline as the running server.
            (
                live.clone(),
                facts("new", "active", "running", 0, 90.0),
                150.0,
                Unasked,
            ),
            (
                live.clone(),
                facts("new", "active", "running", 0, 90.0),
                200.0,
                Code(200),
            ),
            // Told, and the guard heard it: the running server's change, kept as a start is.
            (
                Record {
                    watch: Watch {
                        new_started: true,
                        ..live.watch.clone()
                    },
                    ..live.clone()
                },
                facts("new", "active", "running", 0, 90.0),
                200.0,
                Code(200),
            ),
            // Cut short in the telling: restarted whole, healthy or not.
            (
                Record {
                    watch: Watch {
                        telling: true,
                        ..live.watch.clone()
                    },
                    ..live
                },
                facts("new", "active", "running", 0, 90.0),
                200.0,
                Unasked,
            ),
        ];
        let expected = [
            (
                PutBack,
                "the new unit never started (the controller stopped before its restart)",
            ),
            (
                PutBack,
                "the new unit never started (the controller stopped before its restart)",
            ),
            (
                Restore,
                "the server was stopped and the new unit never started (inactive/dead)",
            ),
            (Wait, "the old server is stopping"),
            (
                Restore,
                "the server was stopped and the new unit never started (deactivating/stop-sigterm)",
            ),
            (
                Restore,
                "the server was stopped and the new unit never started (failed/failed)",
            ),
            (
                Restore,
                "the controller stopped before its restart, and the server that runs started before the arming, perhaps from the new file, unverified",
            ),
            (Wait, "before the deadline"),
            (
                PutBack,
                "the live change was never told to the server (the controller stopped before it)",
            ),
            (
                Keep,
                "active and /health 200 at the deadline, but no apply confirmed it",
            ),
            (
                Restore,
                "the live change was cut short while the server was told it: what it serves is not known",
            ),
        ];
        assert_judged(cases, &expected);
    }

    /// `armed()` taken over by the controller at 150 s, its lease out at 160 s.
    fn taken() -> Record {
        let mut r = armed();
        r.state = GuardState::RollingBack;
        r.watch.taken_at = Some(150.0);
        r.watch.lease_until = 160.0;
        r.watch.judge_at = 400.0;
        r
    }

    fn by_guard() -> Record {
        let mut r = taken();
        r.watch.restored = true;
        r.watch.restored_at = Some(170.0);
        r
    }

    fn stale(mut f: Facts) -> Facts {
        f.stale = true;
        f
    }

    #[test]
    fn a_rollback_under_way_is_finished_without_restarting_what_came_back() {
        // A group's rank the guard restored, systemd's count of 1 restart kept across it.
        let mut rank = by_guard();
        rank.crash_loop_restarts = 1;
        rank.watch.restored_entered = Some(171.0);
        rank.watch.restored_restarts = Some(1);
        let mut joined = by_guard();
        joined.watch.restored_entered = Some(168.0);
        joined.watch.restored_restarts = Some(0);
        let mut counted = taken();
        counted.crash_loop_restarts = 1;
        counted.watch.taken_restarts = 1;
        let mut new_unit = taken();
        new_unit.previous = None;
        new_unit.previous_sha256 = None;
        let mut removed = new_unit.clone();
        removed.watch.restored = true;
        let disarmed = Record {
            state: GuardState::Disarmed,
            ..armed()
        };
        // Most cases judge `taken()`.
        let taken_case = |f, at, h| (taken(), f, at, h);
        let cases = vec![
            // The previous unit back and restarted since: waited for, then done.
            taken_case(
                facts("old", "active", "running", 0, 151.0),
                165.0,
                Code(200),
            ),
            taken_case(
                facts("old", "activating", "start", 0, 151.0),
                165.0,
                Code(503),
            ),
            taken_case(
                facts("old", "activating", "start", 0, 151.0),
                400.0,
                Code(503),
            ),
            // Its file back, but the new server still runs (not restarted since): restored.
            taken_case(facts("old", "active", "running", 0, 120.0), 165.0, Unasked),
            taken_case(facts("new", "active", "running", 0, 120.0), 165.0, Unasked),
            // The previous file back but not loaded (apply died before daemon-reload): the new
            // definition still runs, crash-looping. Restored, not waited for.
            taken_case(
                stale(facts("old", "activating", "auto-restart", 9, 155.0)),
                165.0,
                Unasked,
            ),
            taken_case(
                facts("old", "activating", "auto-restart", 9, 155.0),
                165.0,
                Unasked,
            ),
            // The guard's own restore did not start the previous unit: not restored again.
            (
                by_guard(),
                facts("old", "failed", "failed", 0, 171.0),
                180.0,
                Unasked,
            ),
            // Its restart joined a start the dead controller had begun (at 168 s, before the
            // guard's restore at 170 s): that start is the restored unit's.
            (
                joined,
                facts("old", "active", "running", 0, 168.0),
                180.0,
                Code(200),
            ),
            // A group's rank: judged by /health by its deadline, not by its restarts.
            (
                rank.clone(),
                facts("old", "active", "running", 1, 171.0),
                180.0,
                Code(200),
            ),
            (
                rank.clone(),
                facts("old", "activating", "auto-restart", 2, 185.0),
                190.0,
                Code(503),
            ),
            (
                rank,
                facts("old", "activating", "auto-restart", 7, 395.0),
                400.0,
                Code(503),
            ),
            // The controller took over a unit systemd had restarted once: its rollback's start
            // counts from there.
            (
                counted,
                facts("old", "active", "running", 1, 155.0),
                165.0,
                Code(200),
            ),
            // A unit that was new: removed, once.
            (
                new_unit,
                facts("new", "active", "running", 0, 120.0),
                165.0,
                Unasked,
            ),
            (
                removed,
                facts("gone", "inactive", "dead", 0, 120.0),
                165.0,
                Unasked,
            ),
            // Settled already: nothing more.
            (
                disarmed,
                facts("new", "failed", "failed", 0, 101.0),
                300.0,
                Unasked,
            ),
        ];
        let expected = [
            (Done, "the previous unit runs again and answers /health 200"),
            (Wait, "the restored unit is loading"),
            (
                Failed,
                "the restored unit was not healthy by its deadline (activating/start)",
            ),
            (Restore, "the controller's rollback did not finish"),
            (Restore, "the controller's rollback did not finish"),
            (Restore, "the controller's rollback did not finish"),
            (Restore, "the controller's rollback did not finish"),
            (
                Failed,
                "the restored unit did not start or did not stay up (failed/failed)",
            ),
            (Done, "the previous unit runs again and answers /health 200"),
            (Done, "the previous unit runs again and answers /health 200"),
            (Wait, "the restored unit is loading"),
            (
                Failed,
                "the restored unit was not healthy by its deadline (activating/auto-restart)",
            ),
            (Done, "the previous unit runs again and answers /health 200"),
            (Restore, "the controller's rollback did not finish"),
            (Done, "the rollback finished"),
            (Leave, "the guard is disarmed"),
        ];
        assert_judged(cases, &expected);
    }

    #[test]
    fn a_lease_renewed_after_the_guards_own_restore_does_not_hold_it_off_finishing() {
        let mut g = by_guard();
        g.watch.lease_until = 500.0;
        let f = facts("old", "active", "running", 0, 171.0);
        assert_eq!(judge(&g, &f, 180.0, || Some(200)).0, Done);
        let mut held = taken();
        held.watch.lease_until = 500.0;
        assert_eq!(judge(&held, &f, 180.0, || panic!("not asked")).0, Wait);
    }

    #[test]
    fn the_new_units_start_is_recorded_once_seen_and_only_for_a_restart() {
        let mut g = armed();
        g.saw(&facts("new", "active", "running", 0, 90.0));
        assert!(
            !g.watch.new_started,
            "the old invocation is no start of the new unit"
        );
        g.saw(&facts("new", "active", "running", 0, 101.0));
        assert!(g.watch.new_started);
        let mut live = armed_live();
        live.saw(&facts("new", "active", "running", 0, 101.0));
        assert!(!live.watch.new_started);
    }

    #[test]
    fn a_disarm_never_ends_the_guards_own_restore() {
        let mut own = by_guard();
        assert_eq!(own.disarm("run-1", "t2"), Ok(GuardState::RollingBack));
        assert_eq!(own.state, GuardState::RollingBack);
        let mut controllers = taken();
        assert_eq!(
            controllers.disarm("run-1", "t2"),
            Ok(GuardState::RollingBack)
        );
        assert_eq!(controllers.state, GuardState::Disarmed);
        let mut settled = Record {
            state: GuardState::RolledBack,
            ..armed()
        };
        assert_eq!(settled.disarm("run-1", "t2"), Ok(GuardState::RolledBack));
        assert_eq!(settled.state, GuardState::RolledBack);
    }

    #[test]
    fn another_runs_commands_are_refused_and_change_nothing() {
        let mut g = armed();
        let before = g.clone();
        let other = Err(OtherRun {
            armed_by: "ci@box pid 7".into(),
        });
        assert_eq!(g.renew("run-0", 500.0), other);
        assert_eq!(g.take("run-0", 500.0, Some(0)), other);
        assert_eq!(g.disarm("run-0", "t"), other);
        assert_eq!(g, before);
        assert_eq!(g.renew("run-1", 500.0), Ok(GuardState::Armed));
        assert_eq!(g.watch.lease_until, 510.0);
    }

    #[test]
    fn a_reboot_voids_the_old_boots_clock_and_counts_the_deadline_from_the_boot() {
        let mut g = armed();
        g.watch.taken_at = Some(150.0);
        // The guard itself restarted in the same boot: its times stand.
        let same = g.clone();
        g.start_watch(300.0, "boot-1", Some("new"));
        assert_eq!(g, same);
        g.start_watch(3.0, "boot-2", Some("new"));
        let w = &g.watch;
        assert_eq!(
            (w.armed_mono, w.lease_until, w.judge_at, w.taken_at),
            (Some(0.0), 0.0, 103.0, Some(0.0))
        );
        // The new unit crash-looping after the boot is the new unit's, and judged at once.
        let (verdict, _) = judge(
            &g,
            &facts("new", "activating", "auto-restart", 2, 5.0),
            10.0,
            || panic!("not asked"),
        );
        assert_eq!(verdict, Restore);
        // A first start sets the lease and the deadline from arming.
        let mut fresh = armed();
        fresh.watch = Watch::default();
        fresh.start_watch(50.0, "boot-1", Some("new"));
        let w = &fresh.watch;
        assert_eq!(
            (w.armed_mono, w.lease_until, w.judge_at),
            (Some(50.0), 60.0, 150.0)
        );
    }

    #[test]
    fn a_boot_with_the_previous_file_on_disk_does_not_count_its_start_as_the_new_units() {
        // Armed, then the host rebooted before the controller wrote: the boot started the
        // previous file. The watch counts only starts from now on.
        let mut g = armed();
        g.start_watch(12.0, "boot-2", Some("old"));
        assert_eq!(g.watch.armed_mono, Some(12.0));
        g.saw(&facts("new", "active", "running", 0, 4.0));
        assert!(
            !g.watch.new_started,
            "the boot's start of the previous file"
        );
        g.saw(&facts("new", "active", "running", 0, 20.0));
        assert!(
            g.watch.new_started,
            "the controller's restart after the write"
        );
    }

    #[test]
    fn a_take_in_a_new_boot_before_the_guards_start_keeps_its_times() {
        // The host rebooted; the controller reconnects and takes the guard over before the
        // guard's unit has started in the new boot.
        let mut g = armed();
        g.command_in_boot("run-1", 5.0, "boot-2", Some("new"))
            .unwrap();
        g.take("run-1", 5.0, Some(0)).unwrap();
        let taken = g.clone();
        // The guard starts in the same boot: the take's lease and times stand.
        g.start_watch(6.0, "boot-2", Some("new"));
        assert_eq!(g, taken);
        assert_eq!(g.watch.lease_until, 15.0);
        let (verdict, why) = judge(&g, &facts("old", "active", "running", 0, 7.0), 8.0, || {
            Some(200)
        });
        assert_eq!(
            (verdict, why.as_str()),
            (Wait, "the controller renewed its lease")
        );
        // Another run's command does not touch the record.
        let before = g.clone();
        assert!(g
            .command_in_boot("run-0", 9.0, "boot-3", Some("new"))
            .is_err());
        assert_eq!(g, before);
    }

    #[test]
    fn a_reboot_starts_a_kept_live_change_from_its_file_and_the_guard_judges_that_start() {
        // A live change kept healthy with nobody seeing the server take it: the boot is the
        // first start from its file, and judged as a restart's.
        let mut live = armed_live();
        live.settle_on(Keep, "active and /health 200 at the deadline", "t1");
        live.start_watch(3.0, "boot-2", Some("new"));
        assert_eq!(
            (live.state, live.change),
            (GuardState::Armed, Change::Restart)
        );
        let (verdict, _) = judge(
            &live,
            &facts("new", "activating", "auto-restart", 2, 5.0),
            10.0,
            || panic!("not asked"),
        );
        assert_eq!(verdict, Restore);
        // A kept restart, or a confirm's record (its start seen at arming), stays kept.
        let mut restart = armed();
        restart.settle_on(Keep, "healthy", "t1");
        restart.start_watch(3.0, "boot-2", Some("new"));
        assert_eq!(restart.state, GuardState::Unconfirmed);
        let mut confirm = armed_live();
        confirm.watch.new_started = true;
        confirm.settle_on(Keep, "healthy", "t1");
        confirm.start_watch(3.0, "boot-2", Some("new"));
        assert_eq!(confirm.state, GuardState::Unconfirmed);
    }

    #[test]
    fn the_record_reads_back_as_it_was_written() {
        let mut g = by_guard();
        g.watch.why = Some("the new unit failed".into());
        let text = serde_json::to_string(&g).unwrap();
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, g);
        // A record written by an earlier guard (format 1, no run, no change) still reads.
        let old = r#"{"format":1,"state":"armed","unit":"q.service","unit_path":"/etc/systemd/system/q.service","new_sha256":"n","previous":null,"previous_sha256":null,"beneath":false,"disable":false,"then":"restart","aside":null,"health_url":"http://127.0.0.1:1/health","crash_loop_restarts":2,"judge_after":10.0,"margin":4.0,"armed_by":"x","armed_at":"y","armed_mono":5.5,"judge_at":15.5,"lease_until":9.5}"#;
        let r: Record = serde_json::from_str(old).unwrap();
        assert_eq!((r.change, r.run.as_str()), (Change::Restart, ""));
        assert_eq!(r.watch.armed_mono, Some(5.5));
    }
}
