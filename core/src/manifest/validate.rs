//! Rules a YAML schema cannot express. Every rule runs and every failure is kept, so one run shows
//! an operator all that is wrong in their manifests.

use std::collections::BTreeMap;

use super::error::{ManifestError, ManifestErrors};
use super::locate::{locate, Seg};
use super::{FlagValue, Manifest, RefTarget};

/// Flags the manifest sets through its own fields; giving them again in `flags` would make two
/// sources of truth for the same argument.
const OWN_FIELDS: [(&str, &str); 5] = [
    ("model-path", "sglang.model_path"),
    ("model", "sglang.model_path"),
    ("served-model-name", "sglang.served_model_name"),
    ("host", "sglang.host"),
    ("port", "sglang.port"),
];

/// SGLang's multi-node flags, every option string argparse knows them by (0.4.10 to 0.5.23), with
/// the flag each is: `reconcile` renders them from `nodes:` (see `unit::render`).
const GROUP_FLAGS: [(&str, &str); 4] = [
    ("nnodes", "nnodes"),
    ("node-rank", "node-rank"),
    ("dist-init-addr", "dist-init-addr"),
    ("nccl-init-addr", "dist-init-addr"),
];

/// The multi-node flags a manifest's flag name would set. argparse (`allow_abbrev`, on in
/// SGLang's parser) takes any prefix of an option string as that option when it is the only one,
/// so `nnod` is `--nnodes` and `node` is `--node-rank`; `_` for `-` and capitals are not SGLang
/// flags at all, but are counted here too so no spelling slips past. A prefix several options
/// share (`n`, `dist`) argparse refuses as ambiguous; it is counted here as the multi-node flags
/// it could be, an error either way. No option string of a shipped catalog is itself a prefix of
/// one of these (a test checks), so no other real flag is caught.
pub(crate) fn group_flags(name: &str) -> Vec<&'static str> {
    let name = name.to_ascii_lowercase().replace('_', "-");
    let mut flags: Vec<&'static str> = Vec::new();
    for (option, flag) in GROUP_FLAGS {
        if !name.is_empty() && option.starts_with(&name) && !flags.contains(&flag) {
            flags.push(flag);
        }
    }
    flags
}

/// Unit settings `reconcile` renders itself.
const RENDERED_SETTINGS: [&str; 4] = ["ExecStart", "Environment", "Description", "Type"];

pub fn validate(m: &Manifest, text: &str) -> Result<(), ManifestErrors> {
    let mut check = Checker {
        file: &m.source,
        text,
        errors: Vec::new(),
    };
    check.unit_name(&m.service);
    check.no_control(
        "description",
        &[Seg::Key("description")],
        m.description.as_deref().unwrap_or(""),
    );
    check.hosts(m);
    check.sglang(m);
    check.group(m);
    check.env(&[Seg::Key("env")], &m.env);
    check.settings(&[Seg::Key("systemd")], &m.systemd);
    check.errors.extend(super::reference::check(m));
    if m.verify.guard_margin < crate::guard::MIN_MARGIN {
        check.fail(
            &[Seg::Key("verify"), Seg::Key("guard_margin")],
            format!(
                "guard_margin must be at least {}s: the lease is renewed every quarter of it, and the host's guard looks once a second",
                crate::guard::MIN_MARGIN.as_secs()
            ),
        );
    }
    if let Some(b) = &m.verify.benchmark {
        check.benchmark(b);
    }
    if let Some(q) = &m.verify.quality {
        check.quality(q);
    }
    super::router::check(m, text, &mut |path, message| check.fail(path, message));
    super::bearer::check(m, &mut |path, message| check.fail(path, message));
    super::rollout::check(m, &mut |path, message| check.fail(path, message));
    if let Some(d) = &m.drain {
        check.drain(m, d);
    }
    if let Some(b) = &m.verify.bake {
        check.bake(m, b);
    }
    if check.errors.is_empty() {
        Ok(())
    } else {
        Err(ManifestErrors(check.errors))
    }
}

/// Rules across manifests: two manifests must not render the same unit, or claim the same port, on
/// one host; a server group's rendezvous port (`sglang.dist_init_port`, on its rank 0) is claimed
/// like a server's port.
pub fn validate_fleet(manifests: &[(Manifest, String)]) -> Result<(), ManifestErrors> {
    let mut units: BTreeMap<(String, String), &Manifest> = BTreeMap::new();
    let mut ports: BTreeMap<(String, u16), &Manifest> = BTreeMap::new();
    let mut errors = Vec::new();
    for (m, text) in manifests {
        let key = m.hosts_key();
        for (i, host) in m.hosts.iter().enumerate() {
            let path = [Seg::Key(key), Seg::Index(i)];
            let field = format!("{key}[{i}]");
            let mut clash = |what: String, other: &Manifest| {
                let message = if other.source == m.source {
                    format!("host `{}` is listed twice", host.name)
                } else {
                    format!(
                        "{what} on host `{}` is also claimed by {}",
                        host.name, other.source
                    )
                };
                errors.push(invalid(&m.source, text, &path, &field, message));
            };
            if let Some(other) = units.insert((host.name.clone(), m.unit_name()), m) {
                clash(format!("unit {}", m.unit_name()), other);
            } else if let Some(other) = ports.insert((host.name.clone(), m.sglang.port), m) {
                clash(format!("port {}", m.sglang.port), other);
            }
        }
    }
    errors.extend(group_ports(manifests, &ports));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ManifestErrors(errors))
    }
}

/// The rendezvous ports of server groups: rank 0's process listens there (torch's TCPStore), so
/// two groups with the same rank-0 host and port, or a group's port that another service on that
/// host serves on, cannot both start. Each clash is reported at the later group's
/// `sglang.dist_init_port` (or `nodes` when it keeps the default).
fn group_ports(
    manifests: &[(Manifest, String)],
    ports: &BTreeMap<(String, u16), &Manifest>,
) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut rendezvous: BTreeMap<(String, u16), &Manifest> = BTreeMap::new();
    for (m, text) in manifests {
        let (Some(group), Some(rank0)) = (&m.group, m.hosts.first()) else {
            continue;
        };
        let port = group.dist_init_port;
        let (path, field) = dist_init_port_at(text);
        let mut clash = |message: String| {
            errors.push(invalid(&m.source, text, &path, field, message));
        };
        if let Some(other) = rendezvous.insert((rank0.name.clone(), port), m) {
            clash(format!(
                "dist-init port {port} on host `{}` (rank 0) is also the dist-init port of {}'s server group: give one of them another sglang.dist_init_port",
                rank0.name, other.source
            ));
        } else if let Some(other) = ports
            .get(&(rank0.name.clone(), port))
            .filter(|other| other.source != m.source)
        {
            clash(format!(
                "dist-init port {port} on host `{}` (rank 0) is the sglang.port of {}: give this group another sglang.dist_init_port",
                rank0.name, other.source
            ));
        }
    }
    errors
}

