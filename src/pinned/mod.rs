//! Pinned weights on the hosts (`sglang.model:`): what a host holds of a revision, fetching it
//! there before the old server stops, and the copies kept to roll back to. The decisions are
//! `reconcile_core::pinned`'; this module runs the fixed host script (`weights.py`) that carries
//! them out, with the manifest's Python started as the survey starts it (root starts it only when
//! the interpreter and its standard library are root's, `-I -S`: nothing but the standard library).

pub mod lock;
mod script;

use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use reconcile_core::pinned::{
    human_bytes, judge, CopyPlan, Differ, FetchFailure, FetchProgress, Fetched, Holding, HostCopy,
    LockedFile, LockedRevision, PinnedModel,
};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::preflight::scripts::isolated_python;
use crate::remote::{Host, Output, RemoteError};
use script::WEIGHTS_SCRIPT;

/// How long a command that only looks (`look`, `used`, `remove`) may take: stats of a folder.
const LOOK_LIMIT: Duration = Duration::from_secs(60);
/// How long a whole fetch or hash may take before its host counts as hung: a 234 GB model at a
/// slow 100 MB/s takes 40 minutes; a day is past any link a fleet of GPUs sits on.
const TRANSFER_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// How often a fetch's progress is read.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How long a fetch waits for another fetch of the same revision that makes no progress (one
/// whose controller went away notices within a chunk's time that nobody waits for it, and lets
/// go; one that still makes progress is waited for as long as it does).
const BUSY_WAIT: Duration = Duration::from_secs(60);

/// Why a host's weights could not be looked at, fetched or kept.
#[derive(Debug, thiserror::Error)]
pub enum PinnedError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The manifest's Python is not root's alone: root runs no code another user could change.
    #[error("{host}: root does not start {python} to fetch the weights: {why}")]
    Untrusted {
        host: String,
        python: String,
        why: String,
    },
    /// The script's answer is not one reconcile reads.
    #[error("{host}: the weights script's answer (exit {status}) cannot be read: {why}")]
    Answer {
        host: String,
        status: i32,
        why: String,
    },
    /// The fetch failed on the host; the old server was not touched.
    #[error("{host}: {failure}")]
    Fetch { host: String, failure: FetchFailure },
    /// The plan refuses the host's copy (too little disk, a copy that changed).
    #[error("{host}: {why}")]
    Refused { host: String, why: String },
    #[error("{host}: the fetch was interrupted: {why}")]
    Interrupted { host: String, why: String },
}

/// Runs `mode` for `spec` with `request` on stdin.
async fn run(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
    mode: &str,
    request: &serde_json::Value,
    limit: Duration,
) -> Result<Output, PinnedError> {
    let key = spec.key();
    let args = [
        mode,
        spec.root.as_str(),
        key.as_str(),
        spec.revision.as_str(),
    ];
    run_script(host, python, args, request, limit).await
}

/// Runs the script with `MODE ROOT KEY REVISION` and `request` on stdin, with the manifest's
/// Python behind the trust check; a Python root may not start is [`PinnedError::Untrusted`].
async fn run_script(
    host: &dyn Host,
    python: &str,
    args: [&str; 4],
    request: &serde_json::Value,
    limit: Duration,
) -> Result<Output, PinnedError> {
    let mut argv = isolated_python(python, WEIGHTS_SCRIPT).to_vec();
    argv.extend(args);
    let input = request.to_string();
    let out = host
        .run_within(&argv, Some(input.as_bytes()), limit)
        .await?;
    if reconcile_core::preflight::owners::untrusted(out.status, &out.stderr) || out.status == 100 {
        return Err(PinnedError::Untrusted {
            host: host.name().to_string(),
            python: python.to_string(),
            why: if out.status == 100 {
                "it is not an executable file".to_string()
            } else {
                out.stderr.trim().to_string()
            },
        });
    }
    Ok(out)
}

/// The answer of a script that exited 0, or its failure.
fn answer<T: DeserializeOwned>(host: &dyn Host, out: &Output) -> Result<T, PinnedError> {
    let unreadable = |why: String| PinnedError::Answer {
        host: host.name().to_string(),
        status: out.status,
        why,
    };
    let line = out.stdout.lines().rev().find(|l| l.starts_with('{'));
    let Some(line) = line else {
        return Err(unreadable(format!(
            "no answer; stderr: {}",
            out.stderr.trim()
        )));
    };
    if out.status != 0 {
        return Err(match serde_json::from_str::<FetchFailure>(line) {
            Ok(failure) => PinnedError::Fetch {
                host: host.name().to_string(),
                failure,
            },
            Err(e) => unreadable(format!("{e}: {line}")),
        });
    }
    serde_json::from_str(line).map_err(|e| unreadable(format!("{e}: {line}")))
}

