//! `reconcile lock`: writes `reconcile.lock` beside the manifests, the files of every revision
//! they pin with their sizes and SHA-256, as Cargo.lock pins crates. A hub repository's listing
//! comes from the hub's API (`huggingface_hub` `hf_api.py`: `model_info` for the revision's
//! commit, `list_repo_tree` for its files, whose `lfs.oid` is the sha256 of a large file); a
//! file kept in git itself (configs, tokenizers) is read once to hash it. A store's files are
//! hashed where they are, on the first host of a manifest that pins it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use reconcile_core::pinned::{
    hub_files, human_bytes, short, Lock, LockError, LockedFile, LockedRevision, PinnedModel,
    Source, LOCK_FILE,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::PinnedError;
use crate::manifest::Manifest;
use crate::remote::{self, SshOptions};

/// What `reconcile lock` did with one pinned revision.
#[derive(Debug, Clone, Serialize)]
pub struct Locked {
    pub file: String,
    pub source: String,
    pub revision: String,
    pub files: usize,
    pub bytes: u64,
    /// Listed and hashed by this run; otherwise the lock already had it.
    pub written: bool,
}

impl std::fmt::Display for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}@{}: {} files, {}{}",
            self.file,
            self.source,
            short(&self.revision),
            self.files,
            human_bytes(self.bytes),
            if self.written {
                " (locked)"
            } else {
                " (already locked)"
            }
        )
    }
}

/// Why a lock could not be written.
#[derive(Debug, thiserror::Error)]
pub enum LockCommandError {
    #[error("{}: cannot be read: {source}", .file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{}: cannot be written: {source}", .file.display())]
    Write {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The hub does not know the repository or the revision, or refused the token.
    #[error("{model}@{revision}: {url} answered HTTP {status}: no such repository or revision there (or the token may not read it)")]
    Unknown {
        model: String,
        revision: String,
        url: String,
        status: u16,
    },
    /// The revision is not the commit the hub resolves it to.
    #[error("{model}@{revision}: the hub resolves it to commit {commit}: pin the commit")]
    NotACommit {
        model: String,
        revision: String,
        commit: String,
    },
    #[error("{model}@{revision}: {url}: {source}")]
    Hub {
        model: String,
        revision: String,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{model}@{revision}: {url}: {why}")]
    HubAnswer {
        model: String,
        revision: String,
        url: String,
        why: String,
    },
    #[error("{model}: the store is hashed on {host}: {source}")]
    Store {
        model: String,
        host: String,
        #[source]
        source: PinnedError,
    },
    #[error("{model}: the store is hashed on {host}, which cannot be reached: {source}")]
    Connect {
        model: String,
        host: String,
        #[source]
        source: remote::RemoteError,
    },
}

/// Locks every revision `manifests` pin, in the lock file of each manifest's folder. A revision
/// already locked is kept unless `update`; entries no manifest pins any more are dropped.
pub async fn lock(
    manifests: &[Manifest],
    ssh: &SshOptions,
    update: bool,
) -> Result<Vec<Locked>, LockCommandError> {
    let mut by_folder: BTreeMap<PathBuf, Vec<&Manifest>> = BTreeMap::new();
    for m in manifests.iter().filter(|m| m.sglang.pinned.is_some()) {
        let folder = Path::new(&m.source)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        by_folder.entry(folder).or_default().push(m);
    }
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("reconcile/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|source| LockCommandError::Hub {
            model: String::new(),
            revision: String::new(),
            url: String::new(),
            source,
        })?;
    let mut done = Vec::new();
    for (folder, pinned) in by_folder {
        let file = folder.join(LOCK_FILE);
        let shown = crate::load::display_path(&file);
        let mut lock = match std::fs::read_to_string(&file) {
            Ok(text) => Lock::parse(&shown, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Lock::default(),
            Err(source) => return Err(LockCommandError::Read { file, source }),
        };
        let before = lock.render();
        let mut used = Vec::new();
        for m in pinned {
            let Some(spec) = &m.sglang.pinned else {
                continue;
            };
            let key = (spec.lock_source(), spec.revision.clone());
            if used.contains(&key) {
                continue;
            }
            used.push(key.clone());
            let kept = lock.find(&key.0, &key.1).cloned();
            let (entry, written) = match kept {
                Some(entry) if !update => (entry, false),
                _ => (list(&client, m, spec, ssh).await?, true),
            };
            done.push(Locked {
                file: shown.clone(),
                source: entry.source.clone(),
                revision: entry.revision.clone(),
                files: entry.files.len(),
                bytes: entry.files.iter().map(|f| f.size).sum(),
                written,
            });
            lock.insert(entry);
        }
        lock.retain(&used);
        let text = lock.render();
        if text != before {
            std::fs::write(&file, text)
                .map_err(|source| LockCommandError::Write { file, source })?;
        }
    }
    Ok(done)
}

/// The files of `spec`'s revision, hashed.
async fn list(
    client: &reqwest::Client,
    m: &Manifest,
    spec: &PinnedModel,
    ssh: &SshOptions,
) -> Result<LockedRevision, LockCommandError> {
    let files = match &spec.source {
        Source::Hub { repo, endpoint } => {
            let token = m
                .env
                .get("HF_TOKEN")
                .cloned()
                .or_else(|| std::env::var("HF_TOKEN").ok());
            let hub = Hub {
                client,
                endpoint: endpoint.trim_end_matches('/'),
                repo,
                revision: &spec.revision,
                token: token.as_deref(),
            };
            hub.files().await?
        }
        Source::Store { path } => {
            let host_name = m.hosts.first().map(|h| h.name.clone()).unwrap_or_default();
            let host = remote::connect(&host_name, ssh).await.map_err(|source| {
                LockCommandError::Connect {
                    model: spec.lock_source(),
                    host: host_name.clone(),
                    source,
                }
            })?;
            let hashed = super::hash_store(host.as_ref(), &m.sglang.python, path).await;
            host.close().await;
            hashed.map_err(|source| LockCommandError::Store {
                model: spec.lock_source(),
                host: host_name,
                source,
            })?
        }
    };
    Ok(LockedRevision {
        source: spec.lock_source(),
        revision: spec.revision.clone(),
        files,
    })
}

/// A hub repository at a revision, as `huggingface_hub` reaches it.
struct Hub<'a> {
    client: &'a reqwest::Client,
    endpoint: &'a str,
    repo: &'a str,
    revision: &'a str,
    token: Option<&'a str>,
}

impl Hub<'_> {
    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let request = self.client.get(url);
        match self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    fn failed(&self, url: &str, source: reqwest::Error) -> LockCommandError {
        LockCommandError::Hub {
            model: format!("hub:{}", self.repo),
            revision: self.revision.to_string(),
            url: url.to_string(),
            source,
        }
    }