/// Where a group's rendezvous port is decided: `sglang.dist_init_port` when written, else `nodes`
/// (which leaves it at the default).
fn dist_init_port_at(text: &str) -> (Vec<Seg<'static>>, &'static str) {
    let written = vec![Seg::Key("sglang"), Seg::Key("dist_init_port")];
    if written_at(text, &written) {
        (written, "sglang.dist_init_port")
    } else {
        (vec![Seg::Key("nodes")], "nodes")
    }
}

/// Whether the last key of `path` is written: `locate` points at the deepest part it finds, so a
/// key left out gets its parent's position.
fn written_at(text: &str, path: &[Seg]) -> bool {
    locate(text, path).is_some() && locate(text, path) != locate(text, &path[..path.len() - 1])
}

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<ManifestError>,
}

impl Checker<'_> {
    fn fail(&mut self, path: &[Seg], message: impl Into<String>) {
        let field = field_name(path);
        self.errors
            .push(invalid(self.file, self.text, path, &field, message.into()));
    }

    /// Fails each item of the list at `path` that is `bad`, at its index.
    fn fail_each<T>(&mut self, path: &[Seg], items: &[T], bad: impl Fn(&T) -> bool, message: &str) {
        for (i, item) in items.iter().enumerate() {
            if bad(item) {
                let mut at = path.to_vec();
                at.push(Seg::Index(i));
                self.fail(&at, message);
            }
        }
    }

    fn unit_name(&mut self, name: &str) {
        let ok = !name.is_empty()
            && name.len() <= 200
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
            && !name.starts_with(['-', '.']);
        if !ok {
            self.fail(
                &[Seg::Key("service")],
                format!(
                    "`{name}` is not a valid unit name: use letters, digits, `-`, `_`, `.` and `:`"
                ),
            );
        }
    }

    /// Unit files are line-based: a newline would end the setting, a NUL would truncate it.
    fn no_control(&mut self, what: &str, path: &[Seg], value: &str) -> bool {
        let bad = value.chars().find(|c| matches!(c, '\n' | '\r' | '\0'));
        if let Some(c) = bad {
            self.fail(
                path,
                format!(
                    "{what} holds a {}, which a unit file cannot carry",
                    control_name(c)
                ),
            );
        }
        bad.is_none()
    }

    fn hosts(&mut self, m: &Manifest) {
        let key = m.hosts_key();
        if m.hosts.is_empty() {
            self.fail(&[Seg::Key(key)], "list at least one host");
        }
        for (i, host) in m.hosts.iter().enumerate() {
            let name_path = [Seg::Key(key), Seg::Index(i)];
            let valid = !host.name.is_empty()
                && !host.name.starts_with('-')
                && host
                    .name
                    .chars()
                    .all(|c| c.is_ascii_graphic() && !matches!(c, '\'' | '"' | '\\' | '`' | '$'));
            if !valid {
                self.fail(
                    &name_path,
                    format!(
                        "`{}` is not an ssh destination (name, user@host[:port] or local)",
                        host.name
                    ),
                );
            }
            let base = [Seg::Key(key), Seg::Index(i)];
            self.env(&[base[0], base[1], Seg::Key("env")], &host.env);
            self.flags(&[base[0], base[1], Seg::Key("flags")], &host.flags);
            self.settings(&[base[0], base[1], Seg::Key("systemd")], &host.systemd);
        }
    }

    fn sglang(&mut self, m: &Manifest) {
        let s = &m.sglang;
        let at = |key| [Seg::Key("sglang"), Seg::Key(key)];
        if !s.python.starts_with('/') {
            self.fail(
                &at("python"),
                format!(
                    "`{}` must be an absolute path (systemd runs no shell to find it)",
                    s.python
                ),
            );
        }
        self.no_control("python", &at("python"), &s.python);
        if let Some(script) = &s.console_script {
            if !script.starts_with('/') {
                self.fail(
                    &at("console_script"),
                    format!(
                        "`{script}` must be an absolute path (systemd runs no shell to find it)"
                    ),
                );
            }
            self.no_control("console_script", &at("console_script"), script);
        }
        if s.version.is_empty()
            || !s
                .version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.')
        {
            self.fail(
                &at("version"),
                format!("`{}` is not an SGLang version like 0.5.23", s.version),
            );
        }
        if let Some(w) = &s.pinned {
            self.pinned(w);
        } else {
            if s.model_path.is_empty() {
                self.fail(&at("model_path"), "must not be empty");
            }
            self.no_control("model_path", &at("model_path"), &s.model_path);
        }
        if let Some(name) = &s.served_model_name {
            self.no_control("served_model_name", &at("served_model_name"), name);
        }
        if let Some(host) = &s.host {
            self.no_control("host", &at("host"), host);
        }
        if s.port == 0 {
            self.fail(&at("port"), "port must be between 1 and 65535");
        }
        self.flags(&at("flags"), &s.flags);
    }

    /// `sglang.model:`: a hub repository at a full commit id (a branch moves), or a store folder
    /// at a revision name; names that make one folder on every host.
    fn pinned(&mut self, w: &crate::pinned::PinnedModel) {
        use crate::pinned::{is_commit, Source};
        let at = |key| [Seg::Key("sglang"), Seg::Key("model"), Seg::Key(key)];
        let plain = |text: &str| {
            !text.is_empty()
                && !text.starts_with('.')
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        match &w.source {
            Source::Hub { repo, endpoint } => {
                let ok = repo
                    .split_once('/')
                    .is_some_and(|(org, name)| plain(org) && plain(name));
                if !ok {
                    self.fail(
                        &at("hub"),
                        format!("`{repo}` is not a hub repository like `Qwen/Qwen3.5-122B-A10B`"),
                    );
                }
                if !is_commit(&w.revision) {
                    self.fail(
                        &at("revision"),
                        format!(
                            "`{}` is not a commit: pin a hub model by its full commit id (40 hex digits; a branch or tag moves)",
                            w.revision
                        ),
                    );
                }
                let scheme = endpoint
                    .strip_prefix("https://")
                    .or_else(|| endpoint.strip_prefix("http://"));
                if !scheme
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace))
                {
                    self.fail(
                        &at("endpoint"),
                        format!("`{endpoint}` is not an http:// or https:// URL"),
                    );
                }
            }
            Source::Store { path } => {
                if !path.starts_with('/') || path.trim_end_matches('/').is_empty() {
                    self.fail(
                        &at("store"),
                        format!("`{path}` must be an absolute path to a model's folder"),
                    );
                } else {
                    self.no_control("store", &at("store"), path);
                }
                if !plain(&w.revision) {
                    self.fail(
                        &at("revision"),
                        format!(
                            "`{}` is not a revision name: letters, digits, `-`, `_` and `.`",
                            w.revision
                        ),
                    );
                }
            }
        }
        if !w.root.starts_with('/') {
            self.fail(
                &at("root"),
                format!("`{}` must be an absolute path", w.root),
            );
        } else {
            self.no_control("root", &at("root"), &w.root);
        }
        if w.keep == 0 {
            self.fail(
                &at("keep"),
                "keep at least 1 revision: the one the host runs",
            );
        }
        if w.at_once == 0 {
            self.fail(&at("at_once"), "at least 1 host must fetch at once");
        }
        if let Some(peers) = &w.peers {
            if peers.port == 0 {
                self.fail(
                    &[
                        Seg::Key("sglang"),
                        Seg::Key("model"),
                        Seg::Key("peers"),
                        Seg::Key("port"),
                    ],
                    "port must be between 1 and 65535",
                );
            }
            if matches!(w.source, Source::Store { .. }) {
                self.fail(
                    &at("peers"),
                    "every host reads a store itself: peers serve a hub revision to each other",
                );
            }
        }
        if w.rate == Some(0) {
            self.fail(
                &at("rate"),
                "a rate of 0 fetches nothing: leave it out for no limit",
            );
        }
        for (i, pattern) in w.include.iter().enumerate() {
            if pattern.is_empty() {
                self.fail(
                    &[
                        Seg::Key("sglang"),
                        Seg::Key("model"),
                        Seg::Key("include"),
                        Seg::Index(i),
                    ],
                    "an empty pattern matches nothing",
                );
            }
        }
    }

    /// `nodes:` and the multi-node flags: a group has at least two distinct nodes that can reach
    /// rank 0, and `--nnodes`, `--node-rank` and `--dist-init-addr` are rendered from it, never
    /// set by hand (with `hosts:`, a hand-set rank or rendezvous would make each host wait for
    /// peers `reconcile` does not know of).
    fn group(&mut self, m: &Manifest) {
        let key = m.hosts_key();
        let mut sets: Vec<(Vec<Seg>, &str, Option<&FlagValue>)> = Vec::new();
        for (name, value) in &m.sglang.flags {
            sets.push((
                vec![Seg::Key("sglang"), Seg::Key("flags"), Seg::Key(name)],
                name,
                Some(value),
            ));
        }
        for (i, host) in m.hosts.iter().enumerate() {
            for (name, value) in &host.flags {
                sets.push((
                    vec![
                        Seg::Key(key),
                        Seg::Index(i),
                        Seg::Key("flags"),
                        Seg::Key(name),
                    ],
                    name,
                    Some(value),
                ));
            }
        }
        // `{ from_env: VAR }` flags are not in the maps until the loader resolves them.
        for r in &m.references {
            if let RefTarget::Flag(name) = &r.target {
                let mut path = match r.host {
                    None => vec![Seg::Key("sglang")],
                    Some(i) => vec![Seg::Key(key), Seg::Index(i)],
                };
                path.extend([Seg::Key("flags"), Seg::Key(name)]);
                sets.push((path, name, None));
            }
        }
        for (path, name, value) in sets {
            // `false` (or `~`) renders nothing: it sets no flag.
            if value == Some(&FlagValue::Switch(false)) {
                continue;
            }
            let flags = group_flags(name);
            if flags.is_empty() {
                continue;
            }
            let spelled = name.to_ascii_lowercase().replace('_', "-");
            let exact = GROUP_FLAGS.iter().find(|(option, _)| *option == spelled);
            let what = match (flags.as_slice(), exact) {
                ([flag], Some((option, _))) if name == *flag && option == flag => {
                    format!("--{flag}")
                }
                ([flag], Some((option, _))) if option == flag => format!("`{name}` (--{flag})"),
                ([flag], Some((option, _))) => {
                    format!("`{name}` (--{option}, the alias of --{flag})")
                }
                ([flag], None) => format!("`{name}` (an abbreviation of --{flag})"),
                (many, _) => format!(
                    "`{name}` (an abbreviation of {})",
                    many.iter()
                        .map(|f| format!("--{f}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let message = if m.group.is_some() {
                format!("{what} is rendered from `nodes:` (--nnodes, --node-rank, --dist-init-addr); remove it from flags")
            } else if flags == ["nnodes"] {
                match value.map(flag_int) {
                    // `nnodes: 1` is SGLang's default, a server on one host.
                    Some(Some(n)) if n <= 1 => continue,
                    Some(Some(n)) => format!(
                        "{what} {n}: a server over several hosts is `nodes:` (list its hosts there in rank order; reconcile renders --nnodes, --node-rank and --dist-init-addr)"
                    ),
                    // Not a number: the flag check against the SGLang catalog reports it.
                    Some(None) => continue,
                    // `{ from_env }`: a count nobody reads before the server waits for its peers.
                    None => format!(
                        "{what} from the environment could be any count of hosts: a server over several hosts is `nodes:`; one host needs no --nnodes"
                    ),
                }
            } else {
                format!(
                    "{what} is for a server over several hosts, which is `nodes:` (reconcile renders --nnodes, --node-rank and --dist-init-addr from it); remove it from flags"
                )
            };
            self.fail(&path, message);
        }
        let Some(group) = &m.group else {
            return;
        };
        if m.hosts.len() < 2 {
            self.fail(
                &[Seg::Key("nodes")],
                "a server group needs at least 2 nodes; one host is `hosts:`",
            );
        }
        for (i, host) in m.hosts.iter().enumerate() {
            if let Some(first) = m.hosts[..i].iter().position(|h| h.name == host.name) {
                self.fail(
                    &[Seg::Key("nodes"), Seg::Index(i)],
                    format!(
                        "node `{}` is listed twice (nodes[{first}] and nodes[{i}]): each rank is its own host",
                        host.name
                    ),
                );
            }
        }
        for (i, address) in group.addresses.iter().enumerate() {
            let written = [Seg::Key("nodes"), Seg::Index(i), Seg::Key("address")];
            let path: &[Seg] = if written_at(self.text, &written) {
                &written
            } else {
                &written[..2]
            };
            if let Some(problem) = address_problem(address, &m.hosts[i].name, path.len() == 3) {
                self.fail(path, problem);
            }
        }
        let at = [Seg::Key("sglang"), Seg::Key("dist_init_port")];
        if group.dist_init_port == 0 {
            self.fail(&at, "dist_init_port must be between 1 and 65535");
        } else if group.dist_init_port == m.sglang.port {
            self.fail(
                &at,
                format!(
                    "dist_init_port {} is also sglang.port: rank 0 serves the API there and cannot take the group's rendezvous on it too",
                    group.dist_init_port
                ),
            );
        }
    }

    fn flags(&mut self, base: &[Seg], flags: &BTreeMap<String, FlagValue>) {
        for (name, value) in flags {
            let path = with(base, name);
            if name.starts_with('-') {
                self.fail(
                    &path,
                    format!(
                        "write the flag without dashes: `{}`",
                        name.trim_start_matches('-')
                    ),
                );
                continue;
            }
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                || name.is_empty()
            {
                self.fail(&path, format!("`{name}` is not a flag name"));
                continue;
            }
            if let Some((_, field)) = OWN_FIELDS.iter().find(|(flag, _)| flag == name) {
                self.fail(
                    &path,
                    format!("--{name} is set through `{field}`; remove it from flags"),
                );
            }
            let values: Vec<&String> = match value {
                FlagValue::Switch(_) => vec![],
                FlagValue::Value(v) => vec![v],
                FlagValue::List(items) => items.iter().collect(),
            };
            if let FlagValue::List(items) = value {
                if items.is_empty() {
                    self.fail(
                        &path,
                        "an empty list gives the flag no value; use false to leave it out",
                    );
                }
            }
            for v in values {
                self.no_control("the value", &path, v);
            }
        }
    }

    fn env(&mut self, base: &[Seg], env: &BTreeMap<String, String>) {
        for (name, value) in env {
            let path = with(base, name);
            if !crate::is_identifier(name) {
                self.fail(
                    &path,
                    format!(
                        "`{name}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
                    ),
                );
            }
            self.no_control("the value", &path, value);
        }
    }

    /// `verify.benchmark`: numbers a load test can run with, and one way to size a level.
    fn quality(&mut self, q: &crate::quality::QualitySpec) {
        let at = |key| [Seg::Key("verify"), Seg::Key("quality"), Seg::Key(key)];
        if !(1..=256).contains(&q.prompts) {
            self.fail(&at("prompts"), "prompts must be between 1 and 256");
        }
        if !(1..=4096).contains(&q.max_new_tokens) {
            self.fail(
                &at("max_new_tokens"),
                "max_new_tokens must be between 1 and 4096",
            );
        }
        if !(q.factor.is_finite() && q.factor >= 1.0) {
            self.fail(
                &at("factor"),
                "factor must be a number of at least 1 (the noise floor times it)",
            );
        }
        if !(q.min_kl.is_finite() && q.min_kl >= 0.0) {
            self.fail(&at("min_kl"), "min_kl must be a number of at least 0");
        }
        if !(q.max_pass_drop.is_finite() && (0.0..=100.0).contains(&q.max_pass_drop)) {
            self.fail(
                &at("max_pass_drop"),
                "max_pass_drop is percentage points, between 0 and 100",
            );
        }
        for (key, file) in [
            ("prompts_file", q.prompts_file.as_ref().map(|f| &f.path)),
            ("texts_file", q.texts_file.as_ref().map(|f| &f.path)),
            ("cases", q.cases.as_ref().map(|f| &f.path)),
        ] {
            if file.is_some_and(|p| p.trim().is_empty()) {
                self.fail(&at(key), format!("{key} names no file"));
            }
        }
        // SGLang's own logprob tests ask for up to 20 (`top_logprobs_num`); past 100 the
        // reference grows for little: the KL's tail bucket already holds the rest.
        if !(1..=100).contains(&q.top_logprobs) {
            self.fail(
                &at("top_logprobs"),
                "top_logprobs is how many tokens a position keeps, between 1 and 100",
            );
        }
        // `verify.quality.<part>.<key>`.
        let part = |part, key| {
            [
                Seg::Key("verify"),
                Seg::Key("quality"),
                Seg::Key(part),
                Seg::Key(key),
            ]
        };
        if let Some(l) = &q.long_context {
            let long = |key| part("long_context", key);
            self.fail_each(&long("lengths"), &l.lengths, |length| *length < 256, "a long-context length is at least 256 words (several keys, a chain and a list need room)");
            if l.tasks.is_empty() {
                self.fail(
                    &long("tasks"),
                    "list at least one task (multi_key, variable_tracking, common_words)",
                );
            }
            if !(1..=20).contains(&l.samples) {
                self.fail(
                    &long("samples"),
                    "samples is prompts per task and length, between 1 and 20",
                );
            }
        }
        if let Some(n) = &q.needle {
            let needle = |key| part("needle", key);
            self.fail_each(
                &needle("lengths"),
                &n.lengths,
                |length| *length < 64,
                "a needle length is at least 64 tokens (the key and the question need room)",
            );
            if n.depths.is_empty() {
                self.fail(&needle("depths"), "list at least one depth (0.1, 0.5, 0.9)");
            }
            self.fail_each(
                &needle("depths"),
                &n.depths,
                |depth| !(depth.is_finite() && *depth > 0.0 && *depth < 1.0),
                "a depth is a fraction of the prompt, above 0 and below 1",
            );
        }
    }

    fn benchmark(&mut self, b: &super::BenchmarkSpec) {
        let at = |key| [Seg::Key("verify"), Seg::Key("benchmark"), Seg::Key(key)];
        if b.levels.is_empty() {
            self.fail(&at("levels"), "list at least one concurrency level");
        }
        self.fail_each(
            &at("levels"),
            &b.levels,
            |level| !(1..=4096).contains(level),
            "a concurrency level must be between 1 and 4096",
        );
        let mut sorted = b.levels.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != b.levels.len() {
            self.fail(&at("levels"), "a concurrency level is listed twice");
        }
        for (key, value) in [
            ("prompt_tokens", b.prompt_tokens),
            ("output_tokens", b.output_tokens),
        ] {
            if !(1..=1_000_000).contains(&value) {
                self.fail(&at(key), format!("{key} must be between 1 and 1000000"));
            }
        }
        if b.requests == Some(0) {
            self.fail(&at("requests"), "requests must be at least 1");
        }
        if b.requests.is_some() && b.duration.is_some() {
            self.fail(
                &at("duration"),
                "give `requests` or `duration` per level, not both",
            );
        }
        if b.duration.is_some_and(|d| d.is_zero()) {
            self.fail(&at("duration"), "duration must be longer than 0s");
        }
        if !(b.max_regression >= 0.0 && b.max_regression < 100.0) {
            self.fail(
                &at("max_regression"),
                "max_regression is a percentage: at least 0 and under 100",
            );
        }
    }

    /// `drain:` reads the server's `/metrics`: without `--enable-metrics` on every host a drain
    /// could not see the requests it waits for.
    fn drain(&mut self, m: &Manifest, d: &super::DrainSpec) {
        if d.timeout.is_zero() {
            self.fail(
                &[Seg::Key("drain"), Seg::Key("timeout")],
                "timeout must be longer than 0s (leave `drain:` out to restart at once)",
            );
        }
        self.metrics_on(m, &[Seg::Key("drain")], "drain reads the server's /metrics");
    }

    /// `verify.bake`: a window to judge, limits that can pass, replicas behind a router to judge
    /// against, and `/metrics` on every one of them.
    fn bake(&mut self, m: &Manifest, b: &super::BakeSpec) {
        let at = |key| [Seg::Key("verify"), Seg::Key("bake"), Seg::Key(key)];
        if b.duration.is_zero() {
            self.fail(&at("duration"), "duration must be longer than 0s");
        }
        if b.min_requests == 0 {
            self.fail(&at("min_requests"), "min_requests must be at least 1");
        }
        if !(b.max_error_rate_increase >= 0.0 && b.max_error_rate_increase < 100.0) {
            self.fail(
                &at("max_error_rate_increase"),
                "max_error_rate_increase is in percentage points: at least 0 and under 100",
            );
        }
        // NaN is no ratio either.
        if b.max_latency_ratio.is_nan() || b.max_latency_ratio < 1.0 {
            self.fail(
                &at("max_latency_ratio"),
                "max_latency_ratio must be at least 1 (the stable replicas' latency)",
            );
        }
        if b.max_throughput_ratio.is_nan() || b.max_throughput_ratio < 1.0 {
            self.fail(
                &at("max_throughput_ratio"),
                "max_throughput_ratio must be at least 1 (the stable replicas' throughput)",
            );
        }
        if !(b.confidence >= 0.5 && b.confidence < 1.0) {
            self.fail(
                &at("confidence"),
                "confidence is a probability from 0.5 (a coin) to under 1 (0.99 by default)",
            );
        }
        let bake = [Seg::Key("verify"), Seg::Key("bake")];
        if m.router.is_none() {
            self.fail(
                &bake,
                "bake judges the canary against the stable replicas of a router: add `router:`",
            );
        }
        self.metrics_on(m, &bake, "bake reads the replicas' /metrics");
    }

    /// What reads `/metrics` (`path`, doing `what`) needs `--enable-metrics` on every host:
    /// SGLang mounts it only then (`entrypoints/http_server.py`, `add_prometheus_middleware`).
    fn metrics_on(&mut self, m: &Manifest, path: &[Seg<'_>], what: &str) {
        let on = |flags: &BTreeMap<String, FlagValue>| {
            flags
                .get("enable-metrics")
                .map(|v| *v == FlagValue::Switch(true))
        };
        let service = on(&m.sglang.flags).unwrap_or(false);
        let off: Vec<&str> = m
            .hosts
            .iter()
            .filter(|h| !on(&h.flags).unwrap_or(service))
            .map(|h| h.name.as_str())
            .collect();
        if off.len() == m.hosts.len() && !off.is_empty() {
            self.fail(
                path,
                format!("{what}, which SGLang serves only with --enable-metrics: add `enable-metrics: true` to sglang.flags"),
            );
        } else if !off.is_empty() {
            self.fail(
                path,
                format!(
                    "{what}, which SGLang serves only with --enable-metrics, and host {} turns it off",
                    off.join(", ")
                ),
            );
        }
    }

    fn settings(&mut self, base: &[Seg], settings: &BTreeMap<String, String>) {
        for (key, value) in settings {
            let path = with(base, key);
            let valid = key.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && key.chars().all(|c| c.is_ascii_alphanumeric());
            if !valid {
                self.fail(
                    &path,
                    format!("`{key}` is not a systemd setting name (like User or LimitNOFILE)"),
                );
            } else if RENDERED_SETTINGS.contains(&key.as_str()) {
                self.fail(
                    &path,
                    format!("{key}= is rendered from the manifest's own fields; remove it here"),
                );
            }
            self.no_control("the value", &path, value);
        }
    }
}

/// A flag's one value read as Python's `int()` would (SGLang's `type=int`), if it is one.
fn flag_int(value: &FlagValue) -> Option<i128> {
    let FlagValue::Value(text) = value else {
        return None;
    };
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    let ok = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
    ok.then(|| t.replace('_', "").parse().ok()).flatten()
}

/// Why a node's address cannot be rank 0's rendezvous host (or a peer's), if it cannot.
fn address_problem(address: &str, name: &str, written: bool) -> Option<String> {
    let from = if written {
        String::from("the address")
    } else {
        format!("the address taken from the node's name `{name}`")
    };
    if address.is_empty() {
        return Some(format!("{from} is empty"));
    }
    if address == "local" && !written {
        return Some(
            "`local` is this machine to reconcile, not an address the other ranks can reach: give the node an `address:`".into(),
        );
    }
    if let Some(c) = address
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '@' | '[' | ']'))
    {
        return Some(format!(
            "{from} `{address}` holds {c:?}: give a host name or an IP address"
        ));
    }
    if address.matches(':').count() == 1 {
        return Some(format!(
            "{from} `{address}` has a port: the port is sglang.dist_init_port, give the host alone"
        ));
    }
    None
}

fn with<'a>(base: &[Seg<'a>], key: &'a str) -> Vec<Seg<'a>> {
    let mut path = base.to_vec();
    path.push(Seg::Key(key));
    path
}