/// The listing of `files` the script takes.
fn listing(files: &[&LockedFile]) -> serde_json::Value {
    json!(files
        .iter()
        .map(|f| json!({"path": f.path, "size": f.size, "sha256": f.sha256}))
        .collect::<Vec<_>>())
}

/// What `host` holds of `spec`'s revision, stat only.
pub async fn look(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
) -> Result<HostCopy, PinnedError> {
    let request = json!({"files": listing(&spec.files())});
    let out = run(host, python, spec, "look", &request, LOOK_LIMIT).await?;
    answer(host, &out)
}

/// The plan for `host`'s copy of `spec`'s revision.
pub async fn plan(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
) -> Result<CopyPlan, PinnedError> {
    let copy = look(host, python, spec).await?;
    Ok(judge(spec, &spec.files(), &copy))
}

/// Makes sure `host` holds `spec`'s revision, verified: fetched (resuming what an earlier fetch
/// left) when it does not. Nothing here touches a server: a failure leaves the old one serving.
/// `token` (the manifest's `HF_TOKEN`) travels on stdin.
pub async fn ensure(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
    token: Option<&str>,
    bar: Option<&ProgressBar>,
    cancel: &CancellationToken,
) -> Result<Option<Fetched>, PinnedError> {
    let planned = plan(host, python, spec).await?;
    match planned.holding {
        Holding::Verified => Ok(None),
        Holding::Refused { why } => Err(PinnedError::Refused {
            host: host.name().to_string(),
            why,
        }),
        Holding::Fetch { .. } => {
            let from = spec.fetch_base();
            fetch(host, python, spec, &from, token, bar, cancel)
                .await
                .map(Some)
        }
    }
}

/// Fetches `spec`'s revision to `host` from `from` (the source's base, or a peer's), every
/// file's hash checked, the copy made whole by one rename. `bar` shows bytes, rate and ETA, read
/// from the script's progress file each second.
pub async fn fetch(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
    from: &str,
    token: Option<&str>,
    bar: Option<&ProgressBar>,
    cancel: &CancellationToken,
) -> Result<Fetched, PinnedError> {
    let files = spec.files();
    let request = json!({
        "source": from,
        "token": token,
        "rate": spec.rate.unwrap_or(0),
        "files": listing(&files),
        "lock": LockedRevision::digest(&files),
    });
    if let Some(bar) = bar {
        bar.set_length(LockedRevision::bytes(&files));
    }
    // The other fetch's progress, and when it last moved.
    let mut other = (None, Instant::now());
    loop {
        let fetching = run(host, python, spec, "fetch", &request, TRANSFER_LIMIT);
        let out = tokio::select! {
            out = fetching => out?,
            () = watch(host, spec, bar) => unreachable!("watch never ends"),
            () = cancel.cancelled() => {
                return Err(PinnedError::Interrupted {
                    host: host.name().to_string(),
                    why: "a signal stopped the apply; the next apply resumes the fetch".into(),
                })
            }
        };
        match answer::<Fetched>(host, &out) {
            // A fetch its controller left still holds the revision for a moment.
            Err(PinnedError::Fetch {
                failure: FetchFailure::Busy,
                ..
            }) if other.1.elapsed() < BUSY_WAIT => {
                tokio::time::sleep(PROGRESS_EVERY).await;
                let done = progress(host, spec).await.map(|p| p.done);
                if done != other.0 {
                    other = (done, Instant::now());
                }
            }
            result => {
                if let (Ok(fetched), Some(bar)) = (&result, bar) {
                    bar.set_position(fetched.fetched + fetched.resumed);
                }
                return result;
            }
        }
    }
}

/// Reads the fetch's progress into `bar` every second; never ends (the fetch's end ends it).
async fn watch(host: &dyn Host, spec: &PinnedModel, bar: Option<&ProgressBar>) {
    let Some(bar) = bar else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(PROGRESS_EVERY).await;
        if let Some(p) = progress(host, spec).await {
            bar.set_position(p.done);
        }
    }
}

/// A running fetch's progress file, when there is one that reads.
async fn progress(host: &dyn Host, spec: &PinnedModel) -> Option<FetchProgress> {
    let file = format!(
        "{}/{}/.{}.progress",
        spec.root.trim_end_matches('/'),
        spec.key(),
        spec.revision
    );
    let out = host
        .run_within(&["cat", "--", &file], None, LOOK_LIMIT)
        .await
        .ok()?;
    serde_json::from_str(out.stdout.trim()).ok()
}

/// The report's note for a fetch: bytes, time and rate.
pub fn fetched_note(f: &Fetched) -> String {
    let resumed = if f.resumed > 0 {
        format!(", {} of it already there", human_bytes(f.resumed))
    } else {
        String::new()
    };
    format!(
        "weights: fetched {} in {:.1} s ({}/s){resumed}, every file's sha256 checked",
        human_bytes(f.fetched),
        f.seconds,
        human_bytes(f.rate() as u64)
    )
}

