//! The apply protocol as a model, checked by a real model checker (stateright) over every order
//! of its actors' steps: the controller (core's `Transaction`, step by step, dying at any step),
//! the host's guard (core's `guard::judge` and the record's transitions, on `guard.json` as the
//! host keeps it), systemd and the server (the new unit fast, slow, crash-looping or hanging),
//! the link (cut, healed), the clock (the lease renewed while the controller lives, deadlines),
//! a reboot of the host, either a power cut that takes the controller down with it or the host
//! alone while the controller lives on (the guard's unit then starts some time after the host
//! answers), a stale earlier run sending its commands to this run's guard, and an apply run
//! again after a dead one.
//!
//! The model runs the decision functions the program runs, not a copy of them: a change to the
//! transaction or the guard's judge that breaks a property fails here, with the trace (each step
//! and the state it left).
//!
//! Modelled: a single server; a restart, a live change (a value told to the running server,
//! which verification cannot see) and a confirm (a unit the guard let stand, verified as it runs). A
//! run after a dead one plans from what the host shows and takes the dead run's guard over, or
//! waits for it. Not yet: a 2-rank group, and a stop of the old server that outlasts the lease
//! (apply renews the lease through its restart).

use reconcile_core::guard::{judge, Change, Facts, GuardState, Record, Settled, Verdict};
use reconcile_core::transaction::{End, Kind, Step, Transaction, Went};
use stateright::{Checker, Model, Property};

mod model;
use model::{on_clock, Def, DEADLINE, MARGIN, PREVIOUS_LOAD};

/// Crashes, cuts and reboots happen before this tick; after it, the actors settle.
const FAULTS_UNTIL: u32 = 7;
/// The model's horizon: every actor has settled by then (P5 is judged there). After the last
/// fault: the lease, the guard's deadline, a restore's load and its own deadline.
const HORIZON: u32 = FAULTS_UNTIL + MARGIN + 2 * (DEADLINE + MARGIN) + PREVIOUS_LOAD + 2;

/// How the new unit's server behaves once started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Behaviour {
    /// Healthy a tick after its start.
    Fast,
    /// Healthy at verification's deadline, no sooner.
    Slow,
    /// Dies a tick after each start; systemd restarts it.
    CrashLoop,
    /// Never answers `/health` 200.
    Hang,
}

/// systemd's view of the managed unit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Unit {
    /// The file on disk, and the definition systemd loaded.
    file: Def,
    loaded: Def,
    /// What runs, and when it last began to start (global ticks); `None`: stopped.
    running: Option<(Def, u32)>,
    /// The event in its tick when it began to start (`State::micro`).
    entered_micro: u32,
    restarts: u32,
    /// What runs is the new unit's start since the arming (the apply's restart, or the boot
    /// that started the new file), or the server this apply told a live change: P1 and P3 judge
    /// only such a server.
    new_invocation: bool,
    /// Whose weights and values the running server serves: its file's at its start, then
    /// whatever it was told live.
    values: Def,
    /// systemd's InvocationID, as a count of starts.
    invocation: u32,
    /// When the file was last written (tick, event in it): its mtime.
    written: (u32, u32),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Controller {
    /// Its token.
    run: &'static str,
    /// Under [`Order::WriteThenArm`], it wrote before arming: whether that write replaced the
    /// previous file.
    wrote_early: Option<bool>,
    /// When it died (a crash, or the host's reboot).
    died_at: Option<u32>,
    tx: Transaction,
    alive: bool,
    /// When its restart (or its rollback's) took, for verification's deadline.
    restarted_at: Option<u32>,
    /// The invocation it verifies: another start (a reboot's) fails its verification.
    verifying: Option<u32>,
    /// This run took the guard over and restores itself.
    restoring: bool,
    /// The guard had acted when this run tried to take it over: since when this run waits for it
    /// to settle (still renewing its lease), up to the guard's own bound.
    awaiting_guard: Option<u32>,
    /// It gave up on a guard still at work while the previous unit already served: its report
    /// ("the host needs attention") would mislead.
    misreported: bool,
    /// What it recorded as its ending.
    ended: Option<End>,
    /// It recorded the change as converged: what ran then.
    converged_on: Option<(Def, bool)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u32,
    /// Events taken on the host in this tick so far (`State::event`).
    micro: u32,
    behaviour: Behaviour,
    unit: Unit,
    ctl: Controller,
    /// guard.json as the host keeps it; `None` before arming.
    guard: Option<String>,
    /// Whether the guard's program runs (started at arming, and at boot).
    guard_running: bool,
    /// Whether its watch has begun in this boot (`start_watch`): after a boot the guard's unit
    /// starts some time after the host answers, and a controller's command may come first.
    watch_started: bool,
    link_up: bool,
    cut_once: bool,
    /// When the host last booted (global ticks), and how many times.
    boot_at: u32,
    boots: u32,
    /// Restores (a restart of the previous unit) by this run and by its guard.
    guard_restores: u32,
    controller_restores: u32,
    /// The new server answered /health by verification's deadline, yet the guard restored it.
    healthy_restored: bool,
    /// The new server was healthy within its deadline at some point of this invocation.
    healthy_in_time: bool,
    /// A stale run's command changed this run's guard.
    stale_acted: bool,
    /// The run after a dead one restarted a healthy server that already ran the desired unit.
    needless_restart: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    /// The controller carries out its current step.
    Step,
    Crash,
    Cut,
    Heal,
    /// A power cut of the rack: the host reboots and the controller dies with it.
    Reboot,
    /// The host alone reboots; the controller, elsewhere, lives on and reconnects.
    HostReboot,
    /// A gate after readiness fails (a smoke or quality gate), on whatever server runs.
    FailGate,
    /// An earlier run, stale (its link came back, its process resumed), sends its guard command
    /// to this run's guard.
    Stale(Command),
    /// The operator runs apply again after the first run died: it plans from what the host
    /// shows (the unit file, the guard's record, systemd) as `apply::decide` does.
    Rerun,
}

