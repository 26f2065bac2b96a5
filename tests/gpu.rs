//! The `local` host's GPU reading (NVML) and the memory stage's judges, against a real NVIDIA GPU.
//!
//! A PyTorch process stands in for SGLang loading its weights: it takes GPU memory in steps with
//! `cudaMalloc` (which commits the memory at once, as SGLang's weight and KV-pool allocations do),
//! holds it, and is then killed, as a rank that dies. The test reads the GPU the way `reconcile`
//! run on the GPU host does (`hosts: [local]`: NVML, no command) and hands the readings to the same
//! judges verification uses: stall (growth is progress, a flat GPU is not), the plateau against
//! the expected memory per GPU, and a worker's death. No machine here has a GPU; run it on one
//! with `cargo test --test gpu -- --ignored --nocapture` (it prints what it read).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reconcile::remote::gpu::{parse_query, Gpu, NVIDIA_SMI_QUERY};
use reconcile::remote::{Host, Limits, Local};
use reconcile_core::verify::judge::{dead_worker, plateau_failure, stall, MemoryPolicy, Sample};

/// What one step of the stand-in's load takes, and how many steps: 40 GiB in all, well inside one
/// H100 or H200 and far above the driver's own use (a CUDA context is under 1 GiB).
const STEP_GIB: u64 = 8;
const STEPS: u64 = 5;
/// How often the test reads the GPU: verification's default sample interval is 2 s, the tests'
/// 500 ms; a quarter second sees every step.
const EVERY: Duration = Duration::from_millis(250);

