//! The documentation, checked offline: every relative link of every Markdown file in the
//! repository points at a file that exists, and every `#anchor` at a heading of its target (as
//! GitHub renders headings to anchors); the README's short manifest passes `reconcile validate`;
//! and the guide's lab blocks (`docs/guide.md`, which `tests/integration/docs_guide.rs` runs on a
//! test host) are well formed. No network, no host.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[path = "integration/guide_blocks.rs"]
mod guide_blocks;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A link of a Markdown file: where it is and what it points at.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// The text with every fenced code block blanked (its lines kept, so line numbers stay right).
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The open fence's character and length.
    let mut fence: Option<(char, usize)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let first = trimmed.chars().next().unwrap_or(' ');
        let run = trimmed.chars().take_while(|c| *c == first).count();
        let is_marker = (first == '`' || first == '~') && run >= 3;
        match fence {
            None if is_marker => fence = Some((first, run)),
            Some((c, n))
                if is_marker && first == c && run >= n && trimmed[run..].trim().is_empty() =>
            {
                fence = None
            }
            None => out.push_str(line),
            Some(_) => {}
        }
        out.push('\n');
    }
    out
}

/// The text with inline code spans blanked (`` `[a](b)` `` is not a link).
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let run = chars[i..].iter().take_while(|c| **c == '`').count();
            // The closing run of the same length, if any.
            let mut j = i + run;
            let mut close = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let r = chars[j..].iter().take_while(|c| **c == '`').count();
                    if r == run {
                        close = Some(j);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            if let Some(j) = close {
                for c in &chars[i..j + run] {
                    out.push(if *c == '\n' { '\n' } else { ' ' });
                }
                i = j + run;
                continue;
            }
            for _ in 0..run {
                out.push('`');
            }
            i += run;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The index of the `close` that matches the `open` at `from`, nesting; `None` where there is
/// none, or (`within_paragraph`) none before a blank line.
fn matching(
    chars: &[char],
    from: usize,
    (open, close): (char, char),
    within_paragraph: bool,
) -> Option<usize> {
    let mut depth = 0;
    for (k, &c) in chars.iter().enumerate().skip(from) {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        } else if within_paragraph && c == '\n' && chars.get(k + 1) == Some(&'\n') {
            return None;
        }
    }
    None
}

/// Every inline link `[text](target)` and image `![alt](target)`, and every reference
/// definition `[label]: target`, outside code.
fn links(text: &str) -> Vec<Link> {
    let text = without_code_spans(&without_fences(text));
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let line_of = |i: usize| chars[..i].iter().filter(|c| **c == '\n').count() + 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '[' || (i > 0 && chars[i - 1] == '\\') {
            i += 1;
            continue;
        }
        // The matching `]`, brackets nesting.
        let Some(close) = matching(&chars, i, ('[', ']'), false) else {
            i += 1;
            continue;
        };
        if chars.get(close + 1) == Some(&'(') {
            // The matching `)`, parentheses nesting, within the paragraph.
            if let Some(end) = matching(&chars, close + 1, ('(', ')'), true) {
                let inner: String = chars[close + 2..end].iter().collect();
                let inner = inner.trim();
                // `<target>` or `target "title"`.
                let target = if let Some(rest) = inner.strip_prefix('<') {
                    rest.split('>').next().unwrap_or("").to_string()
                } else {
                    inner.split_whitespace().next().unwrap_or("").to_string()
                };
                found.push(Link {
                    line: line_of(close + 1),
                    target,
                });
                // The link text may hold links of its own (an image in a link).
                i += 1;
                continue;
            }
        } else if chars.get(close + 1) == Some(&':') && (i == 0 || chars[i - 1] == '\n') {
            let rest: String = chars[close + 2..]
                .iter()
                .take_while(|c| **c != '\n')
                .collect();
            if let Some(target) = rest.split_whitespace().next() {
                found.push(Link {
                    line: line_of(close + 1),
                    target: target.trim_matches(['<', '>']).to_string(),
                });
            }
        }
        i += 1;
    }
    found
}

