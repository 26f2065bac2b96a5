//! The apply protocol for a server group of two ranks (`nodes:`), as a model checked by
//! stateright over every order of its actors' steps: the controller (core's `Transaction`, each
//! step carried out rank by rank, dying between any two commands), each rank's guard (core's
//! `guard::judge` and the record's transitions, one `guard.json` per host), systemd and the
//! group's processes, the link to each host (cut, healed), the clock (the lease renewed while
//! the controller lives, deadlines) and a reboot of one host or of the whole rack.
//!
//! What a group adds to a single server (`tests/protocol.rs`, whose stale runs, reruns, live
//! changes and confirms are per rank the same): the ranks are one server. A rank's process dies
//! when its peer's does (NCCL's communicator is gone; systemd restarts it), a rank serves only
//! once both run the same unit and met at the rendezvous, the controller stops every rank before
//! it starts rank 0 and then rank 1, and each rank's guard decides alone, on its own host.
//!
//! Properties, as the single server's, per rank, and one of the group's own:
//! - P1: recorded converged only if every rank runs the new unit, started by this apply;
//! - P2: a rank is restored once at most (by the controller or by its guard);
//! - P3: a rank healthy by its deadline is never restored by its guard;
//! - P5: at the end every rank serves, its guard settled, and says truly what it runs;
//! - G: at the end both ranks run the same unit: a group is never left half old, half new;
//! - W: a new unit file is never on disk with no guard armed and no live controller.

use reconcile_core::guard::{judge, Change, Facts, GuardState, Record, Settled, Verdict};
use reconcile_core::transaction::{End, Kind, Step, Transaction, Went};
use stateright::{Checker, Model, Property};

mod model;
use model::{on_clock, Def, DEADLINE, MARGIN, PREVIOUS_LOAD};

const RANKS: usize = 2;
/// Crashes, cuts and reboots happen before this tick; after it, the actors settle.
const FAULTS_UNTIL: u32 = 6;
/// Every actor has settled by then (P5 and G are judged there): the lease, a guard's deadline,
/// a restore and a peer's restore after it, and the previous group's load.
const HORIZON: u32 = FAULTS_UNTIL + MARGIN + 3 * (DEADLINE + MARGIN) + PREVIOUS_LOAD + 2;
const RUN: &str = "run-1";

/// How the new unit's group behaves once both ranks started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Behaviour {
    /// Serves a tick after its ranks met.
    Fast,
    /// Serves at verification's deadline, no sooner.
    Slow,
    /// Rank 1's process dies a tick after each start (and takes rank 0's with it).
    RankOneCrashLoops,
    /// Never answers `/health` 200.
    Hang,
}

/// One rank: its host's unit, its processes, its guard and its host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Rank {
    file: Def,
    loaded: Def,
    /// What runs, since which tick and event in it; `None`: stopped.
    running: Option<(Def, u32, u32)>,
    restarts: u32,
    /// Met its peer at the rendezvous: one process group from now on.
    joined: bool,
    /// Its peer's process ended while they were joined: it ends at the next tick, and systemd
    /// starts it again (`Restart=on-failure`).
    broken: bool,
    /// What runs is the new unit's start since the arming (the apply's, a boot's, systemd's).
    new_invocation: bool,
    invocation: u32,
    guard: Option<String>,
    guard_running: bool,
    watch_started: bool,
    link_up: bool,
    boot_at: u32,
    boots: u32,
    guard_restores: u32,
    controller_restores: u32,
    /// When the file was last written (tick, event in it): its mtime.
    written: (u32, u32),
    /// Served the new unit by its deadline in this invocation.
    healthy_in_time: bool,
    /// Its guard restored it after it served by its deadline.
    healthy_restored: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Controller {
    tx: Transaction,
    alive: bool,
    /// The commands of the current step done so far, rank by rank.
    part: usize,
    restarted_at: Option<u32>,
    verifying: Option<[u32; RANKS]>,
    /// Confirm: each rank's guard still armed when disarmed.
    confirmed: [bool; RANKS],
    /// Rollback: the ranks whose guard this run took over (it restores them), and since when
    /// it verifies them.
    taken: [bool; RANKS],
    restored_at: Option<u32>,
    /// It reported a rollback that failed (the host needs attention).
    attention: bool,
    ended: Option<End>,
    converged_on: Option<[(Def, bool); RANKS]>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u32,
    micro: u32,
    behaviour: Behaviour,
    ranks: [Rank; RANKS],
    ctl: Controller,
    cut_once: bool,
    rebooted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Step,
    FailGate,
    Crash,
    Cut(usize),
    Heal(usize),
    /// One host reboots; the controller lives on.
    HostReboot(usize),
    /// The rack loses power: both hosts reboot and the controller dies.
    Reboot,
}

