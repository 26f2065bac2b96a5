//! `rollout:`: how a change of the service goes over its hosts, the same in push mode (`reconcile
//! apply`, whose flags override it) and pull mode (agents with a coordinator). The decisions are
//! `crate::rollout`'s.

use super::locate::Seg;
use super::Manifest;

/// A manifest's `rollout:`; each field left out falls to apply's flag or the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutSpec {
    /// The host that goes first and must pass before any other restarts; without it, the first
    /// host listed (with something to do).
    pub canary: Option<String>,
    /// Hosts restarting at once after the canary.
    pub max_parallel: Option<usize>,
    /// Failed hosts on one change after which no other host starts it.
    pub max_failures: Option<usize>,
}

/// The rules of `rollout:`; `fail` gets each failure's field path.
pub(super) fn check(m: &Manifest, fail: &mut dyn FnMut(&[Seg], String)) {
    let Some(r) = &m.rollout else {
        return;
    };
    let at = |key| [Seg::Key("rollout"), Seg::Key(key)];
    if let Some(canary) = &r.canary {
        if !m.hosts.iter().any(|h| &h.name == canary) {
            let names: Vec<&str> = m.hosts.iter().map(|h| h.name.as_str()).collect();
            fail(
                &at("canary"),
                format!(
                    "`{canary}` is not one of this service's hosts ({})",
                    names.join(", ")
                ),
            );
        }
    }
    for (key, value) in [
        ("max_parallel", r.max_parallel),
        ("max_failures", r.max_failures),
    ] {
        if value == Some(0) {
            fail(&at(key), format!("{key} must be at least 1"));
        }
    }
}
