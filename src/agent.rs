//! `reconcile agent`: pull mode. Runs on the GPU host itself, keeps its own checkout of the
//! manifests' git repository, and applies the units whose host is `local` or one of this machine's
//! names, through apply's own path with the host treated as this machine (no SSH). A fleet then
//! needs no central machine that can reach every host.
//!
//! Each round: fetch and hard-reset the checkout to the branch, load every manifest (any error:
//! report it and touch nothing, like `apply`), and apply this host's units. A round whose commit
//! and host need nothing touches nothing, because apply leaves a unit with no change alone.
//!
//! The agent prints nothing itself: what each round comes to is an [`Event`], handed to the
//! printer the face passes in (`report::agent` words them).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::apply::{self, ApplyOptions, GitInfo, LockPolicy, Outcome, Owner, Rollout, UnitReport};
use crate::coordinator::{self, Coordination, CoordinatorOptions, Link};
use crate::manifest::ManifestErrors;
use crate::redact::Redactor;
use crate::remote::{error_chain, Limits, Local};
use crate::rollout::overview::Newest;
use crate::targets::{self, Target};

/// A fetch of a manifests repository is small; longer than this is a hung server or network, and
/// an interval agent must not wait on it forever.
const GIT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("`git {command}` could not start (is git installed and on PATH?)")]
    GitMissing {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`git {command}` exited with {status}: {stderr}")]
    Git {
        command: String,
        status: i32,
        stderr: String,
    },
    #[error("`git {command}` took longer than {}s and was stopped", GIT_TIMEOUT.as_secs())]
    GitTimeout { command: String },
    #[error("{0} exists and is not a git checkout: the agent only resets a checkout it cloned itself; remove it or pass another --checkout")]
    NotACheckout(String),
    #[error("cannot create the checkout's folder {path}")]
    CheckoutDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--path {0}: must be a folder or file inside the checkout (relative, without `..`)")]
    PathOutside(String),
    #[error("--repo and --branch must not start with `-`")]
    Dash,
}

/// `reconcile agent`'s options, as the command line gave them.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The manifests' git repository: a URL git can clone or a path.
    pub repo: String,
    /// The branch whose newest commit is applied.
    pub branch: String,
    /// The agent's own checkout.
    pub checkout: PathBuf,
    /// Manifest files or folders, relative to the checkout.
    pub paths: Vec<PathBuf>,
    /// The `--as` names of this machine.
    pub names: Vec<String>,
    /// One round, then exit.
    pub once: bool,
    /// Time between rounds when not `once`.
    pub interval: Duration,
    /// Warnings count as errors.
    pub strict: bool,
    /// Preflight's deep check.
    pub deep: bool,
    pub lock: LockPolicy,
    /// Roll out together with the other hosts' agents through this coordinator; `None`: each
    /// agent applies alone, as soon as it sees a commit.
    pub coordinator: Option<CoordinatorOptions>,
    /// The coordination benchmark's stand-in for applying (`bench/agents.sh`); `None` applies.
    pub drill: Option<Drill>,
    /// Where to write this machine's units' metrics after every round that applied, for
    /// node_exporter's textfile collector (`--metrics-file`).
    pub metrics_file: Option<PathBuf>,
}

/// A round whose units are not applied: each counts as needing `need`, a restart is a sleep of
/// `restart` (its start and end written to `log`, for the benchmark to count the overlap), and the
/// round ends by telling what coordinating cost. Only the coordination is real.
#[derive(Debug, Clone)]
pub struct Drill {
    pub need: apply::Need,
    pub restart: Duration,
    pub log: Option<PathBuf>,
}

