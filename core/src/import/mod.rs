//! `reconcile import`'s pure part: the files systemd reads for a unit (its file, then its
//! drop-ins, as `systemctl cat` prints them) to the manifest that renders the same unit in meaning,
//! so that a plan of it against that host restarts nothing.
//!
//! Every value in force is written: SGLang's flags typed with the catalog of the host's SGLang
//! version, the environment, the other systemd settings, a drop-in's values folded in. Secrets
//! (by the redactor's rules) become `{ from_env: VAR }` references, never copied. What a manifest
//! cannot express is an error naming the file and line, never dropped. Before answering, the
//! manifest is parsed, validated, rendered and compared with the host's unit
//! ([`check`]), so a manifest that would restart the server is never handed out.

mod argv;
mod check;
mod lines;
mod write;
pub(crate) mod yaml;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use crate::redact::Redactor;
use crate::sglang::Catalog;
use crate::unit::{current_spelling, parse_unit, section_of, specifier, UnitModel};

pub use argv::{ExecStartProblem, FlagProblem};
pub use lines::{split_cat, MissingHeader};

use argv::Written;
use lines::Assignment;
use write::{Entry, Parts};

/// One file systemd reads for the unit: its path and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    pub path: String,
    pub text: String,
}

/// What to import.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The ssh destination the manifest will name.
    pub host: &'a str,
    /// `<name>.service`.
    pub unit: &'a str,
    /// The unit's files in systemd's order: `FragmentPath`, then `DropInPaths`.
    pub files: &'a [UnitFile],
    /// The SGLang version the unit's Python has.
    pub version: &'a str,
    /// Env names to treat as secret besides those that look secret (the manifest's `secret_env`).
    pub secret_env: &'a [String],
    /// The Python on the `#!` line of the console script ExecStart runs (`<script> serve`, see
    /// [`console_script`]); the manifest names it as `sglang.python`.
    pub interpreter: Option<&'a str>,
}

/// The manifest written, and what its user must know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    pub yaml: String,
    /// The variables the manifest reads from reconcile's environment, each with what it is for
    /// (`env HF_TOKEN`, `--api-key`). Their values are nowhere in the manifest.
    pub exports: Vec<(String, String)>,
    /// What is worth knowing but does not stop the import.
    pub notes: Vec<String>,
}

/// A value of the unit a manifest cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("{path}:{line}: {message}")]
    At {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: String, message: String },
}

/// Every problem found, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportErrors {
    pub unit: String,
    pub errors: Vec<ImportError>,
}

impl fmt::Display for ImportErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "{} cannot be written as a manifest: {n} value{} it cannot express",
            self.unit,
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::error::Error for ImportErrors {}

/// Settings every rendered unit has unless the manifest sets them (see `unit::render`).
const RENDERED_DEFAULTS: [(&str, &str); 3] = [
    ("Unit.After", "network-online.target"),
    ("Unit.Wants", "network-online.target"),
    ("Install.WantedBy", "multi-user.target"),
];

/// The files of `files` a manifest answers for: the unit file and the unit's own drop-ins
/// (`<unit>.d/`). Drop-ins shared with other units (`service.d/`, a prefix's) stay in force
/// whatever unit is installed, so they are not folded in.
pub fn own_files<'a>(unit: &str, files: &'a [UnitFile]) -> (Vec<UnitFile>, Vec<&'a UnitFile>) {
    let dir = format!("/{unit}.d/");
    let mut own = Vec::new();
    let mut shared = Vec::new();
    for (i, f) in files.iter().enumerate() {
        if i == 0 || f.path.contains(&dir) {
            own.push(f.clone());
        } else {
            shared.push(f);
        }
    }
    (own, shared)
}

/// What the files mean together: systemd's rules across them (a later value wins, an empty one
/// resets), since each drop-in starts with its own section header.
pub fn effective(files: &[UnitFile]) -> UnitModel {
    let mut text = String::new();
    for f in files {
        text.push_str(&f.text);
        text.push('\n');
    }
    parse_unit(&text)
}

/// The Python the unit runs (ExecStart's first word), to read its SGLang version with; for a
/// console script ([`console_script`]), the script, whose `#!` line names it.
pub fn python(unit: &str, files: &[UnitFile]) -> Option<String> {
    effective(&own_files(unit, files).0)
        .exec_start
        .first()
        .cloned()
}

