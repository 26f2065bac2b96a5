//! The stages a unit's apply passes or fails at: verification's own, the gates after it, the
//! restart before it, and a server group's. Reports, deployment records, experiment results and
//! the live display all name them; their spelling is what those have always carried.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One stage of an apply, in the order a restart meets them. Serialized as its [`Stage::name`]
/// (`"crash window"`, with the space), which JSON consumers match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    /// `systemctl restart` itself (a group's ordered stop and start).
    #[serde(rename = "restart")]
    Restart,
    /// A live change (`apply.live`): the running server told it, without a restart.
    #[serde(rename = "live")]
    Live,
    /// The first seconds after the restart: any crash, restart or new invocation fails it.
    #[serde(rename = "crash window")]
    CrashWindow,
    /// Weights, KV cache and CUDA graphs, the port still closed: a crash, a stall or a dead
    /// worker fails it.
    #[serde(rename = "loading")]
    Loading,
    /// `/v1/models` serves the expected model with the expected context length.
    #[serde(rename = "identity")]
    Identity,
    /// The port is open and SGLang's warmup request runs.
    #[serde(rename = "warmup")]
    Warmup,
    /// `/health` answers 200.
    #[serde(rename = "readiness")]
    Readiness,
    /// Memory within its bounds, and its plateau once loaded.
    #[serde(rename = "memory")]
    Memory,
    /// The smoke completion answered what the manifest expects.
    #[serde(rename = "smoke")]
    Smoke,
    /// The throughput gate (`verify.benchmark`).
    #[serde(rename = "benchmark")]
    Benchmark,
    /// The quality gate (`verify.quality`).
    #[serde(rename = "quality")]
    Quality,
    /// A rank of a server group that failed because its group did, not at a stage of its own.
    #[serde(rename = "group")]
    Group,
}

impl Stage {
    /// Every stage, in the order a restart meets them.
    pub const ALL: [Stage; 12] = [
        Stage::Restart,
        Stage::Live,
        Stage::CrashWindow,
        Stage::Loading,
        Stage::Identity,
        Stage::Warmup,
        Stage::Readiness,
        Stage::Memory,
        Stage::Smoke,
        Stage::Benchmark,
        Stage::Quality,
        Stage::Group,
    ];

    /// The name reports, records and the live display give it: its JSON spelling.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Restart => "restart",
            Stage::Live => "live",
            Stage::CrashWindow => "crash window",
            Stage::Loading => "loading",
            Stage::Identity => "identity",
            Stage::Warmup => "warmup",
            Stage::Readiness => "readiness",
            Stage::Memory => "memory",
            Stage::Smoke => "smoke",
            Stage::Benchmark => "benchmark",
            Stage::Quality => "quality",
            Stage::Group => "group",
        }
    }
}

impl fmt::Display for Stage {
    /// The name, padded as a `&str` would be, so `{:<12}` lines up as it did.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stages_name_is_its_json_and_reads_back() {
        for stage in Stage::ALL {
            let json = serde_json::to_value(stage).unwrap();
            assert_eq!(json, stage.name(), "{stage:?}");
            assert_eq!(serde_json::from_value::<Stage>(json).unwrap(), stage);
            assert_eq!(stage.to_string(), stage.name());
        }
        assert_eq!(format!("[{:<14}]", Stage::CrashWindow), "[crash window  ]");
    }
}
