//! A manifest for tests, built from typed fields instead of edited text.
//!
//! `Manifest::new("t-x")` is the stand-in tests' base manifest (what `lab::manifest` gives); the
//! setters change one field each (`.port(30410)`, `.flag("tp-size", 4)`, `.without_flag(..)`,
//! `.env(..)`, `.systemd(..)`, `.verify(..)`, `.section(..)`), and `to_yaml()` (or `Display`) writes
//! it. A setter always takes effect, unlike a `.replace()` on text that silently matches nothing
//! once the base text changes.
//!
//! Values are `serde_yaml::Value`s (anything `Into<Value>`: `&str`, numbers, bools, or [`yaml`] for
//! a nested map or list), so a manifest a test gets wrong on purpose (port 70000, an env name
//! `NCCL-P2P`, a word where a number belongs) is written as easily as a valid one. Keys come out
//! in a fixed order: `service`, `description`, `hosts`, `nodes`, `labels`, `sglang` (`python`,
//! `version`, `model_path`, `served_model_name`, `host`, `port`, `dist_init_port`, `flags`),
//! `env`, `systemd`, `verify`, `drain`, `router`, `rollout`, `secret_env`, then any other section
//! in the order it was added; within a map (flags, env, systemd, verify), in the order the keys were
//! first set.

use serde_yaml::{Mapping, Value};

/// One manifest. `None` leaves a section out.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    service: Value,
    description: Option<Value>,
    hosts: Option<Vec<Value>>,
    nodes: Option<Vec<Value>>,
    labels: Option<Value>,
    sglang: Sglang,
    env: Option<Mapping>,
    systemd: Option<Mapping>,
    verify: Option<Mapping>,
    drain: Option<Value>,
    router: Option<Value>,
    rollout: Option<Value>,
    secret_env: Option<Value>,
    /// Any other top-level section, written last.
    sections: Mapping,
}

/// `sglang:`.
#[derive(Clone, Debug, PartialEq)]
struct Sglang {
    python: Value,
    version: Value,
    model_path: Value,
    /// `model:`, the weights pinned by revision, written in place of `model_path`.
    model: Option<Value>,
    served_model_name: Option<Value>,
    host: Option<Value>,
    port: Value,
    dist_init_port: Option<Value>,
    /// `flags:`, left out when empty.
    flags: Mapping,
}

/// The stand-in tests' verification, for a server that loads in a second: a 3 s crash window,
/// a sample every 500 ms, a 4 s stall timeout and a 20 s load deadline.
pub const STAND_IN_VERIFY: [(&str, &str); 4] = [
    ("crash_window", "3s"),
    ("sample_interval", "500ms"),
    ("stall_timeout", "4s"),
    ("load_deadline", "20s"),
];

/// A YAML value written as YAML (`yaml("{ timeout: 60s }")`, `yaml("[1, 4]")`): for the nested
/// maps and lists of `verify`, `drain`, `router` and host entries. Panics on a syntax error.
pub fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}): {text}"))
}

/// A YAML map of `entries`, in their order (`map([("name", "rl1")])`; `Value::from` each value
/// when they are of different types).
pub fn map<'a, V: Into<Value>>(entries: impl IntoIterator<Item = (&'a str, V)>) -> Value {
    Value::Mapping(
        entries
            .into_iter()
            .map(|(name, value)| (key(name), value.into()))
            .collect(),
    )
}

fn key(name: &str) -> Value {
    Value::String(name.to_string())
}

fn set(map: &mut Option<Mapping>, name: &str, value: Value) {
    map.get_or_insert_with(Mapping::new)
        .insert(key(name), value);
}

fn unset(map: &mut Option<Mapping>, name: &str) {
    if let Some(map) = map {
        map.shift_remove(name);
    }
}

