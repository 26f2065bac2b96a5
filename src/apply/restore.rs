//! Putting a unit back the way it was, one name per act:
//! - [`put_back_file`]: after a failed install or a cancel before the restart: only the file (and
//!   daemon-reload); the server was never restarted, so it is left alone;
//! - [`restore`]: the previous unit's file (or the removal of a unit that was new), daemon-reload,
//!   then restart or stop, as asked;
//! - [`restore_and_verify`]: `restore`, then verification of the restored unit when it was
//!   restarted. Used by apply's rollback, and by an undo that removes a unit a rollout installed.

use tokio_util::sync::CancellationToken;

use super::aside::Aside;
use super::verifier::{Check, Verifier};
use crate::manifest::VerifySpec;
use crate::plan::UNIT_DIR;
use crate::remote::{error_chain, Host, RemoteError};
use crate::unit::{parse_unit, UnitModel};
use crate::verify::{Expect, Failure, Verification};

/// After a failed install (nothing was restarted): puts the previous unit file back if the new one
/// got in place (`previous: None` removes it), and the files moved aside, and has systemd reload.
/// Returns whether anything had to be put back.
pub async fn put_back_file(
    host: &dyn Host,
    unit: &str,
    previous: Option<&str>,
    aside: Option<&Aside>,
) -> Result<bool, RemoteError> {
    let path = format!("{UNIT_DIR}/{unit}");
    if host.read_file(&path).await?.as_deref() == previous && aside.is_none() {
        return Ok(false);
    }
    match previous {
        Some(previous) => host.write_file(&path, previous, "0644").await?,
        None => {
            host.run_ok(&["rm", "-f", "--", &path]).await?;
        }
    }
    if let Some(aside) = aside {
        super::aside::put_back(host, aside).await?;
    }
    host.run_ok(&["systemctl", "daemon-reload"]).await?;
    Ok(true)
}

/// What [`restore`] does once the previous unit file is back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The server ran before: run the previous unit again.
    Restart,
    /// The server was stopped before: leave it stopped.
    Stop,
}

/// Puts the previous unit back (with the files moved aside, and disabled again if it was), then
/// restarts or stops as `then` says. A unit that was new (`previous: None`, and
/// nothing of its name beneath) is stopped, disabled and removed whatever `then` says.
pub async fn restore(r: &Restore<'_>) -> Result<(), RemoteError> {
    let (host, unit) = (r.host, r.unit);
    let path = format!("{UNIT_DIR}/{unit}");
    if r.previous.is_none() && !r.beneath {
        host.run(&["systemctl", "disable", "--now", "--", unit])
            .await?;
        host.run_ok(&["rm", "-f", "--", &path]).await?;
        if let Some(aside) = r.aside {
            super::aside::put_back(host, aside).await?;
        }
        host.run_ok(&["systemctl", "daemon-reload"]).await?;
        host.run(&["systemctl", "reset-failed", "--", unit]).await?;
        return Ok(());
    }
    match r.previous {
        Some(previous) => host.write_file(&path, previous, "0644").await?,
        // The unit systemd had beneath the managed file (in /run, or a vendor one) comes back.
        None => {
            host.run_ok(&["rm", "-f", "--", &path]).await?;
        }
    }
    if let Some(aside) = r.aside {
        super::aside::put_back(host, aside).await?;
    }
    host.run_ok(&["systemctl", "daemon-reload"]).await?;
    if r.disable {
        host.run_ok(&["systemctl", "disable", "--", unit]).await?;
    }
    let action = match r.then {
        Then::Restart => "restart",
        Then::Stop => "stop",
    };
    host.run_ok(&["systemctl", action, "--", unit]).await?;
    Ok(())
}

/// What was put back.
#[derive(Debug)]
pub enum Restored {
    /// The unit was new: stopped, disabled and removed.
    Removed,
    /// The previous unit is back and stopped, as it was.
    LeftStopped,
    /// The previous unit is back, daemon-reloaded only (an undone reload-only change).
    Reloaded,
    /// The previous unit runs again and passed verification.
    /// Boxed: the other variants are empty.
    Verified(Box<Verification>),
}

/// Why a unit is not back on its previous unit: as `--rollback-all` says it.
#[derive(Debug, thiserror::Error)]
pub enum NotRestored {
    /// Putting the unit back failed on its host.
    #[error("{}", error_chain(.0))]
    Restore(#[source] RemoteError),
    /// No restore of it was done by this run (a group's rank whose turn never came).
    #[error("not restored")]
    NotDone,
    /// The restored unit failed its verification.
    #[error("the restored unit failed {}: {}", .0.stage, .0.reason)]
    Verify(Failure),
}

/// A restore to do and verify.
pub struct Restore<'a> {
    pub host: &'a dyn Host,
    pub unit: &'a str,
    pub previous: Option<&'a str>,
    pub then: Then,
    /// How to judge the restored server.
    pub spec: &'a VerifySpec,
    /// The live display's label for its verification.
    pub label: String,
    /// Files this run moved out of systemd's way, to put back with the unit.
    pub aside: Option<&'a Aside>,
    /// With the managed file gone systemd still has a unit of this name: restore it, not remove.
    pub beneath: bool,
    /// The unit was disabled before this run enabled it.
    pub disable: bool,
    /// What the previous unit runs, drop-ins and all, when it is more than `previous` alone.
    pub expect: Option<&'a UnitModel>,
}

