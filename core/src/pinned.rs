//! Pinned weights (`sglang.model:`): a model revision named by where it comes from, the files
//! the lock file (`reconcile.lock`) records for it, and what a host holds of it, judged into
//! what apply must do there before the old server stops.
//!
//! A hub repository is pinned at a commit (the hub's own LFS sha256 for its large files; the
//! lock's for the rest); a store (a folder every host reaches, the seed's `/shared/models`) is
//! pinned by a revision name the lock gives its files' hashes to. The copy a unit runs is
//! `<root>/<key>/<revision>`: made whole by one rename once every file's hash matched, so a
//! folder of that name is always a complete, verified copy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Where pinned copies live on a host when the manifest does not say: outside reconcile's state
/// folder, which is root's alone (0700), since the server's user must reach its copy.
pub const DEFAULT_ROOT: &str = "/var/lib/reconcile-weights";
/// Revisions a host keeps of a model: the one it runs and the one before, to roll back to.
pub const DEFAULT_KEEP: u32 = 2;
/// Hosts that fetch at once when the manifest does not say.
pub const DEFAULT_AT_ONCE: usize = 4;
/// The lock file's name, beside the manifests.
pub const LOCK_FILE: &str = "reconcile.lock";
/// The Hugging Face hub, for a `hub:` model without an `endpoint:`.
pub const HUB: &str = "https://huggingface.co";

/// Where a pinned model's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A hub repository (`org/name`) at `endpoint` (the hub, or a mirror or proxy that speaks
    /// its API, as `HF_ENDPOINT` names one).
    Hub { repo: String, endpoint: String },
    /// A folder every host reaches under the same path (a network share).
    Store { path: String },
}

/// `sglang.model:`: a model pinned by revision.
#[derive(Debug, Clone, PartialEq)]
pub struct PinnedModel {
    pub source: Source,
    pub revision: String,
    /// Revisions kept on a host, the running one counted; older ones are removed once a new
    /// one is confirmed.
    pub keep: u32,
    /// Glob patterns of the files to fetch (all of the revision's when empty), as
    /// `huggingface_hub`'s `allow_patterns`.
    pub include: Vec<String>,
    pub root: String,
    /// Hosts fetching at once.
    pub at_once: usize,
    /// Bytes a second each host may fetch; `None`: as fast as the link goes.
    pub rate: Option<u64>,
    /// Hosts that hold the revision serve it to their peers while the rollout fetches
    /// (`peers:`), so the source serves it once; `None`: every host fetches from the source.
    pub peers: Option<Peers>,
    /// The revision's files as the lock file records them: set when the manifests are loaded
    /// (`None` only for `reconcile lock`, which writes them).
    pub locked: Option<LockedRevision>,
}

/// `peers:`: how hosts serve a revision they hold to the others during a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peers {
    /// The port a holding host serves its copy on (plain HTTP, read-only, for the fetch's
    /// duration): weights are not secret, and every file is checked against the lock anyway.
    pub port: u16,
}

