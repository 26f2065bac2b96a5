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

// The help texts after the flags: an "Examples:" block, then the exit codes. They are macros, not
// consts, so `concat!` can join them into one literal per command. Every two-space-indented line
// of an Examples block is a command line that the tests parse with this very `Cli`; deeper lines
// are sample output.

macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0  nothing to change (every unit on every host matches its manifest)
  1  error: bad manifests (no host was contacted), a host could not be read, or a unit failed
     preflight (its host cannot run it: SGLang version, model path, GPUs, port, or the host's
     SGLang refuses its arguments or its model's config, or its pinned weights are refused)
  2  changes pending (dry-run/plan only)"
    };
}

macro_rules! apply_exit_codes {
    () => {
        apply_exit_codes!("")
    };
    (paused) => {
        apply_exit_codes!(
            "
  5  a canary's bake could not judge it (verify.bake): the rollout paused, the canary kept its
     new unit; apply again to go on, or `reconcile rollback SERVICE --host CANARY`"
        )
    };
    ($more:literal) => {
        concat!(
            "\
Exit codes:
  0  every unit converged (or needed nothing)
  1  error before any change on some host (bad manifests, unreachable, preflight failed, locked,
     its pinned weights not fetched, interrupted before its turn, a plan file's unit gone stale)
  3  verification failed on some host; it was rolled back to its previous unit, which passed
  4  verification failed and the rollback failed too: that host needs attention",
            $more,
            "

Ctrl-C during verification fails the stage in progress and rolls that unit back (verified like any
rollback); hosts not started yet are left untouched."
        )
    };
}

const TOP_HELP: &str = concat!(
    "\
Examples:
  reconcile --dry-run                              # plan manifests/ against every host they name
  reconcile --dry-run --format markdown > plan.md  # the same, as a pull request comment
  reconcile apply --host gpu-a                     # change gpu-a only, verified, or rolled back
  reconcile completions bash > ~/.local/share/bash-completion/completions/reconcile

Every command's --help has examples of its own.

",
    exit_codes!()
);

const PLAN_HELP: &str = concat!(
    "\
Examples:
  reconcile plan                                # manifests/, every host
  reconcile plan manifests/sglang-qwen3.5-122b.yaml --host gpu-a
  reconcile plan -l service=sglang-qwen -l zone!=b
  reconcile plan --format markdown > plan.md    # a pull request comment
  reconcile plan --out plan.json                # keep the plan to apply
  reconcile plan --deep                         # SGLang's deep check for reload-only units too

",
    exit_codes!()
);

const APPLY_HELP: &str = concat!(
    "\
Examples:
  reconcile apply                                # manifests/, every host, canary first
  reconcile apply --host gpu-a --deep
  reconcile apply plan.json                      # exactly what `plan --out plan.json` showed
  reconcile apply --canary 1 --max-parallel 3 --max-failures 1 --rollback-all
  reconcile apply --break-stale-lock --lock-ttl 30m

",
    apply_exit_codes!(paused)
);

const ROLLBACK_HELP: &str = concat!(
    "\
Examples:
  reconcile rollback sglang-qwen                 # back to the deployment before the current one
  reconcile rollback sglang-qwen --to 9 --host gpu-a    # deployment 9 of `reconcile history`

",
    apply_exit_codes!()
);

const LOCK_HELP: &str = "\
Examples:
  reconcile lock
  reconcile lock manifests/ --update

A revision already in the lock is kept (--update lists it again); entries no manifest pins any
more are dropped. A hub token is read from the manifest's env HF_TOKEN, else this process's.

Exit codes:
  0  the lock file is written (or already complete)
  1  a revision could not be listed: the hub does not know it, or a host cannot hash its store";

const VALIDATE_HELP: &str = "\
Examples:
  reconcile validate
  reconcile validate manifests/sglang-qwen3.5-122b.yaml --strict

Exit codes:
  0  valid (warnings, if any, are printed)
  1  errors (or warnings, with --strict)";

const RENDER_HELP: &str = "\
Examples:
  reconcile render                               # every unit of manifests/, for every host
  reconcile render manifests/sglang-qwen3.5-122b.yaml --host gpu-b";

const HISTORY_HELP: &str = "\
Examples:
  reconcile history sglang-qwen
  reconcile history sglang-qwen.service --host gpu-a --format json";

const IMPORT_HELP: &str = "\
Examples:
  reconcile import gpu-a sglang-qwen                     # the manifest on stdout
  reconcile import gpu-a sglang-qwen.service -o manifests/sglang-qwen.yaml
  reconcile import gpu-a sglang-qwen -o manifests/sglang-qwen.yaml --force --secret-env MY_DSN

The manifest reproduces what systemd runs for the unit (its file and drop-ins): a plan of it against
that host restarts nothing. Secrets are written as `{ from_env: VAR }`, never copied; stderr names
the variables to export before `reconcile plan` or `apply`. A value a manifest cannot express is an
error naming its file and line (see docs/adopting.md). The host is only read.

Exit codes:
  0  the manifest was written
  1  error: the host could not be read, the unit is not there (or masked), its Python has no
     SGLang, a value cannot be expressed, or the output file exists (without --force)";

const COMPLETIONS_HELP: &str = "\
Examples:
  reconcile completions bash > ~/.local/share/bash-completion/completions/reconcile
  reconcile completions zsh > ~/.zfunc/_reconcile       # with fpath+=(~/.zfunc) before compinit
  reconcile completions fish > ~/.config/fish/completions/reconcile.fish

bash loads the file on demand when bash-completion is installed; without it, add
`source <(reconcile completions bash)` to ~/.bashrc. zsh reads `_reconcile` from a folder on its
fpath when compinit runs. fish reads its completions folder by itself. A new shell picks them up.";

#[derive(Debug, Parser)]
#[command(
    name = "reconcile",
    version,
    about = "GitOps for SGLang servers under systemd",
    long_about = "GitOps for SGLang servers under systemd: render units from manifests, diff them against hosts over SSH, apply them with staged verification and a rollback the host holds.",
    after_help = TOP_HELP,
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
    /// jobs (restart, stop) get at least 10 minutes, the deep check 2 (5 with --deep).
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", env = "RECONCILE_COMMAND_TIMEOUT")]
    pub command_timeout: std::time::Duration,

    /// Print a line on stderr for every command run on a host: host, command name (never its
    /// arguments), duration, exit status, and the sequential round trips so far.
    #[arg(long, global = true)]
    pub trace_remote: bool,
}

