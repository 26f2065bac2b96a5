//! Any `current.json` or `history.jsonl` a host holds (damaged, truncated, hand-edited, written by
//! a newer reconcile) must come back as records or as reasons, never a panic; `history.jsonl`
//! keeps one entry per line, so deployment numbers stay right; and a record that reads writes
//! back as one line that reads again as the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::record::{parse_history, parse_record, record_json, RecordProblem};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines = parse_history(&text);
    assert_eq!(lines.len(), text.lines().count());
    for line in lines.iter().filter_map(|l| l.as_ref().err()) {
        let _ = line.to_string();
    }
    match parse_record(&text) {
        Ok(r) => {
            let json = record_json(&r).expect("a record that was read serializes");
            assert!(!json.contains('\n'), "{json}");
            let back = parse_record(&json).expect("a written record reads back");
            // serde_json (without its `float_roundtrip` feature) may read a float back a unit in
            // the last place off; that is not a record of something else.
            let close = match (r.load_seconds, back.load_seconds) {
                (Some(a), Some(b)) => {
                    a == b
                        || (a.is_sign_negative() == b.is_sign_negative()
                            && a.to_bits().abs_diff(b.to_bits()) <= 2)
                }
                (a, b) => a == b,
            };
            assert!(close, "{:?} -> {:?}", r.load_seconds, back.load_seconds);
            let mut back = back;
            back.load_seconds = r.load_seconds;
            assert_eq!(back, r);
        }
        Err(RecordProblem::Unreadable(_)) => panic!("parsing never reports a read failure"),
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
