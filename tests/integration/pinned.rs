//! Pinned weights (`sglang.model:`, issue 48) on the SGLang stand-in, fetched from the lab's hub
//! (olah serving local git repositories offline, `hub.rs`): a revision locked, planned, fetched
//! before the stop and verified, then fetched never again; a fetch killed with its apply and
//! resumed by the next; a file whose bytes are not the lock's refused before anything stopped; a
//! revision that fails rolled back to the one kept, which `keep` keeps while the failed one goes;
//! three hosts that serve each other (`peers:`), the hub serving the revision once.

use serde_json::Value as Json;
use serde_yaml::Value;

use crate::builder::{map, STAND_IN_VERIFY};
use crate::hub::{hub, safetensors, sha256, Repo};
use crate::lab::{assert_has, lab, manifest, Manifest, Reconcile, PINNED};

const ROOT: &str = "/var/lib/reconcile-weights";
const CONFIG: &[u8] = br#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64}"#;
const TOKENIZER: &[u8] = br#"{"model": {"type": "BPE"}}"#;

/// The service `name` on `hosts` at `port`, on the weights `model` pins.
fn service(name: &str, hosts: &[&str], port: u16, model: Value) -> Manifest {
    manifest(name, hosts)
        .port(port)
        .pinned_model(model)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", PINNED.gpu_pair(port))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
}

/// `sglang.model:` for `repo` at `revision`, from the lab's hub, with `more` settings.
fn pin(repo: &Repo, revision: &str, more: &[(&str, Value)]) -> Value {
    let mut entries = vec![
        ("hub", Value::from(repo.id.clone())),
        ("revision", revision.into()),
        ("endpoint", hub().endpoint.clone().into()),
    ];
    entries.extend(more.iter().cloned());
    map(entries)
}

/// The folder of `repo`'s `revision` on a host.
fn pinned_dir(repo: &Repo, revision: &str) -> String {
    format!("{ROOT}/{}/{revision}", repo.id.replace('/', "--"))
}

/// A new repository `name` on the hub, and no copy of it left on `host` by an earlier run.
fn fresh_repo(host: &str, name: &str) -> Repo {
    lab().sh(host, &format!("rm -rf {ROOT}/labs--{name}"));
    hub().repo(name)
}

/// A first revision: a config, a tokenizer and one small safetensors file.
fn first_revision(repo: &Repo) -> String {
    repo.file("config.json", CONFIG)
        .file("tokenizer.json", TOKENIZER)
        .lfs("model.safetensors", &safetensors(1024, 1));
    repo.commit("first")
}

/// `reconcile lock`, which must pass.
fn lock(run: &Reconcile) -> String {
    let locked = run.run_args(&["lock"]);
    assert_eq!(locked.code, 0, "{locked:?}");
    locked.stdout
}

fn apply(run: &Reconcile) -> (i32, Json) {
    let ran = run.run_args(&["apply", "--format", "json"]);
    let json = ran.json();
    (ran.code, json["units"][0].clone())
}

/// The `--model-path` of the unit on `host`.
fn model_path_on(host: &str, unit: &str) -> String {
    let shown = lab().sh(host, &format!("systemctl show -p ExecStart --value {unit}"));
    let at = shown
        .find("--model-path ")
        .expect("--model-path in ExecStart")
        + 13;
    shown[at..].split_whitespace().next().unwrap().to_string()
}

