//! Any output of preflight's port script (`ss -Htlnp`, a `#cgroups` line, `<pid> <cgroup>` lines)
//! must parse into listeners without panicking: a pid at most once, and a cgroup only for a pid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcile_fuzz::preflight::parse_listeners;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let listeners = parse_listeners(&text);
    let mut pids: Vec<u32> = listeners.iter().filter_map(|l| l.pid).collect();
    let all = pids.len();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), all, "a pid listed twice: {listeners:?}");
    for l in &listeners {
        if l.pid.is_none() {
            assert!(l.comm.is_empty() && l.cgroup.is_empty(), "{l:?}");
        }
    }
});