impl Cli {
    /// A command named after a global flag (`reconcile -v plan`). Top-level arguments rule out a
    /// command after them (so `reconcile --dry-run apply` cannot apply), and clap then reads the
    /// name as a manifest path.
    pub fn misplaced_command(&self) -> Option<String> {
        use clap::CommandFactory;
        let first = self.plan.manifests.paths.first()?.to_str()?;
        let known = Cli::command()
            .get_subcommands()
            .any(|c| c.get_name() == first);
        (self.command.is_none() && known).then(|| first.to_string())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what would change on each host, and change nothing.
    #[command(after_help = PLAN_HELP)]
    Plan(PlanCommand),
    /// Make hosts run what the manifests say, verified.
    ///
    /// Make hosts run what the manifests say: install, restart only when needed, watch the crash
    /// window, and roll back a unit that fails it. Given a plan file (`reconcile apply plan.json`,
    /// written by `plan --out`), applies exactly the units it planned, refusing each one whose
    /// manifests, unit file on the host or installed SGLang changed since.
    #[command(after_help = APPLY_HELP)]
    Apply(ApplyArgs),
    /// Check manifests offline, against SGLang's flag catalog.
    ///
    /// Check manifests offline, against the flag catalog of the SGLang version each names.
    #[command(after_help = VALIDATE_HELP)]
    Validate(ValidateArgs),
    /// Write the files and hashes of every pinned model revision.
    ///
    /// Write `reconcile.lock` beside the manifests: the files of every model revision they pin
    /// (`sglang.model:`), with their sizes and SHA-256, read from the hub's API (a hub
    /// repository) or hashed on the first host of the manifest (a store folder). Commit it with
    /// the manifests: plan and apply refuse a pinned revision the lock lacks, and every host's
    /// copy is checked against it before its server stops.
    #[command(after_help = LOCK_HELP)]
    Lock(LockCommand),
    /// Print the units the manifests render, contacting no host.
    ///
    /// Print the units the manifests render, without contacting any host (secrets redacted).
    #[command(after_help = RENDER_HELP)]
    Render(RenderArgs),
    /// What each host really runs, against the manifests.
    ///
    /// What each host really runs: the manifest, the unit on disk, the last deployment and the
    /// running process compared (in_sync, pending_change, edited_on_host, not_reloaded,
    /// not_restarted, down, unmanaged, absent).
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// The deployments each host keeps for a service.
    ///
    /// The deployments each host keeps for a service (numbered, 1 = oldest; the current one
    /// marked), and the generations an apply kept.
    #[command(after_help = HISTORY_HELP)]
    History(HistoryArgs),
    /// Measure the throughput of the server each host runs now.
    ///
    /// Run the throughput benchmark (the manifest's `verify.benchmark`, or its defaults) against
    /// the server each host runs now, without a restart, and keep its figures in the host's current
    /// deployment record: the baseline the next apply's `benchmark` stage compares with.
    #[command(after_help = BENCH_HELP)]
    Bench(BenchArgs),
    /// Measure the answers of the server each host runs now.
    ///
    /// Measure the answers of the server each host runs now, without a restart (the manifest's
    /// `verify.quality`, or its defaults): compared with the reference the host keeps, then kept
    /// as the reference the next apply's `quality` stage compares with.
    #[command(after_help = QUALITY_HELP)]
    Quality(QualityArgs),
    /// Restore a kept deployment, through apply's own path.
    ///
    /// Restore a kept deployment (default: the one before the current) through apply's install,
    /// restart and staged verification, host by host.
    #[command(after_help = ROLLBACK_HELP)]
    Rollback(RollbackArgs),
    /// Try variants of a service's flags on one host, and rank them.
    ///
    /// Try variants of one service's flags and env on one host, each through apply's own path
    /// (drain, install, restart, staged verification, benchmark, quality gate, rollback), between
    /// two measurements of the baseline; rank them and hand back the winner as a manifest change.
    /// See docs/experiments.md.
    #[command(after_help = EXPERIMENT_HELP)]
    Experiment(ExperimentArgs),
    /// Pull mode: apply this machine's units from a git checkout.
    ///
    /// Pull mode, run on the GPU host itself: keep a checkout of the manifests' git repository
    /// and apply the units whose host is this machine (`local` or an `--as` name), without SSH.
    #[command(after_help = AGENT_HELP)]
    Agent(AgentArgs),
    /// Pull mode's rollouts, read from the agents' coordinator.
    #[command(after_help = ROLLOUT_STATUS_HELP)]
    Rollout(RolloutCommand),
    /// Write the manifest of a unit a host runs now.
    ///
    /// Write the manifest of a unit a host runs now (adopting a hand-written unit): SGLang's
    /// flags, env and systemd settings, drop-ins folded in, secrets as references. Changes nothing.
    #[command(after_help = IMPORT_HELP)]
    Import(ImportArgs),
    /// Print a completion script for bash, zsh or fish.
    ///
    /// Print a completion script for bash, zsh or fish on stdout (see the examples for where each
    /// shell reads it).
    #[command(after_help = COMPLETIONS_HELP)]
    Completions(CompletionsArgs),
    /// Print the manifest's JSON Schema, for editors.
    ///
    /// Print the manifest's JSON Schema on stdout, for editors: the one the repository keeps in
    /// schemas/manifest.schema.json, generated from the types the parser reads manifests into.
    #[command(after_help = SCHEMA_HELP)]
    Schema,
    /// Write the man pages into DIR.
    ///
    /// Write the man pages (reconcile.1 and one per command), generated from this command line,
    /// into DIR: what the Debian package installs (packaging/deb/build.sh).
    #[command(hide = true, after_help = MANPAGES_HELP)]
    Manpages(ManpagesArgs),
}

const MANPAGES_HELP: &str = "\
Examples:
  reconcile manpages target/man";

#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// The folder to write them into (created when missing).
    pub dir: PathBuf,
}

