//! `systemd.hardening: standard`: a sandbox for an SGLang server that it keeps working under on
//! NVIDIA GPUs. docs/hardening.md has each setting with its cost on a GPU host, the scores
//! `systemd-analyze security` gives, and which setting to drop when something breaks.
//!
//! What the server needs, and where that is written down (sglang 0.5.23 and its venv):
//! - The GPUs' device nodes: `/dev/nvidia0..N` and `/dev/nvidiactl` (group `nvidia-frontend`, or
//!   `nvidia` and `nvidiactl` in drivers that register them apart, open-gpu-kernel-modules
//!   `nv.c`), `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` (`nvidia-uvm`), `/dev/nvidia-caps/*`
//!   (`nvidia-caps`, MIG) and, over several hosts, `/dev/infiniband/uverbs*` (`infiniband_verbs`).
//!   So no `PrivateDevices=`, which would leave only pseudo devices.
//! - `/dev/shm`, writable and shared by its processes: NCCL's shared memory segments
//!   (`/dev/shm/nccl-*`, NCCL's "Runtime and MPI issues: Shared memory"), SGLang's load snapshots
//!   (`srt/managers/load_snapshot.py`). So no `PrivateIPC=`.
//! - A writable home: the P2P check's cache (`~/.cache/sglang`, made with `os.makedirs` in
//!   `srt/distributed/device_communicators/custom_all_reduce_utils.py`), Triton's kernel cache
//!   (`~/.triton/cache`, `triton/knobs.py`), CUDA's own (`~/.nv/ComputeCache`), Hugging Face's
//!   (`~/.cache/huggingface`, `huggingface_hub/constants.py`). None of them need exist before.
//! - Memory both writable and executable for the JIT compilers (Triton, `torch.compile`, CUDA's
//!   driver, libffi's trampolines): no `MemoryDenyWriteExecute=`.
//! - `setrlimit` (`set_ulimit` in `srt/utils/common.py` catches only `ValueError`, so an EPERM
//!   would end the server), `sched_setaffinity`, `mbind` and `set_mempolicy` (NCCL pins its
//!   threads and its host memory to the GPU's NUMA node): the `@resources` system calls.
//! - The network: TCP for the API, NCCL's and torch's rendezvous; UNIX sockets for ZeroMQ between
//!   SGLang's processes; netlink for `getifaddrs` and RDMA's device list.

use std::collections::BTreeMap;

use crate::manifest::{Hardening, HostSpec, Manifest};

/// Adds the host's preset to `settings` (`Section.Key` to its values). The caller writes the
/// manifest's own `systemd:` settings over them afterwards: an explicit setting replaces the
/// preset's, and an empty one removes it.
pub(super) fn add(settings: &mut BTreeMap<String, Vec<String>>, m: &Manifest, host: &HostSpec) {
    let user = host
        .systemd
        .get("User")
        .or_else(|| m.systemd.get("User"))
        .map(String::as_str);
    for (key, values) in preset(host.hardening, user) {
        settings.insert(format!("Service.{key}"), values);
    }
    if host.hardening == Hardening::None {
        return;
    }
    let mut env = m.env.clone();
    env.extend(host.env.clone());
    for (key, values) in writable_folders(&env) {
        settings.insert(format!("Service.{key}"), values);
    }
}

/// The environment variables that name a folder the server writes: its caches (Hugging Face's,
/// Triton's, torch.compile's, SGLang's own, CUDA's kernel cache, FlashInfer's workspace).
const CACHE_VARS: [&str; 11] = [
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_HOME",
    "SGLANG_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "FLASHINFER_WORKSPACE_BASE",
];

/// Under `ProtectSystem=strict`, the folders the unit's environment points its caches at, made
/// writable: one under `/var/cache` or `/var/lib` as systemd's own `CacheDirectory=` or
/// `StateDirectory=` (systemd makes it, owned by the server's user, before the start), any other
/// with `ReadWritePaths=`, which can open only a folder that exists when the unit starts.
fn writable_folders(env: &BTreeMap<String, String>) -> Vec<(&'static str, Vec<String>)> {
    let mut cache = Vec::new();
    let mut state = Vec::new();
    let mut paths = Vec::new();
    for value in CACHE_VARS.iter().filter_map(|v| env.get(*v)) {
        let value = value.trim_end_matches('/');
        let top = |base: &str| {
            let rest = value.strip_prefix(base)?;
            rest.split('/')
                .next()
                .filter(|n| !n.is_empty() && *n != "..")
                .map(str::to_string)
        };
        if !value.starts_with('/') || value.contains("/../") {
            continue;
        }
        if let Some(name) = top("/var/cache/") {
            cache.push(name);
        } else if let Some(name) = top("/var/lib/") {
            state.push(name);
        } else {
            paths.push(format!("-{value}"));
        }
    }
    let mut out = Vec::new();
    for (key, mut list) in [
        ("CacheDirectory", cache),
        ("StateDirectory", state),
        ("ReadWritePaths", paths),
    ] {
        list.sort();
        list.dedup();
        if !list.is_empty() {
            out.push((key, vec![list.join(" ")]));
        }
    }
    out
}

