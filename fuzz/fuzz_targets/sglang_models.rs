//! Any `/v1/models` body (another server on the port, a proxy's error page, a truncated answer)
//! must come back as models or as a reason, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::remote::http::parse_models;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_models(&text) {
        Ok(models) => {
            for m in &models {
                let _ = format!("{m:?}");
            }
        }
        Err(reason) => assert!(!reason.is_empty()),
    }
});
