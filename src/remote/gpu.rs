//! GPU memory as the host reports it: `nvidia-smi` over SSH, NVML on `local` hosts.

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
    NoTooling(String),
}

/// Parses `0, 75000, 97871` lines.
pub fn parse_query(csv: &str) -> Result<Vec<Gpu>, String> {
    csv.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            match fields[..] {
                [index, used, total] => Ok(Gpu {
                    index: index
                        .parse()
                        .map_err(|_| format!("bad GPU index in `{line}`"))?,
                    used_mib: used
                        .parse()
                        .map_err(|_| format!("bad memory.used in `{line}`"))?,
                    total_mib: total
                        .parse()
                        .map_err(|_| format!("bad memory.total in `{line}`"))?,
                }),
                _ => Err(format!("unexpected nvidia-smi line `{line}`")),
            }
        })
        .collect()
}

impl Host {
    pub async fn gpu_memory(&self) -> Result<GpuReading, RemoteError> {
        if let Host::Local = self {
            if let Some(gpus) = nvml_memory() {
                return Ok(GpuReading::Gpus(gpus));
            }
        }
        let out = self.run(&NVIDIA_SMI_QUERY).await?;
        match out.status {
            0 => Ok(parse_query(&out.stdout).map_or_else(GpuReading::NoTooling, GpuReading::Gpus)),
            127 => Ok(GpuReading::NoTooling("nvidia-smi is not installed".into())),
            status => Ok(GpuReading::NoTooling(format!(
                "nvidia-smi exited with {status}: {}",
                out.stderr.trim()
            ))),
        }
    }
}

/// NVML through the driver's library, when this machine has one.
fn nvml_memory() -> Option<Vec<Gpu>> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
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
        assert!(parse_query("0, N/A, 97871").is_err());
    }
}
