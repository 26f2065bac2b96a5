//! `reconcile rollback`: restore a saved deployment through apply's own path.
//!
//! The restored unit becomes the desired unit of an ordinary apply target, so it gets the same
//! preflight, lock, saved generation, atomic install, restart and staged verification as any
//! apply, and the same automatic rollback (to the unit it replaced) when verification fails.
//! Hosts go one at a time, and none starts after one fails: a rollback is what one does when
//! things are already going wrong.

use super::gather::{read_deployments, Read};
use super::{choose, skipped_lines, Choice, ChooseError};
use crate::apply::{self, ApplyError, ApplyOptions, GitInfo, UnitReport};
use crate::flags::flags;
use crate::manifest::Manifest;
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
use crate::state;
use crate::targets::Target;

/// What `reconcile rollback` is asked: `unit` on `hosts`, to deployment `to` (else the one before
/// the current). `manifest` is the service's manifest, when the manifests have it: its
/// verification settings judge the restored server.
#[derive(Debug, Clone, Copy)]
pub struct Rollback<'a> {
    pub hosts: &'a [String],
    pub unit: &'a str,
    pub to: Option<usize>,
    pub manifest: Option<&'a Manifest>,
}

/// Rolls the unit back on each host in turn.
pub async fn rollback(
    asked: Rollback<'_>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let Rollback {
        hosts,
        unit,
        to,
        manifest,
    } = asked;
    if let Some(reports) = rollback_group(asked, ssh, options).await {
        return reports;
    }
    let mut reports = Vec::new();
    let mut stopped: Option<ApplyError> = None;
    for name in hosts {
        if stopped.is_none() && options.cancel.is_cancelled() {
            stopped = Some(ApplyError::Interrupted(
                "interrupted before this host's turn".into(),
            ));
        }
        if let Some(why) = &stopped {
            reports.push(apply::refused_for(name, unit, "", why));
            continue;
        }
        let report = rollback_host(name, unit, to, manifest, ssh, options).await;
        if report.outcome.exit_code() != 0 {
            stopped = Some(ApplyError::NotStarted(format!(
                "the rollback on {name} did not succeed"
            )));
        }
        reports.push(report);
    }
    reports
}

/// A server group's rollback: `Some` when the unit is a server group's (the manifest's `nodes:`,
/// or a saved unit with `--nnodes` > 1). Every rank is prepared first; they go back together,
/// through the group's own apply, to one deployment: the same number on every host, applied from
/// the same manifest. Anything else (a rank whose history cannot be read, ranks whose chosen
/// deployments differ, hosts that are not the whole group) refuses the rollback on every rank,
/// touching none.
async fn rollback_group(
    asked: Rollback<'_>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Option<Vec<UnitReport>> {
    let (hosts, unit, to, manifest) = (asked.hosts, asked.unit, asked.to, asked.manifest);
    let grouped = manifest.is_some_and(|m| m.group.is_some());
    let mut prepared = Vec::new();
    for name in hosts {
        let read = match remote::connect(name, ssh).await {
            Ok(host) => {
                let p = prepare(&*host, name, unit, to, manifest).await;
                host.close().await;
                p
            }
            Err(e) => Err(PrepareError::Connect(e)),
        };
        prepared.push((name.clone(), read));
    }
    let ranks = prepared
        .iter()
        .any(|(_, p)| p.as_ref().is_ok_and(|p| is_rank(&p.target)));
    if !grouped && !ranks {
        return None;
    }
    let names: Vec<String> = prepared.iter().map(|(name, _)| name.clone()).collect();
    let refuse_all = |why: GroupError| {
        // Every rank's report gets the same words.
        let why = why.to_string();
        names
            .iter()
            .map(|name| apply::refused_for(name, unit, "", &ApplyError::Refused(why.clone())))
            .collect::<Vec<_>>()
    };
    let mut owned = Vec::new();
    for (name, p) in prepared {
        match p {
            Ok(p) => owned.push((name, p)),
            Err(source) => {
                return Some(refuse_all(GroupError::RankRefused {
                    unit: unit.to_string(),
                    host: name,
                    source: Box::new(source),
                }))
            }
        }
    }
    let ok: Vec<(String, &Prepared)> = owned.iter().map(|(name, p)| (name.clone(), p)).collect();
    if let Err(why) = one_deployment(unit, &ok) {
        return Some(refuse_all(why));
    }
    let nodes: Vec<String> = {
        let mut by_rank: Vec<(usize, String)> = ok
            .iter()
            .map(|(name, p)| (node_rank(&p.target), name.clone()))
            .collect();
        by_rank.sort();
        by_rank.into_iter().map(|(_, name)| name).collect()
    };
    let (n, git) = (ok[0].1.n, ok[0].1.git.clone());
    let targets: Vec<Target> = ok
        .iter()
        .map(|(_, p)| Target {
            group: Some(crate::targets::Rank {
                rank: node_rank(&p.target),
                nodes: nodes.clone(),
            }),
            ..p.target.clone()
        })
        .collect();
    let options = options.restoring(apply::Restoring::Deployment(n), git);
    let notes: Vec<Vec<String>> = ok.iter().map(|(_, p)| p.notes.clone()).collect();
    let mut reports = apply::apply_group(targets, ssh, &options).await;
    for r in &mut reports {
        r.detail = format!("rollback to deployment {n}: {}", r.detail);
        if let Some(i) = ok.iter().position(|(name, _)| *name == r.host) {
            r.notes.splice(0..0, notes[i].clone());
        }
    }
    Some(reports)
}

