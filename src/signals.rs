//! Stopping on a signal, the same way for every command that changes hosts: Ctrl-C and SIGTERM
//! (a CI job cancelled, a timer or the agent's service stopped) fail the stage in progress, roll
//! that unit back and start no new unit or host. Rolling back can itself take a model load, so a
//! second signal does not cut it short: it says how to abandon, and a third abandons.

use tokio_util::sync::CancellationToken;

/// Exit status of a run abandoned by a third signal: 128 + SIGINT, as shells report it.
const ABANDONED: i32 = 130;

/// The first signal received, for messages: `Ctrl-C` or `SIGTERM`.
static RECEIVED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// What stopped the run, once a signal has: `interrupted (SIGTERM)`.
pub fn interrupted() -> String {
    format!(
        "interrupted ({})",
        RECEIVED.get().copied().unwrap_or("cancelled")
    )
}

/// A token cancelled on the first Ctrl-C or SIGTERM: the run's, whose children (a server group's
/// verification) are cancelled with it.
pub fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    let stopping = stop.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut received = 0;
        loop {
            let sigterm = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let name = tokio::select! {
                r = tokio::signal::ctrl_c() => match r {
                    Ok(()) => "Ctrl-C",
                    Err(_) => return,
                },
                _ = sigterm => "SIGTERM",
            };
            let _ = RECEIVED.set(name);
            received += 1;
            match received {
                1 => {
                    eprintln!("stopping: rolling back what is being verified, starting nothing new");
                    stopping.cancel();
                }
                2 => eprintln!(
                    "rolling back: signal again to abandon (a host being rolled back is then left as it is; the next apply finishes the job)"
                ),
                _ => {
                    eprintln!("abandoned: a host being rolled back keeps its unit lock; the next apply finishes the job");
                    std::process::exit(ABANDONED);
                }
            }
        }
    });
    stop
}