impl Manifest {
    /// The stand-in tests' base manifest, on no host yet: `/usr/bin/python3` on the test hosts
    /// runs the SGLang stand-in.
    ///
    /// ```yaml
    /// service: SERVICE
    /// description: test service SERVICE
    /// hosts: []
    /// sglang:
    ///   python: /usr/bin/python3
    ///   version: 0.5.23
    ///   model_path: /models/test
    ///   served_model_name: test-model
    ///   port: 30000
    ///   flags: { tp-size: 2, context-length: 8192 }
    /// env: { CUDA_VISIBLE_DEVICES: "0,1", NCCL_P2P_DISABLE: "1" }
    /// systemd: { Restart: on-failure, RestartSec: 1 }
    /// ```
    pub fn new(service: &str) -> Manifest {
        Manifest {
            service: service.into(),
            description: Some(format!("test service {service}").into()),
            hosts: Some(Vec::new()),
            nodes: None,
            labels: None,
            sglang: Sglang {
                python: "/usr/bin/python3".into(),
                version: "0.5.23".into(),
                model_path: "/models/test".into(),
                model: None,
                served_model_name: Some("test-model".into()),
                host: None,
                port: 30000.into(),
                dist_init_port: None,
                flags: Mapping::new(),
            },
            env: None,
            systemd: None,
            verify: None,
            drain: None,
            router: None,
            rollout: None,
            secret_env: None,
            sections: Mapping::new(),
        }
        .flag("tp-size", 2)
        .flag("context-length", 8192)
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .env("NCCL_P2P_DISABLE", "1")
        .systemd("Restart", "on-failure")
        .systemd("RestartSec", 1)
    }

    /// The service's name as written (`service:`), for tests that name its unit.
    pub fn service_name(&self) -> String {
        match &self.service {
            Value::String(s) => s.clone(),
            other => panic!("service is not a string: {other:?}"),
        }
    }

    pub fn description(mut self, description: impl Into<Value>) -> Manifest {
        self.description = Some(description.into());
        self
    }

    /// `hosts:`, a list of bare destinations (replacing any listed before).
    pub fn hosts(mut self, hosts: &[&str]) -> Manifest {
        self.hosts = Some(hosts.iter().map(|h| Value::from(*h)).collect());
        self
    }

    /// One more `hosts:` entry: a destination, or a map with per-host overrides.
    pub fn host(mut self, entry: impl Into<Value>) -> Manifest {
        self.hosts.get_or_insert_with(Vec::new).push(entry.into());
        self
    }

    /// One more `nodes:` entry (a server group, rank by position); `hosts:` stays as it is, so
    /// leave it out with `.without("hosts")`.
    pub fn node(mut self, entry: impl Into<Value>) -> Manifest {
        self.nodes.get_or_insert_with(Vec::new).push(entry.into());
        self
    }

    pub fn python(mut self, python: impl Into<Value>) -> Manifest {
        self.sglang.python = python.into();
        self
    }

    pub fn version(mut self, version: impl Into<Value>) -> Manifest {
        self.sglang.version = version.into();
        self
    }

    pub fn model_path(mut self, path: impl Into<Value>) -> Manifest {
        self.sglang.model_path = path.into();
        self
    }

    /// `sglang.model:` in place of `model_path`: the weights pinned by revision.
    pub fn pinned_model(mut self, model: impl Into<Value>) -> Manifest {
        self.sglang.model = Some(model.into());
        self
    }

    pub fn served_model_name(mut self, name: impl Into<Value>) -> Manifest {
        self.sglang.served_model_name = Some(name.into());
        self
    }

    /// No `served_model_name`: the server answers under its model path.
    pub fn without_served_model_name(mut self) -> Manifest {
        self.sglang.served_model_name = None;
        self
    }

    /// `apply: { live: true }`: changes SGLang takes without a restart are applied live.
    pub fn live(self) -> Manifest {
        self.section("apply", yaml("{ live: true }"))
    }

    /// `sglang.host`, the address the server listens on.
    pub fn listen(mut self, address: impl Into<Value>) -> Manifest {
        self.sglang.host = Some(address.into());
        self
    }

