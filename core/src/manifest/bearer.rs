//! Where a bearer token may go. reconcile sends two: the server's `--api-key` (to every route of
//! the server that needs it) and the router's admin key (to its admin API, beside the worker's own
//! `--api-key` in the body of `POST /workers`). Plain HTTP to another machine shows them to
//! anyone on the path, so a token goes over `http://` only to loopback, or through an SSH forward
//! (the router's `via`; a server reached without `verify.url` always is). The manifest check is
//! here; the binary's HTTP clients ask [`in_clear_off_host`] too before they attach a token.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::locate::Seg;
use super::{FlagValue, Manifest, RefTarget};

/// Whether a request to `url` would cross the network unencrypted: `http://` to a host that is
/// not loopback (127.0.0.0/8, ::1, `localhost`). Anything else (`https://`, another scheme) is
/// not plain HTTP, and is left to the rules that say which schemes are spoken at all.
pub fn in_clear_off_host(url: &str) -> bool {
    let Some(rest) = strip_prefix_ignore_case(url.trim(), "http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials before `@` are not the host.
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    !is_loopback_host(host_of(authority))
}

/// The host of `host[:port]` or `[v6][:port]`.
fn host_of(authority: &str) -> &str {
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    match authority.rsplit_once(':') {
        Some((host, _port)) => host,
        None => authority,
    }
}

/// 127.0.0.0/8, ::1 (an IPv4-mapped 127/8 too), or `localhost`: the resolver of every system
/// reconcile runs on maps the name to loopback, and RFC 6761 reserves it for that.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return v4.is_loopback();
    }
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        return v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback());
    }
    false
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// Whether the server is given `--api-key`: service-wide or on any host, as a value or through a
/// `{ from_env: VAR }` reference (not resolved yet when manifests are checked).
fn has_api_key(m: &Manifest) -> bool {
    let set = |flags: &std::collections::BTreeMap<String, FlagValue>| {
        flags
            .get("api-key")
            .is_some_and(|v| !matches!(v, FlagValue::Switch(false)))
    };
    set(&m.sglang.flags)
        || m.hosts.iter().any(|h| set(&h.flags))
        || m.references
            .iter()
            .any(|r| r.target == RefTarget::Flag("api-key".into()))
}