/// SGLang's console script when ExecStart runs it (`<venv>/bin/sglang serve ...`).
pub fn console_script(unit: &str, files: &[UnitFile]) -> Option<String> {
    let exec_start = effective(&own_files(unit, files).0).exec_start;
    crate::flags::console_script(&exec_start)
        .filter(|script| argv::is_console_script(script))
        .cloned()
}

/// The manifest for `request`'s unit, or every value it cannot express.
pub fn import(request: &Request) -> Result<Imported, ImportErrors> {
    let mut reader = Reader::new(request);
    let result = reader.read();
    let errors = reader.errors;
    match result {
        Some(imported) if errors.is_empty() => Ok(imported),
        _ => Err(ImportErrors {
            unit: request.unit.to_string(),
            errors,
        }),
    }
}

/// One import under way: what was read, and every problem found so far.
struct Reader<'a> {
    request: &'a Request<'a>,
    own: Vec<UnitFile>,
    shared: Vec<&'a UnitFile>,
    catalog: Option<&'static Catalog>,
    redactor: Redactor,
    errors: Vec<ImportError>,
    notes: Vec<String>,
}

impl<'a> Reader<'a> {
    fn new(request: &'a Request<'a>) -> Reader<'a> {
        let (own, shared) = own_files(request.unit, request.files);
        let mut redactor = Redactor::default();
        redactor.declare(request.secret_env);
        Reader {
            request,
            own,
            shared,
            catalog: Catalog::for_version(request.version),
            redactor,
            errors: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn fail_at(&mut self, a: &Assignment, message: impl Into<String>) {
        self.errors.push(ImportError::At {
            path: self.own[a.file].path.clone(),
            line: a.line,
            message: message.into(),
        });
    }

    fn fail_file(&mut self, message: impl Into<String>) {
        let path = self
            .own
            .first()
            .map_or(self.request.unit.to_string(), |f| f.path.clone());
        self.errors.push(ImportError::File {
            path,
            message: message.into(),
        });
    }

    /// Where a value set by a drop-in comes from, for its comment.
    fn origin(&self, a: &Assignment) -> Option<String> {
        (a.file > 0).then(|| format!("from {}:{}", self.own[a.file].path, a.line))
    }

    /// Adopts the specifiers in `a`'s value that systemd resolves alike on every host (`%h`: the
    /// unit is read with their values); refuses the others. False if any was refused.
    fn specifiers(&mut self, a: &Assignment, setting: &str) -> bool {
        let mut ok = true;
        for (spec, value) in specifier::specifiers(&a.value) {
            match value {
                Some(value) => self.notes.push(format!("`{spec}` in {setting} is {value} to systemd's system manager on every host: the manifest writes {value} (a text change, no restart)")),
                None => {
                    self.fail_at(a, format!("`{spec}` in {setting} is a systemd specifier only the host or the unit's name resolves, which a manifest cannot write (reconcile writes `%` as `%%`): put its value in the unit first"));
                    ok = false;
                }
            }
        }
        ok
    }

    fn read(&mut self) -> Option<Imported> {
        let service = self.service()?;
        if self.own.is_empty() {
            self.fail_file("systemd reads no file for this unit");
            return None;
        }
        if self.catalog.is_none() {
            self.notes.push(format!(
                "no catalog of SGLang {}'s flags (known: {}): flags are written as text, untyped",
                self.request.version,
                Catalog::versions().collect::<Vec<_>>().join(", ")
            ));
        }
        for f in &self.shared {
            self.notes.push(format!(
                "{} is shared with other units and stays in force whatever reconcile installs: its values are not in the manifest",
                f.path
            ));
        }
        let assignments = lines::assignments(&self.own);
        let force = lines::in_force(&assignments);
        let model = effective(&self.own);
        let command = self.command(&force, &model);
        let env = self.env(&force, &model);
        let (description, systemd) = self.settings(&force);
        let command_origin = force
            .get("Service.ExecStart")
            .and_then(|lines| lines.last())
            .and_then(|a| self.origin(a))
            .map(|o| format!("ExecStart {o}"));
        let parts = Parts {
            command: command?,
            command_origin,
            description,
            env,
            systemd,
        };
        if !self.errors.is_empty() {
            return None;
        }
        let (yaml, exports, secrets) = write::manifest(self.request, &self.own, &service, &parts);
        match check::check(&yaml, &secrets, &model, self.catalog) {
            Ok(warnings) => self.notes.extend(warnings),
            Err(problems) => {
                for p in problems {
                    self.fail_file(format!(
                        "the manifest import wrote does not reproduce the unit: {p}"
                    ));
                }
                return None;
            }
        }
        Some(Imported {
            yaml,
            exports,
            notes: std::mem::take(&mut self.notes),
        })
    }

    /// The service name, from a unit name a manifest may have.
    fn service(&mut self) -> Option<String> {
        let unit = self.request.unit;
        let service = unit.strip_suffix(".service");
        let valid = service.is_some_and(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
                && !s.starts_with(['-', '.'])
        });
        if !valid {
            self.errors.push(ImportError::File {
                path: unit.to_string(),
                message: "only a service unit whose name a manifest's `service` can hold (letters, digits, `-`, `_`, `.`, `:`; no template instance) can be imported".into(),
            });
            return None;
        }
        service.map(str::to_string)
    }