fn peer(r: usize) -> usize {
    1 - r
}

/// A rank's guard as apply arms it: broken at its first restart (src/apply/guard.rs).
fn arming() -> Record {
    model::arming(RUN, Change::Restart, 1)
}

impl State {
    fn host_mono(&self, r: usize) -> f64 {
        on_clock((self.now, self.micro), self.ranks[r].boot_at)
    }

    /// An event on host `r`'s clock, after every earlier one.
    fn event(&mut self, r: usize) -> f64 {
        let at = self.host_mono(r);
        self.micro += 1;
        at
    }

    fn entered(&self, r: usize) -> f64 {
        let rank = &self.ranks[r];
        match rank.running {
            Some((_, at, micro)) => on_clock((at, micro), rank.boot_at),
            None => 0.0,
        }
    }

    /// Whether rank `r` answers `/health` 200: both ranks run one unit, met, and loaded it.
    fn healthy(&self, r: usize) -> bool {
        let (me, other) = (&self.ranks[r], &self.ranks[peer(r)]);
        let (Some((def, since, _)), Some((other_def, other_since, _))) =
            (me.running, other.running)
        else {
            return false;
        };
        if def != other_def || !me.joined || !other.joined {
            return false;
        }
        let met = since.max(other_since);
        let load = match (def, self.behaviour) {
            (Def::Previous, _) => PREVIOUS_LOAD,
            (Def::New, Behaviour::Fast) => 1,
            (Def::New, Behaviour::Slow) => DEADLINE,
            (Def::New, Behaviour::RankOneCrashLoops | Behaviour::Hang) => return false,
        };
        self.now >= met + load
    }

    fn crash_looping(&self, r: usize) -> bool {
        r == 1
            && self.behaviour == Behaviour::RankOneCrashLoops
            && matches!(self.ranks[r].running, Some((Def::New, since, _)) if since < self.now)
    }

    fn facts(&self, r: usize) -> Facts {
        let rank = &self.ranks[r];
        let (active, sub) = match rank.running {
            None => ("inactive", "dead"),
            Some(_) => ("active", "running"),
        };
        Facts {
            sha256: Some(
                match rank.file {
                    Def::Previous => "old",
                    Def::New => "new",
                }
                .into(),
            ),
            active: active.into(),
            sub: sub.into(),
            restarts: rank.restarts,
            entered: self.entered(r),
            stale: rank.file != rank.loaded,
            written: Some(self.written(r)),
        }
    }

    fn record(&self, r: usize) -> Option<Record> {
        self.ranks[r]
            .guard
            .as_deref()
            .map(|text| serde_json::from_str(text).expect("guard.json reads"))
    }

    fn keep(&mut self, r: usize, record: &Record) {
        self.ranks[r].guard = Some(serde_json::to_string(record).expect("guard.json writes"));
    }

    fn boot_id(&self, r: usize) -> String {
        format!("boot-{}", self.ranks[r].boots)
    }

