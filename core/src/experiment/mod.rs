//! Experiments: variants of one service's manifest tried on one host, each judged on speed and
//! answers, ranked, and the winner handed back as a manifest edit to review. The pure part: the
//! experiment file (`file`), the variant as an in-place edit of the manifest's YAML (`edit`), the
//! ranking and drift check and the report (`results`), the SVG chart (`svg`) and the time
//! estimate (`eta`). Running the variants on the host is the binary's (`experiment`).

pub mod edit;
pub mod eta;
pub mod file;
pub mod results;
pub mod svg;

pub use edit::{EditError, Section};
pub use file::{parse, Change, Experiment, Variant};
pub use results::{Report, RunResult, Status};

/// The variant's manifest text: the baseline's with each of its changes written in, in order.
pub fn variant_text(baseline: &str, v: &Variant) -> Result<String, EditError> {
    v.changes.iter().try_fold(baseline.to_string(), |text, c| {
        edit::set(&text, c.section, &c.key, &c.value)
    })
}

/// A unified diff of the manifest, baseline to `edited`, for review without `--write`.
pub fn manifest_diff(path: &str, baseline: &str, edited: &str) -> String {
    similar::TextDiff::from_lines(baseline, edited)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    #[test]
    fn a_variant_is_its_changes_written_into_the_manifest_and_the_diff_shows_only_them() {
        let e = parse(
            "e.yaml",
            "manifest: m.yaml\nhost: h\nbenchmark: { levels: [1] }\nobjective: { metric: output_tokens_per_s, concurrency: 1 }\nvariants:\n  - name: v\n    flags: { enable-mixed-chunk: true }\n    env: { SGLANG_X: \"1\" }\n",
        )
        .unwrap();
        let base =
            "service: s\n# keep me\nsglang:\n  flags:\n    tp-size: 2  # two\nenv: { A: \"1\" }\n";
        let text = variant_text(base, &e.variants[0]).unwrap();
        assert_eq!(
            text,
            "service: s\n# keep me\nsglang:\n  flags:\n    tp-size: 2  # two\n    enable-mixed-chunk: true\nenv: { A: \"1\", SGLANG_X: \"1\" }\n"
        );
        let diff = manifest_diff("m.yaml", base, &text);
        let changed = |sign: char, header: &str| {
            diff.lines()
                .filter(|l| l.starts_with(sign) && !l.starts_with(header))
                .count()
        };
        assert_eq!(changed('+', "+++"), 2, "{diff}");
        assert_eq!(changed('-', "---"), 1, "{diff}");
        assert_holds(&diff, "+    enable-mixed-chunk: true\n");
    }
}
