//! Any `nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`
//! output must come back as GPUs or as a reason, never a panic; GPUs only when every non-blank
//! line is one, and the reading prints back to the same GPUs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::remote::gpu::parse_query;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_query(&text) {
        Ok(gpus) => {
            let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
            assert_eq!(gpus.len(), lines);
            let again: String = gpus
                .iter()
                .map(|g| format!("{}, {}, {}\n", g.index, g.used_mib, g.total_mib))
                .collect();
            assert_eq!(parse_query(&again).as_ref(), Ok(&gpus));
        }
        Err(reason) => assert!(!reason.is_empty()),
    }
});