    /// Rank `r`'s process ends or is replaced: a peer that met it loses its process group.
    fn leave(&mut self, r: usize) {
        self.ranks[r].joined = false;
        let p = peer(r);
        if self.ranks[p].joined && self.ranks[p].running.is_some() {
            self.ranks[p].broken = true;
        }
        self.ranks[p].joined = false;
    }

    fn stop(&mut self, r: usize) {
        if self.ranks[r].running.is_some() {
            self.leave(r);
        }
        self.ranks[r].running = None;
        self.ranks[r].broken = false;
    }

    /// `systemctl restart` (or start) of what systemd loaded.
    fn start(&mut self, r: usize, new_invocation: bool) {
        self.leave(r);
        let (now, micro) = (self.now, self.micro);
        self.micro += 1;
        let rank = &mut self.ranks[r];
        rank.running = Some((rank.loaded, now, micro));
        rank.restarts = 0;
        rank.broken = false;
        rank.new_invocation = new_invocation;
        rank.invocation += 1;
        rank.healthy_in_time = false;
    }

    /// systemd starts a process that ended on its own again (`NRestarts` counts it).
    fn auto_restart(&mut self, r: usize) {
        let restarts = self.ranks[r].restarts + 1;
        let fresh = self.ranks[r].new_invocation;
        self.start(r, fresh);
        self.ranks[r].restarts = restarts;
    }

    fn daemon_reload(&mut self, r: usize) {
        self.ranks[r].loaded = self.ranks[r].file;
    }

    /// Rank `r`'s unit file replaced (an atomic rename: its mtime is now).
    fn write_file(&mut self, r: usize, def: Def) {
        self.ranks[r].file = def;
        self.ranks[r].written = (self.now, self.micro);
        self.micro += 1;
    }

    /// The file's mtime on its host's monotonic clock (0 for one written before the boot).
    fn written(&self, r: usize) -> f64 {
        on_clock(self.ranks[r].written, self.ranks[r].boot_at)
    }

    fn effective(&self, r: usize) -> Option<Def> {
        self.ranks[r].running.map(|(d, _, _)| d)
    }

    /// Nothing will change any more but the clock.
    fn quiescent(&self) -> bool {
        let controller_done = !self.ctl.alive || self.ctl.ended.is_some();
        let steady = (0..RANKS).all(|r| {
            let rank = &self.ranks[r];
            !rank.broken
                && !self.crash_looping(r)
                && rank.link_up
                && !rank.guard_running
                && match rank.running {
                    None => true,
                    // Met and loaded, or never to be healthy as things stand (another unit on
                    // its peer, a peer stopped, a hung load).
                    Some(_) => {
                        self.healthy(r)
                            || self.effective(peer(r)) != self.effective(r)
                            || self.behaviour == Behaviour::Hang
                                && self.effective(r) == Some(Def::New)
                    }
                }
        });
        let unmet = (0..RANKS).any(|r| {
            self.effective(r).is_some()
                && self.effective(r) == self.effective(peer(r))
                && !self.ranks[r].joined
        });
        controller_done && steady && !unmet
    }
}

/// The model of a group's apply: which behaviours of the new unit it tries.
struct Protocol {
    behaviours: Vec<Behaviour>,
}

impl Protocol {
    fn command(s: &mut State, r: usize, g: &mut Record) -> Option<()> {
        let now = s.event(r);
        let on_disk = s.facts(r).sha256;
        let boot = s.boot_id(r);
        g.command_in_boot(RUN, now, &boot, on_disk.as_deref()).ok()
    }

    /// The controller's renewal on rank `r`: whether its guard still holds for this run.
    fn guard_holds(s: &mut State, r: usize) -> Option<bool> {
        let mut g = s.record(r)?;
        Self::command(s, r, &mut g)?;
        g.saw(&s.facts(r));
        let found = g.renew(RUN, s.host_mono(r)).ok()?;
        s.keep(r, &g);
        Some(found == GuardState::Armed)
    }

