//! Finds where a field is written in a manifest's text, for errors found after parsing (a port out
//! of range, a bad env name) that serde_yaml cannot place. It reads the block and flow styles the
//! manifests use; when it cannot follow a path to its end it points at the deepest part it found.

use super::error::Position;

#[derive(Debug, Clone, Copy)]
pub enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// One line of a block scope: where it is, how far it is indented, and its text after the indent.
#[derive(Clone, Copy)]
struct Line<'t> {
    number: usize,
    indent: usize,
    text: &'t str,
}

pub fn locate(text: &str, path: &[Seg]) -> Option<Position> {
    let lines: Vec<Line> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let body = l.trim_start();
            Line {
                number: i + 1,
                indent: l.len() - body.len(),
                text: body.trim_end(),
            }
        })
        .filter(|l| !l.text.is_empty() && !l.text.starts_with('#'))
        .collect();
    let mut scope = lines;
    let mut found = None;
    for (depth, seg) in path.iter().enumerate() {
        match descend(&scope, *seg) {
            Step::Block(line, children) => {
                found = Some(Position {
                    line: line.number,
                    column: line.indent + 1,
                });
                scope = children;
            }
            Step::Flow(position, rest) => {
                return Some(flow_locate(rest, position, &path[depth + 1..]));
            }
            Step::NotFound => break,
        }
    }
    found
}

enum Step<'t> {
    Block(Line<'t>, Vec<Line<'t>>),
    /// The value continues in flow style (`{ ... }` or `[ ... ]`) on one line.
    Flow(Position, &'t str),
    NotFound,
}

fn descend<'t>(scope: &[Line<'t>], seg: Seg) -> Step<'t> {
    let Some(indent) = scope.first().map(|l| l.indent) else {
        return Step::NotFound;
    };
    let at_indent = scope.iter().enumerate().filter(|(_, l)| l.indent == indent);
    let hit = match seg {
        Seg::Key(key) => at_indent
            .filter_map(|(i, l)| key_value(l.text, key).map(|v| (i, v)))
            .next()
            .map(|(i, value)| (i, scope[i], value, scope[i].indent)),
        Seg::Index(n) => at_indent
            .filter(|(_, l)| l.text == "-" || l.text.starts_with("- "))
            .nth(n)
            .map(|(i, l)| {
                let item = l.text[1..].trim_start();
                let item_line = Line {
                    number: l.number,
                    indent: l.indent + l.text.len() - item.len(),
                    text: item,
                };
                (i, item_line, "", l.indent)
            }),
    };
    let Some((i, line, value, owner_indent)) = hit else {
        return Step::NotFound;
    };
    if value.starts_with('{') || value.starts_with('[') {
        let column = line.indent + line.text.len() - value.len() + 1;
        return Step::Flow(
            Position {
                line: line.number,
                column,
            },
            value,
        );
    }
    let mut children: Vec<Line> = Vec::new();
    if matches!(seg, Seg::Index(_)) && !line.text.is_empty() {
        children.push(line);
    }
    children.extend(
        scope[i + 1..]
            .iter()
            .take_while(|l| l.indent > owner_indent)
            .copied(),
    );
    Step::Block(line, children)
}

/// If `text` is `key: value` (the key bare or quoted), the value part.
fn key_value<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    if key.is_empty() {
        return None;
    }
    [key.to_string(), format!("\"{key}\""), format!("'{key}'")]
        .iter()
        .find_map(|k| {
            let rest = text.strip_prefix(k.as_str())?.trim_start();
            let value = rest.strip_prefix(':')?;
            (value.is_empty() || value.starts_with(' ')).then(|| value.trim_start())
        })
}

/// Within a one-line flow collection, the position of the first remaining segment, or of the
/// collection itself.
fn flow_locate(flow: &str, start: Position, rest: &[Seg]) -> Position {
    let offset = match rest.first() {
        Some(Seg::Key(key)) => flow_key_offset(flow, key),
        Some(Seg::Index(n)) => flow_item_offset(flow, *n),
        None => None,
    };
    Position {
        line: start.line,
        column: start.column + offset.unwrap_or(0),
    }
}

fn flow_key_offset(flow: &str, key: &str) -> Option<usize> {
    if key.is_empty() {
        // An empty key matches everywhere and would never advance.
        return None;
    }
    let mut from = 0;
    while let Some(found) = flow[from..].find(key) {
        let at = from + found;
        let before = flow[..at].trim_end_matches(['"', '\'']).chars().last();
        let after = flow[at + key.len()..].trim_start_matches(['"', '\'']);
        if matches!(before, Some('{' | ',' | ' ')) && after.trim_start().starts_with(':') {
            return Some(at - (flow[..at].len() - flow[..at].trim_end_matches(['"', '\'']).len()));
        }
        from = at + key.len();
    }
    None
}

fn flow_item_offset(flow: &str, n: usize) -> Option<usize> {
    let mut item = 0;
    for (i, c) in flow.char_indices().skip(1) {
        if item == n && !c.is_whitespace() {
            return Some(i);
        }
        if c == ',' {
            item += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
service: s
hosts:
  - gpu-a
  # a comment
  - name: gpu-b
    env: { CUDA_VISIBLE_DEVICES: \"4,5\", 'BAD NAME': x }
sglang:
  port: 70000
  flags:
    tp-size: 4
list: [a, b, c]
";

    fn at(path: &[Seg]) -> (usize, usize) {
        let p = locate(DOC, path).unwrap();
        (p.line, p.column)
    }

    #[test]
    fn block_keys() {
        assert_eq!(at(&[Seg::Key("sglang"), Seg::Key("port")]), (8, 3));
        assert_eq!(
            at(&[Seg::Key("sglang"), Seg::Key("flags"), Seg::Key("tp-size")]),
            (10, 5)
        );
    }

    #[test]
    fn sequence_items_and_their_keys() {
        assert_eq!(at(&[Seg::Key("hosts"), Seg::Index(0)]), (3, 5));
        assert_eq!(
            at(&[Seg::Key("hosts"), Seg::Index(1), Seg::Key("name")]),
            (5, 5)
        );
        assert_eq!(
            at(&[Seg::Key("hosts"), Seg::Index(1), Seg::Key("env")]),
            (6, 10)
        );
    }

    #[test]
    fn flow_maps_and_lists() {
        // Keys of the flow map `hosts[1].env`.
        let env = |name| {
            at(&[
                Seg::Key("hosts"),
                Seg::Index(1),
                Seg::Key("env"),
                Seg::Key(name),
            ])
        };
        assert_eq!(env("CUDA_VISIBLE_DEVICES"), (6, 12));
        assert_eq!(env("BAD NAME"), (6, 41));
        assert_eq!(at(&[Seg::Key("list"), Seg::Index(2)]), (11, 14));
    }

    #[test]
    fn an_empty_key_is_not_found_and_does_not_hang() {
        let doc = "env: { \"\": x }\n";
        assert_eq!(
            locate(doc, &[Seg::Key("env"), Seg::Key("")]),
            Some(Position { line: 1, column: 6 })
        );
    }

    #[test]
    fn a_missing_leaf_points_at_its_parent() {
        assert_eq!(at(&[Seg::Key("sglang"), Seg::Key("nope")]), (7, 1));
    }
}