const LOADER: &str = r#"
import sys, time, torch
step, steps = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.init()
held = []
for i in range(steps):
    held.append(torch.empty(step << 30, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    print("step", i, flush=True)
    time.sleep(0.5)
print("loaded", flush=True)
time.sleep(600)
"#;

fn policy(stall_timeout: Duration, expected_mib: Option<u64>) -> MemoryPolicy {
    MemoryPolicy {
        stall_timeout,
        ceiling_bytes: None,
        gpu_expected_mib: expected_mib,
        gpu_tolerance_percent: 10.0,
    }
}

async fn nvml(host: &dyn Host) -> Vec<Gpu> {
    host.native_gpu_memory()
        .await
        .expect("NVML answers")
        .expect("the local host reads its GPUs through NVML")
}

/// GPU 0, as one verification sample `seconds` into the load.
async fn sample(host: &dyn Host, seconds: f64) -> Sample {
    Sample {
        seconds,
        gpu_mib: vec![nvml(host).await[0].used_mib],
        ..Sample::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs an NVIDIA GPU and PyTorch: `cargo test --test gpu -- --ignored` on a GPU host"]
async fn nvml_follows_a_real_load_and_the_memory_judges_read_it() {
    let host = Local::new(Limits::default());
    let host: &dyn Host = &host;

    // NVML and nvidia-smi describe the same GPUs.
    let started = Instant::now();
    let by_nvml = nvml(host).await;
    let first_read = started.elapsed();
    let smi = Command::new(NVIDIA_SMI_QUERY[0])
        .args(&NVIDIA_SMI_QUERY[1..])
        .output()
        .expect("nvidia-smi runs");
    let by_smi = parse_query(&String::from_utf8_lossy(&smi.stdout)).expect("nvidia-smi's CSV");
    println!("NVML ({first_read:?} with its loading): {by_nvml:?}");
    println!("nvidia-smi: {by_smi:?}");
    assert_eq!(
        by_nvml.iter().map(|g| g.index).collect::<Vec<_>>(),
        by_smi.iter().map(|g| g.index).collect::<Vec<_>>()
    );
    for (n, s) in by_nvml.iter().zip(&by_smi) {
        let apart = n.total_mib.abs_diff(s.total_mib) as f64 / s.total_mib as f64;
        assert!(
            apart < 0.02,
            "GPU {} totals: NVML {n:?}, nvidia-smi {s:?}",
            n.index
        );
    }

    // The stand-in loads; the readings start with its first step.
    let mut loader = Command::new("python3")
        .args(["-c", LOADER, &STEP_GIB.to_string(), &STEPS.to_string()])
        .env("CUDA_VISIBLE_DEVICES", "0")
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let (said, lines) = mpsc::channel();
    let out = BufReader::new(loader.stdout.take().expect("its stdout"));
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    let idle = by_nvml[0].used_mib;
    let first = lines
        .recv_timeout(Duration::from_secs(180))
        .expect("the loader's first step (importing torch, initialising CUDA)");
    assert!(first.starts_with("step"), "{first}");

    let load = Instant::now();
    let mut samples = Vec::new();
    let mut reads = Duration::ZERO;
    let mut loaded_at = None;
    while load.elapsed() < Duration::from_secs(60) {
        let read = Instant::now();
        samples.push(sample(host, load.elapsed().as_secs_f64()).await);
        reads += read.elapsed();
        if loaded_at.is_none() && lines.try_recv().is_ok_and(|l| l == "loaded") {
            loaded_at = Some(samples.len());
        }
        // While it loads, growth is progress: no prefix of the readings is a stall.
        if loaded_at.is_none() {
            assert_eq!(stall(&samples, &policy(Duration::from_secs(2), None)), None);
        }
        // Flat for three seconds after the load: what a stall judge must see as no progress.
        if loaded_at.is_some()
            && samples.last().unwrap().seconds > samples[loaded_at.unwrap() - 1].seconds + 3.0
        {
            break;
        }
        tokio::time::sleep(EVERY).await;
    }
    assert!(loaded_at.is_some(), "the loader did not finish within 60 s");
    let gpu: Vec<u64> = samples.iter().map(|s| s.gpu_mib[0]).collect();
    println!(
        "GPU 0 while loading ({} readings, {:?} each on average): {gpu:?} MiB",
        samples.len(),
        reads / samples.len() as u32
    );
    let plateau = *gpu.last().unwrap();
    let loaded_mib = STEPS * STEP_GIB * 1024;
    assert!(
        plateau >= idle + loaded_mib,
        "{plateau} MiB read after a load of {loaded_mib} MiB onto {idle} MiB"
    );
    let flat = stall(&samples, &policy(Duration::from_secs(2), None));
    println!("stall judge on the flat end: {flat:?}");
    assert!(
        flat.as_deref()
            .is_some_and(|s| s.contains("GPU memory flat")),
        "{flat:?}"
    );

    // The plateau against the memory the manifest expects per GPU.
    let last = samples.last().unwrap().clone();
    let right = plateau_failure(&last, &policy(Duration::from_secs(300), Some(loaded_mib)));
    let wrong = plateau_failure(
        &last,
        &policy(Duration::from_secs(300), Some(2 * loaded_mib)),
    );
    println!(
        "plateau judge, expecting {loaded_mib} MiB: {right:?}; expecting twice that: {wrong:?}"
    );
    assert_eq!(right, None);
    assert!(wrong.is_some_and(|w| w.contains("wrong tp or wrong model")));

    // A rank dies: the memory it held goes back to the driver, and the judge names the GPU.
    assert_eq!(dead_worker(&samples, true), None);
    loader.kill().expect("the loader is killed");
    let _ = loader.wait();
    let died = Instant::now();
    let verdict = loop {
        samples.push(sample(host, load.elapsed().as_secs_f64()).await);
        if let Some(v) = dead_worker(&samples, true) {
            break v;
        }
        assert!(
            died.elapsed() < Duration::from_secs(30),
            "GPU 0 still reads {:?} MiB 30 s after the loader was killed",
            samples.last().unwrap().gpu_mib
        );
        tokio::time::sleep(EVERY).await;
    };
    println!(
        "dead worker judge {:?} after the kill: {verdict}",
        died.elapsed()
    );
    assert!(verdict.contains("GPU #0 of the unit fell"), "{verdict}");
}
