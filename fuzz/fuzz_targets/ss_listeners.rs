//! The fuzzer binary of `reconcile_fuzz::targets::ss_listeners`, which says what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| reconcile_fuzz::targets::ss_listeners::run(data));