impl PinnedModel {
    /// The model's folder name under the root: `org--name` for a hub repository (as the hub's
    /// own cache names it), the store folder's name for a store.
    pub fn key(&self) -> String {
        match &self.source {
            Source::Hub { repo, .. } => repo.replace('/', "--"),
            Source::Store { path } => path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// The folder of the pinned copy: what the unit's `--model-path` names.
    pub fn pinned_dir(&self) -> String {
        self.dir_of(&self.revision)
    }

    /// The folder of another revision of the same model.
    pub fn dir_of(&self, revision: &str) -> String {
        format!(
            "{}/{}/{}",
            self.root.trim_end_matches('/'),
            self.key(),
            revision
        )
    }

    /// How the lock file names the source.
    pub fn lock_source(&self) -> String {
        match &self.source {
            Source::Hub { repo, .. } => format!("hub:{repo}"),
            Source::Store { path } => format!("store:{}", path.trim_end_matches('/')),
        }
    }

    /// Where a file is fetched from, less its path: the hub's `resolve` URL
    /// (`huggingface_hub` `file_download.py` `hf_hub_url`: `{endpoint}/{repo}/resolve/{revision}/{file}`),
    /// or the store folder.
    pub fn fetch_base(&self) -> String {
        match &self.source {
            Source::Hub { repo, endpoint } => format!(
                "{}/{repo}/resolve/{}",
                endpoint.trim_end_matches('/'),
                self.revision
            ),
            Source::Store { path } => path.trim_end_matches('/').to_string(),
        }
    }

    /// Where the plan says the files come from.
    pub fn from(&self) -> String {
        match &self.source {
            Source::Hub { repo, endpoint } => {
                format!("{} ({repo}@{})", endpoint, short(&self.revision))
            }
            Source::Store { path } => format!("{path} (revision {})", self.revision),
        }
    }

    /// The name SGLang serves when the manifest gives none: the hub id, as SGLang serves a
    /// model it was given by hub id, or the store path, as it served the folder before.
    pub fn served_name(&self) -> String {
        match &self.source {
            Source::Hub { repo, .. } => repo.clone(),
            Source::Store { path } => path.clone(),
        }
    }

    /// The locked files to fetch: those `include` matches; none before the lock is read.
    pub fn files(&self) -> Vec<&LockedFile> {
        self.locked
            .as_ref()
            .map_or_else(Vec::new, |l| self.wanted(l))
    }

    /// The files of `locked` to fetch: those `include` matches.
    pub fn wanted<'a>(&self, locked: &'a LockedRevision) -> Vec<&'a LockedFile> {
        locked
            .files
            .iter()
            .filter(|f| self.include.is_empty() || self.include.iter().any(|p| glob(p, &f.path)))
            .collect()
    }
}

/// A revision's first 12 characters, as the plan shows a commit.
pub fn short(revision: &str) -> &str {
    revision.get(..12).unwrap_or(revision)
}

/// `fnmatch` as `huggingface_hub`'s `filter_repo_objects` uses it: `*` matches any run of
/// characters, `/` included; `?` one character; a pattern ending in `/` matches the folder's files.
pub fn glob(pattern: &str, path: &str) -> bool {
    if let Some(folder) = pattern.strip_suffix('/') {
        return path.starts_with(&format!("{folder}/"));
    }
    fn at(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => at(&p[1..], s) || (!s.is_empty() && at(p, &s[1..])),
            (Some(b'?'), Some(_)) => at(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => at(&p[1..], &s[1..]),
            _ => false,
        }
    }
    at(pattern.as_bytes(), path.as_bytes())
}

/// One file of a locked revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// A revision's files, as the lock file records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedRevision {
    /// `hub:org/name` or `store:/path` ([`PinnedModel::lock_source`]).
    pub source: String,
    pub revision: String,
    pub files: Vec<LockedFile>,
}

impl LockedRevision {
    /// The digest of the listing of `files` (path, size and hash a line): what a verified copy
    /// records, so that a copy made for other files is not taken for this one.
    pub fn digest(files: &[&LockedFile]) -> String {
        let mut hash = Sha256::new();
        for f in files {
            hash.update(format!("{} {} {}\n", f.sha256, f.size, f.path));
        }
        format!("{:x}", hash.finalize())
    }

    pub fn bytes(files: &[&LockedFile]) -> u64 {
        files.iter().map(|f| f.size).sum()
    }
}

/// `reconcile.lock`: every pinned revision's files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    pub models: Vec<LockedRevision>,
}

/// The lock file's first lines: what it is and who writes it.
const LOCK_HEADER: &str =
    "# reconcile.lock: the files of every model revision the manifests pin, with their\n\
# sizes and SHA-256. Written by `reconcile lock`; commit it with the manifests.\n";

