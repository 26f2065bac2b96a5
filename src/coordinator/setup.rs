//! The coordinator's address and credentials, from the command line and the environment, checked
//! before anything is contacted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::remote::etcd::EtcdOptions;

/// The environment variable an etcd user's password may come from.
pub const PASSWORD_ENV: &str = "RECONCILE_COORDINATOR_PASSWORD";

/// The standard etcd client port, for an address without one.
const ETCD_PORT: u16 = 2379;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("--coordinator `{0}`: {1}")]
    Address(String, &'static str),
    #[error("--coordinator-user {user}: no password (put it in a file for --coordinator-password-file, or in {PASSWORD_ENV})")]
    NoPassword { user: String },
    #[error("--coordinator-password-file {path}: cannot read it")]
    PasswordFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the command line says of the coordinator.
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub urls: String,
    pub ca: Option<PathBuf>,
    pub identity: Option<(PathBuf, PathBuf)>,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// The etcd options `given` comes to; `password_env` is the environment's password, if any.
pub fn etcd_options(
    given: &Given,
    password_env: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
) -> Result<EtcdOptions, SetupError> {
    let tls = given.ca.is_some();
    let endpoints = endpoints(&given.urls, tls)?;
    let user = match &given.user {
        None => None,
        Some(user) => {
            let password = match &given.password_file {
                Some(path) => first_line(path)?,
                None => password_env
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| SetupError::NoPassword { user: user.clone() })?,
            };
            Some((user.clone(), password))
        }
    };
    Ok(EtcdOptions {
        endpoints,
        ca: given.ca.clone(),
        identity: given.identity.clone(),
        user,
        connect_timeout,
        request_timeout,
    })
}

fn first_line(path: &Path) -> Result<String, SetupError> {
    let text = std::fs::read_to_string(path).map_err(|source| SetupError::PasswordFile {
        path: path.display().to_string(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

/// `etcd://a:2379,b:2379`, `https://a:2379,https://b:2379` or bare `a:2379,b`: one URL per
/// member, `https` when TLS is on. Credentials in the address are refused: they would end up in
/// process listings, unit files and logs.
pub fn endpoints(text: &str, tls: bool) -> Result<Vec<String>, SetupError> {
    let bad = |why| SetupError::Address(shown(text), why);
    let mut out = Vec::new();
    let mut scheme_seen: Option<&str> = None;
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(bad("an empty member address"));
        }
        let (scheme, rest) = match part.split_once("://") {
            Some((s, r)) => (Some(s), r),
            None => (None, part),
        };
        let scheme = scheme.or(scheme_seen);
        scheme_seen = scheme;
        let secure = match scheme {
            None | Some("etcd") => tls,
            Some("http") if tls => {
                return Err(bad(
                    "http:// with --coordinator-ca: use https:// or etcd://",
                ))
            }
            Some("http") => false,
            Some("https") => true,
            Some(_) => return Err(bad("the scheme must be etcd://, http:// or https://")),
        };
        if secure && !tls {
            return Err(bad(
                "https:// needs --coordinator-ca, the CA of the members' certificates",
            ));
        }
        let authority = rest.trim_end_matches('/');
        if authority.contains('@') {
            return Err(bad("credentials do not go in the address: use --coordinator-user and --coordinator-password-file"));
        }
        if authority.is_empty()
            || authority.contains('/')
            || authority.contains(char::is_whitespace)
        {
            return Err(bad("each member is host[:port]"));
        }
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.ends_with(':') && port.parse::<u16>().is_ok());
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{ETCD_PORT}")
        };
        out.push(format!(
            "{}://{authority}",
            if secure { "https" } else { "http" }
        ));
    }
    Ok(out)
}

/// The address for an error message, with any credentials in it masked.
fn shown(text: &str) -> String {
    text.split(',')
        .map(|part| {
            let (scheme, rest) = part.split_once("://").map_or(("", part), |(s, r)| (s, r));
            let rest = match rest.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => rest.to_string(),
            };
            if scheme.is_empty() {
                rest
            } else {
                format!("{scheme}://{rest}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_become_one_url_per_member_with_the_default_port() {
        assert_eq!(
            endpoints("etcd://10.0.0.5:2379,10.0.0.6", false).unwrap(),
            ["http://10.0.0.5:2379", "http://10.0.0.6:2379"]
        );
        assert_eq!(
            endpoints("etcd://coord.internal", true).unwrap(),
            ["https://coord.internal:2379"]
        );
        assert_eq!(
            endpoints("http://127.0.0.1:23790", false).unwrap(),
            ["http://127.0.0.1:23790"]
        );
    }

    #[test]
    fn bad_addresses_are_refused_with_the_reason() {
        let err = |t: &str, tls| endpoints(t, tls).unwrap_err().to_string();
        let creds = err("etcd://root:pw@h:2379", false);
        assert!(creds.contains("credentials do not go"), "{creds}");
        assert!(
            creds.contains("etcd://***@h:2379") && !creds.contains("pw"),
            "{creds}"
        );
        assert!(err("https://h:2379", false).contains("needs --coordinator-ca"));
        assert!(err("http://h:2379", true).contains("use https://"));
        assert!(err("ftp://h", false).contains("scheme"));
        assert!(err("etcd://a,,b", false).contains("empty member"));
    }

    #[test]
    fn a_user_needs_a_password_from_a_file_or_the_environment() {
        let given = Given {
            urls: "etcd://h".into(),
            user: Some("agent".into()),
            ..Given::default()
        };
        let t = Duration::from_secs(1);
        let e = etcd_options(&given, None, t, t).unwrap_err().to_string();
        assert!(e.contains(PASSWORD_ENV), "{e}");
        let o = etcd_options(&given, Some("s3cret".into()), t, t).unwrap();
        assert_eq!(o.user, Some(("agent".into(), "s3cret".into())));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let with_file = Given {
            password_file: Some(file),
            ..given
        };
        let o = etcd_options(&with_file, Some("env".into()), t, t).unwrap();
        assert_eq!(o.user, Some(("agent".into(), "from-file".into())));
    }
}