/// Restores the unit and, when it was restarted, verifies it against what the previous unit says
/// it serves. A second Ctrl-C does not abort the verification: this is the way back.
pub async fn restore_and_verify(
    r: Restore<'_>,
    verifier: &dyn Verifier,
) -> Result<Restored, NotRestored> {
    restore(&r).await.map_err(NotRestored::Restore)?;
    // Its own token, which nothing cancels: a signal does not cut the way back short.
    let never = CancellationToken::new();
    match restored_check(&r, &never) {
        Ok(check) => verifier
            .verify(r.host, check)
            .await
            .map(|v| Restored::Verified(Box::new(v)))
            .map_err(NotRestored::Verify),
        Err(restored) => Ok(restored),
    }
}

/// What a [`restore`] that is done leaves to verify: the restored server, judged against what
/// the previous unit says it serves, or (`Err`) nothing, when it was removed or left stopped. A
/// server group's rollback restores every rank first and verifies them together.
pub fn restored_check<'a>(
    r: &Restore<'a>,
    cancel: &'a CancellationToken,
) -> Result<Check<'a>, Restored> {
    let expect = match (r.previous, r.then) {
        (None, _) if !r.beneath => return Err(Restored::Removed),
        (_, Then::Stop) => return Err(Restored::LeftStopped),
        (_, Then::Restart) => match (r.expect, r.previous) {
            (Some(model), _) => Expect::from_unit(model),
            (None, Some(previous)) => Expect::from_unit(&parse_unit(previous)),
            (None, None) => Expect::from_unit(&UnitModel::default()),
        },
    };
    Ok(Check {
        unit: r.unit,
        spec: r.spec,
        expect,
        label: r.label.clone(),
        cancel,
        history: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::verifier::fake::Scripted;
    use crate::remote::fake::{FakeHost, Reply};

    const PATH: &str = "/etc/systemd/system/s.service";

    async fn run(
        host: &FakeHost,
        previous: Option<&str>,
        then: Then,
    ) -> Result<Restored, NotRestored> {
        let spec = VerifySpec::default();
        let restore = Restore {
            host,
            unit: "s.service",
            previous,
            then,
            spec: &spec,
            label: "gpu-a s.service (rollback)".into(),
            aside: None,
            beneath: false,
            disable: false,
            expect: None,
        };
        restore_and_verify(restore, &Scripted::new(Vec::new())).await
    }

    fn ran(host: &FakeHost, argv: &[&str]) -> bool {
        host.commands().iter().any(|c| c == argv)
    }

    #[tokio::test]
    async fn only_a_restarted_unit_is_verified() {
        let host = FakeHost::new("gpu-a").on(&[], Reply::ok(""));
        let stopped = run(&host, Some("old"), Then::Stop).await;
        assert!(matches!(stopped, Ok(Restored::LeftStopped)), "{stopped:?}");
        assert!(ran(&host, &["systemctl", "stop", "--", "s.service"]));
        assert_eq!(host.file(PATH).as_deref(), Some("old"));

        // A new unit is removed, whatever was asked after.
        let host = FakeHost::new("gpu-a").on(&[], Reply::ok(""));
        let removed = run(&host, None, Then::Restart).await;
        assert!(matches!(removed, Ok(Restored::Removed)), "{removed:?}");
        assert!(ran(
            &host,
            &["systemctl", "disable", "--now", "--", "s.service"]
        ));
        assert!(ran(
            &host,
            &["systemctl", "reset-failed", "--", "s.service"]
        ));
    }

    #[tokio::test]
    async fn a_restore_that_fails_is_not_verified() {
        let host = FakeHost::new("gpu-a")
            .on(&[], Reply::ok(""))
            .on(&["systemctl", "restart"], Reply::exit(1, "", "failed"));
        let failed = run(&host, Some("old"), Then::Restart).await;
        assert!(
            matches!(&failed, Err(NotRestored::Restore(e)) if error_chain(e).ends_with("failed")),
            "{failed:?}"
        );
    }

    #[tokio::test]
    async fn putting_the_file_back_does_nothing_when_it_is_already_there() {
        let host = FakeHost::new("gpu-a")
            .on(&[], Reply::ok(""))
            .with_file(PATH, "old");
        assert!(!put_back_file(&host, "s.service", Some("old"), None)
            .await
            .unwrap());
        assert!(host.commands().is_empty());
        assert!(put_back_file(&host, "s.service", None, None).await.unwrap());
        assert!(ran(&host, &["rm", "-f", "--", PATH]));
        assert!(ran(&host, &["systemctl", "daemon-reload"]));
    }
}
