//! Server groups (`nodes:`): one SGLang server over several hosts, each rank a unit of its own.
//! The ranks form one torch process group, so they change together: what the group as a whole
//! does, what each rank does in it, and the order they stop and start in. Pure; the binary's
//! apply carries the decisions out.

use crate::dry_run::PlanOutcome;
use crate::plan::Verdict;
use crate::targets::Target;

/// What the group does, from each rank's own verdict. The ranks restart together: a rank that
/// restarts leaves the process group, and the others cannot go on without it, so any rank's
/// restart (or install) restarts the group. `Install` when every rank is new (nothing runs yet),
/// else `Restart`; without a restart, `ReloadOnly` if any rank's unit changed that way; else
/// `NoChange`. No ranks: `NoChange`.
pub fn group_verdict(ranks: &[Verdict]) -> Verdict {
    if ranks.is_empty() {
        return Verdict::NoChange;
    }
    if ranks.iter().all(|v| *v == Verdict::Install) {
        Verdict::Install
    } else if ranks
        .iter()
        .any(|v| matches!(v, Verdict::Restart | Verdict::Install))
    {
        Verdict::Restart
    } else if ranks.contains(&Verdict::Live) {
        // Only a server of one changes live (`crate::live`): a group restarts its ranks.
        Verdict::Live
    } else if ranks.contains(&Verdict::ReloadOnly) {
        Verdict::ReloadOnly
    } else {
        Verdict::NoChange
    }
}

/// What one rank does in the group's apply, from its own verdict and the group's
/// ([`group_verdict`]). A rank whose unit is new is installed whatever the group does. When the
/// group restarts, every other rank restarts, even one whose unit did not change: its running
/// process belongs to the old process group and must rejoin the new one. When the group only
/// reloads, a changed rank reloads and an unchanged one has nothing to do.
pub fn rank_verdict(own: Verdict, group: Verdict) -> Verdict {
    match (own, group) {
        (Verdict::Install, _) => Verdict::Install,
        (_, Verdict::Restart | Verdict::Install) => Verdict::Restart,
        (Verdict::Live, _) => Verdict::Live,
        (Verdict::ReloadOnly, _) => Verdict::ReloadOnly,
        // A group verdict below the rank's own cannot come from `group_verdict`; the rank's own
        // change still happens.
        (Verdict::Restart, _) => Verdict::Restart,
        (Verdict::NoChange, _) => Verdict::NoChange,
    }
}

/// One step of stopping some of a group's ranks (their indexes), carried out on each of them at
/// once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStep {
    /// The stop begins and is not waited for (`systemctl stop --no-block`): SIGTERM to the rank's
    /// main process, which SGLang only logs, and the rank's exit, when it comes, is its stop and
    /// no failure for systemd to restart.
    Begin(Vec<usize>),
    /// Stopped, and waited for (`systemctl stop`).
    Stop(Vec<usize>),
    /// SIGTERM to every process of the ranks' units, as systemd's default KillMode sends it: the
    /// schedulers die of it, and the rank's process ends with them.
    Terminate(Vec<usize>),
}

/// How to stop ranks `which` of a group whose units carry `KillMode=mixed`, so that requests in
/// flight finish. Only rank 0 can stop a group gracefully: its SGLang drains the requests, then its
/// schedulers broadcast a ShutdownReq that ends every rank's schedulers, and each rank's process
/// exits (sglang 0.5.23 `managers/tokenizer_manager.py` `sigterm_watchdog`,
/// `managers/scheduler.py` `handle_shutdown`); a rank >= 1 answers SIGTERM with a log line only
/// (`entrypoints/engine.py`, `_launch_subprocesses`). So the other ranks' stops begin first,
/// without waiting (they keep serving rank 0's collectives while it drains), then rank 0 is
/// stopped, then the others are waited for. Without rank 0 (its host lost in a rollback) nothing
/// will broadcast the ShutdownReq: the other ranks' processes are all sent SIGTERM, as before.
pub fn stop_steps(which: &[usize]) -> Vec<StopStep> {
    let mut others: Vec<usize> = which.iter().copied().filter(|&i| i != 0).collect();
    others.sort_unstable();
    others.dedup();
    let mut steps = Vec::new();
    match (which.contains(&0), others.is_empty()) {
        (true, true) => steps.push(StopStep::Stop(vec![0])),
        (true, false) => {
            steps.push(StopStep::Begin(others.clone()));
            steps.push(StopStep::Stop(vec![0]));
            steps.push(StopStep::Stop(others));
        }
        (false, false) => {
            steps.push(StopStep::Terminate(others.clone()));
            steps.push(StopStep::Stop(others));
        }
        (false, true) => {}
    }
    steps
}

