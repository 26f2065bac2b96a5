//! The same change on many hosts, shown once. A fleet of 64 hosts given one new unit plans 64
//! identical diffs; the reports show that change once, with the hosts it applies to named
//! compactly (`gpu-01..gpu-16`), so that a pull request comment stays readable and within GitHub's
//! size limit. Each unit's own plan is untouched: JSON and plan files keep one entry per unit.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::dry_run::PlanOutcome;
use crate::finding::Finding;
use crate::plan::{Summary, UnitPlan, Verdict};

/// Units whose plans differ in nothing but their host.
#[derive(Debug, Clone)]
pub struct SharedChange<'a> {
    /// The first of them in the plan's order; it stands for all of them.
    pub outcome: &'a PlanOutcome,
    /// Every host the change applies to, in host order (see [`host_ranges`]).
    pub hosts: Vec<&'a str>,
}

impl SharedChange<'_> {
    /// `gpu-01..gpu-16`.
    pub fn hosts_shown(&self) -> String {
        host_ranges(&self.hosts)
    }

    /// The outcome's diff as it reads for every host of the shared change (see [`shared_diff`]).
    pub fn diff(&self) -> Cow<'_, str> {
        match self.outcome {
            PlanOutcome::Planned(p) if self.hosts.len() > 1 => shared_diff(p),
            PlanOutcome::Planned(p) => Cow::Borrowed(&p.diff),
            PlanOutcome::Error { .. } => Cow::Borrowed(""),
        }
    }
}

/// The outcomes gathered by identical change: same unit, manifest, verdict, redacted diff (its
/// header aside, which names the host), summary, notes, unit state and preflight findings; an
/// error is one with errors of the same unit and text. Shared changes come in the order of their first
/// outcome, so a plan of one host per change reads as before.
pub fn shared_changes(outcomes: &[PlanOutcome]) -> Vec<SharedChange<'_>> {
    let mut changes: Vec<(Same<'_>, SharedChange<'_>)> = Vec::new();
    // The diff is what tells changes apart in practice, so it alone is hashed; the rest is
    // compared only among the shared changes of the same unit and diff.
    let mut by_diff: HashMap<(&str, Cow<'_, str>), Vec<usize>> = HashMap::new();
    for o in outcomes {
        let same = Same::of(o);
        let candidates = by_diff.entry((same.unit, same.diff.clone())).or_default();
        match candidates.iter().find(|&&i| changes[i].0 == same) {
            Some(&i) => changes[i].1.hosts.push(host(o)),
            None => {
                candidates.push(changes.len());
                changes.push((
                    same,
                    SharedChange {
                        outcome: o,
                        hosts: vec![host(o)],
                    },
                ));
            }
        }
    }
    changes
        .into_iter()
        .map(|(_, mut g)| {
            g.hosts.sort_by(|a, b| Name::of(a).cmp(&Name::of(b)));
            g
        })
        .collect()
}

/// `p`'s diff without the host in its header (`--- gpu-01:/etc/systemd/system/x.service` reads
/// `--- /etc/systemd/system/x.service`), the same text for every host with the same change.
pub fn shared_diff(p: &UnitPlan) -> Cow<'_, str> {
    let named = format!("--- {}:", p.host);
    match p.diff.strip_prefix(&named) {
        Some(rest) => Cow::Owned(format!("--- {rest}")),
        None => Cow::Borrowed(&p.diff),
    }
}

fn host(o: &PlanOutcome) -> &str {
    match o {
        PlanOutcome::Planned(p) => &p.host,
        PlanOutcome::Error { host, .. } => host,
    }
}

/// Everything a report shows of a unit's plan, but its host.
#[derive(Debug, PartialEq)]
struct Same<'a> {
    unit: &'a str,
    source: &'a str,
    diff: Cow<'a, str>,
    planned: Option<Planned<'a>>,
    error: Option<&'a str>,
}

#[derive(Debug, PartialEq)]
struct Planned<'a> {
    verdict: Verdict,
    summary: &'a Summary,
    notes: &'a [String],
    preflight: &'a [Finding],
    pinned: Option<&'a crate::pinned::CopyPlan>,
    state: String,
}

