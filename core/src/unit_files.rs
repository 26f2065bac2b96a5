//! A unit's files: what systemd really runs for a unit, besides the one file `reconcile` manages
//! (`/etc/systemd/system/<unit>`): the drop-ins in force, a mask, a unit file of the same name that
//! systemd loads instead, and whether the unit is enabled.
//!
//! An operator's `systemctl edit` writes `/etc/systemd/system/<unit>.d/override.conf`; a plan that
//! compared only the unit file would say "no change" while the server runs the drop-in's command
//! line. So the survey reads `FragmentPath`, `DropInPaths`, `LoadState` and `UnitFileState` with
//! each drop-in's text, and this module says what differs from "the manifest's unit alone,
//! enabled" ([`Drift`]), what systemd would run ([`UnitFiles::effective`], the files in systemd's
//! order, so its own override rules apply: an empty `ExecStart=` resets), and which file set each
//! value in force ([`UnitFiles::origins`]).
//!
//! What systemd does, read on systemd 252 (Debian 12) test hosts:
//! - `DropInPaths` lists the drop-ins in the order it applies them (by file name across `/etc`,
//!   `/run` and the vendor directories; a same-named file in `/etc` wins over `/run`), including
//!   the ones shared by many units (`service.d/`, prefix directories such as `sglang-.service.d/`);
//! - `/etc/systemd/system` comes before `/run/systemd/system` in the load path: a unit in `/run`
//!   is what runs only while `/etc` has none; a transient unit (`/run/systemd/transient`) or an
//!   early generator's wins over `/etc`;
//! - `systemctl mask` links `/etc/systemd/system/<unit>` to `/dev/null` (`LoadState=masked`);
//!   `cat` of it reads empty, and writing the unit through it would write to `/dev/null`.

use serde::Serialize;

use crate::manifest::DropInPolicy;

/// Where the units reconcile manages live on a host: the one file per unit it writes.
pub const UNIT_DIR: &str = "/etc/systemd/system";
use crate::unit::{assigned, assignments, is_list_setting, parse_unit, UnitModel};

/// One drop-in in force, as `DropInPaths` lists it, with its text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DropIn {
    pub path: String,
    pub text: String,
}

/// What the survey read of a unit's files beyond the managed one. `Default`: nothing was read (a
/// host that could not say), which reads as "the managed file alone".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitFiles {
    /// `FragmentPath`: the file systemd loaded the unit from; empty when it has none.
    pub fragment: String,
    /// That file's text, when it is not the managed one (a unit in `/run` or a vendor directory).
    pub fragment_text: Option<String>,
    /// The drop-ins in force, in systemd's order.
    pub drop_ins: Vec<DropIn>,
    /// `LoadState` and `UnitFileState`, as `systemctl show` gives them.
    pub load_state: String,
    pub unit_file_state: String,
    /// The managed path is a symlink to `/dev/null`.
    pub managed_is_mask: bool,
}

/// A way in which systemd would not run the manifest's unit alone, enabled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Drift {
    /// A drop-in for this unit that the manifest does not own changes what runs.
    DropinOverride { path: String },
    /// The unit is masked (linked to `/dev/null`): systemd refuses to start it.
    Masked { path: String },
    /// systemd loads the unit from another file than the managed one.
    Shadowed { path: String },
    /// Installed but not enabled: it will not start after a reboot.
    Disabled,
}