    pub fn port(mut self, port: impl Into<Value>) -> Manifest {
        self.sglang.port = port.into();
        self
    }

    pub fn dist_init_port(mut self, port: impl Into<Value>) -> Manifest {
        self.sglang.dist_init_port = Some(port.into());
        self
    }

    /// Sets a `launch_server` flag (without its dashes); a flag set before keeps its place.
    pub fn flag(mut self, name: &str, value: impl Into<Value>) -> Manifest {
        self.sglang.flags.insert(key(name), value.into());
        self
    }

    pub fn without_flag(mut self, name: &str) -> Manifest {
        self.sglang.flags.shift_remove(name);
        self
    }

    /// Sets an `env:` variable; one set before keeps its place.
    pub fn env(mut self, name: &str, value: impl Into<Value>) -> Manifest {
        set(&mut self.env, name, value.into());
        self
    }

    /// Sets `env:` variables, in this order.
    pub fn env_all(self, env: &[(&str, &str)]) -> Manifest {
        env.iter()
            .fold(self, |m, (name, value)| m.env(name, *value))
    }

    pub fn without_env(mut self, name: &str) -> Manifest {
        unset(&mut self.env, name);
        self
    }

    /// Sets a `systemd:` setting.
    pub fn systemd(mut self, name: &str, value: impl Into<Value>) -> Manifest {
        set(&mut self.systemd, name, value.into());
        self
    }

    /// Sets a `verify:` setting.
    pub fn verify(mut self, name: &str, value: impl Into<Value>) -> Manifest {
        set(&mut self.verify, name, value.into());
        self
    }

    pub fn without_verify(mut self, name: &str) -> Manifest {
        unset(&mut self.verify, name);
        self
    }

    /// Sets `verify:` settings written as strings (`("crash_window", "3s")`), in this order.
    pub fn verify_all(self, settings: &[(&str, &str)]) -> Manifest {
        settings
            .iter()
            .fold(self, |m, (name, value)| m.verify(name, *value))
    }

    /// Whether `verify:` has the setting `name`.
    pub fn verifies(&self, name: &str) -> bool {
        self.verify.as_ref().is_some_and(|v| v.contains_key(name))
    }

    /// Sets a top-level section other than `service`, `description`, `hosts`, `nodes`, `sglang`,
    /// `env`, `systemd` and `verify` (which have setters of their own): `drain`, `router`,
    /// `rollout`, `secret_env`, `labels`, or any other name (written last).
    pub fn section(mut self, name: &str, value: impl Into<Value>) -> Manifest {
        let value = value.into();
        match name {
            "drain" => self.drain = Some(value),
            "router" => self.router = Some(value),
            "rollout" => self.rollout = Some(value),
            "secret_env" => self.secret_env = Some(value),
            "labels" => self.labels = Some(value),
            "service" | "description" | "hosts" | "nodes" | "sglang" | "env" | "systemd"
            | "verify" => panic!("`{name}` has setters of its own"),
            _ => {
                self.sections.insert(key(name), value);
            }
        }
        self
    }

    /// Leaves a top-level section out (`description`, `hosts`, `env`, `systemd`, ...).
    pub fn without(mut self, name: &str) -> Manifest {
        match name {
            "description" => self.description = None,
            "hosts" => self.hosts = None,
            "nodes" => self.nodes = None,
            "labels" => self.labels = None,
            "env" => self.env = None,
            "systemd" => self.systemd = None,
            "verify" => self.verify = None,
            "drain" => self.drain = None,
            "router" => self.router = None,
            "rollout" => self.rollout = None,
            "secret_env" => self.secret_env = None,
            "service" | "sglang" => panic!("a test manifest always has `{name}`"),
            _ => {
                self.sections.shift_remove(name);
            }
        }
        self
    }

