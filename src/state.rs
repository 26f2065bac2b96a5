//! What `reconcile` keeps on each host, per unit, under `/var/lib/reconcile/<unit>/` (0700):
//! the lock of the run working on it, the previous units (generations), and the deployment record.
//!
//! Two kinds of kept units, for two jobs:
//! - `generations/<unix nanos>.service`: the unit an apply *replaced*, written before the new one is
//!   installed, so an apply that fails can put it back (the newest 5);
//! - `deployed/<N>.service`: the unit a *successful* deployment installed, where N is the number of
//!   its line in `history.jsonl` (1 = oldest), so `reconcile rollback --to N` restores exactly what
//!   deployment N ran (the newest 10).
//!
//! The record's model and its parsing and formatting are pure, in `reconcile_core::record`
//! (re-exported here); this module reads and writes them, and everything else, on the host.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use crate::digest::sha256;
pub use crate::record::{
    parse_history, parse_record, record_json, Record, RecordError, RecordProblem,
};

use crate::remote::{error_chain, Host, RemoteError};

pub const STATE_DIR: &str = "/var/lib/reconcile";
/// Previous units kept per unit on a host.
const GENERATIONS_SAVED: usize = 5;
/// Units of successful deployments kept per unit on a host, for `reconcile rollback`.
pub const DEPLOYED_SAVED: usize = 10;

pub fn unit_dir(unit: &str) -> String {
    format!("{STATE_DIR}/{unit}")
}

/// Who is applying: written into the lock so a refused run can say who holds it.
#[derive(Debug, Clone)]
pub struct Owner {
    pub user: String,
    pub machine: String,
    pub pid: u32,
}

impl Owner {
    pub fn this_process() -> Owner {
        Owner {
            user: std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
            machine: std::fs::read_to_string("/etc/hostname")
                .unwrap_or_default()
                .trim()
                .to_string(),
            pid: std::process::id(),
        }
    }
}

/// How to treat a lock left by another run.
#[derive(Debug, Clone, Copy)]
pub struct LockPolicy {
    /// Break a lock older than `ttl` (a run that died on another machine).
    pub break_stale: bool,
    pub ttl: Duration,
}

/// Why a unit's lock was not taken. Apply reports each as its own kind (`ApplyError`'s `Locked`,
/// `LockNotTaken` and `LockFailed`), with these words.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LockError {
    /// Another run holds the lock.
    #[error("{unit} on {host} is locked by another apply ({holder}); if that run is dead, rerun with --break-stale-lock")]
    Held {
        unit: String,
        host: String,
        holder: String,
    },
    /// A stale lock was broken, and another run took the lock before this one got it.
    #[error("{unit} on {host}: could not take the lock")]
    NotTaken { unit: String, host: String },
    /// The host failed while the lock was being taken.
    #[error("{}", error_chain(&**.0))]
    Failed(#[source] Arc<RemoteError>),
}

/// Takes the unit's lock (`mkdir` is atomic: of two runs exactly one gets it). A lock whose owner
/// was a process on this machine that no longer exists is broken at once; an old lock from
/// elsewhere only with `--break-stale-lock`. Returns a note when a lock was broken.
pub async fn lock(
    host: &dyn Host,
    unit: &str,
    owner: &Owner,
    policy: LockPolicy,
) -> Result<Option<String>, LockError> {
    const TAKE: &str = "umask 077; mkdir -p -m 0700 \"$1\" && mkdir -m 0700 \"$1/lock\" 2>/dev/null && printf '%s\\n' \"$2\" \"$3\" \"$4\" \"$5\" > \"$1/lock/owner\"";
    let dir = unit_dir(unit);
    let now = unix_now().to_string();
    let pid = owner.pid.to_string();
    let take = [
        "sh",
        "-c",
        TAKE,
        "sh",
        &dir,
        &owner.user,
        &owner.machine,
        &pid,
        &now,
    ];
    let mut note = None;
    for attempt in 0..2 {
        let failed = |e: RemoteError| LockError::Failed(Arc::new(e));
        let out = host.run(&take).await.map_err(failed)?;
        if out.status == 0 {
            return Ok(note);
        }
        let held = host
            .read_file(&format!("{dir}/lock/owner"))
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let fields: Vec<&str> = held.lines().collect();
        let (user, machine, pid, since) = match fields[..] {
            [u, m, p, t, ..] => (
                u,
                m,
                p.parse::<u32>().unwrap_or(0),
                t.parse::<u64>().unwrap_or(0),
            ),
            _ => ("?", "?", 0, 0),
        };
        let age = unix_now().saturating_sub(since);
        let holder = format!("{user}@{machine} pid {pid}, {age}s ago");
        let dead_here = machine == owner.machine
            && pid != 0
            && !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let stale = policy.break_stale && age > policy.ttl.as_secs();
        if attempt == 0 && (dead_here || stale) {
            host.run_ok(&["rm", "-rf", "--", &format!("{dir}/lock")])
                .await
                .map_err(failed)?;
            let why = if dead_here {
                "its process is gone"
            } else {
                "older than --lock-ttl"
            };
            note = Some(format!("broke a stale lock held by {holder} ({why})"));
            continue;
        }
        return Err(LockError::Held {
            unit: unit.to_string(),
            host: host.name().to_string(),
            holder,
        });
    }
    Err(LockError::NotTaken {
        unit: unit.to_string(),
        host: host.name().to_string(),
    })
}

