//! The guide's lab blocks (`docs/guide.md`, "The loop by hand, on a test host"), run as written
//! against the shared test host, so the guide cannot drift from the tool: every `reconcile` line
//! must exit with the code its comment states. The guide's units are `t-docs-*`, on `rl1` only,
//! with ports 37601-37609.

use std::process::Command;

use crate::guide_blocks::{steps, Step};
use crate::lab::{lab, stdout_of, Reconcile, DOCS_GUIDE, SHARED};

const GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md");

/// Removes the guide's units from the host, before the run and when it ends (a panic included).
struct Fresh(Vec<String>);

impl Fresh {
    fn clean(&self) -> String {
        self.0
            .iter()
            .map(|unit| format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl reset-failed {unit} 2>/dev/null; "))
            .collect::<String>()
            + "systemctl daemon-reload; true"
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        crate::lab::sh_quietly(SHARED, &self.clean());
    }
}

/// The services the guide's files declare; each must be a `t-docs-*` unit on `rl1` on a port of
/// its own range, since the host is shared with other tests.
fn guide_units(steps: &[Step]) -> Vec<String> {
    let mut units = Vec::new();
    for step in steps {
        let Step::File { path, text } = step else {
            continue;
        };
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .map(|v| v.split('#').next().unwrap_or("").trim().to_string())
        };
        let service = value("service:").unwrap_or_else(|| panic!("{path}: no service"));
        assert!(service.starts_with("t-docs-"), "{path}: service {service}");
        assert_eq!(value("hosts:").as_deref(), Some("[rl1]"), "{path}");
        let port: u16 = value("port:").and_then(|p| p.parse().ok()).unwrap_or(0);
        assert!(
            DOCS_GUIDE.ports.contains(&port),
            "{path}: port {port} is outside the guide's lease {:?}",
            DOCS_GUIDE.ports
        );
        units.push(format!("{service}.service"));
    }
    units.sort();
    units.dedup();
    units
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_guides_lab_blocks_run_as_written() {
    let guide = std::fs::read_to_string(GUIDE).expect("docs/guide.md");
    let steps = steps(&guide).unwrap_or_else(|e| panic!("docs/guide.md: {e}"));
    assert!(
        steps.iter().any(|s| matches!(s, Step::Reconcile { .. })),
        "docs/guide.md has no `sh lab` block"
    );
    let fresh = Fresh(guide_units(&steps));
    lab().sh(SHARED, &fresh.clean());

    let run = Reconcile::new();
    for step in &steps {
        match step {
            Step::File { path, text } => {
                let path = run.dir().join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            Step::Shell { line } => {
                stdout_of(
                    Command::new("sh")
                        .arg("-c")
                        .arg(line)
                        .current_dir(run.dir()),
                    &format!("`{line}`"),
                );
            }
            Step::Reconcile { args, exit, line } => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                // `validate` and `render` reach no host and take no SSH options.
                let ran = if matches!(args[0], "validate" | "render") {
                    run.run_offline(&args)
                } else {
                    run.run_args(&args)
                };
                assert_eq!(
                    ran.code, *exit,
                    "docs/guide.md: `{line}` exited {} where the guide says {exit}\nstdout:\n{}\nstderr:\n{}",
                    ran.code, ran.stdout, ran.stderr
                );
            }
        }
    }
    drop(fresh);
}
