//! The lab's hub: olah, a self-hosted Hugging Face hub mirror, serving local git repositories
//! offline on rl42's address (`tests/hostlab/hub/serve.sh`), and the repositories the tests make
//! for it. A repository is a git work tree under `mirrors/models/ORG/NAME`, as olah reads one
//! (`olah/server_mirror.py` `_mirror_git_paths`); a large file is committed the git-LFS way, a
//! pointer file in the tree and the object under `.git/lfs/objects` (olah `mirror/repos.py`
//! `LocalMirrorRepo._get_path_info`), so that the hub's tree listing gives its sha256 as the
//! real hub does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::lab::{lab, stdout_of, HUB_LEASE};

/// Where the hub's repositories and its own files live on this machine.
const ROOT: &str = "/var/lib/reconcile-lab/hub";

pub struct Hub {
    root: PathBuf,
    /// `http://ADDRESS:PORT`, as a manifest's `endpoint:` names it.
    pub endpoint: String,
}

/// The lab's hub, started once for the test process (a hub already answering is reused; down.sh
/// stops it with the namespace's other processes).
pub fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    HUB.get_or_init(|| {
        let host = HUB_LEASE.host();
        let address = lab().address(host);
        let port = HUB_LEASE.ports.start;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hostlab/hub/serve.sh");
        stdout_of(
            Command::new("bash").args([script, host, &address, &port.to_string(), ROOT]),
            "serve.sh: the lab's hub did not start",
        );
        Hub {
            root: PathBuf::from(ROOT),
            endpoint: format!("http://{address}:{port}"),
        }
    })
}

impl Hub {
    /// A new repository `labs/NAME` (one left by an earlier run is removed first).
    pub fn repo(&self, name: &str) -> Repo {
        let dir = self.root.join("mirrors/models/labs").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let repo = Repo {
            dir,
            id: format!("labs/{name}"),
        };
        repo.git(&["init", "-q", "-b", "main"]);
        repo.git(&["config", "user.email", "lab@reconcile.test"]);
        repo.git(&["config", "user.name", "lab"]);
        repo
    }

    /// How many times the hub served `path` of `repo` at `revision` (its access log).
    pub fn served(&self, repo: &Repo, revision: &str, path: &str) -> usize {
        let log = std::fs::read_to_string(self.root.join("olah.log")).unwrap_or_default();
        let line = format!(
            "\"GET /{}/resolve/{revision}/{path} HTTP/1.1\" 200",
            repo.id
        );
        log.lines().filter(|l| l.contains(&line)).count()
    }

    /// The hub's own venv, whose `huggingface_hub` is the hub's client.
    pub fn venv(&self) -> PathBuf {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hostlab/hub/install.sh");
        PathBuf::from(stdout_of(Command::new("bash").arg(script), "install.sh").trim())
    }
}

/// A repository of the hub.
pub struct Repo {
    dir: PathBuf,
    /// `labs/NAME`.
    pub id: String,
}

impl Repo {
    fn git(&self, args: &[&str]) -> String {
        stdout_of(
            Command::new("git").args(args).current_dir(&self.dir),
            &format!("git {args:?}"),
        )
    }

    fn write(&self, path: &str, bytes: &[u8]) {
        let file = self.dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }

    /// A file kept in git itself (a config, a tokenizer).
    pub fn file(&self, path: &str, bytes: &[u8]) -> &Repo {
        self.write(path, bytes);
        self
    }

    /// A file kept the git-LFS way: a pointer in the tree, the object beside.
    pub fn lfs(&self, path: &str, bytes: &[u8]) -> &Repo {
        let oid = sha256(bytes);
        let object = self.object(&oid);
        std::fs::create_dir_all(object.parent().unwrap()).unwrap();
        std::fs::write(&object, bytes).unwrap();
        let pointer = format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n",
            bytes.len()
        );
        self.write(path, pointer.as_bytes());
        self
    }

    fn object(&self, oid: &str) -> PathBuf {
        self.dir
            .join(".git/lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4])
            .join(oid)
    }

    /// Commits every file; returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.git(&["rev-parse", "HEAD"]).trim().to_string()
    }

    /// Replaces the bytes the hub serves for an LFS file (its pointer, and so the sha256 the
    /// tree lists, stay): a mirror whose copy went bad.
    pub fn corrupt(&self, bytes: &[u8], with: &[u8]) {
        assert_eq!(bytes.len(), with.len(), "the same size, other bytes");
        std::fs::write(self.object(&sha256(bytes)), with).unwrap();
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// A safetensors file of one F32 tensor of `values` values, each byte `fill`: 8 bytes of header
/// length, the JSON header, the data (what preflight's weights check and the stand-in read).
pub fn safetensors(values: usize, fill: u8) -> Vec<u8> {
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{values}],"data_offsets":[0,{}]}}}}"#,
        values * 4
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(fill, values * 4));
    bytes
}