impl Drift {
    /// The name `status` and the JSON give it.
    pub fn kind(&self) -> &'static str {
        match self {
            Drift::DropinOverride { .. } => "dropin_override",
            Drift::Masked { .. } => "masked",
            Drift::Shadowed { .. } => "shadowed",
            Drift::Disabled => "disabled",
        }
    }

    /// The file behind it, if one.
    pub fn path(&self) -> Option<&str> {
        match self {
            Drift::DropinOverride { path } | Drift::Masked { path } | Drift::Shadowed { path } => {
                Some(path)
            }
            Drift::Disabled => None,
        }
    }

    /// What it is, in a sentence.
    pub fn describe(&self, unit: &str) -> String {
        match self {
            Drift::DropinOverride { path } => {
                format!("the drop-in {path} changes what {unit} runs, and no manifest owns it")
            }
            Drift::Masked { path } => {
                format!("{unit} is masked ({path} -> /dev/null): systemd will not start it")
            }
            Drift::Shadowed { path } => format!(
                "systemd runs {unit} from {path}, not from {UNIT_DIR}/{unit}, the file reconcile manages"
            ),
            Drift::Disabled => {
                format!("{unit} is installed but disabled: it will not start after a reboot")
            }
        }
    }

    /// Whether apply has to refuse it under `policy`; enabling a disabled unit is always done.
    pub fn refused_under(&self, policy: DropInPolicy) -> bool {
        !matches!(self, Drift::Disabled) && policy == DropInPolicy::Refuse
    }

    /// What apply does about it under `policy`.
    pub fn apply_does(&self, policy: DropInPolicy) -> String {
        if self.refused_under(policy) {
            return "apply refuses until it is gone or the manifest says `systemd.dropins: replace` (or `apply --replace-dropins`)".into();
        }
        match self {
            Drift::DropinOverride { path } => {
                format!("apply moves {path} aside into the unit's generations (restorable)")
            }
            Drift::Masked { path } => {
                format!("apply keeps the mask {path} in the unit's generations and unmasks it")
            }
            Drift::Shadowed { path } if is_vendor(path) => format!(
                "apply installs {UNIT_DIR}, which systemd loads before the vendor unit {path} (left in place)"
            ),
            Drift::Shadowed { path } => {
                format!("apply moves {path} aside into the unit's generations (restorable)")
            }
            Drift::Disabled => "apply enables it".into(),
        }
    }

    /// Whether a restart of the unit would undo it: never. A restart starts what systemd has in
    /// force again, drop-in and all; a masked unit does not start; a disabled one stays disabled.
    pub fn restart_fixes(&self) -> bool {
        false
    }
}

/// A file a package owns: apply never moves it, it overrides it from `/etc` as systemd intends.
pub fn is_vendor(path: &str) -> bool {
    ["/usr/", "/lib/"].iter().any(|p| path.starts_with(p))
}

