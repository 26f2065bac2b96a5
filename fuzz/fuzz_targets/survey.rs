//! Any output of the survey script (one command per host: `== <key> <status>` headers, base64
//! bodies, `== end 0`) must read into sections or a reason, never panic; every fact read from a
//! section must read without panicking; and sections written out again read back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::survey::{self, encode, end, Sections};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(sections) = Sections::parse(&text) else {
        return;
    };
    let mut again = String::new();
    for key in text.lines().filter_map(|l| l.strip_prefix("== ")?.split(' ').next()) {
        let Ok(s) = sections.get(key) else { continue };
        let _ = survey::file(s, "/p");
        let _ = survey::show(s, "u.service");
        let _ = survey::python(s);
        let _ = survey::access(s, "/m");
        let _ = survey::gpus(s);
        let _ = survey::listeners(s, 30000);
        if !again.contains(&format!("== {key} ")) {
            again += &encode(key, s);
        }
    }
    let reread = Sections::parse(&(again + &end())).expect("written sections read back");
    assert_eq!(reread.len(), sections.len());
});
