//! Two services on one host claiming the same GPU, found offline: splitting a host's GPUs between
//! services (4 + 4 of 8) is done with `CUDA_VISIBLE_DEVICES`, and a typo there makes two servers
//! load onto one GPU, where the second runs out of memory mid-load. A service without the variable
//! may use every GPU, so it conflicts with any other service on the host.
//!
//! `targets` runs this check while it builds the targets, so it works on [`Claimant`]s, not on
//! `Target`s: this module needs nothing of `targets` and the two import each other in one
//! direction only.

use std::collections::BTreeSet;

use crate::finding::Finding;

/// What the fleet check needs of one unit on one host.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    pub host: &'a str,
    pub unit: &'a str,
    /// The manifest file, to name the other side of a clash.
    pub source: &'a str,
    /// `CUDA_VISIBLE_DEVICES` as the unit sets it.
    pub cuda_visible_devices: Option<&'a str>,
}

/// `CUDA_VISIBLE_DEVICES` entries; an empty value lists none (CUDA: no GPU visible).
pub fn split_devices(value: &str) -> Vec<String> {
    if value.trim().is_empty() {
        return Vec::new();
    }
    value.split(',').map(|d| d.trim().to_string()).collect()
}

/// The GPUs a unit may use: the devices it lists, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    All,
    Devices(BTreeSet<String>),
}

impl Claim {
    fn of(t: &Claimant) -> Claim {
        match t.cuda_visible_devices {
            None => Claim::All,
            Some(v) => Claim::Devices(split_devices(v).into_iter().collect()),
        }
    }
}

/// For each target (same order), the findings of its GPU claims clashing with another service's
/// on the same host; each clash is reported on both units, naming the other manifest.
pub fn gpu_conflicts(targets: &[Claimant]) -> Vec<Vec<Finding>> {
    let claims: Vec<Claim> = targets.iter().map(Claim::of).collect();
    targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            targets
                .iter()
                .enumerate()
                .filter(|(j, other)| *j != i && other.host == t.host && other.unit != t.unit)
                .filter_map(|(j, other)| clash(t, &claims[i], other, &claims[j]))
                .collect()
        })
        .collect()
}

fn clash(t: &Claimant, mine: &Claim, other: &Claimant, theirs: &Claim) -> Option<Finding> {
    let them = format!("{} ({})", other.source, other.unit);
    let message = match (mine, theirs) {
        (Claim::Devices(a), Claim::Devices(b)) => {
            let shared: Vec<&str> = a.intersection(b).map(String::as_str).collect();
            if shared.is_empty() {
                return None;
            }
            format!(
                "GPU {} of {} is also claimed by {them}: give each service its own CUDA_VISIBLE_DEVICES",
                shared.join(","),
                t.host
            )
        }
        (Claim::All, _) => format!(
            "{} sets no CUDA_VISIBLE_DEVICES, so it may use every GPU of {}, and {them} runs there too: split the GPUs with CUDA_VISIBLE_DEVICES",
            t.unit, t.host
        ),
        (_, Claim::All) => format!(
            "{them} sets no CUDA_VISIBLE_DEVICES, so it may use every GPU of {}, including this service's: split the GPUs with CUDA_VISIBLE_DEVICES",
            t.host
        ),
    };
    Some(Finding::error("gpu-conflict", message))
}

#[cfg(test)]
mod tests {
    use crate::preflight::tests::{manifest, targets};

    fn with_devices(service: &str, port: u16, devices: Option<&str>) -> String {
        let env = devices.map_or(String::new(), |d| {
            format!("env: {{ CUDA_VISIBLE_DEVICES: \"{d}\" }}\n")
        });
        manifest(service, "gpu-a", &env).replace("port: 30000", &format!("port: {port}"))
    }

    fn messages(texts: &[(&str, &str)]) -> Vec<Vec<String>> {
        // `targets` runs the check on every target it builds.
        targets(texts)
            .into_iter()
            .map(|t| t.conflicts.into_iter().map(|f| f.message).collect())
            .collect()
    }

    /// The conflicts of services `a` (port 30000) and `b` (30001) on one host, with these
    /// `CUDA_VISIBLE_DEVICES`.
    fn side_by_side(a: Option<&str>, b: Option<&str>) -> Vec<Vec<String>> {
        let a = with_devices("a", 30000, a);
        let b = with_devices("b", 30001, b);
        messages(&[("a.yaml", &a), ("b.yaml", &b)])
    }

    #[test]
    fn a_host_split_four_and_four_is_fine() {
        assert_eq!(
            side_by_side(Some("0,1,2,3"), Some("4,5,6,7")),
            [Vec::<String>::new(), Vec::new()]
        );
    }

    #[test]
    fn overlapping_devices_name_both_manifests() {
        assert_eq!(
            side_by_side(Some("0,1,2,3"), Some("3, 4,5,6")),
            [
                ["GPU 3 of gpu-a is also claimed by b.yaml (b.service): give each service its own CUDA_VISIBLE_DEVICES"],
                ["GPU 3 of gpu-a is also claimed by a.yaml (a.service): give each service its own CUDA_VISIBLE_DEVICES"],
            ]
        );
    }

    #[test]
    fn a_service_without_cuda_visible_devices_claims_every_gpu() {
        let found = side_by_side(None, Some("4,5,6,7"));
        assert!(
            found[0][0].starts_with("a.service sets no CUDA_VISIBLE_DEVICES"),
            "{found:?}"
        );
        assert!(found[0][0].contains("b.yaml (b.service)"));
        assert!(
            found[1][0].starts_with("a.yaml (a.service) sets no CUDA_VISIBLE_DEVICES"),
            "{found:?}"
        );
    }

    #[test]
    fn services_on_different_hosts_never_clash() {
        let a = with_devices("a", 30000, None);
        let b = with_devices("b", 30000, None).replace("[gpu-a]", "[gpu-b]");
        assert_eq!(
            messages(&[("a.yaml", &a), ("b.yaml", &b)]),
            [Vec::<String>::new(), Vec::new()]
        );
    }
}
