//! Plans of a fleet in every format: the same change on many hosts shown once, the markdown within
//! GitHub's limit for a comment, and JSON still one entry per unit. Built from the repository's
//! 122B manifest, the largest unit it ships, rendered and planned as a real run would.

use super::markdown::{self, BUDGET};
use super::{render, Format};
use crate::dry_run::PlanOutcome;
use crate::manifest::parse;
use crate::observed::{Observed, UnitState};
use crate::plan::plan;
use crate::redact::Redactor;
use crate::unit::render as render_unit;

const MANIFEST: &str = include_str!("../../manifests/sglang-qwen3.5-122b.yaml");
const SOURCE: &str = "manifests/sglang-qwen3.5-122b.yaml";
const HOSTS: &str =
    "hosts:\n  - gpu-a\n  - name: gpu-b\n    env: { CUDA_VISIBLE_DEVICES: \"4,5,6,7\" }\n";
const CANARY: &str = "hf_fleet_canary_5d2a";

/// The 122B manifest on `hosts`, with a secret in its environment; `extra` is YAML added to a
/// host's entry, so that hosts can differ.
fn manifest(hosts: &[String], extra: &dyn Fn(usize) -> String) -> String {
    assert!(
        MANIFEST.contains(HOSTS),
        "the 122B manifest's hosts changed"
    );
    let list: String = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| format!("  - name: {h}\n{}", extra(i)))
        .collect();
    MANIFEST.replace(HOSTS, &format!("hosts:\n{list}")).replace(
        "  NCCL_P2P_DISABLE: \"1\"\n",
        &format!("  NCCL_P2P_DISABLE: \"1\"\n  HF_TOKEN: {CANARY}\n"),
    )
}

fn names(range: std::ops::RangeInclusive<usize>) -> Vec<String> {
    range.map(|i| format!("gpu-{i:02}")).collect()
}

/// `new`'s plan on each of its hosts, which have `old` installed (none: a new unit).
fn outcomes(new: &str, old: Option<&str>) -> Vec<PlanOutcome> {
    let m = parse(SOURCE, new).unwrap();
    let before = old.map(|text| parse(SOURCE, text).unwrap());
    let redactor = Redactor::of_manifests([&m].into_iter().chain(&before));
    m.hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let unit_text = before.as_ref().map(|b| {
                render_unit(b, &b.hosts[i])
                    .text
                    .replace("<redacted>", CANARY)
            });
            let state = UnitState {
                load_state: if unit_text.is_some() {
                    "loaded"
                } else {
                    "not-found"
                }
                .into(),
                active_state: "active".into(),
                sub_state: "running".into(),
                ..Default::default()
            };
            let observed = Observed {
                unit_text,
                state,
                unit_files: Default::default(),
            };
            let desired = render_unit(&m, host);
            PlanOutcome::Planned(Box::new(plan(
                &host.name, SOURCE, &desired, &observed, &redactor,
            )))
        })
        .collect()
}

/// The markdown as it was before changes were grouped: a row and a diff for each unit.
fn one_block_per_unit(outcomes: &[PlanOutcome]) -> usize {
    let tally = format!(
        "\n{}\n\n",
        super::tally_line(&crate::dry_run::Tally::of(outcomes))
    );
    let blocks: usize = outcomes
        .iter()
        .flat_map(|o| reconcile_core::shared_change::shared_changes(std::slice::from_ref(o)))
        .map(|g| markdown::row(&g).len() + markdown::details(&g).map_or(0, |d| d.len()))
        .sum();
    markdown::HEAD.len() + tally.len() + blocks
}

fn no_extra(_: usize) -> String {
    String::new()
}

fn all_formats(outcomes: &[PlanOutcome]) -> [String; 3] {
    let [text, markdown, json] =
        [Format::Text, Format::Markdown, Format::Json].map(|f| render(outcomes, f, false));
    for shown in [&text, &markdown, &json] {
        assert!(!shown.contains(CANARY), "a secret is shown:\n{shown}");
    }
    [text, markdown, json]
}