/// A lock file that cannot be read.
#[derive(Debug, Error)]
pub enum LockError {
    #[error("{file}: not a lock file reconcile reads: {source}")]
    Syntax {
        file: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{file}: version {version}; this reconcile reads version 1")]
    Version { file: String, version: u32 },
    #[error("{file}: {model}@{revision}: {why}")]
    Entry {
        file: String,
        model: String,
        revision: String,
        why: String,
    },
}

impl Lock {
    pub fn parse(file: &str, text: &str) -> Result<Lock, LockError> {
        let lock: Lock = serde_yaml::from_str(text).map_err(|source| LockError::Syntax {
            file: file.to_string(),
            source,
        })?;
        if lock.version != 1 {
            return Err(LockError::Version {
                file: file.to_string(),
                version: lock.version,
            });
        }
        for m in &lock.models {
            let bad = |why: String| LockError::Entry {
                file: file.to_string(),
                model: m.source.clone(),
                revision: m.revision.clone(),
                why,
            };
            for f in &m.files {
                if !safe_path(&f.path) {
                    return Err(bad(format!("`{}` is not a path inside the model", f.path)));
                }
                if !is_sha256(&f.sha256) {
                    return Err(bad(format!("{}: `{}` is not a SHA-256", f.path, f.sha256)));
                }
            }
        }
        Ok(lock)
    }

    pub fn render(&self) -> String {
        let body = serde_yaml::to_string(self).unwrap_or_default();
        format!("{LOCK_HEADER}{body}")
    }

    pub fn find(&self, source: &str, revision: &str) -> Option<&LockedRevision> {
        self.models
            .iter()
            .find(|m| m.source == source && m.revision == revision)
    }

    /// Adds `entry`, or replaces the one for its source and revision; sorted, so the file's diff
    /// shows only what changed.
    pub fn insert(&mut self, entry: LockedRevision) {
        self.version = 1;
        self.models
            .retain(|m| !(m.source == entry.source && m.revision == entry.revision));
        self.models.push(entry);
        self.models
            .sort_by(|a, b| (&a.source, &a.revision).cmp(&(&b.source, &b.revision)));
    }

    /// Keeps only the entries `used` names (source, revision): what the manifests still pin.
    pub fn retain(&mut self, used: &[(String, String)]) {
        self.models
            .retain(|m| used.iter().any(|(s, r)| *s == m.source && *r == m.revision));
    }
}

/// A path the lock may name: relative, no `..`, no empty part, no hidden part.
pub fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != ".." && part != "." && !part.contains('\0'))
}

pub fn is_sha256(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A full commit id, as a hub revision must be to pin anything (a branch moves).
pub fn is_commit(text: &str) -> bool {
    text.len() == 40
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// One entry of the hub's tree listing (`GET /api/models/{repo}/tree/{revision}?recursive=true`,
/// `huggingface_hub` `hf_api.py` `list_repo_tree`): a file's `lfs.oid` is its sha256; a file
/// kept in git itself has only its git blob id, and the lock hashes it by reading it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TreeEntry {
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    #[serde(default)]
    pub size: u64,
    pub lfs: Option<TreeLfs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TreeLfs {
    pub oid: String,
    pub size: u64,
}

/// What the hub's tree listing says of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    pub path: String,
    pub size: u64,
    /// The hub's own hash (LFS files); `None`: the lock reads the file to hash it.
    pub sha256: Option<String>,
}

/// The files of one page of a tree listing.
pub fn hub_files(json: &str) -> Result<Vec<HubFile>, serde_json::Error> {
    let entries: Vec<TreeEntry> = serde_json::from_str(json)?;
    Ok(entries
        .into_iter()
        .filter(|e| e.kind == "file")
        .map(|e| {
            let sha256 = e.lfs.as_ref().map(|l| l.oid.clone());
            let size = e.lfs.as_ref().map_or(e.size, |l| l.size);
            HubFile {
                path: e.path,
                size,
                sha256,
            }
        })
        .collect())
}

/// A file of a host's copy that is not as the lock says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Differ {
    pub path: String,
    pub why: String,
}

/// Another complete revision of the model on a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldRevision {
    pub revision: String,
    pub bytes: u64,
    /// When it was last confirmed as the running one (Unix seconds).
    pub used: f64,
}