/// GitHub's anchor for a heading's text: lowercase; letters, digits, `-`, `_` and spaces kept,
/// every other character dropped; each space a `-`. Link syntax in the heading counts as its text.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let chars: Vec<char> = heading.chars().collect();
    let mut i = 0;
    // `[text](url)` reads as `text`.
    while i < chars.len() {
        if chars[i] == '[' {
            if let Some(close) = chars[i..].iter().position(|c| *c == ']').map(|p| p + i) {
                if chars.get(close + 1) == Some(&'(') {
                    if let Some(end) = chars[close..].iter().position(|c| *c == ')') {
                        text.extend(&chars[i + 1..close]);
                        i = close + end + 1;
                        continue;
                    }
                }
            }
        }
        text.push(chars[i]);
        i += 1;
    }
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown file's headings render to (a repeated heading gets `-1`, `-2`, ...),
/// and those of explicit `<a name="...">` / `id="..."` tags.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut out = BTreeSet::new();
    for line in without_fences(text).lines() {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with([' ', '\t']) {
            let heading = trimmed[hashes..].trim().trim_end_matches('#').trim();
            let base = slug(heading);
            let mut anchor = base.clone();
            let mut n = 0;
            while seen.contains(&anchor) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
            seen.insert(anchor.clone());
            out.insert(anchor);
        }
        for key in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                rest = &rest[at + key.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_string());
                }
            }
        }
    }
    out
}

/// A link that is not checked here: a URL with a scheme (`https:`, `mailto:`, ...).
fn external(target: &str) -> bool {
    target.contains("://")
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                && !scheme.contains('/')
        })
}