/// A controller's command to the guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Command {
    Renew,
    Take,
    Disarm,
}

struct Protocol {
    kind: Kind,
    behaviours: Vec<Behaviour>,
    /// The guard's decision: core's [`judge`], or one broken on purpose to show the checker
    /// catches it.
    judge: GuardJudge,
    order: Order,
    /// Whether a run after a dead one confirms what the host shows: core's
    /// [`Settled::confirmable`], or a rule broken on purpose.
    confirms: fn(&Settled) -> bool,
}

fn core_confirms(g: &Settled) -> bool {
    g.confirmable("new")
}

/// Which comes first of the new file and its guard.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Core's transaction as it is.
    ArmThenWrite,
    /// The order before the model: the write just before the arming (the controller may die
    /// between them), to show the checker finds what that left open.
    WriteThenArm,
}

/// The guard's decision over its record, what it sees, the host's clock and whether the server
/// answers `/health` 200.
type GuardJudge = fn(&Record, &Facts, f64, bool) -> (Verdict, String);

fn core_judge(g: &Record, f: &Facts, at: f64, healthy: bool) -> (Verdict, String) {
    judge(g, f, at, || Some(if healthy { 200 } else { 503 }))
}

const RUN: &str = "run-1";
/// The run an operator starts after the first one died.
const RERUN: &str = "run-2";

impl Controller {
    fn new(kind: Kind, run: &'static str) -> Controller {
        Controller {
            run,
            wrote_early: None,
            died_at: None,
            tx: Transaction::new(kind),
            alive: true,
            restarted_at: None,
            verifying: None,
            restoring: false,
            awaiting_guard: None,
            misreported: false,
            ended: None,
            converged_on: None,
        }
    }
}
/// An earlier run's token.
const STALE_RUN: &str = "run-0";

impl State {
    /// The host's monotonic clock now: the tick, and the events already taken in it (each a
    /// hundredth of a tick), so that a record written and a start in one tick are ordered as
    /// they happened.
    fn host_mono(&self) -> f64 {
        on_clock((self.now, self.micro), self.boot_at)
    }

    /// The clock at an event on the host (a record written, a start), which comes after every
    /// earlier one.
    fn event(&mut self) -> f64 {
        let at = self.host_mono();
        self.micro += 1;
        at
    }

    /// When what runs began to start, on this boot's monotonic clock; a start before this boot
    /// reads as 0 (systemd's timestamps are of this boot).
    fn entered(&self) -> f64 {
        match self.unit.running {
            Some((_, at)) => on_clock((at, self.unit.entered_micro), self.boot_at),
            None => 0.0,
        }
    }

    /// Whether the server answers /health 200.
    fn healthy(&self) -> bool {
        match self.unit.running {
            // A live change that hangs the server takes its /health with it.
            Some((Def::Previous, _))
                if self.unit.values == Def::New && self.behaviour == Behaviour::Hang =>
            {
                false
            }
            Some((Def::Previous, since)) => self.now >= since + PREVIOUS_LOAD,
            Some((Def::New, since)) => match self.behaviour {
                Behaviour::Fast => self.now > since,
                Behaviour::Slow => self.now >= since + DEADLINE,
                Behaviour::CrashLoop | Behaviour::Hang => false,
            },
            None => false,
        }
    }

    /// What the running server serves: the new unit once it started from it or took it live.
    fn effective(&self) -> Option<Def> {
        self.unit.running.map(|_| self.unit.values)
    }

    fn crash_looping(&self) -> bool {
        matches!(self.unit.running, Some((Def::New, _))) && self.behaviour == Behaviour::CrashLoop
    }

    fn facts(&self) -> Facts {
        let sha = match self.unit.file {
            Def::Previous => "old",
            Def::New => "new",
        };
        let (active, sub) = match self.unit.running {
            None => ("inactive", "dead"),
            Some(_) if self.crash_looping() && self.unit.restarts > 0 => {
                ("activating", "auto-restart")
            }
            Some(_) => ("active", "running"),
        };
        Facts {
            sha256: Some(sha.into()),
            active: active.into(),
            sub: sub.into(),
            restarts: self.unit.restarts,
            entered: self.entered(),
            stale: self.unit.file != self.unit.loaded,
            written: Some(self.written()),
        }
    }

    fn record(&self) -> Option<Record> {
        self.guard
            .as_deref()
            .map(|text| serde_json::from_str(text).expect("guard.json reads"))
    }

    fn keep(&mut self, record: &Record) {
        self.guard = Some(serde_json::to_string(record).expect("guard.json writes"));
    }