/// Why a server group's rollback is refused on every rank.
#[derive(Debug, thiserror::Error)]
enum GroupError {
    /// One rank's deployment cannot be restored.
    #[error("{unit} is a server group, rolled back whole, and {host} cannot be: {source}")]
    RankRefused {
        unit: String,
        host: String,
        /// Boxed: the common errors stay small.
        #[source]
        source: Box<PrepareError>,
    },
    /// The ranks would go back to different deployments (`shown`: `host #n` each).
    #[error("{unit} is a server group, rolled back whole to one deployment, and its hosts would go back to different ones ({}); say which with --to N, the same deployment on every host", .shown.join(", "))]
    Different { unit: String, shown: Vec<String> },
    /// The hosts named are not the group's `nnodes` ranks, each once.
    #[error("deployment {n} of {unit} is one server over {nnodes} hosts, and the hosts named ({}) are not all of its ranks, each once; name every rank's host", .shown.join(", "))]
    NotAllRanks {
        n: usize,
        unit: String,
        nnodes: usize,
        shown: Vec<String>,
    },
}

/// The group's ranks go back to one deployment: the same number on every host, each applied
/// from the same manifest, its ranks together the whole group (`--nnodes` of them, each rank once).
fn one_deployment(unit: &str, ranks: &[(String, &Prepared)]) -> Result<(), GroupError> {
    let shown: Vec<String> = ranks
        .iter()
        .map(|(name, p)| format!("{name} #{}", p.n))
        .collect();
    let first = ranks[0].1;
    if ranks
        .iter()
        .any(|(_, p)| p.n != first.n || p.target.manifest_digest != first.target.manifest_digest)
    {
        return Err(GroupError::Different {
            unit: unit.to_string(),
            shown,
        });
    }
    let nnodes = {
        let (_, flags) = flags(&first.target.desired.model.exec_start);
        flags
            .get("nnodes")
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
    };
    let mut seen: Vec<usize> = ranks.iter().map(|(_, p)| node_rank(&p.target)).collect();
    seen.sort_unstable();
    if seen != (0..nnodes).collect::<Vec<_>>() {
        return Err(GroupError::NotAllRanks {
            n: first.n,
            unit: unit.to_string(),
            nnodes,
            shown,
        });
    }
    Ok(())
}