/// `%20` and the like, decoded.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The broken links of the Markdown file `file` (its text `text`), each as `file:line: target:
/// why`, paths shown relative to `root`.
fn broken_links(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let shown = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut broken = Vec::new();
    for link in links(text) {
        let target = link.target.as_str();
        if target.is_empty() {
            broken.push(format!("{}:{}: an empty link", shown(file), link.line));
            continue;
        }
        if external(target) {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        let path = percent_decoded(path);
        let resolved: PathBuf = if path.is_empty() {
            file.to_path_buf()
        } else if let Some(from_root) = path.strip_prefix('/') {
            root.join(from_root)
        } else {
            file.parent().unwrap_or(root).join(&path)
        };
        if !resolved.exists() {
            broken.push(format!(
                "{}:{}: {target}: no such file ({})",
                shown(file),
                link.line,
                shown(&resolved)
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.is_dir() || resolved.extension().and_then(|e| e.to_str()) != Some("md") {
            // GitHub's line anchors (`#L10`) and the like: not checked.
            continue;
        }
        let target_text = if resolved == file {
            text.to_string()
        } else {
            std::fs::read_to_string(&resolved).unwrap_or_default()
        };
        let anchor = percent_decoded(anchor);
        if !anchors(&target_text).contains(&anchor.to_lowercase()) {
            broken.push(format!(
                "{}:{}: {target}: {} has no heading with the anchor #{anchor}",
                shown(file),
                link.line,
                shown(&resolved)
            ));
        }
    }
    broken
}

/// Every Markdown file of the repository, build outputs and hidden folders left out.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, out);
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = Path::new(ROOT);
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("docs/guide.md")),
        "no docs/guide.md among {files:?}"
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        broken.extend(broken_links(root, file, &text));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The index lists every page of `docs/`.
#[test]
fn the_docs_index_lists_every_page() {
    let root = Path::new(ROOT);
    let index = std::fs::read_to_string(root.join("docs/README.md")).unwrap();
    let listed: BTreeSet<String> = links(&index).into_iter().map(|l| l.target).collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "README.md" && !listed.contains(&name) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not list {missing:?}"
    );
}

/// The README keeps the two set-up commands, in one block, as CI and reviewers read them, and
/// stays a door rather than the whole manual.
#[test]
fn the_readme_keeps_the_two_set_up_commands_and_stays_short() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let block = "```sh\ntests/demo.sh     # the whole loop on three throwaway hosts named gpu-a, gpu-b and gpu-c\ntests/run.sh      # the whole test suite: unit tests, then integration tests against real test hosts\n```\n";
    let setup = readme
        .split("## Set-up on a fresh machine\n")
        .nth(1)
        .expect("README has a `Set-up on a fresh machine` section");
    let setup = setup.split("\n## ").next().unwrap();
    assert!(
        setup.contains(block),
        "the set-up section lost its two commands"
    );
    let lines = readme.lines().count();
    assert!(
        lines <= 260,
        "README.md has {lines} lines; its topics belong in docs/"
    );
}

/// The README's short manifest is one `reconcile validate` accepts (offline, no host).
#[test]
fn the_readmes_manifest_is_valid() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let start = readme.find("```yaml\n").expect("README has a yaml block") + "```yaml\n".len();
    let manifest = &readme[start..start + readme[start..].find("```").unwrap()];
    let dir = std::env::temp_dir().join(format!("reconcile-docs-readme-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(dir.join("manifests/readme.yaml"), manifest).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reconcile"))
        .arg("validate")
        .current_dir(&dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "README's manifest:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The guide's lab blocks read as steps, each `reconcile` line stating its exit code.
#[test]
fn the_guides_lab_blocks_are_well_formed() {
    let guide = std::fs::read_to_string(Path::new(ROOT).join("docs/guide.md")).unwrap();
    let steps = guide_blocks::steps(&guide).unwrap_or_else(|e| panic!("docs/guide.md: {e}"));
    let commands = steps
        .iter()
        .filter(|s| matches!(s, guide_blocks::Step::Reconcile { .. }))
        .count();
    assert!(commands >= 5, "docs/guide.md has {commands} lab commands");
    assert!(matches!(
        steps.first(),
        Some(guide_blocks::Step::File { .. })
    ));
}

/// Every row of the fault matrix (`tests/fault-matrix.sh`) names an integration test that
/// exists: the matrix greps the test log for the exact name, so a renamed test would read as
/// a failed fault only after a whole lab run.
#[test]
fn every_fault_matrix_row_names_an_integration_test() {
    let root = Path::new(ROOT);
    let matrix = std::fs::read_to_string(root.join("tests/fault-matrix.sh")).unwrap();
    let rows: Vec<&str> = matrix
        .lines()
        .filter_map(|line| line.trim().strip_prefix('"')?.strip_suffix('"'))
        .filter_map(|row| row.split_once('|').map(|(_, test)| test))
        .collect();
    assert!(rows.len() >= 40, "the matrix has {} rows", rows.len());
    let missing: Vec<&str> = rows
        .iter()
        .copied()
        .filter(|test| {
            let (module, function) = test.rsplit_once("::").unwrap();
            let folder = root
                .join("tests/integration")
                .join(module.replace("::", "/"));
            let source = [folder.with_extension("rs"), folder.join("mod.rs")]
                .iter()
                .find_map(|file| std::fs::read_to_string(file).ok())
                .unwrap_or_default();
            !source.contains(&format!("fn {function}()"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the fault matrix names tests that do not exist: {missing:#?}"
    );
}

#[cfg(test)]
mod checker {
    use super::*;

    #[test]
    fn slugs_follow_githubs_rules() {
        assert_eq!(slug("Agent mode (pull)"), "agent-mode-pull");
        assert_eq!(
            slug("The deep check: the host's own SGLang, before the old server stops"),
            "the-deep-check-the-hosts-own-sglang-before-the-old-server-stops"
        );
        assert_eq!(
            slug("Checking flags against SGLang: `reconcile validate`"),
            "checking-flags-against-sglang-reconcile-validate"
        );
        assert_eq!(
            slug("Set-up on a fresh machine"),
            "set-up-on-a-fresh-machine"
        );
        assert_eq!(
            slug("snake_case and  two spaces"),
            "snake_case-and--two-spaces"
        );
        assert_eq!(slug("A [linked](x.md) heading"), "a-linked-heading");
    }

    #[test]
    fn finds_links_outside_code_only() {
        let text = "See [a](a.md) and [b\nwrapped](b.md#x \"title\").\n`[not](code.md)`\n```\n[not](fenced.md)\n```\n![img](i.png)\n[ref]: r.md\n";
        let found: Vec<(usize, String)> = links(text)
            .into_iter()
            .map(|l| (l.line, l.target))
            .collect();
        assert_eq!(
            found,
            [
                (1, "a.md".to_string()),
                (2, "b.md#x".to_string()),
                (7, "i.png".to_string()),
                (8, "r.md".to_string())
            ]
        );
    }

    /// A sample with one good link of each kind and one broken link of each kind: the checker
    /// must name exactly the broken ones.
    #[test]
    fn fails_on_a_broken_link() {
        let dir = std::env::temp_dir().join(format!("reconcile-docs-check-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("docs")).unwrap();
        std::fs::write(
            dir.join("docs/page.md"),
            "# Page\n\n## Two words\n\n## Two words\n",
        )
        .unwrap();
        let text = "# Top\n\n[good](docs/page.md)\n[good anchor](docs/page.md#two-words)\n[repeated](docs/page.md#two-words-1)\n[here](#top)\n[web](https://example.com/x.md)\n[folder](docs/)\n\n[missing file](docs/nope.md)\n[missing anchor](docs/page.md#three-words)\n[missing here](#nowhere)\n";
        let file = dir.join("README.md");
        std::fs::write(&file, text).unwrap();
        let broken = broken_links(&dir, &file, text);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(broken.len(), 3, "{broken:#?}");
        assert!(
            broken[0].starts_with("README.md:10: docs/nope.md: no such file"),
            "{}",
            broken[0]
        );
        assert!(
            broken[1]
                .starts_with("README.md:11: docs/page.md#three-words: docs/page.md has no heading"),
            "{}",
            broken[1]
        );
        assert!(
            broken[2].starts_with("README.md:12: #nowhere: README.md has no heading"),
            "{}",
            broken[2]
        );
    }
}
