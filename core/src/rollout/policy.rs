//! A rollout's settings: what apply's flags asked, else the strictest of the manifests' `rollout:`
//! sections, else the defaults, so a manifest that says `max_parallel: 2` means two hosts at once
//! whether `reconcile apply` pushes the change or the hosts' agents pull it.

use crate::manifest::RolloutSpec;

/// How the rollout goes: the policy the push schedule and the pull agents follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Hosts that go first, alone, and must all pass (pull mode: always one host, the first of
    /// [`order`]).
    pub canary: usize,
    /// Hosts restarting at once after the canary.
    pub max_parallel: usize,
    /// Failed hosts, across the whole rollout, after which no new host starts.
    pub max_failures: usize,
    /// Push mode: when the rollout stops, roll back the hosts it already converged.
    pub rollback_all: bool,
}

impl Rollout {
    pub const DEFAULT: Rollout = Rollout {
        canary: 1,
        max_parallel: 4,
        max_failures: 1,
        rollback_all: false,
    };

    /// The settings in force: each one from the flags when they name it, else the strictest value
    /// any of `specs` (the manifests of the services rolled out together) gives, else the default.
    /// Strictest, because a push that applies two services at once must keep the promise of each.
    pub fn resolve<'a>(asked: &Asked, specs: impl IntoIterator<Item = &'a RolloutSpec>) -> Rollout {
        let specs: Vec<&RolloutSpec> = specs.into_iter().collect();
        let strictest =
            |f: fn(&RolloutSpec) -> Option<usize>| specs.iter().filter_map(|s| f(s)).min();
        Rollout {
            canary: asked.canary.unwrap_or(Rollout::DEFAULT.canary),
            max_parallel: asked
                .max_parallel
                .or_else(|| strictest(|s| s.max_parallel))
                .unwrap_or(Rollout::DEFAULT.max_parallel),
            max_failures: asked
                .max_failures
                .or_else(|| strictest(|s| s.max_failures))
                .unwrap_or(Rollout::DEFAULT.max_failures),
            rollback_all: asked.rollback_all,
        }
    }
}

/// What apply's flags asked for; `None`: not given, the manifests decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    pub canary: Option<usize>,
    pub max_parallel: Option<usize>,
    pub max_failures: Option<usize>,
    pub rollback_all: bool,
}

/// A service's hosts in rollout order: the manifest's `rollout.canary` first when it names one,
/// then the rest as the manifest lists them. Every agent computes the same order from the same
/// commit, which is what lets them agree on the canary without asking each other.
pub fn order<'a>(hosts: &[&'a str], canary: Option<&str>) -> Vec<&'a str> {
    let mut ordered: Vec<&'a str> = Vec::with_capacity(hosts.len());
    if let Some(c) = canary.and_then(|c| hosts.iter().find(|h| **h == c)) {
        ordered.push(c);
    }
    ordered.extend(hosts.iter().filter(|h| Some(**h) != canary));
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max_parallel: Option<usize>, max_failures: Option<usize>) -> RolloutSpec {
        RolloutSpec {
            canary: None,
            max_parallel,
            max_failures,
        }
    }

    #[test]
    fn without_flags_or_manifests_the_defaults_hold() {
        assert_eq!(Rollout::resolve(&Asked::default(), []), Rollout::DEFAULT);
    }

    #[test]
    fn a_manifest_sets_what_the_flags_leave_out_and_the_flags_win() {
        let s = spec(Some(2), Some(3));
        let r = Rollout::resolve(&Asked::default(), [&s]);
        assert_eq!((r.max_parallel, r.max_failures), (2, 3));
        let asked = Asked {
            max_parallel: Some(8),
            ..Asked::default()
        };
        let r = Rollout::resolve(&asked, [&s]);
        assert_eq!((r.max_parallel, r.max_failures), (8, 3));
    }

    #[test]
    fn services_rolled_out_together_get_the_strictest_of_their_settings() {
        let a = spec(Some(2), None);
        let b = spec(Some(6), Some(2));
        let r = Rollout::resolve(&Asked::default(), [&a, &b]);
        assert_eq!((r.max_parallel, r.max_failures), (2, 2));
    }

    #[test]
    fn the_canary_host_goes_first_and_the_rest_keep_the_manifest_order() {
        let hosts = ["gpu-a", "gpu-b", "gpu-c"];
        assert_eq!(order(&hosts, None), hosts);
        assert_eq!(order(&hosts, Some("gpu-c")), ["gpu-c", "gpu-a", "gpu-b"]);
        // A name that is not a host of the service (validation refuses it) changes nothing.
        assert_eq!(order(&hosts, Some("gpu-z")), hosts);
    }
}