    /// ExecStart, which must be one `<python> -m sglang.launch_server` line systemd runs as is.
    fn command(
        &mut self,
        force: &BTreeMap<String, Vec<&Assignment>>,
        model: &UnitModel,
    ) -> Option<argv::Command> {
        let lines = force.get("Service.ExecStart").cloned().unwrap_or_default();
        let exec = match lines.as_slice() {
            [] => {
                self.fail_file("no ExecStart= in force: nothing for a manifest to render");
                return None;
            }
            [one] => *one,
            several => {
                for a in several {
                    self.fail_at(a, "one of several ExecStart= lines in force; a manifest renders one (a drop-in that replaces the command resets it first with an empty ExecStart=)");
                }
                return None;
            }
        };
        let mut ok = true;
        if let Some(prefix) = exec.value.chars().next().filter(|c| "-@:+!".contains(*c)) {
            self.fail_at(exec, format!("ExecStart's `{prefix}` prefix changes how systemd runs the command, which a manifest cannot write"));
            ok = false;
        }
        ok &= self.specifiers(exec, "ExecStart");
        if let Some(var) = variable(&exec.value) {
            let name = var.trim_start_matches('$').trim_matches(['{', '}']);
            let files: Vec<&str> = force
                .get("Service.EnvironmentFile")
                .into_iter()
                .flatten()
                .map(|a| a.value.as_str())
                .collect();
            let source = if model.env.contains_key(name) {
                "the unit's Environment=".to_string()
            } else if !files.is_empty() {
                format!(
                    "EnvironmentFile={} (its values stay on the host)",
                    files.join(" ")
                )
            } else {
                "the service manager's environment".to_string()
            };
            self.fail_at(exec, format!("`{var}` in ExecStart is expanded by systemd from {source}, which a manifest's command cannot refer to (reconcile writes `$` as `$$`): write its value in ExecStart first"));
            ok = false;
            // A `$VAR` word alone becomes any number of words (`${VAR}` stays one): the flags
            // cannot be read.
            let splits = |w: &String| variable(w).as_deref() == Some(w) && !w.starts_with("${");
            if model.exec_start.iter().any(splits) {
                return None;
            }
        }
        match argv::read(
            &model.exec_start,
            self.request.interpreter,
            self.catalog,
            &self.redactor,
        ) {
            Ok(mut command) if ok => {
                self.notes.append(&mut command.notes);
                Some(command)
            }
            Ok(_) => None,
            Err(problems) => {
                for p in problems {
                    self.fail_at(exec, p.to_string());
                }
                None
            }
        }
    }

    /// The environment in force; a secret's value becomes a reference.
    fn env(
        &mut self,
        force: &BTreeMap<String, Vec<&Assignment>>,
        model: &UnitModel,
    ) -> Vec<Entry<Written>> {
        let lines = force
            .get("Service.Environment")
            .cloned()
            .unwrap_or_default();
        let mut set_by: BTreeMap<String, &Assignment> = BTreeMap::new();
        for a in &lines {
            self.specifiers(a, "Environment=");
            let one = parse_unit(&format!("[Service]\nEnvironment={}\n", a.value));
            for name in one.env.keys() {
                set_by.insert(name.clone(), a);
            }
        }
        let mut env = Vec::new();
        for (name, value) in &model.env {
            let Some(a) = set_by.get(name).copied() else {
                continue;
            };
            if value.contains(['\n', '\r', '\0']) {
                self.fail_at(a, format!("{name}'s value holds a control character (a newline, carriage return or NUL), which a manifest value cannot"));
                continue;
            }
            let written = if self.redactor.is_secret(name) {
                Written::FromEnv {
                    var: name.clone(),
                    value: value.clone(),
                }
            } else {
                Written::One(argv::Item::Text(value.clone()))
            };
            env.push((name.clone(), written, self.origin(a)));
        }
        env
    }