impl<'a> Same<'a> {
    fn of(o: &'a PlanOutcome) -> Same<'a> {
        match o {
            PlanOutcome::Planned(p) => Same {
                unit: &p.unit,
                source: &p.source,
                diff: shared_diff(p),
                planned: Some(Planned {
                    verdict: p.verdict,
                    summary: &p.summary,
                    notes: &p.notes,
                    preflight: &p.preflight,
                    pinned: p.pinned.as_ref(),
                    state: p.state.summary(),
                }),
                error: None,
            },
            PlanOutcome::Error {
                unit,
                source,
                error,
                ..
            } => Same {
                unit,
                source,
                diff: Cow::Borrowed(""),
                planned: None,
                error: Some(error),
            },
        }
    }
}

/// Host names, sorted and runs of consecutive numbers written as ranges: `gpu-01..gpu-04,
/// gpu-07, gpu-09..gpu-12`. A run is names that differ in one number only, the same one along the
/// run, counting up by one with the same zero padding (`gpu-09`, `gpu-10`; `n9`, `n10`; never
/// `n9`, `n010`); two in a row are both named, three or more become `first..last`. Numbers sort by
/// value (`n9` before `n10`), the rest as text.
pub fn host_ranges(hosts: &[&str]) -> String {
    let mut names: Vec<Name<'_>> = hosts.iter().map(|h| Name::of(h)).collect();
    names.sort();
    names.dedup_by(|a, b| a.full == b.full);
    let mut parts: Vec<String> = Vec::new();
    let mut push = |run: &[Name<'_>]| match run {
        [one] => parts.push(one.full.to_string()),
        [a, b] => parts.extend([a.full.to_string(), b.full.to_string()]),
        [first, .., last] => parts.push(format!("{}..{}", first.full, last.full)),
        [] => {}
    };
    let (mut start, mut axis) = (0, None);
    for i in 1..names.len() {
        match names[i].follows(&names[i - 1]) {
            Some(a) if axis.is_none() || axis == Some(a) => axis = Some(a),
            _ => {
                push(&names[start..i]);
                (start, axis) = (i, None);
            }
        }
    }
    push(&names[start..]);
    parts.join(", ")
}

/// A host name as text and numbers: `gpu-07.dc1` is `gpu-`, 7, `.dc`, 1.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Name<'a> {
    tokens: Vec<Token<'a>>,
    full: &'a str,
}

