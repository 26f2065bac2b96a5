//! `router:`: the sglang-router a service's replicas sit behind, so that a rollout takes each one
//! out, restarts and verifies it, and puts it back (see the binary's `router` module).

use std::collections::BTreeMap;
use std::time::Duration;

use super::locate::Seg;
use super::Manifest;

/// Where the router is and how a rollout treats it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSpec {
    /// The router's base URL as seen from `via` (or from here without it): `http://10.0.0.9:30000`.
    pub url: String,
    /// Reach the router through an SSH port forward from this host (a `~/.ssh/config` name).
    pub via: Option<String>,
    pub admin_key: Option<AdminKey>,
    /// Each host's worker URL as the router reaches it, by host name. A host not listed is
    /// `http://<host>:<port>`.
    pub workers: BTreeMap<String, String>,
    /// Healthy replicas of the model that must stay in the router while one is out.
    pub min_available: usize,
    /// How long to wait for a removed replica's in-flight requests to finish, when the manifest
    /// has no `drain:` of its own (which then decides).
    pub drain_timeout: Duration,
    /// How long to wait, after adding a replica, for the router to list it healthy.
    pub healthy_timeout: Duration,
}

/// Where the router's admin key (`--control-plane-api-keys`, role `admin`) comes from. Never the
/// manifest's own text: a manifest is kept in git.
#[derive(Clone, PartialEq)]
pub enum AdminKey {
    /// An environment variable of the machine running reconcile.
    Env(String),
    /// A file on the `via` host, read over SSH.
    File(String),
}

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminKey::Env(name) => write!(f, "Env({name})"),
            AdminKey::File(path) => write!(f, "File({path})"),
        }
    }
}

impl RouterSpec {
    /// The same as `drain:`'s default: the OpenAI clients most SGLang callers use give up on a
    /// request after 600 s (openai-python's DEFAULT_TIMEOUT).
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
    /// The router's registration job checks `/health` at once (`--health-check-timeout-secs` 5,
    /// real SGLang answers in 1-20 s) and then every `--health-check-interval-secs` (60), both
    /// defaults in `sglang_router/router_args.py`; two intervals is enough for one failed check.
    pub const HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);

    /// The worker URL of the replica on `host` serving on `port`.
    pub fn worker_url(&self, host: &str, port: u16) -> String {
        if let Some(url) = self.workers.get(host) {
            return url.trim_end_matches('/').to_string();
        }
        // `user@host:port` destinations: the router reaches the bare host name.
        let bare = host.rsplit('@').next().unwrap_or(host);
        let bare = bare.split(':').next().unwrap_or(bare);
        format!("http://{bare}:{port}")
    }
}

/// Whether `text` has both `admin_key_env` and `admin_key_file` under `router:`: the typed spec
/// keeps one, so the rule is read from the raw keys.
fn both_keys(text: &str) -> bool {
    let key = |k: &str| {
        super::locate::locate(text, &[Seg::Key("router"), Seg::Key(k)])
            .is_some_and(|p| text.lines().nth(p.line - 1).is_some_and(|l| l.contains(k)))
    };
    key("admin_key_env") && key("admin_key_file")
}

/// The rules of `router:`; `fail` gets each failure's field path (`validate` adds the position).
pub(super) fn check(m: &Manifest, text: &str, fail: &mut dyn FnMut(&[Seg], String)) {
    let Some(r) = &m.router else {
        return;
    };
    let at = |key| [Seg::Key("router"), Seg::Key(key)];
    if let Err(why) = http_url(&r.url) {
        fail(&at("url"), why.to_string());
    }
    if both_keys(text) {
        fail(
            &at("admin_key_file"),
            "give `admin_key_env` or `admin_key_file`, not both".into(),
        );
    }
    match &r.admin_key {
        Some(AdminKey::Env(name)) if !env_name(name) => fail(
            &at("admin_key_env"),
            format!("`{name}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        ),
        Some(AdminKey::File(path)) if r.via.is_none() => fail(
            &at("admin_key_file"),
            format!("`{path}` is a file on the router's host: set `via` to that host too"),
        ),
        Some(AdminKey::File(path)) if !path.starts_with('/') => fail(
            &at("admin_key_file"),
            format!("`{path}` is not an absolute path"),
        ),
        _ => {}
    }
    if let Some(via) = &r.via {
        if via.is_empty() || via.starts_with('-') || via.contains(char::is_whitespace) {
            fail(&at("via"), format!("`{via}` is not an ssh destination"));
        }
    }
    for (host, url) in &r.workers {
        let path = [Seg::Key("router"), Seg::Key("workers"), Seg::Key(host)];
        if !m.hosts.iter().any(|h| &h.name == host) {
            fail(
                &path,
                format!("`{host}` is not one of this service's hosts"),
            );
        } else if m.group.is_some() && m.hosts.first().is_some_and(|rank0| &rank0.name != host) {
            // sglang 0.5.23 `entrypoints/http_server.py`: a rank >= 1 serves no API (only the
            // dummy health server), so the router can only ever send the group's requests to
            // rank 0.
            fail(
                &path,
                format!(
                    "`{host}` is not rank 0 of this server group: only rank 0 ({}) serves the API, so it alone is the router's worker",
                    m.hosts[0].name
                ),
            );
        } else if let Err(why) = http_url(url) {
            fail(&path, why.to_string());
        }
    }
    for (key, d) in [
        ("drain_timeout", r.drain_timeout),
        ("healthy_timeout", r.healthy_timeout),
    ] {
        if d.is_zero() {
            fail(&at(key), format!("{key} must be longer than 0s"));
        }
    }
}

/// Why a router or worker URL is not one reconcile's HTTP client can reach; the message becomes
/// the field's [`super::ManifestError::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Another scheme than `http://` (`https://` included).
    #[error("`{url}` is not an http:// URL (reconcile speaks no TLS)")]
    NotHttp { url: String },
    /// Nothing, a space or user info where the host should be.
    #[error("`{url}` has no plain host[:port] after http://")]
    NoHost { url: String },
}

/// reconcile's HTTP client speaks plain HTTP only (no TLS: the same limit as `verify.url`).
fn http_url(url: &str) -> Result<(), UrlError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| UrlError::NotHttp { url: url.into() })?;
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains(char::is_whitespace) || authority.contains('@') {
        return Err(UrlError::NoHost { url: url.into() });
    }
    Ok(())
}

