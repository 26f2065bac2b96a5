//! Files moved out of systemd's way under `systemd.dropins: replace` (or `--replace-dropins`):
//! a drop-in no manifest owns, a mask, a unit file in `/run` that systemd would load instead.
//! Which files, and why, is `reconcile_core::unit_files`; this module keeps them on the host and puts
//! them back.
//!
//! Each move is kept as one JSON file, `/var/lib/reconcile/<unit>/aside/<unix nanos>.json`
//! (0600, the directory 0700), written *before* any file is removed: a run cut off midway leaves
//! every file either in place or in the record, never lost. Nothing prunes these records: each
//! holds what an operator wrote by hand, and they are small.

use reconcile_core::unit_files::Moved;

use crate::remote::{Host, RemoteError};
use crate::state::unit_dir;

/// Files moved aside by this run, and where their record is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aside {
    pub record: String,
    pub files: Vec<Moved>,
}

/// The folder of a unit's records.
pub fn dir(unit: &str) -> String {
    format!("{}/aside", unit_dir(unit))
}

/// Where a new record of `unit`'s files goes: named before the move, so that the host's guard,
/// armed before the write, knows where to look (no file there: none was moved).
pub fn new_record(unit: &str) -> String {
    format!("{}/{}.json", dir(unit), unix_nanos())
}

/// Keeps `files` in `record` (named by [`new_record`]), then removes each from where systemd
/// reads it. The caller holds the unit's lock and reloads systemd afterwards (with the new unit
/// in place).
pub async fn move_aside(
    host: &dyn Host,
    unit: &str,
    record: &str,
    files: Vec<Moved>,
) -> Result<Option<Aside>, RemoteError> {
    if files.is_empty() {
        return Ok(None);
    }
    crate::state::private_dir(host, &dir(unit)).await?;
    // Each file's mode, kept with it: a drop-in an operator made 0600 comes back 0600.
    let mut files = files;
    let texts: Vec<&str> = files
        .iter()
        .filter(|f| !f.mask)
        .map(|f| f.path.as_str())
        .collect();
    if !texts.is_empty() {
        const MODES: &str =
            "for f; do printf '%s\\n' \"$(stat -c %a -- \"$f\" 2>/dev/null)\"; done";
        let argv: Vec<&str> = ["sh", "-c", MODES, "sh"].into_iter().chain(texts).collect();
        let modes = host.run_ok(&argv).await?;
        let mut modes = modes.lines();
        for f in files.iter_mut().filter(|f| !f.mask) {
            f.mode = modes
                .next()
                .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
                .map(str::to_string);
        }
    }
    let record = record.to_string();
    let json = serde_json::to_string_pretty(&files).expect("moved files serialize");
    host.write_file(&record, &(json + "\n"), "0600").await?;
    // A drop-in folder left empty goes too: systemd does not need it, and the survey takes a
    // folder with files in it for a change.
    const REMOVE: &str =
        "rm -f -- \"$1\" && case \"${1%/*}\" in *.d) rmdir -- \"${1%/*}\" 2>/dev/null; esac; true";
    for f in &files {
        host.run_ok(&["sh", "-c", REMOVE, "sh", &f.path]).await?;
    }
    Ok(Some(Aside { record, files }))
}

/// Puts every file of `aside` back where it was: a file with its text and mode (its folder made
/// if it went), a mask as the link to `/dev/null` it was. The caller reloads systemd.
pub async fn put_back(host: &dyn Host, aside: &Aside) -> Result<(), RemoteError> {
    for f in &aside.files {
        if let Some((parent, _)) = f.path.rsplit_once('/') {
            host.run_ok(&["mkdir", "-p", "--", parent]).await?;
        }
        if f.mask {
            host.run_ok(&["ln", "-sfn", "/dev/null", &f.path]).await?;
        } else {
            host.write_file(&f.path, &f.text, f.mode.as_deref().unwrap_or("0644"))
                .await?;
        }
    }
    Ok(())
}

/// The records kept for a unit, oldest first: for `history`, and for `rollback` to put the files
/// of one back.
pub async fn records(host: &dyn Host, unit: &str) -> Result<Vec<Aside>, RemoteError> {
    const LIST: &str = "cd \"$1\" 2>/dev/null || exit 0; for f in $(ls -1 | sort -n); do printf '%s\\0' \"$PWD/$f\"; cat -- \"$f\"; printf '\\0'; done";
    let out = host.run_ok(&["sh", "-c", LIST, "sh", &dir(unit)]).await?;
    let mut parts = out.split('\0');
    let mut records = Vec::new();
    while let (Some(path), Some(json)) = (parts.next(), parts.next()) {
        if path.is_empty() {
            continue;
        }
        // A record that does not read is shown as empty rather than hiding the others.
        let files = serde_json::from_str(json).unwrap_or_default();
        records.push(Aside {
            record: path.to_string(),
            files,
        });
    }
    Ok(records)
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::fake::{FakeHost, Reply};

    #[tokio::test]
    async fn each_file_is_kept_then_removed_and_a_mask_comes_back_as_a_link() {
        let host = FakeHost::new("gpu-a").on(&[], Reply::ok(""));
        let files = vec![
            Moved {
                path: "/etc/systemd/system/s.service.d/override.conf".into(),
                mask: false,
                text: "[Service]\nUser=x\n".into(),
                mode: None,
            },
            Moved {
                path: "/etc/systemd/system/s.service".into(),
                mask: true,
                text: String::new(),
                mode: None,
            },
        ];
        let record = new_record("s.service");
        let aside = move_aside(&host, "s.service", &record, files)
            .await
            .unwrap()
            .unwrap();
        let commands = host.commands();
        assert!(
            host.file(&aside.record)
                .is_some_and(|t| t.contains("override.conf") && t.contains("User=x")),
            "the record keeps each file's text"
        );
        let removed: Vec<&String> = commands
            .iter()
            .filter(|c| c[0] == "sh" && c[2].starts_with("rm -f"))
            .map(|c| &c[4])
            .collect();
        assert_eq!(
            removed,
            [
                "/etc/systemd/system/s.service.d/override.conf",
                "/etc/systemd/system/s.service"
            ]
        );
        put_back(&host, &aside).await.unwrap();
        assert!(host
            .commands()
            .iter()
            .any(|c| c == &["ln", "-sfn", "/dev/null", "/etc/systemd/system/s.service"]));
        assert_eq!(
            host.file("/etc/systemd/system/s.service.d/override.conf")
                .as_deref(),
            Some("[Service]\nUser=x\n")
        );
        assert_eq!(aside.record, record);
        assert!(
            move_aside(&host, "s.service", &new_record("s.service"), vec![])
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_file_comes_back_with_the_mode_it_had() {
        // The host says the drop-in was 0640 when it was moved.
        let host = FakeHost::new("gpu-a").on(&[], Reply::ok("640\n"));
        let path = "/etc/systemd/system/s.service.d/secret.conf";
        let files = vec![Moved {
            path: path.into(),
            mask: false,
            text: "[Service]\nEnvironment=A=1\n".into(),
            mode: None,
        }];
        let aside = move_aside(&host, "s.service", &new_record("s.service"), files)
            .await
            .unwrap()
            .unwrap();
        assert!(host
            .file(&aside.record)
            .unwrap()
            .contains("\"mode\": \"640\""));
        put_back(&host, &aside).await.unwrap();
        assert_eq!(host.mode(path).as_deref(), Some("640"));
    }
}
