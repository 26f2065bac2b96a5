//! The real server on pinned weights (`sglang.model:`, issue 48): the tier's tiny model as a
//! repository of the lab's hub (olah, `crate::hub`), locked, fetched to the host before the
//! start and every file's sha256 checked, then loaded and served by the real SGLang 0.5.23 from
//! the pinned copy.

use std::path::PathBuf;

use crate::builder::map;
use crate::hub::{hub, sha256};
use crate::lab::{assert_has, lab, Reconcile};

use super::{slots, Service, HOSTS};

/// The tier's folder on this machine (`tests/run.sh` exports it; the hosts have it at
/// `super::ROOT`).
fn tier_on_this_machine() -> PathBuf {
    PathBuf::from(std::env::var("SGLANG_CPU").expect(
        "SGLANG_CPU is not set: tests/run.sh exports the real-SGLang tier's folder on this machine",
    ))
}

#[test]
#[ignore = "needs the real-SGLang tier: tests/run.sh"]
fn the_real_server_loads_and_serves_a_revision_fetched_from_the_hub() {
    let _slot = slots(1);
    let host = HOSTS[1];
    let model = tier_on_this_machine().join("tiny-model");
    lab().sh(host, "rm -rf /var/lib/reconcile-weights/labs--tiny-real");
    let repo = hub().repo("tiny-real");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&model).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let bytes = std::fs::read(&path).unwrap();
        if name.ends_with(".safetensors") {
            repo.lfs(&name, &bytes);
        } else {
            repo.file(&name, &bytes);
        }
        files.push((name, bytes));
    }
    files.sort();
    let revision = repo.commit("the tier's tiny model");
    let pin = map([
        ("hub", serde_yaml::Value::from(repo.id.clone())),
        ("revision", revision.clone().into()),
        ("endpoint", hub().endpoint.clone().into()),
    ]);
    let service = Service::new("t-rs-pinned", host, 38007).pinned(pin);
    let _stopped = service.fresh();
    let run = Reconcile::new().manifest("a.yaml", service.manifest());
    let locked = run.run_args(&["lock"]);
    assert_eq!(locked.code, 0, "{locked:?}");

    let ran = run.run_args(&["apply", "--format", "json"]);
    let report = ran.json()["units"][0].clone();
    assert_eq!(ran.code, 0, "{report:#}");
    assert_eq!(report["outcome"], "converged", "{report:#}");
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(report["fetch"]["fetched"], total as u64, "{report:#}");

    // The real server runs from the pinned copy, whose files are the tier's, byte for byte.
    let dir = format!("/var/lib/reconcile-weights/labs--tiny-real/{revision}");
    assert!(
        service.unit_file().contains(&format!("--model-path {dir}")),
        "{}",
        service.unit_file()
    );
    for (name, bytes) in &files {
        let on_host = lab().sh(host, &format!("sha256sum {dir}/{name} | cut -c1-64"));
        assert_eq!(on_host.trim(), sha256(bytes), "{name}");
    }
    let body = r#"{"model":"tiny-t-rs-pinned","prompt":"Hello","max_tokens":4}"#;
    let (status, answer) = service.http("POST", "/v1/completions", Some(body), None);
    assert_eq!(status, 200, "{answer}");
    assert_has(&answer, "\"choices\"");
}