#[test]
#[ignore = "needs the test hosts: tests/run.sh"]
fn a_pinned_revision_is_locked_fetched_and_verified_before_the_stop_and_then_fetched_no_more() {
    let host = PINNED.hosts[0];
    let repo = fresh_repo(host, "pinned-fetch");
    let shard = safetensors(256 * 1024, 7);
    repo.file("config.json", CONFIG)
        .file("tokenizer.json", TOKENIZER)
        .lfs("model.safetensors", &shard);
    let revision = repo.commit("first");
    let files: [(&str, &[u8]); 3] = [
        ("config.json", CONFIG),
        ("model.safetensors", &shard),
        ("tokenizer.json", TOKENIZER),
    ];
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    let m = service("t-pinned-fetch", &[host], 39201, pin(&repo, &revision, &[]));
    let unit = "t-pinned-fetch.service";
    let run = Reconcile::new().manifest("a.yaml", &m);

    // Without the revision's files in the lock, nothing reaches a host.
    let unlocked = run.run_args(&["plan"]);
    assert_eq!(unlocked.code, 1, "{unlocked:?}");
    assert!(
        unlocked
            .stderr
            .contains("sglang.model.revision: hub:labs/pinned-fetch at revision")
            && unlocked
                .stderr
                .contains("`reconcile lock manifests` records its files' hashes"),
        "{unlocked:?}"
    );

    // The lock lists every file, with the hub's sha256 for the LFS file and its own for the rest.
    let said = lock(&run);
    assert_has(
        &said,
        &format!("hub:labs/pinned-fetch@{}: 3 files", &revision[..12]),
    );
    let text = std::fs::read_to_string(run.dir().join("manifests/reconcile.lock")).unwrap();
    let locked: Value = serde_yaml::from_str(&text).unwrap();
    let listed: Vec<(String, u64, String)> = locked["models"][0]["files"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["size"].as_u64().unwrap(),
                f["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, String)> = files
        .iter()
        .map(|(p, b)| (p.to_string(), b.len() as u64, sha256(b)))
        .collect();
    assert_eq!(listed, expected, "{text}");

    // The plan says what it fetches and from where, while the host has nothing yet.
    let plan = run.run_args(&["plan"]);
    assert_eq!(plan.code, 2, "{plan:?}");
    assert!(
        plan.stdout.contains("weights: fetch 3 files, ")
            && plan.stdout.contains(&format!(
                "from {} (labs/pinned-fetch@{}) into {}",
                hub().endpoint,
                &revision[..12],
                pinned_dir(&repo, &revision)
            )),
        "{}",
        plan.stdout
    );

    // Apply fetches, checks every file, and starts the server from the pinned copy.
    let (code, report) = apply(&run);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["outcome"], "converged", "{report:#}");
    assert_eq!(report["fetch"]["fetched"], total as u64, "{report:#}");
    let dir = pinned_dir(&repo, &revision);
    assert_eq!(model_path_on(host, unit), dir);
    for (path, bytes) in files {
        let on_host = lab().sh(host, &format!("sha256sum {dir}/{path} | cut -c1-64"));
        assert_eq!(on_host.trim(), sha256(bytes), "{path}");
    }
    let modes = lab().sh(
        host,
        &format!("stat -c '%a %U' {dir} {dir}/model.safetensors"),
    );
    assert_eq!(
        modes, "755 root\n644 root\n",
        "the server's user reads it; only root writes"
    );
    lab().sh(
        host,
        &format!("runuser -u nobody -- cat {dir}/model.safetensors > /dev/null"),
    );

    // Present and verified: the next plan changes nothing, and the next apply fetches nothing.
    let again = run.run_args(&["plan"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(
        again
            .stdout
            .contains(&format!("weights: {dir}: present, verified")),
        "{}",
        again.stdout
    );
    let (code, report) = apply(&run);
    assert_eq!(code, 0, "{report:#}");
    assert!(report.get("fetch").is_none(), "{report:#}");

    // A file of the copy changed on the host: `status` says so at once (sizes), and a change
    // that keeps the size shows in the full check (`--verify-weights`).
    lab().sh(host, &format!("printf x >> {dir}/config.json"));
    let status = run.run_args(&["status"]);
    assert_eq!(status.code, 2, "{status:?}");
    assert!(
        status.stdout.contains("weights_drift")
            && status.stdout.contains(&format!(
                "config.json: size {} of {}",
                CONFIG.len() + 1,
                CONFIG.len()
            )),
        "{}",
        status.stdout
    );
    lab().sh(host, &format!("truncate -s {} {dir}/config.json && printf Z | dd of={dir}/model.safetensors bs=1 seek=100 conv=notrunc status=none", CONFIG.len()));
    let sizes = run.run_args(&["status"]);
    assert_eq!(sizes.code, 0, "the sizes are the lock's again: {sizes:?}");
    let hashed = run.run_args(&["status", "--verify-weights"]);
    assert_eq!(hashed.code, 2, "{hashed:?}");
    assert!(
        hashed.stdout.contains("weights_drift")
            && hashed.stdout.contains("model.safetensors: sha256"),
        "{}",
        hashed.stdout
    );

    // huggingface_hub's own client reads the same revision from the lab's hub, byte for byte:
    // the hub is one as far as the hub's client can tell.
    let venv = hub().venv();
    let fetched = std::process::Command::new("ip")
        .args(["netns", "exec", host])
        .arg(venv.join("bin/python"))
        .args([
            "-c",
            "import hashlib, os, sys, tempfile\n\
             from huggingface_hub import snapshot_download\n\
             d = snapshot_download(sys.argv[1], revision=sys.argv[2], endpoint=sys.argv[3], local_dir=tempfile.mkdtemp())\n\
             for n in sorted(os.listdir(d)):\n\
             \x20   p = os.path.join(d, n)\n\
             \x20   if os.path.isfile(p): print(n, hashlib.sha256(open(p, 'rb').read()).hexdigest())",
            &repo.id,
            &revision,
            &hub().endpoint,
        ])
        .env("HF_HOME", std::env::temp_dir().join("reconcile-hub-client"))
        .env("NO_PROXY", "*")
        .output()
        .expect("the hub's client runs");
    assert!(fetched.status.success(), "{fetched:?}");
    let client: Vec<String> = String::from_utf8_lossy(&fetched.stdout)
        .lines()
        .filter(|l| !l.starts_with('.'))
        .map(str::to_string)
        .collect();
    let ours: Vec<String> = files
        .iter()
        .map(|(p, b)| format!("{p} {}", sha256(b)))
        .collect();
    assert_eq!(client, ours);
    lab().remove_unit(host, unit);
}

#[test]
#[ignore = "needs the test hosts: tests/run.sh"]
fn a_fetch_killed_with_its_apply_leaves_the_old_server_serving_and_the_next_apply_resumes_it() {
    let host = PINNED.hosts[1];
    let unit = "t-pinned-resume.service";
    let repo = fresh_repo(host, "pinned-resume");
    let first = first_revision(&repo);
    let run = Reconcile::new().manifest(
        "a.yaml",
        service("t-pinned-resume", &[host], 39202, pin(&repo, &first, &[])),
    );
    lock(&run);
    let (code, report) = apply(&run);
    assert_eq!(code, 0, "{report:#}");
    let serving = lab().invocation(host, unit);

    // Four shards of 3 MiB at 2 MB/s: six seconds of fetch to cut.
    let shards: Vec<Vec<u8>> = (0..4u8).map(|i| safetensors(768 * 1024, 10 + i)).collect();
    for (i, shard) in shards.iter().enumerate() {
        repo.lfs(&format!("model-0000{}-of-00004.safetensors", i + 1), shard);
    }
    std::fs::remove_file(repo.dir().join("model.safetensors")).unwrap();
    let second = repo.commit("four shards");
    let run = run.manifest(
        "a.yaml",
        service(
            "t-pinned-resume",
            &[host],
            39202,
            pin(&repo, &second, &[("rate", "2MB".into())]),
        ),
    );
    lock(&run);
    let partial = format!("{ROOT}/labs--pinned-resume/.{second}.partial");
    let run = run.args(&["apply"]);
    let mut applying = run.spawn(&[]);
    lab().wait_until(
        host,
        &format!("test -f {partial}/model-00001-of-00004.safetensors"),
        std::time::Duration::from_secs(60),
    );
    applying.kill().unwrap();
    applying.wait().unwrap();

    // The old server serves on, untouched; the fetch stops, keeping what it finished.
    assert_eq!(lab().invocation(host, unit), serving);
    assert_eq!(model_path_on(host, unit), pinned_dir(&repo, &first));
    // The fetch's own command line (`weights.py fetch ROOT KEY REVISION`); the bracket keeps
    // this shell's from matching.
    lab().wait_until(
        host,
        &format!("! pgrep -f 'fetch {ROOT} labs--pinned-resum[e]' >/dev/null"),
        std::time::Duration::from_secs(30),
    );
    let left = lab().sh(
        host,
        &format!("test ! -e {}; ls {partial}", pinned_dir(&repo, &second)),
    );
    assert_has(&left, "model-00001-of-00004.safetensors");

    // The next apply fetches only what is missing, and converges on the new revision.
    let (code, report) = apply(&run);
    assert_eq!(code, 0, "{report:#}");
    let total: u64 = shards.iter().map(|s| s.len() as u64).sum::<u64>()
        + (CONFIG.len() + TOKENIZER.len()) as u64;
    let (fetched, resumed) = (
        report["fetch"]["fetched"].as_u64().unwrap(),
        report["fetch"]["resumed"].as_u64().unwrap(),
    );
    assert!(resumed >= shards[0].len() as u64, "{report:#}");
    assert_eq!(fetched + resumed, total, "{report:#}");
    assert_eq!(model_path_on(host, unit), pinned_dir(&repo, &second));
    lab().remove_unit(host, unit);
}

#[test]
#[ignore = "needs the test hosts: tests/run.sh"]
fn a_file_whose_bytes_are_not_the_locks_is_refused_before_anything_stops() {
    let host = PINNED.hosts[2];
    let unit = "t-pinned-corrupt.service";
    let repo = fresh_repo(host, "pinned-corrupt");
    let first = first_revision(&repo);
    let run = Reconcile::new().manifest(
        "a.yaml",
        service("t-pinned-corrupt", &[host], 39203, pin(&repo, &first, &[])),
    );
    lock(&run);
    assert_eq!(apply(&run).0, 0);
    let serving = lab().invocation(host, unit);

    let good = safetensors(4096, 2);
    repo.lfs("model.safetensors", &good);
    let second = repo.commit("new weights");
    let run = run.manifest(
        "a.yaml",
        service("t-pinned-corrupt", &[host], 39203, pin(&repo, &second, &[])),
    );
    lock(&run);
    // The mirror's copy goes bad after the lock was written: same size, other bytes.
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 0xff;
    repo.corrupt(&good, &bad);

    let (code, report) = apply(&run);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["error"], "fetch_failed", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    assert_has(
        detail,
        &format!(
            "model.safetensors: sha256 {} where reconcile.lock says {}: refused, nothing stopped",
            &sha256(&bad)[..12],
            &sha256(&good)[..12]
        ),
    );
    assert_eq!(lab().invocation(host, unit), serving);
    assert_eq!(model_path_on(host, unit), pinned_dir(&repo, &first));
    let parts = lab().sh(
        host,
        &format!(
            "test ! -e {}; find {ROOT}/labs--pinned-corrupt -name '*.part' | wc -l",
            pinned_dir(&repo, &second)
        ),
    );
    assert_eq!(parts.trim(), "0", "a bad file is not kept to resume from");
    lab().remove_unit(host, unit);
}

#[test]
#[ignore = "needs the test hosts: tests/run.sh"]
fn a_revision_that_fails_is_rolled_back_to_the_kept_one_and_keep_lets_the_failed_one_go() {
    let host = PINNED.hosts[2];
    let unit = "t-pinned-keep.service";
    let repo = fresh_repo(host, "pinned-keep");
    let first = first_revision(&repo);
    let pinned =
        |revision: &str| service("t-pinned-keep", &[host], 39204, pin(&repo, revision, &[]));
    let run = Reconcile::new().manifest("a.yaml", pinned(&first));
    lock(&run);
    assert_eq!(apply(&run).0, 0);

    // Weights too large for the GPUs: the server fails at load (the stand-in's model knobs).
    repo.file(
        "fake-sglang.json",
        br#"{"FAKE_SGLANG_FAIL": "crash", "FAKE_SGLANG_FAIL_AT": "0.5"}"#,
    );
    let failing = repo.commit("weights that do not load");
    let run = run.manifest("a.yaml", pinned(&failing));
    lock(&run);
    let (code, report) = apply(&run);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_eq!(model_path_on(host, unit), pinned_dir(&repo, &first));
    let active = lab().sh(host, &format!("systemctl is-active {unit}"));
    assert_eq!(active.trim(), "active");

    // A good revision: the first stays to roll back to (keep: 2), the failed one goes.
    std::fs::remove_file(repo.dir().join("fake-sglang.json")).unwrap();
    repo.file(
        "config.json",
        br#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "v": 3}"#,
    );
    let third = repo.commit("good again");
    let run = run.manifest("a.yaml", pinned(&third));
    lock(&run);
    let plan = run.run_args(&["plan"]);
    assert_has(
        &plan.stdout,
        &format!(
            "once confirmed, removes 1 older revision ({})",
            &failing[..12]
        ),
    );
    let (code, report) = apply(&run);
    assert_eq!(code, 0, "{report:#}");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "weights: removed 1 older revision (keep: 2): {failing}"
        )),
        "{report:#}"
    );
    let held = lab().sh(host, &format!("ls {ROOT}/labs--pinned-keep"));
    let held: Vec<&str> = held.lines().collect();
    let mut expected = vec![first.as_str(), third.as_str()];
    expected.sort();
    assert_eq!(held, expected);
    lab().remove_unit(host, unit);
}

