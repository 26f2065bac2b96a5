//! An argv read as SGLang's command line: the command, then `--flag value` pairs. A leaf module:
//! `plan`, `preflight`, `redact` and verification all read flags, and none of them needs another.

use std::collections::BTreeMap;

/// The console script an ExecStart argv runs as `<script> serve ...` (SGLang 0.5.23's entry
/// point); `None` for `<python> -m sglang.launch_server ...`.
pub fn console_script(argv: &[String]) -> Option<&String> {
    argv.get(1).filter(|a| *a == "serve").and(argv.first())
}

/// The server's arguments in an ExecStart argv: what follows `<python> -m sglang.launch_server`,
/// or `<sglang console script> serve` (both parse them alike).
pub fn server_args(argv: &[String]) -> &[String] {
    let entry = if console_script(argv).is_some() { 2 } else { 3 };
    argv.get(entry..).unwrap_or_default()
}

/// Splits an argv into the command before the first `--flag` and the flags with their values.
pub fn flags(argv: &[String]) -> (Vec<String>, BTreeMap<String, String>) {
    let start = argv
        .iter()
        .position(|a| a.starts_with("--"))
        .unwrap_or(argv.len());
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for arg in &argv[start..] {
        if let Some(flag) = arg.strip_prefix("--") {
            let (name, value) = flag
                .split_once('=')
                .map_or((flag, None), |(n, v)| (n, Some(v)));
            flags.insert(name.to_string(), value.unwrap_or_default().to_string());
            current = Some(name.to_string());
        } else if let Some(name) = &current {
            let entry = flags.entry(name.clone()).or_default();
            if !entry.is_empty() {
                entry.push(' ');
            }
            entry.push_str(arg);
        }
    }
    (argv[..start].to_vec(), flags)
}
