//! systemd's `%` specifiers in `ExecStart=` and `Environment=` (systemd.unit(5), "Specifiers").
//! Those the system manager resolves the same way on every host and for every unit are resolved
//! where a unit is read, so that `%h/venv/bin/python` and `/root/venv/bin/python` are one command
//! to a plan. The others (the host's name, machine and boot, the unit's own name) stay as
//! written: only the host knows them.

/// What the system manager substitutes for `%c` on any host: its user's (root's) home, names and
/// ids (systemd's `get_home_dir` answers `/root` for uid 0 without asking NSS; `User=` changes
/// none of them), and its directory roots. Not `%s`, root's shell, which the host's passwd says
/// (`/bin/bash` on the test hosts).
pub fn fixed(c: char) -> Option<&'static str> {
    Some(match c {
        'h' => "/root",
        'u' | 'g' => "root",
        'U' | 'G' => "0",
        't' => "/run",
        'S' => "/var/lib",
        'C' => "/var/cache",
        'L' => "/var/log",
        'E' => "/etc",
        'T' => "/tmp",
        'V' => "/var/tmp",
        _ => return None,
    })
}

/// `raw` as systemd reads it: `%%` a `%`, a fixed specifier its value, any other kept as written.
pub fn resolve_fixed(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(s) => match fixed(s) {
                Some(value) => out.push_str(value),
                None => {
                    out.push('%');
                    out.push(s);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

/// The specifiers written in `raw` (`%%` is none), in order: `(specifier, fixed value)`.
pub fn specifiers(raw: &str) -> Vec<(String, Option<&'static str>)> {
    let mut found = Vec::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('%') => {}
                Some(s) => found.push((format!("%{s}"), fixed(s))),
                None => found.push(("%".into(), None)),
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_specifiers_are_resolved_and_the_rest_kept() {
        assert_eq!(
            resolve_fixed("%h/venv/bin/python3 %%h 100%% %H %n %t/x %"),
            "/root/venv/bin/python3 %h 100% %H %n /run/x %"
        );
        assert_eq!(
            specifiers("%h/x %%y %H"),
            [("%h".to_string(), Some("/root")), ("%H".to_string(), None)]
        );
    }
}