    /// The manifest as one YAML value, keys in their fixed order.
    pub fn to_value(&self) -> Value {
        let mut sglang = Mapping::new();
        let s = &self.sglang;
        sglang.insert(key("python"), s.python.clone());
        sglang.insert(key("version"), s.version.clone());
        match &s.model {
            Some(model) => sglang.insert(key("model"), model.clone()),
            None => sglang.insert(key("model_path"), s.model_path.clone()),
        };
        if let Some(name) = &s.served_model_name {
            sglang.insert(key("served_model_name"), name.clone());
        }
        if let Some(host) = &s.host {
            sglang.insert(key("host"), host.clone());
        }
        sglang.insert(key("port"), s.port.clone());
        if let Some(port) = &s.dist_init_port {
            sglang.insert(key("dist_init_port"), port.clone());
        }
        if !s.flags.is_empty() {
            sglang.insert(key("flags"), Value::Mapping(s.flags.clone()));
        }

        let map = |m: &Option<Mapping>| m.clone().map(Value::Mapping);
        let list = |l: &Option<Vec<Value>>| l.clone().map(Value::Sequence);
        let sections = [
            ("service", Some(self.service.clone())),
            ("description", self.description.clone()),
            ("hosts", list(&self.hosts)),
            ("nodes", list(&self.nodes)),
            ("labels", self.labels.clone()),
            ("sglang", Some(Value::Mapping(sglang))),
            ("env", map(&self.env)),
            ("systemd", map(&self.systemd)),
            ("verify", map(&self.verify)),
            ("drain", self.drain.clone()),
            ("router", self.router.clone()),
            ("rollout", self.rollout.clone()),
            ("secret_env", self.secret_env.clone()),
        ];
        let mut top = Mapping::new();
        for (name, value) in sections {
            if let Some(value) = value {
                top.insert(key(name), value);
            }
        }
        for (name, value) in &self.sections {
            top.insert(name.clone(), value.clone());
        }
        Value::Mapping(top)
    }

    /// The manifest's text.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(&self.to_value()).expect("a YAML value serialises")
    }
}