/// Writes `reconcile.1` and `reconcile-<command>.1` for every command shown in `--help` into
/// `dir`, generated from [`Cli`] itself, as the completions are.
pub fn manpages(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    let root = Cli::command().version(env!("CARGO_PKG_VERSION"));
    let mut written = Vec::new();
    let mut page = |name: String, cmd: clap::Command| -> std::io::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.name(name.clone())).render(&mut out)?;
        std::fs::write(&path, out)?;
        written.push(path);
        Ok(())
    };
    for sub in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        page(format!("reconcile-{}", sub.get_name()), sub.clone())?;
    }
    page("reconcile".into(), root)?;
    Ok(written)
}

const SCHEMA_HELP: &str = "\
Examples:
  reconcile schema > schemas/manifest.schema.json   # the file the repository keeps

An editor validates and completes a manifest with the schema named on its first line (VS Code's
YAML extension and neovim's yaml-language-server read it):
  # yaml-language-server: $schema=../schemas/manifest.schema.json
The schema checks the structure (fields, types, hosts: or nodes:, ports); `reconcile validate`
checks the rest (flags against SGLang's catalog, conflicts between manifests).";

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The host, as a manifest names it: an ssh destination (`gpu-a`, `user@host:port`) or
    /// `local`.
    pub host: String,

    /// The unit (`sglang-qwen` or `sglang-qwen.service`).
    pub unit: String,

    /// Write the manifest to FILE instead of stdout; an existing FILE is refused unless --force.
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Replace FILE when it exists.
    #[arg(long, requires = "out")]
    pub force: bool,

    /// Env names whose values are secret whatever they are called (written as references and
    /// into the manifest's `secret_env`); may be repeated.
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,

    #[command(flatten)]
    pub ssh: SshArgs,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The shells `completions` writes for: the ones its tests check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Writes `shell`'s completion script for the whole command line, generated from [`Cli`] itself
/// so it cannot miss a flag.
pub fn completions(shell: Shell, out: &mut dyn std::io::Write) {
    use clap::CommandFactory;
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut Cli::command(), "reconcile", out);
}

const BENCH_HELP: &str = "\
Examples:
  reconcile bench sglang-qwen --host gpu-a
    gpu-a sglang-qwen.service: baseline stored in 41.3s: baseline recorded: 1: 212 tok/s, 16: 1,130 tok/s, 64: 1,540 tok/s
  reconcile bench sglang-qwen --format json

Exit codes:
  0  every host was benchmarked and its figures stored
  1  a host could not be reached or benchmarked (requests failed, the unit is not running, no
     deployment record to keep the figures in, locked)";

const EXPERIMENT_HELP: &str = "\
Examples:
  reconcile experiment experiments/qwen.yaml --estimate
    experiment sglang-qwen.service on gpu-canary: 6 variants, about 1 h 50 min
  reconcile experiment experiments/qwen.yaml --chart qwen.svg --format markdown
  reconcile experiment experiments/qwen.yaml --write --keep-best
  reconcile experiment experiments/qwen.yaml --resume

Exit codes:
  0  finished, and the two baselines agree within the stated noise (failed variants are results)
  1  bad input (file:line:field, no host contacted), an unreachable host, or over the budget
  2  finished, but the drift check does not trust the ranking (no winner)
  3  interrupted: the baseline was restored and verified; --resume continues
  4  the baseline could not be restored: the host needs attention";

const QUALITY_HELP: &str = "\
Examples:
  reconcile quality sglang-qwen
  reconcile quality sglang-qwen --host gpu-a --format json

Exit codes:
  0  measured and kept as the reference on every host
  1  a host could not be measured, or its server no longer answers as its kept reference says
     (nothing was stored there)";

#[derive(Debug, Args)]
pub struct QualityArgs {
    #[command(flatten)]
    pub history: HistoryArgs,

    #[command(flatten)]
    pub lock: LockArgs,
}

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

const AGENT_HELP: &str = "\
Examples:
  reconcile agent --repo https://git.example.com/infra/llm-manifests.git --once
  reconcile agent --repo /srv/llm-manifests.git --branch prod --as gpu-a --interval 10m
  reconcile agent --repo /srv/llm-manifests.git --as gpu-a --coordinator etcd://10.0.0.5:2379
  reconcile agent --repo /srv/llm-manifests.git --metrics-file /var/lib/prometheus/node-exporter/reconcile.prom

Exit codes (of --once; an interval agent reports each round and keeps going until SIGTERM):
  0  every unit of this host converged or needed nothing (or the host has none)
  1  the checkout could not be updated, the manifests at the commit are bad (nothing was touched),
     or a unit failed before any change (preflight, lock)
  3  verification failed; the unit was rolled back to its previous unit, which passed
  4  verification failed and the rollback failed too: the host needs attention
With --coordinator, a unit held back (the canary or the failure budget stopped the rollout, or
its turn did not come within --coordinator-wait) is not started: exit 1, its server untouched.";

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

    /// Preflight's deep check for every unit that changes, saying what it could not check (it
    /// runs for units that restart or are new either way).
    #[arg(long)]
    pub deep: bool,

    /// After every round that applied, write this machine's units' metrics to FILE in
    /// Prometheus' text format, atomically: point node_exporter's textfile collector
    /// (--collector.textfile.directory) at its folder and name it `*.prom`.
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,

    #[command(flatten)]
    pub lock: LockArgs,

    #[command(flatten)]
    pub coordinator: CoordinatorArgs,

    /// How long after this agent dies its restart slot frees itself: the slot's lease TTL, renewed
    /// three times per TTL while the restart and its verification run.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION", requires = "coordinator")]
    pub lease_ttl: std::time::Duration,

    /// How long a round waits for its turn (the canary, a free slot) or for a coordinator it
    /// cannot reach, changing nothing, before it gives up; the next round asks again.
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration, value_name = "DURATION", requires = "coordinator")]
    pub coordinator_wait: std::time::Duration,

    /// Time between looks at the coordinator while waiting.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION", requires = "coordinator")]
    pub coordinator_poll: std::time::Duration,

    /// The coordination benchmark (bench/agents.sh): units are not applied; each needs this
    /// (`restart` or `nothing`) and a restart is a sleep of --drill-restart.
    #[arg(long, hide = true, value_parser = ["restart", "nothing"])]
    pub drill: Option<String>,

    #[arg(long, hide = true, default_value = "1s", value_parser = humantime::parse_duration)]
    pub drill_restart: std::time::Duration,

    /// Where each simulated restart's host, start and end (unix ns) are appended.
    #[arg(long, hide = true)]
    pub drill_log: Option<PathBuf>,
}

