//! Signs of life of a loading server beyond its memory: what its cgroup says (anonymous memory,
//! CPU time, its processes) and whether it still writes to the journal. A model load has long
//! phases with flat memory (CUDA graph capture, DeepGEMM's JIT pre-compilation, "typically 10-20
//! mins"), so memory alone cannot tell a busy server from a stuck one.

use serde::Serialize;

use crate::remote::{Host, RemoteError};

/// Read in one round over the connection. cgroup v2 first (`/sys/fs/cgroup/<cg>`), then the
/// hybrid layout systemd 252 uses on cgroup v1 hosts (`memory/`, `unified/`).
/// SGLang names its scheduler processes `sglang::scheduler[_TP<rank>...]`
/// (`sglang/srt/managers/scheduler.py`, `run_scheduler_process`, setproctitle).
const SCRIPT: &str = r#"
cg=$(systemctl show -p ControlGroup --value -- "$1")
if [ -n "$cg" ]; then
  for f in "/sys/fs/cgroup$cg/memory.stat" "/sys/fs/cgroup/memory$cg/memory.stat"; do
    if [ -r "$f" ]; then awk '$1=="anon"||$1=="total_rss"{print "anon=" $2}' "$f"; break; fi
  done
  for f in "/sys/fs/cgroup$cg/cpu.stat" "/sys/fs/cgroup/unified$cg/cpu.stat"; do
    if [ -r "$f" ]; then awk '$1=="usage_usec"{print "cpu_usec=" $2}' "$f"; break; fi
  done
  for f in "/sys/fs/cgroup$cg/cgroup.procs" "/sys/fs/cgroup/unified$cg/cgroup.procs" "/sys/fs/cgroup/systemd$cg/cgroup.procs"; do
    if [ -r "$f" ]; then
      n=0; s=0
      while read -r p; do
        n=$((n+1))
        case $(head -c 17 "/proc/$p/cmdline" 2>/dev/null) in sglang::scheduler) s=$((s+1));; esac
      done < "$f"
      echo "processes=$n"; echo "schedulers=$s"; break
    fi
  done
fi
if [ -n "$4" ] && command -v ss >/dev/null 2>&1; then
  if [ -n "$(ss -Htln "sport = :$4")" ]; then echo listening=1; else echo listening=0; fi
fi
if [ -n "$2" ]; then
  journalctl --after-cursor="$2" --show-cursor -q -o cat --no-pager -u "$1"
else
  journalctl "_SYSTEMD_INVOCATION_ID=$3" --show-cursor -q -o cat --no-pager
fi 2>/dev/null | awk '/^-- cursor: /{print "cursor=" substr($0, 12); next} {n++} END {print "journal_lines=" n+0}'
"#;

/// One reading; `None` where the host does not account it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Liveness {
    /// Anonymous memory of the unit's cgroup: the process's own, not page cache the kernel may
    /// reclaim (reading safetensors fills the cache, and a warm restart is not charged again).
    pub anon_bytes: Option<u64>,
    /// CPU time of every process in the cgroup.
    pub cpu_usec: Option<u64>,
    pub processes: Option<u32>,
    /// Processes titled `sglang::scheduler*`: one per TP rank.
    pub schedulers: Option<u32>,
    /// Whether something listens on the server's port (`ss`), when the host has `ss`.
    pub listening: Option<bool>,
    /// Journal lines since the last reading.
    pub new_journal_lines: u64,
    /// Where the next reading continues the journal.
    #[serde(skip)]
    pub cursor: Option<String>,
}

impl Liveness {
    pub fn parse(output: &str) -> Liveness {
        let mut l = Liveness::default();
        for (key, value) in output.lines().filter_map(|line| line.split_once('=')) {
            let value = value.trim();
            match key {
                "anon" => l.anon_bytes = value.parse().ok(),
                "cpu_usec" => l.cpu_usec = value.parse().ok(),
                "processes" => l.processes = value.parse().ok(),
                "schedulers" => l.schedulers = value.parse().ok(),
                "listening" => l.listening = Some(value == "1"),
                "journal_lines" => l.new_journal_lines = value.parse().unwrap_or(0),
                "cursor" if !value.is_empty() => l.cursor = Some(value.to_string()),
                _ => {}
            }
        }
        l
    }
}

impl<'h> dyn Host + 'h {
    /// Reads the unit's signs of life and whether its `port` is open; `cursor` continues the
    /// journal where the last reading ended (the first reading counts the whole invocation's
    /// lines).
    pub async fn liveness(
        &self,
        unit: &str,
        invocation: &str,
        cursor: Option<&str>,
        port: u16,
    ) -> Result<Liveness, RemoteError> {
        let port = port.to_string();
        let argv = [
            "sh",
            "-c",
            SCRIPT,
            "sh",
            unit,
            cursor.unwrap_or(""),
            invocation,
            &port,
        ];
        let out = self.run(&argv).await.map_err(|e| match e {
            RemoteError::TimedOut { host, after, .. } => RemoteError::TimedOut {
                host,
                command: "the liveness reading (systemctl show, cgroup files, ss, journalctl)"
                    .into(),
                after,
            },
            other => other,
        })?;
        let mut reading = Liveness::parse(&out.stdout);
        if reading.cursor.is_none() {
            reading.cursor = cursor.map(str::to_string);
        }
        Ok(reading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_reading() {
        let l = Liveness::parse(
            "anon=5271552\ncpu_usec=1198264\nprocesses=4\nschedulers=2\nlistening=1\ncursor=s=ab;i=87\njournal_lines=3\n",
        );
        assert_eq!(l.anon_bytes, Some(5271552));
        assert_eq!(l.cpu_usec, Some(1198264));
        assert_eq!((l.processes, l.schedulers), (Some(4), Some(2)));
        assert_eq!(l.new_journal_lines, 3);
        assert_eq!(l.listening, Some(true));
        assert_eq!(l.cursor.as_deref(), Some("s=ab;i=87"));
    }

    #[test]
    fn missing_accounting_is_none_not_zero() {
        let l = Liveness::parse("journal_lines=0\n");
        assert_eq!((l.anon_bytes, l.cpu_usec, l.processes), (None, None, None));
        assert_eq!(l.listening, None);
        assert_eq!(l.cursor, None);
        assert_eq!(Liveness::parse("garbage\n\0=\n"), Liveness::default());
    }
}

#[cfg(test)]
mod reading_tests {
    use super::*;
    use crate::remote::fake::{FakeHost, Reply};

    #[tokio::test]
    async fn a_hung_reading_is_named_for_what_it_reads() {
        let host = FakeHost::new("gpu-a").on(&["sh", "-c", SCRIPT], Reply::Hang);
        let e = (&host as &dyn Host)
            .liveness("a.service", "inv", None, 30000)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`the liveness reading (systemctl show, cgroup files, ss, journalctl)` on gpu-a did not answer in 30s"
        );
    }

    #[tokio::test]
    async fn the_cursor_carries_over_when_the_journal_has_nothing_new() {
        let host = FakeHost::new("gpu-a").on(&["sh", "-c", SCRIPT], Reply::ok("journal_lines=0\n"));
        let l = (&host as &dyn Host)
            .liveness("a.service", "inv", Some("s=1"), 30000)
            .await
            .unwrap();
        assert_eq!(l.cursor.as_deref(), Some("s=1"));
        assert_eq!(
            host.commands()[0][3..],
            ["sh", "a.service", "s=1", "inv", "30000"].map(String::from)
        );
    }
}
