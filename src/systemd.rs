//! What is asked of systemd on a host, over the edge's primitives: a unit's state
//! (`systemctl show`) and, with its unit file, what the host has of a unit. Kept out of
//! `remote`, which only runs commands and moves files, so the edge knows nothing of systemd.

use async_trait::async_trait;

use crate::observed::{Observed, UnitState, SHOW_PROPERTIES};
use crate::plan::UNIT_DIR;
use crate::remote::{Host, RemoteError};

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
        let (unit_text, state) = tokio::try_join!(self.read_file(&path), self.unit_state(unit))?;
        Ok(Observed { unit_text, state })
    }
}
