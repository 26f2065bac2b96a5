//! What is asked of systemd on a host, over the edge's primitives: a unit's state
//! (`systemctl show`) and, with its unit file, what the host has of a unit. Kept out of
//! `remote`, which only runs commands and moves files, so the edge knows nothing of systemd.

use async_trait::async_trait;

use crate::observed::{Observed, UnitState, SHOW_PROPERTIES};
use crate::plan::UNIT_DIR;
use crate::remote::{Host, RemoteError};
use crate::unit_files::{parse_unit_files, UNIT_FILES_SCRIPT};

/// systemd on a host; import it to call `host.unit_state(unit)` on any [`Host`].
#[async_trait]
pub trait Systemd {
    async fn unit_state(&self, unit: &str) -> Result<UnitState, RemoteError>;

    /// The unit's file and systemd's state for it, read concurrently over the one connection.
    async fn observe(&self, unit: &str) -> Result<Observed, RemoteError>;
}

#[async_trait]
impl<H: Host + ?Sized> Systemd for H {
    async fn unit_state(&self, unit: &str) -> Result<UnitState, RemoteError> {
        let out = self
            .run_ok(&["systemctl", "show", "-p", SHOW_PROPERTIES, "--", unit])
            .await?;
        Ok(UnitState::from_show(&out))
    }

    async fn observe(&self, unit: &str) -> Result<Observed, RemoteError> {
        let path = format!("{UNIT_DIR}/{unit}");
        let unit_files = async {
            self.run_ok(&["sh", "-c", UNIT_FILES_SCRIPT, "sh", unit, &path])
                .await
        };
        let (unit_text, state, unit_files) =
            tokio::try_join!(self.read_file(&path), self.unit_state(unit), unit_files)?;
        let unit_files = parse_unit_files(&unit_files, &state.load_state, &state.unit_file_state);
        Ok(Observed {
            unit_text,
            state,
            unit_files,
        })
    }
}

/// How long systemd took over the unit's last stop (from `ActiveExit` to `InactiveEnter`), in
/// seconds: the old server's own shutdown inside `systemctl restart`, which apply's stage clock
/// (started once the restart returned) does not count. SGLang's shutdown (its scheduler and
/// detokenizer processes, `kill_process_tree`) takes seconds on the real server; that is the
/// server's time, not the experiment's; with `KillMode=mixed` it includes the requests in flight
/// SGLang finished. `None` when systemd does not say.
pub async fn last_stop_seconds(host: &dyn Host, unit: &str) -> Option<f64> {
    let out = host
        .run_ok(&[
            "systemctl",
            "show",
            "-p",
            "ActiveExitTimestampMonotonic",
            "-p",
            "InactiveEnterTimestampMonotonic",
            "--",
            unit,
        ])
        .await
        .unwrap_or_default();
    let value = |key: &str| -> Option<f64> {
        out.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (
        value("ActiveExitTimestampMonotonic"),
        value("InactiveEnterTimestampMonotonic"),
    ) {
        (Some(exit), Some(inactive)) if exit > 0.0 && inactive >= exit => {
            Some((inactive - exit) / 1e6)
        }
        _ => None,
    }
}

/// Why a command that measures a running server (`bench`, `quality`) has nothing to measure.
#[derive(Debug, thiserror::Error)]
pub enum NotRunning {
    /// The unit file could not be read.
    #[error("{}", crate::remote::error_chain(.0))]
    ReadUnit(#[source] RemoteError),
    /// No unit file.
    #[error("{unit} is not installed on {host}")]
    NotInstalled { unit: String, host: String },
    /// systemd could not be asked about the unit.
    #[error("{}", crate::remote::error_chain(.0))]
    AskState(#[source] RemoteError),
    /// The unit is not active (`state`); there is nothing `to` do.
    #[error("{unit} is not running on {host} ({state}); nothing to {to}")]
    Inactive {
        unit: String,
        host: String,
        state: String,
        to: String,
    },
}

/// The unit file of a unit that runs now, for a command that measures its server without a
/// restart (`bench`, `quality`): an error saying why there is nothing `to` do otherwise.
pub async fn running_unit(host: &dyn Host, unit: &str, to: &str) -> Result<String, NotRunning> {
    let text = host
        .read_file(&format!("{UNIT_DIR}/{unit}"))
        .await
        .map_err(NotRunning::ReadUnit)?
        .ok_or_else(|| NotRunning::NotInstalled {
            unit: unit.to_string(),
            host: host.name().to_string(),
        })?;
    let state = host.unit_state(unit).await.map_err(NotRunning::AskState)?;
    if state.active_state != "active" {
        return Err(NotRunning::Inactive {
            unit: unit.to_string(),
            host: host.name().to_string(),
            state: state.active_state,
            to: to.to_string(),
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::fake::{FakeHost, Reply};

    #[tokio::test]
    async fn observing_reads_the_unit_file_and_asks_systemd() {
        let fake = FakeHost::new("gpu-a")
            .with_file("/etc/systemd/system/a.service", "[Service]\n")
            .on(
                &[
                    "systemctl",
                    "show",
                    "-p",
                    SHOW_PROPERTIES,
                    "--",
                    "a.service",
                ],
                Reply::ok("LoadState=loaded\nActiveState=active\nInvocationID=abc\n"),
            )
            .on(
                &["sh", "-c", UNIT_FILES_SCRIPT],
                Reply::ok("managed\0/etc/systemd/system/a.service\0\0dropin\0/etc/systemd/system/a.service.d/x.conf\0[Service]\nNice=1\n\0"),
            );
        let host: &dyn Host = &fake;
        let observed = host.observe("a.service").await.unwrap();
        assert_eq!(observed.unit_text.as_deref(), Some("[Service]\n"));
        assert_eq!(observed.state.active_state, "active");
        assert_eq!(observed.state.invocation_id, "abc");
        assert_eq!(observed.unit_files.drop_ins[0].text, "[Service]\nNice=1\n");
        assert_eq!(fake.commands().len(), 2);
        let missing = host.observe("b.service").await.unwrap_err();
        assert_eq!(
            missing.to_string(),
            "gpu-a: `systemctl show -p ".to_string()
                + SHOW_PROPERTIES
                + " -- b.service` exited with 127: fake: no answer scripted for `systemctl show -p "
                + SHOW_PROPERTIES + " -- b.service`"
        );
    }
}
