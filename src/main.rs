//! `reconcile`: GitOps for SGLang inference servers run as systemd services.
//!
//! The core is pure (manifest -> unit -> plan); `remote` is the only layer that reaches hosts
//! (`systemd` and `probe` say what to ask of them through it), and `main` only parses the command
//! line, runs it, and turns the result into an exit code.

mod agent;
mod apply;
mod cli;
mod dry_run;
mod history;
mod load;
mod manifest;
mod observed;
mod plan;
mod plan_file;
mod preflight;
mod probe;
mod redact;
mod remote;
mod report;
mod sglang;
mod signals;
mod status;
mod systemd;
mod targets;
mod unit;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{
    ApplyArgs, Cli, Command, HistoryArgs, PlanArgs, RenderArgs, RollbackArgs, StatusArgs,
    ValidateArgs,
};
use dry_run::Tally;

/// Errors that end a run before any host is planned.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Manifests(#[from] manifest::ManifestErrors),
    #[error(transparent)]
    UnknownHosts(#[from] targets::UnknownHosts),
    #[error("no manifest has the service {0}; name its hosts with --host")]
    NoHosts(String),
    #[error("say what to do: `reconcile --dry-run` (or `reconcile plan`) shows what would change")]
    NoCommand,
    #[error(transparent)]
    PlanFile(#[from] plan_file::Error),
    #[error("a plan file fixes the units it applies; --host and --selector cannot narrow it (plan again with them)")]
    PlanFileFilter,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            report_error(&e);
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    // The global options that say how hosts are reached: every command's SSH options start here.
    let reach = Reach {
        accept_new_host_keys: cli.accept_new_host_keys,
        limits: remote::Limits::with_command(cli.command_timeout),
    };
    match cli.command {
        Some(Command::Plan(args)) => plan(args.plan, args.out, &reach).await,
        Some(Command::Render(args)) => render(args),
        Some(Command::Apply(args)) => apply(args, &reach).await,
        Some(Command::Validate(args)) => validate(args),
        Some(Command::Status(args)) => status(args, &reach).await,
        Some(Command::History(args)) => history(args, &reach).await,
        Some(Command::Rollback(args)) => rollback(args, &reach).await,
        Some(Command::Agent(args)) => Ok(ExitCode::from(agent::run(args, reach.limits).await)),
        None if cli.dry_run => plan(cli.plan, cli.out, &reach).await,
        None => Err(Error::NoCommand),
    }
}

async fn plan(
    args: PlanArgs,
    out: Option<std::path::PathBuf>,
    reach: &Reach,
) -> Result<ExitCode, Error> {
    let manifests = load_manifests(&args.paths, args.strict)?;
    let targets = targets::targets(
        &manifests,
        &targets::Filter {
            hosts: args.hosts.clone(),
            selectors: args.selectors.clone(),
        },
    )?;
    let ssh = ssh_options(reach, &args.ssh_config);
    let outcomes = dry_run::plan_targets(targets, &ssh, args.parallel, args.deep).await;
    if let Some(out) = &out {
        let commit = git_info(&args.paths).commit;
        plan_file::PlanFile::new(&args.paths, commit, &outcomes).write(out)?;
    }
    print!(
        "{}",
        report::render(&outcomes, args.format, args.color.enabled())
    );
    let tally = Tally::of(&outcomes);
    Ok(ExitCode::from(if tally.failed() {
        1
    } else if tally.changes() > 0 {
        2
    } else {
        0
    }))
}

async fn apply(args: ApplyArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let plan = &args.plan;
    let planned = plan_file::PlanFile::find(&plan.paths)?;
    let paths = match &planned {
        Some(_) if !plan.hosts.is_empty() || !plan.selectors.is_empty() => {
            return Err(Error::PlanFileFilter)
        }
        Some(p) => p.manifest_paths(),
        None => plan.paths.clone(),
    };
    let manifests = load_manifests(&paths, plan.strict)?;
    let targets = targets::targets(
        &manifests,
        &targets::Filter {
            hosts: plan.hosts.clone(),
            selectors: plan.selectors.clone(),
        },
    )?;
    // A plan file's units only, each checked on its host against what was planned.
    let (targets, refused) = match &planned {
        Some(p) => p.select(targets),
        None => (targets, Vec::new()),
    };
    let ssh = ssh_options(reach, &plan.ssh_config);
    let cancel = signals::stop_on_signal();
    let live = live_display(plan.format);
    let options = apply::ApplyOptions {
        owner: apply::Owner::this_process(),
        lock: apply::LockPolicy {
            break_stale: args.break_stale_lock,
            ttl: args.lock_ttl,
        },
        git: git_info(&paths),
        cancel,
        progress: live.then(indicatif::MultiProgress::new),
        deep: plan.deep,
        rollout: apply::Rollout {
            canary: args.canary,
            max_parallel: args.max_parallel,
            max_failures: args.max_failures,
            rollback_all: args.rollback_all,
        },
        restoring: None,
    };
    let mut reports = apply::apply_targets(targets, &ssh, &options).await;
    reports.extend(refused.into_iter().map(|r| {
        apply::refused(
            &r.host,
            &r.unit,
            &r.source,
            apply::Outcome::Error,
            format!("nothing was changed: {}", r.why),
        )
    }));
    print!("{}", report::render_apply(&reports, plan.format));
    let worst = reports
        .iter()
        .map(|r| r.outcome.exit_code())
        .max()
        .unwrap_or(0);
    Ok(ExitCode::from(worst))
}

/// Spinners on stderr, only for text output on a terminal.
fn live_display(format: report::Format) -> bool {
    format == report::Format::Text && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// The options global to the command line that every command's SSH options carry.
struct Reach {
    /// `--accept-new-host-keys`.
    accept_new_host_keys: bool,
    /// `--command-timeout`.
    limits: remote::Limits,
}

fn ssh_options(reach: &Reach, config_file: &Option<std::path::PathBuf>) -> remote::SshOptions {
    remote::SshOptions {
        config_file: config_file.clone(),
        connect_timeout: Some(Duration::from_secs(10)),
        accept_new_host_keys: reach.accept_new_host_keys,
        limits: reach.limits,
    }
}

/// `reconcile status`: every unit of the manifests, compared on its host.
async fn status(args: StatusArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let manifests = load_manifests(&args.paths, false)?;
    let targets = targets::targets(
        &manifests,
        &targets::Filter {
            hosts: args.hosts.clone(),
            selectors: args.selectors.clone(),
        },
    )?;
    let ssh = ssh_options(reach, &args.ssh_config);
    let statuses = status::status_targets(targets, &ssh, args.parallel).await;
    print!("{}", status::render(&statuses, args.format));
    Ok(ExitCode::from(status::exit_code(&statuses)))
}

/// The unit a `history`/`rollback` is about, its hosts, and its manifest when the manifests have
/// it. With `--host`, manifests that do not load are not needed: a rollback must work while the
/// manifests are broken, with verification's defaults.
fn service_hosts(
    args: &HistoryArgs,
) -> Result<(String, Vec<String>, Option<manifest::Manifest>), Error> {
    let service = args
        .service
        .strip_suffix(".service")
        .unwrap_or(&args.service)
        .to_string();
    let manifests = match load_manifests(&args.paths, false) {
        Ok(m) => m,
        Err(Error::Manifests(errors)) if !args.hosts.is_empty() => {
            for e in &errors.0 {
                eprintln!("warning: {}", remote::error_chain(e));
            }
            eprintln!("warning: the manifests could not be loaded; using the hosts named with --host and verification's defaults");
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    let manifest = manifests.into_iter().find(|m| m.service == service);
    let hosts = if args.hosts.is_empty() {
        manifest
            .as_ref()
            .map(|m| m.hosts.iter().map(|h| h.name.clone()).collect())
            .unwrap_or_default()
    } else {
        args.hosts.clone()
    };
    if hosts.is_empty() {
        return Err(Error::NoHosts(service));
    }
    Ok((format!("{service}.service"), hosts, manifest))
}

/// `reconcile history`: the deployments and generations each host keeps.
async fn history(args: HistoryArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, _) = service_hosts(&args)?;
    let ssh = ssh_options(reach, &args.ssh_config);
    let histories = history::history_hosts(&hosts, &unit, &ssh, 32).await;
    print!("{}", history::render(&histories, args.format));
    let failed = histories.iter().any(|h| h.error.is_some());
    Ok(ExitCode::from(u8::from(failed)))
}

/// `reconcile rollback`: a kept deployment restored through apply's path, host by host.
async fn rollback(args: RollbackArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, manifest) = service_hosts(&args.history)?;
    let ssh = ssh_options(reach, &args.history.ssh_config);
    let options = apply::ApplyOptions {
        owner: apply::Owner::this_process(),
        lock: apply::LockPolicy {
            break_stale: args.break_stale_lock,
            ttl: args.lock_ttl,
        },
        git: apply::GitInfo::default(),
        cancel: signals::stop_on_signal(),
        progress: live_display(args.history.format).then(indicatif::MultiProgress::new),
        deep: false,
        rollout: apply::Rollout {
            canary: 1,
            max_parallel: 1,
            max_failures: 1,
            rollback_all: false,
        },
        restoring: None,
    };
    let reports =
        history::rollback::rollback(&hosts, &unit, args.to, manifest.as_ref(), &ssh, &options)
            .await;
    print!("{}", report::render_apply(&reports, args.history.format));
    let worst = reports
        .iter()
        .map(|r| r.outcome.exit_code())
        .max()
        .unwrap_or(0);
    Ok(ExitCode::from(worst))
}

/// The commit and author of the manifests' git work tree, when they are in one.
fn git_info(paths: &[std::path::PathBuf]) -> apply::GitInfo {
    let Some(first) = paths.first() else {
        return apply::GitInfo::default();
    };
    let dir = if first.is_dir() {
        first.clone()
    } else {
        first.parent().map(|p| p.to_path_buf()).unwrap_or_default()
    };
    let dir = if dir.as_os_str().is_empty() {
        std::path::PathBuf::from(".")
    } else {
        dir
    };
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    apply::GitInfo {
        commit: git(&["rev-parse", "HEAD"]),
        author: git(&["log", "-1", "--format=%an <%ae>"]),
    }
}

fn render(args: RenderArgs) -> Result<ExitCode, Error> {
    let manifests = load_manifests(&args.paths, false)?;
    let targets = targets::targets(
        &manifests,
        &targets::Filter {
            hosts: args.hosts.clone(),
            selectors: args.selectors.clone(),
        },
    )?;
    let many = targets.len() > 1;
    for t in &targets {
        if many {
            println!("# ---- {} on {}", t.desired.unit, t.host);
        }
        print!("{}", redact::redact_unit(&t.desired));
    }
    Ok(ExitCode::SUCCESS)
}

/// `reconcile validate`: every finding of every manifest, offline.
fn validate(args: ValidateArgs) -> Result<ExitCode, Error> {
    let loaded = load_manifests(&args.paths, args.strict)?;
    let units: usize = loaded.iter().map(|m| m.hosts.len()).sum();
    println!("{} manifests, {units} units: valid", loaded.len());
    Ok(ExitCode::SUCCESS)
}

/// Loads and checks the manifests, printing warnings; errors end the run before any host is
/// contacted.
fn load_manifests(
    paths: &[std::path::PathBuf],
    strict: bool,
) -> Result<Vec<manifest::Manifest>, Error> {
    match load::load(paths, strict) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            Ok(loaded.manifests)
        }
        Err((errors, warnings)) => {
            for w in &warnings {
                eprintln!("warning: {w}");
            }
            Err(Error::Manifests(errors))
        }
    }
}

fn report_error(e: &Error) {
    match e {
        Error::Manifests(errors) => {
            for error in &errors.0 {
                eprintln!("error: {}", remote::error_chain(error));
            }
            eprintln!("{e}; no host was contacted");
        }
        other => eprintln!("error: {}", remote::error_chain(other)),
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RECONCILE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