    /// Rank `r`'s guard polls, as `reconcile-guard watch` does.
    fn guard_poll(s: &mut State, r: usize) {
        let Some(mut g) = s.record(r) else { return };
        if !s.ranks[r].watch_started {
            let on_disk = s.facts(r).sha256;
            let (at, boot) = (s.event(r), s.boot_id(r));
            g.start_watch(at, &boot, on_disk.as_deref());
            g.saw(&s.facts(r));
            s.ranks[r].watch_started = true;
            s.ranks[r].guard_running = g.watching();
            s.keep(r, &g);
            return;
        }
        if !g.watching() {
            s.ranks[r].guard_running = false;
            return;
        }
        g.saw(&s.facts(r));
        let healthy = s.healthy(r);
        let (verdict, why) = judge(&g, &s.facts(r), s.host_mono(r), || {
            Some(if healthy { 200 } else { 503 })
        });
        match verdict {
            Verdict::Wait => {}
            Verdict::PutBack => {
                s.write_file(r, Def::Previous);
                s.daemon_reload(r);
                g.put_back(&why, "put back", "t");
            }
            Verdict::Restore => {
                // Blind: the group serves, or this rank served by its deadline and nothing has
                // sent its peer back since (a rollback of the group, taken over or decided by
                // the peer's guard, takes every rank back, a healthy one too).
                let watched = s.entered(r) > g.watch.armed_mono.unwrap_or(f64::INFINITY);
                let peer_stays = s.effective(peer(r)) == Some(Def::New)
                    && s.record(peer(r))
                        .is_some_and(|p| p.state == GuardState::Armed);
                if g.state == GuardState::Armed
                    && watched
                    && s.effective(r) == Some(Def::New)
                    && (s.healthy(r) || s.ranks[r].healthy_in_time && peer_stays)
                {
                    s.ranks[r].healthy_restored = true;
                }
                let at = s.event(r);
                g.begin_restore(&why, at);
                s.write_file(r, Def::Previous);
                s.daemon_reload(r);
                s.start(r, false);
                s.ranks[r].guard_restores += 1;
                let after = s.facts(r);
                g.restore_returned("restored", Some(&after));
            }
            settles => g.settle_on(settles, &why, "t"),
        }
        if !g.watching() {
            s.ranks[r].guard_running = false;
        }
        s.keep(r, &g);
    }

