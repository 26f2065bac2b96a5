//! Root runs only what root owns: the paths that decide what a unit's Python runs, as the host's
//! trust check found them writable by someone other than root (`src/preflight/scripts.rs`,
//! `trust_fn`), and who a check that imports SGLang runs as.
//!
//! OpenSSH's privilege separation is the model: the part that reads what others wrote owns
//! nothing. reconcile's own Pythons run as root only from a root-owned interpreter and standard
//! library, isolated (`-I -S`: no current folder, no user site, no `PYTHON*` variables, no `.pth`
//! code), reading other users' files as data. The check that imports SGLang (the deep check) runs
//! as the unit's `User=`, in its sandbox; run as root, it needs every path root-owned.

use crate::finding::Finding;
use crate::unit::UnitModel;

/// What a path decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// The interpreter's own file and standard library, and the folders above them: what any
    /// start of it runs.
    Interpreter,
    /// The packages, site folders, `.pth` files and `pyvenv.cfg`: what importing SGLang runs.
    Site,
}

/// A path someone other than root can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writable {
    pub scope: Scope,
    pub uid: u32,
    /// Its permission bits.
    pub mode: u32,
    pub path: String,
}

impl Writable {
    /// Who can write it, in words.
    fn by_whom(&self) -> String {
        let mut who = Vec::new();
        if self.uid != 0 {
            who.push(format!("its owner, uid {}", self.uid));
        }
        if self.mode & 0o020 != 0 {
            who.push("its group".to_string());
        }
        if self.mode & 0o002 != 0 {
            who.push("every user".to_string());
        }
        format!("{} (writable by {})", self.path, who.join(" and "))
    }

    /// Writable by more than one user: its group, or everyone.
    fn shared(&self) -> bool {
        self.mode & 0o022 != 0
    }
}

/// The lines the trust check printed on stderr: `#reconcile-writable <scope> <uid> <mode> <path>`.
pub fn writable(stderr: &str) -> Vec<Writable> {
    let mut found: Vec<Writable> = stderr
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("#reconcile-writable ")?;
            let mut parts = rest.splitn(4, ' ');
            let scope = match parts.next()? {
                "interpreter" => Scope::Interpreter,
                "site" => Scope::Site,
                _ => return None,
            };
            let uid = parts.next()?.parse().ok()?;
            let mode = u32::from_str_radix(parts.next()?, 8).ok()?;
            let path = parts.next()?.to_string();
            Some(Writable {
                scope,
                uid,
                mode,
                path,
            })
        })
        .collect();
    found.sort_by(|a, b| (a.scope, &a.path).cmp(&(b.scope, &b.path)));
    found.dedup_by(|a, b| a.path == b.path);
    found
}

/// The status a runner exits with when root may not start the Python.
pub const UNTRUSTED_STATUS: i32 = 102;

/// Whether a runner's exit (`status`, `stderr`) is a Python that root was not allowed to start.
pub fn untrusted(status: i32, stderr: &str) -> bool {
    status == UNTRUSTED_STATUS && stderr.contains("#reconcile-writable ")
}

/// Whether the unit's server runs as root: no `User=` (systemd's default), `root` or `0`, and no
/// `DynamicUser=`.
pub fn runs_as_root(model: &UnitModel) -> bool {
    let last = |key: &str| {
        model
            .settings
            .get(key)
            .and_then(|v| v.last())
            .map(String::as_str)
    };
    let dynamic = last("Service.DynamicUser")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "yes" | "true" | "on" | "1"));
    !dynamic && matches!(last("Service.User"), None | Some("root") | Some("0"))
}

/// The scopes that keep the deep check from starting as root: all of them, since it imports
/// SGLang; none when it runs as the unit's own user, who is trusted with its own code.
pub fn deep_gate(model: &UnitModel) -> &'static str {
    if runs_as_root(model) {
        "interpreter site"
    } else {
        ""
    }
}

/// The unit's settings that decide who its code runs as and what it sees: the identity, the
/// folders and the sandbox (systemd.exec(5)). The deep check's transient service gets them
/// (`systemd-run -p`), so that SGLang's code runs there as the server's will. Never the
/// environment (it travels on stdin), and never `RuntimeDirectory=`, which systemd removes when
/// the check ends, under the running server.
const SANDBOX: [&str; 52] = [
    "User",
    "Group",
    "DynamicUser",
    "SupplementaryGroups",
    "WorkingDirectory",
    "RootDirectory",
    "RootImage",
    "UMask",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateNetwork",
    "PrivateUsers",
    "PrivateIPC",
    "PrivateMounts",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "ProtectProc",
    "ProcSubset",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "DevicePolicy",
    "DeviceAllow",
    "NoNewPrivileges",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "SecureBits",
    "RestrictNamespaces",
    "RestrictAddressFamilies",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "SystemCallFilter",
    "SystemCallArchitectures",
    "SystemCallErrorNumber",
    "RemoveIPC",
    "KeyringMode",
    "CacheDirectory",
    "StateDirectory",
    "ConfigurationDirectory",
];