#[test]
fn forty_hosts_with_one_change_show_it_once_in_text_and_markdown() {
    let hosts = names(1..=40);
    let new = manifest(&hosts, &no_extra);
    let old = new.replace("mem-fraction-static: 0.85", "mem-fraction-static: 0.8");
    let outcomes = outcomes(&new, Some(&old));
    let [text, markdown, json] = all_formats(&outcomes);

    assert_eq!(
        text.matches("sglang-qwen.service: restart required")
            .count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.matches("  same change on 40 hosts: gpu-01..gpu-40\n")
            .count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.matches("~ mem-fraction-static 0.8 -> 0.85").count(),
        1,
        "{text}"
    );
    assert_eq!(text.matches("\n    @@ ").count(), 1, "{text}");
    assert!(
        text.contains("    --- /etc/systemd/system/sglang-qwen.service\n"),
        "the shared diff names no host:\n{text}"
    );
    // The tally still counts units, so the exit code means what it did.
    assert!(
        text.ends_with(
            "Plan: 0 to install, 40 to restart, 0 reload only, 0 unchanged, 0 failed to plan\n"
        ),
        "{text}"
    );

    assert_eq!(markdown.matches("<details>").count(), 1, "{markdown}");
    assert!(
        markdown.contains(
            "| gpu-01..gpu-40 (40 hosts) | sglang-qwen.service | **restart** | `~ mem-fraction-static 0.8 -> 0.85` |\n"
        ),
        "{markdown}"
    );
    assert!(
        markdown.contains("<summary>gpu-01..gpu-40 (40 hosts) · sglang-qwen.service · restart required (the model reloads)</summary>"),
        "{markdown}"
    );
    assert!(!markdown.contains("Left out"), "{markdown}");
    let per_host = one_block_per_unit(&outcomes);
    println!(
        "40 hosts, one restart of the 122B unit: markdown {} characters (one block per unit: {per_host})",
        markdown.len()
    );
    assert!(markdown.len() < 4_000, "{}", markdown.len());

    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["units"].as_array().unwrap().len(), 40);
    assert_eq!(json["tally"]["restart"], 40);
    let groups = json["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["hosts"].as_array().unwrap().len(), 40);
    assert_eq!(groups[0]["hosts_shown"], "gpu-01..gpu-40");
    assert_eq!(groups[0]["verdict"], "restart");
    assert_eq!(groups[0]["outcome"], "planned");
}

#[test]
fn sixty_four_hosts_given_the_122b_unit_fit_in_one_comment() {
    let hosts = names(1..=64);
    let outcomes = outcomes(&manifest(&hosts, &no_extra), None);
    let [text, markdown, _] = all_formats(&outcomes);
    let PlanOutcome::Planned(one) = &outcomes[0] else {
        unreachable!()
    };
    let one_host_plans = one_block_per_unit(&outcomes);
    println!(
        "64 hosts, the 122B unit new on each: its diff {} characters; markdown {} characters (limit 65,536; one block per unit: {one_host_plans})",
        one.diff.len(),
        markdown.len()
    );
    assert!(one.diff.len() > 1_200, "{}", one.diff);
    assert!(one_host_plans > 65_536, "{one_host_plans}");
    assert!(markdown.len() < 65_536, "{}", markdown.len());
    assert!(markdown.len() <= BUDGET);
    assert!(!markdown.contains("Left out"), "{markdown}");
    assert_eq!(markdown.matches("<details>").count(), 1);
    assert!(
        text.contains("  same change on 64 hosts: gpu-01..gpu-64\n"),
        "{text}"
    );
    assert!(text.contains("Plan: 64 to install,"), "{text}");
}