impl UnitFiles {
    /// The drop-ins that belong to this unit alone (`<unit>.d/`), not to every service
    /// (`service.d/`) or to a name prefix (`sglang-.service.d/`): the shared ones apply whatever
    /// unit reconcile installs, so they are neither the manifest's business nor a difference.
    pub fn own_drop_ins<'a>(&'a self, unit: &'a str) -> impl Iterator<Item = &'a DropIn> + 'a {
        let dir = format!("/{unit}.d/");
        self.drop_ins.iter().filter(move |d| d.path.contains(&dir))
    }

    /// The drop-ins shared with other units, for a note.
    pub fn shared_drop_ins<'a>(&'a self, unit: &'a str) -> impl Iterator<Item = &'a DropIn> + 'a {
        let dir = format!("/{unit}.d/");
        self.drop_ins.iter().filter(move |d| !d.path.contains(&dir))
    }

    /// The ways in which systemd would not run `unit`'s managed file alone, enabled.
    /// `managed` is the managed file's text (`None`: there is none).
    pub fn drifts(&self, unit: &str, managed: Option<&str>) -> Vec<Drift> {
        let managed_path = format!("{UNIT_DIR}/{unit}");
        let mut drifts = Vec::new();
        if self.load_state == "masked" || self.managed_is_mask {
            let path = if self.managed_is_mask || self.fragment.is_empty() {
                managed_path.clone()
            } else {
                self.fragment.clone()
            };
            drifts.push(Drift::Masked { path });
        } else if !self.fragment.is_empty() && self.fragment != managed_path {
            drifts.push(Drift::Shadowed {
                path: self.fragment.clone(),
            });
        }
        drifts.extend(self.own_drop_ins(unit).map(|d| Drift::DropinOverride {
            path: d.path.clone(),
        }));
        if managed.is_some() && self.unit_file_state == "disabled" {
            drifts.push(Drift::Disabled);
        }
        drifts
    }

    /// The files systemd reads for the unit, in its order: the unit file in force (the managed
    /// one, or the one that shadows it) and the unit's own drop-ins. Empty for a masked unit.
    pub fn files<'a>(&'a self, unit: &'a str, managed: Option<&'a str>) -> Vec<(String, &'a str)> {
        let managed_path = format!("{UNIT_DIR}/{unit}");
        if self.load_state == "masked" || self.managed_is_mask {
            return Vec::new();
        }
        let mut files = Vec::new();
        match (&self.fragment_text, managed) {
            (Some(text), _) if !self.fragment.is_empty() && self.fragment != managed_path => {
                files.push((self.fragment.clone(), text.as_str()))
            }
            (_, Some(text)) => files.push((managed_path, text)),
            _ => {}
        }
        files.extend(
            self.own_drop_ins(unit)
                .map(|d| (d.path.clone(), d.text.as_str())),
        );
        files
    }

    /// What systemd would run, as one text: the files of [`UnitFiles::files`] one after the other,
    /// each under a `# <path>` line as `systemctl cat` prints them. Reading it as one unit applies
    /// systemd's rules across them (a later assignment wins, an empty one resets), since every
    /// drop-in starts with its own section header.
    pub fn effective(&self, unit: &str, managed: Option<&str>) -> Option<String> {
        let files = self.files(unit, managed);
        if files.is_empty() {
            return None;
        }
        let mut text = String::new();
        for (path, body) in files {
            if !text.is_empty() && !text.ends_with("\n\n") {
                text.push_str(if text.ends_with('\n') { "\n" } else { "\n\n" });
            }
            text.push_str(&format!("# {path}\n"));
            text.push_str(body);
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Some(text)
    }

    /// What systemd would run, read file by file as systemd merges them: a drop-in's
    /// `ExecStart=` (after its reset) replaces the command, its `Environment=` adds to the
    /// environment (an empty one clears it first), a single-valued setting replaces the earlier
    /// value and a list setting ([`is_list_setting`]) adds to it; an empty assignment resets.
    /// `None` for a masked unit, or one with no file.
    pub fn effective_model(&self, unit: &str, managed: Option<&str>) -> Option<UnitModel> {
        let files = self.files(unit, managed);
        let mut files = files.into_iter();
        let (_, first) = files.next()?;
        let mut model = parse_unit(first);
        for (_, body) in files {
            let layer = parse_unit(body);
            for (name, empty) in assignments(body) {
                match name.as_str() {
                    "ExecStart" => model.exec_start = layer.exec_start.clone(),
                    "env:*" => model.env.clear(),
                    n if n.starts_with("env:") => {}
                    setting if empty => {
                        model.settings.remove(setting);
                    }
                    setting => {
                        let values = layer.settings.get(setting).cloned().unwrap_or_default();
                        if is_list_setting(setting) {
                            // Only once per layer: `layer` holds all of this file's values.
                            let entry = model.settings.entry(setting.to_string()).or_default();
                            for v in values {
                                if !entry.contains(&v) {
                                    entry.push(v);
                                }
                            }
                        } else {
                            model.settings.insert(setting.to_string(), values);
                        }
                    }
                }
            }
            model.env.extend(layer.env);
        }
        model.settings.retain(|_, v| !v.is_empty());
        Some(model)
    }

    /// For each value in force (named as [`assigned`] names them), the file that last set it.
    pub fn origins(&self, unit: &str, managed: Option<&str>) -> Vec<(String, String)> {
        let mut origins: Vec<(String, String)> = Vec::new();
        for (path, body) in self.files(unit, managed) {
            for name in assigned(body) {
                if name == "env:*" {
                    origins.retain(|(n, _)| !n.starts_with("env:"));
                }
                origins.retain(|(n, _)| *n != name);
                origins.push((name, path.clone()));
            }
        }
        origins
    }

    /// The file that set `name` last, when it is not the managed unit file.
    pub fn origin_of(&self, unit: &str, managed: Option<&str>, name: &str) -> Option<String> {
        let managed_path = format!("{UNIT_DIR}/{unit}");
        self.origins(unit, managed)
            .into_iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, path)| path)
            .filter(|path| *path != managed_path)
    }
}

/// A file apply moved out of systemd's way (`systemd.dropins: replace`), as kept on the host:
/// enough to put it back exactly, a mask as the link it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Moved {
    pub path: String,
    /// The file was a link to `/dev/null` (a mask), not a file with text.
    pub mask: bool,
    pub text: String,
    /// Its permission bits (`640`), read when it was moved; records from before had none, and
    /// such a file comes back 0644.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// What apply moves aside for `drift` under `systemd.dropins: replace`: the unit's own drop-ins,
