//! What the deep check reads, and its cached verdicts. A host caches SGLang's verdict on a unit's arguments in
//! `STATE_DIR/deep-check/<key>` (mode 600), keyed by everything the check reads, so a plan of the
//! same change again (CI plans every push) reads it instead of importing torch again.
//!
//! The key is made of two halves. What the controller knows (the check, the unit's Python,
//! arguments, environment and working directory) is hashed here; the model's and tokenizer's
//! top-level `*.json` and `*.jinja` files (config.json, the chat template in
//! tokenizer_config.json) and a `--chat-template` file are hashed on the host. The SGLang version
//! is not in the key but in the cached file's first line: the survey looks a verdict up while it
//! reads that version, in the same round trip, and the version is compared once both are read.
//! A model that is not a local folder (a hub id) is checked every time: what it reads is not on
//! the host.

use super::scripts::DEEP_SCRIPT;
use crate::remote::Host;
use crate::targets::Target;

/// The first line of the lookup's output: a verdict was cached (`CACHED_LINE <key>`, the cached file
/// follows), or none was, for inputs keyed `KEY_LINE <key>` (`none`: not to be cached).
const CACHED_LINE: &str = "#reconcile-deep-kept";
const KEY_LINE: &str = "#reconcile-deep-key";
/// A cached file's first line: the SGLang version that gave the verdict.
const VERSION_LINE: &str = "#reconcile-deep-version";

/// Where the verdicts are cached on a host, one file a key, readable by root alone.
pub(super) fn cache_dir() -> String {
    format!("{}/deep-check", crate::state::STATE_DIR)
}

/// What a unit's lookup is given: the controller's half of the key and the paths whose files
/// make the host's half.
pub(super) struct Cached {
    base: String,
    model: String,
    tokenizer: String,
    template: String,
}

impl Cached {
    /// The lookup's arguments for the unit `t`: the check's script, the unit's Python,
    /// arguments and [`deep_input`] hashed here, with the paths the host hashes.
    pub(super) fn of(t: &Target) -> Cached {
        let python = super::Want::of(t).python;
        let input = deep_input(t);
        let cwd = working_directory(t);
        let exec_start = &t.desired.model.exec_start;
        let (_, flags) = reconcile_core::flags::flags(exec_start);
        let flag = |name: &str| flags.get(name).cloned().unwrap_or_default();
        let model = flag("model-path");
        let tokenizer = flags
            .get("tokenizer-path")
            .cloned()
            .unwrap_or(model.clone());
        let template = match flag("chat-template") {
            path if path.is_empty() || path.starts_with('/') => path,
            relative => format!("{}/{relative}", cwd.trim_end_matches('/')),
        };
        let base = reconcile_core::digest::sha256(
            &serde_json::json!([python, DEEP_SCRIPT, exec_start, input]).to_string(),
        );
        Cached {
            base,
            model,
            tokenizer,
            template,
        }
    }

    /// The lookup's arguments after its script: `version` is the SGLang a cached verdict must have
    /// come from, or empty to print whatever is cached (the survey, which compares afterwards).
    pub(super) fn lookup_args<'a>(&'a self, version: &'a str) -> [&'a str; 5] {
        [
            &self.base,
            &self.model,
            &self.tokenizer,
            &self.template,
            version,
        ]
    }

    /// Caches SGLang's `answer`, given by `version`, under `key`; a failure only costs the next
    /// plan a check.
    pub(super) async fn store(
        &self,
        host: &dyn Host,
        key: &str,
        version: &str,
        answer: &str,
    ) -> bool {
        let dir = cache_dir();
        let argv = ["sh", "-c", CACHE_STORE, "sh", &dir, key];
        let text = format!("{VERSION_LINE} {version}\n{answer}");
        let why = match host.run_with_input(&argv, Some(text.as_bytes())).await {
            Ok(out) if out.status == 0 => return true,
            Ok(out) => out.stderr.trim().to_string(),
            Err(e) => e.to_string(),
        };
        tracing::info!(
            host = host.name(),
            "the deep check's verdict was not kept: {why}"
        );
        false
    }
}

