//! What `reconcile` keeps on each host, per unit, under `/var/lib/reconcile/<unit>/` (0700):
//! the lock of the run working on it, the previous units (generations), and the deployment record.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::remote::{error_chain, Host, RemoteError};

pub const STATE_DIR: &str = "/var/lib/reconcile";
/// Previous units kept per unit on a host.
const GENERATIONS_KEPT: usize = 5;

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

/// Takes the unit's lock (`mkdir` is atomic: of two runs exactly one gets it). A lock whose owner
/// was a process on this machine that no longer exists is broken at once; an old lock from
/// elsewhere only with `--break-stale-lock`. Returns a note when a lock was broken.
pub async fn lock(
    host: &Host,
    unit: &str,
    owner: &Owner,
    policy: LockPolicy,
) -> Result<Option<String>, String> {
    const TAKE: &str = "mkdir -p -m 0700 \"$1\" && mkdir -m 0700 \"$1/lock\" 2>/dev/null && printf '%s\\n' \"$2\" \"$3\" \"$4\" \"$5\" > \"$1/lock/owner\"";
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
        let out = host.run(&take).await.map_err(|e| error_chain(&e))?;
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
                .map_err(|e| error_chain(&e))?;
            let why = if dead_here {
                "its process is gone"
            } else {
                "older than --lock-ttl"
            };
            note = Some(format!("broke a stale lock held by {holder} ({why})"));
            continue;
        }
        return Err(format!(
            "{unit} on {} is locked by another apply ({holder}); if that run is dead, rerun with --break-stale-lock",
            host.name()
        ));
    }
    Err(format!(
        "{unit} on {}: could not take the lock",
        host.name()
    ))
}

pub async fn unlock(host: &Host, unit: &str) -> Result<(), RemoteError> {
    host.run_ok(&["rm", "-rf", "--", &format!("{}/lock", unit_dir(unit))])
        .await
        .map(|_| ())
}

/// Copies a unit's text into the generations, keeping the newest few.
pub async fn keep_generation(host: &Host, unit: &str, text: &str) -> Result<(), RemoteError> {
    let dir = format!("{}/generations", unit_dir(unit));
    host.run_ok(&["mkdir", "-p", "-m", "0700", "--", &dir])
        .await?;
    host.write_file(&format!("{dir}/{}.service", unix_nanos()), text, "0600")
        .await?;
    const PRUNE: &str = "cd \"$1\" && ls -1 | sort -n | head -n -\"$2\" | xargs -r rm -f --";
    host.run_ok(&["sh", "-c", PRUNE, "sh", &dir, &GENERATIONS_KEPT.to_string()])
        .await?;
    Ok(())
}

/// The newest kept generation's text.
pub async fn newest_generation(host: &Host, unit: &str) -> Result<Option<String>, RemoteError> {
    const NEWEST: &str = "cd \"$1\" 2>/dev/null || exit 0; f=$(ls -1 | sort -n | tail -n 1); [ -n \"$f\" ] && cat -- \"$f\"";
    let dir = format!("{}/generations", unit_dir(unit));
    let out = host.run(&["sh", "-c", NEWEST, "sh", &dir]).await?;
    Ok((out.status == 0 && !out.stdout.is_empty()).then_some(out.stdout))
}

/// What was deployed, when and from which commit, and how verification went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub unit: String,
    pub manifest: String,
    pub manifest_sha256: String,
    pub unit_sha256: String,
    pub git_commit: Option<String>,
    pub git_author: Option<String>,
    pub applied_at: String,
    pub applied_by: String,
    pub outcome: String,
    pub load_seconds: Option<f64>,
    pub plateau_service_bytes: Option<u64>,
    pub plateau_gpu_mib: Vec<u64>,
}

/// Writes `current.json` and appends to `history.jsonl`.
pub async fn write_record(host: &Host, record: &Record) -> Result<(), RemoteError> {
    let dir = unit_dir(&record.unit);
    let json = serde_json::to_string(record).expect("records serialize");
    host.write_file(&format!("{dir}/current.json"), &format!("{json}\n"), "0600")
        .await?;
    const APPEND: &str = "umask 077; printf '%s\\n' \"$2\" >> \"$1\"";
    host.run_ok(&[
        "sh",
        "-c",
        APPEND,
        "sh",
        &format!("{dir}/history.jsonl"),
        &json,
    ])
    .await?;
    Ok(())
}

pub async fn read_record(host: &Host, unit: &str) -> Option<Record> {
    let text = host
        .read_file(&format!("{}/current.json", unit_dir(unit)))
        .await
        .ok()??;
    serde_json::from_str(&text).ok()
}

pub fn sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(text.as_bytes()))
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