#[test]
fn different_changes_stay_apart_and_each_names_its_hosts() {
    let hosts = names(1..=12);
    // gpu-05, gpu-06 and gpu-11 also get a flag of their own, so theirs is a different change.
    let own = |i: usize| {
        if [4, 5, 10].contains(&i) {
            "    flags: { enable-cache-report: true }\n".to_string()
        } else {
            String::new()
        }
    };
    let new = manifest(&hosts, &own);
    let old = manifest(&hosts, &no_extra).replace("tp-size: 4", "tp-size: 2");
    let mut all = outcomes(&new, Some(&old));
    // gpu-07 and gpu-08 already run it.
    let same = outcomes(&new, Some(&new));
    all[6] = same[6].clone();
    all[7] = same[7].clone();
    all.push(PlanOutcome::Error {
        host: "gpu-13".into(),
        unit: "sglang-qwen.service".into(),
        source: SOURCE.into(),
        error: "cannot connect to gpu-13: Connection refused".into(),
    });
    let [text, markdown, json] = all_formats(&all);

    let headings: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.is_empty())
        .collect();
    assert_eq!(
        headings,
        [
            "sglang-qwen.service: restart required (the model reloads)",
            "sglang-qwen.service: restart required (the model reloads)",
            "sglang-qwen.service: no change",
            "gpu-13 sglang-qwen.service (manifests/sglang-qwen3.5-122b.yaml): error: cannot connect to gpu-13: Connection refused",
            "Plan: 0 to install, 10 to restart, 0 reload only, 2 unchanged, 1 failed to plan",
        ],
        "{text}"
    );
    assert!(
        text.contains("  same change on 7 hosts: gpu-01..gpu-04, gpu-09, gpu-10, gpu-12\n"),
        "{text}"
    );
    assert!(
        text.contains("  same change on 3 hosts: gpu-05, gpu-06, gpu-11\n"),
        "{text}"
    );
    assert!(
        text.contains("  the same on 2 hosts: gpu-07, gpu-08\n"),
        "{text}"
    );
    assert_eq!(text.matches("+ enable-cache-report").count(), 1, "{text}");

    let rows: Vec<&str> = markdown
        .lines()
        .filter(|l| l.starts_with("| gpu"))
        .collect();
    assert_eq!(rows.len(), 4, "{markdown}");
    assert!(rows[0].starts_with("| gpu-01..gpu-04, gpu-09, gpu-10, gpu-12 (7 hosts) |"));
    assert!(rows[2].starts_with("| gpu-07, gpu-08 (2 hosts) | sglang-qwen.service | no change |"));
    assert!(rows[3].starts_with("| gpu-13 | sglang-qwen.service | **error** |"));
    assert_eq!(markdown.matches("<details>").count(), 2, "{markdown}");

    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["units"].as_array().unwrap().len(), 13);
    assert_eq!(json["groups"].as_array().unwrap().len(), 4);
    assert_eq!(json["groups"][3]["outcome"], "error");
    assert!(json["groups"][3].get("verdict").is_none());
}

#[test]
fn past_the_budget_the_table_stays_and_the_diffs_that_do_not_fit_are_named() {
    // Every host a --mem-fraction-static of its own: 64 different new units, about 130 KB of diffs.
    let hosts = names(1..=64);
    let own = |i: usize| format!("    flags: {{ mem-fraction-static: 0.{} }}\n", 10 + i);
    let outcomes = outcomes(&manifest(&hosts, &own), None);
    let markdown = render(&outcomes, Format::Markdown, false);
    let whole: usize = outcomes
        .iter()
        .map(|o| match o {
            PlanOutcome::Planned(p) => p.diff.len(),
            PlanOutcome::Error { .. } => 0,
        })
        .sum();
    let shown = markdown.matches("<details>").count();
    println!(
        "64 different 122B units: {whole} characters of diffs; markdown {} characters with {shown} of 64 diffs",
        markdown.len()
    );
    assert!(whole > 65_536, "{whole}");
    assert!(markdown.len() <= BUDGET, "{}", markdown.len());
    assert!(shown > 10 && shown < 64, "{shown}");
    assert_eq!(
        markdown.lines().filter(|l| l.starts_with("| gpu-")).count(),
        64
    );
    assert!(
        markdown.contains("64 to install, 0 to restart"),
        "{markdown}"
    );
    let note = markdown.lines().last().unwrap();
    assert_eq!(
        note,
        format!(
            "**Left out**, to keep this under GitHub's limit of 65536 characters for a comment: \
             the last {} of 64 diffs. The tally above counts every unit; `reconcile plan --out \
             plan.json` writes the whole plan, every unit's diff included.",
            64 - shown
        )
    );
    // What is shown is whole: every diff that starts ends.
    assert_eq!(markdown.matches("</details>").count(), shown);
}

