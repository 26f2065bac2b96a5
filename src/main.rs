//! `reconcile`: GitOps for SGLang inference servers run as systemd services.
//!
//! The core is pure (manifest -> unit -> plan); `remote` is the only layer that reaches hosts, and
//! `main` only parses the command line, runs it, and turns the result into an exit code.

mod apply;
mod cli;
mod dry_run;
mod manifest;
mod observed;
mod plan;
mod redact;
mod sglang;
mod remote;
mod report;
mod targets;
mod unit;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{Cli, Command, PlanArgs, RenderArgs};
use dry_run::Tally;

/// Errors that end a run before any host is planned.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Manifests(#[from] manifest::ManifestErrors),
    #[error(transparent)]
    UnknownHosts(#[from] targets::UnknownHosts),
    #[error("say what to do: `reconcile --dry-run` (or `reconcile plan`) shows what would change")]
    NoCommand,
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
    match cli.command {
        Some(Command::Plan(args)) => plan(args).await,
        Some(Command::Render(args)) => render(args),
        Some(Command::Apply(args)) => apply(args).await,
        None if cli.dry_run => plan(cli.plan).await,
        None => Err(Error::NoCommand),
    }
}

async fn plan(args: PlanArgs) -> Result<ExitCode, Error> {
    let manifests = manifest::load(&args.paths)?;
    let targets = targets::targets(&manifests, &args.hosts)?;
    let ssh = remote::SshOptions {
        config_file: args.ssh_config.clone(),
        connect_timeout: Some(Duration::from_secs(10)),
    };
    let outcomes = dry_run::plan_targets(targets, &ssh, args.parallel).await;
    print!(
        "{}",
        report::render(&outcomes, args.format, args.color.enabled())
    );
    let tally = Tally::of(&outcomes);
    Ok(ExitCode::from(if tally.errors > 0 {
        1
    } else if tally.changes() > 0 {
        2
    } else {
        0
    }))
}

async fn apply(args: PlanArgs) -> Result<ExitCode, Error> {
    let manifests = manifest::load(&args.paths)?;
    let targets = targets::targets(&manifests, &args.hosts)?;
    let ssh = remote::SshOptions {
        config_file: args.ssh_config.clone(),
        connect_timeout: Some(Duration::from_secs(10)),
    };
    let options = apply::ApplyOptions {
        owner: lock_owner(),
    };
    let reports = apply::apply_targets(targets, &ssh, args.parallel, &options).await;
    print!("{}", report::render_apply(&reports, args.format));
    let worst = reports
        .iter()
        .map(|r| r.outcome.exit_code())
        .max()
        .unwrap_or(0);
    Ok(ExitCode::from(worst))
}

/// Names this run in a host's lock, so a refused second run can say who holds it.
fn lock_owner() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let machine = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    format!(
        "{user}@{} pid {} since {at}",
        machine.trim(),
        std::process::id()
    )
}

fn render(args: RenderArgs) -> Result<ExitCode, Error> {
    let manifests = manifest::load(&args.paths)?;
    let targets = targets::targets(&manifests, &args.hosts)?;
    let many = targets.len() > 1;
    for t in &targets {
        if many {
            println!("# ---- {} on {}", t.desired.unit, t.host);
        }
        print!("{}", redact::redact_unit(&t.desired));
    }
    Ok(ExitCode::SUCCESS)
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