/// What a round tells, as it happens.
#[derive(Debug)]
pub enum Event<'a> {
    /// A warning about the checkout's manifests, as they load.
    Warning(String),
    /// The checkout could not be updated; nothing was touched. Both texts are free of credentials.
    SyncFailed { repo: String, error: String },
    /// The manifests at `commit` do not load; nothing was touched.
    BadManifests {
        commit: &'a str,
        errors: &'a ManifestErrors,
    },
    /// No unit of the manifests at `commit` is for this machine (`names`).
    NoUnits {
        commit: &'a str,
        names: &'a [String],
    },
    /// What the coordination of a unit does (waiting for the canary or a slot, holding back).
    Coordination(String),
    /// This machine's units at `commit` were applied.
    Applied {
        commit: &'a str,
        author: &'a str,
        reports: &'a [UnitReport],
    },
}

/// The commit a round applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub commit: String,
    pub author: String,
}

/// `reconcile agent`: one round with `--once` (its exit code is apply's), else a round every
/// `--interval` until SIGTERM or Ctrl-C, then exit 0: a failed round is reported and the next one
/// runs, and being stopped is not a failure of the service. Commands on this machine run under
/// `limits`; what the rounds come to goes to `print`.
pub async fn run(options: AgentOptions, limits: Limits, print: &dyn Fn(Event<'_>)) -> u8 {
    let stop = crate::signals::stop_on_signal();
    let names = local_names(&options.names);
    // A name any round's manifests declared secret stays hidden for the life of the process, even
    // after a later commit drops it from `secret_env`: its value may still be in a journal.
    let mut redactor = Redactor::default();
    let link = options.coordinator.clone().map(Link::new);
    let here = Here {
        options: &options,
        names: &names,
        stop: &stop,
        limits,
        print,
        link: link.as_ref(),
    };
    loop {
        let code = round(&here, &mut redactor).await;
        if options.once {
            return code;
        }
        let slept = tokio::time::sleep(options.interval);
        if stop.run_until_cancelled(slept).await.is_none() {
            return 0;
        }
    }
}

/// What every round works with: the options, this machine's names, the stop signal, the limits on
/// its commands and the printer.
struct Here<'a> {
    options: &'a AgentOptions,
    names: &'a [String],
    stop: &'a CancellationToken,
    limits: Limits,
    print: &'a dyn Fn(Event<'_>),
    /// The coordinator, when the agent rolls out with the others.
    link: Option<&'a Link>,
}

/// The host names this machine answers to in manifests: `local`, and the `--as` names or, without
/// them, its short hostname.
fn local_names(wanted: &[String]) -> Vec<String> {
    let mut names = vec!["local".to_string()];
    if wanted.is_empty() {
        if let Some(name) = short_hostname() {
            names.push(name);
        }
    } else {
        names.extend(wanted.iter().cloned());
    }
    names
}

fn short_hostname() -> Option<String> {
    let full = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let short = full.trim().split('.').next()?.to_string();
    (!short.is_empty()).then_some(short)
}

/// One round: tells the commit and every unit's outcome (the printer adds the details of units
/// that changed or failed), and returns apply's exit code for it.
async fn round(here: &Here<'_>, redactor: &mut Redactor) -> u8 {
    let print = here.print;
    let revision = match sync(here.options).await {
        Ok(r) => r,
        Err(e) => {
            print(Event::SyncFailed {
                repo: redact_url(&here.options.repo),
                error: redact_url(&error_chain(&e)),
            });
            return 1;
        }
    };
    let commit = revision.commit.as_str();
    let (targets, all) = match targets_here(here, redactor) {
        Ok(t) => t,
        Err(errors) => {
            print(Event::BadManifests {
                commit,
                errors: &errors,
            });
            return 1;
        }
    };
    if targets.is_empty() {
        print(Event::NoUnits {
            commit,
            names: here.names,
        });
        return 0;
    }
    let options = apply_options(here, &revision, redactor);
    let reports = match (here.link, &here.options.drill) {
        (Some(link), _) => coordinated_here(here, link, &revision, &targets, &all, &options).await,
        // The benchmark's baseline: the same round, uncoordinated.
        (None, Some(drill)) => {
            let mut reports = Vec::new();
            for t in &targets {
                reports.push(match drill.need {
                    apply::Need::Nothing => apply::unchanged(t, std::time::Instant::now()),
                    _ => drill_restart(t, drill).await,
                });
            }
            reports
        }
        (None, None) => apply_here(&targets, &options, here.limits).await,
    };
    print(Event::Applied {
        commit,
        author: &revision.author,
        reports: &reports,
    });
    if let Some(path) = &here.options.metrics_file {
        if let Err(e) = write_metrics(path, &targets, &reports, redactor, here.limits).await {
            print(Event::Warning(format!(
                "the metrics could not be written to {}: {e}",
                path.display()
            )));
        }
    }
    reports
        .iter()
        .map(|r| r.outcome.exit_code())
        .max()
        .unwrap_or(0)
}