/// A preset's `[Service]` settings for a server run as `user` (`User=`; `None` is root).
pub(super) fn preset(level: Hardening, user: Option<&str>) -> Vec<(&'static str, Vec<String>)> {
    match level {
        Hardening::None => Vec::new(),
        Hardening::Standard => standard(user),
    }
}

/// Every setting here is one systemd 247 knows (Debian bullseye; bookworm has 252).
fn standard(user: Option<&str>) -> Vec<(&'static str, Vec<String>)> {
    let one = |v: &str| vec![v.to_string()];
    let mut settings = vec![
        // No setuid gains. The cost: a CUDA that finds /dev/nvidia-uvm missing runs the setuid
        // nvidia-modprobe to load the module and make the nodes, which now fails; the nodes must
        // exist before the server starts (docs/hardening.md).
        ("NoNewPrivileges", one("yes")),
        // Root keeps one capability: memory locking past RLIMIT_MEMLOCK, which InfiniBand's
        // memory registration needs (NCCL asks for `--ulimit memlock=-1` in containers). The
        // others go, CAP_DAC_OVERRIDE with them: a root server reads only what root owns or what
        // is readable to all. A server run as another user had none of them anyway.
        ("CapabilityBoundingSet", one("CAP_IPC_LOCK")),
        // The OS read-only; /dev (so /dev/shm), /proc and /sys stay as they are, and so do /home
        // and /root. ProtectHome= is left off on purpose: its `read-only` would take the
        // server's own home with the others, and ReadWritePaths= can give back only folders that
        // exist when the unit starts (systemd skips a missing `-` path and keeps the stricter of
        // two mounts on one path), while the caches above are made on first use. Without the
        // capabilities above, a root server cannot write other users' homes anyway.
        ("ProtectSystem", one("strict")),
        // A private /tmp and /var/tmp, shared by the server's own processes (ZeroMQ's sockets,
        // Prometheus' multiprocess folder). torch.compile's cache there starts empty each start.
        ("PrivateTmp", one("yes")),
        ("PrivateMounts", one("yes")),
        ("ProtectKernelTunables", one("yes")),
        // Module loading is the setuid helper's job above, never the server's.
        ("ProtectKernelModules", one("yes")),
        ("ProtectKernelLogs", one("yes")),
        ("ProtectControlGroups", one("yes")),
        ("ProtectClock", one("yes")),
        ("ProtectHostname", one("yes")),
        // Other users' processes hidden. Not ProcSubset=pid: NVML reads /proc/driver/nvidia,
        // psutil /proc/meminfo and torch /proc/cpuinfo.
        ("ProtectProc", one("invisible")),
        // Only the pseudo devices (null, zero, random, tty, ...) and these groups of
        // /proc/devices, matched as globs when the unit starts: every NVIDIA group (frontend or
        // nvidia and nvidiactl, uvm, caps, caps-imex-channels, nvswitch) and InfiniBand's verbs.
        ("DevicePolicy", one("closed")),
        (
            "DeviceAllow",
            vec!["char-nvidia* rw".into(), "char-infiniband_verbs rw".into()],
        ),
        (
            "RestrictAddressFamilies",
            one("AF_UNIX AF_INET AF_INET6 AF_NETLINK"),
        ),
        ("RestrictNamespaces", one("yes")),
        ("RestrictRealtime", one("yes")),
        ("RestrictSUIDSGID", one("yes")),
        ("LockPersonality", one("yes")),
        ("SystemCallArchitectures", one("native")),
        // systemd's list for services: it has @resources (above) and @ipc, and lacks @debug, so
        // ptrace, perf_event_open (the profiler) and pidfd_getfd are refused. PyTorch shares
        // expandable segments between processes with pidfd_getfd (`expandable_segments:True`).
        ("SystemCallFilter", one("@system-service")),
        // A refused call fails with EPERM rather than killing the process with SIGSYS.
        ("SystemCallErrorNumber", one("EPERM")),
    ];
    // The home stays writable, its keys and shell start-up files do not: a compromised server
    // cannot let itself in over SSH or into the next login.
    if let Some(home) = home(user) {
        settings.push((
            "ReadOnlyPaths",
            one(&format!("-{home}/.ssh -{home}/.bashrc -{home}/.profile")),
        ));
    }
    settings
}

