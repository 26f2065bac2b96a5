//! The command line. `reconcile --dry-run` and `reconcile plan` are the same command.
//!
//! Flags several commands share, with the same name, default, help and env, are one group each
//! (`Manifests`, `HostFilter`, `SshArgs`, `LockArgs`, `RolloutArgs`), flattened where they appear;
//! where the help differs (`plan`'s `--selector`, `history`'s paths, `apply`'s
//! `--break-stale-lock`) the flag is the command's own. Help lists flags in field order.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::report::Format;
use crate::{agent, apply, targets};

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
     interrupted before its turn, a plan file's unit gone stale)
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

    /// With --dry-run: also write the plan to FILE, for `reconcile apply FILE` (see `plan --help`).
    #[arg(long, value_name = "FILE", requires = "dry_run")]
    pub out: Option<PathBuf>,

    #[command(flatten)]
    pub plan: PlanArgs,

    /// More log output on stderr (-v, -vv).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Accept and record the keys of hosts never seen before (ssh's accept-new). A key that
    /// differs from a recorded one is still refused. Host keys are otherwise checked strictly.
    #[arg(long, global = true)]
    pub accept_new_host_keys: bool,

    /// How long one command on a host may take before the host counts as hung (a GPU that fell
    /// off the bus hangs nvidia-smi; a stale NFS mount hangs a look at the model path). systemd
    /// jobs (restart, stop) get at least 10 minutes, the --deep check 5.
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", env = "RECONCILE_COMMAND_TIMEOUT")]
    pub command_timeout: std::time::Duration,

    /// Print a line on stderr for every command run on a host: host, command name (never its
    /// arguments), duration, exit status, and the sequential round trips so far.
    #[arg(long, global = true)]
    pub trace_remote: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what would change on each host, and change nothing.
    #[command(after_help = EXIT_CODES)]
    Plan(PlanCommand),
    /// Make hosts run what the manifests say: install, restart only when needed, watch the crash
    /// window, and roll back a unit that fails it. Given a plan file (`reconcile apply plan.json`,
    /// written by `plan --out`), applies exactly the units it planned, refusing each one whose
    /// manifests, unit file on the host or installed SGLang changed since.
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
    /// Run the throughput benchmark (the manifest's `verify.benchmark`, or its defaults) against
    /// the server each host runs now, without a restart, and keep its figures in the host's current
    /// deployment record: the baseline the next apply's `benchmark` stage compares with.
    #[command(after_help = BENCH_HELP)]
    Bench(BenchArgs),
    /// Restore a kept deployment (default: the one before the current) through apply's install,
    /// restart and staged verification, host by host.
    #[command(after_help = APPLY_EXIT_CODES)]
    Rollback(RollbackArgs),
    /// Pull mode, run on the GPU host itself: keep a checkout of the manifests' git repository
    /// and apply the units whose host is this machine (`local` or an `--as` name), without SSH.
    #[command(after_help = AGENT_EXIT_CODES)]
    Agent(AgentArgs),
}

const BENCH_HELP: &str = "\
Example:
  reconcile bench sglang-qwen --host gpu-a
  gpu-a sglang-qwen.service: baseline stored in 41.3s: baseline recorded: 1: 212 tok/s, 16: 1,130 tok/s, 64: 1,540 tok/s

Exit codes:
  0  every host was benchmarked and its figures stored
  1  a host could not be reached or benchmarked (requests failed, the unit is not running, no
     deployment record to keep the figures in, locked)";

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub history: HistoryArgs,

    #[command(flatten)]
    pub lock: LockArgs,

    /// Benchmark the server at this URL alone: no host, nothing stored (bench/client.sh).
    #[arg(long, hide = true, value_name = "URL")]
    pub url: Option<String>,
}

const AGENT_EXIT_CODES: &str = "\
Exit codes (of --once; an interval agent reports each round and keeps going until SIGTERM):
  0  every unit of this host converged or needed nothing (or the host has none)
  1  the checkout could not be updated, the manifests at the commit are bad (nothing was touched),
     or a unit failed before any change (preflight, lock)
  3  verification failed; the unit was rolled back to its previous unit, which passed
  4  verification failed and the rollback failed too: the host needs attention";

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The manifests' git repository: a URL git can clone (https, ssh) or a path.
    #[arg(long, value_name = "URL")]
    pub repo: String,

    /// The branch whose newest commit is applied.
    #[arg(long, default_value = "main")]
    pub branch: String,

    /// The agent's own checkout, hard-reset to the branch every round (never point it at a tree
    /// someone works in; a folder that is not a git checkout is refused).
    #[arg(
        long,
        default_value = "/var/lib/reconcile/agent/repo",
        value_name = "DIR"
    )]
    pub checkout: PathBuf,

    /// Manifest files or folders, relative to the checkout; may be repeated.
    #[arg(long = "path", default_value = "manifests", value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// The names this machine has as a host in the manifests (default: its short hostname);
    /// `local` always counts. May be repeated.
    #[arg(long = "as", value_name = "NAME")]
    pub names: Vec<String>,

    /// One round, then exit with apply's exit code (for a systemd timer).
    #[arg(long, conflicts_with = "interval")]
    pub once: bool,

    /// Time between rounds when not --once.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub interval: std::time::Duration,

    /// Treat warnings (flag abbreviations, deprecated flags, unknown SGLANG_* variables) as errors.
    #[arg(long)]
    pub strict: bool,

    /// Preflight also asks the host's SGLang to parse each unit's arguments (about 10 s a unit).
    #[arg(long)]
    pub deep: bool,

    #[command(flatten)]
    pub lock: LockArgs,
}