/// Apply's options for a round: as the agent's own user, recorded with the round's commit.
fn apply_options(here: &Here<'_>, revision: &Revision, redactor: &Redactor) -> ApplyOptions {
    let owner = Owner {
        user: "reconcile-agent".into(),
        ..Owner::this_process()
    };
    ApplyOptions::new(
        owner,
        here.options.lock,
        here.stop.clone(),
        redactor.clone(),
    )
    .git(GitInfo {
        commit: Some(revision.commit.clone()),
        author: Some(revision.author.clone()),
    })
    .deep(here.options.deep)
    // One host: there is nothing to roll out over.
    .rollout(Rollout {
        canary: 0,
        max_parallel: 1,
        max_failures: 1,
        rollback_all: false,
    })
}

/// The manifests of the checkout, loaded whole (an error anywhere stops the round, as it stops
/// `apply`), kept to the units whose host is this machine. `redactor` takes in the names they
/// declare secret, loaded or not.
/// The second list is every host's units, which the coordinator's rollout is over.
fn targets_here(
    here: &Here<'_>,
    redactor: &mut Redactor,
) -> Result<(Vec<Target>, Vec<Target>), ManifestErrors> {
    let args = here.options;
    let warn = |w: &dyn std::fmt::Display| (here.print)(Event::Warning(w.to_string()));
    let paths: Vec<PathBuf> = args.paths.iter().map(|p| args.checkout.join(p)).collect();
    let loaded = crate::load::load(&paths, args.strict).map_err(|failed| {
        for w in &failed.warnings {
            warn(w);
        }
        redactor.extend(&failed.redactor);
        failed.errors
    })?;
    redactor.extend(&loaded.redactor);
    for w in &loaded.warnings {
        warn(w);
    }
    // `targets` fails only for a host the filter names that no manifest has; this filter names none.
    let all = targets::targets(&loaded.manifests, &targets::Filter::default())
        .expect("no filter names a host");
    let mine = all
        .iter()
        .filter(|t| here.names.contains(&t.host))
        .cloned()
        .collect();
    Ok((mine, all))
}