    /// systemctl restart of the loaded definition (stop, then start).
    fn restart(&mut self, new_invocation: bool) {
        self.unit.running = Some((self.unit.loaded, self.now));
        self.unit.entered_micro = self.micro;
        self.micro += 1;
        self.unit.restarts = 0;
        self.unit.new_invocation = new_invocation;
        self.unit.values = self.unit.loaded;
        self.unit.invocation += 1;
        self.healthy_in_time = false;
    }

    fn daemon_reload(&mut self) {
        self.unit.loaded = self.unit.file;
    }

    /// The unit file replaced (an atomic rename: its mtime is now).
    fn write_file(&mut self, def: Def) {
        self.unit.file = def;
        self.unit.written = (self.now, self.micro);
        self.micro += 1;
    }

    /// The file's mtime on this boot's monotonic clock (0 for one written before the boot).
    fn written(&self) -> f64 {
        on_clock(self.unit.written, self.boot_at)
    }

    /// Nothing will change any more but the clock: the controller is done or dead, the guard
    /// settled, and the server steady (serving, stopped, or hung for good).
    fn quiescent(&self) -> bool {
        let controller_done = !self.ctl.alive || self.ctl.ended.is_some();
        let steady = match self.unit.running {
            None => true,
            Some((Def::Previous, since)) => self.now >= since + PREVIOUS_LOAD,
            Some((Def::New, since)) => match self.behaviour {
                Behaviour::Fast => self.now > since,
                Behaviour::Slow => self.now >= since + DEADLINE,
                Behaviour::Hang => true,
                Behaviour::CrashLoop => false,
            },
        };
        controller_done && !self.guard_running && steady && self.link_up
    }

    /// Whether a host command reaches the host now.
    fn reachable(&self) -> bool {
        self.link_up
    }
}

/// The guard's record as apply arms it for a change of `kind`.
fn arming(kind: Kind, run: &str) -> Record {
    let change = if kind == Kind::Restart {
        Change::Restart
    } else {
        Change::InPlace
    };
    model::arming(run, change, 2)
}

impl Protocol {
    /// The protocol as core runs it (its guard's judge, arming before the write, its rule for
    /// confirming), for a change of `kind` to servers that behave as `behaviours`.
    fn of_core(kind: Kind, behaviours: &[Behaviour]) -> Protocol {
        Protocol {
            kind,
            behaviours: behaviours.to_vec(),
            judge: core_judge,
            order: Order::ArmThenWrite,
            confirms: core_confirms,
        }
    }

    fn boot_id(s: &State) -> String {
        format!("boot-{}", s.boots)
    }

    /// The host boots again: systemd starts the unit from the file on disk (it is enabled), and
    /// the guard's unit (enabled too), whose watch begins at a later poll.
    fn boot(s: &mut State) {
        s.boots += 1;
        s.boot_at = s.now;
        s.daemon_reload();
        s.restart(s.unit.loaded == Def::New);
        s.guard_running = s.guard.is_some();
        s.watch_started = false;
    }

    /// A controller's command (renew, take) as the host's program runs it: in this boot first.
    fn command(s: &mut State, run: &str, g: &mut Record) -> Option<()> {
        // An event on the host: a start after it is ordered after it.
        let now = s.event();
        let on_disk = s.facts().sha256;
        g.command_in_boot(run, now, &Self::boot_id(s), on_disk.as_deref())
            .ok()
    }

    /// The guard's poll: judged by core, carried out as `reconcile-guard watch` does.
    fn guard_poll(&self, s: &mut State) {
        let Some(mut g) = s.record() else { return };
        if !s.watch_started {
            // The guard's unit started in this boot: its watch begins, and a settled record ends it.
            let on_disk = s.facts().sha256;
            g.start_watch(s.event(), &Self::boot_id(s), on_disk.as_deref());
            // What runs is seen at once: a run after a dead one reads it.
            g.saw(&s.facts());
            s.watch_started = true;
            s.guard_running = g.watching();
            s.keep(&g);
            return;
        }
        if !g.watching() {
            s.guard_running = false;
            return;
        }
        g.saw(&s.facts());
        let (verdict, why) = (self.judge)(&g, &s.facts(), s.host_mono(), s.healthy());
        match verdict {
            Verdict::Wait => {}
            Verdict::PutBack => {
                s.write_file(Def::Previous);
                s.daemon_reload();
                g.put_back(&why, "put back", "t");
            }
            Verdict::Restore => {
                // Blind: the guard's own judgement of the start it watches (one after its
                // arming), not the finish of a rollback a controller began (its verification or
                // a gate judged the server), nor a server that may run the previous unit.
                // (A file put back since, by a controller's undo, is no longer the new unit the
                // guard watches: restoring then finishes that undo.)
                let watched = s.entered() > g.watch.armed_mono.unwrap_or(f64::INFINITY);
                if g.state == GuardState::Armed
                    && watched
                    && s.unit.file == Def::New
                    && s.unit.running.map(|(d, _)| d) == Some(Def::New)
                    && s.healthy_in_time
                {
                    s.healthy_restored = true;
                }
                // A server judged as it runs is restored only when it does not answer.
                if g.state == GuardState::Armed && g.change == Change::InPlace && s.healthy() {
                    s.healthy_restored = true;
                }
                g.begin_restore(&why, s.event());
                s.write_file(Def::Previous);
                s.daemon_reload();
                s.restart(false);
                // A dead run's guard restores that run's change, not this run's.
                if g.run == s.ctl.run {
                    s.guard_restores += 1;
                }
                let after = s.facts();
                g.restore_returned("restored", Some(&after));
            }
            settles => g.settle_on(settles, &why, "t"),
        }
        if !g.watching() {
            s.guard_running = false;
        }
        s.keep(&g);
    }