/// What a host holds of a pinned model (the host script's `look`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HostCopy {
    /// Bytes free for root under the root folder.
    pub free: u64,
    /// The revision's folder exists: complete, as only a rename makes it.
    pub present: bool,
    /// The lock digest the copy was verified against.
    pub lock: Option<String>,
    /// The copy's files that are missing or of another size.
    #[serde(default)]
    pub differ: Vec<Differ>,
    /// Bytes an earlier fetch left, which the next one resumes from.
    #[serde(default)]
    pub partial: u64,
    /// The other revisions it holds.
    #[serde(default)]
    pub revisions: Vec<HeldRevision>,
}

/// What a host needs for its pinned copy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Holding {
    /// The copy is there, verified against this lock entry.
    Verified,
    /// Files to fetch before the old server stops.
    Fetch {
        files: usize,
        bytes: u64,
        /// Bytes an earlier fetch left.
        resumed: u64,
        from: String,
    },
    /// The copy cannot be made or trusted; nothing is stopped.
    Refused { why: String },
}

/// The plan for a host's weights: what it needs, and which revisions go once the new one is
/// confirmed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyPlan {
    pub dir: String,
    pub holding: Holding,
    pub remove: Vec<String>,
}

impl CopyPlan {
    /// The plan's line: `fetch 12 files, 234.1 GB from ... (resumes 40.2 GB)`, then what goes
    /// once the change is confirmed.
    pub fn line(&self) -> String {
        let mut line = match &self.holding {
            Holding::Verified => format!("{}: present, verified", self.dir),
            Holding::Fetch {
                files,
                bytes,
                resumed,
                from,
            } => {
                let resumes = if *resumed > 0 {
                    format!(" (resumes at {})", human_bytes(*resumed))
                } else {
                    String::new()
                };
                format!(
                    "fetch {files} files, {} from {from} into {}, every file checked before the unit changes{resumes}",
                    human_bytes(*bytes),
                    self.dir
                )
            }
            Holding::Refused { why } => format!("refused: {why}"),
        };
        if !self.remove.is_empty() {
            let names: Vec<&str> = self.remove.iter().map(|r| short(r)).collect();
            line.push_str(&format!(
                "; once confirmed, removes {} older revision{} ({})",
                self.remove.len(),
                if self.remove.len() == 1 { "" } else { "s" },
                names.join(", ")
            ));
        }
        line
    }
}

/// Judges `copy` for `spec`'s revision, whose files (as `wanted`) the lock lists.
pub fn judge(spec: &PinnedModel, wanted: &[&LockedFile], copy: &HostCopy) -> CopyPlan {
    let digest = LockedRevision::digest(wanted);
    let dir = spec.pinned_dir();
    let holding = if copy.present {
        if let Some(first) = copy.differ.first() {
            Holding::Refused {
                why: format!(
                    "the copy at {dir} is not as {LOCK_FILE} says ({}: {}{}): move it aside to fetch it again",
                    first.path,
                    first.why,
                    more(copy.differ.len())
                ),
            }
        } else if copy.lock.as_deref() != Some(digest.as_str()) {
            Holding::Refused {
                why: format!(
                    "the copy at {dir} was verified against other files than {LOCK_FILE} lists for revision {}: move it aside to fetch it again",
                    spec.revision
                ),
            }
        } else {
            Holding::Verified
        }
    } else {
        let bytes = LockedRevision::bytes(wanted);
        let resumed = copy.partial.min(bytes);
        let needed = bytes - resumed;
        if needed > copy.free {
            Holding::Refused {
                why: format!(
                    "{} to fetch into {}, {} free there{}",
                    human_bytes(needed),
                    spec.root,
                    human_bytes(copy.free),
                    kept_note(copy)
                ),
            }
        } else {
            Holding::Fetch {
                files: wanted.len(),
                bytes,
                resumed,
                from: spec.from(),
            }
        }
    };
    CopyPlan {
        dir,
        holding,
        remove: removals(spec, copy),
    }
}