    /// The controller's next command; `None` while it waits (a loading group, a host out of
    /// reach).
    fn step(s: &mut State) -> Option<()> {
        let part = s.ctl.part;
        // The rank this command goes to, for steps carried out rank by rank.
        let r = part.min(RANKS - 1);
        let last = part + 1 == RANKS;
        let went = match s.ctl.tx.step() {
            Step::Prepare | Step::Preload | Step::Drain => Went::Passed,
            Step::Arm => {
                if !s.ranks[r].link_up {
                    return None;
                }
                let mut record = arming();
                record.replaces = s.ranks[r].file != Def::New;
                let on_disk = s.facts(r).sha256;
                let (at, boot) = (s.event(r), s.boot_id(r));
                record.start_watch(at, &boot, on_disk.as_deref());
                s.keep(r, &record);
                s.ranks[r].guard_running = true;
                s.ranks[r].watch_started = true;
                if !last {
                    s.ctl.part += 1;
                    return Some(());
                }
                Went::Passed
            }
            Step::Write => {
                if !s.ranks[r].link_up {
                    return None;
                }
                if !Self::guard_holds(s, r)? {
                    Went::Stopped
                } else {
                    // A file already the new one is not written again (install::write_unit).
                    if s.ranks[r].file != Def::New {
                        s.write_file(r, Def::New);
                    }
                    s.daemon_reload(r);
                    if !last {
                        s.ctl.part += 1;
                        return Some(());
                    }
                    Went::Passed
                }
            }
            // Every rank stopped, under guards that still hold, then started in order. A command
            // to a host out of reach fails (its ssh times out), and the step with it.
            Step::Restart if s.ranks.iter().any(|k| !k.link_up) => Went::Failed,
            Step::Restart => match part {
                0 => {
                    for k in 0..RANKS {
                        if !Self::guard_holds(s, k)? {
                            return Self::went(s, Went::Stopped);
                        }
                    }
                    s.stop(0);
                    s.ctl.part += 1;
                    return Some(());
                }
                p if p < RANKS => {
                    s.stop(p);
                    s.ctl.part += 1;
                    return Some(());
                }
                p => {
                    let k = p - RANKS;
                    s.start(k, true);
                    if k + 1 < RANKS {
                        s.ctl.part += 1;
                        return Some(());
                    }
                    s.ctl.restarted_at = Some(s.now);
                    s.ctl.verifying = Some([s.ranks[0].invocation, s.ranks[1].invocation]);
                    Went::Passed
                }
            },
            Step::Verify => {
                let since = s.ctl.restarted_at?;
                let started_again = (0..RANKS)
                    .any(|k| s.ctl.verifying.map(|v| v[k]) != Some(s.ranks[k].invocation));
                let all = (0..RANKS).all(|k| {
                    s.ranks[k].link_up && s.healthy(k) && s.effective(k) == Some(Def::New)
                });
                if started_again {
                    Went::Failed
                } else if all {
                    Went::Passed
                } else if s
                    .ranks
                    .iter()
                    .any(|k| k.running.is_none() || k.restarts > 0)
                    || s.now >= since + DEADLINE
                {
                    Went::Failed
                } else {
                    return None;
                }
            }
            Step::Gates => Went::Passed,
            // The guards disarmed one after another, within a second, taken here as one step: a
            // controller that dies between two disarms while a host reboots is a window the
            // model leaves (one rank confirmed, its peer's guard left to judge a group that a
            // reboot restarted).
            Step::Confirm => {
                let started_again = (0..RANKS)
                    .any(|k| s.ctl.verifying.map(|v| v[k]) != Some(s.ranks[k].invocation));
                if started_again {
                    Went::Failed
                } else {
                    if !s.ranks.iter().all(|k| k.link_up) {
                        return None;
                    }
                    for k in 0..RANKS {
                        let mut g = s.record(k)?;
                        let found = g.disarm(RUN, "t").ok()?;
                        s.keep(k, &g);
                        s.ctl.confirmed[k] = found == GuardState::Armed
                            || found == GuardState::RollingBack && !g.watch.restored;
                    }
                    if s.ctl.confirmed.iter().all(|&c| c) {
                        s.ctl.converged_on = Some([0, 1].map(|k| {
                            (
                                s.effective(k).unwrap_or(Def::Previous),
                                s.ranks[k].new_invocation,
                            )
                        }));
                        s.ctl.ended = Some(End::Converged);
                    } else {
                        s.ctl.ended = Some(End::RolledBack);
                    }
                    Went::Passed
                }
            }
            Step::PutBack if !s.ctl.tx.armed() && s.ranks.iter().all(|k| k.guard.is_none()) => {
                Went::Passed
            }
            Step::PutBack => {
                if !s.ranks[r].link_up {
                    return None;
                }
                if s.ranks[r].guard.is_some() {
                    Self::guard_holds(s, r)?;
                    s.write_file(r, Def::Previous);
                    s.daemon_reload(r);
                    // A rank that started the new file since (its peer's reboot restarted it)
                    // is left to its guard, armed: it restores what the file no longer says.
                    let mut g = s.record(r)?;
                    if !g.watch.new_started {
                        g.disarm(RUN, "t").ok()?;
                        s.keep(r, &g);
                    }
                }
                if !last {
                    s.ctl.part += 1;
                    return Some(());
                }
                Went::Passed
            }
            Step::RollBack => return Self::roll_back(s),
            Step::Live | Step::LiveBack | Step::RecordReload => Went::Failed,
            Step::Done(_) => return None,
        };
        Self::went(s, went)
    }