    /// The controller's current step, carried out against the model's host.
    fn step(&self, s: &mut State) -> Option<()> {
        let step = s.ctl.tx.step();
        let went = match step {
            Step::Prepare | Step::Preload | Step::Drain => Went::Passed,
            Step::Write if s.ctl.wrote_early.is_some() => Went::Passed,
            Step::Write => {
                // Written only under a guard that still holds: one that acted while the link
                // was cut has put the previous file back, and would not watch the new one.
                if self.guard_holds(s)? {
                    // A file already the new one is not written again (install::write_unit).
                    if s.unit.file != Def::New {
                        s.write_file(Def::New);
                    }
                    s.daemon_reload();
                    Went::Passed
                } else {
                    Went::Stopped
                }
            }
            // Not armed: nothing was written, nothing to put back.
            Step::PutBack if !s.ctl.tx.armed() => Went::Passed,
            Step::PutBack => {
                // A renewal first (in this boot: a reboot's start is then the guard's to see),
                // the previous file back (the server never restarted), then the guard disarmed.
                self.guard_holds(s)?;
                s.write_file(Def::Previous);
                s.daemon_reload();
                let mut g = s.record()?;
                g.disarm(s.ctl.run, "t").ok()?;
                s.keep(&g);
                Went::Passed
            }
            Step::Arm
                if self.order == Order::WriteThenArm
                    && s.ctl.tx.kind() == Kind::Restart
                    && s.ctl.wrote_early.is_none() =>
            {
                s.ctl.wrote_early = Some(s.unit.file != Def::New);
                s.write_file(Def::New);
                s.daemon_reload();
                return Some(());
            }
            Step::Arm => {
                let kind = s.ctl.tx.kind();
                // A confirm arms over the dead run's guard only while what it planned from still
                // holds: that guard may have acted since (restored, or put the file back).
                let prior = s.guard.as_deref().and_then(|t| Settled::parse(t).ok());
                if kind == Kind::Confirm {
                    if !prior.is_some_and(|g| (self.confirms)(&g)) {
                        s.ctl.tx.went(Went::Failed);
                        s.ctl.ended = Some(End::Refused);
                        return Some(());
                    }
                } else if prior.is_some_and(|g| g.state.active()) {
                    // A dead run's guard still at work (its lease, its judgement, its restore):
                    // not overwritten. The apply stops before anything changes, until it settles.
                    s.ctl.tx.went(Went::Failed);
                    return Some(());
                }
                if kind == Kind::Confirm {
                    // Verified as it runs, from now.
                    s.ctl.restarted_at = Some(s.now);
                    s.ctl.verifying = Some(s.unit.invocation);
                }
                let mut record = arming(kind, s.ctl.run);
                // This run's write replaces the previous file, or finds the change there already.
                record.replaces = s
                    .ctl
                    .wrote_early
                    .unwrap_or(kind != Kind::Confirm && s.unit.file != Def::New);
                // Confirming a kept start: a run after this one confirms it too.
                record.watch.new_started = kind == Kind::Confirm;
                let on_disk = s.facts().sha256;
                record.start_watch(s.event(), &Self::boot_id(s), on_disk.as_deref());
                s.keep(&record);
                s.guard_running = true;
                s.watch_started = true;
                Went::Passed
            }
            // Like the write, the restart and the live change go ahead only under a guard that
            // still holds: one that acted behind a cut has settled, and would not watch them.
            Step::Restart | Step::Live if !self.guard_holds(s)? => Went::Stopped,
            Step::Restart => {
                s.restart(true);
                s.ctl.restarted_at = Some(s.now);
                s.ctl.verifying = Some(s.unit.invocation);
                Went::Passed
            }
            Step::Verify => {
                let since = s.ctl.restarted_at?;
                // Verification follows the invocation it began with: another start (the host
                // rebooted under it) is a failed crash window.
                if s.ctl.verifying != Some(s.unit.invocation) {
                    let next = s.ctl.tx.went(Went::Failed);
                    if let Step::Done(end) = next {
                        s.ctl.ended.get_or_insert(end);
                    }
                    return Some(());
                }
                // Verification sees a start and /health, not the values a server took live (a
                // weights change shows in its identity; a value does not): a server judged as it
                // runs passes when it answers.
                let seen = match s.ctl.tx.kind() {
                    Kind::Live | Kind::Confirm => s.unit.running.is_some(),
                    _ => s.unit.running.map(|(d, _)| d) == Some(Def::New),
                };
                if s.healthy() && seen {
                    Went::Passed
                } else if s.crash_looping() && s.unit.restarts > 0
                    || s.unit.running.is_none()
                    || s.now >= since + DEADLINE
                {
                    Went::Failed
                } else {
                    return None; // still loading: verification polls on
                }
            }
            Step::Gates => Went::Passed,
            // Verified, then started again (the host rebooted): not confirmed, the guard left
            // armed to judge that start.
            Step::Confirm if s.ctl.verifying != Some(s.unit.invocation) => Went::Failed,
            Step::Confirm => {
                let mut g = s.record()?;
                let found = g.disarm(s.ctl.run, "t").ok()?;
                s.keep(&g);
                if found == GuardState::Armed
                    || found == GuardState::RollingBack && !g.watch.restored
                {
                    s.ctl.converged_on = s.effective().map(|d| (d, s.unit.new_invocation));
                    s.ctl.ended = Some(End::Converged);
                } else {
                    // The guard acted first: reported as its rollback, nothing recorded.
                    s.ctl.ended = Some(End::RolledBack);
                }
                Went::Passed
            }
            Step::RollBack => {
                if let Some(since) = s.ctl.awaiting_guard {
                    let settled = s.record().is_some_and(|g| !g.state.active());
                    if !settled && s.now < since + DEADLINE + MARGIN {
                        return None;
                    }
                    let serving = s.unit.running.map(|(d, _)| d) == Some(Def::Previous);
                    s.ctl.misreported = !settled && serving && s.healthy();
                    // Reported as the guard's rollback, or as a host needing attention.
                    s.ctl.ended = Some(End::RolledBack);
                    s.ctl.tx.went(Went::Passed);
                    return Some(());
                }
                if !s.ctl.restoring {
                    let mut g = s.record()?;
                    Self::command(s, s.ctl.run, &mut g)?;
                    let found = g.take(s.ctl.run, s.event(), Some(s.unit.restarts)).ok()?;
                    s.keep(&g);
                    if found != GuardState::Armed {
                        s.ctl.awaiting_guard = Some(s.now);
                        return Some(());
                    }
                    s.ctl.restoring = true;
                    s.write_file(Def::Previous);
                    s.daemon_reload();
                    s.restart(false);
                    s.controller_restores += 1;
                    return Some(());
                }
                // Verified as it loads; then the guard stands down.
                if !s.healthy() {
                    return None;
                }
                let mut g = s.record()?;
                g.disarm(s.ctl.run, "t").ok()?;
                s.keep(&g);
                s.ctl.ended = Some(End::RolledBack);
                Went::Passed
            }
            Step::Live => {
                // The running server told the change: it serves it from now. The guard hears
                // that it is being told first, then that it took it (`telling`, the calls,
                // `told`, within a second: one step here; the crash matrix cuts between them).
                if s.unit.running.is_none() {
                    Went::Failed
                } else {
                    let mut g = s.record()?;
                    g.telling(s.ctl.run).ok()?;
                    g.told(s.ctl.run).ok()?;
                    s.keep(&g);
                    s.unit.values = Def::New;
                    s.unit.new_invocation = true;
                    s.ctl.restarted_at = Some(s.now);
                    s.ctl.verifying = Some(s.unit.invocation);
                    Went::Passed
                }
            }
            Step::LiveBack => {
                // The previous values told back live and the previous file back; the server
                // verified as it runs (the one told, answering), then the guard disarmed. A
                // server that does not pass is restarted on its previous unit (RollBack).
                self.guard_holds(s)?;
                s.unit.values = Def::Previous;
                s.unit.new_invocation = false;
                s.write_file(Def::Previous);
                s.daemon_reload();
                if s.ctl.verifying != Some(s.unit.invocation) || !s.healthy() {
                    Went::Failed
                } else {
                    let mut g = s.record()?;
                    g.disarm(s.ctl.run, "t").ok()?;
                    s.keep(&g);
                    Went::Passed
                }
            }
            Step::RecordReload => Went::Failed,
            Step::Done(_) => return None,
        };
        let next = s.ctl.tx.went(went);
        if let Step::Done(end) = next {
            s.ctl.ended.get_or_insert(end);
        }
        Some(())
    }