/// What the deep check reads on its standard input (never on a command line, where `ps` shows
/// it): the unit's `Environment=` and its working directory (systemd's default, `/`, unless the
/// unit sets an absolute `WorkingDirectory=`), so SGLang reads the environment variables the
/// server will have (`SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`, `HF_HUB_OFFLINE`, ...) and
/// relative paths resolve as the server's will.
pub(super) fn deep_input(t: &Target) -> String {
    let cwd = working_directory(t);
    let args = reconcile_core::flags::server_args(&t.desired.model.exec_start);
    serde_json::json!({ "args": args, "env": t.desired.environment(), "cwd": cwd }).to_string()
}

/// Where the server starts: an absolute `WorkingDirectory=` (a `-` prefix only makes it optional),
/// else systemd's default, `/`.
fn working_directory(t: &Target) -> &str {
    t.desired
        .model
        .settings
        .get("Service.WorkingDirectory")
        .and_then(|v| v.last())
        .map(|d| d.trim_start_matches('-'))
        .filter(|d| d.starts_with('/'))
        .unwrap_or("/")
}

/// The lookup's shell, reading verdicts in `cache_dir`. Arguments: the controller's half of the
/// key, the model, tokenizer and chat-template paths, and the version a cached verdict must have
/// come from (empty: any). A verdict cached under the key is printed (and its file touched, so that
/// it is not forgotten) and the script exits; otherwise it prints the key and goes on (to the
/// check itself, where one follows).
pub(super) fn lookup_script(cache_dir: &str) -> String {
    format!("KEPT_DIR={cache_dir}\n{CACHE_LOOKUP}")
}