    /// Every other setting in force: the Description, and the `systemd:` map.
    fn settings(
        &mut self,
        force: &BTreeMap<String, Vec<&Assignment>>,
    ) -> (Option<String>, Vec<Entry<String>>) {
        let mut description = None;
        let mut systemd = Vec::new();
        for (setting, lines) in force {
            let (section, key) = setting.split_once('.').unwrap_or(("", setting));
            let last = *lines.last().expect("in force means set");
            match setting.as_str() {
                "Service.ExecStart" | "Service.Environment" => continue,
                "Service.Type" => {
                    if lines.iter().any(|a| a.value != "simple") {
                        self.fail_at(
                            last,
                            format!(
                                "Type={} is not the Type=simple every rendered unit has",
                                last.value
                            ),
                        );
                    }
                    continue;
                }
                "Unit.Description" => {
                    match specifier::specifiers(&last.value).into_iter().next() {
                        Some((spec, _)) => self.fail_at(last, format!("`{spec}` in Description= is a systemd specifier, which a manifest's description cannot hold")),
                        None => description = Some((last.value.replace("%%", "%"), self.origin(last))),
                    }
                    continue;
                }
                _ => {}
            }
            if !matches!(section, "Unit" | "Service" | "Install") {
                self.fail_at(
                    last,
                    format!("[{section}] is a section reconcile does not render"),
                );
                continue;
            }
            let (section, key) = match current_spelling(section, key) {
                Some((home, name)) => {
                    self.notes.push(format!("{key}= in [{section}] is systemd's old spelling of {name}= in [{home}], which the manifest writes (a reload, no restart)"));
                    (home, name)
                }
                None => (section, key),
            };
            if section_of(key) != section {
                self.fail_at(last, format!("{key}= is in [{section}], and a manifest's `systemd.{key}` is rendered in [{}]", section_of(key)));
                continue;
            }
            let name_ok = key.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && key.chars().all(|c| c.is_ascii_alphanumeric());
            if !name_ok {
                self.fail_at(
                    last,
                    format!("`{key}` is not a setting name a manifest can hold"),
                );
                continue;
            }
            let value = match lines.as_slice() {
                [one] => one.value.clone(),
                // Unit and Install settings that list units: several lines of them mean the same
                // as one line with the values joined, and they take effect with a reload.
                several if section != "Service" && crate::unit::is_list_setting(setting) => {
                    self.notes.push(format!("{key}= is given on {} lines; the manifest joins them on one (a reload at most)", several.len()));
                    several
                        .iter()
                        .map(|a| a.value.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                }
                several => {
                    for a in several {
                        self.fail_at(a, format!("one of {} {key}= lines in force; a manifest sets a setting once (a drop-in that replaces it resets it first with an empty {key}=)", several.len()));
                    }
                    continue;
                }
            };
            if RENDERED_DEFAULTS.contains(&(setting.as_str(), value.as_str())) {
                continue;
            }
            if systemd.iter().any(|(k, _, _)| k == key) {
                self.fail_at(last, format!("{key}= is set both in its old and its current spelling; systemd keeps whichever it reads last: keep one in the unit first"));
                continue;
            }
            systemd.push((key.to_string(), value, self.origin(last)));
        }
        for (setting, default) in RENDERED_DEFAULTS {
            if !force.contains_key(setting) {
                let key = setting.split_once('.').map_or(setting, |(_, k)| k);
                let comment =
                    format!("the unit has no {key}=; reconcile's unit would say {key}={default}");
                systemd.push((key.to_string(), String::new(), Some(comment)));
            }
        }
        systemd.sort_by(|a, b| a.0.cmp(&b.0));
        let description = description.map(|(d, _)| d);
        if description.is_none() {
            self.notes.push("the unit has no Description=; the manifest's unit gets reconcile's default one (a reload, no restart)".into());
        }
        (description, systemd)
    }
}

/// The first `$NAME` or `${NAME}` systemd would substitute in a command line (`$$` is a `$`).
fn variable(raw: &str) -> Option<String> {
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '$' {
            match chars.get(i + 1) {
                Some('$') => i += 1,
                Some('{') => {
                    let end = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .map_or(chars.len(), |e| i + e + 1);
                    return Some(chars[i..end].iter().collect());
                }
                Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                    let end = chars[i + 1..]
                        .iter()
                        .position(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
                        .map_or(chars.len(), |e| i + 1 + e);
                    return Some(chars[i..end].iter().collect());
                }
                _ => {}
            }
        }
        i += 1;
    }
    None
}
