//! The edge of `history`: a unit's records, saved units and generations, read over one connection
//! per host. Nothing is changed.

use super::{deployments, disk_notes, generations, moved_aside, Deployment, HostHistory};
use crate::plan::UNIT_DIR;
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::state;
use crate::visit;

/// The history of `unit` on each host, at most `parallel` hosts at once, in the hosts' order.
pub async fn history_hosts(
    hosts: &[String],
    unit: &str,
    ssh: &SshOptions,
    parallel: usize,
) -> Vec<HostHistory> {
    visit::each_host(
        hosts.iter().map(|name| (name.clone(), ())),
        ssh,
        parallel,
        visit::no_span,
        async |host: &dyn Host, visit: &visit::Visit<'_>, ()| {
            read(host, unit)
                .await
                .unwrap_or_else(|e| unreadable(visit.name, unit, &e))
        },
        |visit, (), e| unreadable(visit.name, unit, &e),
    )
    .await
}

/// The history of a host that could not be reached or read.
fn unreadable(name: &str, unit: &str, e: &RemoteError) -> HostHistory {
    HostHistory {
        host: name.to_string(),
        unit: unit.to_string(),
        deployments: Vec::new(),
        generations: Vec::new(),
        moved_aside: Vec::new(),
        notes: Vec::new(),
        error: Some(error_chain(e)),
    }
}

/// A unit's deployments on a host, and what kept the current one from being known.
pub struct Read {
    pub deployments: Vec<Deployment>,
    /// Why `current.json` could not be used, when it exists but cannot be read or parsed: then no
    /// deployment is marked current.
    pub current_error: Option<state::RecordError>,
}

/// The deployments of `unit` on a connected host, numbered and marked (also used by rollback).
pub async fn read_deployments(host: &dyn Host, unit: &str) -> Result<Read, RemoteError> {
    let (history, current, kept) = tokio::join!(
        state::read_history(host, unit),
        state::read_record(host, unit),
        state::deployed_numbers(host, unit)
    );
    let (current, current_error) = match current {
        Ok(current) => (current, None),
        Err(e) => (None, Some(e)),
    };
    Ok(Read {
        deployments: deployments(history?, current.as_ref(), &kept?),
        current_error,
    })
}

async fn read(host: &dyn Host, unit: &str) -> Result<HostHistory, RemoteError> {
    let path = format!("{UNIT_DIR}/{unit}");
    let (deployed, saved_generations, disk, aside, guard) = tokio::join!(
        read_deployments(host, unit),
        state::generations(host, unit),
        host.read_file(&path),
        crate::apply::aside::records(host, unit),
        crate::apply::guard::read(host, unit)
    );
    let Read {
        deployments: deployed,
        current_error,
    } = deployed?;
    let disk_sha = disk?.map(|text| state::sha256(&text));
    let mut notes: Vec<String> = current_error
        .iter()
        .map(|e| format!("{e}; no deployment is marked current"))
        .collect();
    notes.extend(disk_notes(&deployed, disk_sha.as_deref()));
    // What the host's guard did when the apply that armed it died: kept or rolled back on its own.
    // A guard that cannot be read says nothing here (`status` reports the unit's state).
    notes.extend(guard.ok().flatten().and_then(|g| g.summary()));
    Ok(HostHistory {
        host: host.name().to_string(),
        unit: unit.to_string(),
        generations: generations(&saved_generations?, &deployed),
        moved_aside: moved_aside(&aside?),
        notes,
        deployments: deployed,
        error: None,
    })
}