/// its mask, and a unit file in `/run` that systemd would load instead. Never a vendor file
/// (`/usr`, `/lib`): a package owns it, and the managed file in `/etc` overrides it anyway.
pub fn to_move(unit: &str, unit_files: &UnitFiles, drift: &[Drift]) -> Vec<Moved> {
    let managed_path = format!("{UNIT_DIR}/{unit}");
    drift
        .iter()
        .filter_map(|d| match d {
            Drift::DropinOverride { path } => Some(Moved {
                path: path.clone(),
                mask: false,
                text: unit_files
                    .drop_ins
                    .iter()
                    .find(|x| x.path == *path)
                    .map(|x| x.text.clone())
                    .unwrap_or_default(),
                mode: None,
            }),
            Drift::Masked { path } => Some(Moved {
                path: path.clone(),
                mask: true,
                text: String::new(),
                mode: None,
            }),
            Drift::Shadowed { path } if !is_vendor(path) && *path != managed_path => Some(Moved {
                path: path.clone(),
                mask: false,
                text: unit_files.fragment_text.clone().unwrap_or_default(),
                mode: None,
            }),
            Drift::Shadowed { .. } | Drift::Disabled => None,
        })
        .collect()
}

/// Whether, with the managed file removed, systemd would still have a unit of this name (one
/// moved aside and put back, or a vendor unit): a rollback then restarts it rather than
/// removing "a new unit".
pub fn has_unit_beneath(unit: &str, unit_files: &UnitFiles, moved: &[Moved]) -> bool {
    let managed_path = format!("{UNIT_DIR}/{unit}");
    let fragment_elsewhere = !unit_files.fragment.is_empty() && unit_files.fragment != managed_path;
    fragment_elsewhere || moved.iter().any(|m| m.path == managed_path && m.mask)
}

/// Reads what [`UNIT_FILES_SCRIPT`]-like parts print: records `kind NUL path NUL text NUL`, where
/// kind is `mask` (the managed path links to `/dev/null`), `fragment` (the unit file systemd
/// loads, when it is not the managed one) or `dropin` (one per `DropInPaths` entry, in order).
/// `load_state` and `unit_file_state` come from `systemctl show`, read beside it.
pub fn parse_unit_files(output: &str, load_state: &str, unit_file_state: &str) -> UnitFiles {
    let mut unit_files = UnitFiles {
        load_state: load_state.to_string(),
        unit_file_state: unit_file_state.to_string(),
        ..UnitFiles::default()
    };
    let mut parts = output.split('\0');
    while let (Some(kind), Some(path), Some(text)) = (parts.next(), parts.next(), parts.next()) {
        let kind = kind.trim_start_matches('\n');
        match kind {
            "mask" => unit_files.managed_is_mask = true,
            "fragment" => {
                unit_files.fragment = path.to_string();
                unit_files.fragment_text = Some(text.to_string());
            }
            "managed" => unit_files.fragment = path.to_string(),
            "dropin" => unit_files.drop_ins.push(DropIn {
                path: path.to_string(),
                text: text.to_string(),
            }),
            _ => {}
        }
    }
    unit_files
}