/// The rule: no token over plain HTTP off this machine. `fail` gets each failure's field path
/// (`validate` adds the file and position).
pub(super) fn check(m: &Manifest, fail: &mut dyn FnMut(&[Seg], String)) {
    let api_key = has_api_key(m);
    if let Some(url) = m.verify.url.as_deref().filter(|u| in_clear_off_host(u)) {
        if api_key {
            fail(
                &[Seg::Key("verify"), Seg::Key("url")],
                format!(
                    "`{url}` is plain HTTP to another machine, and every request to the server carries its --api-key: leave out `verify.url` (the server is then reached through an SSH forward to its port), or give a loopback URL"
                ),
            );
        }
    }
    let Some(r) = &m.router else {
        return;
    };
    if r.via.is_some() || !in_clear_off_host(&r.url) {
        return;
    }
    let carried = match (r.admin_key.is_some(), api_key) {
        (true, true) => "the router's admin key and the server's --api-key",
        (true, false) => "the router's admin key",
        (false, true) => "the server's --api-key (it registers the worker)",
        (false, false) => return,
    };
    fail(
        &[Seg::Key("router"), Seg::Key("url")],
        format!(
            "`{}` is plain HTTP to another machine, and the admin API's requests carry {carried}: set `via` to an ssh host that reaches the router (its admin API then goes through an SSH forward), or give a loopback URL",
            r.url
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::in_clear_off_host;
    use crate::manifest::{parse, validate};
    use crate::testing::{assert_each_holds, assert_starts};

    const BASE: &str = "service: q\nhosts: [rl19, rl20]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";
    const WITH_KEY: &str = "service: q\nhosts: [rl19, rl20]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags: { api-key: { from_env: SGLANG_API_KEY } }\n";

    fn errors(text: &str) -> Vec<String> {
        let m = parse("m.yaml", text).unwrap();
        match validate(&m, text) {
            Ok(()) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn plain_http_off_this_machine_is_told_apart_from_loopback_and_tls() {
        for clear in [
            "http://10.0.0.5:30000",
            "HTTP://gpu-a:30000/",
            "http://[fd00::5]:30000",
            "http://128.0.0.1",
            "http://localhost.example.com:1",
            "http://u:p@10.0.0.5:1",
        ] {
            assert!(in_clear_off_host(clear), "{clear}");
        }
        for safe in [
            "http://127.0.0.1:30000",
            "http://127.8.9.10",
            "http://localhost:30000/v1",
            "http://LOCALHOST.",
            "http://[::1]:30000",
            "http://[::ffff:127.0.0.1]:1",
            "https://10.0.0.5:30000",
        ] {
            assert!(!in_clear_off_host(safe), "{safe}");
        }
    }

    #[test]
    fn a_server_key_over_plain_http_to_another_machine_is_refused_at_verify_url() {
        let text = format!("{WITH_KEY}verify:\n  url: http://10.0.0.5:30000\n");
        let e = errors(&text);
        assert_starts(
            &e,
            &[
                "m.yaml:10:3: verify.url: `http://10.0.0.5:30000` is plain HTTP to another machine, and every request to the server carries its --api-key",
            ],
        );
        assert!(e[0].contains("SSH forward"), "{e:?}");
        // A key written on one host only counts too.
        let per_host = format!(
            "{}verify:\n  url: http://10.0.0.5:30000\n",
            BASE.replace(
                "hosts: [rl19, rl20]\n",
                "hosts:\n  - name: rl19\n    flags: { api-key: k }\n"
            )
        );
        assert_eq!(errors(&per_host).len(), 1, "{:?}", errors(&per_host));
    }

    #[test]
    fn a_server_key_to_tls_or_loopback_and_plain_http_without_a_key_are_accepted() {
        for url in [
            "https://10.0.0.5:30000",
            "http://127.0.0.1:30000",
            "http://localhost:30000",
            "http://[::1]:30000",
        ] {
            let text = format!("{WITH_KEY}verify:\n  url: {url}\n");
            assert_eq!(errors(&text), Vec::<String>::new(), "{url}");
        }
        let no_key = format!("{BASE}verify:\n  url: http://10.0.0.5:30000\n");
        assert_eq!(errors(&no_key), Vec::<String>::new());
    }

    #[test]
    fn a_router_key_over_plain_http_to_another_machine_is_refused_unless_it_goes_via_ssh() {
        let router = "router:\n  url: http://10.0.0.9:30000\n  admin_key_env: ROUTER_KEY\n";
        let e = errors(&format!("{BASE}{router}"));
        assert_starts(
            &e,
            &[
                "m.yaml:9:3: router.url: `http://10.0.0.9:30000` is plain HTTP to another machine, and the admin API's requests carry the router's admin key: set `via`",
            ],
        );
        // The worker's own key goes in the body of `POST /workers`.
        let e = errors(&format!(
            "{WITH_KEY}router:\n  url: http://10.0.0.9:30000\n"
        ));
        assert_each_holds(&e, &["the server's --api-key"]);
        // Through an SSH forward, to loopback, or with no key at all: accepted.
        for ok in [
            format!(
                "{BASE}router:\n  url: http://10.0.0.9:30000\n  via: rl18\n  admin_key_env: K\n"
            ),
            format!("{WITH_KEY}router:\n  url: http://10.0.0.9:30000\n  via: rl18\n"),
            format!("{BASE}router:\n  url: http://127.0.0.1:30000\n  admin_key_env: K\n"),
            format!("{BASE}router:\n  url: http://10.0.0.9:30000\n"),
        ] {
            assert_eq!(errors(&ok), Vec::<String>::new(), "{ok}");
        }
    }
}