/// The order to start `n` ranks in: rank 0 first. Rank 0's process hosts the rendezvous, the
/// torch `TCPStore` server at `--dist-init-addr`, that the other ranks connect to, retrying until
/// the dist timeout (`--dist-timeout`). sglang 0.5.23 `sglang/srt/distributed/bootstrap.py`:
/// `_resolve_dist_init_method` turns `dist_init_addr` into `tcp://host:port`, and
/// `_init_parallel_groups` passes it to
/// `init_distributed_environment(distributed_init_method=tcp://dist_init_addr)`, where rank 0
/// listens and every other rank dials in. Then the ranks in order, so a log reads the same way
/// each time.
pub fn start_order(n: usize) -> Vec<usize> {
    (0..n).collect()
}

/// A dry run's outcomes (in `targets`' order) made into one plan per server group: when a rank
/// could not be planned (its host unreachable, its unit unreadable) no rank of its group is
/// planned, since apply would touch none of them; otherwise every rank gets its verdict in the
/// group ([`rank_verdict`]) and a note saying what the group does. Plain servers are left as they
/// are.
pub fn plan_groups(outcomes: &mut [PlanOutcome], targets: &[Target]) {
    let key = |t: &Target| (t.source.clone(), t.desired.unit.clone());
    let mut seen: Vec<(String, String)> = Vec::new();
    for t in targets.iter().filter(|t| t.group.is_some()) {
        if seen.contains(&key(t)) {
            continue;
        }
        seen.push(key(t));
        let members: Vec<usize> = (0..targets.len())
            .filter(|&i| targets[i].group.is_some() && key(&targets[i]) == key(t))
            .collect();
        let nodes = t
            .group
            .as_ref()
            .map(|g| g.nodes.join(", "))
            .unwrap_or_default();
        let failed = members.iter().find_map(|&i| match &outcomes[i] {
            PlanOutcome::Error { error, .. } => Some((i, error.clone())),
            PlanOutcome::Planned(_) => None,
        });
        if let Some((f, error)) = failed {
            let rank = targets[f].group.as_ref().map_or(0, |g| g.rank);
            for &i in &members {
                if i == f {
                    continue;
                }
                outcomes[i] = PlanOutcome::failed(
                    &targets[i],
                    format!(
                        "the server group over {nodes} is not planned: its rank {rank} ({}) could not be: {error}",
                        targets[f].host
                    ),
                );
            }
            continue;
        }
        let own: Vec<Verdict> = members
            .iter()
            .filter_map(|&i| match &outcomes[i] {
                PlanOutcome::Planned(p) => Some(p.verdict),
                PlanOutcome::Error { .. } => None,
            })
            .collect();
        let group = group_verdict(&own);
        for (&i, own) in members.iter().zip(own) {
            let rank = targets[i].group.as_ref().map_or(0, |g| g.rank);
            if let PlanOutcome::Planned(p) = &mut outcomes[i] {
                p.verdict = rank_verdict(own, group);
                let mut note = format!(
                    "rank {rank} of one server over {} hosts ({nodes}): the group's verdict is {}",
                    members.len(),
                    group.describe()
                );
                if p.verdict != own {
                    note.push_str(
                        "; this rank's unit is unchanged, and it restarts with its group",
                    );
                }
                p.notes.insert(0, note);
            }
        }
    }
}