impl From<AgentArgs> for agent::AgentOptions {
    fn from(args: AgentArgs) -> agent::AgentOptions {
        agent::AgentOptions {
            repo: args.repo,
            branch: args.branch,
            checkout: args.checkout,
            paths: args.paths,
            names: args.names,
            once: args.once,
            interval: args.interval,
            strict: args.strict,
            deep: args.deep,
            lock: args.lock.policy(),
        }
    }
}

/// Manifest files or folders, as most commands take them.
#[derive(Debug, Args)]
pub struct Manifests {
    /// Manifest files or folders of them.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,
}

/// Which of the manifests' hosts a command is about, when it only reads them.
#[derive(Debug, Args)]
pub struct HostFilter {
    /// Only these hosts (as named in the manifests); may be repeated.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,

    /// Only hosts whose labels match (see `plan --help`).
    #[arg(long = "selector", short = 'l', value_name = "SELECTOR")]
    pub selectors: Vec<crate::targets::Selector>,
}

impl HostFilter {
    pub fn filter(&self) -> targets::Filter {
        targets::Filter {
            hosts: self.hosts.clone(),
            selectors: self.selectors.clone(),
        }
    }
}

/// How hosts are reached over SSH, besides the global options.
#[derive(Debug, Args)]
pub struct SshArgs {
    /// Read this ssh_config instead of ~/.ssh/config (known_hosts is always checked).
    #[arg(long, value_name = "FILE", env = "RECONCILE_SSH_CONFIG")]
    pub ssh_config: Option<PathBuf>,
}

/// A lock another run left, for the commands that change hosts besides `apply` (whose
/// `--break-stale-lock` says more, and whose `--lock-ttl` comes after its rollout flags).
#[derive(Debug, Args)]
pub struct LockArgs {
    /// Break a unit's lock left by a run that died elsewhere, once it is older than --lock-ttl.
    #[arg(long)]
    pub break_stale_lock: bool,

    /// Age after which --break-stale-lock may break a lock.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub lock_ttl: std::time::Duration,
}

impl LockArgs {
    pub fn policy(&self) -> apply::LockPolicy {
        apply::LockPolicy {
            break_stale: self.break_stale_lock,
            ttl: self.lock_ttl,
        }
    }
}

/// How `apply` rolls out over the fleet.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// Hosts that go first, one batch, and must pass every verification stage before any other
    /// host starts. Only hosts with something to change count: up-to-date hosts are skipped.
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
}

impl RolloutArgs {
    pub fn rollout(&self) -> apply::Rollout {
        apply::Rollout {
            canary: self.canary,
            max_parallel: self.max_parallel,
            max_failures: self.max_failures,
            rollback_all: self.rollback_all,
        }
    }
}

const STATUS_EXIT_CODES: &str = "\
Exit codes:
  0  every unit is in sync (manifest, last deployment, unit on disk and running process agree)
  1  error: bad manifests, or a host could not be read
  2  some unit is not in sync";

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub manifests: Manifests,

    #[command(flatten)]
    pub filter: HostFilter,

    /// Output format: text for a terminal, markdown for a pull request comment, json for tools.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    #[command(flatten)]
    pub ssh: SshArgs,

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

    #[command(flatten)]
    pub ssh: SshArgs,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub history: HistoryArgs,

    /// The deployment to restore, as `reconcile history` numbers it (default: the newest one
    /// before the current that installed another unit).
    #[arg(long, value_name = "N")]
    pub to: Option<usize>,

    #[command(flatten)]
    pub lock: LockArgs,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub plan: PlanArgs,

    /// Break a unit's lock left by a run that died elsewhere, once it is older than --lock-ttl.
    /// (A lock whose process on this machine is gone is always broken.)
    #[arg(long)]
    pub break_stale_lock: bool,

    #[command(flatten)]
    pub rollout: RolloutArgs,

    /// Age after which --break-stale-lock may break a lock.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub lock_ttl: std::time::Duration,
}