    fn went(s: &mut State, went: Went) -> Option<()> {
        s.ctl.part = 0;
        if let Step::Done(end) = s.ctl.tx.went(went) {
            s.ctl.ended.get_or_insert(end);
        }
        Some(())
    }

    /// Every rank's guard taken over; the ranks taken stopped, their previous files back, started
    /// in order, verified together, their guards disarmed. A rank whose guard acted first is left
    /// to it (src/apply/pipeline/roll_back.rs).
    fn roll_back(s: &mut State) -> Option<()> {
        let part = s.ctl.part;
        if part < RANKS {
            let r = part;
            if !s.ranks[r].link_up {
                return None;
            }
            let mut g = s.record(r)?;
            Self::command(s, r, &mut g)?;
            let at = s.event(r);
            let found = g.take(RUN, at, Some(s.ranks[r].restarts)).ok()?;
            s.keep(r, &g);
            s.ctl.taken[r] = found == GuardState::Armed;
            s.ctl.part += 1;
            return Some(());
        }
        if s.ctl.restored_at.is_none() {
            // Before each restore command: a rank whose guard restored it meanwhile (its lease
            // ran out while the host was out of reach) is left to that guard.
            for k in 0..RANKS {
                if s.ctl.taken[k] && s.ranks[k].link_up {
                    let mut g = s.record(k)?;
                    Self::command(s, k, &mut g)?;
                    g.renew(RUN, s.host_mono(k)).ok()?;
                    s.keep(k, &g);
                    let read = Settled::parse(s.ranks[k].guard.as_deref()?).ok()?;
                    s.ctl.taken[k] = !read.acted_itself();
                }
            }
        }
        let taken: Vec<usize> = (0..RANKS).filter(|&k| s.ctl.taken[k]).collect();
        if taken.is_empty() {
            return Self::went(s, Went::Passed);
        }
        if taken.iter().any(|&k| !s.ranks[k].link_up) {
            return None;
        }
        if part == RANKS {
            // Stopped first: a rank on its old unit must not dial into a new rank 0.
            for &k in &taken {
                s.stop(k);
                s.write_file(k, Def::Previous);
                s.daemon_reload(k);
            }
            s.ctl.part += 1;
            return Some(());
        }
        let started = part - RANKS - 1;
        if started < taken.len() {
            // The restore proper: the previous unit started (a guard finishes a rollback whose
            // controller died before this).
            s.start(taken[started], false);
            s.ranks[taken[started]].controller_restores += 1;
            s.ctl.part += 1;
            if started + 1 == taken.len() {
                s.ctl.restored_at = Some(s.now);
            }
            return Some(());
        }
        // Every rank this run restores started (or left to its guard since).
        let since = *s.ctl.restored_at.get_or_insert(s.now);
        if !taken.iter().all(|&k| s.healthy(k)) {
            if s.now < since + DEADLINE {
                return None;
            }
            // The restored ranks failed their verification: reported, their guards left armed
            // to judge them.
            s.ctl.attention = true;
            return Self::went(s, Went::Passed);
        }
        for &k in &taken {
            let mut g = s.record(k)?;
            g.disarm(RUN, "t").ok()?;
            s.keep(k, &g);
        }
        Self::went(s, Went::Passed)
    }

    fn can_step(s: &State) -> bool {
        Self::step(&mut s.clone()).is_some()
    }