/// One rank as `reconcile status` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStatus<'a> {
    pub host: &'a str,
    /// Manifest, record, unit on disk and process agree on this rank.
    pub in_sync: bool,
    /// What is wrong with it otherwise: its status classes (`pending-change,down`), or why it
    /// could not be read.
    pub why: &'a str,
    /// The manifest digest its last deployment was applied from.
    pub deployed: Option<&'a str>,
}

/// The line every rank of a group shows in `reconcile status`: whether the server as a whole is
/// in sync, on one deployment. A group serves only when every rank runs the same deployment, so
/// one rank out of sync puts the whole server out of sync, and the line names it.
pub fn group_status(ranks: &[RankStatus<'_>]) -> String {
    let hosts: Vec<&str> = ranks.iter().map(|r| r.host).collect();
    let head = format!(
        "one server over {} hosts ({})",
        ranks.len(),
        hosts.join(", ")
    );
    let off: Vec<String> = ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.in_sync)
        .map(|(i, r)| format!("rank {i} ({}) is {}", r.host, r.why))
        .collect();
    let mut deployed: Vec<&str> = ranks.iter().filter_map(|r| r.deployed).collect();
    deployed.sort_unstable();
    deployed.dedup();
    let mixed =
        deployed.len() > 1 || (deployed.len() == 1 && ranks.iter().any(|r| r.deployed.is_none()));
    match (off.is_empty(), mixed) {
        (true, false) => format!("{head}: every rank in sync, on one deployment"),
        (true, true) => format!(
            "{head}: NOT one deployment: the ranks' last deployments come from different manifests"
        ),
        (false, _) => format!("{head}: the server is NOT in sync: {}", off.join("; ")),
    }
}

/// Whether a rank's journal says it died because a peer went away: NCCL's words for a remote
/// rank that exited (torch `ProcessGroupNCCL.cpp`: "remote process exited or there was a network
/// error", `ncclRemoteError`), or torch's store losing rank 0 ("Connection was likely closed",
/// `DistNetworkError`). sglang 0.5.23 logs them under "Scheduler hit an exception" before the
/// scheduler SIGQUITs its parent (`managers/scheduler.py`, `run_scheduler_process`).
pub fn died_of_a_peer(journal: &str) -> bool {
    journal.contains("remote process exited or there was a network error")
        || journal.contains("ncclRemoteError")
        || journal.contains("Connection was likely closed")
}

/// systemd's line saying a unit's process ended in failure, from its journal: systemd logs "Main
/// process exited, code=..., status=..." at notice level only when the result is a failure
/// (`src/core/service.c`, `service_sigchld_event`), then "Failed with result '...'". A rank whose
/// verification a peer's failure cut short may have crashed too, and this says so.
pub fn process_failure(journal: &str) -> Option<&str> {
    if !journal.contains("Failed with result") {
        return None;
    }
    journal
        .lines()
        .rev()
        .find(|l| l.contains("Main process exited"))
}