impl ApplyArgs {
    pub fn lock(&self) -> apply::LockPolicy {
        apply::LockPolicy {
            break_stale: self.break_stale_lock,
            ttl: self.lock_ttl,
        }
    }
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub manifests: Manifests,

    /// Treat warnings (flag abbreviations, deprecated flags, unknown SGLANG_* variables) as errors.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub manifests: Manifests,

    #[command(flatten)]
    pub filter: HostFilter,
}

#[derive(Debug, Args)]
pub struct PlanCommand {
    #[command(flatten)]
    pub plan: PlanArgs,

    /// Also write the plan to FILE as JSON, for `reconcile apply FILE`: per unit the hashes of
    /// the rendered unit and of the host's, the host's SGLang version and the redacted diff (never
    /// a secret). Apply refuses each unit where any of these changed since.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub manifests: Manifests,

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

    #[command(flatten)]
    pub ssh: SshArgs,

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

impl PlanArgs {
    /// The hosts `--host` and `--selector` keep (their help differs from [`HostFilter`]'s: this
    /// is where `plan --help` explains selectors).
    pub fn filter(&self) -> targets::Filter {
        targets::Filter {
            hosts: self.hosts.clone(),
            selectors: self.selectors.clone(),
        }
    }
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    /// The `reconcile ...` command lines of a file: a line (or a YAML `run:` value, or a systemd
    /// `ExecStart=`) whose first word is the binary, cut at the first shell redirection or pipe.
    fn commands(text: &str) -> Vec<Vec<String>> {
        let mut found = Vec::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            let mut line = line.trim().to_string();
            while line.ends_with('\\') {
                line.pop();
                line.push_str(lines.next().unwrap_or("").trim());
            }
            let line = line
                .trim_start_matches("- ")
                .trim_start_matches("run:")
                .trim();
            let line = line.strip_prefix("ExecStart=").unwrap_or(line);
            let words = shell_words(line);
            if words
                .first()
                .is_some_and(|w| w == "reconcile" || w.ends_with("/reconcile"))
            {
                found.push(words);
            }
        }
        found
    }

    /// Splits like a POSIX shell (quotes, backslashes), stopping at the first unquoted operator.
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    let w = word.get_or_insert_with(String::new);
                    w.extend(chars.by_ref().take_while(|&c| c != '\''));
                }
                '"' => {
                    let w = word.get_or_insert_with(String::new);
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => w.extend(chars.next()),
                            c => w.push(c),
                        }
                    }
                }
                '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
                '>' | '<' | '|' | ';' | '&' | '#' if word.is_none() => break,
                '>' | '<' | '|' | ';' | '&' => {
                    // `2>file`: the digits belong to the redirection, not to the command.
                    if word
                        .as_deref()
                        .is_some_and(|w| w.chars().all(|d| d.is_ascii_digit()))
                    {
                        word = None;
                    }
                    break;
                }
                c if c.is_whitespace() => words.extend(word.take()),
                c => word.get_or_insert_with(String::new).push(c),
            }
        }
        words.extend(word);
        words
    }

    #[test]
    fn shell_words_stop_at_redirections_and_keep_quotes() {
        assert_eq!(
            shell_words(r#"reconcile plan --host 'a b' "c\"d" manifests > plan.md 2> err"#),
            ["reconcile", "plan", "--host", "a b", "c\"d", "manifests"]
        );
        assert_eq!(
            shell_words("reconcile plan x 2>err"),
            ["reconcile", "plan", "x"]
        );
    }

    /// Every `reconcile` command in examples/ parses with the real command line, so the examples
    /// cannot drift from the flags.
    #[test]
    fn the_examples_commands_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let files = [
            "github-actions/reconcile.yml",
            "systemd/reconcile-agent.service",
        ];
        let mut seen = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(dir.join(file)).expect("example exists");
            for argv in commands(&text) {
                let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| {
                    panic!("{file}: `{}` does not parse:\n{e}", argv.join(" "))
                });
                seen.push(match cli.command {
                    Some(Command::Plan(p)) => format!("plan {:?}", p.plan.format),
                    Some(Command::Apply(_)) => "apply".into(),
                    Some(Command::Validate(_)) => "validate".into(),
                    Some(Command::Agent(a)) => format!("agent once={}", a.once),
                    other => format!("{other:?}"),
                });
            }
        }
        for wanted in ["plan Markdown", "apply", "agent once=true"] {
            assert!(
                seen.iter().any(|s| s == wanted),
                "no `{wanted}` in the examples: {seen:?}"
            );
        }
    }
}
