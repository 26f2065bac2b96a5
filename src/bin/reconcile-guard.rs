//! `reconcile-guard`: the host's guard over one apply of one unit (`reconcile_core::guard`).
//!
//! `apply` copies this program to the host (root's, 0700, named by its sha256) and runs it as a
//! unit of its own, enabled, so that it outlives the machine that ran apply and a reboot of the
//! host. It is small on purpose: root runs it, so it links only the pure core and the standard
//! library, reads what it judges by, and carries out what `reconcile_core::guard::judge` decides.
//! Every decision reads and writes `guard.json` under an flock on `guard.lock`, the one lock the
//! controller's commands take too: of the two, exactly one acts.
//!
//! Usage: reconcile-guard COMMAND DIR [RUN]
//!   watch DIR         wait, then judge and act (the guard's unit runs this)
//!   renew DIR RUN     the controller is alive: the lease pushed out by the margin
//!   take DIR RUN      the controller begins its own rollback; the guard finishes it if the
//!                     controller dies. Prints the state found
//!   telling DIR RUN   the controller tells the running server a live change (or tells it
//!                     back). Prints the state found
//!   told DIR RUN      the running server took the live change. Prints the state found
//!   disarm DIR RUN    the controller is done. Prints the state found
//! A command of a run other than the one that armed the guard is refused (exit status 3).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use reconcile_core::guard::{judge, Facts, GuardState, Record, Then, Verdict};
use reconcile_core::unit_files::Moved;