    /// The controller's renewal, as `Armed::holds` sends it: whether its guard is still armed
    /// for this run. `None`: the guard's record is not there (never armed).
    fn guard_holds(&self, s: &mut State) -> Option<bool> {
        let mut g = s.record()?;
        Self::command(s, s.ctl.run, &mut g)?;
        g.saw(&s.facts());
        let found = g.renew(s.ctl.run, s.host_mono()).ok()?;
        s.keep(&g);
        Some(found == GuardState::Armed)
    }

    /// Whether the controller's current step can be carried out now (a wait is not).
    fn can_step(&self, s: &State) -> bool {
        self.step(&mut s.clone()).is_some()
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.behaviours
            .iter()
            .map(|&behaviour| {
                let confirm = self.kind == Kind::Confirm;
                // The apply begins at tick 1; what runs started before it.
                State {
                    now: 1,
                    micro: 0,
                    behaviour,
                    unit: Unit {
                        file: if confirm { Def::New } else { Def::Previous },
                        loaded: if confirm { Def::New } else { Def::Previous },
                        running: Some((if confirm { Def::New } else { Def::Previous }, 0)),
                        entered_micro: 0,
                        restarts: 0,
                        new_invocation: confirm,
                        values: if confirm { Def::New } else { Def::Previous },
                        invocation: 0,
                        written: (0, 0),
                    },
                    ctl: Controller::new(self.kind, RUN),
                    // A confirm's unit was let stand by the guard of a run that died.
                    guard: confirm.then(|| {
                        let mut kept = arming(Kind::Restart, "run-dead");
                        kept.watch.new_started = true;
                        kept.settle_on(Verdict::Keep, "healthy at the deadline", "t");
                        serde_json::to_string(&kept).expect("guard.json writes")
                    }),
                    guard_running: false,
                    watch_started: true,
                    link_up: true,
                    cut_once: false,
                    boot_at: 0,
                    boots: 1,
                    guard_restores: 0,
                    controller_restores: 0,
                    healthy_restored: false,
                    healthy_in_time: false,
                    stale_acted: false,
                    needless_restart: false,
                }
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now >= HORIZON {
            return;
        }
        let working = s.ctl.alive && s.ctl.ended.is_none();
        // A step takes no time: the clock moves on only while the controller waits (on a
        // loading server, a cut link) or is gone.
        if working && s.reachable() && self.can_step(s) {
            actions.push(Action::Step);
            if s.ctl.tx.step() == Step::Gates {
                actions.push(Action::FailGate);
            }
        } else {
            actions.push(Action::Tick);
        }
        if working && s.now < FAULTS_UNTIL {
            actions.push(Action::Crash);
            if s.link_up && !s.cut_once {
                actions.push(Action::Cut);
            }
            if s.guard.is_some() && s.boots == 1 {
                actions.push(Action::Reboot);
                actions.push(Action::HostReboot);
            }
        }
        // The operator's next run comes a tick (a poll of the guard, a second) or more after the
        // first died, and after the host is back from a reboot: it plans from what the guard
        // saw. (A run within the guard's one-second poll could find a start not yet recorded,
        // and restart it: the window this assumption leaves.)
        let later = s.ctl.died_at.is_some_and(|at| s.now > at);
        if s.ctl.run == RUN && later && s.guard.is_some() && s.now < FAULTS_UNTIL {
            actions.push(Action::Rerun);
        }
        if s.guard.is_some() && s.now < FAULTS_UNTIL {
            for command in [Command::Renew, Command::Take, Command::Disarm] {
                actions.push(Action::Stale(command));
            }
        }
        if !s.link_up && s.now < FAULTS_UNTIL {
            actions.push(Action::Heal);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                if s.quiescent() {
                    // Nothing acts any more: the horizon, where P5 is judged.
                    s.now = HORIZON;
                    return Some(s);
                }
                s.now += 1;
                s.micro = 0;
                // systemd restarts a crash-looping server; the new server's health is noted.
                if s.crash_looping() {
                    s.unit.running = Some((Def::New, s.now));
                    s.unit.entered_micro = s.micro;
                    s.micro += 1;
                    s.unit.restarts += 1;
                }
                if s.healthy() {
                    if let (Some((Def::New, since)), true) = (s.unit.running, s.unit.new_invocation)
                    {
                        if s.now <= since + DEADLINE {
                            s.healthy_in_time = true;
                        }
                    }
                }
                // A live controller renews its lease (a quarter of the margin apart).
                if s.ctl.alive && s.ctl.ended.is_none() && s.link_up {
                    if let Some(mut g) = s.record() {
                        let run = s.ctl.run;
                        if Self::command(&mut s, run, &mut g).is_some()
                            && g.renew(run, s.host_mono()).is_ok()
                        {
                            s.keep(&g);
                        }
                    }
                }
                // The guard looks once a tick (it polls every second); the controller's steps
                // fall before or after its look, in every order.
                if s.guard_running {
                    self.guard_poll(&mut s);
                }
            }
            Action::Step => self.step(&mut s)?,
            Action::FailGate => {
                s.ctl.tx.went(Went::Failed);
            }
            Action::Stale(command) => {
                let mut g = s.record()?;
                let before = g.clone();
                let _refused = match command {
                    Command::Renew => g.renew(STALE_RUN, s.host_mono()),
                    Command::Take => g.take(STALE_RUN, s.host_mono(), Some(s.unit.restarts)),
                    Command::Disarm => g.disarm(STALE_RUN, "t"),
                };
                s.stale_acted |= g != before;
                s.keep(&g);
            }
            Action::Crash => {
                s.ctl.alive = false;
                s.ctl.died_at = Some(s.now);
            }
            Action::Rerun => {
                // The dead run's lock is stale and broken. The desired unit on disk with no
                // record: the last apply did not finish; confirmed as it runs when the guard
                // watches or kept a start of it, restarted otherwise. The change not on disk
                // (put back, rolled back): applied again.
                let running = s.facts().active == "active";
                let read = s.guard.as_deref().and_then(|t| Settled::parse(t).ok());
                let kind = match read {
                    Some(g) if s.unit.file == Def::New && running && (self.confirms)(&g) => {
                        Kind::Confirm
                    }
                    _ => Kind::Restart,
                };
                // P6 judges the plan: a restart of the dead run's healthy start, or of a server
                // that took its live change.
                let new_start = (s.unit.running.map(|(d, _)| d) == Some(Def::New)
                    || s.unit.values == Def::New)
                    && s.unit.new_invocation
                    && s.healthy();
                s.needless_restart |= kind == Kind::Restart && new_start;
                s.ctl = Controller::new(kind, RERUN);
                // P2 counts the restores of one run and its guard: the dead run's are done.
                s.guard_restores = 0;
                s.controller_restores = 0;
            }
            Action::Cut => {
                s.link_up = false;
                s.cut_once = true;
            }
            Action::Heal => s.link_up = true,
            Action::Reboot => {
                s.ctl.alive = false;
                s.ctl.died_at = Some(s.now);
                Self::boot(&mut s);
            }
            Action::HostReboot => Self::boot(&mut s),
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // P1: recorded converged only if the host runs the new unit, started by this apply.
            Property::always("P1 converged means the new unit runs", |_, s: &State| {
                s.ctl.ended != Some(End::Converged) || s.ctl.converged_on == Some((Def::New, true))
            }),
            // P2: never two restores of one unit for one run: the controller and the guard, or
            // one twice.
            Property::always("P2 one restore at most", |_, s: &State| {
                s.guard_restores + s.controller_restores <= 1
            }),
            // P3: a server healthy before its deadline is never restored by a guard.
            Property::always(
                "P3 a healthy server is never restored blind",
                |_, s: &State| !s.healthy_restored,
            ),
            // P4: a stale run never changes this run's guard.
            Property::always(
                "P4 a stale run never acts on a newer run's guard",
                |_, s: &State| !s.stale_acted,
            ),
            // P6: an apply run again after a dead one never restarts a server that already
            // runs the desired unit's start and is healthy.
            Property::always(
                "P6 a rerun never restarts a healthy new server",
                |_, s: &State| !s.needless_restart,
            ),
            // P5: at the horizon, the host serves the new unit (recorded, or kept for the next
            // apply to confirm) or its previous unit, the guard has settled, and the controller
            // did not report a host needing attention that its guard had brought back.
            Property::always("P5 every ending serves a known unit", |_, s: &State| {
                if s.now < HORIZON {
                    return true;
                }
                if !s.ctl.tx.armed() && s.ctl.tx.step() != Step::Done(End::Converged) {
                    // Stopped before its guard was armed, so before its write (property W): what
                    // runs is what ran.
                    return true;
                }
                let g = s.record();
                let settled = g.as_ref().is_none_or(|g| !g.state.active());
                let serving = s.healthy();
                // Kept: `status` says unconfirmed while the file is the one kept, and what runs
                // is the kept change (a live change the server never took goes back around it).
                let kept = g
                    .as_ref()
                    .is_some_and(|g| g.state == GuardState::Unconfirmed)
                    && s.unit.file == Def::New;
                let told = match s.effective() {
                    Some(Def::New) if s.ctl.ended == Some(End::Converged) => true,
                    Some(Def::New) if kept => true,
                    Some(Def::Previous) => s.unit.file == Def::Previous,
                    _ => false,
                };
                settled && serving && told && !s.ctl.misreported
            }),
            // W: the new unit file is never on disk with no guard armed and no live
            // controller: a reboot would start it unverified and unwatched. It held only once
            // the transaction armed before it wrote; the test below shows the checker finds
            // the window with the old order.
            Property::always(WRITE_WINDOW, |_, s: &State| {
                !(s.unit.file == Def::New
                    && s.guard.is_none()
                    && !s.ctl.alive
                    && s.ctl.tx.kind() == Kind::Restart)
            }),
        ]
    }
}

const WRITE_WINDOW: &str = "W the new unit file is never left unguarded";
const PROVEN: [&str; 7] = [
    WRITE_WINDOW,
    "P1 converged means the new unit runs",
    "P2 one restore at most",
    "P3 a healthy server is never restored blind",
    "P4 a stale run never acts on a newer run's guard",
    "P5 every ending serves a known unit",
    "P6 a rerun never restarts a healthy new server",
];

/// Checks every state `protocol` reaches: every property holds (a broken one fails with its
/// trace). Returns the states explored.
fn check(protocol: Protocol) -> usize {
    let started = std::time::Instant::now();
    let checker = protocol.checker().spawn_bfs().join();
    eprintln!(
        "{} unique states in {:.1?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    for property in PROVEN {
        if let Some(trace) = checker.discovery(property) {
            // Each step with the state it left, to read the counterexample by.
            for (state, action) in trace.into_vec() {
                eprintln!("{action:?} -> {}", brief(&state));
            }
            panic!("{property}: the checker found a counterexample (above)");
        }
    }
    checker.unique_state_count()
}

/// How the checker's counterexample to `property` ends, for a `protocol` with a rule broken on
/// purpose: its trace shows where.
fn counterexample(protocol: Protocol, property: &'static str) -> State {
    let checker = protocol.checker().spawn_bfs().join();
    let trace = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("the checker finds no counterexample to {property}"));
    trace.last_state().clone()
}

