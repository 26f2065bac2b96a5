//! Any text, valid YAML or not, must come back from `parse` and `validate` as a manifest or as
//! errors, never as a panic (or a hang, or unbounded memory: libFuzzer's -timeout / -rss_limit_mb).
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::manifest::{parse, validate, validate_fleet};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let manifest = match parse("fuzz.yaml", text) {
        Ok(m) => m,
        Err(errors) => {
            // Errors are shown to users: formatting them must not panic either.
            for e in &errors.0 {
                let _ = e.to_string();
            }
            return;
        }
    };
    if let Err(errors) = validate(&manifest, text) {
        for e in &errors.0 {
            let _ = e.to_string();
        }
        return;
    }
    let _ = validate_fleet(&[(manifest, text.to_string())]);
});
