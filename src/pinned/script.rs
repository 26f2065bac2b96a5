//! The fixed script that keeps pinned weights on a host (`weights.py`): what a host holds of a
//! revision (`look`), fetching it (`fetch`), checking it (`verify`), marking it used (`used`),
//! removing old ones (`remove`), and hashing a store folder (`hash`). It runs as root with the
//! host's interpreter, `python -I -S -c WEIGHTS_SCRIPT MODE ROOT KEY REVISION`, the request as
//! a JSON object on stdin (a token, too: never on argv), its answer one JSON object on stdout.
//!
//! Exit codes: 0 answered; 1 internal (`{"error":"internal","why"}`); 2 a refused argument or
//! path (`{"error":"usage"|"path"|"absent"}`); 3 a fetched file's size or sha256 is wrong (the
//! `.part` deleted); 4 the source refused (`"http"` with `status`, or `"missing"`); 5 the
//! network failed (the `.part` kept, the next fetch resumes it); 6 another fetch of the same
//! revision holds it (`"busy"`); 7 nobody reads the answer any more (stdout's reader closed,
//! as when the SSH session ends): the fetch stopped between chunks, its `.part` kept.

pub(crate) const WEIGHTS_SCRIPT: &str = include_str!("weights.py");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use sha2::{Digest, Sha256};
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// Runs the script with the local interpreter as a host would: `-I -S`, the request on
    /// stdin. No proxy from this machine's environment stands between it and the test server.
    fn run(args: [&str; 4], request: &Value, env: &[(&str, &str)]) -> (i32, Value) {
        let mut child = Command::new("python3")
            .args(["-I", "-S", "-c", WEIGHTS_SCRIPT])
            .args(args)
            .env("no_proxy", "*")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs (the tests need it, as the hosts do)");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(request.to_string().as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let answer = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("{e}: {stdout:?} {:?}", String::from_utf8_lossy(&out.stderr))
        });
        (out.status.code().unwrap(), answer)
    }

    fn sha256(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    /// Deterministic bytes that are not all alike, so a resumed hash has something to catch.
    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    /// A store under `dir` holding one `model.bin` of `n` bytes (`bytes(n, seed)`): its folder
    /// and the file's content.
    fn model_store(dir: &Path, n: usize, seed: u32) -> (PathBuf, Vec<u8>) {
        let source = dir.join("store");
        let content = bytes(n, seed);
        store(&source, &[("model.bin", &content)]);
        (source, content)
    }

    fn store(dir: &Path, files: &[(&str, &[u8])]) {
        for (path, content) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
    }

    fn wanted(files: &[(&str, &[u8])]) -> Value {
        let files: Vec<Value> = files
            .iter()
            .map(|(p, c)| json!({"path": p, "size": c.len(), "sha256": sha256(c)}))
            .collect();
        Value::Array(files)
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// Every file below `dir`, hidden ones included.
    fn all_files(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(all_files(&path));
            } else {
                found.push(path);
            }
        }
        found
    }

    /// A loopback HTTP/1.1 server of `files` (keyed by URL path without the leading `/`) that
    /// honours `Range: bytes=N-` (but under `/norange/X`), redirects `/redirect/X` to `/X`,
    /// cuts its first body of the path `cut` names after that many bytes, and records each
    /// request's head.
    struct Server {
        base: String,
        heads: Arc<Mutex<Vec<String>>>,
    }

    /// The end of an answer without a body.
    const EMPTY: &str = "Content-Length: 0\r\nConnection: close\r\n\r\n";

    fn serve(files: HashMap<String, Vec<u8>>, cut: Option<(&str, usize)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let mut cut = cut.map(|(path, n)| (path.to_string(), n));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                seen.lock().unwrap().push(head.clone());
                let mut path = head.split(' ').nth(1).unwrap_or("/")[1..].to_string();
                let ranges = match path.strip_prefix("norange/") {
                    Some(rest) => {
                        path = rest.to_string();
                        false
                    }
                    None => true,
                };
                let from = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("range: bytes=")
                            .map(str::to_owned)
                    })
                    .map(|r| r.trim_end_matches('-').parse::<usize>().unwrap())
                    .filter(|_| ranges);
                if let Some(to) = path.strip_prefix("redirect/") {
                    let reply = format!("HTTP/1.1 302 Found\r\nLocation: /{to}\r\n{EMPTY}");
                    stream.write_all(reply.as_bytes()).unwrap();
                    continue;
                }
                let Some(file) = files.get(&path) else {
                    let reply = format!("HTTP/1.1 404 Not Found\r\n{EMPTY}");
                    stream.write_all(reply.as_bytes()).unwrap();
                    continue;
                };
                let start = from.unwrap_or(0);
                let status = match from {
                    Some(n) => format!(
                        "206 Partial Content\r\nContent-Range: bytes {n}-{}/{}",
                        file.len() - 1,
                        file.len()
                    ),
                    None => "200 OK".to_string(),
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    file.len() - start
                );
                stream.write_all(reply.as_bytes()).unwrap();
                let mut body = &file[start..];
                if let Some((_, n)) = cut.take_if(|(p, _)| *p == path) {
                    body = &body[..n];
                }
                // The client may hang up early (a refused digest); that is its business.
                let _ = stream.write_all(body);
                let _ = stream.shutdown(std::net::Shutdown::Write);
                // Read to the client's close, so the close is a FIN and never a reset.
                let _ = reader.read_to_end(&mut Vec::new());
            }
        });
        Server { base, heads }
    }

    #[test]
    fn hash_lists_a_stores_files_skipping_hidden_ones_and_symlinked_folders() {
        let dir = tempfile::tempdir().unwrap();
        let a = b"{\"a\": 1}".as_slice();
        let b = bytes(5000, 1);
        store(
            dir.path(),
            &[("config.json", a), ("sub/model.safetensors", &b)],
        );
        store(
            dir.path(),
            &[(".cache/huggingface/x", b"x"), (".hidden", b"y")],
        );
        let elsewhere = tempfile::tempdir().unwrap();
        store(elsewhere.path(), &[("outside.bin", b"z")]);
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("linked")).unwrap();

        let (code, answer) = run(["hash", s(dir.path()), "-", "-"], &json!({}), &[]);
        assert_eq!(code, 0, "{answer}");
        let want = wanted(&[("config.json", a), ("sub/model.safetensors", &b)]);
        assert_eq!(answer, json!({ "files": want }));

        let (code, answer) = run(
            ["hash", s(&dir.path().join("nothing")), "-", "-"],
            &json!({}),
            &[],
        );
        assert_eq!((code, &answer["error"]), (4, &json!("missing")));
    }

    #[test]
    fn a_local_fetch_makes_a_readable_copy_that_look_finds_whole() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("shared/models/X");
        let big = bytes(3 << 20, 2);
        let files: &[(&str, &[u8])] = &[("config.json", b"{}"), ("sub/model.safetensors", &big)];
        store(&source, files);
        let root = dir.path().join("var/lib/weights");
        let args = ["fetch", s(&root), "org--name", "abc123"];
        let request = json!({"source": s(&source), "token": null, "rate": 0,
                             "files": wanted(files), "lock": "lock-digest"});
        let (code, answer) = run(args, &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert_eq!(answer["fetched"], json!(big.len() + 2));
        assert_eq!(answer["resumed"], json!(0));

        let copy = root.join("org--name/abc123");
        assert_eq!(
            std::fs::read(copy.join("sub/model.safetensors")).unwrap(),
            big
        );
        for path in [&root, &root.join("org--name"), &copy, &copy.join("sub")] {
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o755, "{}", path.display());
        }
        for path in all_files(&copy) {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "{}", path.display());
        }
        let left: Vec<_> = std::fs::read_dir(root.join("org--name")).unwrap().collect();
        assert_eq!(left.len(), 1, "no .partial or .progress left: {left:?}");

        // A second fetch finds it there.
        let (code, answer) = run(args, &request, &[]);
        assert_eq!((code, &answer["present"]), (0, &json!(true)));

        // An older revision, marked used, is listed with its bytes and that mark's time.
        store(&root.join("org--name/old"), &[("w.bin", &[0u8; 100])]);
        let (code, _) = run(["used", s(&root), "org--name", "old"], &json!({}), &[]);
        assert_eq!(code, 0);
        let mark = std::fs::metadata(root.join("org--name/old/.reconcile-used")).unwrap();
        let (code, answer) = run(
            ["look", s(&root), "org--name", "abc123"],
            &json!({"files": wanted(files)}),
            &[],
        );
        assert_eq!(code, 0, "{answer}");
        assert_eq!(answer["present"], json!(true));
        assert_eq!(answer["lock"], json!("lock-digest"));
        assert_eq!(answer["differ"], json!([]));
        assert_eq!(answer["partial"], json!(0));
        assert!(answer["free"].as_u64().unwrap() > 0);
        let revisions = answer["revisions"].as_array().unwrap();
        assert_eq!(revisions.len(), 1, "{answer}");
        assert_eq!(revisions[0]["revision"], json!("old"));
        assert_eq!(revisions[0]["bytes"], json!(100));
        let used = mark
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        assert!((revisions[0]["used"].as_f64().unwrap() - used.as_secs_f64()).abs() < 0.01);

        // A revision not there yet: no copy, and the free bytes of the nearest folder that is.
        let (code, answer) = run(["look", s(&root.join("new")), "k", "r"], &json!({}), &[]);
        assert_eq!(code, 0, "{answer}");
        assert_eq!(
            (&answer["present"], &answer["lock"]),
            (&json!(false), &Value::Null)
        );
    }

    #[test]
    fn a_cut_http_fetch_keeps_its_part_and_the_next_one_resumes_it_with_a_range() {
        let dir = tempfile::tempdir().unwrap();
        let big = bytes(3 << 20, 3);
        let cut = (1 << 20) + 12345;
        let model = "org/name/resolve/r1/model.safetensors";
        let served = HashMap::from([
            (
                "org/name/resolve/r1/config.json".to_string(),
                b"{}".to_vec(),
            ),
            (model.to_string(), big.clone()),
        ]);
        let server = serve(served, Some((model, cut)));
        let files: &[(&str, &[u8])] = &[("config.json", b"{}"), ("model.safetensors", &big)];
        let root = dir.path().join("weights");
        let request = json!({"source": format!("{}/org/name/resolve/r1", server.base),
                             "token": null, "rate": 0, "files": wanted(files), "lock": "l"});
        let args = ["fetch", s(&root), "k", "r1"];

        let (code, answer) = run(args, &request, &[]);
        assert_eq!(code, 5, "{answer}");
        assert_eq!(answer["error"], json!("connect"));
        assert_eq!(answer["path"], json!("model.safetensors"));
        let partial = root.join("k/.r1.partial");
        assert_eq!(std::fs::read(partial.join("config.json")).unwrap(), b"{}");
        let part = std::fs::metadata(partial.join("model.safetensors.part")).unwrap();
        assert_eq!(part.len(), cut as u64);
        let progress: Value =
            serde_json::from_slice(&std::fs::read(root.join("k/.r1.progress")).unwrap()).unwrap();
        assert_eq!(progress["total"], json!(big.len() + 2));
        let (_, look) = run(
            ["look", s(&root), "k", "r1"],
            &json!({"files": wanted(files)}),
            &[],
        );
        assert_eq!(look["partial"], json!(cut + 2));
        assert_eq!(look["present"], json!(false));

        let (code, answer) = run(args, &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert_eq!(answer["resumed"], json!(cut + 2));
        assert_eq!(answer["fetched"], json!(big.len() - cut));
        let heads = server.heads.lock().unwrap().clone();
        assert_eq!(
            heads.len(),
            3,
            "config, the cut model, its resumption: {heads:?}"
        );
        assert!(
            heads[2].contains(&format!("Range: bytes={cut}-")),
            "{heads:?}"
        );
        assert!(
            heads.iter().all(|h| h.contains("User-Agent: reconcile")),
            "{heads:?}"
        );
        assert_eq!(
            std::fs::read(root.join("k/r1/model.safetensors")).unwrap(),
            big
        );
        assert!(!partial.exists() && !root.join("k/.r1.progress").exists());
    }

    #[test]
    fn a_server_that_answers_a_range_with_the_whole_file_starts_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let content = bytes(50_000, 9);
        let server = serve(
            HashMap::from([("m/model.bin".to_string(), content.clone())]),
            None,
        );
        let root = dir.path().join("w");
        store(
            &root.join("k/.r.partial"),
            &[("model.bin.part", &[0u8; 1000])],
        );
        let request = json!({"source": format!("{}/norange/m", server.base),
                             "files": wanted(&[("model.bin", &content)]), "lock": "l"});
        let (code, answer) = run(["fetch", s(&root), "k", "r"], &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert_eq!(
            (&answer["resumed"], &answer["fetched"]),
            (&json!(0), &json!(content.len()))
        );
        assert!(server.heads.lock().unwrap()[0].contains("Range: bytes=1000-"));
        assert_eq!(std::fs::read(root.join("k/r/model.bin")).unwrap(), content);
    }

    #[test]
    fn a_second_fetch_is_busy_until_the_first_one_notices_nobody_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let (source, content) = model_store(dir.path(), 4 << 20, 10);
        let root = dir.path().join("w");
        let files = wanted(&[("model.bin", &content)]);
        let slow = json!({"source": s(&source), "rate": 1 << 20, "files": files, "lock": "l"});
        let mut first = Command::new("python3")
            .args([
                "-I",
                "-S",
                "-c",
                WEIGHTS_SCRIPT,
                "fetch",
                s(&root),
                "k",
                "r",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = first.stdin.take().unwrap();
        stdin.write_all(slow.to_string().as_bytes()).unwrap();
        drop(stdin);
        let progress = root.join("k/.r.progress");
        let started = Instant::now();
        while !progress.exists() {
            assert!(
                started.elapsed().as_secs() < 5,
                "the first fetch never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }

        let (code, answer) = run(["fetch", s(&root), "k", "r"], &slow, &[]);
        assert_eq!((code, answer), (6, json!({"error": "busy"})));

        // Its reader gone (as when the SSH session ends), the first one stops within moments.
        drop(first.stdout.take());
        let gone = Instant::now();
        let status = loop {
            if let Some(status) = first.try_wait().unwrap() {
                break status;
            }
            assert!(gone.elapsed().as_secs() < 3, "the abandoned fetch went on");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(7));

        let request = json!({"source": s(&source), "files": files, "lock": "l"});
        let (code, answer) = run(["fetch", s(&root), "k", "r"], &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert!(answer["resumed"].as_u64().unwrap() >= 1 << 20, "{answer}");
        assert_eq!(std::fs::read(root.join("k/r/model.bin")).unwrap(), content);
    }

    #[test]
    fn a_corrupt_file_is_refused_and_its_part_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("store");
        store(&source, &[("model.bin", b"the corrupt bytes")]);
        let root = dir.path().join("weights");
        let files = wanted(&[("model.bin", b"the intended byte")]);
        let request = json!({"source": s(&source), "files": files, "lock": "l"});
        let (code, answer) = run(["fetch", s(&root), "k", "r"], &request, &[]);
        assert_eq!(code, 3, "{answer}");
        assert_eq!(answer["error"], json!("digest"));
        assert_eq!(answer["path"], json!("model.bin"));
        assert_eq!(answer["expected"], json!(sha256(b"the intended byte")));
        assert_eq!(answer["got"], json!(sha256(b"the corrupt bytes")));
        assert!(!root.join("k/r").exists());
        assert_eq!(all_files(&root.join("k/.r.partial")), Vec::<PathBuf>::new());

        // A size that differs, too; and paths that would leave the revision's folder.
        let files = json!([{"path": "model.bin", "size": 3, "sha256": "00"}]);
        let (code, answer) = run(
            ["fetch", s(&root), "k", "r"],
            &json!({"source": s(&source), "files": files}),
            &[],
        );
        assert_eq!(
            (code, &answer["why"]),
            (3, &json!("size 4 of 3")),
            "{answer}"
        );
        for bad in ["../x", "/etc/passwd", "a//b", "a/./b", ""] {
            let files = json!([{"path": bad, "size": 1, "sha256": "00"}]);
            let (code, answer) = run(
                ["fetch", s(&root), "k", "r"],
                &json!({"source": s(&source), "files": files}),
                &[],
            );
            assert_eq!((code, answer), (2, json!({"error": "path", "path": bad})));
        }
        let (code, _) = run(["fetch", s(&root), "k", ".r.partial"], &json!({}), &[]);
        assert_eq!(code, 2);
        let (code, answer) = run(
            ["fetch", s(&root), "k", "r"],
            &json!({"source": s(&source), "files": wanted(&[("gone", b"x")])}),
            &[],
        );
        assert_eq!(
            (code, answer),
            (4, json!({"error": "missing", "path": "gone"}))
        );
    }

    #[test]
    fn remove_keeps_a_revision_a_unit_names_and_refuses_what_is_not_a_revision() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("weights");
        for rev in ["r1", "r10", "r2"] {
            store(&root.join("k").join(rev), &[("w.bin", b"w")]);
        }
        store(&root.join("k/.r1.partial"), &[("x.part", b"x")]);
        store(&root.join("k"), &[(".r1.progress", b"{}")]);
        let etc = dir.path().join("etc");
        let run_dir = dir.path().join("run");
        store(
            &etc,
            &[("sglang-a.service", b"[Service]\nExecStart=/bin/true\n")],
        );
        let drop_in = format!(
            "[Service]\nEnvironment=MODEL={}\n",
            root.join("k/r10").display()
        );
        store(
            &run_dir,
            &[("sglang-a.service.d/10-model.conf", drop_in.as_bytes())],
        );
        let dirs = format!(
            "{}:{}:{}",
            etc.display(),
            run_dir.display(),
            dir.path().join("none").display()
        );

        let request = json!({"revisions": ["r1", "r10", "../etc", ".r1.partial", "absent"]});
        let (code, answer) = run(
            ["remove", s(&root), "k", "-"],
            &request,
            &[("RECONCILE_UNIT_DIRS", &dirs)],
        );
        assert_eq!(code, 0, "{answer}");
        assert_eq!(answer["removed"], json!(["r1", "absent"]));
        let kept = answer["kept"].as_array().unwrap();
        assert_eq!(kept.len(), 3, "{answer}");
        assert_eq!(kept[0]["revision"], json!("r10"));
        assert!(
            kept[0]["why"].as_str().unwrap().contains("10-model.conf"),
            "{answer}"
        );
        assert_eq!(
            kept[1],
            json!({"revision": "../etc", "why": "not a revision name"})
        );
        assert_eq!(
            kept[2],
            json!({"revision": ".r1.partial", "why": "not a revision name"})
        );
        let mut left: Vec<_> = std::fs::read_dir(root.join("k"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["r10", "r2"]);
        assert!(etc.exists());
    }

    #[test]
    fn the_rate_limits_a_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let (source, content) = model_store(dir.path(), 2 << 20, 4);
        let request = json!({"source": s(&source), "rate": 1 << 20,
                             "files": wanted(&[("model.bin", &content)]), "lock": "l"});
        let started = Instant::now();
        let (code, answer) = run(["fetch", s(&dir.path().join("w")), "k", "r"], &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert!(
            started.elapsed().as_secs_f64() >= 1.5,
            "{:?}",
            started.elapsed()
        );
        assert!(answer["seconds"].as_f64().unwrap() >= 1.5, "{answer}");
    }

    #[test]
    fn the_token_reaches_the_server_alone_and_is_written_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let token = "hf_s3cretTOKENvalue";
        let content = bytes(70_000, 5);
        let server = serve(
            HashMap::from([("base/model.bin".to_string(), content.clone())]),
            None,
        );
        let root = dir.path().join("w");
        // Through a redirect, as the hub's to its CDN: the token goes to the first server only.
        let request = json!({"source": format!("{}/redirect/base", server.base), "token": token,
                             "files": wanted(&[("model.bin", &content)]), "lock": "l"});
        let (code, answer) = run(["fetch", s(&root), "k", "r"], &request, &[]);
        assert_eq!(code, 0, "{answer}");
        assert!(!answer.to_string().contains(token));
        let heads = server.heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(
            heads[0].starts_with("GET /redirect/base/model.bin "),
            "{heads:?}"
        );
        assert!(
            heads[0].contains(&format!("Authorization: Bearer {token}\r\n")),
            "{heads:?}"
        );
        assert!(heads[1].starts_with("GET /base/model.bin "), "{heads:?}");
        assert!(!heads[1].contains(token), "{heads:?}");
        for path in all_files(&root) {
            let text = std::fs::read(&path).unwrap();
            assert!(
                !text.windows(token.len()).any(|w| w == token.as_bytes()),
                "{}",
                path.display()
            );
        }

        // A refusal is an http error with its status, and the token is not in it either.
        let request = json!({"source": format!("{}/nothing", server.base), "token": token,
                             "files": wanted(&[("model.bin", &content)]), "lock": "l"});
        let (code, answer) = run(["fetch", s(&root), "k", "r2"], &request, &[]);
        assert_eq!(
            (code, answer),
            (
                4,
                json!({"error": "http", "status": 404, "path": "model.bin"})
            )
        );
    }

    #[test]
    fn verify_finds_a_flipped_byte_a_missing_file_and_a_short_one() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("store");
        let (a, b, c) = (bytes(10_000, 6), bytes(20, 7), bytes(30, 8));
        let files: &[(&str, &[u8])] = &[("a.bin", &a), ("b.bin", &b), ("sub/c.bin", &c)];
        store(&source, files);
        let root = dir.path().join("w");
        let request = json!({"source": s(&source), "files": wanted(files), "lock": "l"});
        assert_eq!(run(["fetch", s(&root), "k", "r"], &request, &[]).0, 0);
        let request = json!({"files": wanted(files)});
        let (code, answer) = run(["verify", s(&root), "k", "r"], &request, &[]);
        assert_eq!((code, answer), (0, json!({"differ": []})));

        let copy = root.join("k/r");
        let mut flipped = a.clone();
        flipped[5000] ^= 1;
        std::fs::write(copy.join("a.bin"), &flipped).unwrap();
        std::fs::remove_file(copy.join("b.bin")).unwrap();
        std::fs::write(copy.join("sub/c.bin"), &c[..29]).unwrap();
        let (code, answer) = run(["verify", s(&root), "k", "r"], &request, &[]);
        assert_eq!(code, 0, "{answer}");
        let why = format!("sha256 {}, want {}", sha256(&flipped), sha256(&a));
        assert_eq!(
            answer,
            json!({"differ": [{"path": "a.bin", "why": why}, {"path": "b.bin", "why": "missing"},
                              {"path": "sub/c.bin", "why": "size 29 of 30"}]})
        );
        // look, which reads no contents, sees the two it can by their sizes.
        let (_, look) = run(["look", s(&root), "k", "r"], &request, &[]);
        let want = json!([{"path": "b.bin", "why": "missing"},
                          {"path": "sub/c.bin", "why": "size 29 of 30"}]);
        assert_eq!(look["differ"], want);
    }
}