/// Where the coordinator of pull agents is (an etcd v3 cluster) and how to authenticate to it,
/// as etcd's own clients do: TLS with a CA and an optional client certificate, and a user whose
/// password comes from a file or the environment, never from a manifest or the command line.
#[derive(Debug, Clone, Args)]
pub struct CoordinatorArgs {
    /// The etcd cluster: `etcd://host:2379[,host:2379...]` (TLS when a CA is given), or
    /// `http://`/`https://` URLs.
    #[arg(long, env = "RECONCILE_COORDINATOR", value_name = "URLS")]
    pub coordinator: Option<String>,

    /// The key prefix of this fleet in etcd.
    #[arg(long, env = "RECONCILE_COORDINATOR_PREFIX", default_value = reconcile_core::rollout::ledger::DEFAULT_PREFIX, value_name = "PREFIX")]
    pub coordinator_prefix: String,

    /// The CA certificate (PEM) of the etcd members; turns TLS on (etcdctl's --cacert).
    #[arg(
        long,
        env = "RECONCILE_COORDINATOR_CA",
        value_name = "FILE",
        requires = "coordinator"
    )]
    pub coordinator_ca: Option<PathBuf>,

    /// A client certificate (PEM) for etcd, with --coordinator-key (etcdctl's --cert).
    #[arg(long, env = "RECONCILE_COORDINATOR_CERT", value_name = "FILE", requires_all = ["coordinator_key", "coordinator_ca"])]
    pub coordinator_cert: Option<PathBuf>,

    /// The client certificate's key (PEM) (etcdctl's --key).
    #[arg(
        long,
        env = "RECONCILE_COORDINATOR_KEY",
        value_name = "FILE",
        requires = "coordinator_cert"
    )]
    pub coordinator_key: Option<PathBuf>,

    /// An etcd user, for a cluster with authentication on; its password from
    /// --coordinator-password-file or RECONCILE_COORDINATOR_PASSWORD.
    #[arg(
        long,
        env = "RECONCILE_COORDINATOR_USER",
        value_name = "NAME",
        requires = "coordinator"
    )]
    pub coordinator_user: Option<String>,

    /// A file holding the etcd user's password (its first line).
    #[arg(
        long,
        env = "RECONCILE_COORDINATOR_PASSWORD_FILE",
        value_name = "FILE",
        requires = "coordinator_user"
    )]
    pub coordinator_password_file: Option<PathBuf>,
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
            coordinator: None,
            drill: args.drill.as_deref().map(|need| agent::Drill {
                need: if need == "restart" {
                    crate::apply::Need::Restart
                } else {
                    crate::apply::Need::Nothing
                },
                restart: args.drill_restart,
                log: args.drill_log.clone(),
            }),
            metrics_file: args.metrics_file,
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

