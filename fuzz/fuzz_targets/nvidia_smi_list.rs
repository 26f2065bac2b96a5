//! The fuzzer binary of `reconcile_fuzz::targets::nvidia_smi_list`, which says what it checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| reconcile_fuzz::targets::nvidia_smi_list::run(data));
