//! Any chat completion body must come back as an answer or as a reason, never a panic; the
//! smoke check's comparisons on it must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::remote::http::parse_answer;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_answer(&text) {
        Ok(a) => {
            let _ = a.content.contains("Paris")
                || a.reasoning.as_deref().is_some_and(|r| r.contains("Paris"));
            let _ = a.content.chars().take(200).collect::<String>();
        }
        Err(reason) => assert!(!reason.is_empty()),
    }
});
