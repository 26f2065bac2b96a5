//! A unit's files read line by line, as systemd's `config_parse` reads them, keeping where each
//! assignment is: `unit::parse_unit` says what the files mean, this says which file and line each
//! value in force comes from, so what import cannot express is named by its line.

use std::collections::BTreeMap;

use super::UnitFile;

/// One `Key=value` line (continuations joined), where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Index into the files read.
    pub file: usize,
    /// 1-based line where the assignment starts.
    pub line: usize,
    pub section: String,
    pub key: String,
    /// The value as written (quotes, escapes and specifiers not resolved), stripped.
    pub value: String,
}

impl Assignment {
    /// `Section.Key`, as `UnitModel::settings` names it.
    pub fn setting(&self) -> String {
        format!("{}.{}", self.section, self.key)
    }
}

/// systemd's whitespace (`WHITESPACE`): other Unicode spaces are ordinary characters to it.
const WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

fn strip(s: &str) -> &str {
    s.trim_matches(WHITESPACE)
}

/// A line ending in an unescaped backslash continues on the next one.
fn continues(line: &str) -> bool {
    let mut escaped = false;
    for c in line.chars() {
        escaped = !escaped && c == '\\';
    }
    escaped
}

/// Every assignment of every file, in systemd's order.
pub fn assignments(files: &[UnitFile]) -> Vec<Assignment> {
    let mut found = Vec::new();
    for (file, f) in files.iter().enumerate() {
        let mut section = String::new();
        for (line, text) in logical_lines(&f.text) {
            if let Some(name) = text.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
                continue;
            }
            let Some((key, value)) = text.split_once('=') else {
                continue;
            };
            found.push(Assignment {
                file,
                line,
                section: section.clone(),
                key: strip(key).to_string(),
                value: strip(value).to_string(),
            });
        }
    }
    found
}

/// The assignments in force for each `Section.Key`: an empty one resets the ones before it.
pub fn in_force(assignments: &[Assignment]) -> BTreeMap<String, Vec<&Assignment>> {
    let mut force: BTreeMap<String, Vec<&Assignment>> = BTreeMap::new();
    for a in assignments {
        let values = force.entry(a.setting()).or_default();
        if a.value.is_empty() {
            values.clear();
        } else {
            values.push(a);
        }
    }
    force.retain(|_, v| !v.is_empty());
    force
}

/// Logical lines with the number of the raw line each starts on: continuations joined (the
/// backslash becomes a space), comment and blank lines dropped, even inside a continuation.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.split('\n').enumerate() {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if strip(raw).starts_with(['#', ';']) {
            continue;
        }
        let (start, mut joined) = match pending.take() {
            Some((start, mut acc)) => {
                acc.push_str(raw);
                (start, acc)
            }
            None => (i + 1, raw.to_string()),
        };
        if continues(&joined) {
            joined.pop();
            joined.push(' ');
            pending = Some((start, joined));
        } else if !strip(&joined).is_empty() {
            lines.push((start, strip(&joined).to_string()));
        }
    }
    lines.extend(
        pending
            .map(|(start, p)| (start, strip(&p).to_string()))
            .filter(|(_, p)| !p.is_empty()),
    );
    lines
}

/// A file systemd names for the unit whose `# <path>` header `systemctl cat` did not print (the
/// unit changed between the two reads).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`systemctl cat` printed no `# {path}` header")]
pub struct MissingHeader {
    pub path: String,
}

/// `systemctl cat -- UNIT`'s output cut into its files: each starts with a `# <path>` line, in
/// the order of `paths` (`FragmentPath`, then `DropInPaths`). `Err` names the path whose header
/// is missing.
pub fn split_cat(output: &str, paths: &[String]) -> Result<Vec<UnitFile>, MissingHeader> {
    let lines: Vec<&str> = output.split_inclusive('\n').collect();
    let mut starts = Vec::new();
    let mut from = 0;
    for path in paths {
        let header = format!("# {path}");
        let at = (from..lines.len())
            .find(|&i| lines[i].trim_end_matches(['\n', '\r']) == header)
            .ok_or_else(|| MissingHeader { path: path.clone() })?;
        starts.push(at);
        from = at + 1;
    }
    let mut files = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(lines.len());
        files.push(UnitFile {
            path: path.clone(),
            text: lines[starts[i] + 1..end].concat(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> UnitFile {
        UnitFile {
            path: path.into(),
            text: text.into(),
        }
    }

    #[test]
    fn assignments_know_their_file_and_first_line() {
        let files = [
            file(
                "/a.service",
                "[Unit]\n# c\nDescription=x\n\n[Service]\nExecStart=/p \\\n  --a 1 \\\n# mid\n  --b\nUser=root\n",
            ),
            file("/a.service.d/o.conf", "[Service]\nUser=\nUser=me\n"),
        ];
        let found = assignments(&files);
        let at: Vec<(usize, usize, String)> = found
            .iter()
            .map(|a| (a.file, a.line, a.setting()))
            .collect();
        assert_eq!(
            at,
            [
                (0, 3, "Unit.Description".to_string()),
                (0, 6, "Service.ExecStart".to_string()),
                (0, 10, "Service.User".to_string()),
                (1, 2, "Service.User".to_string()),
                (1, 3, "Service.User".to_string()),
            ]
        );
        assert_eq!(found[1].value, "/p    --a 1    --b");
        let force = in_force(&found);
        assert_eq!(force["Service.User"].len(), 1);
        assert_eq!(force["Service.User"][0].value, "me");
    }

    #[test]
    fn systemctl_cat_splits_on_the_paths_it_was_told() {
        let out = "# /etc/systemd/system/a.service\n[Service]\n# /not/a/header\nUser=root\n\n# /etc/systemd/system/a.service.d/o.conf\n[Service]\nNice=1\n";
        let paths = [
            "/etc/systemd/system/a.service".to_string(),
            "/etc/systemd/system/a.service.d/o.conf".to_string(),
        ];
        let files = split_cat(out, &paths).unwrap();
        assert_eq!(files[0].text, "[Service]\n# /not/a/header\nUser=root\n\n");
        assert_eq!(files[1].text, "[Service]\nNice=1\n");
        assert_eq!(
            split_cat("[Service]\n", &paths[..1]),
            Err(MissingHeader {
                path: paths[0].clone()
            })
        );
    }
}