fn more(n: usize) -> String {
    if n > 1 {
        format!(", and {} more", n - 1)
    } else {
        String::new()
    }
}

fn kept_note(copy: &HostCopy) -> String {
    if copy.revisions.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = copy.revisions.iter().map(|r| short(&r.revision)).collect();
        format!(" (kept to roll back to: {})", names.join(", "))
    }
}

/// The revisions to remove once the new one is confirmed: all but the `keep - 1` last used
/// others (the one the host ran before among them).
pub fn removals(spec: &PinnedModel, copy: &HostCopy) -> Vec<String> {
    let mut others: Vec<&HeldRevision> = copy
        .revisions
        .iter()
        .filter(|r| r.revision != spec.revision)
        .collect();
    others.sort_by(|a, b| b.used.total_cmp(&a.used));
    let keep_others = spec.keep.saturating_sub(1) as usize;
    let mut remove: Vec<String> = others
        .iter()
        .skip(keep_others)
        .map(|r| r.revision.clone())
        .collect();
    remove.sort();
    remove
}

/// Who serves the hosts fetching one revision with `peers:` (a swarm, as Dragonfly and Kraken
/// spread images): the source serves one host at a time and only while no peer can serve, so
/// the revision crosses the source's link once; each peer (a host that holds the revision)
/// serves one host at a time; a peer whose copy failed a fetch is never asked again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swarm {
    source_busy: bool,
    /// Each peer's (busy, failed).
    peers: Vec<(bool, bool)>,
}

/// Who serves one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Source,
    /// The peer of that index, in the order [`Swarm::join`] numbered them.
    Peer(usize),
}

impl Swarm {
    /// A server for one fetch, or `None` when the fetch must wait for one to be free.
    pub fn take(&mut self) -> Option<Server> {
        if let Some(i) = self
            .peers
            .iter()
            .position(|&(busy, failed)| !busy && !failed)
        {
            self.peers[i].0 = true;
            return Some(Server::Peer(i));
        }
        let peers_serve = self.peers.iter().any(|&(_, failed)| !failed);
        if peers_serve || self.source_busy {
            return None;
        }
        self.source_busy = true;
        Some(Server::Source)
    }

    /// A fetch from `server` ended; `failed`: the server's copy or link failed it.
    pub fn done(&mut self, server: Server, failed: bool) {
        match server {
            Server::Source => self.source_busy = false,
            Server::Peer(i) => {
                if let Some(peer) = self.peers.get_mut(i) {
                    peer.0 = false;
                    peer.1 |= failed;
                }
            }
        }
    }

    /// A host that holds the revision serves from now on; returns its index.
    pub fn join(&mut self) -> usize {
        self.peers.push((false, false));
        self.peers.len() - 1
    }
}

/// Fetch progress, as the host script writes it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct FetchProgress {
    pub done: u64,
    pub total: u64,
}

/// What a finished fetch reports.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Fetched {
    /// Bytes transferred this time.
    pub fetched: u64,
    /// Bytes an earlier fetch had left.
    pub resumed: u64,
    pub seconds: f64,
}