/// Which of the ranks that failed in their own right is to blame, given them in the order they
/// were seen to fail, each with whether its journal says it died of a peer ([`died_of_a_peer`]):
/// the first that did not. When a rank crashes, its peers die of it within moments, and which
/// death the polling sees first is a race; the journals say which came first. `None` when no
/// rank failed.
pub fn root_cause(failed: &[(usize, bool)]) -> Option<usize> {
    failed
        .iter()
        .find(|(_, of_a_peer)| !of_a_peer)
        .or(failed.first())
        .map(|(rank, _)| *rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    #[test]
    fn any_restart_or_install_restarts_the_group() {
        assert_eq!(group_verdict(&[NoChange, Restart, ReloadOnly]), Restart);
        assert_eq!(group_verdict(&[NoChange, Install]), Restart);
        assert_eq!(group_verdict(&[Install, Restart]), Restart);
        assert_eq!(group_verdict(&[Install, Install, Install]), Install);
    }

    #[test]
    fn without_a_restart_a_reload_is_the_groups() {
        assert_eq!(group_verdict(&[NoChange, ReloadOnly]), ReloadOnly);
        assert_eq!(group_verdict(&[NoChange, NoChange]), NoChange);
        assert_eq!(group_verdict(&[]), NoChange);
    }

    #[test]
    fn in_a_restarting_group_every_rank_restarts_and_a_new_one_installs() {
        for group in [Restart, Install] {
            assert_eq!(rank_verdict(NoChange, group), Restart);
            assert_eq!(rank_verdict(ReloadOnly, group), Restart);
            assert_eq!(rank_verdict(Restart, group), Restart);
            assert_eq!(rank_verdict(Install, group), Install);
        }
    }

    #[test]
    fn in_a_reloading_group_only_changed_ranks_reload() {
        assert_eq!(rank_verdict(ReloadOnly, ReloadOnly), ReloadOnly);
        assert_eq!(rank_verdict(NoChange, ReloadOnly), NoChange);
        assert_eq!(rank_verdict(NoChange, NoChange), NoChange);
    }

    #[test]
    fn the_rank_verdicts_follow_from_the_group_verdict() {
        let ranks = [NoChange, ReloadOnly, Restart, Install];
        let group = group_verdict(&ranks);
        let each: Vec<Verdict> = ranks.iter().map(|r| rank_verdict(*r, group)).collect();
        assert_eq!(each, [Restart, Restart, Restart, Install]);
    }

    #[test]
    fn rank_zero_starts_first() {
        assert_eq!(start_order(3), [0, 1, 2]);
        assert!(start_order(0).is_empty());
    }

    #[test]
    fn rank_zero_drains_while_the_other_ranks_stops_wait_for_its_shutdown() {
        use StopStep::*;
        assert_eq!(
            stop_steps(&[0, 1, 2]),
            [Begin(vec![1, 2]), Stop(vec![0]), Stop(vec![1, 2])]
        );
        assert_eq!(
            stop_steps(&[2, 0]),
            [Begin(vec![2]), Stop(vec![0]), Stop(vec![2])]
        );
        assert_eq!(stop_steps(&[0]), [Stop(vec![0])]);
        // Rank 0 not stopped (its host lost): nothing would end the others' schedulers.
        assert_eq!(
            stop_steps(&[2, 1]),
            [Terminate(vec![1, 2]), Stop(vec![1, 2])]
        );
        assert!(stop_steps(&[]).is_empty());
    }

    fn rank<'a>(host: &'a str, in_sync: bool, deployed: Option<&'a str>) -> RankStatus<'a> {
        RankStatus {
            host,
            in_sync,
            why: if in_sync { "" } else { "pending-change" },
            deployed,
        }
    }

    #[test]
    fn a_group_is_in_sync_only_when_every_rank_is_on_one_deployment() {
        let both = [rank("a", true, Some("d1")), rank("b", true, Some("d1"))];
        assert_eq!(
            group_status(&both),
            "one server over 2 hosts (a, b): every rank in sync, on one deployment"
        );
        let one_off = [rank("a", true, Some("d1")), rank("b", false, Some("d0"))];
        assert_eq!(
            group_status(&one_off),
            "one server over 2 hosts (a, b): the server is NOT in sync: rank 1 (b) is pending-change"
        );
        let mixed = [rank("a", true, Some("d1")), rank("b", true, Some("d2"))];
        assert!(group_status(&mixed).contains("NOT one deployment"));
    }

    const GROUP: &str = "service: big\nnodes: [gpu-a, gpu-b]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags: { tp-size: 2 }\n";

    /// Each rank planned against a host that runs `current` (a manifest's rendering of it).
    fn planned(current: Option<&str>) -> (Vec<PlanOutcome>, Vec<Target>) {
        use crate::observed::{Observed, UnitState};
        let m = crate::manifest::parse("big.yaml", GROUP).unwrap();
        let targets = crate::targets::targets(&[m], &Default::default()).unwrap();
        let outcomes = targets
            .iter()
            .map(|t| {
                let old = current.map(|text| {
                    let m = crate::manifest::parse("big.yaml", text).unwrap();
                    let i = m.hosts.iter().position(|h| h.name == t.host).unwrap();
                    crate::unit::render(&m, &m.hosts[i]).text
                });
                let observed = Observed {
                    unit_text: old,
                    state: UnitState {
                        load_state: "loaded".into(),
                        active_state: "active".into(),
                        ..Default::default()
                    },
                    unit_files: Default::default(),
                };
                PlanOutcome::Planned(Box::new(crate::plan::plan(
                    &t.host,
                    &t.source,
                    &t.desired,
                    &observed,
                    &Default::default(),
                )))
            })
            .collect();
        (outcomes, targets)
    }

    fn verdicts(outcomes: &[PlanOutcome]) -> Vec<Option<Verdict>> {
        outcomes
            .iter()
            .map(|o| match o {
                PlanOutcome::Planned(p) => Some(p.verdict),
                PlanOutcome::Error { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_group_is_planned_as_one_server() {
        // Rank 1's own unit is unchanged; rank 0's restarts: both restart, and rank 1 says why.
        let before = GROUP.replace(
            "nodes: [gpu-a, gpu-b]",
            "nodes:\n  - name: gpu-a\n    env: { X: \"1\" }\n  - gpu-b",
        );
        let (mut outcomes, targets) = planned(Some(&before));
        assert_eq!(verdicts(&outcomes), [Some(Restart), Some(NoChange)]);
        plan_groups(&mut outcomes, &targets);
        assert_eq!(verdicts(&outcomes), [Some(Restart), Some(Restart)]);
        let PlanOutcome::Planned(rank1) = &outcomes[1] else {
            unreachable!()
        };
        assert!(
            rank1.notes[0].starts_with("rank 1 of one server over 2 hosts (gpu-a, gpu-b)"),
            "{:?}",
            rank1.notes
        );
        assert!(
            rank1.notes[0].ends_with("it restarts with its group"),
            "{:?}",
            rank1.notes
        );
        // Up to date everywhere: no change, for the group too.
        let (mut outcomes, targets) = planned(Some(GROUP));
        plan_groups(&mut outcomes, &targets);
        assert_eq!(verdicts(&outcomes), [Some(NoChange), Some(NoChange)]);
    }

    #[test]
    fn a_rank_that_cannot_be_planned_leaves_the_whole_group_unplanned() {
        let (mut outcomes, targets) = planned(None);
        outcomes[1] = PlanOutcome::failed(&targets[1], "cannot connect to gpu-b".into());
        plan_groups(&mut outcomes, &targets);
        assert_eq!(verdicts(&outcomes), [None, None]);
        let PlanOutcome::Error { error, .. } = &outcomes[0] else {
            unreachable!()
        };
        assert_eq!(
            error,
            "the server group over gpu-a, gpu-b is not planned: its rank 1 (gpu-b) could not be: cannot connect to gpu-b"
        );
    }

    #[test]
    fn the_rank_to_blame_is_the_first_that_did_not_die_of_a_peer() {
        let peer = "TP0] Scheduler hit an exception: ... torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:3690, remote process exited or there was a network error, NCCL version 2.27.5";
        assert!(died_of_a_peer(peer));
        assert!(!died_of_a_peer("RuntimeError: CUDA out of memory"));
        // Rank 0 was seen dead first, of rank 1's crash: rank 1 is to blame.
        assert_eq!(root_cause(&[(0, true), (1, false)]), Some(1));
        // All died of a peer (the journals could not tell): the first seen.
        assert_eq!(root_cause(&[(1, true), (0, true)]), Some(1));
        assert_eq!(root_cause(&[]), None);
    }

    #[test]
    fn a_process_that_failed_is_read_from_systemds_lines() {
        let crashed = "loading\nt.service: Main process exited, code=exited, status=1/FAILURE\nt.service: Failed with result 'exit-code'.\nStopped t.service.";
        assert_eq!(
            process_failure(crashed),
            Some("t.service: Main process exited, code=exited, status=1/FAILURE")
        );
        assert_eq!(
            process_failure("loading\nStopping t.service...\nStopped t.service."),
            None
        );
    }
}
