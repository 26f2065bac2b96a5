//! systemd unit files: rendering a manifest into one, and reading one back.
//!
//! Both directions meet in [`UnitModel`], what a unit means rather than how it is written: the argv
//! systemd will execute, the environment it will set, and every other setting. Comparing models
//! (not text) is what lets a plan tell a reformatted unit from one that needs a restart.

mod escape;
mod hardening;
mod read;
mod render;
mod secrets;
pub mod specifier;

use std::collections::BTreeMap;

pub use escape::{quote_env, quote_exec_arg};
pub use read::{assigned, assignments, parse_unit};
pub use render::{render, Desired};
pub use secrets::{looks_secret, SecretsFile, SECRETS_DIR};

/// What a unit file means.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitModel {
    /// `ExecStart=`'s argv, as systemd executes it (quotes, escapes, `%%`, `$$` and the specifiers
    /// every host resolves alike, `%h`, resolved: see [`specifier`]).
    pub exec_start: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Every other setting as `Section.Key`; a key given several times keeps its values in order.
    pub settings: BTreeMap<String, Vec<String>>,
}

/// Settings whose change takes effect with `daemon-reload` alone: metadata, ordering and dependency
/// links, install targets, and policies systemd reads only when the process exits or is stopped.
pub fn takes_effect_without_restart(setting: &str) -> bool {
    let (section, key) = setting.split_once('.').unwrap_or(("", setting));
    let (section, key) = current_spelling(section, key).unwrap_or((section, key));
    match section {
        "Unit" | "Install" => true,
        "Service" => matches!(
            key,
            "Restart"
                | "RestartSec"
                | "RestartSteps"
                | "RestartMaxDelaySec"
                | "RestartPreventExitStatus"
                | "RestartForceExitStatus"
                | "SuccessExitStatus"
                | "TimeoutStopSec"
                | "TimeoutAbortSec"
                | "KillMode"
                | "KillSignal"
                | "FinalKillSignal"
                | "SendSIGKILL"
        ),
        _ => false,
    }
}

/// Where systemd keeps a setting written in its old place or under its old name: these five moved
/// from `[Service]` to `[Unit]` (systemd's `load-fragment-gperf.gperf`: "only exist for
/// compatibility, they moved into Unit"), and `StartLimitInterval=` is `StartLimitIntervalSec=`.
/// `None` for a setting already written the current way.
pub fn current_spelling(section: &str, key: &str) -> Option<(&'static str, &'static str)> {
    let moved = match key {
        "StartLimitInterval" => "StartLimitIntervalSec",
        "StartLimitBurst" => "StartLimitBurst",
        "StartLimitAction" => "StartLimitAction",
        "FailureAction" => "FailureAction",
        "RebootArgument" => "RebootArgument",
        _ => return None,
    };
    let legacy = section == "Service" || (section == "Unit" && key != moved);
    legacy.then_some(("Unit", moved))
}

/// `[Unit]` settings that name other units: each assignment adds to the list.
const DEPENDENCIES: [&str; 12] = [
    "After",
    "Before",
    "Wants",
    "Requires",
    "Requisite",
    "BindsTo",
    "PartOf",
    "Conflicts",
    "Upholds",
    "Documentation",
    "OnFailure",
    "OnSuccess",
];

/// `[Install]` settings, lists all of them.
const INSTALL: [&str; 5] = ["WantedBy", "RequiredBy", "UpheldBy", "Alias", "Also"];

/// Whether a later assignment of `setting` (as `Section.Key`) adds to its earlier values rather
/// than replacing them: dependencies, install targets, the other `Exec*=` commands, paths and
/// conditions, as systemd.unit(5), systemd.service(5) and systemd.exec(5) describe them. What
/// a drop-in does to a setting depends on it: it adds an `After=` but replaces a `User=`.
pub fn is_list_setting(setting: &str) -> bool {
    let (section, key) = setting.split_once('.').unwrap_or(("", setting));
    const SERVICE_LISTS: [&str; 17] = [
        "ExecStartPre",
        "ExecStartPost",
        "ExecCondition",
        "ExecReload",
        "ExecStop",
        "ExecStopPost",
        "EnvironmentFile",
        "PassEnvironment",
        "UnsetEnvironment",
        "ReadWritePaths",
        "ReadOnlyPaths",
        "InaccessiblePaths",
        "BindPaths",
        "BindReadOnlyPaths",
        "DeviceAllow",
        "SupplementaryGroups",
        "LoadCredential",
    ];
    match section {
        "Unit" => {
            DEPENDENCIES.contains(&key) || key.starts_with("Condition") || key.starts_with("Assert")
        }
        "Install" => INSTALL.contains(&key),
        _ => SERVICE_LISTS.contains(&key),
    }
}

/// Which section a setting from the manifest's `systemd:` map belongs in.
pub fn section_of(key: &str) -> &'static str {
    const UNIT: [&str; 7] = [
        "StartLimitIntervalSec",
        "StartLimitBurst",
        "StartLimitAction",
        "FailureAction",
        "SuccessAction",
        "RebootArgument",
        "JobTimeoutSec",
    ];
    if DEPENDENCIES.contains(&key)
        || UNIT.contains(&key)
        || key.starts_with("Condition")
        || key.starts_with("Assert")
    {
        "Unit"
    } else if INSTALL.contains(&key) {
        "Install"
    } else {
        "Service"
    }
}