/// How `apply` rolls out over the fleet. Each flag left out falls to the manifests' `rollout:`
/// (the strictest of the services applied), then to the default shown.
#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// Hosts that go first, one batch, and must pass every verification stage before any other
    /// host starts. Only hosts with something to change count: up-to-date hosts are skipped. A
    /// manifest's `rollout.canary` host goes first. [default: 1]
    #[arg(long, value_name = "N")]
    pub canary: Option<usize>,

    /// Hosts applied at once after the canary. [default: rollout.max_parallel, else 4]
    #[arg(long, value_name = "N")]
    pub max_parallel: Option<usize>,

    /// Failed hosts, across the whole rollout, after which no new host is started.
    /// [default: rollout.max_failures, else 1]
    #[arg(long, value_name = "N")]
    pub max_failures: Option<usize>,

    /// When the rollout stops early, roll back the hosts it already converged.
    #[arg(long)]
    pub rollback_all: bool,
}

impl RolloutArgs {
    pub fn asked(&self) -> reconcile_core::rollout::Asked {
        reconcile_core::rollout::Asked {
            canary: self.canary,
            max_parallel: self.max_parallel,
            max_failures: self.max_failures,
            rollback_all: self.rollback_all,
        }
    }
}

const STATUS_HELP: &str = "\
Examples:
  reconcile status
  reconcile status --host gpu-a --host gpu-b --format json
  reconcile status -l service=sglang-qwen --format markdown
  reconcile status --coordinator etcd://10.0.0.5:2379 --format json
  reconcile status --format prometheus > /var/lib/prometheus/node-exporter/reconcile.prom

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

    /// Output format: text for a terminal, markdown for a pull request comment, json for tools,
    /// prometheus for a metrics scrape (the text exposition format: push mode's counterpart of
    /// the agent's --metrics-file).
    #[arg(long, value_enum, default_value = "text")]
    pub format: StatusFormat,

    #[command(flatten)]
    pub ssh: SshArgs,

    /// Hosts read at once.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub parallel: usize,

    /// Hash every file of each pinned model's copy (`sglang.model:`) against the lock file,
    /// instead of checking their sizes: reads the whole model on every host.
    #[arg(long)]
    pub verify_weights: bool,

    /// Read every host's last outcome from the pull agents' coordinator instead of the hosts:
    /// no SSH. The manifests, when they load, say which hosts are behind the newest change.
    #[command(flatten)]
    pub coordinator: CoordinatorArgs,
}