    fn boot(s: &mut State, r: usize) {
        s.ranks[r].boots += 1;
        s.ranks[r].boot_at = s.now;
        // The host's processes end with it.
        s.stop(r);
        s.daemon_reload(r);
        let fresh = s.ranks[r].loaded == Def::New;
        s.start(r, fresh);
        s.ranks[r].guard_running = s.ranks[r].guard.is_some();
        s.ranks[r].watch_started = false;
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let rank = Rank {
            file: Def::Previous,
            loaded: Def::Previous,
            running: Some((Def::Previous, 0, 0)),
            restarts: 0,
            joined: true,
            broken: false,
            new_invocation: false,
            invocation: 0,
            guard: None,
            guard_running: false,
            watch_started: true,
            link_up: true,
            boot_at: 0,
            boots: 1,
            guard_restores: 0,
            controller_restores: 0,
            written: (0, 0),
            healthy_in_time: false,
            healthy_restored: false,
        };
        self.behaviours
            .iter()
            .map(|&behaviour| State {
                now: 1,
                micro: 0,
                behaviour,
                ranks: [rank.clone(), rank.clone()],
                ctl: Controller {
                    tx: Transaction::new(Kind::Restart),
                    alive: true,
                    part: 0,
                    restarted_at: None,
                    verifying: None,
                    confirmed: [false; RANKS],
                    taken: [false; RANKS],
                    restored_at: None,
                    attention: false,
                    ended: None,
                    converged_on: None,
                },
                cut_once: false,
                rebooted: false,
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now >= HORIZON {
            return;
        }
        let working = s.ctl.alive && s.ctl.ended.is_none();
        if working && Protocol::can_step(s) {
            actions.push(Action::Step);
            if s.ctl.tx.step() == Step::Gates {
                actions.push(Action::FailGate);
            }
        } else {
            actions.push(Action::Tick);
        }
        let armed = s.ranks.iter().any(|k| k.guard.is_some());
        if working && s.now < FAULTS_UNTIL {
            actions.push(Action::Crash);
            if !s.cut_once {
                actions.extend((0..RANKS).map(Action::Cut));
            }
            if armed && !s.rebooted {
                actions.push(Action::Reboot);
                actions.extend((0..RANKS).map(Action::HostReboot));
            }
        }
        for r in 0..RANKS {
            if !s.ranks[r].link_up && s.now < FAULTS_UNTIL {
                actions.push(Action::Heal(r));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                if s.quiescent() {
                    s.now = HORIZON;
                    return Some(s);
                }
                s.now += 1;
                s.micro = 0;
                // A cut is shorter than apply's grace for a host to come back (a minute and the
                // crash window): the links are back once the faults are over.
                if s.now >= FAULTS_UNTIL {
                    for r in 0..RANKS {
                        s.ranks[r].link_up = true;
                    }
                }
                // A rank whose peer's process ended ends too; systemd starts it again.
                for r in 0..RANKS {
                    if s.ranks[r].broken && s.ranks[r].running.is_some() {
                        s.auto_restart(r);
                    }
                }
                if s.crash_looping(1) {
                    s.auto_restart(1);
                }
                // Ranks running one unit meet at the rendezvous.
                if s.effective(0).is_some() && s.effective(0) == s.effective(1) {
                    for r in 0..RANKS {
                        s.ranks[r].joined = true;
                    }
                }
                for r in 0..RANKS {
                    if let (true, Some((Def::New, since, _))) = (s.healthy(r), s.ranks[r].running) {
                        if s.ranks[r].new_invocation && s.now <= since + DEADLINE {
                            s.ranks[r].healthy_in_time = true;
                        }
                    }
                }
                // A live controller renews each reachable rank's lease.
                if s.ctl.alive && s.ctl.ended.is_none() {
                    for r in 0..RANKS {
                        if !s.ranks[r].link_up {
                            continue;
                        }
                        if let Some(mut g) = s.record(r) {
                            if Protocol::command(&mut s, r, &mut g).is_some()
                                && g.renew(RUN, s.host_mono(r)).is_ok()
                            {
                                s.keep(r, &g);
                            }
                        }
                    }
                }
                for r in 0..RANKS {
                    if s.ranks[r].guard_running {
                        Protocol::guard_poll(&mut s, r);
                    }
                }
            }
            Action::Step => Protocol::step(&mut s)?,
            Action::FailGate => {
                Protocol::went(&mut s, Went::Failed)?;
            }
            Action::Crash => s.ctl.alive = false,
            Action::Cut(r) => {
                s.ranks[r].link_up = false;
                s.cut_once = true;
            }
            Action::Heal(r) => s.ranks[r].link_up = true,
            Action::HostReboot(r) => {
                s.rebooted = true;
                Protocol::boot(&mut s, r);
            }
            Action::Reboot => {
                s.rebooted = true;
                s.ctl.alive = false;
                for r in 0..RANKS {
                    Protocol::boot(&mut s, r);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(P1, |_, s: &State| {
                s.ctl.ended != Some(End::Converged)
                    || s.ctl.converged_on == Some([(Def::New, true); RANKS])
            }),
            Property::always(P2, |_, s: &State| {
                s.ranks
                    .iter()
                    .all(|k| k.guard_restores + k.controller_restores <= 1)
            }),
            Property::always(P3, |_, s: &State| {
                s.ranks.iter().all(|k| !k.healthy_restored)
            }),
            Property::always(P5, |_, s: &State| {
                if s.now < HORIZON || s.ranks.iter().all(|k| k.guard.is_none()) {
                    return true;
                }
                (0..RANKS).all(|r| {
                    let g = s.record(r);
                    let settled = g.as_ref().is_none_or(|g| !g.state.active());
                    let kept = g
                        .as_ref()
                        .is_some_and(|g| g.state == GuardState::Unconfirmed)
                        && s.ranks[r].file == Def::New;
                    let told = match s.effective(r) {
                        Some(Def::New) => s.ctl.ended == Some(End::Converged) || kept,
                        Some(Def::Previous) => s.ranks[r].file == Def::Previous,
                        None => false,
                    };
                    settled && s.healthy(r) && told
                })
            }),
            Property::always(G, |_, s: &State| {
                s.now < HORIZON || s.effective(0) == s.effective(1)
            }),
            Property::always(W, |_, s: &State| {
                s.ctl.alive
                    || s.ranks
                        .iter()
                        .all(|k| k.file == Def::Previous || k.guard.is_some())
            }),
        ]
    }
}

const P1: &str = "P1 converged means every rank runs the new unit";
const P2: &str = "P2 a rank is restored once at most";
const P3: &str = "P3 a healthy rank is never restored blind";
const P5: &str = "P5 every rank ends serving a unit it tells";
const G: &str = "G the ranks end on one unit";
const W: &str = "W a new unit file is never left unguarded";

fn brief(s: &State) -> String {
    let ranks: Vec<String> = (0..RANKS)
        .map(|r| {
            let k = &s.ranks[r];
            format!(
                "[{r}: file={:?} running={:?} joined={} broken={} restarts={} healthy={} guard={:?} link={}]",
                k.file,
                k.running,
                k.joined,
                k.broken,
                k.restarts,
                s.healthy(r),
                s.record(r).map(|g| g.state),
                k.link_up
            )
        })
        .collect();
    format!(
        "t={} {:?} part={} alive={} {}",
        s.now,
        s.ctl.tx.step(),
        s.ctl.part,
        s.ctl.alive,
        ranks.join(" ")
    )
}

fn check(protocol: Protocol) -> usize {
    let started = std::time::Instant::now();
    let checker = protocol.checker().spawn_bfs().join();
    eprintln!(
        "{} unique states in {:.1?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    for property in [P1, P2, P3, P5, G, W] {
        if let Some(trace) = checker.discovery(property) {
            for (state, action) in trace.into_vec() {
                eprintln!("{action:?} -> {}", brief(&state));
            }
            panic!("{property}: the checker found a counterexample (above)");
        }
    }
    checker.unique_state_count()
}

#[test]
fn a_group_of_two_ranks_holds_every_property_whatever_crashes_cuts_or_reboots() {
    let states = check(Protocol {
        behaviours: vec![
            Behaviour::Fast,
            Behaviour::Slow,
            Behaviour::RankOneCrashLoops,
            Behaviour::Hang,
        ],
    });
    assert!(states > 100_000, "the model explored only {states} states");
}