    fn answer(&self, url: &str, why: String) -> LockCommandError {
        LockCommandError::HubAnswer {
            model: format!("hub:{}", self.repo),
            revision: self.revision.to_string(),
            url: url.to_string(),
            why,
        }
    }

    /// `url`'s answer, an HTTP error status named.
    async fn fetch(&self, url: &str) -> Result<reqwest::Response, LockCommandError> {
        let response = self
            .get(url)
            .send()
            .await
            .map_err(|e| self.failed(url, e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(LockCommandError::Unknown {
            model: format!("hub:{}", self.repo),
            revision: self.revision.to_string(),
            url: url.to_string(),
            status: status.as_u16(),
        })
    }

    /// The revision's files: the commit checked, the tree listed (page by page, as the hub's
    /// `Link: rel="next"` says), each file without the hub's sha256 read and hashed.
    async fn files(&self) -> Result<Vec<LockedFile>, LockCommandError> {
        let info = format!(
            "{}/api/models/{}/revision/{}",
            self.endpoint, self.repo, self.revision
        );
        let body = self
            .fetch(&info)
            .await?
            .text()
            .await
            .map_err(|e| self.failed(&info, e))?;
        #[derive(serde::Deserialize)]
        struct Info {
            sha: Option<String>,
        }
        let commit = serde_json::from_str::<Info>(&body)
            .map_err(|e| self.answer(&info, e.to_string()))?
            .sha;
        if let Some(commit) = commit.filter(|c| c != self.revision) {
            return Err(LockCommandError::NotACommit {
                model: format!("hub:{}", self.repo),
                revision: self.revision.to_string(),
                commit,
            });
        }
        let mut url = format!(
            "{}/api/models/{}/tree/{}?recursive=true",
            self.endpoint, self.repo, self.revision
        );
        let mut listed = Vec::new();
        loop {
            let response = self.fetch(&url).await?;
            let next = next_link(response.headers());
            let body = response.text().await.map_err(|e| self.failed(&url, e))?;
            listed.extend(hub_files(&body).map_err(|e| self.answer(&url, e.to_string()))?);
            match next {
                Some(next) => url = next,
                None => break,
            }
        }
        let mut files = Vec::new();
        for f in listed {
            let sha256 = match f.sha256 {
                Some(sha256) => sha256,
                None => self.hash(&f.path, f.size).await?,
            };
            files.push(LockedFile {
                path: f.path,
                size: f.size,
                sha256,
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Reads a file the hub gives no sha256 for, and hashes it.
    async fn hash(&self, path: &str, size: u64) -> Result<String, LockCommandError> {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint, self.repo, self.revision, path
        );
        let response = self.fetch(&url).await?;
        let mut stream = response.bytes_stream();
        let mut hash = Sha256::new();
        let mut read = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.failed(&url, e))?;
            read += chunk.len() as u64;
            hash.update(&chunk);
        }
        if read != size {
            return Err(self.answer(&url, format!("{read} bytes where the tree says {size}")));
        }
        Ok(format!("{:x}", hash.finalize()))
    }
}

/// The `rel="next"` URL of a `Link` header (the hub pages long listings).
fn next_link(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let link = headers.get(reqwest::header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            url.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::LINK,
            "<https://hub/api/models/a/b/tree/c?cursor=xyz>; rel=\"next\""
                .parse()
                .unwrap(),
        );
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://hub/api/models/a/b/tree/c?cursor=xyz")
        );
        assert_eq!(next_link(&reqwest::header::HeaderMap::new()), None);
    }
}