/// `status --format`: the report formats, and Prometheus' text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Text,
    Markdown,
    Json,
    Prometheus,
}

impl StatusFormat {
    /// The report format, `None` for Prometheus' own.
    pub fn report(self) -> Option<Format> {
        match self {
            StatusFormat::Text => Some(Format::Text),
            StatusFormat::Markdown => Some(Format::Markdown),
            StatusFormat::Json => Some(Format::Json),
            StatusFormat::Prometheus => None,
        }
    }
}

#[derive(Debug, Args)]
pub struct RolloutCommand {
    #[command(subcommand)]
    pub command: RolloutSub,
}

#[derive(Debug, Subcommand)]
pub enum RolloutSub {
    /// A service's rollout as the pull agents' coordinator sees it, for the change the manifests
    /// render now: the canary, hosts in flight, done, failed, waiting and held.
    #[command(after_help = ROLLOUT_STATUS_HELP)]
    Status(RolloutStatusArgs),
}

#[derive(Debug, Args)]
pub struct RolloutStatusArgs {
    /// The service (`sglang-qwen` or `sglang-qwen.service`).
    pub service: String,

    /// Manifest files or folders: the change and the hosts' order come from here.
    #[arg(default_value = "manifests")]
    pub paths: Vec<PathBuf>,

    #[command(flatten)]
    pub coordinator: CoordinatorArgs,

    /// Keep watching, printing the progress each time it changes, until every host is done.
    #[arg(long)]
    pub watch: bool,

    /// Output format: text for a terminal, markdown for a pull request comment, json for tools.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

const ROLLOUT_STATUS_HELP: &str = "\
Examples:
  reconcile rollout status sglang-qwen --coordinator etcd://10.0.0.5:2379
  reconcile rollout status sglang-qwen --coordinator etcd://10.0.0.5:2379 --watch

Exit codes:
  0  every host is done with the change and none failed
  1  error: bad manifests, or the coordinator could not be read
  2  the rollout is under way (hosts in flight, waiting, or not reported yet)
  3  some host failed or was held: the rollout stopped";

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
pub struct ExperimentArgs {
    /// The experiment file (YAML): manifest, host, variants or grid, benchmark, objective,
    /// constraints, budget.
    pub file: PathBuf,

    /// At the end, leave the best variant that met every constraint running (applied and
    /// verified again) instead of the baseline.
    #[arg(long)]
    pub keep_best: bool,

    /// Edit the manifest in place with the winner's change (comments and layout kept); without
    /// it the change is printed as a unified diff.
    #[arg(long)]
    pub write: bool,

    /// Continue an interrupted experiment from the state it left on the host.
    #[arg(long)]
    pub resume: bool,

    /// Write the chart (output tok/s against concurrency per run) to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,

    /// Print the estimate and check everything offline, then stop.
    #[arg(long)]
    pub estimate: bool,

    /// Output format: text, markdown (for a pull request, with a Mermaid chart) or json.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    #[command(flatten)]
    pub lock: LockArgs,

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

    /// For every unit, what `systemd.dropins: replace` does for one manifest: move what systemd
    /// runs besides the manifest's unit (drop-ins it does not own, a mask, a unit file in /run)
    /// aside into the unit's generations, restorable, and install the manifest's unit alone.
    /// Without it apply refuses such a unit and touches nothing.
    #[arg(long)]
    pub replace_dropins: bool,

    /// Do not read a restarting server's weights into its host's page cache before the old server
    /// stops. By default each file its safetensors index names is read at low I/O priority, for
    /// at most the load deadline, when the weights fit in 90 % of the host's available memory, so
    /// the new server loads them from memory.
    #[arg(long)]
    pub no_stage: bool,
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
pub struct LockCommand {
    #[command(flatten)]
    pub manifests: Manifests,