impl Fetched {
    /// Bytes a second over this fetch's transfer.
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.fetched as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Why a fetch failed, as the host script says.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum FetchFailure {
    /// A file's hash or size is not the lock's.
    Digest {
        path: String,
        #[serde(default)]
        expected: Option<String>,
        #[serde(default)]
        got: Option<String>,
        #[serde(default)]
        why: Option<String>,
    },
    /// The source answered an HTTP error.
    Http {
        status: u16,
        path: String,
    },
    /// The source could not be reached.
    Connect {
        path: String,
        why: String,
    },
    /// The store has no such file.
    Missing {
        path: String,
    },
    /// The lock names a path outside the model.
    Path {
        path: String,
    },
    /// Another fetch of the same revision holds it.
    Busy,
    /// Nobody read the fetch's answer any more (its controller went away): it stopped, keeping
    /// what it had for the next fetch to resume.
    Abandoned {
        #[serde(default)]
        path: Option<String>,
    },
    /// The revision is not on the host.
    Absent,
    /// The script was called wrongly (a bug of reconcile's).
    Usage {
        #[serde(default)]
        why: Option<String>,
    },
    Internal {
        why: String,
    },
}

impl std::fmt::Display for FetchFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchFailure::Digest {
                path,
                expected: Some(expected),
                got: Some(got),
                ..
            } => write!(
                f,
                "{path}: sha256 {} where {LOCK_FILE} says {}: refused, nothing stopped",
                short(got),
                short(expected)
            ),
            FetchFailure::Digest { path, why, .. } => write!(
                f,
                "{path}: {}: refused, nothing stopped",
                why.as_deref().unwrap_or("not the file the lock names")
            ),
            FetchFailure::Http { status, path } => {
                write!(f, "{path}: the source answered HTTP {status}")
            }
            FetchFailure::Connect { path, why } => {
                write!(f, "{path}: the source could not be reached: {why}")
            }
            FetchFailure::Missing { path } => write!(f, "{path}: not in the store"),
            FetchFailure::Path { path } => write!(f, "{path}: not a path inside the model"),
            FetchFailure::Busy => {
                write!(f, "another fetch of this revision is running on the host")
            }
            FetchFailure::Abandoned { .. } => {
                write!(f, "the fetch stopped: nobody waited for it any more")
            }
            FetchFailure::Absent => write!(f, "the revision is not on the host"),
            FetchFailure::Usage { why } => write!(
                f,
                "the weights script refused its arguments: {}",
                why.as_deref().unwrap_or("(no reason given)")
            ),
            FetchFailure::Internal { why } => write!(f, "the fetch failed: {why}"),
        }
    }
}

