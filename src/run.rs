//! Running a parsed command line: each command loads what it needs, does it, prints its report
//! and says which exit code it comes to. `main` calls [`run`] and maps an [`Error`] to exit 1.

use std::process::ExitCode;
use std::time::Duration;

use crate::apply::Rollout;
use crate::cli::{
    AgentArgs, ApplyArgs, BenchArgs, Cli, Command, ExperimentArgs, HistoryArgs, ImportArgs,
    PlanArgs, QualityArgs, RenderArgs, RollbackArgs, RolloutStatusArgs, RolloutSub, SshArgs,
    StatusArgs, ValidateArgs,
};
use crate::dry_run::Tally;
use crate::redact::Redactor;
use crate::{
    agent, apply, dry_run, history, load, manifest, plan_file, remote, report, signals, status,
    targets,
};

/// Errors that end a run before any host is planned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Manifests(#[from] manifest::ManifestErrors),
    #[error(transparent)]
    UnknownHosts(#[from] targets::UnknownHosts),
    #[error("no manifest has the service {0}; name its hosts with --host")]
    NoHosts(String),
    #[error("say what to do: `reconcile --dry-run` (or `reconcile plan`) shows what would change")]
    NoCommand,
    #[error("`{0}` came after a flag, so it was read as a manifest path: name the command first (`reconcile {0} -v ...`)")]
    CommandAfterFlag(String),
    #[error(transparent)]
    PlanFile(#[from] plan_file::Error),
    #[error("a plan file fixes the units it applies; --host and --selector cannot narrow it (plan again with them)")]
    PlanFileFilter,
    #[error(transparent)]
    Import(#[from] crate::import::Error),
    #[error(transparent)]
    Coordinator(#[from] crate::coordinator::SetupError),
    #[error(transparent)]
    Experiment(#[from] crate::experiment::Error),
    #[error(transparent)]
    Lock(#[from] Box<crate::pinned::lock::LockCommandError>),
    #[error("the coordinator: {0}")]
    CoordinatorUnreachable(String),
    #[error("the man pages could not be written into {}: {source}", .dir.display())]
    Manpages {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    /// `status --coordinator --format prometheus`: the coordinator holds no figures to export.
    #[error("--format prometheus reads the hosts (or each agent writes its own with --metrics-file); it does not go with --coordinator")]
    PrometheusFromCoordinator,
}

pub async fn run(cli: Cli) -> Result<ExitCode, Error> {
    // The global options that say how hosts are reached: every command's SSH options start here.
    let reach = Reach {
        accept_new_host_keys: cli.accept_new_host_keys,
        limits: remote::Limits::with_command(cli.command_timeout),
        trace: cli.trace_remote.then(remote::Trace::stderr),
    };
    let misplaced = cli.misplaced_command();
    match cli.command {
        Some(Command::Plan(args)) => plan(args.plan, args.out, &reach).await,
        Some(Command::Render(args)) => render(args),
        Some(Command::Apply(args)) => apply(args, &reach).await,
        Some(Command::Validate(args)) => validate(args),
        Some(Command::Lock(args)) => lock(args, &reach).await,
        Some(Command::Status(args)) => status(args, &reach).await,
        Some(Command::History(args)) => history(args, &reach).await,
        Some(Command::Rollback(args)) => rollback(args, &reach).await,
        Some(Command::Experiment(args)) => experiment(args, &reach).await,
        Some(Command::Bench(args)) => bench(args, &reach).await,
        Some(Command::Quality(args)) => quality(args, &reach).await,
        Some(Command::Agent(args)) => agent_rounds(args, &reach).await,
        Some(Command::Rollout(args)) => match args.command {
            RolloutSub::Status(a) => rollout_status(a).await,
        },
        Some(Command::Import(args)) => import(args, &reach).await,
        Some(Command::Manpages(args)) => {
            crate::cli::manpages(&args.dir).map_err(|source| Error::Manpages {
                dir: args.dir.clone(),
                source,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Schema) => {
            print!("{}", reconcile_core::manifest::schema::manifest_text());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Completions(args)) => {
            crate::cli::completions(args.shell, &mut std::io::stdout().lock());
            Ok(ExitCode::SUCCESS)
        }
        None if cli.dry_run => plan(cli.plan, cli.out, &reach).await,
        None => Err(misplaced.map_or(Error::NoCommand, Error::CommandAfterFlag)),
    }
}

/// The targets a plan or an apply works on: the manifests' units on the hosts `args` select,
/// every one restarting with `--restart` (none changed live).
fn planned_targets(
    manifests: &[manifest::Manifest],
    args: &PlanArgs,
) -> Result<Vec<targets::Target>, Error> {
    let mut targets = targets::targets(manifests, &args.filter())?;
    if args.restart {
        for t in &mut targets {
            t.desired.live = false;
        }
    }
    Ok(targets)
}

async fn plan(
    args: PlanArgs,
    out: Option<std::path::PathBuf>,
    reach: &Reach,
) -> Result<ExitCode, Error> {
    let paths = &args.manifests.paths;
    let (manifests, redactor) = load_manifests(paths, args.strict)?;
    let targets = planned_targets(&manifests, &args)?;
    let ssh = ssh_options(reach, &args.ssh);
    let mut outcomes =
        dry_run::plan_targets(targets, &ssh, args.parallel, args.deep, &redactor).await;
    if args.strict {
        outcomes = outcomes
            .into_iter()
            .map(dry_run::PlanOutcome::strictly)
            .collect();
    }
    if let Some(out) = &out {
        let commit = git_info(paths).commit;
        plan_file::write(&plan_file::new(paths, commit, &outcomes), out)?;
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
    let planned = plan_file::find(&plan.manifests.paths)?;
    let paths = match &planned {
        Some(_) if !plan.hosts.is_empty() || !plan.selectors.is_empty() => {
            return Err(Error::PlanFileFilter)
        }
        Some(p) => p.manifest_paths(),
        None => plan.manifests.paths.clone(),
    };
    let (manifests, redactor) = load_manifests(&paths, plan.strict)?;
    let targets = planned_targets(&manifests, plan)?;
    // A plan file's units only, each checked on its host against what was planned.
    let (targets, refused) = match &planned {
        Some(p) => p.select(targets),
        None => (targets, Vec::new()),
    };
    let ssh = ssh_options(reach, &plan.ssh);
    let options = apply_options(args.lock(), plan.format, redactor)
        .git(git_info(&paths))
        .deep(plan.deep)
        .rollout(Rollout::resolve(
            &args.rollout.asked(),
            targets.iter().filter_map(|t| t.manifest.rollout.as_ref()),
        ))
        .replace_dropins(args.replace_dropins)
        .preload(!args.no_stage)
        .strict(plan.strict);
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
    Ok(ExitCode::from(apply::exit_code(&reports)))
}

/// Apply's options as `apply` and `rollback` start them: this process's, stopping on a signal,
/// with spinners when [`live_display`] says so.
fn apply_options(
    lock: apply::LockPolicy,
    format: report::Format,
    redactor: Redactor,
) -> apply::ApplyOptions {
    let cancel = signals::stop_on_signal();
    let progress = live_display(format).then(indicatif::MultiProgress::new);
    apply::ApplyOptions::new(apply::Owner::this_process(), lock, cancel, redactor)
        .progress(progress)
}

/// Spinners on stderr, only for text output on a terminal that may be drawn on.
fn live_display(format: report::Format) -> bool {
    format == report::Format::Text && stderr_takes_escapes()
}

/// Whether stderr is a terminal that escape codes (a spinner's redraws, the logs' colours) may be
/// written to.
fn stderr_takes_escapes() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && escapes_allowed(
            std::env::var_os("NO_COLOR").as_deref(),
            std::env::var_os("TERM").as_deref(),
        )
}

/// `NO_COLOR` (plain output asked for) and `TERM=dumb` (a terminal that cannot move its cursor)
/// get plain lines: a spinner's line is redrawn with escape codes.
fn escapes_allowed(no_color: Option<&std::ffi::OsStr>, term: Option<&std::ffi::OsStr>) -> bool {
    no_color.is_none_or(|v| v.is_empty()) && term.is_none_or(|t| t != "dumb")
}

/// The options global to the command line that every command's SSH options carry.
struct Reach {
    /// `--accept-new-host-keys`.
    accept_new_host_keys: bool,
    /// `--command-timeout`.
    limits: remote::Limits,
    /// `--trace-remote`.
    trace: Option<remote::Trace>,
}

fn ssh_options(reach: &Reach, ssh: &SshArgs) -> remote::SshOptions {
    remote::SshOptions {
        config_file: ssh.ssh_config.clone(),
        connect_timeout: Some(Duration::from_secs(10)),
        accept_new_host_keys: reach.accept_new_host_keys,
        limits: reach.limits,
        trace: reach.trace.clone(),
    }
}

/// `reconcile status`: every unit of the manifests, compared on its host.
async fn status(args: StatusArgs, reach: &Reach) -> Result<ExitCode, Error> {
    if let Some(etcd) = coordinator_options(&args.coordinator)? {
        return fleet_status(args, etcd).await;
    }
    let (manifests, redactor) = load_manifests(&args.manifests.paths, false)?;
    let targets = targets::targets(&manifests, &args.filter.filter())?;
    let ssh = ssh_options(reach, &args.ssh);
    let weights = if args.verify_weights {
        status::WeightsCheck::Hashes
    } else {
        status::WeightsCheck::Sizes
    };
    let statuses = status::status_targets(targets, &ssh, args.parallel, &redactor, weights).await;
    match args.format.report() {
        Some(format) => print!("{}", report::status::render(&statuses, format)),
        None => print!("{}", status::metrics(&statuses, &[])),
    }
    Ok(ExitCode::from(status::exit_code(&statuses)))
}

/// The coordinator's status comes as a report; its metrics are each agent's own
/// (`--metrics-file`), read from the hosts.
fn fleet_format(format: crate::cli::StatusFormat) -> Result<report::Format, Error> {
    format.report().ok_or(Error::PrometheusFromCoordinator)
}

/// `reconcile status --coordinator`: every host's last entry, from the coordinator alone. The
/// manifests, when they load, add the hosts no agent has reported and say who is behind; when
/// they do not, the coordinator's word is shown alone (a warning says why).
async fn fleet_status(
    args: StatusArgs,
    etcd: remote::etcd::EtcdOptions,
) -> Result<ExitCode, Error> {
    use crate::rollout::overview::{rows, Newest};
    let newest = match load_reporting(&args.manifests.paths, false) {
        Ok((manifests, _)) => {
            let targets = targets::targets(&manifests, &args.filter.filter())?;
            Newest::all(&targets)
        }
        Err(failed) => {
            eprintln!(
                "warning: the manifests could not be loaded ({}); showing the coordinator's entries alone",
                failed.errors
            );
            Default::default()
        }
    };
    let ledgers = read_fleet(&args.coordinator, etcd).await?;
    let filter = args.filter.filter();
    let mut shown = rows(&ledgers, &newest);
    if !filter.hosts.is_empty() {
        shown.retain(|r| filter.hosts.contains(&r.host));
    }
    print!(
        "{}",
        report::coordinator::render_fleet(
            &shown,
            fleet_format(args.format)?,
            crate::coordinator::now()
        )
    );
    Ok(ExitCode::from(if shown.iter().all(|r| r.in_sync()) {
        0
    } else {
        2
    }))
}

async fn read_fleet(
    args: &crate::cli::CoordinatorArgs,
    etcd: remote::etcd::EtcdOptions,
) -> Result<std::collections::BTreeMap<String, crate::rollout::ledger::ServiceLedger>, Error> {
    let unreachable = |e: remote::etcd::EtcdError| {
        let mut why = remote::error_chain(&e);
        if e.plain_to_tls() {
            why.push_str(" give its CA with --coordinator-ca");
        }
        Error::CoordinatorUnreachable(why)
    };
    let coordinator = crate::coordinator::Coordinator::connect(&etcd, &args.coordinator_prefix)
        .await
        .map_err(unreachable)?;
    coordinator.fleet().await.map_err(unreachable)
}

/// `reconcile rollout status SERVICE`: the progress of the change the manifests render now.
async fn rollout_status(args: RolloutStatusArgs) -> Result<ExitCode, Error> {
    use crate::rollout::overview::{Newest, RolloutView};
    let service = args
        .service
        .strip_suffix(".service")
        .unwrap_or(&args.service)
        .to_string();
    let (manifests, _) = load_manifests(&args.paths, false)?;
    let targets = targets::targets(&manifests, &targets::Filter::default())?;
    let newest = Newest::all(&targets)
        .remove(&service)
        .ok_or_else(|| Error::NoHosts(service.clone()))?;
    let Some(etcd) = coordinator_options(&args.coordinator)? else {
        return Err(Error::CoordinatorUnreachable(
            "give --coordinator: rollouts are read from the agents' coordinator".into(),
        ));
    };
    let stop = crate::signals::stop_on_signal();
    let mut last = String::new();
    loop {
        let ledgers = read_fleet(&args.coordinator, etcd.clone()).await?;
        let ledger = ledgers.get(&service).cloned().unwrap_or_default();
        let view = RolloutView::new(&service, &newest, &ledger);
        let shown = report::coordinator::render_rollout(&view, args.format);
        if shown != last {
            print!("{shown}");
            last = shown;
        }
        if !args.watch || view.exit_code() != 2 || stop.is_cancelled() {
            return Ok(ExitCode::from(view.exit_code()));
        }
        let slept = tokio::time::sleep(Duration::from_secs(2));
        if stop.run_until_cancelled(slept).await.is_none() {
            return Ok(ExitCode::from(view.exit_code()));
        }
    }
}

/// The unit a `history`/`rollback` is about, its hosts, its manifest when the manifests have it,
/// and what to hide. With `--host`, manifests that do not load are not needed: a rollback must
/// work while the manifests are broken, with verification's defaults (and the secret names of the
/// manifests that did parse).
fn service_hosts(
    args: &HistoryArgs,
) -> Result<(String, Vec<String>, Option<manifest::Manifest>, Redactor), Error> {
    let service = args
        .service
        .strip_suffix(".service")
        .unwrap_or(&args.service)
        .to_string();
    let (manifests, redactor) = match load_reporting(&args.paths, false) {
        Ok(loaded) => loaded,
        Err(failed) if !args.hosts.is_empty() => {
            for e in &failed.errors.0 {
                eprintln!("warning: {}", remote::error_chain(e));
            }
            eprintln!("warning: the manifests could not be loaded; using the hosts named with --host and verification's defaults");
            (Vec::new(), failed.redactor)
        }
        Err(failed) => return Err(Error::Manifests(failed.errors)),
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
    Ok((format!("{service}.service"), hosts, manifest, redactor))
}

/// `reconcile history`: the deployments and generations each host keeps.
async fn history(args: HistoryArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, manifest, _) = service_hosts(&args)?;
    let ssh = ssh_options(reach, &args.ssh);
    let mut histories = history::history_hosts(&hosts, &unit, &ssh, 32).await;
    if manifest.is_some_and(|m| m.group.is_some()) {
        history::group_notes(&mut histories);
    }
    print!("{}", report::history::render(&histories, args.format));
    let failed = histories.iter().any(|h| h.error.is_some());
    Ok(ExitCode::from(u8::from(failed)))
}

/// What `bench` or `quality` measures with: `pick` of the manifest's `verify`, or the default
/// when there is no manifest or it says nothing.
fn spec_of<T: Clone + Default>(
    manifest: Option<&manifest::Manifest>,
    pick: impl Fn(&manifest::VerifySpec) -> Option<&T>,
) -> T {
    manifest
        .and_then(|m| pick(&m.verify))
        .cloned()
        .unwrap_or_default()
}

/// `reconcile bench`: the benchmark against each host's running server, its figures stored as the
/// baseline (or, with the hidden `--url`, against that URL alone, storing nothing).
async fn bench(args: BenchArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, manifest, _) = service_hosts(&args.history)?;
    let spec = spec_of(manifest.as_ref(), |v| v.benchmark.as_ref());
    let on_level = |host: &str, l: &crate::benchmark::Level| {
        eprintln!("{host} {unit}: {}", crate::bench::level_line(l));
    };
    let options = crate::bench::hosts::BenchOptions {
        spec: &spec,
        url: manifest.as_ref().and_then(|m| m.verify.url.as_deref()),
        owner: apply::Owner::this_process(),
        lock: args.lock.policy(),
        cancel: signals::stop_on_signal(),
        on_level: &on_level,
    };
    let results = match &args.url {
        Some(url) => {
            let model = manifest.as_ref().map_or(unit.as_str(), |m| m.model_id());
            vec![crate::bench::hosts::bench_url(url, model, &options).await]
        }
        None => {
            let ssh = ssh_options(reach, &args.history.ssh);
            crate::bench::hosts::bench_hosts(&hosts, &unit, &ssh, 8, &options).await
        }
    };
    print!("{}", report::bench::render(&results, args.history.format));
    Ok(ExitCode::from(u8::from(
        results.iter().any(|r| r.error.is_some()),
    )))
}

/// `reconcile experiment`: the variants run on the host, the report printed.
async fn experiment(args: ExperimentArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let ssh = ssh_options(reach, &args.ssh);
    let options = crate::experiment::Options {
        keep_best: args.keep_best,
        write: args.write,
        resume: args.resume,
        chart: args.chart.clone(),
        estimate_only: args.estimate,
        lock: args.lock.policy(),
    };
    let done = crate::experiment::run(&args.file, &options, &ssh)
        .await
        .map_err(|e| match e {
            crate::experiment::Error::Invalid(errors) => Error::Manifests(errors),
            e => Error::Experiment(e),
        })?;
    print!("{}", report::experiment::render(&done, args.format));
    Ok(ExitCode::from(done.exit_code()))
}

/// `reconcile quality`: the quality measurement against the running servers, kept as reference.
async fn quality(args: QualityArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, manifest, _) = service_hosts(&args.history)?;
    let spec = spec_of(manifest.as_ref(), |v| v.quality.as_ref());
    let options = crate::quality::hosts::QualityOptions {
        spec: &spec,
        url: manifest.as_ref().and_then(|m| m.verify.url.as_deref()),
        owner: apply::Owner::this_process(),
        lock: args.lock.policy(),
        cancel: signals::stop_on_signal(),
    };
    let ssh = ssh_options(reach, &args.history.ssh);
    let results = crate::quality::hosts::quality_hosts(&hosts, &unit, &ssh, 8, &options).await;
    print!("{}", report::quality::render(&results, args.history.format));
    Ok(ExitCode::from(u8::from(
        results.iter().any(|r| r.error.is_some()),
    )))
}

/// `reconcile rollback`: a saved deployment restored through apply's path, host by host.
async fn rollback(args: RollbackArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let (unit, hosts, manifest, redactor) = service_hosts(&args.history)?;
    let ssh = ssh_options(reach, &args.history.ssh);
    let options = apply_options(args.lock.policy(), args.history.format, redactor);
    let reports = history::rollback::rollback(
        history::rollback::Rollback {
            hosts: &hosts,
            unit: &unit,
            to: args.to,
            manifest: manifest.as_ref(),
        },
        &ssh,
        &options,
    )
    .await;
    print!("{}", report::render_apply(&reports, args.history.format));
    Ok(ExitCode::from(apply::exit_code(&reports)))
}

/// `reconcile import`: the manifest on stdout or in `-o FILE`; on stderr, the variables its
/// references read (never their values) and what is worth knowing.
async fn import(args: ImportArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let options = crate::import::ImportOptions {
        host: args.host.clone(),
        unit: args.unit.clone(),
        secret_env: args.secret_env.clone(),
    };
    let imported = crate::import::import(&options, &ssh_options(reach, &args.ssh)).await?;
    match &args.out {
        Some(path) => crate::import::write_manifest(path, &imported.yaml, args.force)?,
        None => print!("{}", imported.yaml),
    }
    for note in &imported.notes {
        eprintln!("note: {}", reconcile_core::terminal::escape_controls(note));
    }
    for (var, what) in &imported.exports {
        eprintln!("export {var}: the manifest reads {what} from it (the value is in the unit on {}, never in the manifest)", args.host);
    }
    if let Some(path) = &args.out {
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `reconcile agent`: its rounds, each printed as it happens.
async fn agent_rounds(args: AgentArgs, reach: &Reach) -> Result<ExitCode, Error> {
    let coordinator = match coordinator_options(&args.coordinator)? {
        None => None,
        Some(etcd) => Some(crate::coordinator::CoordinatorOptions {
            etcd,
            prefix: args.coordinator.coordinator_prefix.clone(),
            lease_ttl: args.lease_ttl,
            wait: args.coordinator_wait,
            poll: args.coordinator_poll,
        }),
    };
    let print = |event: agent::Event<'_>| print!("{}", report::agent::render(&event));
    let options = agent::AgentOptions {
        coordinator,
        ..args.into()
    };
    Ok(ExitCode::from(
        agent::run(options, reach.limits, &print).await,
    ))
}

/// The coordinator's etcd options, when `--coordinator` is given: checked (and the password read)
/// before anything is contacted.
fn coordinator_options(
    args: &crate::cli::CoordinatorArgs,
) -> Result<Option<remote::etcd::EtcdOptions>, Error> {
    let Some(urls) = &args.coordinator else {
        return Ok(None);
    };
    let given = crate::coordinator::Given {
        urls: urls.clone(),
        ca: args.coordinator_ca.clone(),
        identity: args
            .coordinator_cert
            .clone()
            .zip(args.coordinator_key.clone()),
        user: args.coordinator_user.clone(),
        password_file: args.coordinator_password_file.clone(),
    };
    // etcd answers a request in milliseconds; ten seconds is a member that is down or cut off.
    let timeout = Duration::from_secs(10);
    Ok(Some(crate::coordinator::etcd_options(
        &given,
        std::env::var(crate::coordinator::PASSWORD_ENV).ok(),
        timeout,
        timeout,
    )?))
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
    let (manifests, redactor) = load_manifests(&args.manifests.paths, false)?;
    let targets = targets::targets(&manifests, &args.filter.filter())?;
    let many = targets.len() > 1;
    for t in &targets {
        if many {
            println!("# ---- {} on {}", t.desired.unit, t.host);
        }
        print!("{}", redactor.redact_unit(&t.desired));
    }
    Ok(ExitCode::SUCCESS)
}

/// `reconcile validate`: every finding of every manifest, offline.
fn validate(args: ValidateArgs) -> Result<ExitCode, Error> {
    let (loaded, _) = load_manifests(&args.manifests.paths, args.strict)?;
    let units: usize = loaded.iter().map(|m| m.hosts.len()).sum();
    println!("{} manifests, {units} units: valid", loaded.len());
    Ok(ExitCode::SUCCESS)
}

/// `reconcile lock`: the lock file of every pinned revision, written beside the manifests.
async fn lock(args: crate::cli::LockCommand, reach: &Reach) -> Result<ExitCode, Error> {
    let loaded = load::load_unlocked(&args.manifests.paths, false)
        .map_err(|failed| Error::Manifests(failed.errors))?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    let ssh = ssh_options(reach, &args.ssh);
    let locked = crate::pinned::lock::lock(&loaded.manifests, &ssh, args.update)
        .await
        .map_err(Box::new)?;
    if locked.is_empty() {
        println!("no manifest pins a model revision (`sglang.model:`): nothing to lock");
    }
    for l in &locked {
        println!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads and checks the manifests, printing warnings; errors end the run before any host is
/// contacted. The redactor hides what the manifests declare secret.
fn load_manifests(
    paths: &[std::path::PathBuf],
    strict: bool,
) -> Result<(Vec<manifest::Manifest>, Redactor), Error> {
    load_reporting(paths, strict).map_err(|failed| Error::Manifests(failed.errors))
}

/// [`load_manifests`], a failed load coming back whole.
fn load_reporting(
    paths: &[std::path::PathBuf],
    strict: bool,
) -> Result<(Vec<manifest::Manifest>, Redactor), load::Failed> {
    match load::load(paths, strict) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            Ok((loaded.manifests, loaded.redactor))
        }
        Err(failed) => {
            for w in &failed.warnings {
                eprintln!("warning: {w}");
            }
            Err(failed)
        }
    }
}

pub fn report_error(e: &Error) {
    // An error can carry a host's words (an import's unit, the coordinator's answer): shown, not
    // acted on by the terminal.
    let shown = reconcile_core::terminal::escape_controls;
    match e {
        Error::Manifests(errors) => {
            for error in &errors.0 {
                eprintln!("error: {}", shown(&remote::error_chain(error)));
            }
            eprintln!("{e}; no host was contacted");
        }
        Error::Import(crate::import::Error::Inexpressible { errors, .. }) => {
            for error in &errors.errors {
                eprintln!("error: {}", shown(&error.to_string()));
            }
            eprintln!("{e}; nothing was written");
        }
        other => eprintln!("error: {}", shown(&remote::error_chain(other))),
    }
}

pub fn init_logging(verbose: u8) {
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
        // tracing colours even a pipe (it only checks NO_COLOR): logs kept in a file stay plain.
        .with_ansi(stderr_takes_escapes())
        .with_target(false)
        .init();
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::escapes_allowed;

    #[test]
    fn no_color_and_a_dumb_terminal_get_plain_lines() {
        let set = |v: &'static str| Some(OsStr::new(v));
        assert!(escapes_allowed(None, set("xterm-256color")));
        assert!(
            escapes_allowed(set(""), None),
            "an empty NO_COLOR does not count"
        );
        assert!(!escapes_allowed(set("1"), set("xterm-256color")));
        assert!(!escapes_allowed(None, set("dumb")));
    }
}