    /// List every pinned revision again, not only those the lock lacks.
    #[arg(long)]
    pub update: bool,

    #[command(flatten)]
    pub ssh: SshArgs,
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

    #[command(flatten)]
    pub deep: DeepArgs,

    /// Restart every changed server, also where its manifest says `apply: { live: true }` and
    /// the running server could take the change without a restart.
    #[arg(long)]
    pub restart: bool,

    /// Colour the text output: auto (a terminal, unless NO_COLOR is set), always or never.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
}

/// When preflight asks each host's own SGLang (the deep check).
#[derive(Debug, Clone, Copy, Args)]
pub struct DeepArgs {
    /// The deep check for every unit that changes, reload-only ones too, and say what it could
    /// not check (it needs a GPU for some, and this SGLang may lack others). Without it, the check
    /// runs for each unit that restarts or is new, and speaks only when SGLang refuses the unit.
    #[arg(long, conflicts_with = "no_deep")]
    pub deep: bool,

    /// Skip the deep check: each host's SGLang parses each restarting unit's exact arguments and
    /// builds its model's config (config.json, dtype, --context-length, quantization) and checks
    /// --chat-template, as a launch would before loading weights. It costs 10-30 s a unit
    /// (importing torch), and catches what no catalog knows before the old server stops.
    #[arg(long)]
    pub no_deep: bool,
}

impl From<DeepArgs> for crate::preflight::DeepWhen {
    fn from(args: DeepArgs) -> crate::preflight::DeepWhen {
        crate::preflight::DeepWhen::from_flags(args.deep, args.no_deep)
    }
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

    use super::{completions, Cli, Command, Shell};

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

    /// The command lines of a help text's "Examples:" block: its two-space-indented lines (deeper
    /// ones are sample output), up to the first blank line.
    fn help_examples(help: &str) -> Vec<String> {
        help.lines()
            .skip_while(|l| *l != "Examples:")
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .map(|l| l.trim().to_string())
            .collect()
    }

    #[test]
    fn help_examples_take_the_block_and_skip_sample_output() {
        let help = "Examples:\n  reconcile a   # why\n    output line\n  reconcile b\n\nExit codes:\n  0  ok";
        assert_eq!(help_examples(help), ["reconcile a   # why", "reconcile b"]);
        assert!(help_examples("Exit codes:\n  0  ok").is_empty());
    }

    /// `reconcile --help` lists each command on one line a terminal of 80 columns shows whole;
    /// the paragraph is `reconcile help CMD`'s.
    #[test]
    fn the_command_list_fits_80_columns_and_each_command_says_more_in_its_own_help() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        let list: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(list.len() > 10, "{help}");
        for line in &list {
            assert!(line.len() <= 80, "{} columns: {line}", line.len());
        }
        let mut root = Cli::command();
        let apply = root
            .find_subcommand_mut("apply")
            .expect("apply")
            .render_long_help();
        assert!(
            apply.to_string().contains("roll back a unit that fails it"),
            "{apply}"
        );
    }

    /// Every example in the top-level help and in each command's help parses with the real
    /// command line, as the command whose help shows it, so `--help` cannot drift from the flags.
    #[test]
    fn every_help_has_examples_and_they_parse() {
        use clap::CommandFactory;
        let root = Cli::command();
        let helps = std::iter::once((None, &root))
            .chain(root.get_subcommands().map(|c| (Some(c.get_name()), c)));
        let mut parsed = 0;
        for (name, cmd) in helps {
            let help = cmd
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let examples = help_examples(&help);
            assert!(
                !examples.is_empty(),
                "{name:?}: no Examples: block in\n{help}"
            );
            for line in examples {
                let argv = shell_words(&line);
                assert_eq!(
                    argv.first().map(String::as_str),
                    Some("reconcile"),
                    "{name:?}: `{line}`"
                );
                Cli::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{name:?}: `{line}` does not parse:\n{e}"));
                let matches = Cli::command()
                    .try_get_matches_from(&argv)
                    .expect("parsed above");
                // The top-level help may show any command; a command's help shows only its own.
                if name.is_some() {
                    assert_eq!(
                        matches.subcommand_name(),
                        name,
                        "`{line}` in {name:?}'s help"
                    );
                }
                parsed += 1;
            }
        }
        // At least one for the top level and one for each command.
        assert!(parsed > root.get_subcommands().count(), "{parsed} examples");
    }