const CACHE_LOOKUP: &str = "base=$1 model=$2 tokenizer=$3 template=$4 version=$5; shift 5
key=none
if [ -d \"$model\" ]; then
  # The files the check reads, in one cat (a process is what a survey costs a host); listed in
  # the pipeline's own shell, whose arguments are its own (the deep check's follow in this one).
  key=$({ printf '%s\\n' \"$base\"; set --
    for d in \"$model\" \"$tokenizer\"; do [ -d \"$d\" ] && set -- \"$@\" \"$d\"/*.json \"$d\"/*.jinja; done
    [ -f \"$template\" ] && set -- \"$@\" \"$template\"
    cat -- \"$@\" 2>/dev/null; } | sha256sum)
  key=${key%% *}
  kept=\"$KEPT_DIR/$key\" first=
  [ -f \"$kept\" ] && read -r first < \"$kept\"
  if [ -f \"$kept\" ] && { [ -z \"$version\" ] || [ \"$first\" = \"#reconcile-deep-version $version\" ]; } &&
    touch \"$kept\" 2>/dev/null; then echo \"#reconcile-deep-kept $key\"; cat \"$kept\"; exit 0; fi
fi
echo \"#reconcile-deep-key $key\"
";

/// Caches the verdict on stdin as `$1/$2` (written whole, then renamed), and forgets verdicts no
/// plan read for 30 days.
const CACHE_STORE: &str = "# deep check: its verdict kept\numask 077; mkdir -p \"$1\" && cat > \"$1/.$2\" && mv -f \"$1/.$2\" \"$1/$2\"
find \"$1\" -maxdepth 1 -type f -mtime +30 -delete 2>/dev/null; true";

/// What a lookup printed.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lookup<'a> {
    /// A verdict cached under `key`, given by SGLang `version`: `answer` is the check's output.
    Cached {
        key: &'a str,
        version: &'a str,
        answer: &'a str,
    },
    /// None cached; the check's verdict may be cached under `key`.
    Keyed(&'a str),
    /// None cached, and none to cache: the model is not a folder on the host.
    Unkeyed,
    /// Not a lookup's output (the check could not start).
    Unread,
}

/// Reads a lookup's output, and what follows it (the check's own, where the check ran).
pub(super) fn read(stdout: &str) -> Lookup<'_> {
    let (first, rest) = stdout.split_once('\n').unwrap_or((stdout, ""));
    match first.split_once(' ') {
        Some((CACHED_LINE, key)) => {
            let (line, answer) = rest.split_once('\n').unwrap_or((rest, ""));
            match line.split_once(' ') {
                Some((VERSION_LINE, version)) => Lookup::Cached {
                    key,
                    version,
                    answer,
                },
                // Cached by an older reconcile, which did not record the version.
                _ => Lookup::Unread,
            }
        }
        Some((KEY_LINE, "none")) => Lookup::Unkeyed,
        Some((KEY_LINE, key)) => Lookup::Keyed(key),
        _ => Lookup::Unread,
    }
}

#[cfg(test)]
mod tests {
    use super::{read, Lookup};
    use std::process::Command;

    /// Runs the lookup here, with `echo` for the check after it, which gets the arguments after
    /// the lookup's five as its own: its output.
    fn looked_up(
        cache_dir: &std::path::Path,
        model: &std::path::Path,
        template: &str,
        version: &str,
    ) -> String {
        let script =
            super::lookup_script(cache_dir.to_str().unwrap()) + "echo the check ran with $*";
        let model = model.to_str().unwrap();
        let out = Command::new("sh")
            .args(["-c", &script, "sh", "base", model, model, template, version])
            .args(["/venv/bin/python3", "-c"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn store(cache_dir: &std::path::Path, key: &str, text: &str) {
        let stored = Command::new("sh")
            .args([
                "-c",
                super::CACHE_STORE,
                "sh",
                cache_dir.to_str().unwrap(),
                key,
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(text.as_bytes())?;
                child.wait()
            })
            .unwrap();
        assert!(stored.success());
    }

    #[test]
    fn a_kept_verdict_is_read_until_what_the_check_reads_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (cache_dir, model) = (dir.path().join("kept"), dir.path().join("model"));
        std::fs::create_dir(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            "{\"max_position_embeddings\": 2048}",
        )
        .unwrap();
        let first = looked_up(&cache_dir, &model, "", "0.5.23");
        let Lookup::Keyed(key) = read(&first) else {
            panic!("{first}")
        };
        assert_eq!(key.len(), 64);
        assert!(
            first.ends_with("\nthe check ran with /venv/bin/python3 -c\n"),
            "{first}"
        );
        // Cached, it is printed instead of running the check, for that SGLang version or for a
        // lookup that compares later (an empty version).
        let answer = "#reconcile-deep {\"verdict\": \"accepted\", \"unchecked\": []}\n";
        store(
            &cache_dir,
            key,
            &format!("#reconcile-deep-version 0.5.23\n{answer}"),
        );
        for version in ["0.5.23", ""] {
            let again = looked_up(&cache_dir, &model, "", version);
            let kept = Lookup::Cached {
                key,
                version: "0.5.23",
                answer,
            };
            assert_eq!(read(&again), kept, "{again}");
        }
        // Another SGLang: checked again.
        let other = looked_up(&cache_dir, &model, "", "0.5.24");
        assert_eq!(read(&other), Lookup::Keyed(key), "{other}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(cache_dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by its owner alone: {mode:o}");
        // Another config.json, a chat template file, or a model that is no folder: checked again.
        std::fs::write(
            model.join("config.json"),
            "{\"max_position_embeddings\": 4096}",
        )
        .unwrap();
        let changed = looked_up(&cache_dir, &model, "", "0.5.23");
        assert!(
            matches!(read(&changed), Lookup::Keyed(k) if k != key),
            "{changed}"
        );
        let template = dir.path().join("t.jinja");
        std::fs::write(&template, "{{ messages }}").unwrap();
        let with_template = looked_up(&cache_dir, &model, template.to_str().unwrap(), "0.5.23");
        assert_ne!(with_template, changed);
        assert!(with_template.ends_with("\nthe check ran with /venv/bin/python3 -c\n"));
        let hub = looked_up(
            &cache_dir,
            std::path::Path::new("Qwen/Qwen3-8B"),
            "",
            "0.5.23",
        );
        assert_eq!(
            hub,
            "#reconcile-deep-key none\nthe check ran with /venv/bin/python3 -c\n"
        );
        assert_eq!(read(&hub), Lookup::Unkeyed);
    }

    #[test]
    fn a_verdict_kept_without_its_version_is_not_read() {
        let old = "#reconcile-deep-kept abc\n#reconcile-deep {\"verdict\": \"accepted\"}\n";
        assert_eq!(read(old), Lookup::Unread);
        assert_eq!(read("Traceback (most recent call last):\n"), Lookup::Unread);
    }
}