fn env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use crate::manifest::{parse, validate};
    use crate::testing::{assert_each_holds, assert_holds, assert_starts};

    const BASE: &str = "service: q\nhosts: [rl19, rl20]\nsglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /m, port: 30000 }\n";

    fn errors(router: &str) -> Vec<String> {
        let text = format!("{BASE}{router}");
        let m = parse("m.yaml", &text).unwrap();
        match validate(&m, &text) {
            Ok(()) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn a_router_parses_with_its_defaults() {
        let text = format!("{BASE}router:\n  url: http://10.0.0.9:30000/\n  via: rl18\n  admin_key_file: /etc/sglang-router/admin-key\n  workers: {{ rl19: \"http://10.0.0.19:30000\" }}\n");
        let m = parse("m.yaml", &text).unwrap();
        validate(&m, &text).unwrap();
        let r = m.router.unwrap();
        assert_eq!(r.url, "http://10.0.0.9:30000");
        assert_eq!(r.min_available, 1);
        assert_eq!(r.drain_timeout, super::RouterSpec::DRAIN_TIMEOUT);
        assert_eq!(
            r.admin_key,
            Some(super::AdminKey::File("/etc/sglang-router/admin-key".into()))
        );
        assert_eq!(r.worker_url("rl19", 30000), "http://10.0.0.19:30000");
        assert_eq!(r.worker_url("root@rl20:2222", 30000), "http://rl20:30000");
    }

    #[test]
    fn a_server_groups_worker_is_its_rank_0() {
        let group = "service: q\nnodes: [rl22, rl23]\nsglang: { python: /usr/bin/python3, version: 0.5.23, model_path: /m, port: 30000 }\nrouter:\n  url: http://10.0.0.9:30000\n  workers:\n";
        let check = |workers: &str| {
            let text = format!("{group}{workers}");
            let m = parse("m.yaml", &text).unwrap();
            validate(&m, &text).map_err(|e| e.0.iter().map(|e| e.to_string()).collect::<Vec<_>>())
        };
        check("    rl22: \"http://10.0.0.22:30000\"\n").unwrap();
        let e = check("    rl23: \"http://10.0.0.23:30000\"\n").unwrap_err();
        assert_starts(
            &e,
            &[
                "m.yaml:7:5: router.workers.rl23: `rl23` is not rank 0 of this server group: only rank 0 (rl22) serves the API",
            ],
        );
    }

    #[test]
    fn router_mistakes_name_file_line_and_field() {
        let e = errors("router:\n  url: https://r:1\n  admin_key_file: key\n");
        assert_starts(
            &e,
            &[
                "m.yaml:5:3: router.url: `https://r:1` is not an http:// URL",
                "m.yaml:6:3: router.admin_key_file: `key` is a file on the router's host",
            ],
        );
        assert!(matches!(
            super::http_url("https://r:1"),
            Err(super::UrlError::NotHttp { .. })
        ));
        let no_host = super::http_url("http://a@b/").unwrap_err();
        assert_eq!(
            no_host.to_string(),
            "`http://a@b/` has no plain host[:port] after http://"
        );
        assert!(matches!(no_host, super::UrlError::NoHost { .. }));
        let e = errors("router:\n  url: http://r:1\n  via: rl18\n  admin_key_env: K\n  admin_key_file: /k\n  workers: { rl99: \"http://x:1\" }\n  drain_timeout: 0s\n");
        assert_each_holds(
            &e,
            &[
                "router.admin_key_file: give `admin_key_env` or `admin_key_file`, not both",
                "router.workers.rl99: `rl99` is not one of this service's hosts",
                "router.drain_timeout: drain_timeout must be longer than 0s",
            ],
        );
    }

    #[test]
    fn the_key_itself_cannot_be_written_in_the_manifest() {
        let text = format!("{BASE}router:\n  url: http://r:1\n  admin_key: s3cret\n");
        let e = parse("m.yaml", &text).unwrap_err().0[0].to_string();
        assert!(e.starts_with("m.yaml:6:"), "{e}");
        assert_holds(&e, "router");
        assert!(!e.contains("s3cret"), "{e}");
    }
}