#[test]
#[ignore = "needs the test hosts: tests/run.sh"]
fn peers_serve_each_other_so_the_hub_serves_a_revision_once_for_three_hosts() {
    let hosts = PINNED.hosts;
    let unit = "t-pinned-peers.service";
    for host in hosts {
        lab().sh(host, &format!("rm -rf {ROOT}/labs--pinned-peers"));
    }
    let repo = hub().repo("pinned-peers");
    let shard = safetensors(512 * 1024, 5);
    repo.file("config.json", CONFIG)
        .file("tokenizer.json", TOKENIZER)
        .lfs("model.safetensors", &shard);
    let revision = repo.commit("first");
    let model = pin(
        &repo,
        &revision,
        &[("peers", map([("port", Value::from(39209))]))],
    );
    let m = service("t-pinned-peers", hosts, 39205, model);
    let run = Reconcile::new().manifest("a.yaml", m);
    lock(&run);
    let ran = run.run_args(&["apply", "--format", "json"]);
    assert_eq!(ran.code, 0, "{ran:?}");
    let json = ran.json();
    let units = json["units"].as_array().unwrap();
    assert_eq!(units.len(), 3, "{json:#}");
    let mut from_peers = 0;
    for report in units {
        assert_eq!(report["outcome"], "converged", "{report:#}");
        assert_eq!(
            report["fetch"]["fetched"].as_u64().unwrap() as usize,
            shard.len() + CONFIG.len() + TOKENIZER.len(),
            "{report:#}"
        );
        if report["notes"]
            .to_string()
            .contains("a peer that held the revision")
        {
            from_peers += 1;
        }
    }
    assert_eq!(
        from_peers, 2,
        "one host from the hub, two from peers: {json:#}"
    );
    assert_eq!(hub().served(&repo, &revision, "model.safetensors"), 1);
    for host in hosts {
        let dir = pinned_dir(&repo, &revision);
        let on_host = lab().sh(
            host,
            &format!("sha256sum {dir}/model.safetensors | cut -c1-64"),
        );
        assert_eq!(on_host.trim(), sha256(&shard), "{host}");
        // Nothing serves the copy once the fetch is over.
        let serving = lab().sh(
            host,
            "systemctl list-units --no-legend 'reconcile-seed-*' | wc -l",
        );
        assert_eq!(serving.trim(), "0", "{host}");
        lab().remove_unit(host, unit);
    }
}