/// The home of `User=` as Debian makes it: `/root` for root (the default), else `/home/<name>`.
/// `None` for a value that is no plain user name (a specifier, a number other than 0).
fn home(user: Option<&str>) -> Option<String> {
    match user.map(str::trim) {
        None | Some("" | "root" | "0") => Some("/root".into()),
        Some(name)
            if name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
        {
            Some(format!("/home/{name}"))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::unit::{parse_unit, render};

    const BASE: &str = "\
service: s
hosts: [gpu-a]
sglang:
  python: /root/ml-env/bin/python3
  version: 0.5.23
  model_path: /shared/models/m
  port: 30000
";

    fn setting<'a>(unit: &'a crate::unit::Desired, key: &str) -> Option<&'a Vec<String>> {
        unit.model.settings.get(&format!("Service.{key}"))
    }

    #[test]
    fn the_standard_preset_renders_the_gpu_sandbox() {
        let text = format!("{BASE}systemd: {{ User: root, hardening: standard }}\n");
        let m = parse("m.yaml", &text).unwrap();
        let unit = render(&m, &m.hosts[0]);
        let expected: &[(&str, &[&str])] = &[
            ("NoNewPrivileges", &["yes"]),
            ("CapabilityBoundingSet", &["CAP_IPC_LOCK"]),
            ("ProtectSystem", &["strict"]),
            ("PrivateTmp", &["yes"]),
            ("PrivateMounts", &["yes"]),
            ("ProtectKernelTunables", &["yes"]),
            ("ProtectKernelModules", &["yes"]),
            ("ProtectKernelLogs", &["yes"]),
            ("ProtectControlGroups", &["yes"]),
            ("ProtectClock", &["yes"]),
            ("ProtectHostname", &["yes"]),
            ("ProtectProc", &["invisible"]),
            ("DevicePolicy", &["closed"]),
            (
                "DeviceAllow",
                &["char-nvidia* rw", "char-infiniband_verbs rw"],
            ),
            (
                "RestrictAddressFamilies",
                &["AF_UNIX AF_INET AF_INET6 AF_NETLINK"],
            ),
            ("RestrictNamespaces", &["yes"]),
            ("RestrictRealtime", &["yes"]),
            ("RestrictSUIDSGID", &["yes"]),
            ("LockPersonality", &["yes"]),
            ("SystemCallArchitectures", &["native"]),
            ("SystemCallFilter", &["@system-service"]),
            ("SystemCallErrorNumber", &["EPERM"]),
            (
                "ReadOnlyPaths",
                &["-/root/.ssh -/root/.bashrc -/root/.profile"],
            ),
        ];
        for (key, values) in expected {
            assert_eq!(
                setting(&unit, key).map(Vec::as_slice),
                Some(
                    values
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .as_slice()
                ),
                "{key} in\n{}",
                unit.text
            );
        }
        // What SGLang on GPUs cannot run under is left out.
        for key in [
            "PrivateDevices",
            "PrivateIPC",
            "MemoryDenyWriteExecute",
            "ProtectHome",
            "ProcSubset",
            "PrivateUsers",
            "PrivateNetwork",
            "RemoveIPC",
        ] {
            assert!(setting(&unit, key).is_none(), "{key} in\n{}", unit.text);
        }
        // The text says what the model says: two DeviceAllow= lines, in order.
        assert_eq!(parse_unit(&unit.text), unit.model);
        assert!(unit
            .text
            .contains("DeviceAllow=char-nvidia* rw\nDeviceAllow=char-infiniband_verbs rw\n"));
        // The key itself is reconcile's, never written into the unit.
        assert!(!m.systemd.contains_key("hardening"));
        assert!(!unit.text.contains("hardening"), "{}", unit.text);
    }

    #[test]
    fn an_explicit_systemd_setting_overrides_the_presets_and_an_empty_one_removes_it() {
        let text = format!(
            "{BASE}systemd:\n  hardening: standard\n  ProtectSystem: full\n  PrivateTmp: \"no\"\n  DeviceAllow: /dev/nvidia0 rw\n  ReadOnlyPaths: \"\"\n"
        );
        let m = parse("m.yaml", &text).unwrap();
        let unit = render(&m, &m.hosts[0]);
        assert_eq!(setting(&unit, "ProtectSystem").unwrap(), &["full"]);
        assert_eq!(setting(&unit, "PrivateTmp").unwrap(), &["no"]);
        // A list setting given explicitly replaces the preset's whole list.
        assert_eq!(setting(&unit, "DeviceAllow").unwrap(), &["/dev/nvidia0 rw"]);
        assert!(setting(&unit, "ReadOnlyPaths").is_none(), "{}", unit.text);
        // The rest of the preset stays.
        assert_eq!(setting(&unit, "DevicePolicy").unwrap(), &["closed"]);
        assert_eq!(parse_unit(&unit.text), unit.model);
    }

    #[test]
    fn a_host_sets_its_own_preset_over_the_services() {
        let text = "\
service: s
hosts:
  - gpu-a
  - name: gpu-b
    systemd: { hardening: none }
  - name: gpu-c
    systemd: { hardening: standard, ProtectClock: \"no\" }
sglang:
  python: /root/ml-env/bin/python3
  version: 0.5.23
  model_path: /shared/models/m
  port: 30000
systemd: { hardening: standard }
";
        let m = parse("m.yaml", text).unwrap();
        assert!(crate::manifest::validate(&m, text).is_ok());
        let [a, b, c] = [0, 1, 2].map(|i| render(&m, &m.hosts[i]));
        assert_eq!(setting(&a, "ProtectSystem").unwrap(), &["strict"]);
        assert!(setting(&b, "ProtectSystem").is_none(), "{}", b.text);
        assert_eq!(setting(&c, "ProtectSystem").unwrap(), &["strict"]);
        assert_eq!(setting(&c, "ProtectClock").unwrap(), &["no"]);
        assert!(!m.hosts[2].systemd.contains_key("hardening"));
    }

    #[test]
    fn without_the_key_the_unit_is_as_before() {
        let m = parse("m.yaml", BASE).unwrap();
        let plain = render(&m, &m.hosts[0]);
        let text = format!("{BASE}systemd: {{ hardening: none }}\n");
        let m = parse("m.yaml", &text).unwrap();
        assert_eq!(render(&m, &m.hosts[0]).text, plain.text);
        assert!(setting(&plain, "ProtectSystem").is_none());
    }

    #[test]
    fn an_unknown_preset_is_refused_offline_with_its_file_line_and_field() {
        let bad = format!("{BASE}systemd:\n  User: root\n  hardening: strict\n");
        let e = parse("m.yaml", &bad).unwrap_err().0;
        assert_eq!(e.len(), 1, "{e:?}");
        let e = e[0].to_string();
        assert!(
            e.starts_with("m.yaml:10:3: systemd.hardening: `strict` is not a hardening preset"),
            "{e}"
        );
        let bad = BASE.replace(
            "hosts: [gpu-a]",
            "hosts:\n  - gpu-a\n  - name: gpu-b\n    systemd: { hardening: Standard }",
        );
        let e = parse("m.yaml", &bad).unwrap_err().0[0].to_string();
        assert!(
            e.starts_with("m.yaml:5:") && e.contains("hosts[1].systemd.hardening: `Standard`"),
            "{e}"
        );
        // A number or a boolean is no preset either.
        let bad = format!("{BASE}systemd: {{ hardening: true }}\n");
        assert!(parse("m.yaml", &bad).is_err());
    }

    #[test]
    fn the_protected_start_up_files_are_in_the_servers_home() {
        let paths = |user: Option<&str>| {
            preset(Hardening::Standard, user)
                .into_iter()
                .find(|(k, _)| *k == "ReadOnlyPaths")
                .map(|(_, v)| v[0].clone())
        };
        assert_eq!(
            paths(None).as_deref(),
            Some("-/root/.ssh -/root/.bashrc -/root/.profile")
        );
        assert_eq!(paths(Some("0")), paths(None));
        assert_eq!(
            paths(Some("sglang")).as_deref(),
            Some("-/home/sglang/.ssh -/home/sglang/.bashrc -/home/sglang/.profile")
        );
        // Not a name a home can be guessed from: nothing is protected rather than a wrong path.
        assert_eq!(paths(Some("%i")), None);
        assert_eq!(paths(Some("1000")), None);
        assert!(preset(Hardening::None, None).is_empty());
    }

    #[test]
    fn the_caches_the_environment_names_stay_writable_under_a_read_only_system() {
        let env: BTreeMap<String, String> = [
            ("XDG_CACHE_HOME", "/var/cache/sglang"),
            ("HF_HOME", "/var/cache/sglang/hf"),
            ("TRITON_CACHE_DIR", "/var/lib/triton/cache"),
            ("TORCHINDUCTOR_CACHE_DIR", "/scratch/inductor/"),
            ("CUDA_VISIBLE_DEVICES", "/var/cache/not-a-cache"),
            ("SGLANG_CACHE_DIR", "relative/path"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            writable_folders(&env),
            [
                ("CacheDirectory", vec!["sglang".to_string()]),
                ("StateDirectory", vec!["triton".to_string()]),
                ("ReadWritePaths", vec!["-/scratch/inductor".to_string()]),
            ]
        );
    }
}