/// A host serving its verified copy of a revision to its peers (`peers:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeder {
    pub host: String,
    /// The transient service that serves it.
    pub unit: String,
    /// The base URL peers fetch the files from.
    pub url: String,
}

/// Starts serving `host`'s verified copy of `spec`'s revision to its peers on `port`: Python's
/// own `http.server` (the standard library, `-I -S`) as a transient service of a user of its own
/// (`DynamicUser=`), read-only, bound to the host's first address, stopped by [`unseed`] or after
/// six hours whatever happens to this run.
pub async fn seed(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
    port: u16,
) -> Result<Seeder, PinnedError> {
    let addresses = host.run_ok(&["hostname", "-I"]).await?;
    let address = addresses
        .split_whitespace()
        .next()
        .ok_or_else(|| PinnedError::Answer {
            host: host.name().to_string(),
            status: 0,
            why: "`hostname -I` lists no address to serve peers on".into(),
        })?
        .to_string();
    // Named by its port: one left on the port by a run that died, whatever it served, is
    // replaced.
    let unit = format!("reconcile-seed-{port}.service");
    let _ = host.run(&["systemctl", "stop", "--", &unit]).await;
    let _ = host.run(&["systemctl", "reset-failed", "--", &unit]).await;
    let dir = spec.pinned_dir();
    let port_text = port.to_string();
    let argv = [
        "systemd-run",
        "--quiet",
        "--collect",
        "--service-type=exec",
        "--unit",
        &unit,
        "-p",
        "DynamicUser=yes",
        "-p",
        "ProtectSystem=strict",
        "-p",
        "ProtectHome=yes",
        "-p",
        "PrivateTmp=yes",
        "-p",
        "NoNewPrivileges=yes",
        "-p",
        "RuntimeMaxSec=6h",
        "--",
        python,
        "-I",
        "-S",
        "-m",
        "http.server",
        "--bind",
        &address,
        "--directory",
        &dir,
        &port_text,
    ];
    host.run_ok(&argv).await?;
    // Told to peers only once it listens: a peer that refuses a connection is not asked again.
    host.run_ok(&["sh", "-c", LISTENING, "sh", &port_text])
        .await?;
    let shown = if address.contains(':') {
        format!("[{address}]")
    } else {
        address
    };
    Ok(Seeder {
        host: host.name().to_string(),
        unit,
        url: format!("http://{shown}:{port}"),
    })
}

/// Waits up to 5 s for a TCP listener on port `$1`.
const LISTENING: &str = r#"for _ in $(seq 50); do ss -Hltn "sport = :$1" | grep -q . && exit 0; sleep 0.1; done; echo "nothing listens on port $1" >&2; exit 1"#;

/// Stops a [`seed`]ed copy's service.
pub async fn unseed(host: &dyn Host, unit: &str) -> Result<(), PinnedError> {
    host.run_ok(&["systemctl", "stop", "--", unit]).await?;
    Ok(())
}

/// Once the revision is confirmed: marks it used, and removes the revisions `keep` no longer
/// keeps (never one a unit file still names). Returns those removed.
pub async fn confirm(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
) -> Result<Vec<String>, PinnedError> {
    let out = run(host, python, spec, "used", &json!({}), LOOK_LIMIT).await?;
    answer::<serde_json::Value>(host, &out)?;
    let planned = plan(host, python, spec).await?;
    if planned.remove.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(serde::Deserialize)]
    struct Removed {
        removed: Vec<String>,
    }
    let request = json!({"revisions": planned.remove});
    let out = run(host, python, spec, "remove", &request, LOOK_LIMIT).await?;
    Ok(answer::<Removed>(host, &out)?.removed)
}

/// Every file of the host's copy hashed against the lock (`status --verify-weights`).
pub async fn verify(
    host: &dyn Host,
    python: &str,
    spec: &PinnedModel,
) -> Result<Vec<Differ>, PinnedError> {
    #[derive(serde::Deserialize)]
    struct Verified {
        differ: Vec<Differ>,
    }
    let request = json!({"files": listing(&spec.files())});
    let out = run(host, python, spec, "verify", &request, TRANSFER_LIMIT).await?;
    Ok(answer::<Verified>(host, &out)?.differ)
}

/// Every file of a store folder on `host`, hashed, for the lock file.
pub async fn hash_store(
    host: &dyn Host,
    python: &str,
    path: &str,
) -> Result<Vec<LockedFile>, PinnedError> {
    let args = ["hash", path, "-", "-"];
    let out = run_script(host, python, args, &json!({}), TRANSFER_LIMIT).await?;
    #[derive(serde::Deserialize)]
    struct Hashed {
        files: Vec<LockedFile>,
    }
    Ok(answer::<Hashed>(host, &out)?.files)
}
