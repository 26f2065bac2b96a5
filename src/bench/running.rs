//! The way `reconcile bench` and `reconcile quality` reach their hosts: the server each host runs
//! now (no restart), measured under the unit's lock, one result a host. The two commands differ
//! only in what they measure and keep, so the visit, the lock and the result's bookkeeping are
//! written once here.

use crate::remote::{error_chain, Host, SshOptions};
use crate::state::{self, LockError, LockPolicy, Owner};

/// One host's result, as the command reports it.
pub trait HostResult {
    /// A result with nothing measured yet.
    fn new(host: &str, unit: &str) -> Self;
    /// What every result has: its notes (the lock's, and the measurement's), why it failed,
    /// and the host's seconds.
    fn parts(&mut self) -> Parts<'_>;

    /// Its end: why it failed, if it did, and the host's seconds.
    fn finish(&mut self, failed: Option<String>, took: f64) {
        let (_, error, seconds) = self.parts();
        (*error, *seconds) = (failed, took);
    }
}

/// A result's notes, error and seconds.
pub type Parts<'a> = (&'a mut Vec<String>, &'a mut Option<String>, &'a mut f64);

/// Whose lock the measurement takes, and what it says it does (`running_unit`'s "to").
pub struct Visit<'a> {
    pub unit: &'a str,
    /// For the message of a unit that is not running: "measure", "benchmark".
    pub to: &'a str,
    pub owner: &'a Owner,
    pub lock: LockPolicy,
}

/// Why a host was not measured; `E` is the command's own failure under the lock.
#[derive(Debug, thiserror::Error)]
pub enum RunningError<E> {
    /// The unit is not installed, or not running.
    #[error(transparent)]
    NotRunning(crate::systemd::NotRunning),
    /// The unit's lock was not taken (another run holds it).
    #[error(transparent)]
    Lock(LockError),
    /// The measurement, under the lock.
    #[error(transparent)]
    Measure(E),
}

/// Measures `visit.unit` on each host (at most `at_once` at once) with `measure`, which is given
/// the host, the running unit's text and the host's result; the unit's lock is held around it.
pub async fn each_running<O, E>(
    hosts: &[String],
    ssh: &SshOptions,
    at_once: usize,
    visit: &Visit<'_>,
    measure: impl AsyncFn(&dyn Host, &str, &mut O) -> Result<(), E>,
) -> Vec<O>
where
    O: HostResult,
    E: std::error::Error,
{
    let unit = visit.unit;
    crate::visit::each_host(
        hosts.iter().map(|h| (h.clone(), ())),
        ssh,
        at_once,
        crate::visit::no_span,
        async |host: &dyn Host, turn: &crate::visit::Visit<'_>, ()| {
            let mut out = O::new(turn.name, unit);
            let error = locked(host, visit, &measure, &mut out).await.err();
            out.finish(
                error.map(|e| e.to_string()),
                turn.started.elapsed().as_secs_f64(),
            );
            out
        },
        |turn, (), e| {
            let mut out = O::new(turn.name, unit);
            out.finish(
                Some(format!("unreachable: {}", error_chain(&e))),
                turn.started.elapsed().as_secs_f64(),
            );
            out
        },
    )
    .await
}

/// The running unit's text, then `measure` under its lock; the lock is given back whatever
/// `measure` did.
async fn locked<O: HostResult, E>(
    host: &dyn Host,
    visit: &Visit<'_>,
    measure: &impl AsyncFn(&dyn Host, &str, &mut O) -> Result<(), E>,
    out: &mut O,
) -> Result<(), RunningError<E>> {
    let text = crate::systemd::running_unit(host, visit.unit, visit.to)
        .await
        .map_err(RunningError::NotRunning)?;
    let note = state::lock(host, visit.unit, visit.owner, visit.lock)
        .await
        .map_err(RunningError::Lock)?;
    out.parts().0.extend(note);
    let result = measure(host, &text, out).await;
    state::unlock_noting(host, visit.unit, out.parts().0).await;
    result.map_err(RunningError::Measure)
}
