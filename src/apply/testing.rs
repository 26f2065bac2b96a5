//! Fixtures for apply's unit tests: a target from a small manifest, run options, observed states.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ApplyOptions, GitInfo, LockPolicy, Owner, Rollout};
use crate::observed::{Observed, UnitState};
use crate::targets::Target;

pub const MANIFEST: &str = "service: s\nhosts: [gpu-a]\nsglang:\n  python: /venv/bin/python3\n  version: 0.5.23\n  model_path: /models/m\n  port: 30000\n";

/// `s.service` on `gpu-a`.
pub fn target() -> Target {
    let m = crate::manifest::parse("manifests/s.yaml", MANIFEST).expect("parses");
    crate::targets::targets(&[m], &Default::default())
        .expect("targets")
        .remove(0)
}

/// Options of a run; `cancel` is its Ctrl-C.
pub fn options(cancel: CancellationToken) -> ApplyOptions {
    ApplyOptions {
        owner: Owner {
            user: "me".into(),
            machine: "box".into(),
            pid: 1,
        },
        lock: LockPolicy {
            break_stale: false,
            ttl: Duration::from_secs(3600),
        },
        git: GitInfo::default(),
        cancel,
        progress: None,
        deep: crate::preflight::DeepWhen::default(),
        rollout: Rollout {
            canary: 0,
            max_parallel: 1,
            max_failures: 1,
            rollback_all: false,
        },
        restoring: None,
        redactor: Default::default(),
        routers: None,
        replace_dropins: false,
        preload: true,
        strict: false,
    }
}

pub fn observed(unit_text: Option<&str>, active_state: &str) -> Observed {
    Observed {
        unit_text: unit_text.map(str::to_string),
        state: UnitState {
            active_state: active_state.into(),
            ..UnitState::default()
        },
        unit_files: Default::default(),
    }
}