/// Numbers sort before text and by value, then by width (`7` before `07`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Token<'a> {
    Number(u64, usize, &'a str),
    Text(&'a str),
}

impl<'a> Name<'a> {
    fn of(full: &'a str) -> Name<'a> {
        let mut tokens = Vec::new();
        let mut rest = full;
        while !rest.is_empty() {
            let digit = rest.as_bytes()[0].is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digit)
                .unwrap_or(rest.len());
            let (part, tail) = rest.split_at(end);
            // Past u64 it is not a counter anyone numbers hosts with: text.
            tokens.push(match part.parse::<u64>() {
                Ok(n) if digit => Token::Number(n, part.len(), part),
                _ => Token::Text(part),
            });
            rest = tail;
        }
        Name { tokens, full }
    }

    /// Where `self` counts one up from `prev` (the token's index), when that is all that differs.
    fn follows(&self, prev: &Name<'_>) -> Option<usize> {
        if self.tokens.len() != prev.tokens.len() {
            return None;
        }
        let mut differ = self
            .tokens
            .iter()
            .zip(&prev.tokens)
            .enumerate()
            .filter(|(_, (a, b))| a != b);
        let (i, pair) = differ.next()?;
        if differ.next().is_some() {
            return None;
        }
        let (Token::Number(n, width, digits), Token::Number(p, prev_width, prev_digits)) = pair
        else {
            return None;
        };
        let padded = |d: &str| d.len() > 1 && d.starts_with('0');
        let same_padding = width == prev_width || !(padded(digits) || padded(prev_digits));
        (p.checked_add(1) == Some(*n) && same_padding).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::observed::{Observed, UnitState};
    use crate::plan::plan;
    use crate::redact::Redactor;
    use crate::unit::render;
    use proptest::prelude::*;

    fn ranges(hosts: &[&str]) -> String {
        host_ranges(hosts)
    }

    #[test]
    fn a_full_run_is_one_range() {
        let hosts: Vec<String> = (1..=16).map(|i| format!("gpu-{i:02}")).collect();
        let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
        assert_eq!(ranges(&names), "gpu-01..gpu-16");
    }

    #[test]
    fn gaps_split_runs_and_pairs_stay_named() {
        let hosts = [
            "gpu-12", "gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "gpu-09", "gpu-10",
            "gpu-11", "gpu-14", "gpu-15",
        ];
        assert_eq!(
            ranges(&hosts),
            "gpu-01..gpu-04, gpu-07, gpu-09..gpu-12, gpu-14, gpu-15"
        );
    }

    #[test]
    fn numbers_sort_by_value_and_padding_is_kept() {
        assert_eq!(ranges(&["n10", "n9", "n8", "n11"]), "n8..n11");
        // gpu-09 -> gpu-10 keeps the width; n9 -> n010 would not.
        assert_eq!(ranges(&["gpu-10", "gpu-08", "gpu-09"]), "gpu-08..gpu-10");
        assert_eq!(ranges(&["n8", "n9", "n010"]), "n8, n9, n010");
        assert_eq!(ranges(&["h0", "h1", "h2"]), "h0..h2");
    }

    #[test]
    fn names_without_a_number_sort_as_text() {
        assert_eq!(ranges(&["gpu-c", "gpu-a", "gpu-b"]), "gpu-a, gpu-b, gpu-c");
        assert_eq!(
            ranges(&["b", "gpu-02", "a", "gpu-01", "gpu-03"]),
            "a, b, gpu-01..gpu-03"
        );
    }

    #[test]
    fn any_one_number_may_count_and_the_rest_is_kept() {
        assert_eq!(
            ranges(&[
                "gpu-01.dc1.example",
                "gpu-02.dc1.example",
                "gpu-03.dc1.example"
            ]),
            "gpu-01.dc1.example..gpu-03.dc1.example"
        );
        assert_eq!(ranges(&["r1-a", "r2-a", "r1-b"]), "r1-a, r1-b, r2-a");
        // One number counts along a run, never one then another.
        assert_eq!(
            ranges(&["a1b1", "a1b2", "a2b2", "a3b2", "a4b2"]),
            "a1b1, a1b2, a2b2..a4b2"
        );
        assert_eq!(
            ranges(&["rack1-gpu1", "rack1-gpu2", "rack1-gpu3"]),
            "rack1-gpu1..rack1-gpu3"
        );
    }

    #[test]
    fn edge_cases() {
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&["gpu-a"]), "gpu-a");
        assert_eq!(ranges(&["h1", "h1", "h2"]), "h1, h2");
        // Too long for a counter: text, so no panic and no range.
        assert_eq!(
            ranges(&["h99999999999999999999999", "h99999999999999999999998"]),
            "h99999999999999999999998, h99999999999999999999999"
        );
        assert_eq!(
            ranges(&[&format!("h{}", u64::MAX), &format!("h{}", u64::MAX - 1)]),
            format!("h{}, h{}", u64::MAX - 1, u64::MAX)
        );
    }

    proptest! {
        #[test]
        fn every_host_is_named_or_inside_a_range(numbers in proptest::collection::btree_set(0u64..200, 0..40)) {
            let hosts: Vec<String> = numbers.iter().map(|n| format!("gpu-{n:03}")).collect();
            let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
            let shown = host_ranges(&names);
            let mut expanded = Vec::new();
            for part in shown.split(", ").filter(|p| !p.is_empty()) {
                match part.split_once("..") {
                    Some((a, b)) => {
                        let (a, b): (u64, u64) = (a[4..].parse().unwrap(), b[4..].parse().unwrap());
                        prop_assert!(b >= a + 2, "a range of fewer than three: {}", part);
                        expanded.extend(a..=b);
                    }
                    None => expanded.push(part[4..].parse().unwrap()),
                }
            }
            prop_assert_eq!(expanded, numbers.into_iter().collect::<Vec<_>>());
        }
    }

    const MANIFEST: &str = "service: s\nhosts: [gpu-01, gpu-02, gpu-03]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags: { tp-size: 4 }\n";

    fn planned(host: &str, current: Option<&str>, manifest: &str) -> PlanOutcome {
        let m = parse("m.yaml", manifest).unwrap();
        let desired = render(&m, &m.hosts[0]);
        let old = current.map(|text| {
            let m = parse("m.yaml", text).unwrap();
            render(&m, &m.hosts[0]).text
        });
        let observed = Observed {
            unit_text: old.clone(),
            state: UnitState {
                load_state: if old.is_some() { "loaded" } else { "not-found" }.into(),
                active_state: "active".into(),
                sub_state: "running".into(),
                ..Default::default()
            },
            unit_files: Default::default(),
        };
        PlanOutcome::Planned(Box::new(plan(
            host,
            "m.yaml",
            &desired,
            &observed,
            &Redactor::default(),
        )))
    }

    #[test]
    fn one_change_on_forty_hosts_is_one_group() {
        let old = MANIFEST.replace("tp-size: 4", "tp-size: 2");
        let hosts: Vec<String> = (1..=40).map(|i| format!("gpu-{i:02}")).collect();
        let outcomes: Vec<PlanOutcome> = hosts
            .iter()
            .rev()
            .map(|h| planned(h, Some(&old), MANIFEST))
            .collect();
        let changes = shared_changes(&outcomes);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].hosts.len(), 40);
        assert_eq!(changes[0].hosts_shown(), "gpu-01..gpu-40");
        // The header names no host, so the diff is true of each.
        let diff = changes[0].diff();
        assert!(
            diff.starts_with("--- /etc/systemd/system/s.service\n+++ m.yaml\n"),
            "{diff}"
        );
        let PlanOutcome::Planned(p) = &outcomes[0] else {
            unreachable!()
        };
        assert!(p.diff.starts_with("--- gpu-40:/etc/"), "{}", p.diff);
    }

    #[test]
    fn different_changes_stay_apart_in_the_order_first_seen() {
        let tp2 = MANIFEST.replace("tp-size: 4", "tp-size: 2");
        let tp8 = MANIFEST.replace("tp-size: 4", "tp-size: 8");
        let error = |host: &str| PlanOutcome::Error {
            host: host.into(),
            unit: "s.service".into(),
            source: "m.yaml".into(),
            error: "cannot connect".into(),
        };
        let outcomes = vec![
            planned("gpu-01", Some(&tp2), MANIFEST),
            planned("gpu-02", None, MANIFEST),
            planned("gpu-03", Some(&tp2), MANIFEST),
            planned("gpu-04", Some(&tp8), MANIFEST),
            planned("gpu-05", Some(MANIFEST), MANIFEST),
            planned("gpu-06", None, MANIFEST),
            error("gpu-09"),
            error("gpu-10"),
            planned("gpu-07", Some(MANIFEST), MANIFEST),
        ];
        let shown: Vec<(String, &str)> = shared_changes(&outcomes)
            .iter()
            .map(|g| {
                let what = match g.outcome {
                    PlanOutcome::Planned(p) => p.verdict.describe(),
                    PlanOutcome::Error { .. } => "error",
                };
                (g.hosts_shown(), what)
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("gpu-01, gpu-03".to_string(), Verdict::Restart.describe()),
                ("gpu-02, gpu-06".to_string(), Verdict::Install.describe()),
                ("gpu-04".to_string(), Verdict::Restart.describe()),
                ("gpu-05, gpu-07".to_string(), Verdict::NoChange.describe()),
                ("gpu-09, gpu-10".to_string(), "error"),
            ]
        );
    }

    #[test]
    fn a_note_or_a_finding_of_one_host_keeps_it_apart() {
        let old = MANIFEST.replace("tp-size: 4", "tp-size: 2");
        let mut down = planned("gpu-02", Some(&old), MANIFEST);
        let mut failing = planned("gpu-03", Some(&old), MANIFEST);
        if let (PlanOutcome::Planned(d), PlanOutcome::Planned(f)) = (&mut down, &mut failing) {
            d.state.active_state = "failed".into();
            f.preflight
                .push(Finding::error("gpus", "the host has 2 GPUs".into()));
        }
        let outcomes = vec![planned("gpu-01", Some(&old), MANIFEST), down, failing];
        let changes = shared_changes(&outcomes);
        assert_eq!(changes.len(), 3, "{changes:?}");
    }

    #[test]
    fn a_single_host_keeps_its_header() {
        let old = MANIFEST.replace("tp-size: 4", "tp-size: 2");
        let outcomes = vec![planned("gpu-01", Some(&old), MANIFEST)];
        let changes = shared_changes(&outcomes);
        assert!(changes[0].diff().starts_with("--- gpu-01:/etc/"));
    }
}
