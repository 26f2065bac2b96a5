//! Any `/metrics` body (another exporter on the port, a proxy's page, a truncated answer, hostile
//! label values) must come back as running and queued requests or as a reason, never a panic; and
//! other metrics and comments around the gauges never change what they say, since a drain decides
//! on that whether to restart a busy server.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::drain::parse_metrics;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let read = parse_metrics(&text);
    match &read {
        Ok(_) => {
            let padded = format!("# HELP other x\nother_total{{a=\"b\"}} 7\n{text}\n# EOF\n");
            assert_eq!(parse_metrics(&padded), read, "{padded:?}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