pub async fn unlock(host: &dyn Host, unit: &str) -> Result<(), RemoteError> {
    host.run_ok(&["rm", "-rf", "--", &format!("{}/lock", unit_dir(unit))])
        .await
        .map(|_| ())
}

/// Releases the unit's lock; a failure to is a note (the next run from here breaks the lock).
pub async fn unlock_noting(host: &dyn Host, unit: &str, notes: &mut Vec<String>) {
    if let Err(e) = unlock(host, unit).await {
        notes.push(format!(
            "the lock could not be released: {}",
            error_chain(&e)
        ));
    }
}

/// A folder of the state path made, and it and every folder above it up to [`STATE_DIR`] made
/// root's alone (0700), whatever made them before: `mkdir -p -m` sets only the last folder's
/// mode, and an earlier reconcile left the state folder 0755.
pub async fn private_dir(host: &dyn Host, dir: &str) -> Result<(), RemoteError> {
    const MAKE: &str = r#"umask 077 && mkdir -p -- "$2" || exit 1
d=$2; set -- "$1"
while [ "${d#"$1"/}" != "$d" ]; do set -- "$@" "$d"; d=${d%/*}; done
chmod 0700 -- "$@""#;
    host.run_ok(&["sh", "-c", MAKE, "sh", STATE_DIR, dir])
        .await
        .map(drop)
}

/// Removes all but the newest `keep` files of `dir` (their names are numbers: generations by
/// time, deployments by line).
async fn prune(host: &dyn Host, dir: &str, keep: usize) -> Result<(), RemoteError> {
    const PRUNE: &str = "cd \"$1\" && ls -1 | sort -n | head -n -\"$2\" | xargs -r rm -f --";
    host.run_ok(&["sh", "-c", PRUNE, "sh", dir, &keep.to_string()])
        .await
        .map(drop)
}

/// Copies a unit's text into the generations, keeping the newest few; returns the copy's path.
pub async fn keep_generation(
    host: &dyn Host,
    unit: &str,
    text: &str,
) -> Result<String, RemoteError> {
    let dir = format!("{}/generations", unit_dir(unit));
    private_dir(host, &dir).await?;
    let path = format!("{dir}/{}.service", unix_nanos());
    host.write_file(&path, text, "0600").await?;
    prune(host, &dir, GENERATIONS_SAVED).await?;
    Ok(path)
}

/// The newest saved generation's text.
pub async fn newest_generation(host: &dyn Host, unit: &str) -> Result<Option<String>, RemoteError> {
    const NEWEST: &str = "cd \"$1\" 2>/dev/null || exit 0; f=$(ls -1 | sort -n | tail -n 1); [ -n \"$f\" ] && cat -- \"$f\"";
    let dir = format!("{}/generations", unit_dir(unit));
    let out = host.run(&["sh", "-c", NEWEST, "sh", &dir]).await?;
    Ok((out.status == 0 && !out.stdout.is_empty()).then_some(out.stdout))
}

/// Writes `current.json`, keeps the deployed unit as `deployed/<N>.service` and appends the record
/// to `history.jsonl` as its line N. The copy goes first: a run cut off between the two leaves a
/// copy no line points at, which the next deployment (same N) overwrites, never a line without its
/// unit. The caller holds the unit's lock, so N cannot be taken by another run meanwhile.
pub async fn write_record(
    host: &dyn Host,
    record: &Record,
    unit_text: &str,
) -> Result<(), RemoteError> {
    let dir = unit_dir(&record.unit);
    let json = record_json(record).map_err(|e| RemoteError::Transport {
        host: host.name().to_string(),
        command: "write the deployment record".into(),
        source: Box::new(e),
    })?;
    host.write_file(&format!("{dir}/current.json"), &format!("{json}\n"), "0600")
        .await?;
    const LINES: &str = "[ -f \"$1\" ] && wc -l < \"$1\" || echo 0";
    let history = format!("{dir}/history.jsonl");
    let lines = host.run_ok(&["sh", "-c", LINES, "sh", &history]).await?;
    let n = lines.trim().parse::<usize>().unwrap_or(0) + 1;
    let deployed = format!("{dir}/deployed");
    private_dir(host, &deployed).await?;
    host.write_file(&format!("{deployed}/{n}.service"), unit_text, "0600")
        .await?;
    const APPEND: &str = "umask 077; printf '%s\\n' \"$2\" >> \"$1\"";
    host.run_ok(&["sh", "-c", APPEND, "sh", &history, &json])
        .await?;
    prune(host, &deployed, DEPLOYED_SAVED).await?;
    Ok(())
}

/// Rewrites `current.json` alone (`reconcile bench` adding figures to the current deployment).
/// `history.jsonl` stays append-only: its line for this deployment keeps what the apply recorded.
pub async fn write_current(host: &dyn Host, record: &Record) -> Result<(), RemoteError> {
    let json = record_json(record).map_err(|e| RemoteError::Transport {
        host: host.name().to_string(),
        command: "write the deployment record".into(),
        source: Box::new(e),
    })?;
    let path = format!("{}/current.json", unit_dir(&record.unit));
    host.write_file(&path, &format!("{json}\n"), "0600").await
}

/// Every record of `history.jsonl`, oldest first; line N is deployment N. A line that does not
/// parse (written by a newer reconcile, or damaged) is kept as the reason, so the numbers stay
/// right.
pub async fn read_history(
    host: &dyn Host,
    unit: &str,
) -> Result<Vec<Result<Record, RecordProblem>>, RemoteError> {
    let text = host
        .read_file(&format!("{}/history.jsonl", unit_dir(unit)))
        .await?
        .unwrap_or_default();
    Ok(parse_history(&text))
}

/// The deployments whose unit is kept under `deployed/`, ascending.
pub async fn deployed_numbers(host: &dyn Host, unit: &str) -> Result<Vec<usize>, RemoteError> {
    const LIST: &str = "cd \"$1\" 2>/dev/null || exit 0; ls -1";
    let dir = format!("{}/deployed", unit_dir(unit));
    let out = host.run_ok(&["sh", "-c", LIST, "sh", &dir]).await?;
    let mut numbers: Vec<usize> = out
        .lines()
        .filter_map(|l| l.strip_suffix(".service")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// The unit deployment `n` installed, when it is kept.
pub async fn read_deployed(
    host: &dyn Host,
    unit: &str,
    n: usize,
) -> Result<Option<String>, RemoteError> {
    host.read_file(&format!("{}/deployed/{n}.service", unit_dir(unit)))
        .await
}

/// A unit an apply replaced: when it was kept (unix nanos, its file name) and its sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub nanos: u128,
    pub sha256: String,
}

/// The saved generations, oldest first.
pub async fn generations(host: &dyn Host, unit: &str) -> Result<Vec<Generation>, RemoteError> {
    const LIST: &str = "cd \"$1\" 2>/dev/null || exit 0; for f in $(ls -1 | sort -n); do printf '%s %s\\n' \"$f\" \"$(sha256sum < \"$f\" | cut -d' ' -f1)\"; done";
    let dir = format!("{}/generations", unit_dir(unit));
    let out = host.run_ok(&["sh", "-c", LIST, "sh", &dir]).await?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (name, sha) = l.split_once(' ')?;
            Some(Generation {
                nanos: name.strip_suffix(".service")?.parse().ok()?,
                sha256: sha.to_string(),
            })
        })
        .collect())
}

/// The unit's last deployment record (`current.json`): `None` when there is none, an error when
/// there is one that cannot be read or parsed (see [`RecordError`]).
pub async fn read_record(host: &dyn Host, unit: &str) -> Result<Option<Record>, RecordError> {
    let path = format!("{}/current.json", unit_dir(unit));
    let read = host.read_file(&path).await;
    let error = |problem| RecordError {
        host: host.name().to_string(),
        path: path.clone(),
        problem,
    };
    match read {
        Ok(None) => Ok(None),
        Ok(Some(text)) => parse_record(&text).map(Some).map_err(error),
        Err(e) => Err(error(RecordProblem::Unreadable(error_chain(&e)))),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// Generation names sort by time even when two applies fall in one second.
fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos()
}
