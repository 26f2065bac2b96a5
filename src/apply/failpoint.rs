//! Fail points at the transaction's step boundaries, for the crash matrix (issue 44,
//! `tests/integration/crash.rs`, `tests/crash-matrix.sh`): the controller dies, or waits for the
//! test to reboot its host or cut its link, just before it carries out a step.
//!
//! Compiled into debug builds only (the tests' build); a release build has no trace of them.
//! Not fail-rs: its points exist only under a cargo feature, which every test command would
//! have to name, and a command that forgot it would run the matrix against no fail point at all.
//! Here the test build always has them, and each cell checks that its point fired.
//!
//! `RECONCILE_FAIL_AT=<step>:<action>[,...]` (a step by [`Step::name`]); the action:
//! - `kill`: SIGKILL of this process, as the step begins;
//! - `pause`: waits until the test says go, which it does once it has rebooted the host, cut the
//!   link or sent a signal (or kills this process meanwhile).
//!
//! Each fires once per run. `RECONCILE_FAIL_MARK=<path>`: a fired point writes the step's name
//! there first; a paused one waits for `<path>.go` to exist, and removes it as it goes on.

use reconcile_core::transaction::Step;

/// The fail point before `step`: nothing unless the environment names it.
#[cfg(debug_assertions)]
pub async fn before(step: Step) {
    use std::sync::Mutex;
    static FIRED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let Ok(points) = std::env::var("RECONCILE_FAIL_AT") else {
        return;
    };
    let name = step.name();
    let Some(action) = points
        .split(',')
        .filter_map(|p| p.split_once(':'))
        .find_map(|(at, action)| (at == name).then_some(action))
    else {
        return;
    };
    {
        let mut fired = FIRED.lock().unwrap_or_else(|p| p.into_inner());
        if fired.contains(&name) {
            return;
        }
        fired.push(name);
    }
    let mark = std::env::var("RECONCILE_FAIL_MARK").ok();
    if let Some(mark) = &mark {
        let _ = std::fs::write(mark, name);
    }
    match action {
        "kill" => {
            // SAFETY: kill(2) on this process; nothing of Rust's state is touched.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        "pause" => {
            let go = format!("{}.go", mark.expect("a pause needs RECONCILE_FAIL_MARK"));
            while !std::path::Path::new(&go).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            // Taken, so that a later pause waits for a go of its own.
            let _ = std::fs::remove_file(&go);
        }
        other => panic!("RECONCILE_FAIL_AT: unknown action {other:?} (kill or pause)"),
    }
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub async fn before(_: Step) {}
