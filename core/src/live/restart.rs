//! Why a change takes a restart rather than a live change: every reason [`super::live_change`],
//! [`super::candidate`] and [`super::checkpoints_agree`] give, typed so that a caller can tell a
//! server that is down from a flag that differs without reading the plan's note.

use super::SAMPLING_FILE;

/// Why a restart cannot be applied live; the plan notes it (`not applied live (...)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestartNeeded {
    /// The environment or a unit setting differs, as [`crate::plan::restart_reason`] names it.
    #[error("{reason} changes, which only a restart applies")]
    Unit { reason: String },
    /// The program or the module ExecStart runs differs.
    #[error("the command changes")]
    Command,
    /// A server group (`--nnodes` over 1): each rank restarts instead.
    #[error("a server over several hosts takes changes by a restart of its ranks")]
    Group,
    /// A side of the move has no `--model-path`.
    #[error("the unit names no --model-path")]
    NoModelPath,
    /// A flag neither the weights nor `/set_internal_state` change.
    #[error("the flag --{name} changes, which only a restart applies")]
    Flag { name: String },
    /// A weight update would answer under the model path, not `--served-model-name`.
    #[error("SGLang answers under the new model path after a weight update, not under --served-model-name {name} as a restart would")]
    ServedModelName { name: String },
    /// The commands read the same: no live change to make.
    #[error("nothing SGLang takes live changes")]
    Nothing,
    /// A `/set_internal_state` value that is no number.
    #[error("--{flag} {value} is not a number")]
    NotANumber {
        flag: &'static str,
        value: String,
        #[source]
        source: std::num::ParseFloatError,
    },
    /// A setting left out on one side whose SGLang default (`None`) cannot be set back live.
    #[error(
        "--{flag} must be set before and after: SGLang's default for it (None) cannot be set live"
    )]
    NoDefault { flag: &'static str },
    /// systemd runs drop-ins or a unit file besides the managed one.
    #[error("systemd runs more than the managed unit file")]
    Drift,
    /// The server is not running, so nothing can take the change.
    #[error("the server is {state}, not running")]
    NotRunning {
        /// systemd's `ActiveState`.
        state: String,
    },
    /// The host has no unit file to compare with.
    #[error("the host has no unit file")]
    NoUnitFile,
    /// No catalog for the manifest's SGLang version.
    #[error("SGLang {version} is not cataloged, so its flags cannot be compared")]
    Uncataloged { version: String },
    /// A side of the weight move is no local checkpoint (a hub id, a missing folder).
    #[error("{path} has no config.json (a weight update loads a local checkpoint)")]
    NoConfig { path: String },
    /// The two checkpoints have different shapes.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A file a weight update does not read again differs (the tokenizer's, the sampling
    /// defaults).
    #[error("{file} differs between the checkpoints ({})", read_once(.file))]
    FileDiffers { file: &'static str },
}

fn read_once(file: &str) -> &'static str {
    if file == SAMPLING_FILE {
        "the default sampling parameters are read at start-up only"
    } else {
        "the tokenizer is read at start-up only"
    }
}

/// Why two checkpoints' `config.json` do not describe one model shape ([`super::same_shape`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Not JSON, or not an object.
    #[error("the {which} checkpoint's config.json does not read")]
    Unreadable {
        /// `old` or `new`.
        which: &'static str,
    },
    /// The first shaping field that differs, each side as JSON text or `(none)`.
    #[error("config.json's {key} differs: {old} -> {new}")]
    Differs {
        key: String,
        old: String,
        new: String,
    },
}