/// How often the watch looks.
const POLL: Duration = Duration::from_secs(1);
/// How long one /health may take: SGLang answers it after a one-token generation, up to
/// SGLANG_HEALTH_CHECK_TIMEOUT (20 s) on a busy server.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(25);
/// systemd's D-Bus calls give up after 25 s (sd-bus's default method timeout): a `systemctl show`
/// that has not answered in 30 s is wedged. The guard reads it holding its lock, which the
/// controller's renewals wait on: it looks again at the next poll rather than wait on.
const SHOW_TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, dir, run) = match args.as_slice() {
        [c, d] if c == "watch" => (c.as_str(), PathBuf::from(d), ""),
        [c, d, r] => (c.as_str(), PathBuf::from(d), r.as_str()),
        _ => {
            eprintln!("usage: reconcile-guard watch DIR | renew|take|telling|told|disarm DIR RUN");
            return ExitCode::from(2);
        }
    };
    let outcome = match command {
        "watch" => watch(&dir).map(|()| None),
        "renew" => locked(&dir, |g| {
            let t = now();
            let file = on_disk(g);
            g.command_in_boot(run, t, &boot_id(), file.as_deref())?;
            // What runs, seen now rather than at the next poll: a controller about to put the
            // file back reads whether the new unit started meanwhile.
            if let Some(seen) = facts(g) {
                g.saw(&seen);
            }
            Ok(g.renew(run, t)?)
        })
        .map(Some),
        "take" => locked(&dir, |g| {
            let t = now();
            let file = on_disk(g);
            g.command_in_boot(run, t, &boot_id(), file.as_deref())?;
            // Unread (systemd wedged): none counted before, so the guard finishes the rollback
            // should the controller die, as the controller meant to.
            let restarts = facts(g).map(|f| f.restarts);
            Ok(g.take(run, t, restarts)?)
        })
        .map(Some),
        "telling" => locked(&dir, |g| {
            let file = on_disk(g);
            g.command_in_boot(run, now(), &boot_id(), file.as_deref())?;
            Ok(g.telling(run)?)
        })
        .map(Some),
        "told" => locked(&dir, |g| {
            let file = on_disk(g);
            g.command_in_boot(run, now(), &boot_id(), file.as_deref())?;
            Ok(g.told(run)?)
        })
        .map(Some),
        "disarm" => locked(&dir, |g| Ok(g.disarm(run, &utc())?)).map(Some),
        other => Err(Error::Usage(other.to_string())),
    };
    match outcome {
        Ok(found) => {
            if let Some(state) = found {
                println!("{}", state.name());
            }
            ExitCode::SUCCESS
        }
        Err(e @ Error::OtherRun(_)) => {
            eprintln!("reconcile-guard: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("reconcile-guard: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("unknown command {0}")]
    Usage(String),
    #[error(transparent)]
    OtherRun(#[from] reconcile_core::guard::judge::OtherRun),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("systemctl {args}: {stderr}")]
    Systemctl { args: String, stderr: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `work` on guard.json under the guard's flock; the record written back (whole, then renamed)
/// when it changed.
fn locked<T>(dir: &Path, work: impl FnOnce(&mut Record) -> Result<T, Error>) -> Result<T, Error> {
    let lock_path = dir.join("guard.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    lock.lock().map_err(io(&lock_path))?;
    let path = dir.join("guard.json");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let mut record: Record = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    let before = record.clone();
    let out = work(&mut record);
    if record != before {
        let json = serde_json::to_string_pretty(&record).expect("the record serializes") + "\n";
        write(&path, json.as_bytes(), 0o600)?;
    }
    out
}

/// Replaces `path` whole: a temporary file beside it, renamed over it.
fn write(path: &Path, content: &[u8], mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".reconcile-tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(content).map_err(io(&tmp))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// The host's monotonic clock, in seconds: the one systemd's `*TimestampMonotonic` reads.
fn now() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn utc() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `systemctl ARGS`, given up on past `limit` (killed): its status and output, or `None`.
fn systemctl(args: &[&str], limit: Option<Duration>) -> Option<std::process::Output> {
    let mut child = Command::new("systemctl")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    if let Some(limit) = limit {
        let until = Instant::now() + limit;
        while child.try_wait().ok()?.is_none() {
            if Instant::now() >= until {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    child.wait_with_output().ok()
}

fn must(args: &[&str]) -> Result<(), Error> {
    let out = systemctl(args, None);
    match out {
        Some(o) if o.status.success() => Ok(()),
        other => Err(Error::Systemctl {
            args: args.join(" "),
            stderr: other.map_or("did not run".into(), |o| {
                String::from_utf8_lossy(&o.stderr).trim().to_string()
            }),
        }),
    }
}

/// What the guard judges by: the unit file, systemd's view of the unit; `None` when systemd did
/// not answer in [`SHOW_TIMEOUT`].
/// sha256 of the unit file on disk; `None` when there is none.
fn on_disk(guard: &Record) -> Option<String> {
    use sha2::{Digest, Sha256};
    std::fs::read(&guard.unit_path)
        .ok()
        .map(|b| format!("{:x}", Sha256::digest(&b)))
}

fn facts(guard: &Record) -> Option<Facts> {
    let sha256 = on_disk(guard);
    let props = "ActiveState,SubState,NRestarts,InactiveExitTimestampMonotonic,NeedDaemonReload";
    let out = systemctl(
        &["show", "-p", props, "--", &guard.unit],
        Some(SHOW_TIMEOUT),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let shown = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("")
            .to_string()
    };
    Some(Facts {
        sha256,
        active: shown("ActiveState"),
        sub: shown("SubState"),
        restarts: shown("NRestarts").parse().unwrap_or(0),
        entered: shown("InactiveExitTimestampMonotonic")
            .parse::<f64>()
            .unwrap_or(0.0)
            / 1e6,
        stale: shown("NeedDaemonReload") == "yes",
        written: written(&guard.unit_path),
    })
}

/// When `path` was last written (its mtime), on the monotonic clock [`now`] reads: how long ago,
/// by the wall clock, taken from now. `None` when it cannot be read.
fn written(path: &str) -> Option<f64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let ago = std::time::SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default();
    Some(now() - ago.as_secs_f64())
}

/// `/health`'s status code, or `None` when nothing answered in [`HEALTH_TIMEOUT`]. The URL is
/// the one apply wrote: `http://ADDRESS:PORT/health`, an IPv6 address in brackets.
fn health(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let address = authority.to_socket_addrs().ok()?.next()?;
    let mut stream = TcpStream::connect_timeout(&address, HEALTH_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(HEALTH_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(HEALTH_TIMEOUT)).ok()?;
    let path = if path.is_empty() { "/" } else { path };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    // The status line is all the guard reads: `HTTP/1.1 200 OK`.
    let mut head = [0u8; 64];
    let mut read = 0;
    while read < 12 {
        match stream.read(&mut head[read..]).ok()? {
            0 => break,
            n => read += n,
        }
    }
    let line = std::str::from_utf8(&head[..read]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn put_back_aside(guard: &Record) -> Result<(), Error> {
    let Some(aside) = &guard.aside else {
        return Ok(());
    };
    let path = Path::new(aside);
    // The record is named at arming and written before any file moves: none means none moved.
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        read => read.map_err(io(path))?,
    };
    let files: Vec<Moved> = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    for moved in files {
        let target = Path::new(&moved.path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        if target.symlink_metadata().is_ok() {
            std::fs::remove_file(target).map_err(io(target))?;
        }
        if moved.mask {
            std::os::unix::fs::symlink("/dev/null", target).map_err(io(target))?;
        } else {
            // The mode it had when moved (records from before kept none: 0644).
            let mode = moved
                .mode
                .as_deref()
                .and_then(|m| u32::from_str_radix(m, 8).ok())
                .unwrap_or(0o644);
            write(target, moved.text.as_bytes(), mode)?;
        }
    }
    Ok(())
}

/// The previous unit file back (or the new one removed where the unit beneath comes back), with
/// the files moved aside, and systemd reloaded.
fn previous_files_back(guard: &Record) -> Result<(), Error> {
    let path = Path::new(&guard.unit_path);
    match &guard.previous {
        Some(kept) => {
            let kept = Path::new(kept);
            let text = std::fs::read(kept).map_err(io(kept))?;
            write(path, &text, 0o644)?;
        }
        None if path.symlink_metadata().is_ok() => {
            std::fs::remove_file(path).map_err(io(path))?;
        }
        None => {}
    }
    put_back_aside(guard)?;
    must(&["daemon-reload"])?;
    if guard.disable {
        must(&["disable", "--", &guard.unit])?;
    }
    Ok(())
}

/// apply's rollback (src/apply/restore.rs), on the host: the previous unit back, the files moved
/// aside back, then restarted or left stopped as it was.
fn restore(guard: &Record) -> Result<&'static str, Error> {
    let unit = guard.unit.as_str();
    if guard.previous.is_none() && !guard.beneath {
        let _ = systemctl(&["disable", "--now", "--", unit], None);
        let path = Path::new(&guard.unit_path);
        if path.symlink_metadata().is_ok() {
            std::fs::remove_file(path).map_err(io(path))?;
        }
        put_back_aside(guard)?;
        must(&["daemon-reload"])?;
        let _ = systemctl(&["reset-failed", "--", unit], None);
        return Ok("the new unit was stopped, disabled and removed");
    }
    previous_files_back(guard)?;
    match guard.then {
        Then::Restart => {
            must(&["restart", "--", unit])?;
            Ok("the previous unit was restored and restarted")
        }
        Then::Stop => {
            must(&["stop", "--", unit])?;
            Ok("the previous unit was restored and left stopped, as it was")
        }
    }
}

fn watch(dir: &Path) -> Result<(), Error> {
    locked(dir, |g| {
        // Times are the host's monotonic clock, read here: the controller's clock may differ.
        let file = on_disk(g);
        g.start_watch(now(), &boot_id(), file.as_deref());
        // What runs is seen at once, not a poll later: after a boot, a run after a dead one
        // reads whether the new unit started.
        if let Some(seen) = facts(g) {
            g.saw(&seen);
        }
        Ok(())
    })?;
    loop {
        std::thread::sleep(POLL);
        let done = locked(dir, |g| {
            if !g.watching() {
                return Ok(true);
            }
            let Some(seen) = facts(g) else {
                return Ok(false);
            };
            g.saw(&seen);
            let url = g.health_url.clone();
            let (verdict, why) = judge(g, &seen, now(), || health(&url));
            match verdict {
                Verdict::Wait => Ok(false),
                Verdict::PutBack => {
                    match previous_files_back(g) {
                        Ok(()) => g.put_back(
                            &why,
                            "its previous file was put back; the server was left running",
                            &utc(),
                        ),
                        Err(e) => g.settle(
                            GuardState::RollbackFailed,
                            &format!("{why}; putting the previous file back failed: {e}"),
                            &utc(),
                        ),
                    }
                    Ok(true)
                }
                Verdict::Restore => {
                    g.begin_restore(&why, now());
                    match restore(g) {
                        Ok(did) => {
                            let after = facts(g);
                            g.restore_returned(did, after.as_ref());
                            Ok(false)
                        }
                        Err(e) => {
                            let began = g.watch.why.clone().unwrap_or_default();
                            g.settle(
                                GuardState::RollbackFailed,
                                &format!("{began}; the rollback failed: {e}"),
                                &utc(),
                            );
                            Ok(true)
                        }
                    }
                }
                settles => {
                    g.settle_on(settles, &why, &utc());
                    Ok(true)
                }
            }
        })?;
        if done {
            return Ok(());
        }
    }
}