/// This machine's units' metrics after a round (`reconcile_core::metrics`), as node_exporter's
/// textfile collector reads them: written to a temporary file beside `path` and renamed over it,
/// so the collector never reads half a file (it reads `*.prom` only, and the temporary name does
/// not end so).
async fn write_metrics(
    path: &std::path::Path,
    targets: &[Target],
    reports: &[UnitReport],
    redactor: &Redactor,
    limits: Limits,
) -> std::io::Result<()> {
    let statuses = crate::status::status_host(
        &Local::new(limits),
        targets,
        redactor,
        crate::status::WeightsCheck::Sizes,
    )
    .await;
    let outcomes: Vec<(String, String, Outcome)> = reports
        .iter()
        .map(|r| (r.host.clone(), r.unit.clone(), r.outcome))
        .collect();
    let text = crate::status::metrics(&statuses, &outcomes);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Applies each unit on this machine in turn, through apply's own path; none starts once the
/// agent is stopping.
async fn apply_here(targets: &[Target], options: &ApplyOptions, limits: Limits) -> Vec<UnitReport> {
    apply::apply_units(
        &Local::new(limits),
        targets,
        options,
        "the agent is stopping",
    )
    .await
}

/// Applies each unit on this machine in turn, each when the coordinator gives it its turn (see
/// `coordinator::coordinated`): the service's change is named by the units it renders for all of
/// its hosts, its canary and limits come from its manifest's `rollout:`.
async fn coordinated_here(
    here: &Here<'_>,
    link: &Link,
    revision: &Revision,
    targets: &[Target],
    all: &[Target],
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let host = Local::new(here.limits);
    let say = |text: String| (here.print)(Event::Coordination(text));
    let mut reports = Vec::new();
    for t in targets {
        if here.stop.is_cancelled() {
            // Stopping: apply's own path reports the unit as not started.
            reports.extend(apply_here(std::slice::from_ref(t), options, here.limits).await);
            continue;
        }
        // The rollout is over every host of the unit's service, not only this one.
        let service: Vec<&Target> = all
            .iter()
            .filter(|o| o.manifest.service == t.manifest.service)
            .collect();
        let newest = Newest::of(&service).expect("the unit's own target is among them");
        let order: Vec<&str> = newest.order.iter().map(String::as_str).collect();
        let coordination = Coordination {
            link,
            revision: &newest.revision,
            commit: &revision.commit,
            order: &order,
            policy: Rollout::resolve(&Default::default(), t.manifest.rollout.as_ref()),
            stop: here.stop,
            say: &say,
            redactor: &options.redactor,
        };
        let report = match &here.options.drill {
            None => {
                let need = apply::need(&host, t, options).await;
                coordinator::coordinated(&coordination, t, need, || async {
                    apply_here(std::slice::from_ref(t), options, here.limits)
                        .await
                        .pop()
                        .expect("one report per unit")
                })
                .await
            }
            Some(drill) => {
                coordinator::coordinated(&coordination, t, drill.need, || drill_restart(t, drill))
                    .await
            }
        };
        reports.push(report);
    }
    if here.options.drill.is_some() {
        if let Some((requests, took)) = link.spent().await {
            say(format!(
                "drill: {requests} requests to the coordinator, {:.2} ms in them",
                took.as_secs_f64() * 1000.0
            ));
        }
    }
    reports
}

/// A drill's restart: a sleep, with its start and end (unix nanoseconds) appended to the log.
async fn drill_restart(t: &Target, drill: &Drill) -> UnitReport {
    let nanos = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    };
    let began = nanos();
    tokio::time::sleep(drill.restart).await;
    let ended = nanos();
    if let Some(log) = &drill.log {
        use std::io::Write;
        // One short append per restart: whole lines, even with many agents writing at once.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{} {began} {ended}", t.host);
        }
    }
    apply::refused(
        &t.host,
        &t.desired.unit,
        &t.source,
        apply::Outcome::Converged,
        "drill: restart simulated".into(),
    )
}

/// Brings the checkout to the branch's newest commit: cloned when missing, else fetched and hard
/// reset, and cleaned of anything git does not track (the checkout is the agent's own, so nothing
/// there is anyone's work).
pub async fn sync(args: &AgentOptions) -> Result<Revision, AgentError> {
    refuse_unsafe(args)?;
    let checkout = args.checkout.as_path();
    if checkout.join(".git").exists() {
        update(checkout, args).await?;
    } else {
        clone(checkout, args).await?;
    }
    let commit = git(Some(checkout), &args_of(&["rev-parse", "HEAD"])).await?;
    let author = git(
        Some(checkout),
        &args_of(&["log", "-1", "--format=%an <%ae>"]),
    )
    .await?;
    Ok(Revision {
        commit: commit.trim().to_string(),
        author: author.trim().to_string(),
    })
}