/// [`counterexample`] to `property` of core's protocol for a change of `kind` to a fast server,
/// its guard deciding by `judge`, a judge broken on purpose.
fn judged_wrong(kind: Kind, judge: GuardJudge, property: &'static str) -> State {
    counterexample(
        Protocol {
            judge,
            ..Protocol::of_core(kind, &[Behaviour::Fast])
        },
        property,
    )
}

/// One line of a state, for a counterexample's trace.
fn brief(s: &State) -> String {
    format!(
        "t={} {}:{:?} alive={} file={:?} running={:?} invocation={} values={:?} healthy={} guard={:?} boots={} watch_started={} link={}",
        s.now,
        s.ctl.run,
        s.ctl.tx.step(),
        s.ctl.alive,
        s.unit.file,
        s.unit.running,
        s.unit.invocation,
        s.unit.values,
        s.healthy(),
        s.record().map(|g| (g.state, g.run, g.watch.new_started)),
        s.boots,
        s.watch_started,
        s.link_up
    )
}

#[test]
fn a_restart_holds_every_property_whatever_crashes_cuts_reboots_or_stale_runs() {
    let states = check(Protocol::of_core(
        Kind::Restart,
        &[
            Behaviour::Fast,
            Behaviour::Slow,
            Behaviour::CrashLoop,
            Behaviour::Hang,
        ],
    ));
    assert!(states > 1000, "the model explored only {states} states");
}

