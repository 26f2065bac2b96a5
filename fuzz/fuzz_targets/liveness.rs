//! Any output of the liveness script (cgroup files, journal counts, a cursor) must parse into a
//! reading without panicking; a cursor, when there is one, is never empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::probe::liveness::Liveness;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let l = Liveness::parse(&text);
    assert!(l.cursor.as_deref().is_none_or(|c| !c.is_empty()));
});
