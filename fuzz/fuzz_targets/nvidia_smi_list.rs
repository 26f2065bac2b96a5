//! Any `nvidia-smi -L` output must parse into GPUs without panicking: one per `GPU <n>:` line at
//! most.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::preflight::parse_gpu_list;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let gpus = parse_gpu_list(&text);
    assert!(gpus.len() <= text.lines().count());
});