#[test]
fn a_table_too_long_for_the_budget_is_cut_with_the_count_left_out() {
    let outcomes: Vec<PlanOutcome> = (1..=3_000)
        .map(|i| PlanOutcome::Error {
            host: format!("gpu-{i:04}"),
            unit: "sglang-qwen.service".into(),
            source: SOURCE.into(),
            error: format!("cannot connect to gpu-{i:04}: No route to host"),
        })
        .collect();
    let markdown = render(&outcomes, Format::Markdown, false);
    let rows = markdown.lines().filter(|l| l.starts_with("| gpu-")).count();
    assert!(markdown.len() <= BUDGET, "{}", markdown.len());
    assert!(rows > 100 && rows < 3_000, "{rows}");
    assert!(
        markdown.contains(&format!(
            "comment: the last {} of the table's 3000 rows. The tally above counts every unit",
            3_000 - rows
        )),
        "{markdown}"
    );
    assert!(
        markdown.contains(
            "0 to install, 0 to restart, 0 reload only, 0 unchanged, 3000 failed to plan"
        ),
        "{markdown}"
    );
}

#[test]
fn the_same_error_on_many_hosts_is_one_block_and_one_row() {
    let error = |host: &str| PlanOutcome::Error {
        host: host.into(),
        unit: "sglang-qwen.service".into(),
        source: SOURCE.into(),
        error: "the manifest's SGLang catalog is missing".into(),
    };
    let outcomes: Vec<PlanOutcome> = ["gpu-03", "gpu-01", "gpu-02"].map(error).into();
    let text = render(&outcomes, Format::Text, false);
    assert_eq!(
        text,
        "sglang-qwen.service (manifests/sglang-qwen3.5-122b.yaml): error: the manifest's SGLang catalog is missing\n  \
         same error on 3 hosts: gpu-01..gpu-03\n\n\
         Plan: 0 to install, 0 to restart, 0 reload only, 0 unchanged, 3 failed to plan\n"
    );
    let markdown = render(&outcomes, Format::Markdown, false);
    assert!(
        markdown.contains("\n| gpu-01..gpu-03 (3 hosts) | sglang-qwen.service | **error** | the manifest's SGLang catalog is missing |\n\n"),
        "{markdown}"
    );
}

#[test]
fn a_hosts_control_sequences_reach_every_format_shown_not_acted_on() {
    let hosts = names(1..=1);
    let m = parse(SOURCE, &manifest(&hosts, &no_extra)).unwrap();
    let desired = render_unit(&m, &m.hosts[0]);
    // The unit file on the host carries a title set (OSC 0 ... BEL) and a screen clear, and its
    // state a C1 CSI; the planning error of another unit carries a carriage return.
    let hostile = "\x1b]0;owned\x07\x1b[2J";
    let observed = Observed {
        unit_text: Some(format!("{}# {hostile}\n", desired.text)),
        state: UnitState {
            load_state: "loaded".into(),
            active_state: "active".into(),
            sub_state: "running\u{9b}2J".into(),
            ..Default::default()
        },
        unit_files: Default::default(),
    };
    let redactor = Redactor::of_manifests([&m]);
    let outcomes = vec![
        PlanOutcome::Planned(Box::new(plan(
            "gpu-01", SOURCE, &desired, &observed, &redactor,
        ))),
        PlanOutcome::Error {
            host: "gpu-02".into(),
            unit: "other.service".into(),
            source: SOURCE.into(),
            error: format!("`cat` failed: real\rfake {hostile}"),
        },
    ];
    let acts = |c: char| c.is_control() && c != '\n' && c != '\t';
    for (format, color) in [
        (Format::Text, false),
        (Format::Text, true),
        (Format::Markdown, false),
    ] {
        let shown = render(&outcomes, format, color);
        assert!(
            shown.contains("# \\x1b]0;owned\\x07\\x1b[2J"),
            "{format:?}:\n{shown}"
        );
        assert!(shown.contains("real\\x0dfake"), "{format:?}:\n{shown}");
        // Only the plan's own colours are left to act.
        let ours = [
            "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[1m", "\x1b[0m",
        ];
        let left = ours
            .iter()
            .fold(shown.clone(), |s, code| s.replace(code, ""));
        assert!(
            !left.chars().any(acts),
            "{format:?} color {color}:\n{left:?}"
        );
    }
    let json = render(&outcomes, Format::Json, false);
    assert!(!json.chars().any(acts), "{json}");
    // JSON keeps the host's text as it was, as JSON escapes.
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        value["units"][1]["error"],
        format!("`cat` failed: real\rfake {hostile}")
    );
}