/// A repository or branch git would read as an option, and a `--path` that leaves the checkout.
fn refuse_unsafe(args: &AgentOptions) -> Result<(), AgentError> {
    if args.repo.starts_with('-') || args.branch.starts_with('-') {
        return Err(AgentError::Dash);
    }
    for p in &args.paths {
        let inside = p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
        if !inside {
            return Err(AgentError::PathOutside(p.display().to_string()));
        }
    }
    Ok(())
}

/// An existing checkout: fetched, hard reset to the branch and cleaned.
async fn update(checkout: &Path, args: &AgentOptions) -> Result<(), AgentError> {
    let remote_ref = format!("refs/remotes/origin/{}", args.branch);
    let repo = OsStr::new(&args.repo);
    // The URL may have changed since the clone (a new --repo).
    git(
        Some(checkout),
        &[
            "remote".as_ref(),
            "set-url".as_ref(),
            "origin".as_ref(),
            repo,
        ],
    )
    .await?;
    let refspec = format!("+refs/heads/{}:{remote_ref}", args.branch);
    git(
        Some(checkout),
        &args_of(&[
            "fetch",
            "--quiet",
            "--prune",
            "--no-tags",
            "origin",
            &refspec,
        ]),
    )
    .await?;
    git(
        Some(checkout),
        &args_of(&["reset", "--quiet", "--hard", &remote_ref]),
    )
    .await?;
    git(Some(checkout), &args_of(&["clean", "-ffdxq"])).await?;
    Ok(())
}

/// No checkout yet: the branch cloned, into a folder that must be empty or missing.
async fn clone(checkout: &Path, args: &AgentOptions) -> Result<(), AgentError> {
    let occupied = checkout
        .read_dir()
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    if occupied {
        return Err(AgentError::NotACheckout(checkout.display().to_string()));
    }
    if let Some(parent) = checkout.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    git(
        None,
        &[
            "clone".as_ref(),
            "--quiet".as_ref(),
            "--no-tags".as_ref(),
            "--single-branch".as_ref(),
            "--branch".as_ref(),
            args.branch.as_ref(),
            "--".as_ref(),
            args.repo.as_ref(),
            checkout.as_os_str(),
        ],
    )
    .await?;
    Ok(())
}

fn args_of<'a>(args: &'a [&'a str]) -> Vec<&'a OsStr> {
    args.iter().map(OsStr::new).collect()
}

/// The checkout's parent (by default /var/lib/reconcile/agent) holds nothing but it; the
/// manifests may name secrets' env names and hosts, so it is readable by root only.
fn create_private_dir(dir: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| AgentError::CheckoutDir {
            path: dir.display().to_string(),
            source,
        })
}

