//! GPU memory as the host reports it: `nvidia-smi` over SSH, NVML on `local` hosts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use nvml_wrapper::Nvml;
use serde::Serialize;

use super::{Host, RemoteError};

pub const NVIDIA_SMI_QUERY: [&str; 3] = [
    "nvidia-smi",
    "--query-gpu=index,memory.used,memory.total",
    "--format=csv,noheader,nounits",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub used_mib: u64,
    pub total_mib: u64,
}

/// GPUs and their memory, or why there is nothing to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuReading {
    Gpus(Vec<Gpu>),
    /// No nvidia-smi (or NVML) on the host: memory is judged on the service alone.
    NoTooling(NoGpus),
}

/// Why a host has no GPU memory to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGpus {
    /// The shell found no `nvidia-smi` (exit 127).
    #[error("nvidia-smi is not installed")]
    NotInstalled,
    /// `nvidia-smi` failed (no driver loaded, no GPU); `stderr` is what it said, trimmed.
    #[error("nvidia-smi exited with {status}: {stderr}")]
    Exited { status: i32, stderr: String },
    /// It answered, in a form not read here.
    #[error(transparent)]
    Unreadable(#[from] QueryError),
}

/// Why `nvidia-smi`'s CSV did not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A field is not a number; `field` is its name in the query (`memory.used`).
    #[error("bad {field} in `{line}`")]
    BadField {
        field: &'static str,
        line: String,
        #[source]
        source: std::num::ParseIntError,
    },
    /// Not the three fields asked for.
    #[error("unexpected nvidia-smi line `{line}`")]
    Unexpected { line: String },
}

/// Parses `0, 75000, 97871` lines.
pub fn parse_query(csv: &str) -> Result<Vec<Gpu>, QueryError> {
    csv.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            match fields[..] {
                [index, used, total] => Ok(Gpu {
                    index: number(index, "GPU index", line)?,
                    used_mib: number(used, "memory.used", line)?,
                    total_mib: number(total, "memory.total", line)?,
                }),
                _ => Err(QueryError::Unexpected {
                    line: line.to_string(),
                }),
            }
        })
        .collect()
}

/// The number in `text`, the field `field` of `line`.
fn number<T>(text: &str, field: &'static str, line: &str) -> Result<T, QueryError>
where
    T: std::str::FromStr<Err = std::num::ParseIntError>,
{
    text.parse().map_err(|source| QueryError::BadField {
        field,
        line: line.to_string(),
        source,
    })
}

impl<'h> dyn Host + 'h {
    /// GPU memory without a command where the host can (NVML on `local`), else `nvidia-smi`.
    pub async fn gpu_memory(&self) -> Result<GpuReading, RemoteError> {
        if let Some(gpus) = self.native_gpu_memory().await? {
            return Ok(GpuReading::Gpus(gpus));
        }
        let out = self.run(&NVIDIA_SMI_QUERY).await?;
        match out.status {
            0 => Ok(parse_query(&out.stdout)
                .map_or_else(|e| GpuReading::NoTooling(e.into()), GpuReading::Gpus)),
            127 => Ok(GpuReading::NoTooling(NoGpus::NotInstalled)),
            status => Ok(GpuReading::NoTooling(NoGpus::Exited {
                status,
                stderr: out.stderr.trim().to_string(),
            })),
        }
    }
}

/// NVML, loaded once per run, on first use: `Nvml::init` loads the driver's library and opens
/// every GPU, which blocks, for seconds on a large host. `None` when this machine has no NVIDIA
/// driver, and then it is not tried again.
static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
/// Set once an NVML call did not return within the limit (a GPU fallen off the bus hangs the
/// driver): later readings go to `nvidia-smi`, and its own limit, rather than pile up threads
/// stuck in NVML.
static NVML_HUNG: AtomicBool = AtomicBool::new(false);

/// GPU memory through NVML, when this machine has it (`Ok(None)` when not). NVML calls block, so
/// they run on tokio's blocking threads, never on the threads that drive the other checks; past
/// `limit` (the host's command limit) NVML counts as hung.
pub(super) async fn nvml_memory(limit: Duration) -> Result<Option<Vec<Gpu>>, RemoteError> {
    if NVML_HUNG.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let read = tokio::task::spawn_blocking(|| {
        let nvml = NVML.get_or_init(|| Nvml::init().ok()).as_ref()?;
        nvml_read(nvml)
    });
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(gpus)) => Ok(gpus),
        // The blocking task panicked inside the driver's library: read with nvidia-smi instead.
        Ok(Err(_)) => Ok(None),
        Err(_) => {
            NVML_HUNG.store(true, Ordering::Relaxed);
            Err(RemoteError::TimedOut {
                host: "local".into(),
                command: "NVML".into(),
                after: limit,
            })
        }
    }
}

fn nvml_read(nvml: &Nvml) -> Option<Vec<Gpu>> {
    let count = nvml.device_count().ok()?;
    (0..count)
        .map(|index| {
            let memory = nvml.device_by_index(index).ok()?.memory_info().ok()?;
            Some(Gpu {
                index,
                used_mib: memory.used / (1024 * 1024),
                total_mib: memory.total / (1024 * 1024),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nvidia_smi_csv() {
        let gpus = parse_query("0, 75000, 97871\n1, 12, 97871\n").unwrap();
        assert_eq!(
            gpus[0],
            Gpu {
                index: 0,
                used_mib: 75000,
                total_mib: 97871
            }
        );
        assert_eq!(gpus.len(), 2);
        let e = parse_query("0, N/A, 97871").unwrap_err();
        assert_eq!(e.to_string(), "bad memory.used in `0, N/A, 97871`");
    }

    #[tokio::test]
    async fn nvml_is_loaded_once_and_read_off_the_async_threads() {
        // Whether or not this machine has a GPU, the second reading finds NVML (or its absence)
        // already settled and gives the same kind of answer.
        let first = nvml_memory(super::super::COMMAND_TIMEOUT).await.unwrap();
        assert!(
            NVML.get().is_some(),
            "NVML was not settled by the first reading"
        );
        let second = nvml_memory(super::super::COMMAND_TIMEOUT).await.unwrap();
        assert_eq!(first.is_some(), second.is_some());
        assert_eq!(first.is_some(), NVML.get().is_some_and(Option::is_some));
    }

    proptest::proptest! {
        #[test]
        fn any_output_is_gpus_or_a_reason(text in proptest::prelude::any::<String>()) {
            let _ = parse_query(&text);
        }

        #[test]
        fn readings_as_nvidia_smi_prints_them_parse_back(
            gpus in proptest::collection::vec((0u32..64, proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()), 0..9),
        ) {
            let csv: String = gpus
                .iter()
                .map(|(i, used, total)| format!("{i}, {used}, {total}\n"))
                .collect();
            let parsed = parse_query(&csv).unwrap();
            let back: Vec<(u32, u64, u64)> =
                parsed.iter().map(|g| (g.index, g.used_mib, g.total_mib)).collect();
            proptest::prop_assert_eq!(back, gpus);
        }
    }
}