pub(super) fn invalid(
    file: &str,
    text: &str,
    path: &[Seg],
    field: &str,
    message: String,
) -> ManifestError {
    ManifestError::Invalid {
        file: file.to_string(),
        position: locate(text, path),
        field: field.to_string(),
        message,
    }
}

fn field_name(path: &[Seg]) -> String {
    let mut name = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if name.is_empty() => name.push_str(k),
            Seg::Key(k) => {
                name.push('.');
                name.push_str(k);
            }
            Seg::Index(i) => name.push_str(&format!("[{i}]")),
        }
    }
    name
}

fn control_name(c: char) -> &'static str {
    match c {
        '\n' => "newline",
        '\r' => "carriage return",
        _ => "NUL byte",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::testing::{
        assert_any, assert_any_starts, assert_each_holds, assert_holds, assert_starts,
    };

    fn errors(text: &str) -> Vec<String> {
        let m = parse("m.yaml", text).unwrap();
        match validate(&m, text) {
            Ok(()) => vec![],
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    const BASE: &str = "service: s\nhosts: [a]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";

    #[test]
    fn a_good_manifest_passes() {
        assert!(errors(BASE).is_empty());
    }

    const PINNED: &str = "service: s\nhosts: [a]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model:\n    hub: Qwen/Qwen3.5-122B-A10B\n    revision: 0123456789abcdef0123456789abcdef01234567\n  port: 30000\n";

    #[test]
    fn a_pinned_model_runs_from_its_pinned_copy_under_its_hub_name() {
        assert!(errors(PINNED).is_empty(), "{:#?}", errors(PINNED));
        let m = parse("m.yaml", PINNED).unwrap();
        assert_eq!(
            m.sglang.model_path,
            "/var/lib/reconcile-weights/Qwen--Qwen3.5-122B-A10B/0123456789abcdef0123456789abcdef01234567"
        );
        assert_eq!(m.model_id(), "Qwen/Qwen3.5-122B-A10B");
        let w = m.sglang.pinned.unwrap();
        assert_eq!(w.keep, 2);
        assert_eq!(
            w.source,
            crate::pinned::Source::Hub {
                repo: "Qwen/Qwen3.5-122B-A10B".into(),
                endpoint: "https://huggingface.co".into()
            }
        );
    }

    #[test]
    fn a_pin_by_branch_a_store_with_an_endpoint_and_keep_zero_are_refused_at_their_lines() {
        let branch = errors(&PINNED.replace("0123456789abcdef0123456789abcdef01234567", "main"));
        assert_starts(
            &branch,
            &["m.yaml:8:5: sglang.model.revision: `main` is not a commit"],
        );
        let zero = errors(&PINNED.replace("  port:", "    keep: 0\n    rate: 0\n  port:"));
        assert_eq!(zero.len(), 2, "{zero:#?}");
        assert!(
            zero[0].contains("sglang.model.keep: keep at least 1"),
            "{zero:#?}"
        );
        let refused = |text: &str| {
            let e = parse("m.yaml", text).unwrap_err();
            e.0.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let both = refused(&PINNED.replace("  port:", "  model_path: /m\n  port:"));
        assert_holds(&both, "sglang.model: give `model_path:`");
        let store = "service: s\nhosts: [a]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model:\n    store: /shared/models/Qwen3.5-122B-A10B\n    revision: 2026-11-30\n    endpoint: http://hub\n  port: 30000\n";
        let e = refused(store);
        assert_holds(&e, "m.yaml:9:5: sglang.model.endpoint");
        let plain = store.replace("    endpoint: http://hub\n", "");
        let m = parse("m.yaml", &plain).unwrap();
        assert_eq!(m.model_id(), "/shared/models/Qwen3.5-122B-A10B");
        assert_eq!(
            m.sglang.model_path,
            "/var/lib/reconcile-weights/Qwen3.5-122B-A10B/2026-11-30"
        );
    }

    #[test]
    fn every_error_in_a_file_is_reported_with_its_position() {
        let text = "service: bad/name\nhosts: [a]\nsglang:\n  python: python3\n  version: 0.5.23\n  model_path: /m\n  port: 70000\n  flags:\n    port: 1\nenv: { 1X: a, OK: \"line\\nbreak\" }\n";
        let e = errors(text);
        assert_eq!(e.len(), 6, "{e:#?}");
        let script = errors(&BASE.replace("sglang:\n", "sglang:\n  console_script: sglang\n"));
        assert_each_holds(
            &script,
            &["sglang.console_script: `sglang` must be an absolute path"],
        );
        assert!(
            e[0].starts_with("m.yaml:1:1: service: `bad/name` is not a valid unit name"),
            "{}",
            e[0]
        );
        assert_any_starts(&e, "m.yaml:4:3: sglang.python:");
        assert_any_starts(
            &e,
            "m.yaml:7:3: sglang.port: port must be between 1 and 65535",
        );
        assert_any(&e, "sglang.flags.port: --port is set through `sglang.port`");
        assert!(
            e.iter()
                .any(|e| e
                    .starts_with("m.yaml:10:8: env.1X: `1X` is not an environment variable name")),
            "{e:#?}"
        );
        assert_any_starts(&e, "m.yaml:10:15: env.OK: the value holds a newline");
    }

    #[test]
    fn nul_and_managed_settings_are_refused() {
        let text = format!("{BASE}systemd: {{ ExecStart: /bin/x, User: \"ro\\0ot\" }}\n");
        let e = errors(&text);
        assert_any(&e, "systemd.ExecStart: ExecStart= is rendered");
        assert_any(&e, "systemd.User: the value holds a NUL byte");
    }

    #[test]
    fn host_destinations_cannot_smuggle_ssh_options() {
        let e = errors(&BASE.replace("hosts: [a]", "hosts: [\"-oProxyCommand=x\"]"));
        assert_any(&e, "hosts[0]: `-oProxyCommand=x` is not an ssh destination");
    }

    #[test]
    fn two_manifests_with_the_same_unit_on_one_host_clash() {
        let a = parse("a.yaml", BASE).unwrap();
        let b = parse("b.yaml", &BASE.replace("port: 30000", "port: 30001")).unwrap();
        let e = validate_fleet(&[(a, BASE.into()), (b, BASE.into())]).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert!(
            e.0[0]
                .to_string()
                .contains("unit s.service on host `a` is also claimed by a.yaml"),
            "{}",
            e.0[0]
        );
    }

    #[test]
    fn two_services_on_one_port_clash() {
        let a = parse("a.yaml", BASE).unwrap();
        let b = parse("b.yaml", &BASE.replace("service: s", "service: t")).unwrap();
        let e = validate_fleet(&[(a, BASE.into()), (b, BASE.into())]).unwrap_err();
        assert!(
            e.0[0]
                .to_string()
                .contains("port 30000 on host `a` is also claimed by a.yaml"),
            "{}",
            e.0[0]
        );
    }

    const GROUP: &str = "service: g\nnodes: [a, b]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n";

    #[test]
    fn a_server_group_passes() {
        assert!(errors(GROUP).is_empty());
        let text = GROUP.replace(
            "nodes: [a, b]",
            "nodes:\n  - a\n  - name: local\n    address: 10.0.0.2\n  - root@[fd00::3]:22",
        );
        assert!(errors(&text).is_empty(), "{:?}", errors(&text));
    }

    #[test]
    fn a_group_has_two_distinct_nodes_at_least() {
        let e = errors(&GROUP.replace("nodes: [a, b]", "nodes: [a]"));
        assert_eq!(
            e,
            ["m.yaml:2:8: nodes: a server group needs at least 2 nodes; one host is `hosts:`"]
        );
        let e = errors(&GROUP.replace("nodes: [a, b]", "nodes:\n  - a\n  - b\n  - a"));
        assert_starts(
            &e,
            &["m.yaml:5:5: nodes[2]: node `a` is listed twice (nodes[0] and nodes[2])"],
        );
    }

    #[test]
    fn a_node_needs_an_address_the_other_ranks_can_reach() {
        let text = GROUP.replace(
            "nodes: [a, b]",
            "nodes:\n  - local\n  - name: b\n    address: 10.0.0.2:20000",
        );
        let e = errors(&text);
        assert_starts(
            &e,
            &[
                "m.yaml:3:5: nodes[0]: `local` is this machine to reconcile",
                "m.yaml:5:5: nodes[1].address: the address `10.0.0.2:20000` has a port",
            ],
        );
    }

    #[test]
    fn multi_node_flags_are_rendered_from_nodes_in_every_spelling() {
        let text = GROUP.replace(
            "nodes: [a, b]",
            "nodes:\n  - a\n  - name: b\n    flags: { node_rank: 1, dist-init: x }",
        ) + "  flags:\n    nnodes: 2\n    nccl-init-addr: a:1\n    tp-size: 2\n    no-such: false\n";
        let e = errors(&text);
        assert_starts(
            &e,
            &[
                "m.yaml:13:5: sglang.flags.nccl-init-addr: `nccl-init-addr` (--nccl-init-addr, the alias of --dist-init-addr) is rendered from `nodes:`",
                "m.yaml:12:5: sglang.flags.nnodes: --nnodes is rendered from `nodes:`",
                "m.yaml:5:28: nodes[1].flags.dist-init: `dist-init` (an abbreviation of --dist-init-addr) is rendered from `nodes:`",
                "m.yaml:5:14: nodes[1].flags.node_rank: `node_rank` (--node-rank) is rendered from `nodes:`",
            ],
        );
        // One written `{ from_env }`, not yet in the flags.
        let text = format!("{GROUP}  flags:\n    dist-init-addr: {{ from_env: ADDR }}\n");
        let e = errors(&text);
        assert_starts(
            &e,
            &[
                "m.yaml:9:21: sglang.flags.dist-init-addr: --dist-init-addr is rendered from `nodes:`",
            ],
        );
    }

    #[test]
    fn with_hosts_a_multi_node_flag_points_to_nodes() {
        let text = BASE.replace(
            "hosts: [a]",
            "hosts:\n  - name: a\n    flags: { node-rank: 0 }",
        ) + "  flags:\n    nn: 2\n    dist-init-addr: a:5000\n";
        let e = errors(&text);
        assert_starts(
            &e,
            &[
                "m.yaml:12:5: sglang.flags.dist-init-addr: --dist-init-addr is for a server over several hosts, which is `nodes:`",
                "m.yaml:11:5: sglang.flags.nn: `nn` (an abbreviation of --nnodes) 2: a server over several hosts is `nodes:`",
                "m.yaml:4:14: hosts[0].flags.node-rank: --node-rank is for a server over several hosts, which is `nodes:`",
            ],
        );
        // One node is SGLang's default; `false` sets nothing.
        let fine = format!("{BASE}  flags: {{ nnodes: 1, node-rank: false }}\n");
        assert!(errors(&fine).is_empty(), "{:?}", errors(&fine));
        let e = errors(&format!("{BASE}  flags:\n    nnodes: {{ from_env: N }}\n"));
        assert_starts(
            &e,
            &["m.yaml:9:13: sglang.flags.nnodes: --nnodes from the environment"],
        );
    }

    #[test]
    fn the_rendezvous_port_is_not_the_api_port() {
        let e = errors(&format!("{GROUP}  dist_init_port: 30000\n"));
        assert_starts(
            &e,
            &["m.yaml:8:3: sglang.dist_init_port: dist_init_port 30000 is also sglang.port"],
        );
        let e = errors(&format!("{GROUP}  dist_init_port: 70000\n"));
        assert_eq!(
            e,
            ["m.yaml:8:3: sglang.dist_init_port: dist_init_port must be between 1 and 65535"]
        );
        assert!(errors(&format!("{GROUP}  dist_init_port: 29500\n")).is_empty());
    }

    /// The prefix rule of `group_flags` against every flag SGLang ships: no other real option
    /// string is caught, and every one of the multi-node flags' option strings is, with each of its
    /// prefixes.
    #[test]
    fn the_multi_node_flags_catch_no_other_sglang_flag() {
        use crate::sglang::Catalog;
        for version in Catalog::versions() {
            let catalog = Catalog::for_version(version).unwrap();
            for option in catalog.option_strings() {
                let reserved = GROUP_FLAGS.iter().any(|(o, _)| *o == option);
                assert_eq!(
                    !group_flags(option).is_empty(),
                    reserved,
                    "--{option} in SGLang {version}"
                );
                if reserved {
                    for end in 1..=option.len() {
                        assert!(!group_flags(&option[..end]).is_empty());
                        assert!(!group_flags(&option[..end].replace('-', "_")).is_empty());
                    }
                }
            }
        }
    }

    fn fleet(files: &[(&str, &str)]) -> Vec<String> {
        let manifests: Vec<(Manifest, String)> = files
            .iter()
            .map(|(name, text)| (parse(name, text).unwrap(), text.to_string()))
            .collect();
        match validate_fleet(&manifests) {
            Ok(()) => vec![],
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn two_groups_cannot_share_a_rendezvous_on_one_host() {
        let other = GROUP
            .replace("service: g", "service: h")
            .replace("port: 30000", "port: 30001");
        assert_eq!(
            fleet(&[("a.yaml", GROUP), ("b.yaml", &other)]),
            ["b.yaml:2:8: nodes: dist-init port 20000 on host `a` (rank 0) is also the dist-init port of a.yaml's server group: give one of them another sglang.dist_init_port"]
        );
        let written = format!("{other}  dist_init_port: 20000\n");
        let e = fleet(&[("a.yaml", GROUP), ("b.yaml", &written)]);
        assert_starts(
            &e,
            &["b.yaml:8:3: sglang.dist_init_port: dist-init port 20000"],
        );
        // Another port, or another rank 0, is another rendezvous.
        let moved = format!("{other}  dist_init_port: 20001\n");
        assert!(fleet(&[("a.yaml", GROUP), ("b.yaml", &moved)]).is_empty());
        let swapped = other.replace("nodes: [a, b]", "nodes: [b, a]");
        assert!(fleet(&[("a.yaml", GROUP), ("b.yaml", &swapped)]).is_empty());
    }

    #[test]
    fn a_rendezvous_port_cannot_be_another_services_port_on_rank_zero() {
        let server = BASE
            .replace("service: s", "service: t")
            .replace("port: 30000", "port: 20000");
        let e = fleet(&[("t.yaml", &server), ("g.yaml", GROUP)]);
        assert_eq!(
            e,
            ["g.yaml:2:8: nodes: dist-init port 20000 on host `a` (rank 0) is the sglang.port of t.yaml: give this group another sglang.dist_init_port"]
        );
        // Either order.
        assert_eq!(fleet(&[("g.yaml", GROUP), ("t.yaml", &server)]), e);
        // On a rank other than 0 nothing listens on it.
        let elsewhere = server.replace("hosts: [a]", "hosts: [b]");
        assert!(fleet(&[("t.yaml", &elsewhere), ("g.yaml", GROUP)]).is_empty());
    }

    #[test]
    fn rollout_names_one_of_the_hosts_and_limits_of_at_least_one() {
        let two = BASE.replace("hosts: [a]", "hosts: [a, b]");
        assert!(errors(&format!(
            "{two}rollout: {{ canary: b, max_parallel: 2, max_failures: 1 }}\n"
        ))
        .is_empty());
        let e = errors(&format!("{two}rollout:\n  canary: c\n  max_parallel: 0\n"));
        assert_starts(
            &e,
            &[
                "m.yaml:9:3: rollout.canary: `c` is not one of this service's hosts (a, b)",
                "m.yaml:10:3: rollout.max_parallel: max_parallel must be at least 1",
            ],
        );
        let m = parse("m.yaml", &format!("{two}rollout: {{ max_failures: 3 }}\n")).unwrap();
        assert_eq!(
            m.rollout,
            Some(super::super::RolloutSpec {
                canary: None,
                max_parallel: None,
                max_failures: Some(3)
            })
        );
        let unknown =
            parse("m.yaml", &format!("{two}rollout: {{ max_paralel: 3 }}\n")).unwrap_err();
        assert!(
            unknown.to_string().contains("max_paralel")
                || format!("{unknown:?}").contains("max_paralel"),
            "{unknown:?}"
        );
    }

    #[test]
    fn a_bake_needs_a_router_metrics_and_limits_that_can_pass() {
        let metrics = BASE.replace(
            "  port: 30000\n",
            "  port: 30000\n  flags: { enable-metrics: true }\n",
        );
        let router = "router: { url: \"http://127.0.0.1:30100\", admin_key_env: K }\n";
        let ok = format!("{metrics}{router}verify:\n  bake: {{ duration: 10m }}\n");
        assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
        let bake = parse("m.yaml", &ok).unwrap().verify.bake.unwrap();
        assert_eq!(
            bake,
            super::super::BakeSpec::lasting(std::time::Duration::from_secs(600))
        );
        assert_eq!(bake.limits().error_rate_above, 0.01);
        // Without a router or metrics: each said at `verify.bake`.
        let e = errors(&format!("{BASE}verify:\n  bake: {{ duration: 10m }}\n"));
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("m.yaml:9:9: verify.bake: bake judges the canary against the stable replicas of a router"), "{e:?}");
        assert!(
            e[1].contains(
                "bake reads the replicas' /metrics, which SGLang serves only with --enable-metrics"
            ),
            "{e:?}"
        );
        let bad = format!(
            "{metrics}{router}verify:\n  bake:\n    duration: 0s\n    min_requests: 0\n    max_latency_ratio: 0.5\n    max_throughput_ratio: 0.9\n    confidence: 1\n"
        );
        let e = errors(&bad);
        assert_each_holds(
            &e,
            &[
                "verify.bake.duration: duration must be longer than 0s",
                "verify.bake.min_requests",
                "verify.bake.max_latency_ratio: max_latency_ratio must be at least 1",
                "verify.bake.max_throughput_ratio",
                "verify.bake.confidence: confidence is a probability",
            ],
        );
        // A warm-up before the first look.
        let warm = format!("{metrics}{router}verify:\n  bake: {{ warmup: 30s, duration: 10m }}\n");
        let bake = parse("m.yaml", &warm).unwrap().verify.bake.unwrap();
        assert_eq!(bake.warmup, std::time::Duration::from_secs(30));
    }

    #[test]
    fn drain_needs_enable_metrics_on_every_host() {
        let e = errors(&format!("{BASE}drain:\n  timeout: 0s\n"));
        assert_starts(
            &e,
            &[
                "m.yaml:9:3: drain.timeout: timeout must be longer than 0s",
                "m.yaml:8:1: drain: drain reads the server's /metrics, which SGLang serves only with --enable-metrics: add `enable-metrics: true`",
            ],
        );
        let with = BASE.replace(
            "  port: 30000\n",
            "  port: 30000\n  flags: { enable-metrics: true }\n",
        );
        assert!(errors(&format!("{with}drain: {{ timeout: 5m }}\n")).is_empty());
        let one_off = with.replace(
            "hosts: [a]",
            "hosts:\n  - a\n  - name: b\n    flags: { enable-metrics: false }",
        );
        let e = errors(&format!("{one_off}drain: {{}}\n"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("drain: ") && e[0].ends_with("and host b turns it off"),
            "{e:?}"
        );
    }

    #[test]
    fn the_drop_in_policy_is_refuse_by_default_replace_when_asked_and_nothing_else() {
        use crate::manifest::DropInPolicy;
        let m = parse("m.yaml", BASE).unwrap();
        assert_eq!(m.dropins, DropInPolicy::Refuse);
        let text = format!("{BASE}systemd: {{ User: root, dropins: replace }}\n");
        let m = parse("m.yaml", &text).unwrap();
        assert_eq!(m.dropins, DropInPolicy::Replace);
        assert!(
            !m.systemd.contains_key("dropins"),
            "reconcile's key, never rendered"
        );
        assert!(errors(&text).is_empty());
        let bad = format!("{BASE}systemd:\n  dropins: keep\n");
        let e = parse("m.yaml", &bad).unwrap_err().0[0].to_string();
        assert!(
            e.starts_with("m.yaml:9:") && e.contains("systemd.dropins") && e.contains("`keep`"),
            "{e}"
        );
    }

    #[test]
    fn quality_settings_are_checked_with_their_positions() {
        let text = format!("{BASE}verify:\n  quality:\n    prompts: 0\n    factor: 0.5\n    needle: {{ lengths: [32], depths: [1.5] }}\n");
        let e = errors(&text);
        assert!(
            e.iter()
                .any(|e| e.contains("verify.quality.prompts") && e.contains("between 1 and 256")),
            "{e:?}"
        );
        assert_any(&e, "verify.quality.factor");
        assert_any(&e, "verify.quality.needle.lengths[0]");
        assert_any(&e, "verify.quality.needle.depths[0]");
    }

    #[test]
    fn a_guard_margin_too_short_to_renew_is_refused_at_its_line() {
        let e = errors(&format!("{BASE}verify:\n  guard_margin: 500ms\n"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("m.yaml:9:")
                && e[0].contains("verify.guard_margin")
                && e[0].contains("at least 4s"),
            "{e:?}"
        );
        assert!(errors(&format!("{BASE}verify: {{ guard_margin: 4s }}\n")).is_empty());
    }

    #[test]
    fn benchmark_settings_are_checked_with_their_positions() {
        let text = format!("{BASE}verify:\n  benchmark:\n    levels: [1, 0, 1]\n    requests: 4\n    duration: 10s\n    max_regression: 120\n");
        let e = errors(&text);
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].contains("verify.benchmark.levels[1]"), "{e:?}");
        assert!(e[1].contains("listed twice"), "{e:?}");
        assert!(
            e[2].contains("verify.benchmark.duration") && e[2].contains("not both"),
            "{e:?}"
        );
        assert!(
            e[3].contains(":13:") && e[3].contains("verify.benchmark.max_regression"),
            "{e:?}"
        );
        assert!(errors(&format!(
            "{BASE}verify: {{ benchmark: {{ levels: [1, 4], requests: 8 }} }}\n"
        ))
        .is_empty());
    }
}