impl std::fmt::Display for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_yaml())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The base text every stand-in test edited before the builder (`lab::manifest`).
    fn old_base(service: &str, hosts: &[&str]) -> String {
        format!(
            "service: {service}\n\
             description: test service {service}\n\
             hosts: [{}]\n\
             sglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /models/test\n  served_model_name: test-model\n  port: 30000\n  flags:\n    tp-size: 2\n    context-length: 8192\n\
             env: {{ CUDA_VISIBLE_DEVICES: \"0,1\", NCCL_P2P_DISABLE: \"1\" }}\n\
             systemd: {{ Restart: on-failure, RestartSec: 1 }}\n",
            hosts.join(", ")
        )
    }

    /// Both texts read as the same YAML, and as the same manifest (apart from its text).
    fn same(old: &str, new: &Manifest) {
        let new = new.to_yaml();
        let (a, b): (Value, Value) = (
            serde_yaml::from_str(old).unwrap(),
            serde_yaml::from_str(&new).unwrap(),
        );
        assert_eq!(a, b, "old:\n{old}\nnew:\n{new}");
        let parsed = |text: &str| {
            let mut m = reconcile::manifest::parse("a.yaml", text)
                .unwrap_or_else(|e| panic!("{e}:\n{text}"));
            m.text.clear();
            m.digest.clear();
            m
        };
        assert_eq!(parsed(old), parsed(&new), "old:\n{old}\nnew:\n{new}");
    }

    #[test]
    fn the_default_is_the_old_base_text() {
        same(
            &old_base("t-x", &["rl1"]),
            &Manifest::new("t-x").hosts(&["rl1"]),
        );
        same(
            &old_base("t-y", &["rl1", "rl2", "local"]),
            &Manifest::new("t-y").hosts(&["rl1", "rl2", "local"]),
        );
    }

    #[test]
    fn setters_change_their_field_and_nothing_else() {
        let old = "service: t-x\n\
                   description: test service t-x\n\
                   hosts: [rl1]\n\
                   sglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /models/test\n  served_model_name: test-model\n  port: 30410\n  flags:\n    tp-size: 4\n    context-length: 8192\n    enable-metrics: true\n    mem-fraction-static: 0.8\n\
                   env: { CUDA_VISIBLE_DEVICES: \"0,1,2,3\", NCCL_P2P_DISABLE: \"1\" }\n\
                   systemd: { Restart: on-failure, RestartSec: 1 }\n";
        let new = Manifest::new("t-x")
            .hosts(&["rl1"])
            .port(30410)
            .flag("tp-size", 4)
            .flag("enable-metrics", true)
            .flag("mem-fraction-static", 0.8)
            .env("CUDA_VISIBLE_DEVICES", "0,1,2,3");
        same(old, &new);
        let text = new.to_yaml();
        assert!(text.contains("  port: 30410\n"), "{text}");
        assert!(text.contains("    tp-size: 4\n"), "{text}");
    }

    #[test]
    fn keys_come_out_in_a_fixed_order_whatever_order_they_were_set_in() {
        let a = Manifest::new("t-x")
            .section("secret_env", yaml("[A]"))
            .verify("crash_window", "3s")
            .section("drain", yaml("{ timeout: 60s }"))
            .section("extra", 1);
        let b = Manifest::new("t-x")
            .section("extra", 1)
            .section("drain", yaml("{ timeout: 60s }"))
            .verify("crash_window", "3s")
            .section("secret_env", yaml("[A]"));
        assert_eq!(a.to_yaml(), b.to_yaml());
        let text = a.to_yaml();
        let order: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.starts_with('-'))
            .map(|l| l.split(':').next().unwrap())
            .collect();
        assert_eq!(
            order,
            [
                "service",
                "description",
                "hosts",
                "sglang",
                "env",
                "systemd",
                "verify",
                "drain",
                "secret_env",
                "extra"
            ]
        );
    }

    #[test]
    fn removals_leave_the_rest_in_place() {
        let m = Manifest::new("t-x")
            .without_flag("tp-size")
            .without_env("NCCL_P2P_DISABLE")
            .without("description")
            .without("systemd");
        let text = m.to_yaml();
        assert_eq!(
            text,
            "service: t-x\nhosts: []\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /models/test\n  served_model_name: test-model\n  port: 30000\n  flags:\n    context-length: 8192\nenv:\n  CUDA_VISIBLE_DEVICES: 0,1\n"
        );
        assert_eq!(m.to_string(), text);
    }

    #[test]
    fn deliberately_invalid_values_are_written_as_given() {
        let text = Manifest::new("t-bad")
            .port(70000)
            .env("NCCL-P2P", "1")
            .flag("context-length", "lots")
            .to_yaml();
        let v: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(v["sglang"]["port"], Value::from(70000));
        assert_eq!(v["env"]["NCCL-P2P"], Value::from("1"));
        assert_eq!(v["sglang"]["flags"]["context-length"], Value::from("lots"));
        let errors = match reconcile::manifest::parse("a.yaml", &text) {
            Err(e) => format!("{e:?}"),
            Ok(m) => format!("{:?}", reconcile::manifest::validate(&m, &text)),
        };
        assert!(errors.contains("sglang.port"), "{errors}");
    }

    #[test]
    fn strings_that_look_like_other_types_stay_strings() {
        let m = Manifest::new("t-x")
            .env("A", "1")
            .env("B", "true")
            .env("C", "0.5")
            .env("D", "")
            .env("E", "two\nlines")
            .env("F", "`x` $(y) ; z #w")
            .version("0.6.0");
        let v: Value = serde_yaml::from_str(&m.to_yaml()).unwrap();
        for (name, value) in [
            ("A", "1"),
            ("B", "true"),
            ("C", "0.5"),
            ("D", ""),
            ("E", "two\nlines"),
            ("F", "`x` $(y) ; z #w"),
        ] {
            assert_eq!(v["env"][name], Value::from(value), "{name}");
        }
        assert_eq!(v["sglang"]["version"], Value::from("0.6.0"));
    }
}
