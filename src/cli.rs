//! The command line. `reconcile --dry-run` and `reconcile plan` are the same command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::report::Format;

const EXIT_CODES: &str = "\
Exit codes:
  0  nothing to change (every unit on every host matches its manifest)
  1  error: bad manifests (no host was contacted), a host could not be read, or a unit failed
     preflight (its host cannot run it: SGLang version, model path, GPUs, port)
  2  changes pending (dry-run/plan only)";

const APPLY_EXIT_CODES: &str = "\
Exit codes:
  0  every unit converged (or needed nothing)
  1  error before any change on some host (bad manifests, unreachable, preflight failed, locked,
     interrupted before its turn)
  3  verification failed on some host; it was rolled back to its previous unit, which passed
  4  verification failed and the rollback failed too: that host needs attention

Ctrl-C during verification fails the stage in progress and rolls that unit back (verified like any
rollback); hosts not started yet are left untouched.";

#[derive(Debug, Parser)]
#[command(
    name = "reconcile",
    version,
    about = "GitOps for SGLang servers under systemd: render units from manifests, diff them against hosts over SSH",
    after_help = EXIT_CODES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Show what would change on each host, and change nothing (same as `reconcile plan`).
    #[arg(long)]
    pub dry_run: bool,

    #[command(flatten)]
    pub plan: PlanArgs,

    /// More log output on stderr (-v, -vv).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what would change on each host, and change nothing.
    #[command(after_help = EXIT_CODES)]
    Plan(PlanArgs),
    /// Make hosts run what the manifests say: install, restart only when needed, watch the crash
    /// window, and roll back a unit that fails it.
    #[command(after_help = APPLY_EXIT_CODES)]
    Apply(ApplyArgs),
    /// Check manifests offline, against the flag catalog of the SGLang version each names.
    #[command(
        after_help = "Exit codes:\n  0  valid (warnings, if any, are printed)\n  1  errors (or warnings, with --strict)"
    )]
    Validate(ValidateArgs),
    /// Print the units the manifests render, without contacting any host (secrets redacted).
    Render(RenderArgs),
    /// What each host really runs: the manifest, the unit on disk, the last deployment and the
    /// running process compared (in_sync, pending_change, edited_on_host, not_reloaded,
    /// not_restarted, down, unmanaged, absent).
    #[command(after_help = STATUS_EXIT_CODES)]
    Status(StatusArgs),
    /// The deployments each host keeps for a service (numbered, 1 = oldest; the current one
    /// marked), and the generations an apply kept.
    History(HistoryArgs),
    /// Restore a kept deployment (default: the one before the current) through apply's install,
    /// restart and staged verification, host by host.
    #[command(after_help = APPLY_EXIT_CODES)]
    Rollback(RollbackArgs),
}

const STATUS_EXIT_CODES: &str = "\
Exit codes:
  0  every unit is in sync (manifest, last deployment, unit on disk and running process agree)
  1  error: bad manifests, or a host could not be read
  2  some unit is not in sync";

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Manifest files or folders of them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    /// Only these hosts (as named in the manifests); may be repeated.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,

    /// Only hosts whose labels match (see `plan --help`).
    #[arg(long = "selector", short = 'l', value_name = "SELECTOR")]
    pub selectors: Vec<crate::targets::Selector>,

    /// Output format: text for a terminal, markdown for a pull request comment, json for tools.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    /// Read this ssh_config instead of ~/.ssh/config (known_hosts is always checked).
    #[arg(long, value_name = "FILE", env = "RECONCILE_SSH_CONFIG")]
    pub ssh_config: Option<PathBuf>,

    /// Hosts read at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub parallel: usize,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The service (`sglang-qwen` or `sglang-qwen.service`).
    pub service: String,

    /// Manifest files or folders of them: the service's hosts come from here unless --host names
    /// them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    /// Only these hosts; may be repeated. A host not in the manifests may be named too.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,

    /// Output format: text or json (markdown prints the text).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    /// Read this ssh_config instead of ~/.ssh/config (known_hosts is always checked).
    #[arg(long, value_name = "FILE", env = "RECONCILE_SSH_CONFIG")]
    pub ssh_config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub history: HistoryArgs,

    /// The deployment to restore, as `reconcile history` numbers it (default: the newest one
    /// before the current that installed another unit).
    #[arg(long, value_name = "N")]
    pub to: Option<usize>,

    /// Break a unit's lock left by a run that died elsewhere, once it is older than --lock-ttl.
    #[arg(long)]
    pub break_stale_lock: bool,

    /// Age after which --break-stale-lock may break a lock.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub lock_ttl: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub plan: PlanArgs,

    /// Break a unit's lock left by a run that died elsewhere, once it is older than --lock-ttl.
    /// (A lock whose process on this machine is gone is always broken.)
    #[arg(long)]
    pub break_stale_lock: bool,

    /// Hosts that go first, one batch, and must pass every verification stage before any other
    /// host starts.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub canary: usize,

    /// Hosts applied at once after the canary.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub max_parallel: usize,

    /// Failed hosts, across the whole rollout, after which no new host is started.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub max_failures: usize,

    /// When the rollout stops early, roll back the hosts it already converged.
    #[arg(long)]
    pub rollback_all: bool,

    /// Age after which --break-stale-lock may break a lock.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub lock_ttl: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Manifest files or folders of them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    /// Treat warnings (flag abbreviations, deprecated flags, unknown SGLANG_* variables) as errors.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest files or folders of them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    /// Only these hosts (as named in the manifests); may be repeated.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,

    /// Only hosts whose labels match (see `plan --help`).
    #[arg(long = "selector", short = 'l', value_name = "SELECTOR")]
    pub selectors: Vec<crate::targets::Selector>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Manifest files or folders of them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    /// Only these hosts (as named in the manifests); may be repeated.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,

    /// Only hosts whose labels match: key=value, key!=value or key (repeatable; all must match).
    /// Every host also has the labels `host` and `service`.
    #[arg(long = "selector", short = 'l', value_name = "SELECTOR")]
    pub selectors: Vec<crate::targets::Selector>,

    /// Output format: text for a terminal, markdown for a pull request comment, json for tools.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    /// Read this ssh_config instead of ~/.ssh/config (known_hosts is always checked).
    #[arg(long, value_name = "FILE", env = "RECONCILE_SSH_CONFIG")]
    pub ssh_config: Option<PathBuf>,

    /// Treat warnings (flag abbreviations, deprecated flags, unknown SGLANG_* variables) as errors.
    #[arg(long)]
    pub strict: bool,

    /// Hosts read at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub parallel: usize,

    /// Also ask each host's own SGLang to parse each unit's exact arguments, without starting a
    /// server (`sglang.srt.server_args.prepare_server_args`). Catches what no catalog knows, at
    /// about 10 s a unit on a real host (it imports torch).
    #[arg(long)]
    pub deep: bool,

    /// Colour the text output: auto (a terminal, unless NO_COLOR is set), always or never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    pub fn enabled(self) -> bool {
        use std::io::IsTerminal;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        }
    }
}