#[test]
fn a_live_change_holds_every_property_whatever_crashes_cuts_reboots_or_stale_runs() {
    let states = check(Protocol::of_core(
        Kind::Live,
        &[Behaviour::Fast, Behaviour::Hang],
    ));
    assert!(states > 1000, "the model explored only {states} states");
}

/// The guard before the crash matrix's live rows: a live change healthy at its deadline was
/// kept, told to the server or not.
fn judge_keeping_untold_live(g: &Record, f: &Facts, at: f64, healthy: bool) -> (Verdict, String) {
    match core_judge(g, f, at, healthy) {
        (Verdict::PutBack, why) if why.starts_with("the live change was never told") => (
            Verdict::Keep,
            "active and /health 200 at the deadline".into(),
        ),
        decided => decided,
    }
}

#[test]
fn keeping_a_live_change_never_told_leaves_the_new_file_over_the_old_values() {
    // The checker finds the previous values kept under the new file.
    let last = judged_wrong(
        Kind::Live,
        judge_keeping_untold_live,
        "P5 every ending serves a known unit",
    );
    assert_eq!(last.effective(), Some(Def::Previous));
    assert_eq!(last.unit.file, Def::New);
}

/// The rule before the live change was modelled: any unit the guard let stand was confirmed as it
/// runs, a live change too, whose taking nobody saw.
fn confirms_any_kept(g: &Settled) -> bool {
    let started = match g.state {
        GuardState::Unconfirmed => true,
        GuardState::Armed => g.new_started,
        _ => false,
    };
    started && g.new_sha256 == "new"
}

