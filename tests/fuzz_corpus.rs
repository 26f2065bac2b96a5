//! The fuzz targets' checked-in corpora (`fuzz/corpus/<target>/`), replayed as ordinary tests:
//! every input the fuzzers kept must still pass its target's checks. The same checks
//! (`fuzz/src/targets.rs`) run under libFuzzer in `fuzz/ci.sh`, which finds new inputs; this
//! replays the known ones on every `cargo test`, with no nightly flags and no sanitizer build.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../fuzz/src/targets.rs"]
mod targets;

/// Runs `check` on every input of `target`'s corpus; fails naming each input that panicked.
fn replay(target: &str, check: fn(&[u8])) {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no input", folder.display());
    let failed: Vec<String> = inputs
        .iter()
        .filter(|input| {
            let data = std::fs::read(input).expect("a corpus input reads");
            catch_unwind(AssertUnwindSafe(|| check(&data))).is_err()
        })
        .map(|input| input.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} inputs of {target} fail its checks (the panics above say how); reproduce one with \
         `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run {target} <input>`:\n{}",
        failed.len(),
        inputs.len(),
        failed.join("\n")
    );
}

#[test]
fn deployment_record() {
    replay("deployment_record", targets::deployment_record::run);
}

#[test]
fn liveness() {
    replay("liveness", targets::liveness::run);
}

#[test]
fn manifest_parse() {
    replay("manifest_parse", targets::manifest_parse::run);
}

#[test]
fn nvidia_smi_list() {
    replay("nvidia_smi_list", targets::nvidia_smi_list::run);
}

#[test]
fn nvidia_smi_query() {
    replay("nvidia_smi_query", targets::nvidia_smi_query::run);
}

#[test]
fn render_roundtrip() {
    replay("render_roundtrip", targets::render_roundtrip::run);
}

#[test]
fn sglang_answer() {
    replay("sglang_answer", targets::sglang_answer::run);
}

#[test]
fn sglang_metrics() {
    replay("sglang_metrics", targets::sglang_metrics::run);
}

#[test]
fn sglang_models() {
    replay("sglang_models", targets::sglang_models::run);
}

#[test]
fn ss_listeners() {
    replay("ss_listeners", targets::ss_listeners::run);
}

#[test]
fn survey() {
    replay("survey", targets::survey::run);
}

#[test]
fn systemctl_show() {
    replay("systemctl_show", targets::systemctl_show::run);
}