/// Runs git with arguments (never a shell string), without a terminal to prompt on.
async fn git(dir: Option<&Path>, args: &[&OsStr]) -> Result<String, AgentError> {
    let command = redact_url(
        &args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
    );
    let mut git = tokio::process::Command::new("git");
    if let Some(dir) = dir {
        git.arg("-C").arg(dir);
    }
    git.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = git.spawn().map_err(|source| AgentError::GitMissing {
        command: command.clone(),
        source,
    })?;
    let out = match tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output()).await {
        Err(_) => return Err(AgentError::GitTimeout { command }),
        Ok(Err(source)) => return Err(AgentError::GitMissing { command, source }),
        Ok(Ok(out)) => out,
    };
    if !out.status.success() {
        return Err(AgentError::Git {
            command,
            status: out.status.code().unwrap_or(-1),
            stderr: redact_url(String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Hides the credentials of a URL such as `https://user:token@host/repo.git` wherever one appears
/// in a message (git repeats the URL in its own errors).
fn redact_url(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '/' || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("<redacted>");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_hidden() {
        assert_eq!(
            redact_url("fatal: unable to access 'https://bot:ghp_abc@github.com/o/r.git/': 403"),
            "fatal: unable to access 'https://<redacted>@github.com/o/r.git/': 403"
        );
        assert_eq!(
            redact_url("clone -- ssh://git@host/r.git /x"),
            "clone -- ssh://<redacted>@host/r.git /x"
        );
        assert_eq!(
            redact_url("/srv/git/r.git and https://h/r"),
            "/srv/git/r.git and https://h/r"
        );
    }

    #[test]
    fn local_names_default_to_the_short_hostname() {
        let names = local_names(&[]);
        assert_eq!(names[0], "local");
        assert!(names.len() == 2 && !names[1].contains('.'), "{names:?}");
        assert_eq!(local_names(&["gpu-a".into()]), ["local", "gpu-a"]);
    }

    fn git_sync(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "Ann")
            .env("GIT_AUTHOR_EMAIL", "ann@example.com")
            .env("GIT_COMMITTER_NAME", "Ann")
            .env("GIT_COMMITTER_EMAIL", "ann@example.com")
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?}");
    }

    fn agent_args(repo: &Path, checkout: &Path) -> AgentOptions {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "reconcile".as_ref(),
            "agent".as_ref(),
            "--once".as_ref(),
            "--repo".as_ref(),
            repo.as_os_str(),
            "--checkout".as_ref(),
            checkout.as_os_str(),
        ])
        .expect("parses");
        match cli.command {
            Some(crate::cli::Command::Agent(a)) => a.into(),
            other => panic!("{other:?}"),
        }
    }

    /// The checkout follows the branch: a new commit, a force push that rewrote history, and a
    /// stray file on the host are all replaced by exactly the branch's tree.
    #[tokio::test]
    async fn the_checkout_follows_the_branch_even_after_a_force_push() {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        std::fs::create_dir_all(work.join("manifests")).unwrap();
        git_sync(&work, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(work.join("manifests/a.yaml"), "one\n").unwrap();
        git_sync(&work, &["add", "."]);
        git_sync(&work, &["commit", "--quiet", "-m", "one"]);
        let checkout = tmp.path().join("state/agent/repo");
        let args = agent_args(&work, &checkout);

        let first = sync(&args).await.expect("clones");
        assert_eq!(first.author, "Ann <ann@example.com>");
        assert_eq!(
            std::fs::read_to_string(checkout.join("manifests/a.yaml")).unwrap(),
            "one\n"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(checkout.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);

        std::fs::write(checkout.join("manifests/stray.yaml"), "x").unwrap();
        std::fs::write(work.join("manifests/a.yaml"), "two\n").unwrap();
        git_sync(&work, &["commit", "--quiet", "--amend", "-am", "rewritten"]);
        let second = sync(&args).await.expect("fetches");
        assert_ne!(second.commit, first.commit);
        assert_eq!(
            std::fs::read_to_string(checkout.join("manifests/a.yaml")).unwrap(),
            "two\n"
        );
        assert!(!checkout.join("manifests/stray.yaml").exists());
        assert_eq!(sync(&args).await.expect("again").commit, second.commit);
    }

    #[tokio::test]
    async fn a_folder_that_is_not_a_checkout_is_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("precious"), "x").unwrap();
        let args = agent_args(Path::new("/nonexistent/repo.git"), tmp.path());
        let e = sync(&args).await.unwrap_err();
        assert!(matches!(e, AgentError::NotACheckout(_)), "{e}");
        assert!(tmp.path().join("precious").exists());
    }

    #[tokio::test]
    async fn a_missing_repository_is_an_error_naming_git_s_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let args = agent_args(Path::new("/nonexistent/repo.git"), &tmp.path().join("c"));
        let e = error_chain(&sync(&args).await.unwrap_err());
        assert!(
            e.contains("git clone") && e.contains("/nonexistent/repo.git"),
            "{e}"
        );
    }
}