#[test]
fn confirming_a_kept_live_change_records_values_the_server_never_took() {
    // With the guard that let untold changes stand: the confirm of any kept unit recorded them.
    // The checker finds a live change confirmed that the server never took.
    let last = counterexample(
        Protocol {
            judge: judge_keeping_untold_live,
            confirms: confirms_any_kept,
            ..Protocol::of_core(Kind::Live, &[Behaviour::Fast])
        },
        "P1 converged means the new unit runs",
    );
    assert_eq!(last.ctl.tx.kind(), Kind::Confirm);
    assert_eq!(last.effective(), Some(Def::Previous));
}

#[test]
fn a_confirm_holds_every_property_whatever_crashes_cuts_reboots_or_stale_runs() {
    let states = check(Protocol::of_core(
        Kind::Confirm,
        &[Behaviour::Fast, Behaviour::CrashLoop, Behaviour::Hang],
    ));
    assert!(states > 100, "the model explored only {states} states");
}

#[test]
fn a_write_before_the_arming_leaves_the_new_file_unguarded_and_the_checker_says_where() {
    // The order before this model: the controller that dies between its write and its arming
    // leaves the new file on disk with the old server running and nothing watching; a reboot
    // then starts it unverified.
    // The checker finds the window between the write and the arming.
    let last = counterexample(
        Protocol {
            order: Order::WriteThenArm,
            ..Protocol::of_core(Kind::Restart, &[Behaviour::Fast])
        },
        WRITE_WINDOW,
    );
    assert_eq!(last.unit.file, Def::New);
    assert!(last.guard.is_none() && !last.ctl.alive);
}

/// The guard as it was before the model: a new unit that never started was judged at the deadline
/// as the server that runs, and kept when healthy, so the next apply confirmed a change never made.
fn judge_keeping_what_never_started(
    g: &Record,
    f: &Facts,
    at: f64,
    healthy: bool,
) -> (Verdict, String) {
    match core_judge(g, f, at, healthy) {
        (Verdict::PutBack, _) if at >= g.watch.judge_at && f.active == "active" && healthy => (
            Verdict::Keep,
            "active and /health 200 at the deadline".into(),
        ),
        (Verdict::PutBack, _) => (Verdict::Wait, "before the deadline".into()),
        decided => decided,
    }
}

#[test]
fn a_guard_broken_on_purpose_is_caught_with_its_trace() {
    // The checker finds the old server kept as the new unit.
    // The trace ends with the guard's keep of a unit that never started: the previous server
    // runs under the new file, recorded by the guard as the new unit let stand unconfirmed.
    let last = judged_wrong(
        Kind::Restart,
        judge_keeping_what_never_started,
        "P5 every ending serves a known unit",
    );
    assert_eq!(last.unit.running.map(|(d, _)| d), Some(Def::Previous));
    assert_eq!(last.unit.file, Def::New);
    assert_eq!(
        last.record().map(|g| g.state),
        Some(GuardState::Unconfirmed)
    );
}