    /// Each shell's script names every command and some flags of each kind.
    #[test]
    fn completions_name_every_command_and_flag() {
        use clap::CommandFactory;
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            completions(shell, &mut script);
            let script = String::from_utf8(script).expect("utf-8");
            for name in &names {
                assert!(
                    script.contains(name.as_str()),
                    "{shell:?} script lacks `{name}`"
                );
            }
            for flag in ["dry-run", "max-parallel", "break-stale-lock"] {
                // fish names a long flag `-l NAME`; bash and zsh write `--NAME`.
                let written = match shell {
                    Shell::Fish => format!("-l {flag}"),
                    Shell::Bash | Shell::Zsh => format!("--{flag}"),
                };
                assert!(
                    script.contains(&written),
                    "{shell:?} script lacks `{written}`"
                );
            }
        }
    }

    /// Runs `code` in `shell` with the completion script as its last argument (`$1`; in fish,
    /// whose `-c` has no `$0`, `$argv[-1]`): its stdout. A missing shell fails the test: the
    /// tests of shells a machine may lack (zsh, fish) are `#[ignore]`d, and `tests/run.sh`, which
    /// runs them, has CI install both.
    fn in_shell(shell: Shell, program: &str, flags: &[&str], code: &str) -> String {
        let program = which(program).unwrap_or_else(|_| {
            panic!("no {program} here: install it to test its completion script")
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("reconcile-completions");
        let mut script = Vec::new();
        completions(shell, &mut script);
        std::fs::write(&file, script).expect("write script");
        let out = std::process::Command::new(program)
            .args(flags)
            .arg("-c")
            .arg(code)
            .arg("shell")
            .arg(&file)
            // zsh's compinit keeps its cache in $HOME; fish its history.
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .output()
            .expect("the shell runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{shell:?}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// bash registers the script for `reconcile`, and completes a command and a flag with it the
    /// way its readline calls it.
    #[test]
    fn bash_completes_with_the_script() {
        let code = r#"source "$1" && complete -p reconcile &&
            COMP_WORDS=(reconcile ap) COMP_CWORD=1 && _reconcile reconcile ap reconcile &&
            echo "[${COMPREPLY[*]}]" &&
            COMP_WORDS=(reconcile apply --max) COMP_CWORD=2 && _reconcile reconcile --max apply &&
            echo "[${COMPREPLY[*]}]""#;
        let stdout = in_shell(Shell::Bash, "bash", &["--norc"], code);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        assert!(
            lines[0].starts_with("complete ") && lines[0].ends_with(" reconcile"),
            "{stdout}"
        );
        assert_eq!(lines[1], "[apply]");
        let flags: Vec<&str> = lines[2].trim_matches(['[', ']']).split(' ').collect();
        assert!(
            flags.contains(&"--max-parallel") && flags.contains(&"--max-failures"),
            "{stdout}"
        );
    }

    /// zsh parses the script, and once compinit has run, sourcing it registers `_reconcile`.
    #[test]
    #[ignore = "needs zsh: run by `tests/run.sh`"]
    fn zsh_registers_the_script() {
        let code = r#"zsh -n "$1" && autoload -U compinit && compinit -u -D && source "$1" &&
            print -r -- "$_comps[reconcile]""#;
        let stdout = in_shell(Shell::Zsh, "zsh", &["-f"], code);
        assert_eq!(stdout.trim(), "_reconcile");
    }

    /// fish completes a command and a flag with the script, as it would on a Tab.
    #[test]
    #[ignore = "needs fish: run by `tests/run.sh`"]
    fn fish_completes_with_the_script() {
        let code = r#"source $argv[-1]; and complete -C "reconcile ap"; and complete -C "reconcile apply --max""#;
        let stdout = in_shell(Shell::Fish, "fish", &["--no-config"], code);
        let words: Vec<&str> = stdout
            .lines()
            .map(|l| l.split('\t').next().unwrap_or(""))
            .collect();
        assert_eq!(
            words,
            ["apply", "--max-failures", "--max-parallel"],
            "{stdout}"
        );
    }

    /// The program's path on PATH, as the shell would find it.
    fn which(program: &str) -> Result<std::path::PathBuf, ()> {
        let path = std::env::var_os("PATH").ok_or(())?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
            .ok_or(())
    }

    #[test]
    fn a_command_after_a_global_flag_is_named() {
        let misplaced = |argv: &[&str]| {
            Cli::try_parse_from(argv)
                .expect("parses")
                .misplaced_command()
        };
        assert_eq!(misplaced(&["reconcile", "-v", "plan"]), Some("plan".into()));
        assert_eq!(
            misplaced(&[
                "reconcile",
                "--command-timeout",
                "5s",
                "apply",
                "--host",
                "a"
            ]),
            Some("apply".into())
        );
        assert_eq!(misplaced(&["reconcile", "plan", "-v"]), None);
        assert_eq!(
            misplaced(&["reconcile", "-v", "--dry-run", "manifests"]),
            None
        );
        assert_eq!(misplaced(&["reconcile", "-v"]), None);
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