/// The `-p` properties of the deep check's transient service: the unit's [`SANDBOX`] settings
/// (a list setting once per value), then a bound on its run, `limit_secs`, should the controller
/// that waits for it be gone.
pub fn sandbox_properties(model: &UnitModel, limit_secs: u64) -> Vec<String> {
    let mut properties: Vec<String> = model
        .settings
        .iter()
        .filter_map(|(key, values)| {
            let key = key.strip_prefix("Service.")?;
            SANDBOX.contains(&key).then_some((key, values))
        })
        .flat_map(|(key, values)| values.iter().map(move |v| format!("{key}={v}")))
        .filter(|p| !p.contains('\n'))
        .collect();
    properties.push(format!("RuntimeMaxSec={limit_secs}"));
    properties
}

/// What the trust check found, for a unit: a warning where root runs code another user can write
/// (the server runs as root, or root was kept from starting its Python), and where a path is
/// writable by a group or every user (whoever the server runs as, they can change what it runs).
pub fn judge_owners(model: &UnitModel, python: &str, found: &[Writable]) -> Vec<Finding> {
    const SHOWN: usize = 3;
    let root = runs_as_root(model);
    let shown: Vec<&Writable> = found.iter().filter(|w| root || w.shared()).collect();
    if shown.is_empty() {
        return Vec::new();
    }
    let mut list: Vec<String> = shown.iter().take(SHOWN).map(|w| w.by_whom()).collect();
    if shown.len() > SHOWN {
        list.push(format!("and {} more", shown.len() - SHOWN));
    }
    let consequence = if root {
        "the server runs as root, so root runs code that user can change; make them root's alone, \
         or give the unit a User= of its own"
    } else {
        "a user other than the server's can change what the server runs"
    };
    vec![Finding::warning(
        "owner",
        format!(
            "{python} runs code that is not root's alone: {}; {consequence}",
            list.join(", ")
        ),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    fn unit(settings: &[(&str, &str)]) -> UnitModel {
        UnitModel {
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                .collect(),
            ..UnitModel::default()
        }
    }

    const FOUND: &str = "noise\n#reconcile-writable site 65534 755 /srv/venv/lib/python3.11/site-packages/evil.pth\n\
        #reconcile-writable interpreter 0 777 /opt/py\n#reconcile-writable nonsense 1 2 3\n";

    #[test]
    fn the_trust_checks_lines_are_read_with_their_scope_owner_and_mode() {
        let found = writable(FOUND);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].scope, Scope::Interpreter);
        assert_eq!((found[0].uid, found[0].mode), (0, 0o777));
        assert_eq!(
            found[1].path,
            "/srv/venv/lib/python3.11/site-packages/evil.pth"
        );
    }

    #[test]
    fn a_server_run_as_root_is_warned_of_any_path_another_user_can_write() {
        let found = writable(FOUND);
        let findings = judge_owners(&unit(&[]), "/srv/venv/bin/python3", &found);
        assert_eq!(findings.len(), 1);
        let message = &findings[0].message;
        assert_holds(message, "evil.pth (writable by its owner, uid 65534)");
        assert_holds(message, "/opt/py (writable by its group and every user)");
        assert_holds(message, "runs as root");
    }

    #[test]
    fn a_server_run_as_its_own_user_is_warned_only_of_what_others_can_write() {
        let own = writable("#reconcile-writable site 1000 755 /home/svc/venv/lib\n");
        let alice = unit(&[("Service.User", "svc")]);
        assert!(judge_owners(&alice, "/home/svc/venv/bin/python3", &own).is_empty());
        let shared = writable("#reconcile-writable site 1000 775 /home/svc/venv/lib\n");
        assert_eq!(judge_owners(&alice, "/p", &shared).len(), 1);
    }

    #[test]
    fn the_deep_check_is_gated_only_where_it_would_run_as_root() {
        assert!(runs_as_root(&unit(&[])));
        assert!(runs_as_root(&unit(&[("Service.User", "root")])));
        assert!(!runs_as_root(&unit(&[("Service.User", "nobody")])));
        assert!(!runs_as_root(&unit(&[("Service.DynamicUser", "yes")])));
        assert_eq!(deep_gate(&unit(&[])), "interpreter site");
        assert_eq!(deep_gate(&unit(&[("Service.User", "svc")])), "");
    }

    #[test]
    fn the_check_runs_with_the_units_sandbox_and_never_its_environment() {
        let mut model = unit(&[
            ("Service.User", "svc"),
            ("Service.ProtectSystem", "strict"),
            ("Service.RuntimeDirectory", "sglang"),
            ("Service.EnvironmentFile", "/etc/secrets"),
            ("Service.Restart", "on-failure"),
        ]);
        model.settings.insert(
            "Service.ReadWritePaths".into(),
            vec!["/var/cache/a".into(), "/srv/b".into()],
        );
        model.env.insert("HF_TOKEN".into(), "hf_secret".into());
        let properties = sandbox_properties(&model, 75);
        assert_eq!(
            properties,
            [
                "ProtectSystem=strict",
                "ReadWritePaths=/var/cache/a",
                "ReadWritePaths=/srv/b",
                "User=svc",
                "RuntimeMaxSec=75"
            ]
        );
    }
}