/// The saved unit's `--node-rank` (0 without one).
fn node_rank(t: &Target) -> usize {
    let (_, flags) = flags(&t.desired.model.exec_start);
    flags
        .get("node-rank")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

async fn rollback_host(
    name: &str,
    unit: &str,
    to: Option<usize>,
    manifest: Option<&Manifest>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> UnitReport {
    let error = |e: ApplyError| apply::refused_for(name, unit, "", &e);
    let host = match remote::connect(name, ssh).await {
        Ok(host) => host,
        Err(e) => return error(ApplyError::Unreachable(std::sync::Arc::new(e))),
    };
    let report = match prepare(&*host, name, unit, to, manifest).await {
        Ok(Prepared {
            n,
            target,
            git,
            notes,
        }) => {
            let options = options.restoring(apply::Restoring::Deployment(n), git);
            let mut report = apply::apply_one(&*host, &target, &options).await;
            report.detail = format!("rollback to deployment {n}: {}", report.detail);
            report.notes.splice(0..0, notes);
            report
        }
        Err(detail) => error(ApplyError::Refused(detail.to_string())),
    };
    host.close().await;
    report
}

/// Whether the saved unit runs one rank of a server over several hosts.
fn is_rank(t: &Target) -> bool {
    let (_, flags) = flags(&t.desired.model.exec_start);
    flags
        .get("nnodes")
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n > 1)
}

/// The deployment to restore, the apply target and git info that restore it, and notes on what
/// the choice passed over.
struct Prepared {
    n: usize,
    target: Target,
    git: GitInfo,
    notes: Vec<String>,
}

/// Why a host's deployment cannot be restored.
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    /// The host could not be reached (a group's rank; a lone host reports it as unreachable).
    #[error("{}", error_chain(.0))]
    Connect(#[source] RemoteError),
    /// The unit's history could not be read.
    #[error("{}", error_chain(.0))]
    ReadHistory(#[source] RemoteError),
    /// `current.json` was written by a newer reconcile: no `--to N` makes this one read it.
    #[error(transparent)]
    CurrentNewer(state::RecordError),
    /// `current.json` cannot be used, so the deployment before it is unknown.
    #[error("{0}; say which deployment to restore with --to N")]
    CurrentUnreadable(state::RecordError),
    /// No deployment of `unit` on `host` can be chosen.
    #[error("{unit} on {host}: {source}")]
    Choose {
        unit: String,
        host: String,
        #[source]
        source: ChooseError,
    },
    /// The chosen deployment's record cannot be read.
    #[error("{unit} on {host}: deployment {n}'s record cannot be read")]
    RecordUnreadable {
        unit: String,
        host: String,
        n: usize,
    },
    /// The saved unit could not be read.
    #[error("{}", error_chain(.0))]
    ReadSaved(#[source] RemoteError),
    /// The saved unit was there when the history was read, and is not now.
    #[error("deployment {n}'s kept unit disappeared meanwhile")]
    SavedGone { n: usize },
}

async fn prepare(
    host: &dyn Host,
    name: &str,
    unit: &str,
    to: Option<usize>,
    manifest: Option<&Manifest>,
) -> Result<Prepared, PrepareError> {
    let Read {
        deployments,
        current_error,
    } = read_deployments(host, unit)
        .await
        .map_err(PrepareError::ReadHistory)?;
    let mut notes = Vec::new();
    if let Some(e) = current_error {
        // Without it the current deployment is unknown, and so is the one before it.
        match (to, &e.problem) {
            (None, state::RecordProblem::Newer(_)) => return Err(PrepareError::CurrentNewer(e)),
            (None, _) => return Err(PrepareError::CurrentUnreadable(e)),
            (Some(_), _) => {}
        }
        notes.push(e.to_string());
    }
    let Choice { n, skipped } =
        choose(&deployments, to).map_err(|source| PrepareError::Choose {
            unit: unit.to_string(),
            host: name.to_string(),
            source,
        })?;
    if skipped > 0 {
        notes.push(skipped_lines(skipped));
    }
    let record = deployments
        .iter()
        .find(|d| d.n == n)
        .and_then(|d| d.record.clone())
        .ok_or_else(|| PrepareError::RecordUnreadable {
            unit: unit.to_string(),
            host: name.to_string(),
            n,
        })?;
    let text = state::read_deployed(host, unit, n)
        .await
        .map_err(PrepareError::ReadSaved)?
        .ok_or(PrepareError::SavedGone { n })?;
    let git = GitInfo {
        commit: record.git_commit.clone(),
        author: record.git_author.clone(),
    };
    Ok(Prepared {
        n,
        target: apply::undo::saved_target(
            name,
            unit,
            text,
            &record.manifest,
            &record.manifest_sha256,
            manifest,
        ),
        git,
        notes,
    })
}