/// `1.5 GB`: decimal units, as disks and links are sold.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The lock entries every manifest's pin needs, by (source, revision), for `reconcile lock`.
pub fn pins<'a>(
    specs: impl IntoIterator<Item = &'a PinnedModel>,
) -> BTreeMap<(String, String), &'a PinnedModel> {
    specs
        .into_iter()
        .map(|s| ((s.lock_source(), s.revision.clone()), s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    fn hub() -> PinnedModel {
        PinnedModel {
            source: Source::Hub {
                repo: "Qwen/Qwen3.5-122B-A10B".into(),
                endpoint: HUB.into(),
            },
            revision: "0123456789abcdef0123456789abcdef01234567".into(),
            keep: DEFAULT_KEEP,
            include: Vec::new(),
            root: DEFAULT_ROOT.into(),
            at_once: DEFAULT_AT_ONCE,
            rate: None,
            peers: None,
            locked: None,
        }
    }

    fn file(path: &str, size: u64) -> LockedFile {
        LockedFile {
            path: path.into(),
            size,
            sha256: "a".repeat(64),
        }
    }

    fn locked() -> LockedRevision {
        LockedRevision {
            source: hub().lock_source(),
            revision: hub().revision,
            files: vec![
                file("config.json", 100),
                file("model-00001-of-00002.safetensors", 5_000),
                file("model-00002-of-00002.safetensors", 4_000),
                file("original/consolidated.pth", 9_000),
            ],
        }
    }

    #[test]
    fn a_hub_pin_names_its_folder_its_url_and_its_served_name() {
        let spec = hub();
        assert_eq!(
            spec.pinned_dir(),
            "/var/lib/reconcile-weights/Qwen--Qwen3.5-122B-A10B/0123456789abcdef0123456789abcdef01234567"
        );
        assert_eq!(
            spec.fetch_base(),
            "https://huggingface.co/Qwen/Qwen3.5-122B-A10B/resolve/0123456789abcdef0123456789abcdef01234567"
        );
        assert_eq!(spec.served_name(), "Qwen/Qwen3.5-122B-A10B");
        assert_eq!(spec.lock_source(), "hub:Qwen/Qwen3.5-122B-A10B");
        let store = PinnedModel {
            source: Source::Store {
                path: "/shared/models/Qwen3.5-122B-A10B/".into(),
            },
            revision: "2026-11-30".into(),
            ..hub()
        };
        assert_eq!(
            store.pinned_dir(),
            "/var/lib/reconcile-weights/Qwen3.5-122B-A10B/2026-11-30"
        );
        assert_eq!(store.fetch_base(), "/shared/models/Qwen3.5-122B-A10B");
        assert_eq!(
            store.lock_source(),
            "store:/shared/models/Qwen3.5-122B-A10B"
        );
    }

    #[test]
    fn include_patterns_match_as_huggingface_hubs_allow_patterns() {
        assert!(glob("*.safetensors", "model-00001-of-00002.safetensors"));
        assert!(
            glob("*.json", "sub/config.json"),
            "`*` crosses `/` as fnmatch's does"
        );
        assert!(!glob("*.json", "model.safetensors"));
        assert!(glob("original/", "original/consolidated.pth"));
        assert!(glob(
            "model-0000?-of-00002.safetensors",
            "model-00002-of-00002.safetensors"
        ));
        let spec = PinnedModel {
            include: vec!["*.json".into(), "*.safetensors".into()],
            ..hub()
        };
        let entry = locked();
        let wanted: Vec<&str> = spec
            .wanted(&entry)
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        assert_eq!(
            wanted,
            [
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn a_verified_copy_needs_nothing_and_a_missing_one_is_fetched_from_where_it_stopped() {
        let spec = hub();
        let entry = locked();
        let wanted = spec.wanted(&entry);
        let digest = LockedRevision::digest(&wanted);
        let verified = HostCopy {
            free: 0,
            present: true,
            lock: Some(digest),
            ..HostCopy::default()
        };
        assert_eq!(judge(&spec, &wanted, &verified).holding, Holding::Verified);
        let partial = HostCopy {
            free: 20_000,
            partial: 5_100,
            ..HostCopy::default()
        };
        assert_eq!(
            judge(&spec, &wanted, &partial).holding,
            Holding::Fetch {
                files: 4,
                bytes: 18_100,
                resumed: 5_100,
                from: "https://huggingface.co (Qwen/Qwen3.5-122B-A10B@0123456789ab)".into()
            }
        );
    }

    #[test]
    fn too_little_disk_a_changed_copy_and_a_copy_of_other_files_are_refused() {
        let spec = hub();
        let entry = locked();
        let wanted = spec.wanted(&entry);
        let full = HostCopy {
            free: 10_000,
            partial: 100,
            revisions: vec![HeldRevision {
                revision: "f".repeat(40),
                bytes: 18_100,
                used: 1.0,
            }],
            ..HostCopy::default()
        };
        let Holding::Refused { why } = judge(&spec, &wanted, &full).holding else {
            panic!("not refused")
        };
        assert_eq!(
            why,
            "18.0 kB to fetch into /var/lib/reconcile-weights, 10.0 kB free there (kept to roll back to: ffffffffffff)"
        );
        let changed = HostCopy {
            present: true,
            lock: Some(LockedRevision::digest(&wanted)),
            differ: vec![
                Differ {
                    path: "config.json".into(),
                    why: "size 99 of 100".into(),
                },
                Differ {
                    path: "original/consolidated.pth".into(),
                    why: "missing".into(),
                },
            ],
            ..HostCopy::default()
        };
        let Holding::Refused { why } = judge(&spec, &wanted, &changed).holding else {
            panic!("not refused")
        };
        assert_holds(&why, "(config.json: size 99 of 100, and 1 more)");
        let other = HostCopy {
            present: true,
            lock: Some("b".repeat(64)),
            ..HostCopy::default()
        };
        assert!(matches!(
            judge(&spec, &wanted, &other).holding,
            Holding::Refused { .. }
        ));
    }

    #[test]
    fn keep_two_removes_all_but_the_last_used_other_revision() {
        let held = |revision: &str, used: f64| HeldRevision {
            revision: revision.into(),
            bytes: 1,
            used,
        };
        let copy = HostCopy {
            revisions: vec![held("old", 1.0), held("previous", 3.0), held("older", 2.0)],
            ..HostCopy::default()
        };
        assert_eq!(removals(&hub(), &copy), ["old", "older"]);
        let keep_one = PinnedModel { keep: 1, ..hub() };
        assert_eq!(removals(&keep_one, &copy), ["old", "older", "previous"]);
        let keep_five = PinnedModel { keep: 5, ..hub() };
        assert!(removals(&keep_five, &copy).is_empty());
    }

    #[test]
    fn the_lock_file_round_trips_and_refuses_paths_outside_the_model() {
        let mut lock = Lock::default();
        lock.insert(locked());
        let text = lock.render();
        assert!(text.starts_with("# reconcile.lock"), "{text}");
        let back = Lock::parse("manifests/reconcile.lock", &text).unwrap();
        assert_eq!(back, lock);
        assert!(back.find(&hub().lock_source(), &hub().revision).is_some());
        let bad = text.replace("original/consolidated.pth", "../etc/shadow");
        let e = Lock::parse("manifests/reconcile.lock", &bad).unwrap_err();
        assert!(
            e.to_string()
                .contains("`../etc/shadow` is not a path inside the model"),
            "{e}"
        );
        let newer = text.replace("version: 1", "version: 2");
        assert!(Lock::parse("l", &newer)
            .unwrap_err()
            .to_string()
            .contains("version 2"));
    }

    #[test]
    fn the_hubs_tree_gives_lfs_files_their_sha256_and_leaves_git_files_to_hash() {
        let json = r#"[
          {"type":"directory","oid":"x","size":0,"path":"sub"},
          {"type":"file","oid":"5d2f","size":41,"path":"config.json"},
          {"type":"file","oid":"9e1a","size":134,"path":"model.safetensors",
           "lfs":{"oid":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","size":3145728,"pointerSize":134}}
        ]"#;
        let files = hub_files(json).unwrap();
        assert_eq!(
            files,
            [
                HubFile {
                    path: "config.json".into(),
                    size: 41,
                    sha256: None
                },
                HubFile {
                    path: "model.safetensors".into(),
                    size: 3_145_728,
                    sha256: Some("b".repeat(64))
                }
            ]
        );
    }

    #[test]
    fn a_swarm_asks_the_source_once_then_only_peers_and_never_a_peer_that_failed() {
        let mut swarm = Swarm::default();
        // Three hosts fetch: the source serves the first; the others wait for a peer.
        assert_eq!(swarm.take(), Some(Server::Source));
        assert_eq!(swarm.take(), None);
        // The first host holds it now and serves before the source is free again.
        let first = swarm.join();
        swarm.done(Server::Source, false);
        assert_eq!(swarm.take(), Some(Server::Peer(first)));
        assert_eq!(
            swarm.take(),
            None,
            "the source stays unasked while a peer can serve"
        );
        let second = swarm.join();
        assert_eq!(swarm.take(), Some(Server::Peer(second)));
        // A peer whose copy failed is not asked again; with none left, the source is.
        swarm.done(Server::Peer(first), true);
        swarm.done(Server::Peer(second), true);
        assert_eq!(swarm.take(), Some(Server::Source));
        swarm.done(Server::Source, false);
        let third = swarm.join();
        assert_eq!(swarm.take(), Some(Server::Peer(third)));
    }

    #[test]
    fn a_failed_fetch_says_which_file_and_why() {
        let f: FetchFailure = serde_json::from_str(&format!(
            r#"{{"error":"digest","path":"model.safetensors","expected":"{}","got":"{}"}}"#,
            "a".repeat(64),
            "c".repeat(64)
        ))
        .unwrap();
        assert_eq!(
            f.to_string(),
            "model.safetensors: sha256 cccccccccccc where reconcile.lock says aaaaaaaaaaaa: refused, nothing stopped"
        );
        let f: FetchFailure =
            serde_json::from_str(r#"{"error":"http","status":404,"path":"a.json"}"#).unwrap();
        assert_eq!(f.to_string(), "a.json: the source answered HTTP 404");
    }
}