/// The shell that prints what [`parse_unit_files`] reads, for `sh -c SCRIPT sh UNIT MANAGED_PATH
/// [SHOW]`: `FragmentPath` and `DropInPaths` from `systemctl show` (or from SHOW, a file holding
/// its answer already: the survey asks systemd once a unit), and each file's text. Only the
/// shell's builtins read them: a process costs a host more than the lines it saves.
pub const UNIT_FILES_SCRIPT: &str = r#"if [ -n "$3" ]; then exec <"$3" || exit 1
else s=$(systemctl show -p FragmentPath,DropInPaths -- "$1") || exit 1; exec <<EOF
$s
EOF
fi
f= ds=
while IFS= read -r line; do
  case $line in FragmentPath=*) f=${line#FragmentPath=} ;; DropInPaths=*) ds=${line#DropInPaths=} ;; esac
done
if [ -L "$2" ] && [ "$(readlink -- "$2")" = /dev/null ]; then printf 'mask\0%s\0\0' "$2"; fi
if [ -n "$f" ] && [ "$f" != /dev/null ]; then
  if [ "$f" = "$2" ]; then printf 'managed\0%s\0\0' "$f"; else printf 'fragment\0%s\0' "$f"; cat -- "$f" 2>/dev/null; printf '\0'; fi
fi
for d in $ds; do
  printf 'dropin\0%s\0' "$d"; cat -- "$d" 2>/dev/null; printf '\0'
done
"#;

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = "hd.service";
    const MANAGED: &str = "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --tp-size 2\nEnvironment=CUDA_VISIBLE_DEVICES=0,1\n\n[Install]\nWantedBy=multi-user.target\n";

    fn unit_files(drop_ins: &[(&str, &str)]) -> UnitFiles {
        UnitFiles {
            fragment: format!("{UNIT_DIR}/{UNIT}"),
            load_state: "loaded".into(),
            unit_file_state: "enabled".into(),
            drop_ins: drop_ins
                .iter()
                .map(|(p, t)| DropIn {
                    path: p.to_string(),
                    text: t.to_string(),
                })
                .collect(),
            ..UnitFiles::default()
        }
    }

    #[test]
    fn the_managed_file_alone_enabled_is_no_drift() {
        assert!(unit_files(&[]).drifts(UNIT, Some(MANAGED)).is_empty());
        // A host that could not say reads as the managed file alone.
        assert!(UnitFiles::default().drifts(UNIT, Some(MANAGED)).is_empty());
    }

    #[test]
    fn systemctl_edit_is_a_drop_in_override_and_its_values_are_in_force() {
        let edit = "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --tp-size 1\nEnvironment=CUDA_VISIBLE_DEVICES=0\n";
        let path = format!("{UNIT_DIR}/{UNIT}.d/override.conf");
        let l = unit_files(&[(&path, edit)]);
        assert_eq!(
            l.drifts(UNIT, Some(MANAGED)),
            vec![Drift::DropinOverride { path: path.clone() }]
        );
        let model = l.effective_model(UNIT, Some(MANAGED)).unwrap();
        assert_eq!(model.exec_start.last().unwrap(), "1");
        assert_eq!(model.env["CUDA_VISIBLE_DEVICES"], "0");
        assert_eq!(
            l.origin_of(UNIT, Some(MANAGED), "ExecStart"),
            Some(path.clone())
        );
        assert_eq!(
            l.origin_of(UNIT, Some(MANAGED), "env:CUDA_VISIBLE_DEVICES"),
            Some(path)
        );
        assert_eq!(l.origin_of(UNIT, Some(MANAGED), "Install.WantedBy"), None);
    }

    #[test]
    fn a_drop_in_replaces_single_settings_and_adds_to_lists() {
        let managed = "[Unit]\nAfter=network-online.target\n[Service]\nExecStart=/bin/a\nUser=root\nRestart=on-failure\nEnvironment=A=1 B=2\n";
        let path = format!("{UNIT_DIR}/{UNIT}.d/10.conf");
        let l = unit_files(&[(
            &path,
            "[Unit]\nAfter=nvidia-persistenced.service\n[Service]\nUser=sglang\nRestart=\nEnvironment=B=3\n",
        )]);
        let m = l.effective_model(UNIT, Some(managed)).unwrap();
        assert_eq!(
            m.exec_start,
            ["/bin/a"],
            "a drop-in without ExecStart keeps it"
        );
        assert_eq!(m.settings["Service.User"], ["sglang"]);
        assert!(
            !m.settings.contains_key("Service.Restart"),
            "an empty assignment resets"
        );
        assert_eq!(
            m.settings["Unit.After"],
            ["network-online.target", "nvidia-persistenced.service"]
        );
        assert_eq!((m.env["A"].as_str(), m.env["B"].as_str()), ("1", "3"));
        let cleared = unit_files(&[(&path, "[Service]\nEnvironment=\nEnvironment=C=1\n")]);
        let m = cleared.effective_model(UNIT, Some(managed)).unwrap();
        assert_eq!(m.env.keys().collect::<Vec<_>>(), ["C"]);
    }

    #[test]
    fn drop_ins_shared_with_other_units_are_not_the_units_own() {
        let l = unit_files(&[
            (
                "/etc/systemd/system/service.d/10-all.conf",
                "[Service]\nLimitCORE=0\n",
            ),
            (
                "/etc/systemd/system/hd-.service.d/prefix.conf",
                "[Service]\nNice=1\n",
            ),
        ]);
        assert!(l.drifts(UNIT, Some(MANAGED)).is_empty());
        assert_eq!(l.shared_drop_ins(UNIT).count(), 2);
        assert_eq!(
            l.effective(UNIT, Some(MANAGED))
                .unwrap()
                .matches("# ")
                .count(),
            1
        );
    }

    #[test]
    fn a_mask_a_shadow_and_a_disabled_unit_are_each_named() {
        let mut masked = unit_files(&[]);
        masked.load_state = "masked".into();
        masked.managed_is_mask = true;
        assert_eq!(
            masked.drifts(UNIT, Some("")),
            vec![Drift::Masked {
                path: format!("{UNIT_DIR}/{UNIT}")
            }]
        );
        assert_eq!(masked.effective(UNIT, Some("")), None);

        let mut shadowed = unit_files(&[]);
        shadowed.fragment = format!("/run/systemd/system/{UNIT}");
        shadowed.fragment_text = Some("[Service]\nExecStart=/bin/other\n".into());
        assert_eq!(
            shadowed.drifts(UNIT, None),
            vec![Drift::Shadowed {
                path: format!("/run/systemd/system/{UNIT}")
            }]
        );
        let effective = shadowed.effective(UNIT, None).unwrap();
        assert!(effective.starts_with("# /run/systemd/system/hd.service\n"));
        assert_eq!(
            crate::unit::parse_unit(&effective).exec_start,
            ["/bin/other"]
        );

        let mut disabled = unit_files(&[]);
        disabled.unit_file_state = "disabled".into();
        assert_eq!(disabled.drifts(UNIT, Some(MANAGED)), vec![Drift::Disabled]);
        // A unit that is not installed is not "disabled": it is new.
        assert!(disabled.drifts(UNIT, None).is_empty());
    }

    #[test]
    fn the_policy_says_what_apply_does() {
        let d = Drift::DropinOverride {
            path: "/run/systemd/system/hd.service.d/x.conf".into(),
        };
        assert!(d.refused_under(DropInPolicy::Refuse));
        assert!(d
            .apply_does(DropInPolicy::Refuse)
            .contains("systemd.dropins: replace"));
        assert!(d
            .apply_does(DropInPolicy::Replace)
            .contains("moves /run/systemd/system/hd.service.d/x.conf aside"));
        assert!(!Drift::Disabled.refused_under(DropInPolicy::Refuse));
        let vendor = Drift::Shadowed {
            path: "/lib/systemd/system/hd.service".into(),
        };
        assert!(vendor
            .apply_does(DropInPolicy::Replace)
            .contains("left in place"));
        assert!(
            [d, vendor, Drift::Disabled]
                .iter()
                .all(|d| !d.restart_fixes()),
            "a restart starts what systemd has in force again"
        );
    }

    #[test]
    fn the_survey_part_reads_back() {
        let text = "managed\0/etc/systemd/system/a.service\0\0dropin\0/etc/a.d/x.conf\0[Service]\nNice=1\n\0dropin\0/run/a.d/y.conf\0\0";
        let l = parse_unit_files(text, "loaded", "enabled");
        assert_eq!(l.fragment, "/etc/systemd/system/a.service");
        assert_eq!(l.fragment_text, None);
        assert_eq!(l.drop_ins.len(), 2);
        assert_eq!(l.drop_ins[0].text, "[Service]\nNice=1\n");
        assert_eq!(
            (l.drop_ins[1].path.as_str(), l.drop_ins[1].text.as_str()),
            ("/run/a.d/y.conf", "")
        );
        let masked = parse_unit_files(
            "mask\0/etc/systemd/system/a.service\0\0",
            "masked",
            "masked",
        );
        assert!(masked.managed_is_mask && masked.drop_ins.is_empty());
        let shadowed = parse_unit_files(
            "fragment\0/run/systemd/system/a.service\0[Service]\n\0",
            "loaded",
            "static",
        );
        assert_eq!(shadowed.fragment_text.as_deref(), Some("[Service]\n"));
        assert_eq!(parse_unit_files("", "", ""), UnitFiles::default());
    }
}
